"""Host gaps for ``--pacing recorded`` come from a light profile matched to the ET by op order."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mystique.trace.kineto import KinetoTimes
from mystique.trace.pacing import MIN_MATCHED, align_spans, pacing_spans, read_timeline


def _reference(names: list[str], step: float = 10.0) -> KinetoTimes:
    """ET-joined Kineto times: op k (rf_id 100 + k) spans [k * step, k * step + 1)."""
    spans = {100 + k: (k * step, k * step + 1.0) for k in range(len(names))}
    return KinetoTimes(cpu_us={rf: 1.0 for rf in spans}, device_us={},
                       names={100 + k: n for k, n in enumerate(names)}, cpu_spans_us=spans)


def _light(names: list[str], step: float = 4.0) -> list[tuple[str, float, float]]:
    return [(n, 1000.0 + k * step, 1000.0 + k * step + 1.0) for k, n in enumerate(names)]


def _write_kineto(path, events) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump({"traceEvents": events}, fh)


def test_each_reference_op_gets_the_span_of_the_same_op_of_the_light_run():
    names = ["aten::linear", "aten::relu", "aten::linear", "aten::sum"]
    spans, matched = align_spans(_reference(names), _light(names))
    assert matched == 1.0
    assert spans == {100 + k: (1000.0 + 4 * k, 1001.0 + 4 * k) for k in range(4)}


def test_an_op_only_one_run_has_shifts_nothing_after_it():
    ref = ["aten::mm", "aten::add", "aten::relu", "aten::sum"]
    light = ["aten::mm", "aten::empty", "aten::add", "aten::relu", "aten::sum"]  # one extra op in the light run
    spans, matched = align_spans(_reference(ref), _light(light))
    assert matched == 1.0
    assert spans[101] == (1008.0, 1009.0) and spans[103] == (1016.0, 1017.0)  # add and sum: their own spans


@given(st.lists(st.sampled_from(["aten::mm", "aten::add", "aten::relu", "aten::view"]), min_size=1, max_size=40))
def test_a_run_matched_with_itself_maps_every_op_in_order(names):
    spans, matched = align_spans(_reference(names), _light(names))
    assert matched == 1.0 and [spans[100 + k][0] for k in range(len(names))] == sorted(v[0] for v in spans.values())


def test_read_timeline_keeps_host_ops_in_start_order_and_leaves_out_the_step_region(tmp_path):
    p = tmp_path / "pacing.json.gz"
    _write_kineto(p, [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 10, "dur": 30},  # encloses mm: listed first
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 21, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "aten::bad", "ts": "x", "dur": 3},
        {"ph": "i", "cat": "cpu_op", "name": "aten::instant", "ts": 50},
    ])
    assert read_timeline(p) == [("aten::linear", 10.0, 40.0), ("aten::mm", 20.0, 25.0)]


def test_a_light_run_that_did_other_work_is_not_used(tmp_path):
    names = [f"aten::op{k}" for k in range(10)]
    light = names[:8] + ["aten::other", "aten::else"]  # 80% of the reference matched: under MIN_MATCHED
    assert 0.8 < MIN_MATCHED
    _write_kineto(tmp_path / "pacing.json.gz",
                  [{"ph": "X", "cat": "cpu_op", "name": n, "ts": s, "dur": e - s} for n, s, e in _light(light)])
    spans, source = pacing_spans(tmp_path, _reference(names))
    assert spans is None and "matched only 80%" in source
    _write_kineto(tmp_path / "pacing.json.gz",
                  [{"ph": "X", "cat": "cpu_op", "name": n, "ts": s, "dur": e - s} for n, s, e in _light(names)])
    spans, source = pacing_spans(tmp_path, _reference(names))
    assert spans is not None and len(spans) == 10 and "100% of ops matched" in source


def test_without_a_light_profile_the_gaps_say_they_include_the_observer(tmp_path):
    spans, source = pacing_spans(tmp_path, _reference(["aten::mm"]))
    assert spans is None and "gaps include" in source


def _capture_gaps(tmp_path, light_run: bool) -> tuple[str, float, float]:
    """(gap source, median gap of the plan, median gap of the ET-joined profile) of a capture."""
    import statistics

    from mystique.capture import capture
    from mystique.replay.plan import build_plan, plan_from_path
    from mystique.trace import load_trace
    from mystique.trace.kineto import read_kineto

    out = capture("user_steps:tiny_mlp", tmp_path / "cap", steps=3, warmup=1)
    assert (out / "pacing.json.gz").is_file()
    if not light_run:
        (out / "pacing.json.gz").unlink()
    plan, _ = plan_from_path(out)
    old = build_plan(load_trace(out), kineto_times=read_kineto(out))
    new_gaps = statistics.median(op["gap_us"] for op in plan.ops if op.get("gap_us") is not None)
    old_gaps = statistics.median(op["gap_us"] for op in old.ops if op.get("gap_us") is not None)
    return plan.metadata["gap_source"], new_gaps, old_gaps


@pytest.mark.parametrize("light_run", [True, False])
def test_a_capture_paces_with_the_light_profile_where_it_has_one(tmp_path, light_run):
    source, new_gaps, old_gaps = _capture_gaps(tmp_path, light_run)
    assert source.startswith("pacing.json.gz") if light_run else source.startswith("kineto.json.gz")
    assert new_gaps > 0
    assert (new_gaps != old_gaps) if light_run else (new_gaps == old_gaps)


@pytest.mark.slow  # compares two profiled runs' real host gaps: a measurement of this host
def test_the_light_profiles_gaps_are_shorter_than_the_et_joined_ones(tmp_path):
    """The light profile's gaps leave out the ET observer's work: their median is shorter than the
    ET-joined profile's (the observer serialises every op's inputs; a median, so one preempted gap
    on a busy host decides nothing)."""
    _, new_gaps, old_gaps = _capture_gaps(tmp_path, True)
    assert new_gaps < old_gaps
