"""Side-by-side timing: paired rounds, a warm-up until stable, the median paired ratio with a 95%
interval, and a verdict from the interval.

A ratio of two medians measured minutes apart, or in two processes, reports the host's noise.
Here the two sides ``a`` (the candidate, e.g. the replay) and ``b`` (the baseline, e.g. the original
step) alternate in one process, in ABBA order (each round times ``a b`` or ``b a``, alternating, so
a linear drift of the host cancels in pairs), and every round gives one paired ratio ``a_r / b_r``
taken under the same state of the host. The figure is the median of those ratios with a distribution-free 95% interval
(order statistics with binomial ranks); rounds are added until the interval's half-width is at
most ``half_width`` of the median or ``time_cap_s`` is spent.

Warm-up runs both sides alternately until their step times are stable: the median of the last
``window`` times of each side moves by at most ``stable_tol`` from the window before (allocator,
caches, lazy initialisation, clocks ramping), or ``warmup_cap_s`` is spent (then the warm-up is
reported as not settled). On CUDA the device time comes from CUDA events around each side and the
host wall time beside it; elsewhere wall time between device synchronisations.

:func:`verdict` turns an interval and a band into ``pass`` (inside), ``fail`` (outside) or
``inconclusive`` (straddling): never a verdict from one median.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

LEVEL = 0.95


def median_interval(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """Distribution-free ``level`` interval of the median of ``values`` (order statistics, binomial ranks).

    With fewer than 6 values no 95% interval exists; the extremes are returned.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    # the largest j with P(Binomial(n, 1/2) < j) <= (1 - level) / 2: [x_(j), x_(n+1-j)] covers the median;
    # counted in integers (C(n, j) out of 2^n) so that no float overflows however many rounds there are
    tail = Fraction((1.0 - level) / 2.0) * 2**n
    cdf, j = 0, 0
    while j < n:
        p = math.comb(n, j)
        if cdf + p > tail:
            break
        cdf += p
        j += 1
    lo = max(j - 1, 0)
    return xs[lo], xs[n - 1 - lo]


def verdict(lo: float, hi: float, band_low: float, band_high: float) -> str:
    """``pass`` when [lo, hi] lies inside [band_low, band_high], ``fail`` when it lies wholly
    outside, ``inconclusive`` when it straddles an edge (or is undefined)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if band_low <= lo and hi <= band_high:
        return "pass"
    if hi < band_low or lo > band_high:
        return "fail"
    return "inconclusive"


@dataclass
class Paired:
    """The outcome of :func:`paired_rounds`: per-round times (ms) and the paired-ratio statistics."""

    a_ms: list[float] = field(default_factory=list)  # candidate, one per round
    b_ms: list[float] = field(default_factory=list)  # baseline, one per round
    a_wall_ms: list[float] = field(default_factory=list)
    b_wall_ms: list[float] = field(default_factory=list)
    warmup_rounds: int = 0
    warmup_s: float = 0.0
    warmup_settled: bool = False
    clock: str = "wall"
    stop: str = ""  # why the rounds stopped: "half-width", "time cap", "max rounds"
    seconds: float = 0.0
    order: str = "ABBA"
    half_width_target: float = math.nan
    time_cap_s: float = math.nan
    loadavg_start: list[float] | None = None  # os.getloadavg() before the warm-up, and after the rounds
    loadavg_end: list[float] | None = None

    @property
    def rounds(self) -> int:
        return len(self.a_ms)

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.a_ms, self.b_ms) if b > 0]

    @property
    def ratio(self) -> float:
        r = self.ratios
        return statistics.median(r) if r else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        return median_interval(self.ratios)

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the median ratio."""
        lo, hi = self.interval
        m = self.ratio
        return (hi - lo) / 2.0 / m if m and math.isfinite(m) and math.isfinite(lo) else math.inf

    @property
    def a_median_ms(self) -> float:
        return statistics.median(self.a_ms) if self.a_ms else math.nan

    @property
    def b_median_ms(self) -> float:
        return statistics.median(self.b_ms) if self.b_ms else math.nan

    def summary(self) -> dict[str, Any]:
        """The statistics as ``summary.json`` keeps them (per-round times included); strict JSON:
        a non-finite number (no interval yet) becomes None."""
        lo, hi = self.interval
        d = asdict(self)
        d.update(rounds=self.rounds, ratio=self.ratio, ratio_low=lo, ratio_high=hi, half_width=self.half_width,
                 level=LEVEL, a_median_ms=self.a_median_ms, b_median_ms=self.b_median_ms, ratios=self.ratios)
        return _json_safe(d)


