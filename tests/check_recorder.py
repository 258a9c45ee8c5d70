"""Every check can fail, proven by a test (issue #30): the session-side half.

:func:`register` (called from ``tests/conftest.py``) wraps :meth:`mystique.results.Results.add` so
that every row the product's code writes in this process is noted as ``(owner, suite, check, status)``:
``owner`` is the running test's node id without its parametrization, or, for a row written while a
module-, class- or session-scoped fixture is set up, that fixture (``<baseid>::<name>@fixture``);
a test sees the rows of its own and of every such fixture it uses. Only rows whose ``add`` is called
from the product's own folders (:data:`PRODUCT`: ``mystique``, ``validators``, ``workloads``,
``reports``) are noted: tables a test builds itself, or a fake validator it writes to a temporary
folder, do not show what a check writes. Rows written in a subprocess (the CLI run with
``subprocess``, the ranks of a multi-rank replay) are not seen either: a reproducer must write its
fail row in-process.

At the end of the session the notes are held to ``tests/check_reproducers.py``:

* (a) on a run of the whole default selection (no ``-k``, no ``--deselect``, no path other than
  the ``testpaths``): every ``(suite, check)`` seen writing ``pass`` has a ``REPRODUCERS`` entry;
* (b) on every run: every ``REPRODUCERS`` entry of which at least one test ran and passed was
  seen writing ``fail`` (or its ``FAILS_AS`` status) in one of those tests (else its reproducer no
  longer reproduces).

Each violation is one line in the terminal summary and the session exits 1. Under pytest-xdist
each worker writes its notes to a JSON file in a folder the controller names (``workerinput``) and
the controller checks the union; test outcomes are the controller's own (xdist reports them there).
``MYSTIQUE_CHECK_ROWS=PATH`` also writes the session's notes to ``PATH`` (JSON) for inspection.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

NAME = "mystique-check-recorder"
_DIR_KEY = "mystique_check_rows_dir"


def _product_folders() -> tuple[str, ...]:
    """The folders the product's packages load from (``validators/`` for ``mystique.validators``, ...)."""
    out = []
    for name in ("mystique", "mystique.validators", "mystique.workloads", "mystique.reports"):
        spec = importlib.util.find_spec(name)
        out += [str(Path(p).resolve()) + os.sep for p in (spec.submodule_search_locations or [])] if spec else []
    return tuple(out)


PRODUCT = _product_folders()


def base_id(nodeid: str) -> str:
    """``tests/test_x.py::test_y`` of ``tests/test_x.py::test_y[param]``."""
    return nodeid.split("[", 1)[0]


def register(config: pytest.Config) -> None:
    """Register the recorder (``-p no:mystique-check-recorder`` turns it off, and with it the checks)."""
    if not config.pluginmanager.is_blocked(NAME):
        config.pluginmanager.register(Recorder(config), NAME)


