"""mystique.timing: the interval of the median, verdicts from intervals, ABBA rounds and when they stop.

No test here depends on how fast the host is: the clock is replaced where a figure is asserted.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mystique import timing
from mystique.timing import Paired, median_interval, paired_rounds, verdict

finite = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=300))
def test_the_interval_contains_the_median_and_lies_within_the_sample(xs):
    lo, hi = median_interval(xs)
    assert min(xs) <= lo <= statistics.median(xs) <= hi <= max(xs)


def test_the_interval_ranks_are_the_narrowest_with_95_percent_coverage():
    """[x_(j), x_(n+1-j)] covers the median with probability 1 - 2 P(Bin(n, 1/2) < j): at least 95%,
    and the next narrower pair of ranks would not."""
    for n in range(6, 301):
        xs = list(range(n))
        lo, hi = median_interval(xs)
        j = lo + 1  # 1-based rank of the lower bound

        def coverage(k: int, n: int = n) -> float:
            return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n

        assert coverage(j) >= 0.95 - 1e-12, n
        assert coverage(j + 1) < 0.95, n
        assert hi == n - j  # symmetric ranks


def test_fewer_than_six_values_give_the_extremes_and_none_gives_nan():
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    lo, hi = median_interval([])
    assert math.isnan(lo) and math.isnan(hi)


@pytest.mark.parametrize("lo,hi,want", [
    (0.95, 1.05, "pass"), (0.90, 1.10, "pass"),       # inside, edges included
    (1.12, 1.30, "fail"), (0.50, 0.89, "fail"),       # wholly outside
    (1.05, 1.15, "inconclusive"), (0.85, 0.95, "inconclusive"), (0.5, 1.5, "inconclusive"),  # straddling
    (math.nan, 1.0, "inconclusive"), (0.95, math.inf, "inconclusive"),
])
def test_verdict_from_an_interval(lo, hi, want):
    assert verdict(lo, hi, 0.90, 1.10) == want


@given(finite, finite, finite, finite)
def test_verdict_law(a, b, c, d):
    lo, hi = sorted((a, b))
    bl, bh = sorted((c, d))
    v = verdict(lo, hi, bl, bh)
    assert (v == "pass") == (bl <= lo and hi <= bh)
    assert (v == "fail") == (hi < bl or lo > bh)
    assert v in ("pass", "fail", "inconclusive")


class FakeClock:
    """Replaces ``_Timer.__call__``: each side takes the time its schedule says, and the calls are logged."""

    def __init__(self, a_ms, b_ms):
        self.a_ms, self.b_ms = a_ms, b_ms
        self.calls: list[str] = []

    def install(self, monkeypatch):
        clock = self

        def call(timer_self, fn):
            name = fn()
            clock.calls.append(name)
            n = clock.calls.count(name)
            sched = clock.a_ms if name == "a" else clock.b_ms
            t = sched(n) if callable(sched) else sched
            return t, t

        monkeypatch.setattr(timing._Timer, "__call__", call)


def test_rounds_alternate_abba_after_a_warm_up_until_stable(monkeypatch):
    clock = FakeClock(2.0, 1.0)
    clock.install(monkeypatch)
    p = paired_rounds(lambda: "a", lambda: "b", half_width=0.025, time_cap_s=30, min_rounds=12, window=3)
    assert p.warmup_settled and p.warmup_rounds == 6  # two windows of 3 with the same median
    rounds = clock.calls[2 * p.warmup_rounds:]
    assert len(rounds) == 2 * p.rounds
    pairs = [tuple(rounds[i:i + 2]) for i in range(0, len(rounds), 2)]
    assert pairs == [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(p.rounds)]  # A B B A A B ...
    assert p.rounds == 12 and p.stop == "half-width" and p.ratio == 2.0 and p.interval == (2.0, 2.0)
    assert p.half_width == 0.0 and p.a_median_ms == 2.0 and p.b_median_ms == 1.0 and p.order == "ABBA"


def test_a_warm_up_that_never_settles_stops_at_its_cap(monkeypatch):
    # side a slows down every call (never stable); the warm-up gives up after its cap
    clock = FakeClock(lambda n: float(n), 1.0)
    clock.install(monkeypatch)
    p = paired_rounds(lambda: "a", lambda: "b", time_cap_s=0.05, warmup_cap_s=0.0, min_rounds=6, min_warmup=4)
    assert not p.warmup_settled and p.warmup_rounds == 4  # the minimum, then the cap
    assert p.rounds >= 6 and p.stop in ("time cap", "half-width")


def test_rounds_are_added_until_the_time_cap_when_the_interval_stays_wide(monkeypatch):
    noisy = [1.0, 3.0, 0.5, 2.5, 1.5, 0.7]
    clock = FakeClock(lambda n: noisy[n % len(noisy)], 1.0)
    clock.install(monkeypatch)
    p = paired_rounds(lambda: "a", lambda: "b", half_width=0.001, time_cap_s=0.2, min_rounds=6, warmup_cap_s=0.0)
    assert p.stop == "time cap" and p.rounds >= 6 and p.half_width > 0.001
    lo, hi = p.interval
    assert lo <= p.ratio <= hi
    q = paired_rounds(lambda: "a", lambda: "b", half_width=0.001, time_cap_s=30, max_rounds=9, min_rounds=6,
                      warmup_cap_s=0.0)
    assert q.stop == "max rounds" and q.rounds == 9


def test_real_callables_are_timed_with_the_wall_clock_and_summary_is_strict_json():
    p = paired_rounds(lambda: sum(range(2000)), lambda: sum(range(1000)), time_cap_s=0.2, warmup_cap_s=0.05,
                      min_rounds=6)
    assert p.clock == "wall" and p.rounds >= 6 and all(x > 0 for x in p.a_ms + p.b_ms)
    d = p.summary()
    json.dumps(d, allow_nan=False)
    for key in ("rounds", "a_ms", "b_ms", "a_wall_ms", "b_wall_ms", "ratios", "ratio", "ratio_low", "ratio_high",
                "half_width", "half_width_target", "time_cap_s", "warmup_rounds", "warmup_s", "warmup_settled",
                "clock", "stop", "order", "level", "loadavg_start", "loadavg_end"):
        assert key in d, key
    assert d["rounds"] == len(d["a_ms"]) == len(d["ratios"]) and d["level"] == 0.95
    empty = Paired().summary()
    json.dumps(empty, allow_nan=False)
    assert empty["ratio"] is None and empty["half_width"] is None


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        paired_rounds(lambda: None, lambda: None, half_width=0)
    with pytest.raises(ValueError):
        paired_rounds(lambda: None, lambda: None, time_cap_s=-1)


def test_the_interval_of_many_rounds_needs_no_float_past_its_range():
    """2^n overflows a float past 1023 rounds; the ranks are counted in integers."""
    xs = list(range(3001))
    lo, hi = timing.median_interval(xs)
    assert lo < 1500 < hi and hi - lo < 120 and 1500 - lo == hi - 1500
