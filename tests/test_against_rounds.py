"""``replay --against``'s rounds (issue 34): several executors per plan rotated so that one executor's
placement does not bias the ratio, a null (more executors of the base plan) in the same rounds as the
floor, and the check deciding against it. Timed with an injected clock: no wall-clock speed involved."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.replay import routing_cost as rc
from mystique.replay.against import rows
from mystique.replay.against_rounds import ORDERS, floor_of, rotated_rounds
from mystique.results import Results, RunContext


class FakeDevice:
    """A clock and executors that each advance it by their own step time (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def clock(self) -> float:
        return self.now

    def executor(self, name: str, step_s: float):
        def run() -> None:
            self.calls.append(name)
            self.now += step_s
        return run


def _streams(dev: FakeDevice, bench: list[float], base: list[float], null: list[float]):
    return [[dev.executor(f"{tag}{i}", t) for i, t in enumerate(ts)] for tag, ts in
            (("x", bench), ("b", base), ("n", null))]


def test_every_order_of_the_three_streams_comes_in_turn():
    assert sorted(ORDERS) == sorted(itertools.permutations(range(3)))
    for place in range(3):  # each stream in each place once per six rounds
        assert {o[place] for o in ORDERS} == {0, 1, 2}


@examples(20)
@given(k=st.integers(1, 3), rounds=st.integers(1, 6))
def test_every_executor_takes_an_equal_share_and_none_runs_twice_in_a_row(k, rounds):
    dev = FakeDevice()
    n = rounds * k
    p = rotated_rounds(_streams(dev, [1.0] * k, [1.0] * k, [1.0] * k), clock=dev.clock, half_width=1e-9,
                       time_cap_s=3 * n - 0.5, min_rounds=n)  # a round takes 3 s of the fake clock
    assert p.rounds == n and p.warmup_rounds >= k * k
    for stream in ("bench", "base", "null"):
        used = p.executor[stream]
        assert Counter(used) == Counter({e: rounds for e in range(k)})
        # no stream keeps an executor from one round to the next (while another changes): equal footing
        assert k == 1 or all(a != b for a, b in zip(used, used[1:]))
    assert len(dev.calls) == 3 * (p.warmup_rounds + n)


def test_an_executor_offset_enters_the_interval_instead_of_the_median():
    # two executors of one plan, one 2% slower (where its tensors sit), on both sides and in the null:
    # one executor a side could read 1.02 or 0.98 however long it is timed; rotated, the median is 1
    dev = FakeDevice()
    p = rotated_rounds(_streams(dev, [1.0, 1.02], [1.02, 1.0], [1.02, 1.0]), clock=dev.clock, half_width=1e-9,
                       time_cap_s=40, min_rounds=40)
    m, lo, hi = p.ratio("bench")
    assert m == pytest.approx(1.0, abs=1e-3) and lo == pytest.approx(1 / 1.02) and hi == pytest.approx(1.02)
    assert p.ratio("null")[0] == pytest.approx(1.0)


def test_a_real_change_is_measured_through_the_rotation():
    dev = FakeDevice()
    p = rotated_rounds(_streams(dev, [1.10, 1.10], [1.0, 1.0], [1.0, 1.0]), clock=dev.clock, half_width=0.01,
                       time_cap_s=100, min_rounds=12)
    assert p.stop == "half-width" and p.rounds == 12
    assert p.ratio("bench") == pytest.approx((1.10, 1.10, 1.10)) and p.ratio("null") == pytest.approx((1, 1, 1))
    assert p.base_median_s() == pytest.approx(1.0) and p.summary()["null_ratio"] == pytest.approx(1.0)


def test_the_prediction_runs_after_every_measured_round_under_that_rounds_host():
    # a host that turns twice as slow halfway (a neighbour starts): the prediction's passes, one pair after
    # each measured round, run in both halves as the rounds do (timed in a phase of their own, they would see one)
    dev = FakeDevice()
    slow = {"f": 1.0}
    streams = [[_scaled(dev, slow, f"{tag}{i}", t) for i in range(2)] for tag, t in (("x", 1.1), ("b", 1.0), ("n", 1.0))]
    seen = []

    def each_round(n: int) -> None:
        dev.calls.append(f"P{n}")
        seen.append((n, slow["f"]))
        if n == 9:
            slow["f"] = 2.0

    after = []
    p = rotated_rounds(streams, clock=dev.clock, half_width=1e-9, time_cap_s=1e9, min_rounds=20, each_round=each_round,
                       after_round=lambda r: after.append((r, dev.calls[-3:])))
    assert [n for n, _ in seen] == list(range(p.rounds)) and p.rounds == 20
    measured = [c for c in dev.calls[3 * p.warmup_rounds:]]  # none during the warm-up; after each round's streams
    assert all(measured[4 * n + 3] == f"P{n}" and not measured[4 * n + 2].startswith("P") for n in range(p.rounds))
    # after_round follows every round, warm-up included, once its executors (r % k of each stream) ran
    assert [r for r, _ in after] == list(range(p.warmup_rounds)) + list(range(p.rounds))
    assert all(sorted(int(c[1:]) for c in calls) == [r % 2] * 3 for r, calls in after)
    assert [f for _, f in seen].count(2.0) == 10 and p.ratio("bench")[0] == pytest.approx(1.1)


def _scaled(dev: FakeDevice, slow: dict, name: str, step_s: float):
    def run() -> None:
        dev.calls.append(name)
        dev.now += step_s * slow["f"]
    return run


def test_bad_streams_are_refused():
    dev = FakeDevice()
    with pytest.raises(ValueError, match="three streams"):
        rotated_rounds(_streams(dev, [1.0], [1.0, 1.0], [1.0])[:3], clock=dev.clock)
    with pytest.raises(ValueError, match="positive"):
        rotated_rounds(_streams(dev, [1.0], [1.0], [1.0]), clock=dev.clock, half_width=0)


def test_the_floor_is_the_null_intervals_farther_end():
    assert floor_of(0.998, 1.0205) == pytest.approx(0.0205)
    assert floor_of(0.97, 1.001) == pytest.approx(0.03)
    assert math.isnan(floor_of(math.nan, 1.0))


def _check(bench, null, delta_s, unc_s=0.2e-3):
    """The rotated rounds of fake executors, then the rows, as replay --against writes them."""
    dev = FakeDevice()
    p = rotated_rounds(_streams(dev, *bench, null), clock=dev.clock, half_width=1e-9, time_cap_s=60, min_rounds=60)
    res = Results(RunContext(device="cpu", device_name="test", torch_version="x"), "replay")
    s = rows(res, "x [skewed:4 vs uniform]", rc.Prediction(delta_s, delta_s - unc_s, delta_s + unc_s, 40, 8, 32), p.base_median_s(), *p.ratio("bench"),
             null=p.ratio("null"), rounds=p.rounds, threads=1, load=(None, None), replayed_ok=True, repro="r")
    return s, {r["check"]: r for r in res.rows}


def test_a_step_that_moves_otherwise_than_predicted_fails_beyond_the_floor():
    # the benchmark 5% slower; the model predicted +0.3% (of a 1 s step); each plan's two executors 1% apart,
    # the null's as the base's: rotated, the null reads 1 with a tight interval (floor 0) and the check fails
    s, r = _check(([1.05, 1.0605], [1.0, 1.01]), [1.0, 1.01], delta_s=3e-3)
    assert s["verdict"] == "fail" and r["routing_skew_prediction_error"]["status"] == "fail"
    assert s["floor"] == pytest.approx(0.0) and r["routing_skew_null_ratio"]["value"] == pytest.approx(1.0)
    # the null's executors 1% slower than the base's (an offset the rotation does not average out): floor ~1%
    null = [1.01, 1.0201]
    s, r = _check(([0.95, 0.9595], [1.0, 1.01]), null, delta_s=3e-3)  # -5% against +0.3%: beyond the floor
    assert s["verdict"] == "fail" and 0.01 <= s["floor"] < 0.021
    s, _ = _check(([1.05, 1.0605], [1.0, 1.01]), null, delta_s=50e-3)  # the predicted +5% is found
    assert s["verdict"] == "pass"
    s, r = _check(([1.003, 1.01303], [1.0, 1.01]), null, delta_s=3e-3)  # +0.3% under a 1% floor: unresolved
    assert s["verdict"] == "inconclusive" and "floor" in r["routing_skew_prediction_error"]["detail"]