def _json_safe(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def loadavg() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages, or None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


class _Timer:
    """Times one call of ``fn`` on ``device``: CUDA events where available, wall time always."""

    def __init__(self, device: str, sync: Callable[[], None]):
        self.sync = sync
        self.cuda = False
        self.dev: Any = None
        try:
            import torch

            self.cuda = str(device).startswith("cuda") and torch.cuda.is_available()
            if self.cuda:
                self.dev = torch.device(device)
                if self.dev.index is None:
                    self.dev = torch.device("cuda", torch.cuda.current_device())
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        self.clock = "cuda events" if self.cuda else "wall"

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, float]:
        """(device ms, wall ms) of one call, synchronised at both ends.

        On CUDA the events are recorded on the device's current stream (the one the step and the
        replay launch on) right before and after the call; the elapsed time between them, read after
        a synchronisation, is the step's device time including any host-bound gaps between kernels."""
        self.sync()
        if self.cuda:
            import torch

            stream = torch.cuda.current_stream(self.dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            w0 = time.perf_counter()
            start.record(stream)
            fn()
            end.record(torch.cuda.current_stream(self.dev))
            self.sync()
            end.synchronize()
            wall = (time.perf_counter() - w0) * 1e3
            return float(start.elapsed_time(end)), wall
        w0 = time.perf_counter()
        fn()
        self.sync()
        wall = (time.perf_counter() - w0) * 1e3
        return wall, wall


def _settled(xs: list[float], window: int, tol: float) -> bool:
    if len(xs) < 2 * window:
        return False
    last = statistics.median(xs[-window:])
    before = statistics.median(xs[-2 * window:-window])
    return abs(last - before) <= tol * before


def paired_rounds(
    a: Callable[[], Any],
    b: Callable[[], Any],
    *,
    device: str = "cpu",
    sync: Callable[[], None] = lambda: None,
    half_width: float = 0.025,
    time_cap_s: float = 60.0,
    min_rounds: int = 12,
    max_rounds: int = 100_000,
    window: int = 5,
    stable_tol: float = 0.05,
    warmup_cap_s: float | None = None,
    min_warmup: int = 0,
    progress: Callable[[str], None] | None = None,
    between: Callable[[], None] | None = None,
    decide: Callable[[Paired, float], str | None] | None = None,
) -> Paired:
    """Alternate ``a`` and ``b`` (ABBA) after a warm-up until stable (at least ``min_warmup``
    rounds); add rounds (at least ``min_rounds``) until the 95% interval of the median ratio ``a/b``
    is within ``half_width`` (relative) or ``time_cap_s`` (measurement, after warm-up) is spent.
    ``sync`` waits for the device at step boundaries; ``between`` (if given) is called after every
    warm-up and measured round, outside the timed calls (e.g. to watch the host and abort by raising).
    ``decide(out, seconds)`` (if given) is asked after every measured round, with the seconds of
    measurement so far; a string it returns stops the rounds with that reason (an adaptive stop:
    :class:`mystique.stopping.Stopper`), before the half-width and cap rules are read."""
    if half_width <= 0 or time_cap_s <= 0:
        raise ValueError("half_width and time_cap_s must be positive")
    timer = _Timer(device, sync)
    out = Paired(clock=timer.clock, half_width_target=half_width, time_cap_s=time_cap_s, loadavg_start=loadavg())
    cap = warmup_cap_s if warmup_cap_s is not None else max(5.0, time_cap_s / 4)
    t0 = time.perf_counter()
    wa: list[float] = []
    wb: list[float] = []
    while True:  # warm-up until stable
        wa.append(timer(a)[0])
        wb.append(timer(b)[0])
        if between is not None:
            between()
        if len(wa) >= min_warmup and _settled(wa, window, stable_tol) and _settled(wb, window, stable_tol):
            out.warmup_settled = True
            break
        if time.perf_counter() - t0 > cap and len(wa) >= min_warmup:
            break
    out.warmup_rounds, out.warmup_s = len(wa), time.perf_counter() - t0
    if progress:
        progress(f"warm-up: {out.warmup_rounds} rounds in {out.warmup_s:.1f} s"
                 + ("" if out.warmup_settled else " (not settled: time cap)"))
    t1 = time.perf_counter()
    next_note = t1 + 2.0
    while True:
        order = (a, b) if out.rounds % 2 == 0 else (b, a)
        got = {}
        for fn in order:
            got[fn is a] = timer(fn)
        out.a_ms.append(got[True][0])
        out.a_wall_ms.append(got[True][1])
        out.b_ms.append(got[False][0])
        out.b_wall_ms.append(got[False][1])
        if between is not None:
            between()
        n = out.rounds
        now = time.perf_counter()
        why = decide(out, now - t1) if decide is not None else None
        if why:
            out.stop = why
            break
        if n >= min_rounds and out.half_width <= half_width:
            out.stop = "half-width"
            break
        if now - t1 > time_cap_s and n >= min(min_rounds, 6):
            out.stop = "time cap"
            break
        if n >= max_rounds:
            out.stop = "max rounds"
            break
        if progress and now >= next_note:
            lo, hi = out.interval
            progress(f"round {n}: ratio {out.ratio:.3f} [{lo:.3f}, {hi:.3f}]")
            next_note = now + 2.0
    out.seconds = time.perf_counter() - t0
    out.loadavg_end = loadavg()
    return out
