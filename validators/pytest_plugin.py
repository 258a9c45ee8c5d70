"""pytest plugin for hardware qualification, inert until ``--mystique-device`` is given.

Registered through the ``pytest11`` entry point. Importing it is cheap: no torch, no validator is
imported until the plugin is enabled.

When enabled (``pytest --mystique-device cuda [--mystique-inject SPEC] [--mystique-level full]``)
the session gets one extra collector, ``mystique``, next to whatever the command line collects:

    mystique                      QualificationCollector   (added to the session's collect report)
      mystique::numerics          ValidatorCollector       (one per validator module)
        mystique::numerics::gemm  CheckGroupItem           (one per group the validator lists)

Each validator module ``mystique.validators.<name>`` exposes ``groups(level) -> list[str]`` and
``run(target, *, level, seed, groups, out_dir) -> DataFrame`` (the results schema). An item runs
one group; it fails when any row of its group has status ``fail``, ``error`` or ``inconclusive``
(an item whose only bad rows are inconclusive says "undecided": ``mystique qualify`` then exits 4),
and its failure message lists those rows (check, subject, value vs threshold, detail); a group with
no check row (only skips and ``info`` measurements) is skipped, never passed ("only measurements",
"nothing checked"). A validator that is not installed or lacks the contract yields one skipped item.
Items carry the validator's name as a marker (``-m numerics``) and ``slow`` when their group runs
only at level ``full``; ``-k`` matches validator and group names. JUnit XML (``--junitxml``) works
as for any test.

The collector is added by a wrapper around ``pytest_make_collect_report`` for the session rather
than by adding a file to the command line: a shipped test module would be imported by path, which
in a source checkout imports ``validators`` as a second top-level package; a collector needs no
import at all and its items go through pytest's ordinary collection, selection and reporting.

At session end, when ``--mystique-report-dir DIR`` is given, ``DIR/results.csv`` holds every row
and ``DIR/report.html`` the rendered report (:func:`mystique.reports.render_report`). As with the
CLI's output folders, DIR must be new or empty unless ``--mystique-force`` is given.

Validators are imported by name with :mod:`importlib` (a short name of ``mystique.validators.*`` or
a user's dotted module path); the suite's own modules are imported plainly, inside the hooks that
need them, so that importing the plugin stays cheap.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DEFAULT_VALIDATORS: tuple[str, ...] = ("numerics", "soft_errors", "correctness", "performance")
MARKERS: dict[str, str] = {
    "numerics": "qualification checks of the numerics validator (BF16/FP16 vs fp64 goldens)",
    "soft_errors": "qualification checks of the soft-error (silent data corruption) validator",
    "correctness": "qualification checks of the cross-device correctness validator",
    "performance": "qualification checks of the performance validator (its quick item: an injected mode's cost)",
    "slow": "long campaigns and published-size checks; opt in with -m slow",
}
ROOT_NAME = "mystique"


@dataclass
class QualState:
    """What one enabled session knows: its settings, the target, and the rows gathered so far."""

    device: str
    inject: str | None
    emulate: str | None
    level: str
    seed: int
    report_dir: Path | None
    validators: list[str]
    target: Any = None
    context: Any = None
    frames: list[Any] = field(default_factory=list)
    artifacts_root: Path | None = None
    report_html: Path | None = None
    report_note: str = ""
    written: bool = False
    shown_as: Path | None = None

    def shown(self, path: Path) -> Path:
        """``path`` under the report folder as the user will find it (see ``--mystique-report-shown-as``)."""
        if self.shown_as is None or self.report_dir is None:
            return path
        try:
            return self.shown_as / path.relative_to(self.report_dir)
        except ValueError:
            return path


STATE_KEY = pytest.StashKey[QualState]()


class QualificationFailure(Exception):
    """Raised by an item whose group has failing rows; its text is the failure message."""


# ---------------------------------------------------------------------------------------------
# Options, configuration, header and summary


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mystique", "Mystique Suite hardware qualification")
    group.addoption("--mystique-device", default=None, metavar="DEV",
                    help="Qualify this torch device (enables the plugin): cpu, cuda, cuda:1, xpu, mps, ...")
    group.addoption("--mystique-inject", default=None, metavar="SPEC",
                    help="Dispatch mode active on the device under test: a built-in fault simulation "
                         "NAME[:k=v,...] (`mystique faults`) or package.module:factory.")
    group.addoption("--mystique-emulate", default=None, metavar="PROFILE",
                    help="Run the device under test as an emulated foreign device (its legal numerics "
                         "differences reproduced here; profiles: cuda).")
    group.addoption("--mystique-level", default="quick", choices=("quick", "full"),
                    help="quick: every boot (minutes); full: acceptance (default: quick).")
    group.addoption("--mystique-seed", default=0, type=int, metavar="N",
                    help="Seed of every random choice of the checks (default: 0).")
    group.addoption("--mystique-report-dir", default=None, metavar="DIR",
                    help="Write DIR/results.csv and DIR/report.html at the end of the session.")
    group.addoption("--mystique-force", action="store_true", default=False,
                    help="Let --mystique-report-dir name an existing non-empty folder: its results.csv and "
                         "report.html are then replaced (other files are kept).")
    group.addoption("--mystique-report-shown-as", default=None, metavar="DIR",
                    help="Name DIR instead of --mystique-report-dir in the header and summary (for a "
                         "caller that moves the report folder there afterwards, as `mystique qualify` does).")
    group.addoption("--mystique-validators", default=None, metavar="NAMES",
                    help="Comma-separated validators to run: short names of mystique.validators.* or "
                         "dotted module paths (default: ini mystique_validators, else "
                         + ",".join(DEFAULT_VALIDATORS) + ").")
    parser.addini("mystique_validators", type="args", default=list(DEFAULT_VALIDATORS),
                  help="Validators the mystique plugin runs (short names or dotted module paths).")


def enabled(config: pytest.Config) -> bool:
    """True when this session qualifies a device (``--mystique-device`` was given)."""
    return STATE_KEY in config.stash


def _validator_names(config: pytest.Config) -> list[str]:
    raw = config.getoption("mystique_validators")
    names = [n.strip() for n in raw.split(",")] if raw else list(config.getini("mystique_validators"))
    names = [n for n in names if n]
    if not names:
        raise pytest.UsageError("--mystique-validators: no validator named")
    return names


def marker_name(validator: str) -> str:
    """The marker of a validator: its last dotted component (``pkg.checks.numerics`` -> ``numerics``)."""
    return validator.rsplit(".", 1)[-1]


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    device = config.getoption("mystique_device")
    if device is None:
        return
    validators = _validator_names(config)
    for name in validators:
        if marker_name(name) not in MARKERS:
            config.addinivalue_line("markers", f"{marker_name(name)}: qualification checks of validator {name}")
    report_dir = config.getoption("mystique_report_dir")
    state = QualState(
        device=device, inject=config.getoption("mystique_inject"), emulate=config.getoption("mystique_emulate"),
        level=config.getoption("mystique_level"),
        seed=config.getoption("mystique_seed"), report_dir=Path(report_dir) if report_dir else None,
        validators=validators,
    )
    shown_as = config.getoption("mystique_report_shown_as")
    state.shown_as = Path(shown_as) if shown_as else None
    from mystique.errors import EnvironmentUnsupported, UsageError
    from mystique.results import RunContext
    from mystique.targets import make_target

    try:
        state.target = make_target(device, state.inject, state.emulate)
    except UsageError as exc:
        raise pytest.UsageError(f"mystique: {exc}") from exc
    except EnvironmentUnsupported as exc:
        pytest.exit(f"mystique: {exc}", returncode=3)
    if state.report_dir is not None:
        if state.report_dir.exists() and not state.report_dir.is_dir():
            raise pytest.UsageError(f"mystique: --mystique-report-dir {state.report_dir} is not a folder")
        # the CLI's rule: a new or empty folder, or an explicit --mystique-force (never a silent overwrite)
        if (state.report_dir.is_dir() and any(state.report_dir.iterdir())
                and not config.getoption("mystique_force")):
            raise pytest.UsageError(
                f"mystique: --mystique-report-dir {state.report_dir} exists and is not empty; pass "
                "--mystique-force to replace its results.csv and report.html")
        state.artifacts_root = state.report_dir
    state.context = RunContext.for_target(state.target)
    config.stash[STATE_KEY] = state


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not enabled(config):
        return None
    state = config.stash[STATE_KEY]
    info = state.target.info()
    lines = [
        f"mystique: device {state.target.label} ({info.name}; {info.capability}), torch {state.context.torch_version}",
        f"mystique: level {state.level}, seed {state.seed}, validators {', '.join(state.validators)}",
    ]
    if state.report_dir is not None:
        lines.append(f"mystique: report dir {state.shown(state.report_dir)}")
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    if isinstance(collector, pytest.Session) and enabled(collector.config) and report.passed:
        report.result.append(QualificationCollector.from_parent(collector, name=ROOT_NAME, nodeid=ROOT_NAME))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not enabled(session.config):
        return
    state = session.config.stash[STATE_KEY]
    if state.report_dir is None:
        if state.artifacts_root is not None:
            shutil.rmtree(state.artifacts_root, ignore_errors=True)
        return
    write_outputs(state)


def write_outputs(state: QualState) -> None:
    """Write ``results.csv`` (every row) and ``report.html`` (unless rendering it fails: then a note says why)."""
    from mystique import reports, results

    state.report_dir.mkdir(parents=True, exist_ok=True)
    csv_path = state.report_dir / "results.csv"
    results.write_csv(collected_rows(state), csv_path)
    state.written = True
    html = state.report_dir / "report.html"
    try:
        reports.render_report([csv_path], html, force=True)
    except Exception as exc:  # the rows are safe in results.csv; a broken renderer must not hide them
        state.report_note = f"report.html not written: {type(exc).__name__}: {exc}"
        return
    state.report_html = html


def collected_rows(state: QualState) -> Any:
    """Every row of this session as one results table, stamped with the session's run id."""
    from mystique import results

    df = results.concat(state.frames)
    if len(df):
        df["run_id"] = state.context.run_id
    return df


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not enabled(config):
        return
    state = config.stash[STATE_KEY]
    df = collected_rows(state)
    from mystique.results import counts

    terminalreporter.section("mystique qualification")
    terminalreporter.write_line(f"{state.target.label}: {counts(df).line}")
    if state.written:
        terminalreporter.write_line(f"results: {state.shown(state.report_dir / 'results.csv')}")
    if state.report_html is not None:
        terminalreporter.write_line(f"report:  {state.shown(state.report_html)}")
    if state.report_note:
        terminalreporter.write_line(state.report_note)