class Recorder:
    """Notes the rows of one pytest process; the controller (or a lone process) also judges them."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.rows: set[tuple[str, str, str, str]] = set()  # (owner, suite, check, status)
        self.owner = ""
        self.uses: dict[str, set[str]] = {}  # test id -> the scoped fixtures (owners) it used
        self.passed: set[str] = set()  # test ids with an item whose call phase passed
        self.failed: set[str] = set()  # test ids with a failed phase
        self.violations: list[str] = []
        self.worker = getattr(config, "workerinput", None)
        self._restore: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._install()

    # -- recording --------------------------------------------------------------------------------

    def _install(self) -> None:
        from mystique.results import Results

        original = Results.add
        rows, recorder, getframe, product = self.rows, self, sys._getframe, PRODUCT

        @functools.wraps(original)
        def add(res: Any, *args: Any, **kwargs: Any) -> Any:
            row = original(res, *args, **kwargs)
            if getframe(1).f_code.co_filename.startswith(product):
                rows.add((recorder.owner, row["suite"], row["check"], row["status"]))
            return row

        Results.add = add  # type: ignore[method-assign]
        self._restore = lambda: setattr(Results, "add", original)

    def pytest_unconfigure(self) -> None:
        if self._restore is not None:
            self._restore()
        if self._tmp is not None:
            self._tmp.cleanup()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        tid = base_id(item.nodeid)
        uses = self.uses.setdefault(tid, set())
        for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
            if defs and defs[-1].scope != "function":
                uses.add(_fixture_owner(defs[-1]))
        self.owner = tid
        try:
            yield
        finally:
            self.owner = ""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any):
        if fixturedef.scope == "function":
            yield
            return
        outer, self.owner = self.owner, _fixture_owner(fixturedef)
        try:
            yield
        finally:
            self.owner = outer

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tid = base_id(report.nodeid)
        if report.failed:
            self.failed.add(tid)
        elif report.when == "call" and report.passed:
            self.passed.add(tid)

    # -- xdist ------------------------------------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Controller: name the folder each worker leaves its notes in."""
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mystique-check-rows-")
        node.workerinput[_DIR_KEY] = self._tmp.name

    def _notes(self) -> dict[str, Any]:
        return {"rows": sorted(self.rows), "uses": {k: sorted(v) for k, v in self.uses.items()},
                "passed": sorted(self.passed), "failed": sorted(self.failed)}

    def _merge(self, notes: dict[str, Any]) -> None:
        self.rows.update(tuple(r) for r in notes["rows"])
        for tid, owners in notes["uses"].items():
            self.uses.setdefault(tid, set()).update(owners)

    # -- judging ----------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        dump = os.environ.get("MYSTIQUE_CHECK_ROWS")
        if self.worker is not None:
            folder = self.worker.get(_DIR_KEY)
            if folder:
                Path(folder, f"{self.worker.get('workerid', 'worker')}.json").write_text(json.dumps(self._notes()))
            return
        if self._tmp is not None:
            for f in sorted(Path(self._tmp.name).glob("*.json")):
                self._merge(json.loads(f.read_text()))
        if dump:
            Path(dump).write_text(json.dumps(self._notes(), indent=1))
        if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return
        from check_reproducers import FAILS_AS, REPRODUCERS

        self.violations = judge(REPRODUCERS, self.rows, self.uses, self.passed, self.failed,
                                whole_run=_whole_run(self.config), fails_as=FAILS_AS)
        if self.violations:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.violations:
            return
        terminalreporter.section("every check can fail (tests/check_reproducers.py)", sep="=", red=True)
        for line in self.violations:
            terminalreporter.line(line, red=True)


def _fixture_owner(fixturedef: Any) -> str:
    return f"{fixturedef.baseid}::{fixturedef.argname}@fixture"


def _whole_run(config: pytest.Config) -> bool:
    """Whether this run selects the whole default selection (so every check that can pass ran)."""
    opt = config.option
    if any(getattr(opt, name, None) for name in ("keyword", "deselect", "lf", "stepwise")):
        return False
    paths = {(config.rootpath / p).resolve() for p in (config.getini("testpaths") or ["."])}
    here = config.invocation_params.dir
    return all("::" not in a and (here / a).resolve() in paths for a in config.args)


def judge(reproducers: dict[tuple[str, str], tuple[str, ...]], rows: Iterable[tuple[str, str, str, str]],
          uses: dict[str, set[str]], passed: set[str], failed: set[str], *, whole_run: bool,
          fails_as: dict[tuple[str, str], str] | None = None) -> list[str]:
    """One line per violation of (a) (only on a whole run) and (b); see the module docstring. ``fails_as``:
    the status a check's reproducer must write where its bad outcome is not ``fail`` by design."""
    rows = set(rows)
    out = []
    if whole_run:
        passing: dict[tuple[str, str], str] = {}
        for owner, suite, check, status in sorted(rows):
            if status == "pass":
                passing.setdefault((suite, check), owner)
        for (suite, check), owner in sorted(passing.items()):
            if (suite, check) not in reproducers:
                out.append(f"{suite}/{check} wrote pass (in {owner or 'no test'}) but has no reproducer: "
                           "add a test that drives it to fail to REPRODUCERS in tests/check_reproducers.py")
    for (suite, check), tests in sorted(reproducers.items()):
        ran = [t for t in tests if t in passed and t not in failed]
        if not ran:
            continue
        bad = (fails_as or {}).get((suite, check), "fail")
        if not any((owner, suite, check, bad) in rows for t in ran for owner in {t} | uses.get(t, set())):
            out.append(f"{suite}/{check}: its reproducer {', '.join(ran)} passed but wrote no {bad} row "
                       f"for it in this process (a reproducer must drive the check to {bad} in-process)")
    return out
