"""Every check can fail, proven by a test (issue #30): the static half.

An AST scan of ``mystique/`` and ``validators/`` finds every check name that can be written with
status ``pass`` (a ``Results.add`` call whose ``status`` is not one of the constants
``info``/``skip``/``error``/``fail``, and every call of a function that forwards its check-name
parameter to such a call: ``Ctx.bound``, ``Ctx.fact``, ``rate_rows``, ...). Each must have a
reproducer in ``tests/check_reproducers.py`` (or a reasoned exemption there); the reproducers must
name tests that exist and checks that exist. ``tests/check_recorder.py`` checks at the end of each
session that the reproducers that ran did write a ``fail`` row (and, on a whole run, that every
check seen passing has one); the last tests here show that the recorder notices both.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import check_recorder
import pytest
from check_reproducers import DYNAMIC, EXEMPT, FAILS_AS, REPRODUCERS

from mystique.results import SUITES, Results, RunContext

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("mystique", "validators")
#: which suite the rows written by the code under a path belong to (the first matching prefix)
SUITE_OF_PATH: tuple[tuple[str, str], ...] = (
    ("mystique/capture.py", "capture"),
    ("mystique/distributed/capture.py", "capture"),  # a rank's own results.csv
    ("mystique/distributed/", "distributed"),
    ("mystique/replay/", "replay"),
    ("mystique/predict/", "predict"),
    ("validators/numerics/", "numerics"),
    ("validators/soft_errors/", "soft_errors"),
    ("validators/correctness/", "correctness"),
    ("validators/performance/", "performance"),
    ("validators/onnx_runtime.py", "onnx"),
    ("validators/selftest.py", "selftest"),
)
NEVER_PASS = frozenset({"info", "skip", "error", "fail"})


# --- the scan ------------------------------------------------------------------------------------

def _strings(node: ast.AST) -> set[str] | None:
    """The string constants an expression can be (through ``a if c else b``), None if not only constants."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        a, b = _strings(node.body), _strings(node.orelse)
        return None if a is None or b is None else a | b
    return None


def _up(node: ast.AST, kind: type | tuple[type, ...]) -> ast.AST | None:
    node = getattr(node, "parent", None)
    while node is not None and not isinstance(node, kind):
        node = getattr(node, "parent", None)
    return node


def _assigned_dict(name: str, where: ast.AST) -> ast.Dict | None:
    """The dict literal ``name`` is assigned in the function around ``where`` (or its module)."""
    scopes = [s for s in (_up(where, (ast.FunctionDef, ast.AsyncFunctionDef)), _up(where, ast.Module)) if s]
    for scope in scopes:
        for n in ast.walk(scope):
            if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)):
                return n.value
    return None


