"""The results schema: one place builds, validates, writes and reads it."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique import results
from mystique.errors import UsageError

CTX = results.RunContext(device="cpu", device_name="Test CPU", torch_version="2.13.0")


def test_columns_are_the_design_columns_in_order():
    assert results.COLUMNS == (
        "run_id", "started_at", "host", "device", "device_name", "torch_version", "suite", "check",
        "subject", "dtype", "metric", "value", "unit", "threshold", "low", "high", "status", "detail",
    )


def test_a_results_file_written_before_the_interval_columns_still_loads(tmp_path):
    old = [c for c in results.COLUMNS if c not in ("low", "high")]
    row = dict.fromkeys(old, "")
    row.update(suite="replay", check="replay_coverage", value="1.0", status="pass", run_id="r1")
    path = tmp_path / "results.csv"
    pd.DataFrame([row], columns=old).to_csv(path, index=False)
    df = results.read_csv(path)
    assert list(df.columns) == list(results.COLUMNS)
    assert math.isnan(df.loc[0, "low"]) and math.isnan(df.loc[0, "high"])
    assert df.loc[0, "status"] == "pass"


def test_the_interval_columns_carry_numbers_through_a_write_and_read(tmp_path):
    res = results.Results(CTX, "replay")
    res.add("replay_step_time_ratio", "b", "ratio", 1.01, status="pass", low=0.98, high=1.04)
    path = results.write_csv(res.frame(), tmp_path / "results.csv")
    df = results.read_csv(path)
    assert (df.loc[0, "low"], df.loc[0, "high"]) == (0.98, 1.04)


def test_add_builds_a_full_row_and_normalises_dtype_and_detail():
    res = results.Results(CTX, "numerics")
    row = res.add("gemm_error_vs_fp64", "mm", "rel_err", 1e-3, status="fail", threshold=5e-4,
                  dtype="torch.bfloat16", detail="seed 3\n shapes (4, 8)")
    assert row["dtype"] == "bfloat16" and row["detail"] == "seed 3 shapes (4, 8)"
    df = res.frame()
    assert list(df.columns) == list(results.COLUMNS)
    assert df.loc[0, "suite"] == "numerics" and df.loc[0, "device"] == "cpu"
    assert results.exit_code(df) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"check": "GemmError", "status": "pass"}, "snake_case"),
        ({"check": "gemm_error", "status": "ok"}, "status"),
        ({"check": "gemm_error", "status": "pass", "value": "abc"}, "not a number"),
    ],
)
def test_add_rejects_rows_outside_the_schema(kwargs, message):
    res = results.Results(CTX, "numerics")
    args = {"subject": "mm", "metric": "x", "value": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        res.add(args.pop("check"), args.pop("subject"), args.pop("metric"), args.pop("value"), **args)


def test_unknown_suite_is_refused():
    with pytest.raises(ValueError, match="suite"):
        results.Results(CTX, "benchmarks")


def test_exit_code_zero_when_only_pass_and_skip():
    res = results.Results(CTX, "replay")
    res.add("replay_coverage", "b", "coverage", 1.0, status="pass")
    res.add("replay_step_time_ratio", "b", "ratio", None, status="skip", detail="original unknown")
    assert results.exit_code(res.frame()) == 0


def test_nothing_checked_exits_3_and_measurements_are_not_checks():
    res = results.Results(CTX, "soft_errors")
    res.add("pvf", "dlrm", "pvf", 0.12, status="info")
    res.add("abft_gemm", "mm", "ratio", None, status="skip", detail="no kernel")
    assert results.exit_code(res.frame()) == results.NOTHING_CHECKED == 3
    assert results.exit_code(results.to_frame([])) == 3
    c = results.counts(res.frame())
    assert (c.checks, c.failed, c.skipped, c.measurements) == (0, 0, 1, 1)
    res.add("abft_gemm", "mm", "ratio", 0.5, threshold=1.0, status="pass")
    assert results.exit_code(res.frame()) == 0
    assert results.counts(res.frame()).line == "1 checks, 0 failed, 1 skipped, 1 measurements"


def test_inconclusive_alone_is_undecided_apart_from_failed():
    res = results.Results(CTX, "replay")
    res.add("replay_coverage", "b", "coverage", 1.0, status="pass")
    res.add("replay_step_time_ratio", "b", "ratio", 1.04, status="inconclusive", detail="[0.97, 1.12] straddles")
    assert results.exit_code(res.frame()) == results.UNDECIDED == 4
    c = results.counts(res.frame())
    assert (c.inconclusive, c.failed, c.decided_failures) == (1, 1, 0)
    assert c.line == "2 checks, 0 failed, 1 undecided, 0 measurements"
    res.add("replay_coverage", "c", "coverage", 0.5, status="fail")  # a failure decides the run: exit 1
    assert results.exit_code(res.frame()) == results.FAILED == 1
    assert results.counts(res.frame()).line == "3 checks, 1 failed, 1 undecided, 0 measurements"
    res.add("replay_coverage", "d", "coverage", None, status="error", detail="boom")
    assert results.exit_code(res.frame()) == 1


@examples(40)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(results.SUITES),
            st.from_regex(r"[a-z][a-z0-9]{0,6}(_[a-z0-9]{1,4}){0,2}", fullmatch=True),
            st.text(min_size=0, max_size=12),
            st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=True, width=32)),
            st.sampled_from(results.STATUSES),
            st.text(max_size=30),
        ),
        max_size=6,
    )
)
def test_csv_round_trip_keeps_every_row(tmp_path_factory, rows):
    recs = []
    for suite, check, subject, value, status, detail in rows:
        res = results.Results(CTX, suite)
        res.add(check, subject, "m", value, status=status, detail=detail)
        recs.append(res.frame())
    df = results.concat(recs)
    path = tmp_path_factory.mktemp("rt") / "results.csv"
    results.write_csv(df, path)
    back = results.read_csv(path)
    assert len(back) == len(df)
    for a, b in zip(df["value"], back["value"]):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6)
    assert list(back["status"]) == list(df["status"])
    assert list(back["check"]) == list(df["check"])
    assert list(back["detail"]) == list(df["detail"])


def test_read_csv_refuses_foreign_files_with_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="lacks column"):
        results.read_csv(bad)
    with pytest.raises(UsageError, match="does not exist"):
        results.read_csv(tmp_path / "missing.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(UsageError, match="not a results CSV"):
        results.read_csv(empty)


def test_write_is_atomic_and_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("precious")
    bad = pd.DataFrame({"x": [1]})
    with pytest.raises(ValueError):
        results.write_csv(bad, path)
    assert path.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


def test_failed_rows_end_with_the_command_that_reproduces_them():
    res = results.Results(CTX, "numerics")
    res.add("a_check", "mm", "x", 2.0, threshold=1.0, status="fail", detail="seed=0")
    res.add("b_check", "mm", "x", 0.5, threshold=1.0, status="pass", detail="seed=0")
    res.add("c_check", "mm", "x", None, status="error", detail="boom; reproduce: mystique replay B -o OUT")
    out = results.with_reproduce(res.frame(), "mystique validate numerics --seed 0 -o OUT")
    assert list(out["detail"]) == ["seed=0; reproduce: mystique validate numerics --seed 0 -o OUT", "seed=0",
                                   "boom; reproduce: mystique replay B -o OUT"]


def test_the_cli_names_the_command_of_a_failed_row(tmp_path):
    from mystique.cli import main

    out = tmp_path / "o"
    code = main(["-q", "validate", "numerics", "--inject", "wrong_gelu", "--group", "op_sweep", "--ops", "gelu",
                 "--dtypes", "float32", "-o", str(out)])
    df = results.read_csv(out / "results.csv")
    failed = df[df["status"] == "fail"]
    assert code == 1 and len(failed)
    assert failed["detail"].str.endswith(
        "reproduce: mystique validate numerics --inject wrong_gelu --dtypes float32 --group op_sweep --ops gelu -o OUT"
    ).all()
