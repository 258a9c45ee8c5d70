"""Process-to-process consistency of replays (mystique/replay/consistency.py, issue 33's H100 target): one
capture replayed in separate processes must give the same verdict every time, every ratio within 0.95-1.05."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mystique.replay.consistency import BAND_HALF, consistency, judge, main
from mystique.results import read_csv


def _summary(ratio: float, verdict: str = "pass", kind: str = "paired", main_cpu: int | None = None) -> dict:
    pl = {"applied": main_cpu is not None, "main_cpu": main_cpu}
    return {"ratio": ratio, "ratio_low": ratio * 0.98, "ratio_high": ratio * 1.02, "verdict": verdict,
            "ratio_kind": kind, "replay_step_ms": 9.2 * ratio, "original_step_ms": 9.2,
            "timing": {"basis": "host timeline", "cpu_placement": pl}}


def test_the_same_verdict_and_ratios_near_one_pass():
    status, detail, fig = judge([_summary(0.982), _summary(0.99), _summary(1.01)], 3)
    assert status == "pass" and fig["low"] == 0.982 and fig["high"] == 1.01
    assert "the same verdict in every process" in detail


def test_the_h100_flip_fails():
    """The issue's two processes: 0.982 pass, then 0.726 fail."""
    status, detail, fig = judge([_summary(0.982), _summary(0.726, "fail"), _summary(0.99)], 3)
    assert status == "fail" and "verdicts differ (pass, fail, pass)" in detail and fig["value"] == pytest.approx(0.274)


def test_different_verdicts_fail_even_with_every_ratio_inside_the_band():
    """A wide interval in one process (inconclusive) is no consistency, however close its median."""
    status, detail, _ = judge([_summary(1.0), _summary(0.97, "inconclusive"), _summary(1.0)], 3)
    assert status == "fail" and "verdicts differ (pass, inconclusive, pass)" in detail


def test_one_verdict_with_a_ratio_outside_the_band_fails():
    status, detail, _ = judge([_summary(0.94), _summary(0.96), _summary(0.97)], 3)
    assert status == "fail" and "ratio 0.940 outside 0.95-1.05" in detail


def test_a_process_without_summary_or_paired_ratio_is_no_claim():
    assert judge([_summary(1.0), None, _summary(1.0)], 3)[0] == "error"
    assert judge([_summary(1.0), _summary(1.0)], 3)[0] == "error"  # the third never ran
    assert judge([_summary(1.0), _summary(1.0, None, "recorded"), _summary(1.0)], 3)[0] == "fail"


@given(st.lists(st.floats(0.5, 1.5), min_size=1, max_size=5), st.sampled_from(["pass", "fail", "inconclusive"]))
def test_pass_exactly_when_one_verdict_and_every_ratio_within_the_band(ratios, verdict):
    status, _, fig = judge([_summary(r, verdict) for r in ratios], len(ratios))
    assert (status == "pass") == all(abs(r - 1) <= BAND_HALF for r in ratios)
    assert fig["low"] == min(ratios) and fig["high"] == max(ratios)


def _write(folder: Path, summary: dict | None, subject: str) -> None:
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
        (folder / "results.csv").write_text(
            "run_id,started_at,host,device,device_name,torch_version,suite,check,subject,dtype,metric,value,unit,"
            "threshold,low,high,status,detail\n"
            f"r,2026-01-01T00:00:00Z,h,cuda,H100,2.11,replay,replay_step_time_ratio,{subject},float32,ratio,1.0,,,"
            ",,pass,x\n")


def test_the_command_reads_gpu_checks_folders_and_writes_one_row_per_capture(tmp_path, capsys):
    for k, r in enumerate([0.98, 0.99, 1.0], 1):
        _write(tmp_path / f"replay_llama_infer_{k}", _summary(r, main_cpu=1), "llama/small/infer")
    for k, (r, v) in enumerate([(0.982, "pass"), (0.726, "fail")], 1):
        _write(tmp_path / f"replay_bert_train_{k}", _summary(r, v), "bert/small/train")
    _write(tmp_path / "replay_bert_train_3", None, "bert/small/train")  # timed out: no summary
    for k, (r, v) in enumerate([(0.982, "pass"), (0.726, "fail"), (0.99, "pass")], 1):  # the H100's flip
        _write(tmp_path / f"replay_bert_infer_{k}", _summary(r, v), "bert/small/infer")
    (tmp_path / "cap_bert_train").mkdir()  # not a replay
    code = main([str(tmp_path), "--replays", "3"])
    out = capsys.readouterr().out
    df = read_csv(tmp_path / "consistency" / "results.csv")
    rows = dict(zip(df["subject"], df["status"]))
    assert rows == {"llama/small/infer": "pass", "bert/small/train": "error", "bert/small/infer": "fail"}
    assert code == 1
    assert "consistency llama/small/infer: pass" in out and "main CPU 1" in out
    assert set(df["device_name"]) == {"H100"}
    assert consistency(tmp_path / "cap_bert_train").empty


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