class Scan:
    """Check names that can be written with ``pass``: ``names[name] = {"path:line", ...}``, patterns
    (``fleet_*`` of an f-string) included; ``unresolved`` lists the check arguments it could not read."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module] = {}
        for top in SOURCES:
            for path in sorted((REPO / top).rglob("*.py")):
                tree = ast.parse(path.read_text(), filename=str(path))
                for node in ast.walk(tree):
                    for child in ast.iter_child_nodes(node):
                        child.parent = node  # type: ignore[attr-defined]
                self.trees[path.relative_to(REPO).as_posix()] = tree
        self.names: dict[str, set[str]] = {}
        self.unresolved: list[str] = []
        self.forwarders: dict[str, tuple[int | None, str, int]] = {}  # function -> (index, param, required)
        todo: list[str] = []
        for path, call in self._calls():
            if isinstance(call.func, ast.Attribute) and call.func.attr == "add":
                kw = {k.arg: k.value for k in call.keywords}
                if "status" not in kw:
                    continue  # not Results.add (its status is keyword-only and required)
                status = _strings(kw["status"])
                if status is not None and not status - NEVER_PASS:
                    continue
                arg = call.args[0] if call.args else kw.get("check")
                if arg is not None and not isinstance(arg, ast.Starred):
                    self._resolve(arg, path, call, todo)
        while todo:
            fname = todo.pop()
            index, param, required = self.forwarders[fname]
            for path, call in self._calls():
                called = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
                if called != fname:
                    continue
                starred = (any(isinstance(a, ast.Starred) for a in call.args)
                           or any(k.arg is None for k in call.keywords))
                if not starred and len(call.args) + len(call.keywords) < required:
                    continue  # another function of that name: this call could not bind to the forwarder
                kw = {k.arg: k.value for k in call.keywords}
                arg = kw.get(param)
                if arg is None and index is not None and index < len(call.args):
                    arg = call.args[index]
                if arg is None or isinstance(arg, ast.Starred):
                    self.unresolved.append(f"{path}:{call.lineno}: {ast.unparse(call)[:80]}")
                else:
                    self._resolve(arg, path, call, todo)

    def _calls(self) -> Iterator[tuple[str, ast.Call]]:
        for path, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    yield path, node

    def _note(self, name: str, path: str, call: ast.Call) -> None:
        self.names.setdefault(name, set()).add(f"{path}:{call.lineno}")

    def _resolve(self, expr: ast.AST, path: str, call: ast.Call, todo: list[str]) -> None:
        """Note the check name(s) ``expr`` (the check argument of ``call``) can be."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return self._note(expr.value, path, call)
        if isinstance(expr, ast.IfExp):
            self._resolve(expr.body, path, call, todo)
            return self._resolve(expr.orelse, path, call, todo)
        if isinstance(expr, ast.JoinedStr):
            pattern = "".join(v.value if isinstance(v, ast.Constant) else "*" for v in expr.values)
            return self._note(pattern, path, call)
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
            table = _assigned_dict(expr.value.id, call)
            if table is not None:
                for value in table.values:
                    self._resolve(value, path, call, todo)
                return None
        if isinstance(expr, ast.Name):
            fn = _up(call, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and self._forward(fn, expr.id, todo):
                return None
            loop = _up(call, ast.For)
            while isinstance(loop, ast.For):
                target = loop.target
                ids = [target.id] if isinstance(target, ast.Name) else [getattr(e, "id", None) for e in
                                                                        getattr(target, "elts", [])]
                if expr.id in ids and isinstance(loop.iter, (ast.Tuple, ast.List)):
                    k = ids.index(expr.id)
                    for el in loop.iter.elts:
                        self._resolve(el if isinstance(target, ast.Name) else el.elts[k], path, call, todo)
                    return None
                loop = _up(loop, ast.For)
        self.unresolved.append(f"{path}:{call.lineno}: check name {ast.unparse(expr)!r}")
        return None

    def _forward(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, todo: list[str]) -> bool:
        """Whether ``name`` is a parameter of ``fn``; if so, ``fn`` is a forwarder whose calls are scanned."""
        a = fn.args
        positional = [p.arg for p in a.posonlyargs + a.args]
        if name not in positional and name not in [p.arg for p in a.kwonlyargs]:
            return False
        bound = 1 if positional[:1] in (["self"], ["cls"]) else 0
        required = len(positional) - len(a.defaults) - bound + sum(d is None for d in a.kw_defaults)
        index = positional.index(name) - bound if name in positional else None
        if fn.name not in self.forwarders:
            self.forwarders[fn.name] = (index, name, required)
            todo.append(fn.name)
        return True


@cache
def scan() -> Scan:
    return Scan()


def suite_of(path: str) -> str | None:
    return next((suite for prefix, suite in SUITE_OF_PATH if path.startswith(prefix)), None)


def _expanded(name: str) -> tuple[str, ...]:
    return DYNAMIC.get(name, (name,))


# --- the registry against the code ---------------------------------------------------------------

def test_the_scan_reads_every_check_name_it_meets():
    """A check name the scan cannot read (a variable it cannot follow) would hide a check: name it as
    a constant, a parameter forwarded from constants, a ``for`` over a literal table or an f-string."""
    assert scan().unresolved == []


def test_the_scan_finds_the_known_forwarders():
    """The helpers that forward a check name (so a broken scan that finds none fails here)."""
    assert {"bound", "fact", "rate_rows"} <= set(scan().forwarders)
    assert {"trace_recorded", "normwise_error", "detection_campaign", "fleet_*"} <= set(scan().names)


def test_every_check_that_can_pass_has_a_reproducer_or_an_exemption():
    """Adding a check kind that can write ``pass`` without a test that drives it to ``fail`` fails here."""
    reproduced = {check for _, check in REPRODUCERS}
    missing = []
    for pattern, where in sorted(scan().names.items()):
        for name in _expanded(pattern):
            suites = {suite_of(w.split(":")[0]) for w in where}
            if name in EXEMPT:
                continue
            if name not in reproduced:
                missing.append(f"{name} (written at {', '.join(sorted(where))})")
                continue
            for suite in suites - {None}:
                if (suite, name) not in REPRODUCERS:
                    missing.append(f"{suite}/{name} (written at {', '.join(sorted(where))})")
    assert not missing, "checks that can pass with no reproducer in tests/check_reproducers.py:\n" + "\n".join(
        missing)


def test_every_file_that_writes_a_passing_row_has_a_suite():
    paths = {w.split(":")[0] for where in scan().names.values() for w in where}
    assert not {p for p in paths if suite_of(p) is None}, "add the path to SUITE_OF_PATH"


def test_exemptions_are_still_found_and_not_also_reproduced():
    """An exemption whose check the scan no longer finds, or that also has a reproducer, is stale."""
    found = {n for pattern in scan().names for n in _expanded(pattern)}
    assert not set(EXEMPT) - found
    assert not set(EXEMPT) & {check for _, check in REPRODUCERS}
    assert all(len(why) > 20 for why in EXEMPT.values())


def test_a_check_whose_bad_outcome_is_not_fail_cannot_write_fail():
    """``FAILS_AS`` is for checks whose statuses are pass and another bad one: a check that can write
    ``fail`` must be reproduced by a ``fail`` row."""
    assert set(FAILS_AS) <= set(REPRODUCERS) and set(FAILS_AS.values()) <= {"inconclusive", "error"}
    for (_suite, check), _bad in FAILS_AS.items():
        statuses = set()
        for where in scan().names[check]:
            path, line = where.split(":")
            for node in ast.walk(scan().trees[path]):
                if isinstance(node, ast.Call) and node.lineno == int(line):
                    kw = {k.arg: k.value for k in node.keywords}
                    if "status" in kw:
                        statuses |= _strings(kw["status"]) or {"?"}
        assert statuses and "fail" not in statuses and "?" not in statuses, (check, statuses)


def test_dynamic_names_expand_to_what_the_code_forms():
    """``fleet_{check}`` is formed from the figures the fleet compares."""
    from mystique.validators.performance.fleet import COMPARED

    assert set(DYNAMIC) <= set(scan().names)
    assert set(DYNAMIC["fleet_*"]) == {f"fleet_{check}" for check, _ in COMPARED}


def _source_text() -> str:
    return "\n".join(p.read_text() for top in SOURCES for p in (REPO / top).rglob("*.py"))


def test_every_reproduced_check_exists_and_can_still_pass():
    """A registry entry whose suite or check the code no longer has, or whose check the scan no longer
    finds written with ``pass`` (it became a measurement), is stale."""
    text = _source_text()
    formed = {n for names in DYNAMIC.values() for n in names}
    found = {n for pattern in scan().names for n in _expanded(pattern)}
    stale = [f"{suite}/{check}" for suite, check in REPRODUCERS
             if suite not in SUITES or (check not in formed and f'"{check}"' not in text) or check not in found]
    assert not stale


def _defines(path: Path, names: list[str]) -> bool:
    """Whether the test file ``path`` defines ``names`` (a function, or a class and its method), read
    without importing it."""
    body = ast.parse(path.read_text()).body
    for i, name in enumerate(names):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None:
            return False
        if i < len(names) - 1:
            body = node.body if isinstance(node, ast.ClassDef) else []
    return isinstance(node, ast.FunctionDef)


def test_every_reproducer_names_a_test_that_exists():
    """Node ids without parametrization: ``tests/test_x.py::test_name`` (or ``::Class::test_name``)."""
    def exists(nodeid: str) -> bool:
        path, *names = nodeid.split("::")
        return (path.startswith("tests/test_") and "[" not in nodeid and bool(names)
                and (REPO / path).is_file() and _defines(REPO / path, names))

    assert not [t for tests in REPRODUCERS.values() for t in tests if not exists(t)]
    assert all(REPRODUCERS.values())


# --- the recorder ---------------------------------------------------------------------------------

#: ``res.add`` as code of a product folder calls it (the recorder notes only the product's rows)
PRODUCT_ADD = compile("res.add(*args, **kwargs)", check_recorder.PRODUCT[-1] + "probe.py", "exec")


def _product_add(res: Results, *args, **kwargs) -> None:
    exec(PRODUCT_ADD, {"res": res, "args": args, "kwargs": kwargs})


def test_the_recorder_notes_the_rows_the_product_writes_in_this_test(request):
    if request.config.pluginmanager.is_blocked(check_recorder.NAME):
        pytest.skip("the recorder is turned off (-p no:mystique-check-recorder)")
    recorder = request.config.pluginmanager.get_plugin(check_recorder.NAME)
    assert recorder is not None
    me = check_recorder.base_id(request.node.nodeid)
    res = Results(RunContext(device="cpu"), "selftest")
    probe = [(me, "selftest", "recorder_probe", status) for status in ("pass", "fail")]
    try:
        for status in ("pass", "fail"):
            _product_add(res, "recorder_probe", "x", "m", 1, status=status)
        res.add("recorder_probe_by_test", "x", "m", 1, status="pass")  # a table the test builds
        assert set(probe) <= recorder.rows
        assert not any(check == "recorder_probe_by_test" for _, _, check, _ in recorder.rows)
    finally:
        recorder.rows.difference_update(probe)


def test_judge_names_a_pass_without_reproducer_and_a_reproducer_that_did_not_fail():
    reproducers = {("numerics", "good"): ("t::a",), ("numerics", "stale"): ("t::b",),
                   ("numerics", "by_fixture"): ("t::c",), ("numerics", "not_run"): ("t::d",),
                   ("numerics", "doubts"): ("t::e",)}
    rows = {("t::a", "numerics", "good", "fail"), ("t::a", "numerics", "good", "pass"),
            ("t::b", "numerics", "stale", "pass"), ("t::x", "numerics", "orphan", "pass"),
            ("f@fixture", "numerics", "by_fixture", "fail"), ("t::e", "numerics", "doubts", "inconclusive")}
    uses = {"t::c": {"f@fixture"}}
    lines = check_recorder.judge(reproducers, rows, uses, {"t::a", "t::b", "t::c", "t::e"}, set(), whole_run=True,
                                 fails_as={("numerics", "doubts"): "inconclusive"})
    assert len(lines) == 2 and lines[0].startswith("numerics/orphan wrote pass (in t::x)")
    assert lines[1].startswith("numerics/stale: its reproducer t::b passed but wrote no fail row")
    partial = check_recorder.judge(reproducers, rows, uses, {"t::a", "t::b", "t::c"}, {"t::b"}, whole_run=False)
    assert partial == []  # a failed reproducer is pytest's to report; no (a) on a partial run
    strict = check_recorder.judge(reproducers, rows, uses, {"t::e"}, set(), whole_run=False)
    assert strict == ["numerics/doubts: its reproducer t::e passed but wrote no fail row for it in this process "
                      "(a reproducer must drive the check to fail in-process)"]


def test_a_session_fails_on_a_reproducer_that_does_not_reproduce(tmp_path):
    """End to end in a child pytest: the recorder plugin, a registry of its own, the exit status and
    the summary lines (a whole run, so also the pass with no reproducer)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.append({str(REPO / "tests")!r})
        import check_recorder

        def pytest_configure(config):
            check_recorder.register(config)
    """))
    (tmp_path / "check_reproducers.py").write_text(
        'REPRODUCERS = {("selftest", "fault_caught"): ("test_probe.py::test_reproducer",),\n'
        '               ("selftest", "run_time"): ("test_probe.py::test_real_reproducer",)}\n'
        'FAILS_AS = {}\n')
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        import check_recorder
        from mystique.results import Results, RunContext

        ADD = compile("res.add(check, 'x', 'm', 1, status=status)", check_recorder.PRODUCT[0] + "probe.py", "exec")

        def _rows(check, *statuses):
            res = Results(RunContext(device="cpu"), "selftest")
            for status in statuses:
                exec(ADD, {"res": res, "check": check, "status": status})

        def test_reproducer():
            _rows("fault_caught", "pass")

        def test_real_reproducer():
            _rows("run_time", "fail", "pass")

        def test_unregistered():
            _rows("healthy_false_failures", "pass")

        def test_a_table_built_by_the_test_itself_is_not_noted():
            Results(RunContext(device="cpu"), "selftest").add("failed_check", "x", "m", 1, status="pass")
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "4 passed" in text
    assert "selftest/fault_caught: its reproducer test_probe.py::test_reproducer passed but wrote no fail" in text
    assert "selftest/healthy_false_failures wrote pass (in test_probe.py::test_unregistered)" in text
    assert "selftest/run_time" not in text and "failed_check" not in text