# ---------------------------------------------------------------------------------------------
# Collection


def load_validator(name: str) -> tuple[Any | None, str]:
    """Import validator ``name``; returns ``(module, "")`` or ``(None, why it is unavailable)``.

    A module that does not exist, or that lacks callables ``groups`` and ``run``, is unavailable.
    Any other import error propagates (a broken validator must fail, not skip).
    """
    module_name = name if "." in name else f"mystique.validators.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            return None, f"validator {name} is not installed ({module_name} not found)"
        raise
    missing = [attr for attr in ("groups", "run") if not callable(getattr(module, attr, None))]
    if missing:
        return None, f"validator {name} lacks the contract ({module_name} has no {' or '.join(missing)}())"
    return module, ""


class _Node:
    """What every node of the plugin shares: its location is its node id."""

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, self.nodeid


class _Item(_Node, pytest.Item):
    """An item of the plugin: a :class:`QualificationFailure` is reported as its message alone."""

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, QualificationFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


class QualificationCollector(_Node, pytest.Collector):
    """The ``mystique`` node: one child per configured validator."""

    def collect(self) -> list[pytest.Collector]:
        state = self.config.stash[STATE_KEY]
        return [ValidatorCollector.from_parent(self, name=marker_name(v), validator=v) for v in state.validators]


