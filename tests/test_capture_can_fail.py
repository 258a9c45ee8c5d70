"""Capture checks driven to ``fail`` (issue #30: every check can fail; the registry is
tests/check_reproducers.py)."""

from __future__ import annotations

from mystique import results
from mystique.capture import capture


def no_aten_step():
    """A capture target whose step runs no torch operator (pure Python work)."""
    return lambda: sum(i * i for i in range(1000))


def test_trace_recorded_fails_when_the_step_runs_no_aten_op(tmp_path):
    out = capture("test_capture_can_fail:no_aten_step", tmp_path / "t", steps=2, warmup=1)
    row = results.read_csv(out / "results.csv").set_index("check").loc["trace_recorded"]
    assert row["status"] == "fail" and row["value"] == 0 and "no aten op recorded" in row["detail"]
