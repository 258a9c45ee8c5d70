"""`mystique predict`'s op times from a capture's light profile (issue #35): each op's median over the
profile's steps, less the profiler's measured cost per recorded event; older captures (one light step,
no recorded cost) still predict."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.predict.light import light_times
from mystique.trace.pacing import StepTimeline, median_step, pacing_spans, step_timelines

# --- the light profile's steps ------------------------------------------------------------------------


def _write(path, events) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump({"traceEvents": events}, fh)


def _ev(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def _three_steps(path, durs=((10, 30), (50, 70), (12, 31))):
    """Three steps of two ops (mm, relu) at 0, 1000, 2000; op k of step s lasts durs[s][k] - ..."""
    events = []
    for s, (mm_end, relu_end) in enumerate(durs):
        t0 = 1000.0 * s
        events += [_ev(f"ProfilerStep#{s + 2}", t0, relu_end + 5, "user_annotation"),
                   _ev("aten::mm", t0 + 2, mm_end - 2), _ev("aten::relu", t0 + mm_end + 1, relu_end - mm_end - 1)]
    _write(path, events)


def test_a_profile_of_several_steps_is_split_at_its_step_regions(tmp_path):
    p = tmp_path / "pacing.json.gz"
    _three_steps(p)
    steps = step_timelines(p)
    assert [(s.start, [e[0] for e in s.ops]) for s in steps] == [(0.0, ["aten::mm", "aten::relu"]),
                                                                  (1000.0, ["aten::mm", "aten::relu"]),
                                                                  (2000.0, ["aten::mm", "aten::relu"])]
    assert median_step(steps).start == 2000.0  # durations 35, 75, 36: the median is the third


def test_a_profile_without_step_regions_is_one_step(tmp_path):
    p = tmp_path / "pacing.json.gz"
    _write(p, [_ev("aten::mm", 5, 10), _ev("aten::relu", 20, 3)])
    (s,) = step_timelines(p)
    assert (s.start, s.end, len(s.ops)) == (5.0, 23.0, 2)


def test_the_replay_paces_the_step_of_median_length(tmp_path):
    from mystique.trace.kineto import KinetoTimes

    _three_steps(tmp_path / "pacing.json.gz")
    ref = KinetoTimes(cpu_us={1: 1.0, 2: 1.0}, device_us={}, names={1: "aten::mm", 2: "aten::relu"},
                      cpu_spans_us={1: (0.0, 1.0), 2: (2.0, 3.0)})
    spans, _source = pacing_spans(tmp_path, ref)
    assert spans == {1: (2002.0, 2012.0), 2: (2013.0, 2031.0)}  # the third step's, not the first's or the slow one's


# --- op times: medians and the profiler's cost --------------------------------------------------------


def _matched(step_ops: list[list[tuple[str, float, float, int | None]]], ends: list[float]):
    """Steps given as events (name, start, end, rf of a plan op or None) -> what match_steps returns."""
    used = []
    for evs, end in zip(step_ops, ends):
        st_ = StepTimeline(evs[0][1] - 1.0 if evs else 0.0, end, sorted((e[0], e[1], e[2]) for e in evs))
        used.append((st_, {e[3]: (e[1], e[2]) for e in evs if e[3] is not None}, 1.0))
    return used


def test_each_op_takes_its_median_over_the_steps_so_one_slow_step_sets_nothing():
    ops = [{"index": 0, "rf_id": 10}, {"index": 1, "rf_id": 11}]
    steps = [[("aten::mm", 1.0, 11.0, 10), ("aten::relu", 12.0, 14.0, 11)],
             [("aten::mm", 1.0, 91.0, 10), ("aten::relu", 95.0, 135.0, 11)],  # a slow step
             [("aten::mm", 1.0, 13.0, 10), ("aten::relu", 15.0, 18.0, 11)]]
    lt = light_times(_matched(steps, [20.0, 140.0, 20.0]), 3, ops, [1, 1], None)
    # medians: mm 12, relu 3, gap 2, lead 1, tail 5 (23 in all), scaled to the median step's 20 (module docstring)
    k = 20.0 / 23.0
    assert lt.scale == pytest.approx(k)
    assert lt.host_us == pytest.approx({0: 12.0 * k, 1: 3.0 * k}) and lt.gap_us == pytest.approx({1: 2.0 * k})
    assert (lt.lead_us, lt.tail_us, lt.steps, lt.cost_us) == (pytest.approx(k), pytest.approx(5.0 * k), 3, None)
    assert "median of 3 steps" in lt.describe("pacing.json.gz") and "no per-event profiler cost" in lt.describe("p")


def _total(x) -> float:
    return x.lead_us + x.tail_us + sum(x.host_us.values()) + sum(x.gap_us.values())


def test_ops_each_slow_in_a_different_step_add_up_to_the_median_step_not_the_sum_of_their_medians():
    """Three ops of 10 us, each 20 us in one of three steps: every step lasts 40 us of ops, the medians
    sum to 30 (the prediction was 25% short, and so leaned negative on every capture)."""
    ops = [{"index": i, "rf_id": i} for i in range(3)]
    steps = []
    for slow in range(3):
        t, evs = 1.0, []
        for i in range(3):
            d = 20.0 if i == slow else 10.0
            evs.append(("aten::op", t, t + d, i))
            t += d
        steps.append(evs)
    lt = light_times(_matched(steps, [41.0] * 3), 3, ops, [0, 0, 0], None)
    assert _total(lt) == pytest.approx(41.0)  # the median step: lead 1 + 40 of ops
    k = 41.0 / 31.0  # medians: 10 per op and a lead of 1
    assert lt.host_us == pytest.approx({0: 10 * k, 1: 10 * k, 2: 10 * k})  # equal medians, equal shares
    assert "scaled by 1.3" in lt.describe("pacing.json.gz")


@given(st.lists(st.lists(st.floats(1, 100), min_size=3, max_size=3), min_size=1, max_size=7).filter(
    lambda s: len(s) % 2 == 1))
@examples(50)
def test_the_op_times_add_up_to_the_median_of_the_steps_totals(durs):
    """Law (all ops matched, an odd number of steps): the predicted step is the median step."""
    ops = [{"index": i, "rf_id": i} for i in range(3)]
    steps, ends = [], []
    for ds in durs:
        t, evs = 1.0, []
        for i, d in enumerate(ds):
            evs.append(("aten::op", t, t + d, i))
            t += d + 0.5
        steps.append(evs)
        ends.append(t + 2.0)
    lt = light_times(_matched(steps, ends), len(steps), ops, [0, 0, 0], None)
    assert _total(lt) == pytest.approx(statistics.median(e - 0.0 for e in ends))


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.floats(10, 100), st.floats(10, 100)),
                min_size=1, max_size=6), st.floats(0, 1))
@examples(50)
def test_the_profilers_cost_comes_off_where_its_events_fell_and_all_of_it_comes_off(ops, cost):
    """Op i: d nested events, w wrapper events before it (in its gap), gap g, host span h. Each event
    costs ``cost``: nested ones the op, its own and the wrappers the gap before it (the first op's:
    the step's lead); the step loses exactly cost x events."""
    t, evs = 5.0, []
    for i, (d, w, g, h) in enumerate(ops):
        evs += [("autograd::wrapper", t + 0.01 * (k + 1), t + 0.02 * (k + 1), None) for k in range(w)]
        t += g
        evs.append(("aten::op", t, t + h, i))
        evs += [("aten::inner", t + 0.1 * (k + 1), t + 0.2 * (k + 1), None) for k in range(d)]
        t += h
    end = t + 7.0
    plan = [{"index": i, "rf_id": i} for i in range(len(ops))]
    raw = light_times(_matched([evs], [end]), 1, plan, [0] * len(ops), None)
    lt = light_times(_matched([evs], [end]), 1, plan, [0] * len(ops), cost)
    for i, (d, w, _g, _h) in enumerate(ops):
        assert lt.host_us[i] == pytest.approx(raw.host_us[i] - cost * d)
        if i:
            assert lt.gap_us[i] == pytest.approx(raw.gap_us[i] - cost * (1 + w))
    assert lt.lead_us == pytest.approx(raw.lead_us - cost * (1 + ops[0][1]))

    def total(x):
        return x.lead_us + x.tail_us + sum(x.host_us.values()) + sum(x.gap_us.values())

    assert total(lt) == pytest.approx(total(raw) - cost * len(evs)) and lt.events == len(evs)


def test_a_gap_shorter_than_its_charge_passes_the_rest_to_the_op_after_it_and_nothing_goes_negative():
    plan = [{"index": 0, "rf_id": 0}, {"index": 1, "rf_id": 1}]
    evs = [("aten::a", 1.0, 11.0, 0), ("w", 11.2, 11.3, None), ("w", 11.4, 11.5, None), ("aten::b", 11.5, 12.5, 1)]
    lt = light_times(_matched([evs], [13.0]), 1, plan, [0, 0], 1.0)  # the gap (0.5 us) is charged 3 us
    assert lt.gap_us[1] == 0.0 and lt.host_us[1] == 0.0 and lt.host_us[0] == 10.0


# --- the cost itself, measured at capture time ----------------------------------------------------------


def test_the_cost_per_event_is_the_profiled_loops_extra_time_over_its_events():
    """A clock on which every profiled loop of 400 ops takes 400 us more than a plain one: 1 us per
    event, whatever the host's speed (the profiler itself is real: it counts the events)."""
    from mystique.trace.profiler_cost import REPEATS, measure_event_cost

    calls = {"n": 0}

    def clock():  # loop 0 warms up; then each round: REPEATS plain loops (400 us), REPEATS profiled (800 us)
        calls["n"] += 1
        k, end = divmod(calls["n"] - 1, 2)
        profiled = k > 0 and (k - 1) % (2 * REPEATS) >= REPEATS
        return k * 1.0 + (0.0 if not end else 800e-6 if profiled else 400e-6)

    cost = measure_event_cost(clock=clock)
    assert cost["events_per_call"] == 1.0 and cost["per_event_us"] == pytest.approx(1.0)
    assert len(cost["rounds_us"]) == 7 and cost["low_us"] == pytest.approx(1.0) == cost["high_us"]


@pytest.mark.parametrize("recorded, cost", [(None, None), ({}, None), ({"profiler_event_cost": None}, None),
                                            ({"profiler_event_cost": {"per_event_us": "x"}}, None),
                                            ({"profiler_event_cost": {"per_event_us": float("nan")}}, None),
                                            ({"profiler_event_cost": {"per_event_us": -0.2}}, 0.0),
                                            ({"profiler_event_cost": {"per_event_us": 0.4}}, 0.4)])
def test_a_recorded_cost_is_read_as_a_number_or_none(recorded, cost):
    from mystique.trace.profiler_cost import event_cost_us

    assert event_cost_us(recorded) == cost


# --- a capture, and one made before several light steps were -----------------------------------------


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory):
    from mystique.capture import capture

    return capture("user_steps:tiny_mlp", tmp_path_factory.mktemp("light") / "cap", steps=1, warmup=0)


