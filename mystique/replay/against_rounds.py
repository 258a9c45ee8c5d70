"""The timed rounds of ``replay BENCH --against BASE``: several executors per plan, rotated, and a null.

Two executors of one plan are not the same program in memory: each allocates its own tensors, and
where they land (pages, cache sets, alignment) can make one a steady percent or so faster than the
other, however many rounds are timed (issue 34: the uniform Llama 4 small train benchmark against
itself read +0.86% [+0.23, +2.05] with one executor a side). A routing change smaller than that is
then judged against an offset the routing did not cause. Here:

* each plan gets ``k`` executors (fresh allocations), and every stream takes its next executor every
  round, each an equal share: an executor's own offset enters the rounds' spread (so the interval)
  instead of biasing the median;
* a third stream, the *null*, is ``k`` more executors of BASE, timed in the same rounds: NULL / BASE
  is the floor of the comparison, what two sets of executors of one plan read on this host now;
* the three streams run in every order in turn (``b n x``, ``n x b``, ``x b n`` and their
  reverses, ``x`` the benchmark), so a linear drift of the host touches each alike over six rounds.

Each round gives the ratios BENCH / BASE and NULL / BASE, taken under the same state of the host;
their medians carry distribution-free 95% intervals (:func:`mystique.timing.median_interval`).
Rounds are added (at least ``min_rounds``) until the BENCH / BASE interval's half-width is within
``half_width`` of its median or ``time_cap_s`` of measurement is spent, after a warm-up that runs
until every stream's times are stable (or a quarter of the cap) and every executor ran.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..timing import _settled, loadavg, median_interval

STREAMS = ("bench", "base", "null")
#: the order of the three streams in round r is ORDERS[r % 6]: each stream in each place once per six rounds
ORDERS = ((0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1), (2, 0, 1), (1, 0, 2))


@dataclass
class Rotated:
    """Seconds per round of each stream, which executor ran it, and how the rounds went."""

    times: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STREAMS})
    executor: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in STREAMS})
    executors: int = 0
    warmup_rounds: int = 0
    warmup_settled: bool = False
    stop: str = ""
    seconds: float = 0.0
    loadavg_start: list[float] | None = None
    loadavg_end: list[float] | None = None

    @property
    def rounds(self) -> int:
        return len(self.times["base"])

    def ratios(self, stream: str) -> list[float]:
        return [a / b for a, b in zip(self.times[stream], self.times["base"]) if b > 0]

    def ratio(self, stream: str) -> tuple[float, float, float]:
        """Median ratio ``stream`` / base over the rounds and its 95% interval."""
        r = self.ratios(stream)
        if not r:
            return math.nan, math.nan, math.nan
        return (statistics.median(r), *median_interval(r))

    def base_median_s(self) -> float:
        return statistics.median(self.times["base"]) if self.times["base"] else math.nan

    def half_width(self) -> float:
        m, lo, hi = self.ratio("bench")
        return (hi - lo) / 2 / m if m and math.isfinite(lo) else math.inf

    def summary(self) -> dict[str, Any]:
        def safe(x: float) -> float | None:
            return x if math.isfinite(x) else None

        out: dict[str, Any] = {"order": "rotated bench/base/null", "executors_per_stream": self.executors,
                               "rounds": self.rounds, "warmup_rounds": self.warmup_rounds,
                               "warmup_settled": self.warmup_settled, "stop": self.stop, "seconds": self.seconds,
                               "loadavg_start": self.loadavg_start, "loadavg_end": self.loadavg_end,
                               "ms": {s: [t * 1e3 for t in xs] for s, xs in self.times.items()},
                               "executor": self.executor}
        for s in ("bench", "null"):
            m, lo, hi = self.ratio(s)
            out[f"{s}_ratio"], out[f"{s}_ratio_low"], out[f"{s}_ratio_high"] = safe(m), safe(lo), safe(hi)
        return out


def _pick(r: int, stream: int, k: int) -> int:
    """The executor of ``stream`` in round ``r``: every stream takes its next executor every round, so each
    executor runs an equal share and no stream repeats one in consecutive rounds (a stream that did, while
    the others did not, would gain whatever an executor's data still warm from its last step is worth:
    measured on Llama 4 small train, a base changing executors every second round read 0.8% faster than a
    null changing every round)."""
    return r % k


def rotated_rounds(streams: Sequence[Sequence[Callable[[], Any]]], *, sync: Callable[[], None] = lambda: None,
                   clock: Callable[[], float] = time.perf_counter, half_width: float = 0.025,
                   time_cap_s: float = 60.0, min_rounds: int = 12, window: int = 5, stable_tol: float = 0.05,
                   progress: Callable[[str], None] | None = None,
                   each_round: Callable[[int], None] | None = None,
                   after_round: Callable[[int], None] | None = None) -> Rotated:
    """Time ``streams`` (BENCH, BASE, NULL: ``k`` callables each, one per executor) as the module
    docstring says; ``clock`` gives seconds (injected by tests). ``each_round(n)`` runs after every measured
    round ``n`` (outside the streams' times): work that must see the same state of the host as the rounds
    (``replay --against``'s prediction); the rotation puts each stream first after it equally often.
    ``after_round(r)`` runs after every round ``r``, warm-up included (counted from 0 in each phase),
    untimed: the executors of round ``r`` are ``r % k`` of each stream (``replay --against`` puts their state
    back there)."""
    if len(streams) != 3 or len({len(s) for s in streams}) != 1 or not streams[0]:
        raise ValueError("rotated_rounds takes three streams of as many executors each")
    if half_width <= 0 or time_cap_s <= 0:
        raise ValueError("half_width and time_cap_s must be positive")
    k = len(streams[0])
    out = Rotated(executors=k, loadavg_start=loadavg())

    def one(r: int, into: Rotated | None) -> list[float]:
        got = [0.0, 0.0, 0.0]
        for s in ORDERS[r % len(ORDERS)]:
            e = _pick(r, s, k)
            sync()
            t0 = clock()
            streams[s][e]()
            sync()
            got[s] = clock() - t0
            if into is not None:
                into.executor[STREAMS[s]].append(e)
        if into is not None:
            for s, name in enumerate(STREAMS):
                into.times[name].append(got[s])
        return got

    t0 = clock()
    warm: list[list[float]] = [[], [], []]
    cap = max(5.0, time_cap_s / 4)
    r = 0
    while True:  # warm-up: every executor runs, then until each stream's times settle (or the cap)
        for s, t in enumerate(one(r, None)):
            warm[s].append(t)
        if after_round is not None:
            after_round(r)
        r += 1
        if r >= k * k and all(_settled(w, window, stable_tol) for w in warm):
            out.warmup_settled = True
            break
        if r >= k * k and clock() - t0 > cap:
            break
    out.warmup_rounds = r
    if progress:
        progress(f"warm-up: {r} rounds of {3 * k} executors" + ("" if out.warmup_settled else " (not settled: time cap)"))
    t1 = clock()
    n = 0
    while True:
        one(n, out)
        if after_round is not None:
            after_round(n)
        if each_round is not None:
            each_round(n)
        n += 1
        now = clock()
        if n >= min_rounds and out.half_width() <= half_width:
            out.stop = "half-width"
            break
        if now - t1 > time_cap_s and n >= min(min_rounds, 6):
            out.stop = "time cap"
            break
    out.seconds = clock() - t0
    out.loadavg_end = loadavg()
    return out


def floor_of(null_low: float, null_high: float) -> float:
    """The comparison's floor from the null's 95% interval: how far from 1 two sets of executors of one
    plan may read (the interval's farther end); NaN when the null has no interval."""
    if not (math.isfinite(null_low) and math.isfinite(null_high)):
        return math.nan
    return max(abs(null_low - 1), abs(null_high - 1))


__all__ = ["ORDERS", "STREAMS", "Rotated", "floor_of", "rotated_rounds"]
