"""A routing change's predicted effect against its measured one (issue 34): ``replay BENCH --against
BASE``. The model (mystique.replay.routing_cost) and the check are tested on synthetic numbers; the
real timing is in docs/results/replay_llama4_routing_skew/."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mystique.replay import routing_cost as rc
from mystique.replay.against import rows
from mystique.results import Results, RunContext


def _plan(loads_per_site, shapes=((1024, 256), (8, 256, 512))):
    """A plan-like object: one grouped GEMM per site, its offs pinned to the cumulative loads."""
    tensors = [{"id": 0, "shape": list(shapes[0]), "dtype": "float32", "storage": 0},
               {"id": 1, "shape": list(shapes[1]), "dtype": "float32", "storage": 1}]
    storages = [{"id": 0, "recipe": {}}, {"id": 1, "recipe": {}}]
    ops, pins_ = [], []
    for i, ls in enumerate(loads_per_site):
        ends = [sum(ls[:j + 1]) for j in range(len(ls))]
        tid, sid = len(tensors), len(storages)
        tensors.append({"id": tid, "shape": [len(ls)], "dtype": "int32", "storage": sid})
        storages.append({"id": sid, "recipe": {"kind": "values", "values": ends}})
        ops.append({"node_id": 100 + i, "name": "aten::_grouped_mm", "args": [{"t": 0}, {"t": 1}, {"t": tid}]})
        pins_.append({"node_id": 100 + i, "op": "aten::_grouped_mm", "arg": "offs", "tensor": tid, "recorded": ends})
    return SimpleNamespace(ops=ops, metadata={"pins": pins_}, data={"tensors": tensors, "storages": storages})


def test_sites_pair_the_grouped_gemms_and_refuse_other_totals():
    cand, base = _plan([[6, 1, 1, 0]] * 2), _plan([[2, 2, 2, 2]] * 2)
    ss = rc.sites(cand, base)
    assert len(ss) == 2 and ss[0].layout == "rows" and ss[0].dims == (256, 512)
    assert ss[0].candidate == (6, 1, 1, 0) and ss[0].base == (2, 2, 2, 2)
    assert rc.needed(ss) == {("rows", (256, 512), "float32", n) for n in (0, 1, 2, 6)}
    with pytest.raises(ValueError, match="keeps each layer's total"):
        rc.sites(_plan([[6, 1, 1, 1]]), _plan([[2, 2, 2, 2]]))
    with pytest.raises(ValueError, match="ops"):
        rc.sites(_plan([[8]] * 2), _plan([[8]]))
    # a weight gradient (K, T) @ (T, N) and an input gradient's (E, M, K) @ (K, T)
    assert rc._layout([256, 1024], [1024, 512]) == ("inner", (256, 512))
    assert rc._layout([8, 64, 256], [256, 1024]) == ("cols", (64, 256))


def test_the_prediction_sums_the_group_times_that_move_with_their_uncertainty():
    ss = rc.sites(_plan([[6, 1, 1, 0]] * 2), _plan([[2, 2, 2, 2]] * 2))
    # a cost curve with a fixed per-group cost: t(n) = 10 + 3 n us, each point known to +-0.5 us
    pts = {("rows", (256, 512), "float32", n): rc.Point((10 + 3 * n) * 1e-6, (9.5 + 3 * n) * 1e-6, (10.5 + 3 * n) * 1e-6)
           for n in (0, 1, 2, 6)}
    p = rc.predict(ss, pts)
    # per site: t(6)+t(1)+t(1)+t(0) - 4 t(2) = (28+13+13+10) - 4*16 = 0: a linear cost moves nothing
    assert p.delta_s == pytest.approx(0.0, abs=1e-12) and p.terms == 8 and p.points == 4
    assert p.uncertainty_s == pytest.approx(8 * 1e-6)  # 8 moved groups, each two points of +-0.5 us
    # a cost with a floor (small groups as dear as a block of 4): skew saves time
    pts = {k: rc.Point(v, v, v) for k, v in ((("rows", (256, 512), "float32", n), max(n, 4) * 1e-6)
                                             for n in (0, 1, 2, 6))}
    p = rc.predict(ss, pts)
    assert p.delta_s == pytest.approx(2 * ((6 + 4 + 4 + 4) - 4 * 4) * 1e-6)
    r, lo, hi = p.ratio(1e-3)
    assert r == pytest.approx(1.004) and lo == hi == r
    assert all(math.isnan(x) for x in p.ratio(0.0))


@pytest.mark.parametrize("pred, meas, want", [
    ((1.10, 1.20), (1.12, 1.18), "pass"),  # inside: the amount and the direction
    ((1.10, 1.20), (1.01, 1.05), "fail"),  # the right direction, not the predicted amount
    ((1.10, 1.20), (0.90, 0.95), "fail"),  # the wrong direction
    ((1.10, 1.20), (0.98, 1.15), "inconclusive"),  # overlaps, but a change is not resolved
    ((0.98, 1.01), (0.99, 1.00), "inconclusive"),  # the model does not say which way: agreeing confirms nothing
    ((0.95, 1.06), (0.95, 1.05), "inconclusive"),  # (the train skewed:2 figure on a busy host: both +-5%)
    ((1.0, 1.0), (0.99, 1.01), "pass"),  # no load moved: exactly no change predicted, and none seen
    ((1.0, 1.0), (1.002, 1.01), "fail"),  # ... and a change seen
    ((0.80, 0.90), (0.85, 0.95), "pass"),
    ((0.80, 0.90), (0.85, 1.02), "inconclusive"),
    ((math.nan, 1.0), (0.9, 1.1), "inconclusive"),
])
def test_verdict_from_the_two_intervals(pred, meas, want):
    assert rc.verdict(*pred, *meas) == want


def _rows(measured, replayed_ok=True, null=(1.0, 1.0, 1.0), delta_s=10e-3, unc_s=1e-3):
    res = Results(RunContext(device="cpu", device_name="test", torch_version="x"), "replay")
    pred = rc.Prediction(delta_s=delta_s, uncertainty_s=unc_s, terms=8, points=4)  # +10 ms +-1 on a 100 ms step
    s = rows(res, "llama4/small/infer [skewed:4 vs uniform]", pred, 0.1, *measured, null=null, rounds=40, threads=1,
             load=([1.0], [1.0]), replayed_ok=replayed_ok, repro="mystique replay B --against A -o OUT")
    return s, {r["check"]: r for r in res.rows}


def test_the_check_fails_when_the_step_moves_otherwise_than_predicted():
    s, r = _rows((1.02, 1.01, 1.03))  # measured +2%, predicted +10% +-1%, no floor
    row = r["routing_skew_prediction_error"]
    assert row["status"] == "fail" and s["verdict"] == "fail"
    assert row["value"] == pytest.approx(-0.08) and row["low"] == pytest.approx(1.01 - 1.11)
    assert "disjoint" in row["detail"] and "reproduce: mystique replay B --against A" in row["detail"]
    # a floor of 2% (the null read [0.98, 1.005]) still leaves +2% [1%, 3%] short of +9..11%: fail
    s, r = _rows((1.02, 1.01, 1.03), null=(0.995, 0.98, 1.005))
    assert s["verdict"] == "fail" and s["floor"] == pytest.approx(0.02)
    assert r["routing_skew_prediction_error"]["high"] == pytest.approx(1.03 + 0.02 - 1.09)
    assert r["routing_skew_null_ratio"]["status"] == "info" and r["routing_skew_null_ratio"]["low"] == 0.98
    assert r["routing_skew_predicted_ratio"]["status"] == "info"
    assert r["routing_skew_predicted_ratio"]["low"] == pytest.approx(1.09)
    _, r = _rows((1.10, 1.095, 1.105))
    assert r["routing_skew_prediction_error"]["status"] == "pass"
    _, r = _rows((1.10, 1.095, 1.105), replayed_ok=False)
    assert r["routing_skew_prediction_error"]["status"] == "error"


@pytest.mark.parametrize("measured, null, want", [
    # issue 34's train figures: predicted +0.29% [+0.09, +0.49], measured -0.55% [-0.87, -0.12] (skewed:2);
    # the null (the base against itself) read +0.86% [+0.23, +2.05] in another process: with it in the same
    # rounds the floor is 2.05%, the widened interval overlaps the prediction, and a +0.3% change is unresolved
    ((0.9945, 0.9913, 0.9988), (1.0086, 1.0023, 1.0205), "inconclusive"),
    ((0.9945, 0.9913, 0.9988), (1.0, 1.0, 1.0), "fail"),  # the same measurement without a floor
    ((1.003, 1.0025, 1.0035), (1.0, 0.9995, 1.0005), "pass"),  # resolved beyond a floor of 0.05%
    ((0.95, 0.94, 0.96), (1.0086, 1.0023, 1.0205), "fail"),  # a -5% step against a +0.3% prediction: beyond the floor
    ((1.003, 1.0025, 1.0035), (math.nan, math.nan, math.nan), "inconclusive"),  # no null interval: no floor known
])
def test_the_floor_widens_the_measured_interval(measured, null, want):
    s, _ = _rows(measured, null=null, delta_s=0.29e-3, unc_s=0.2e-3)  # +0.29% [+0.09, +0.49] of a 100 ms step
    assert s["verdict"] == want, s


def test_against_refuses_options_it_cannot_honour(cli_run, tmp_path):
    from mystique.cli import main

    code = main(["-q", "replay", str(tmp_path), "--against", str(tmp_path), "-o", str(tmp_path / "o"),
                 "--pacing", "recorded"])
    assert code == 2


@pytest.mark.slow
def test_against_predicts_then_measures_two_routings_of_one_capture(tmp_path, cli_run):
    """End to end on a Llama 4 debug capture: the rows, the replayed loads as planned (not ``error``)."""
    import json

    from mystique.capture import capture

    capture("llama4", tmp_path / "cap", config="debug", mode="train", steps=1, warmup=0)
    for r in ("uniform", "skewed:4"):
        code, _, _ = cli_run("-q", "generate", str(tmp_path / "cap"), "-o", str(tmp_path / r), "--routing", r)
        assert code == 0
    code, out, _ = cli_run("-q", "replay", str(tmp_path / "skewed:4"), "--against", str(tmp_path / "uniform"),
                           "-o", str(tmp_path / "o"), "--time-cap", "5")
    assert code in (0, 1, 4) and "predicted ratio" in out
    s = json.loads((tmp_path / "o" / "routing_skew.json").read_text())
    assert s["verdict"] in ("pass", "fail", "inconclusive") and len(s["sites"]) == 6
    assert all(r["replayed_equals_planned"] for r in s["routing"])
    assert s["predicted_low"] <= s["predicted_ratio"] <= s["predicted_high"]