def test_a_capture_records_several_light_steps_and_the_profilers_cost(capture_dir):
    from mystique.capture import PACING_STEPS
    from mystique.predict.graph import load_step

    assert len(step_timelines(capture_dir / "pacing.json.gz")) == PACING_STEPS
    cost = json.loads((capture_dir / "capture.json").read_text())["profiler_event_cost"]
    assert cost["events_per_call"] == 1.0 and isinstance(cost["per_event_us"], float)
    step = load_step(capture_dir)
    assert f"median of {PACING_STEPS} steps" in step.times_from and "per event taken out" in step.times_from


def test_a_capture_with_one_light_step_and_no_recorded_cost_still_predicts_from_that_step(capture_dir, tmp_path):
    from mystique.predict.graph import build_graph, load_step
    from mystique.predict.sim import simulate

    old = tmp_path / "old"
    shutil.copytree(capture_dir, old)
    with gzip.open(old / "pacing.json.gz", "rt") as fh:
        doc = json.load(fh)
    first = step_timelines(old / "pacing.json.gz")[0]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (isinstance(e.get("ts"), (int, float))
                                                                and e.get("ph") == "X" and e["ts"] > first.end)]
    _write(old / "pacing.json.gz", doc["traceEvents"])
    meta = json.loads((old / "capture.json").read_text())
    del meta["profiler_event_cost"]
    (old / "capture.json").write_text(json.dumps(meta))
    step = load_step(old)
    assert "its one step" in step.times_from and "no per-event profiler cost" in step.times_from
    r = simulate(build_graph(step))
    assert r.step_us == pytest.approx(first.dur, rel=1e-6)  # one thread: the recorded step, to the microsecond


