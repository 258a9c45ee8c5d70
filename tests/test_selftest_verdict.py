"""The self-test's verdicts from injected qualification results (no real qualification runs): only
``fail`` rows catch a fault, and the healthy run fails on anything that is not a clean pass."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mystique.validators import selftest as st
from mystique.validators.qualify import Outcome

from mystique import results
from mystique.errors import MystiqueError

FAULT = "wrong_gelu"


def _rows(suite: str, statuses: list[str]) -> pd.DataFrame:
    res = results.Results(results.RunContext(device="cpu"), suite)
    for i, status in enumerate(statuses):
        res.add(f"check_{status}", f"op{i}", "err", 1.0, threshold=0.5, status=status)
    return res.frame()


def _inject(monkeypatch: pytest.MonkeyPatch, runs: dict[str | None, object]) -> None:
    """Replace the one qualification run with ``runs[inject]``: (exit code, rows) written as qualify
    writes them, or an exception raised."""

    def fake_qualify(out, *, inject=None, **_):
        what = runs[inject]
        if isinstance(what, Exception):
            raise what
        code, df = what
        Path(out).mkdir(parents=True)
        results.write_csv(df, Path(out) / "results.csv")
        return Outcome(code, results.counts(df), ("results.csv",))

    monkeypatch.setattr(st, "qualify", fake_qualify)


def _selftest(tmp_path: Path, validators=("numerics",)) -> tuple[int, pd.DataFrame]:
    return st.selftest(tmp_path / "st", faults=[FAULT], validators=list(validators))


def _row(df: pd.DataFrame, check: str) -> pd.Series:
    return df[df["check"] == check].iloc[0]


GOOD = (0, _rows("numerics", ["pass", "pass"]))
CAUGHT = (1, _rows("numerics", ["pass", "fail", "fail"]))


def test_a_clean_healthy_run_and_a_caught_fault_pass(tmp_path, monkeypatch):
    _inject(monkeypatch, {None: GOOD, FAULT: CAUGHT})
    code, df = _selftest(tmp_path)
    assert code == 0
    healthy, fault = _row(df, "healthy_false_failures"), _row(df, "fault_caught")
    assert (healthy["status"], healthy["value"]) == ("pass", 0)
    assert (fault["status"], fault["value"]) == ("pass", 2)
    hits = df[df["check"] == "failed_check"]
    assert list(zip(hits["subject"], hits["metric"], hits["value"])) == [(FAULT, "numerics.check_fail", 2)]


def test_error_and_inconclusive_rows_under_a_fault_are_not_a_catch(tmp_path, monkeypatch):
    _inject(monkeypatch, {None: GOOD, FAULT: (1, _rows("numerics", ["pass", "error", "inconclusive"]))})
    code, df = _selftest(tmp_path)
    fault = _row(df, "fault_caught")
    assert code == 1 and (fault["status"], fault["value"]) == ("fail", 0)
    assert "NOT caught" in fault["detail"] and "2 error or inconclusive rows, not catches" in fault["detail"]
    assert not len(df[df["check"] == "failed_check"])  # nothing caught it: no catch in the matrix


def test_an_undecided_fault_run_is_not_caught_and_an_undecided_healthy_run_is_not_clean(tmp_path, monkeypatch):
    """Exit 4 (undecided: inconclusive rows, no fail) is a doubt: under a fault no catch, on the healthy device
    a false failure per inconclusive row (the exit code adds none: the rows explain it)."""
    undecided = (results.UNDECIDED, _rows("performance", ["pass", "inconclusive"]))
    _inject(monkeypatch, {None: undecided, FAULT: undecided})
    code, df = _selftest(tmp_path, validators=("performance",))
    healthy, fault = _row(df, "healthy_false_failures"), _row(df, "fault_caught")
    assert code == 1 and (healthy["status"], healthy["value"]) == ("fail", 1)
    assert "1 undecided" in healthy["detail"] and "qualify exited" not in healthy["detail"]
    assert (fault["status"], fault["value"]) == ("fail", 0)
    assert "NOT caught (undecided (qualify exit 4" in fault["detail"]
    assert st.fault_outcome(st.RunOutcome("h", None, undecided[1], 1.0, exit_code=4)).startswith("undecided")
    bare = st.RunOutcome(st.HEALTHY, None, _rows("performance", ["pass"]), 1.0, exit_code=4, expected=("performance",))
    assert st.healthy_problems(bare) == ["qualify exited 4 (undecided) with no inconclusive row to show for it"]


@pytest.mark.parametrize("code, statuses, how", [
    (0, ["pass"], "passed: the fault went unnoticed"),
    (results.NOTHING_CHECKED, ["skip"], "nothing checked (qualify exit 3)"),
    (1, ["pass", "error"], "failed with no fail row (errors prove nothing)"),
    (1, ["fail"], "caught"),
    (2, [], "qualify exited 2"),
])
def test_each_exit_code_of_a_fault_run_is_read_explicitly(code, statuses, how):
    o = st.RunOutcome(FAULT, FAULT, _rows("numerics", statuses), 1.0, exit_code=code)
    assert st.fault_outcome(o) == how


def test_an_error_row_on_the_healthy_device_fails_it(tmp_path, monkeypatch):
    _inject(monkeypatch, {None: (1, _rows("numerics", ["pass", "error"])), FAULT: CAUGHT})
    code, df = _selftest(tmp_path)
    healthy = _row(df, "healthy_false_failures")
    assert code == 1 and (healthy["status"], healthy["value"]) == ("fail", 1)
    hits = df[(df["check"] == "failed_check") & (df["subject"] == st.HEALTHY)]
    assert list(zip(hits["metric"], hits["value"])) == [("numerics.check_error", 1)]


def test_qualify_failing_with_no_failed_row_fails_the_healthy_run(tmp_path, monkeypatch):
    """A validator that failed to import: pytest fails its item, no row says so."""
    _inject(monkeypatch, {None: (1, _rows("numerics", ["pass"])), FAULT: CAUGHT})
    code, df = _selftest(tmp_path)
    healthy = _row(df, "healthy_false_failures")
    assert code == 1 and (healthy["status"], healthy["value"]) == ("fail", 1)
    assert "qualify failed with no failed row" in healthy["detail"]


def test_a_qualification_that_did_not_finish_fails_the_healthy_run(tmp_path, monkeypatch):
    _inject(monkeypatch, {None: MystiqueError("pytest failed internally during qualification"), FAULT: CAUGHT})
    code, df = _selftest(tmp_path)
    healthy = _row(df, "healthy_false_failures")
    assert code == 1 and (healthy["status"], healthy["value"]) == ("fail", 1)
    assert "did not finish: pytest failed internally" in healthy["detail"]


def test_a_suite_without_rows_fails_the_healthy_run(tmp_path, monkeypatch):
    _inject(monkeypatch, {None: GOOD, FAULT: CAUGHT})
    code, df = _selftest(tmp_path, validators=("numerics", "correctness"))
    healthy = _row(df, "healthy_false_failures")
    assert code == 1 and (healthy["status"], healthy["value"]) == ("fail", 1)
    assert "no rows from suite correctness" in healthy["detail"]


def test_a_healthy_run_that_checked_nothing_fails(tmp_path, monkeypatch):
    _inject(monkeypatch, {None: (3, _rows("numerics", ["info", "skip"])), FAULT: CAUGHT})
    code, df = _selftest(tmp_path)
    healthy = _row(df, "healthy_false_failures")
    assert code == 1 and (healthy["status"], healthy["value"]) == ("fail", 1)
    assert "qualify exited 3 (nothing checked)" in healthy["detail"]


@pytest.mark.parametrize("spec, validators, expected", [
    (None, None, ("numerics", "soft_errors", "correctness", "performance")),
    ("throttle", None, ("performance",)),
    ("straggler:stall_ms=300", None, ("performance",)),
    ("wrong_gelu", None, ("numerics", "soft_errors", "correctness")),  # numbers, not speed: no mode item
    ("mypkg.modes:slow", None, ("numerics", "soft_errors", "correctness", "performance")),
    (None, ["numerics", "mypkg.checks"], ("numerics",)),
])
def test_the_suites_each_run_must_produce(spec, validators, expected):
    assert st.expected_suites(spec, validators) == expected


@pytest.mark.parametrize("spec, validators, keyword", [
    ("wrong_gelu", None, "not pvf"),  # a numeric fault: pvf's trials are measurements, no catch
    ("stuck_lane:lane=1", None, "not pvf"),
    (None, None, None), ("throttle", None, None), ("mypkg.modes:slow", None, None),
    ("wrong_gelu", ["soft_errors"], None),  # the caller's choice stands
])
def test_a_numeric_faults_run_leaves_out_the_groups_that_cannot_catch_it(spec, validators, keyword):
    assert st.run_keyword(spec, validators) == keyword


def test_each_run_qualifies_with_the_validators_its_fault_can_fail(tmp_path, monkeypatch):
    """A slowness fault's run is the performance item alone, a numeric fault's run leaves it out."""
    asked = {}

    def fake_qualify(out, *, inject=None, validators=None, **_):
        asked[inject] = validators
        df = _rows("performance" if inject == "throttle" else "numerics", ["fail"] if inject else ["pass"])
        Path(out).mkdir(parents=True)
        results.write_csv(df, Path(out) / "results.csv")
        return Outcome(1 if inject else 0, results.counts(df), ("results.csv",))

    monkeypatch.setattr(st, "qualify", fake_qualify)
    st.selftest(tmp_path / "st", faults=["throttle", FAULT])
    assert asked == {None: None, "throttle": ["performance"], FAULT: ["numerics", "soft_errors", "correctness"]}


def _shown(obj):
    """A section's blocks without the hover titles (which quote the details for people)."""
    if isinstance(obj, dict):
        return {k: _shown(v) for k, v in obj.items() if k != "title"}
    if isinstance(obj, (list, tuple)):
        return [_shown(v) for v in obj]
    return obj


def _section(df: pd.DataFrame) -> list:
    from mystique.reports.blocks import Ids
    from mystique.reports.sections import selftest as section
    from mystique.reports.sections.base import SuiteRows

    return _shown(section.blocks(SuiteRows(df.assign(run="r", run_no=1), multi=False, ids=Ids())))


def test_the_report_matrix_reads_columns_not_details(tmp_path, monkeypatch):
    """Rewording every detail changes neither the verdict line nor a cell of the fault x check matrix."""
    _inject(monkeypatch, {None: (1, _rows("numerics", ["pass", "inconclusive"])), FAULT: CAUGHT})
    _, df = _selftest(tmp_path)
    shown = _section(df)
    text = repr(shown)
    assert "numerics.check_inconclusive" in text and "numerics.check_fail" in text and "selftest-verdict bad" in text
    assert _section(df.assign(detail="x")) == shown