class ValidatorCollector(_Node, pytest.Collector):
    """One validator: one item per group at the session's level, or one skipped item."""

    def __init__(self, *, validator: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validator = validator
        self.add_marker(marker_name(validator))

    def collect(self) -> list[pytest.Item]:
        state = self.config.stash[STATE_KEY]
        try:
            module, why = load_validator(self.validator)
        except Exception as exc:  # a validator that fails to import is a failed check, not a skip
            return [BrokenValidatorItem.from_parent(self, name="import", error=exc)]
        if module is None:
            return [UnavailableValidatorItem.from_parent(self, name="unavailable", reason=why)]
        source = Path(getattr(module, "__file__", None) or self.path)
        listed = getattr(module, "qualification_groups", module.groups)  # a validator may narrow its item list
        groups = [str(g) for g in listed(state.level)]
        quick = set(map(str, listed("quick"))) if state.level != "quick" else set(groups)
        items = []
        for group in groups:
            item = CheckGroupItem.from_parent(self, name=group, path=source, module=module, group=group)
            if group not in quick:
                item.add_marker("slow")
            items.append(item)
        return items


class UnavailableValidatorItem(_Item):
    """Stands for a validator that is not installed or lacks the contract: always skipped."""

    def __init__(self, *, reason: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reason = reason
        self.add_marker(pytest.mark.skip(reason=reason))  # reported at the item, not inside the plugin

    def runtest(self) -> None:
        pytest.skip(self.reason)


class BrokenValidatorItem(_Item):
    """Stands for a validator whose import raised: always fails with the import error."""

    def __init__(self, *, error: BaseException, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise QualificationFailure(
            f"validator {self.parent.validator} failed to import: {type(self.error).__name__}: {self.error}\n"
            + "".join(traceback.format_exception(type(self.error), self.error, self.error.__traceback__))
        )


def format_failure(validator: str, group: str, df: Any, seed: int, target_label: str) -> str:
    """The failure message of a group: a header line, then one line per failing row.

    Each row line reads ``status check [subject, dtype]: metric = value unit vs threshold -- detail``.
    """
    from mystique.results import BAD_STATUSES

    bad = df[df["status"].isin(BAD_STATUSES)]
    undecided = bool(len(bad)) and bool((bad["status"] == "inconclusive").all())
    how = "were undecided (inconclusive, none failed)" if undecided else "failed"
    lines = [f"{len(bad)} of {len(df)} checks of {validator}::{group} {how} on {target_label} (seed {seed}):"]
    for _, row in bad.iterrows():
        where = ", ".join(x for x in (row["subject"], row["dtype"]) if x)
        value = "" if row["value"] != row["value"] else f"{row['value']:.6g}"
        bound = "" if row["threshold"] != row["threshold"] else f" vs threshold {row['threshold']:.6g}"
        unit = f" {row['unit']}" if row["unit"] else ""
        detail = f" -- {row['detail']}" if row["detail"] else ""
        lines.append(f"  {row['status']} {row['check']} [{where}]: {row['metric']} = {value}{unit}{bound}{detail}")
    return "\n".join(lines)


def nothing_checked_reason(df: Any) -> str:
    """Why a group with no check row (every row ``skip`` or ``info``) is reported skipped: ``only
    measurements`` when it has no skip, else ``nothing checked`` with the skip reasons."""
    skips = df[df["status"] == "skip"]
    measured = int((df["status"] == "info").sum())
    if not len(skips):
        return f"only measurements: {measured} info rows, no check with a verdict"
    reasons = sorted({d for d in skips["detail"] if d}) or ["every check skipped"]
    return "nothing checked" + (f" ({measured} measurements)" if measured else "") + ": " + "; ".join(reasons)


class CheckGroupItem(_Item):
    """One group of one validator, run on the session's target."""

    def __init__(self, *, module: Any, group: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module
        self.group = group

    @property
    def validator(self) -> str:
        return self.parent.validator

    def reproduce(self, state: QualState) -> str:
        """The ``mystique qualify`` command that runs this group alone on the same target and seed."""
        import shlex

        words = ["mystique", "qualify", "--device", state.device, "--level", state.level, "--seed", str(state.seed)]
        if state.inject:
            words += ["--inject", state.inject]
        if state.emulate:
            words += ["--emulate", state.emulate]
        words += ["--validators", self.validator, "-k", self.group, "-o", "OUT"]
        return shlex.join(words)

    def _out_dir(self, state: QualState) -> Path:
        if state.artifacts_root is None:
            state.artifacts_root = Path(tempfile.mkdtemp(prefix="mystique-qualify-"))
        path = state.artifacts_root / marker_name(self.validator) / self.group
        path.mkdir(parents=True, exist_ok=True)
        return path

    def runtest(self) -> None:
        from mystique import results

        state = self.config.stash[STATE_KEY]
        out_dir = self._out_dir(state)
        try:
            df = self.module.run(state.target, level=state.level, seed=state.seed, groups=[self.group],
                                 out_dir=out_dir)
        except Exception as exc:
            self._record_error(state, exc)
            raise
        finally:
            _remove_empty_dirs(out_dir, stop=state.artifacts_root)
        try:
            df = results.with_reproduce(results.validate(df), self.reproduce(state))
        except ValueError as exc:
            self._record_error(state, exc)
            raise QualificationFailure(
                f"{self.validator}::{self.group} returned a table outside the results schema: {exc}") from exc
        state.frames.append(df)
        from mystique.results import BAD_STATUSES

        n_bad = int(df["status"].isin(BAD_STATUSES).sum())
        self.user_properties += [("device", state.target.label), ("seed", state.seed),
                                 ("checks", len(df)), ("failed", n_bad)]
        if len(df) == 0:
            raise QualificationFailure(f"{self.validator}::{self.group} produced no results on {state.target.label}")
        if n_bad:
            raise QualificationFailure(format_failure(self.validator, self.group, df, state.seed, state.target.label))
        if not results.counts(df).checks:  # only skips and measurements: nothing passed, so not a pass
            pytest.skip(nothing_checked_reason(df)[:500])

    def _record_error(self, state: QualState, exc: BaseException) -> None:
        """Keep a crash of the validator in results.csv as an ``error`` row (when its suite is known)."""
        from mystique.results import SUITES, Results

        suite = marker_name(self.validator)
        if suite not in SUITES:
            return
        rows = Results(state.context, suite)
        rows.add("validator_error", self.group, "exception", None, status="error",
                 detail=f"{type(exc).__name__}: {exc} (seed {state.seed})")
        state.frames.append(rows.frame())


def _remove_empty_dirs(path: Path, stop: Path | None) -> None:
    """Remove ``path`` and its empty parents up to (not including) ``stop`` when they hold nothing."""
    while stop is not None and path != stop and stop in path.parents:
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent
