"""`mystique selftest`: does the suite tell a healthy device from a broken one, here?

A qualification suite earns trust on a device only when (a) the healthy device passes it and (b)
every fault it claims to catch makes it fail. :func:`selftest` runs the quick qualification
(:func:`mystique.validators.qualify.qualify`) once on the healthy device, then once under each
built-in fault simulation (``mystique faults``) and each ``--inject SPEC`` given, each run in its
own folder, and records rows of suite ``selftest``:

* ``healthy_false_failures`` (one check): what went wrong on the healthy device, threshold 0: its
  failed rows (fail, error or inconclusive), plus one for each of: qualify ending in failure with no
  failed row to show for it (a validator that failed to import or to collect, a group that returned
  no rows), qualify's exit code other than 0 or 1, a suite expected to run that produced no row,
  nothing checked at all, or the run not finishing. Pass only at 0.
* ``fault_caught`` (one check per fault): the ``fail`` rows of the run under that fault (value),
  threshold 1: pass when at least one check failed. Error and inconclusive rows under a fault are no
  catch (a crash or a doubt proves nothing); the detail counts them. A run that did not finish is an
  ``error`` row.
* ``failed_check`` (measurements, ``info``): one per run and ``suite.check`` with failed rows
  (subject the run, ``healthy`` or the fault; metric ``suite.check``; value the number of rows): on
  the healthy run its fail, error and inconclusive rows (false failures), under a fault its fail
  rows (the catches). The report's fault x check matrix reads these; the names in the other rows'
  details are for people.
* ``run_time`` (measurements, ``info``): the wall time of each run.

With the default validators (:data:`.pytest_plugin.DEFAULT_VALIDATORS`, ``performance`` among
them: its quick item ``mode`` pairs the device with and without the injected mode) each run
qualifies with the validators its fault can fail (:func:`run_validators`): the slowness faults
(``throttle``, ``straggler``) change speed, not numbers, so their runs are the performance item
alone; the other built-in simulations change numbers, not speed (their Python dispatch costs time
of its own, which the ``mode`` item would only measure), so their runs leave it out, and the
``soft_errors`` ``pvf`` group (:data:`NUMERIC_FAULT_SKIPS`: measurements, no catch); the healthy run
and each ``--inject SPEC`` get every default validator and group.

Goldens that do not depend on the fault (fp64 results and the bounds derived from them) are computed
by the healthy run and reused by the fault runs (:mod:`.golden_cache`); the reference benchmarks
are captured once per process (:mod:`.correctness.benchmarks`).

Exit 0 only when the healthy run passes and every fault is caught.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mystique.reports import render_report

from mystique import faults, results
from mystique.errors import MystiqueError, UsageError
from mystique.io import atomic_write_text, check_output_dir, staged_output_dir
from mystique.progress import Progress
from mystique.targets import make_target

from . import golden_cache
from .pytest_plugin import DEFAULT_VALIDATORS, marker_name
from .qualify import qualify

HEALTHY = "healthy"


@dataclass(frozen=True)
class RunOutcome:
    """One qualification run of the self-test: its name, fault spec, rows, time, qualify's exit code
    (None where qualify did not run) and the suites expected to produce rows."""

    name: str
    inject: str | None
    frame: Any  # results DataFrame
    seconds: float
    error: str = ""
    exit_code: int | None = None
    expected: tuple[str, ...] = ()

    def rows_by_check(self, statuses: Sequence[str]) -> dict[str, int]:
        """``suite.check`` -> how many of its rows have one of ``statuses``, most first."""
        df = self.frame
        out: dict[str, int] = {}
        if len(df):
            for suite, check in zip(*(df.loc[df["status"].isin(statuses), c] for c in ("suite", "check"))):
                out[f"{suite}.{check}"] = out.get(f"{suite}.{check}", 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def caught_by(self) -> dict[str, int]:
        """``suite.check`` -> how many of its rows failed (``fail`` only: an error or an inconclusive
        row is no catch)."""
        return self.rows_by_check(("fail",))

    def missing_suites(self) -> list[str]:
        """The expected suites of which this run has no row."""
        have = set(self.frame["suite"]) if len(self.frame) else set()
        return [s for s in self.expected if s not in have]


def fault_specs(extra: Sequence[str] = (), only: Sequence[str] | None = None) -> list[str]:
    """The built-in fault simulations (or ``only`` of them), then the user's ``--inject`` specs."""
    names = sorted(faults.FAULTS)
    if only:
        unknown = [n for n in only if n not in faults.FAULTS]
        if unknown:
            raise UsageError(f"unknown fault simulation(s) {', '.join(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in set(only)]
    specs = names + [s.strip() for s in extra if s.strip()]
    if len(set(specs)) != len(specs):
        raise UsageError("a fault simulation is named twice")
    return specs


def _folder(spec: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)
    return f"fault-{safe}"[:120]


def run_validators(spec: str | None, validators: Sequence[str] | None) -> list[str] | None:
    """The validators of one self-test run (None: qualify's defaults): the caller's when given; else
    the performance validator alone under a slowness fault, every default but performance under the
    other built-in faults, the defaults on the healthy device and under a user's ``--inject`` mode."""
    if validators is not None:
        return list(validators)
    name = spec.split(":", 1)[0] if spec else None
    if name is None or name not in faults.FAULTS:
        return None
    if name in faults.SLOWNESS_FAULTS:
        return ["performance"]
    return [v for v in DEFAULT_VALIDATORS if v != "performance"]


#: groups a built-in numeric fault's run leaves out: ``pvf``'s trials are measurements (``info``: no
#: verdict, so no catch), and its one check, the unflipped model on the device against its golden by the
#: PVF's coarse change test, is what ``numerics.model_*_deviation`` checks with derived bounds; under a
#: fault the trials cost a quarter of the run (every forward pass under the fault's mode) for nothing the
#: self-test reads. The healthy run and a user's ``--inject`` mode keep it.
NUMERIC_FAULT_SKIPS: tuple[str, ...] = ("pvf",)


def run_keyword(spec: str | None, validators: Sequence[str] | None) -> str | None:
    """The ``-k`` expression of one self-test run (None: every group): a built-in numeric fault's run
    without :data:`NUMERIC_FAULT_SKIPS` (unless the caller chose the validators)."""
    name = spec.split(":", 1)[0] if spec else None
    if validators is not None or name is None or name not in faults.FAULTS or name in faults.SLOWNESS_FAULTS:
        return None
    return " and ".join(f"not {g}" for g in NUMERIC_FAULT_SKIPS)


def expected_suites(spec: str | None, validators: Sequence[str] | None) -> tuple[str, ...]:
    """The suites a self-test run must produce rows of: those its validators (:func:`run_validators`) name."""
    names = [marker_name(v) for v in (run_validators(spec, validators) or DEFAULT_VALIDATORS)]
    return tuple(dict.fromkeys(n for n in names if n in results.SUITES))


def _run_one(stage: Path, name: str, folder: str, *, device: str, inject: str | None, emulate: str | None,
             level: str, seed: int, validators: Sequence[str] | None) -> RunOutcome:
    t0 = time.perf_counter()
    out = stage / folder
    expected = expected_suites(inject, validators)
    log = io.StringIO()  # pytest's own report of the run: kept beside its results, not on the terminal
    code: int | None = None
    try:
        try:
            with contextlib.redirect_stdout(log):
                code = qualify(out, device=device, inject=inject, emulate=emulate, level=level, seed=seed,
                               validators=run_validators(inject, validators), keyword=run_keyword(inject, validators),
                               quiet=True).exit_code
        finally:
            if out.is_dir():
                atomic_write_text(out / "pytest.log", log.getvalue())
        csv = out / "results.csv"
        df = results.read_csv(csv) if csv.exists() else results.to_frame([])
        return RunOutcome(name, inject, df, time.perf_counter() - t0, exit_code=code, expected=expected)
    except UsageError:
        raise
    except MystiqueError as exc:  # the run could not finish: neither a pass nor a catch
        return RunOutcome(name, inject, results.to_frame([]), time.perf_counter() - t0, error=str(exc),
                          exit_code=code, expected=expected)


def selftest(output: str | os.PathLike, *, device: str = "cpu", emulate: str | None = None,
             inject: Sequence[str] = (), faults: Sequence[str] | None = None, level: str = "quick",
             seed: int = 0, validators: Sequence[str] | None = None, force: bool = False) -> tuple[int, Any]:
    """Run the self-test into ``output``; return (exit code, the selftest rows).

    ``output`` gets ``results.csv`` (the selftest rows), ``report.html``, and one folder per run
    (``healthy/``, ``fault-NAME/``) with that run's ``results.csv``, ``report.html``, ``junit.xml`` and
    ``pytest.log``.
    """
    if level not in ("quick", "full"):
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    specs = fault_specs(inject, faults)
    check_output_dir(output, force)
    target = make_target(device, None, emulate)  # bad input and absent devices: before anything runs
    for spec in specs:
        make_target(device, spec, emulate)
    runs: list[tuple[str, str, str | None]] = [(HEALTHY, HEALTHY, None)] + [(s, _folder(s), s) for s in specs]
    progress = Progress("selftest", total=len(runs))
    with staged_output_dir(output, force) as stage:
        outcomes: list[RunOutcome] = []
        goldens = golden_cache.Store()  # filled by the healthy run only, read by the fault runs
        for name, folder, spec in runs:
            progress.step(f"qualification ({level}) on {target.label}" + (f" under fault {spec}" if spec else ", healthy"))
            with golden_cache.shared(goldens, fill=spec is None):
                outcomes.append(_run_one(stage, name, folder, device=device, inject=spec, emulate=emulate,
                                         level=level, seed=seed, validators=validators))
            o = outcomes[-1]
            progress.note(f"{name}: {results.counts(o.frame).line}" + (f"; {o.error}" if o.error else "")
                          + f" ({o.seconds:.1f} s)")
        df = rows(target, outcomes, level=level, seed=seed, emulate=emulate)
        results.write_csv(df, stage / "results.csv")
        tables = [p for p in (stage / "results.csv", stage / HEALTHY / "results.csv") if p.exists()]
        render_report([str(p) for p in tables], str(stage / "report.html"),
                      title=f"Mystique Suite self-test on {target.label}")
    return results.exit_code(df), df


def healthy_problems(o: RunOutcome) -> list[str]:
    """What fails the healthy run beside its failed rows (each counts one false failure).

    qualify's exit code, explicitly: 0 and 1 are verdicts its rows explain (1 with no failed row is a
    problem of its own: a validator that failed to import or to collect); 4 (undecided) is a run whose
    only bad rows are inconclusive, each already counted as a false failure (a healthy device must be
    decided clean, and an undecided row is not clean), so it adds a problem only when no inconclusive
    row explains it; 3 (nothing checked) is counted by "nothing was checked"; any other code (2: bad
    input) is a problem of its own."""
    if o.error:
        return [f"the healthy qualification did not finish: {o.error}"]
    out = []
    c = results.counts(o.frame)
    undecided_rows = int((o.frame["status"] == "inconclusive").sum()) if len(o.frame) else 0
    if o.exit_code == results.FAILED and not c.failed:
        out.append(f"qualify failed with no failed row to show for it (a validator that failed to import or to "
                   f"collect, or a group that returned no rows: see {HEALTHY}/pytest.log)")
    elif o.exit_code == results.UNDECIDED:
        if not undecided_rows:
            out.append(f"qualify exited {results.UNDECIDED} (undecided) with no inconclusive row to show for it")
    elif o.exit_code == results.NOTHING_CHECKED:
        out.append(f"qualify exited {results.NOTHING_CHECKED} (nothing checked)")
    elif o.exit_code not in (None, 0, results.FAILED):
        out.append(f"qualify exited {o.exit_code}")
    missing = o.missing_suites()
    if missing:
        out.append(f"no rows from suite{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    if not c.checks and o.exit_code != results.NOTHING_CHECKED:
        out.append("nothing was checked")
    return out


def fault_outcome(o: RunOutcome) -> str:
    """How a fault run ended, by qualify's exit code, for its row: only ``fail`` rows are a catch, so exit 1
    with fail rows is the one catch; exit 4 (undecided: inconclusive rows, no fail) is a doubt, never a
    catch; exit 0 (passed) and 3 (nothing checked) are misses; exit 1 with no fail row (error rows, a
    collection failure) proves nothing; any other code is a run that did not judge."""
    code = o.exit_code
    fails = sum(o.caught_by().values())
    if code == results.FAILED:
        return "caught" if fails else "failed with no fail row (errors prove nothing)"
    if code == results.UNDECIDED:
        return "undecided (qualify exit 4: inconclusive rows only), not a catch"
    if code == 0:
        return "passed: the fault went unnoticed"
    if code == results.NOTHING_CHECKED:
        return "nothing checked (qualify exit 3)"
    return "caught" if code is None and fails else f"qualify exited {code}"


def _items(counted: dict[str, int]) -> str:
    return "; ".join(f"{k} x{v}" for k, v in counted.items())


def _healthy_row(res: results.Results, target: Any, o: RunOutcome, repro: str) -> None:
    bad = o.rows_by_check(results.BAD_STATUSES)
    problems = healthy_problems(o)
    n = sum(bad.values()) + len(problems)
    res.add("healthy_false_failures", target.label, "false_failures", n, threshold=0,
            status="pass" if n == 0 else "fail",
            detail=(f"{results.counts(o.frame).line} on the healthy device" + (f"; failing: {_items(bad)}" if bad else "")
                    + "".join(f"; {p}" for p in problems) + f"; rows in {HEALTHY}/results.csv; {repro}"))


def _fault_row(res: results.Results, target: Any, o: RunOutcome, repro: str, tail: str) -> None:
    subject = o.inject or o.name
    if o.error:
        res.add("fault_caught", subject, "catching_rows", None, status="error", threshold=1,
                detail=f"the qualification under this fault did not finish: {o.error}; {repro} --inject {subject}")
        return
    caught = o.caught_by()
    how = fault_outcome(o)
    n = sum(caught.values()) if how == "caught" else 0
    c = results.counts(o.frame)
    doubts = c.failed - sum(caught.values())  # error and inconclusive rows: reported, never a catch
    res.add("fault_caught", subject, "catching_rows", n, threshold=1, status="pass" if n else "fail",
            detail=(f"caught by {_items(caught)}" if n else f"NOT caught ({how}): {c.line}")
            + (f"; {doubts} error or inconclusive rows, not catches" if doubts else "")
            + f"; rows in {_folder(subject)}/results.csv; reproduce: mystique qualify --device {target.device}"
              f"{tail} --inject {subject} -o OUT")


def rows(target: Any, outcomes: Sequence[RunOutcome], *, level: str, seed: int, emulate: str | None) -> Any:
    """The selftest rows of ``outcomes`` (the first is the healthy run)."""
    ctx = results.RunContext.for_target(target)
    res = results.Results(ctx, "selftest")
    emu = f" --emulate {emulate}" if emulate else ""
    repro = f"mystique selftest --device {target.device}{emu} --level {level} --seed {seed}"
    healthy, faulty = outcomes[0], outcomes[1:]
    _healthy_row(res, target, healthy, repro)
    for o in faulty:
        _fault_row(res, target, o, repro, f"{emu} --level {level} --seed {seed}")
    for o in outcomes:  # what the fault x check matrix reads
        counted = o.rows_by_check(results.BAD_STATUSES) if o is healthy else o.caught_by()
        for key, n in counted.items():
            res.add("failed_check", HEALTHY if o is healthy else (o.inject or o.name), key, n, unit="rows",
                    status="info", detail=("false failures on the healthy device" if o is healthy
                                           else "fail rows under this fault: its catches"))
    for o in outcomes:
        res.add("run_time", o.inject or o.name, "seconds", o.seconds, unit="s", status="info",
                detail=f"wall time of the quick qualification run ({results.counts(o.frame).line})")
    return res.frame()
