"""A routing change's predicted effect against its measured one (issue 34): ``replay BENCH --against
BASE``. The model (mystique.replay.routing_cost) and the check are tested on synthetic numbers; the
real timing is in docs/results/replay_llama4_routing_skew_*/; the paired timing runs on an injected
clock and grouped GEMM, so no wall-clock speed is involved."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

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


def test_sites_pair_the_grouped_gemms_with_their_operand_layouts_and_refuse_other_totals():
    cand, base = _plan([[6, 1, 1, 0]] * 2), _plan([[2, 2, 2, 2]] * 2)
    ss = rc.sites(cand, base)
    assert len(ss) == 2 and ss[0].layout == "rows" and ss[0].dims == (256, 512)
    assert ss[0].candidate == (6, 1, 1, 0) and ss[0].base == (2, 2, 2, 2) and ss[0].moved == 4
    # a plan's tensor without strides is contiguous; a transposed weight (an input gradient's) keeps its strides
    assert ss[0].operands == (((1024, 256), (256, 1)), ((8, 256, 512), (131072, 512, 1)))
    cand.data["tensors"][1]["strides"] = [131072, 1, 256]
    assert rc.sites(cand, base)[0].operands[1] == ((8, 256, 512), (131072, 1, 256))
    assert rc.sites(_plan([[2, 2, 2, 2]]), _plan([[2, 2, 2, 2]]))[0].moved == 0
    with pytest.raises(ValueError, match="keeps each layer's total"):
        rc.sites(_plan([[6, 1, 1, 1]]), _plan([[2, 2, 2, 2]]))
    with pytest.raises(ValueError, match="ops"):
        rc.sites(_plan([[8]] * 2), _plan([[8]]))
    # a weight gradient (K, T) @ (T, N) and an input gradient's (E, M, K) @ (K, T)
    assert rc._layout([256, 1024], [1024, 512]) == ("inner", (256, 512))
    assert rc._layout([8, 64, 256], [256, 1024]) == ("cols", (64, 256))


def test_an_operand_has_the_steps_strides():
    import torch

    t = rc._operand((8, 256, 512), (131072, 1, 256), torch.float32, torch.device("cpu"))
    assert t.shape == (8, 256, 512) and t.stride() == (131072, 1, 256) and t.isfinite().all()
    assert rc._operand((0, 4), (4, 1), torch.float32, torch.device("cpu")).shape == (0, 4)


class FakeGemm:
    """A grouped GEMM that advances a fake clock by a cost of its groups' sizes (seconds), with an
    optional drift that grows with every call (a host slowing down), recording which loads ran."""

    def __init__(self, cost, drift: float = 0.0) -> None:
        self.now, self.cost, self.drift, self.calls = 0.0, cost, drift, []

    def clock(self) -> float:
        return self.now

    def __call__(self, a, b, offs) -> None:
        ends = offs.tolist()
        ls = tuple(e - s for s, e in zip([0, *ends[:-1]], ends))
        self.calls.append(ls)
        self.now += self.cost(ls) + self.drift * len(self.calls)


def _per_group(ls) -> float:
    """A cost with a per-group floor (a group of fewer than 4 tokens as dear as 4; an empty group free)."""
    return sum(max(n, 4) * 1e-6 for n in ls if n)


def test_the_prediction_is_the_paired_difference_of_the_moved_grouped_gemms():
    cand, base = _plan([[6, 1, 1, 0], [2, 2, 2, 2]]), _plan([[2, 2, 2, 2]] * 2)
    ss = rc.sites(cand, base)
    g = FakeGemm(_per_group)
    p = rc.time_sites(ss, "cpu", clock=g.clock, run=g, min_rounds=8)
    # only the site whose loads moved runs: (6, 1, 1, 0) against (2, 2, 2, 2)
    assert set(g.calls) == {(6, 1, 1, 0), (2, 2, 2, 2)} and len(g.calls) == 2 * (2 + 8)
    pred = rc.predict(ss, p)
    want = _per_group((6, 1, 1, 0)) - _per_group((2, 2, 2, 2))  # 14 - 16 us
    assert pred.delta_s == pytest.approx(want) and pred.low_s == pytest.approx(want) == pytest.approx(pred.high_s)
    assert (pred.rounds, pred.sites, pred.groups) == (8, 1, 4) and p.stop == "half-width"
    r, lo, hi = pred.ratio(1e-3)
    assert r == pytest.approx(1 + want / 1e-3) and lo == pytest.approx(r) and hi == pytest.approx(r)
    assert all(math.isnan(x) for x in pred.ratio(0.0))
    # nothing moved: exactly no change, nothing timed
    same = rc.sites(_plan([[2, 2, 2, 2]]), _plan([[2, 2, 2, 2]]))
    g = FakeGemm(_per_group)
    none = rc.predict(same, rc.time_sites(same, "cpu", clock=g.clock, run=g, min_rounds=3, time_cap_s=0.0))
    assert (none.delta_s, none.low_s, none.high_s) == (0.0, 0.0, 0.0) and none.ratio(1.0) == (1.0, 1.0, 1.0)


def test_the_rounds_run_abba_so_that_a_drifting_host_cancels_in_the_median():
    ss = rc.sites(_plan([[6, 1, 1, 0]]), _plan([[2, 2, 2, 2]]))
    g = FakeGemm(_per_group, drift=1e-7)  # each call 0.1 us slower than the last: 14 vs 16 us, a 2 us change
    p = rc.time_sites(ss, "cpu", clock=g.clock, run=g, min_rounds=40, time_cap_s=1e9, rel_half_width=1.0)
    order = ["c" if c == (6, 1, 1, 0) else "b" for c in g.calls[4:]]  # after the two warm-up pairs
    assert "".join(order[:8]) == "cbbcbccb"  # rounds AB, BA, BA, AB: each side first in half the rounds
    pred = rc.predict(ss, p)
    # the drift adds +-0.1 us to alternate rounds' differences; the median lies between, the interval holds -2 us
    assert pred.low_s <= -2e-6 <= pred.high_s and abs(pred.delta_s + 2e-6) <= 0.11e-6


def test_the_rounds_stop_at_the_half_width_or_the_time_cap():
    ss = rc.sites(_plan([[6, 1, 1, 0]]), _plan([[2, 2, 2, 2]]))
    noise = iter([0.0, 3e-6, -3e-6, 5e-6] * 1000)
    g = FakeGemm(lambda ls: _per_group(ls) + next(noise))  # a noisy host: the interval never narrows to 10%
    p = rc.time_sites(ss, "cpu", clock=g.clock, run=g, min_rounds=10, time_cap_s=2e-3)
    assert p.stop == "time cap" and len(p.candidate_s) > 10
    g = FakeGemm(_per_group)
    p = rc.time_sites(ss, "cpu", clock=g.clock, run=g, min_rounds=10, time_cap_s=2e-3)
    assert p.stop == "half-width" and len(p.candidate_s) == 10


class CachedGemm(FakeGemm):
    """A grouped GEMM whose experts' weights cost ``miss_s`` each when not cached (a cache that keeps every
    expert a pass read until ``flush``), plus 1 us per token: what a skewed pass leaves cached makes the
    uniform pass after it cheaper than from cold."""

    def __init__(self, miss_s: float) -> None:
        super().__init__(lambda ls: 0.0)
        self.miss_s, self.cached, self.flushes = miss_s, set(), 0

    def flush(self) -> None:
        self.cached.clear()
        self.flushes += 1

    def __call__(self, a, b, offs) -> None:
        ends = offs.tolist()
        ls = [e - s for s, e in zip([0, *ends[:-1]], ends)]
        busy = {(id(b), i) for i, n in enumerate(ls) if n}
        self.now += len(busy - self.cached) * self.miss_s + sum(ls) * 1e-6
        self.cached |= busy
        self.calls.append(tuple(ls))


def test_each_pass_starts_from_cold_caches_as_the_steps_grouped_gemms_do():
    ss = rc.sites(_plan([[5, 1, 0, 0]]), _plan([[2, 2, 1, 1]]))  # 2 busy experts against 4, 6 tokens each
    cold = (2 - 4) * 10e-6  # the step's change: two experts' weights fewer from memory, the tokens alike
    g = CachedGemm(10e-6)
    pred = rc.predict(ss, rc.time_sites(ss, "cpu", clock=g.clock, run=g, min_rounds=8, flush=g.flush))
    assert g.flushes == len(g.calls) == 2 * (2 + 8)  # one flush before every pass, warm-up included
    assert pred.delta_s == pytest.approx(cold) and pred.low_s == pytest.approx(cold) == pytest.approx(pred.high_s)
    # back to back, the uniform pass after a skewed one finds its busy experts cached: the change reads short
    g = CachedGemm(10e-6)
    warm = rc.predict(ss, rc.time_sites(ss, "cpu", clock=g.clock, run=g, min_rounds=8, rel_half_width=1.0))
    assert abs(warm.delta_s) < abs(cold) * 0.75


def test_llc_bytes_is_the_highest_level_data_or_unified_cache(tmp_path):
    def index(i, level, kind, size):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, v in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{v}\n")

    assert rc.llc_bytes("cpu", str(tmp_path)) is None  # nothing listed: unknown
    index(0, 1, "Data", "32K")
    index(1, 1, "Instruction", "64K")
    assert rc.llc_bytes("cpu", str(tmp_path)) == 32 << 10
    index(2, 2, "Unified", "512K")
    index(3, 3, "Instruction", "1G")  # not a data cache
    index(4, 3, "Unified", "bogus")  # unreadable: skipped
    assert rc.llc_bytes("cpu", str(tmp_path)) == 512 << 10
    index(5, 3, "Unified", "32768K")
    assert rc.llc_bytes("cpu", str(tmp_path)) == 32 << 20


def test_the_flush_reads_and_writes_a_multiple_of_the_cache():
    flush, nbytes = rc.cache_flusher("cpu", llc=1 << 16)
    assert nbytes == rc.FLUSH_CAPACITIES << 16 and flush.buffer.numel() * 4 == nbytes
    flush()
    flush()
    assert bool((flush.buffer == 2).all())  # every element read and written by every flush
    flush, nbytes = rc.cache_flusher("cpu", llc=0)  # unknown: nothing flushed, and the rows say so
    assert nbytes == 0 and flush() is None
    _, r = _rows((1.10, 1.095, 1.105), flush_bytes=0)
    assert "none flushed" in r["routing_skew_predicted_ratio"]["detail"]
    s, r = _rows((1.10, 1.095, 1.105), flush_bytes=128 << 20)
    assert "cold caches" in r["routing_skew_predicted_ratio"]["detail"] and s["flush_bytes"] == 128 << 20


@pytest.mark.parametrize("pred, meas, floor, want", [
    ((1.10, 1.20), (1.12, 1.18), 0.0, "pass"),  # inside: the amount and the direction
    ((1.10, 1.20), (1.01, 1.05), 0.0, "fail"),  # the right direction, not the predicted amount
    ((1.10, 1.20), (1.01, 1.05), 0.06, "inconclusive"),  # ... unless the floor reaches the prediction
    ((1.10, 1.20), (0.90, 0.95), 0.0, "fail"),  # the wrong direction
    ((1.10, 1.20), (0.98, 1.15), 0.0, "inconclusive"),  # overlaps, but a change is not resolved
    ((1.10, 1.20), (1.15, 1.25), 0.0, "inconclusive"),  # the direction, but reaching past the predicted amount
    ((1.10, 1.20), (1.15, 1.25), 0.05, "pass"),  # ... within the floor
    ((1.02, 1.03), (1.012, 1.035), 0.015, "inconclusive"),  # inside the widened prediction, but the floor reaches 1
    ((0.98, 1.01), (0.99, 1.00), 0.0, "inconclusive"),  # the model does not say which way: agreeing confirms nothing
    ((0.95, 1.06), (0.95, 1.05), 0.0, "inconclusive"),  # (the train skewed:2 figure on a busy host: both +-5%)
    ((1.0, 1.0), (0.99, 1.01), 0.0, "pass"),  # no load moved: exactly no change predicted, and none seen
    ((1.0, 1.0), (1.002, 1.01), 0.0, "fail"),  # ... and a change seen
    ((1.0, 1.0), (1.002, 1.01), 0.003, "pass"),  # ... within the floor
    ((0.80, 0.90), (0.82, 0.88), 0.0, "pass"),
    ((0.80, 0.90), (0.85, 0.95), 0.0, "inconclusive"),
    ((0.80, 0.90), (0.85, 1.02), 0.0, "inconclusive"),
    ((math.nan, 1.0), (0.9, 1.1), 0.0, "inconclusive"),
    ((0.8, 0.9), (0.85, 0.88), math.nan, "inconclusive"),  # no null interval: no floor known
])
def test_verdict_from_the_two_intervals_and_the_floor(pred, meas, floor, want):
    assert rc.verdict(*pred, *meas, floor) == want


_ratio = st.floats(0.5, 1.5, allow_nan=False)


@examples(200)
@given(p=st.tuples(_ratio, _ratio), m=st.tuples(_ratio, _ratio), f=st.floats(0.0, 0.1))
def test_verdict_laws(p, m, f):
    (plo, phi), (mlo, mhi) = sorted(p), sorted(m)
    v = rc.verdict(plo, phi, mlo, mhi, f)
    # fail exactly when the measured interval widened by the floor misses the prediction
    assert (v == "fail") == (mhi + f < plo or mlo - f > phi)
    if v == "pass" and not plo == phi == 1:  # pass: the amount inside, the direction beyond the floor
        assert plo - f <= mlo and mhi <= phi + f and (mlo - f > 1 or mhi + f < 1)
        assert (mlo - f > 1) == (plo > 1)
    # a change mirrored about 1 (a slowdown for a speed-up) is judged alike
    assert rc.verdict(2 - phi, 2 - plo, 2 - mhi, 2 - mlo, f) == v or min(abs(x - 1) for x in (plo, phi, mlo, mhi)) < 1e-9
    # a wider floor never turns a fail into a pass without passing through overlap, and never makes a pass fail
    if v == "pass":
        assert rc.verdict(plo, phi, mlo, mhi, f + 0.05) != "fail"


def _rows(measured, replayed_ok=True, null=(1.0, 1.0, 1.0), delta_s=10e-3, unc_s=1e-3, flush_bytes=0,
          special=(0.0, 0.0)):
    res = Results(RunContext(device="cpu", device_name="test", torch_version="x"), "replay")
    pred = rc.Prediction(delta_s, delta_s - unc_s, delta_s + unc_s, 40, 8, 32)  # +10 ms +-1 on a 100 ms step
    s = rows(res, "llama4/small/infer [skewed:4 vs uniform]", pred, 0.1, *measured, null=null, rounds=40, threads=1,
             load=([1.0], [1.0]), replayed_ok=replayed_ok, repro="mystique replay B --against A -o OUT",
             flush_bytes=flush_bytes, special=special)
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


def test_state_with_special_values_is_counted_once_per_storage():
    import torch

    from mystique.replay.against import special_fraction

    x = torch.tensor([1.0, math.inf, math.nan, 1e-40, 0.0, 2.0, -math.inf, 3.0])  # 1e-40: subnormal in fp32
    ex = SimpleNamespace(_external={0: x, 1: x.view(8), 2: torch.arange(4), 3: torch.ones(8, dtype=torch.float64)})
    assert special_fraction(ex) == pytest.approx(4 / 16)  # x once (its view is the same storage), the ints left out
    assert special_fraction(SimpleNamespace(_external={})) == 0.0


def test_the_state_a_step_changed_is_put_back_and_nothing_else_is_copied():
    import torch

    from mystique.replay.against import StateRestore

    moment, weight = torch.full((4,), 0.5), torch.ones(3)
    ex = SimpleNamespace(_external={0: moment, 1: weight, 2: moment.view(4), 3: torch.arange(3)})
    st = StateRestore(ex)
    for _ in range(3):  # a replayed step re-applying its in-place update to its own result: it drifts, to inf
        moment.mul_(1e20)
    assert not moment.isfinite().all()
    st()
    assert bool((moment == 0.5).all()) and bool((weight == 1).all())
    assert st.bytes == 16  # the moment only: the weight did not change, so it is no longer copied
    moment.mul_(1e20)
    st()
    assert bool((moment == 0.5).all())
    assert StateRestore(SimpleNamespace(_external={0: weight})).bytes == 12  # before its first call: all kept


def test_a_replayed_state_of_special_values_makes_the_comparison_an_error():
    s, r = _rows((1.10, 1.095, 1.105))  # a pass without special values
    assert r["routing_skew_special_values"]["status"] == "pass" and s["verdict"] == "pass"
    s, r = _rows((1.10, 1.095, 1.105), special=(0.0, 0.3))  # the base's Adam moments overflowed
    assert r["routing_skew_special_values"]["status"] == "fail" and r["routing_skew_special_values"]["value"] == 0.3
    assert s["verdict"] == "error" and "inf, NaN or subnormal" in r["routing_skew_prediction_error"]["detail"]


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