def test_the_capture_check_uses_the_plain_steps_paired_with_the_light_ones_and_old_captures_their_timed_steps():
    from mystique.predict.verify import capture_measured

    timed = {"times_ms": [150.0, 160.0, 155.0], "warmup": 2}  # an earlier block, the host slower then
    plain = [100.0, 104.0, 98.0, 101.0, 99.0, 103.0, 102.0, 97.0]
    m = capture_measured({"step_time": timed, "light_reference": {"plain_ms": plain}})  # light steps not kept
    assert m.value == pytest.approx(100.5) and m.samples == plain
    assert m.low <= 100.5 <= m.high and "paired" in m.how and "same window" in m.what
    light = [1.1 * x for x in plain]  # each light step 10% over the plain step beside it
    m = capture_measured({"step_time": timed, "light_reference": {"plain_ms": plain, "light_ms": light}})
    assert (m.value, m.low, m.high) == pytest.approx((100.5, 100.5, 100.5))
    assert "median ratio light/plain 1.1000" in m.how and "drift between pairs cancels" in m.what
    # a capture from before the pairs (or one whose pairs are unusable): its timed steps, as before
    for meta in ({"step_time": timed}, {"step_time": timed, "light_reference": {"plain_ms": [100.0, -1.0]}}):
        old = capture_measured(meta)
        assert old.value == 155.0 and old.what is None and "uninstrumented steps" in old.how


def test_a_capture_pairs_its_light_steps_with_plain_ones_and_predict_checks_against_those(capture_dir, tmp_path, cli_run):
    from mystique.capture import PACING_STEPS
    from mystique.results import read_csv

    ref = json.loads((capture_dir / "capture.json").read_text())["light_reference"]
    assert len(ref["plain_ms"]) == len(ref["light_ms"]) == PACING_STEPS
    assert all(x > 0 for x in ref["plain_ms"] + ref["light_ms"])
    # plain steps record no op event: each light step's region holds the whole step, the same ops
    assert len({len(st.ops) for st in step_timelines(capture_dir / "pacing.json.gz")}) == 1
    cap = tmp_path / "cap"
    shutil.copytree(capture_dir, cap)
    meta = json.loads((cap / "capture.json").read_text())
    meta["step_time"]["times_ms"] = [1000.0] * len(meta["step_time"]["times_ms"])  # far off: must not be used
    (cap / "capture.json").write_text(json.dumps(meta))
    cli_run("predict", str(cap), "-o", str(tmp_path / "p"))
    df = read_csv(tmp_path / "p" / "results.csv")
    measured = df[df.check == "measured_step_time"]
    ratio = statistics.median(a / b for a, b in zip(ref["light_ms"], ref["plain_ms"]))
    assert float(measured.value.iloc[0]) == pytest.approx(statistics.median(ref["light_ms"]) / ratio)
    err = df[df.check == "prediction_error"]
    predicted = float(df[df.check == "predicted_step_time"].value.iloc[0])
    assert float(err.value.iloc[0]) == pytest.approx(predicted / float(measured.value.iloc[0]) - 1)
    assert "the plain step its light/plain pairs give" in err.detail.iloc[0]


@given(st.lists(st.floats(50, 200), min_size=3, max_size=12), st.floats(0.8, 1.2), st.floats(0.0, 0.05))
@examples(50)
def test_a_host_drifting_from_pair_to_pair_moves_both_steps_of_a_pair_and_cancels(speeds, ratio, jitter):
    """Law: pairs whose light step is ``ratio`` x its plain one (within ``jitter``), on a host whose speed
    varies freely from pair to pair, give the plain step as the light median / ``ratio``, its interval
    within the jitter (the plain steps' own median interval spans the drift)."""
    from mystique.predict.verify import capture_measured

    plain = list(speeds)
    light = [p * ratio * (1 + jitter * (-1) ** i) for i, p in enumerate(plain)]
    m = capture_measured({"light_reference": {"plain_ms": plain, "light_ms": light}})
    r = statistics.median(a / b for a, b in zip(light, plain))
    assert m.value == pytest.approx(statistics.median(light) / r)
    assert m.low <= m.value <= m.high
    assert m.high / m.low <= (1 + jitter) / (1 - jitter) * (1 + 1e-9)


def test_a_capture_with_more_steps_than_the_default_pairs_takes_as_many_pairs(tmp_path):
    import torch

    from mystique.capture import PACING_STEPS, pacing_pairs, record_pacing

    assert pacing_pairs(1) == pacing_pairs(PACING_STEPS) == PACING_STEPS and pacing_pairs(40) == 40

    class _Host:
        def synchronize(self):
            pass

    x = torch.ones(8)
    out = record_pacing(lambda: torch.relu(x + 1), _Host(), tmp_path / "pacing.json.gz", pairs=11)
    ref = out["light_reference"]
    assert ref["pairs"] == len(ref["plain_ms"]) == len(ref["light_ms"]) == 11
    assert len(step_timelines(tmp_path / "pacing.json.gz")) == 11
