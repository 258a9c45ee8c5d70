"""Binomial rates: the Wilson score interval, the verdict of a rate read from it, and the trials a
verdict needs (stdlib only: the validators and the reports share this one implementation).

A rate with a target (a detection rate of at least 0.999, a false-alarm rate of at most some bound)
is judged from its 95% interval, never from its point estimate: ``pass`` when the whole interval
is on the good side of the target, ``fail`` when the whole interval is on the bad side, else
``inconclusive``. With no bad outcome in ``n`` trials the Wilson lower bound is ``n / (n + z^2)``, so
a rate of at least ``t`` needs ``n >= t z^2 / (1 - t)`` trials without a miss (3838 for 0.999) and
one of at most ``t`` needs ``n >= (1 - t) z^2 / t`` trials without an alarm.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` of ``successes`` out of ``trials`` (``(0, 1)`` when no trials).

    The bounds are the two roots p of ``(p_hat - p)^2 = z^2 p (1 - p) / n``. ``successes`` may be a
    real number (a rate times its trials, as a report recovers it).
    """
    if trials < 0 or successes < 0 or successes > trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    n = float(trials)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, min(p, center - half))
    high = 1.0 if successes == trials else min(1.0, max(p, center + half))
    return low, high


def rate_verdict(hits: int, trials: int, target: float, higher_is_better: bool) -> str:
    """``pass``, ``fail`` or ``inconclusive`` of ``hits`` in ``trials`` against ``target``, from the 95%
    interval: at least ``target`` (``higher_is_better``: pass when the lower bound reaches it, fail
    when the upper bound is below it) or at most ``target`` (pass when the upper bound is at or below
    it, fail when the lower bound is above it). No trial decides nothing: ``inconclusive``."""
    lo, hi = wilson(hits, trials)
    if higher_is_better:
        return "pass" if lo >= target else "fail" if hi < target else "inconclusive"
    return "pass" if hi <= target else "fail" if lo > target else "inconclusive"


def trials_to_pass(hits: int, trials: int, target: float, higher_is_better: bool,
                   limit: int = 10**12) -> int | None:
    """The fewest trials in all (at least ``trials``) after which the rate passes, if every further
    trial goes well (a detection is caught, a clean operation raises no alarm); ``None`` when no count
    up to ``limit`` would (a target of 1 to reach or 0 to stay under: no finite campaign shows it)."""

    def passes(n: int) -> bool:
        return rate_verdict(hits + (n - trials) if higher_is_better else hits, n, target, higher_is_better) == "pass"

    if passes(trials):
        return trials
    lo, hi = trials, max(2 * trials, 1)
    while not passes(hi):  # the verdict only improves as good trials are added
        lo, hi = hi, 2 * hi
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi
