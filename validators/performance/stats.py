"""Distribution-free statistics of the performance validator (no torch).

* :func:`quantile_interval`: the 95% interval of a quantile from order statistics with binomial
  ranks (the median's is :func:`mystique.timing.median_interval`'s generalisation).
* :func:`ratio_interval`: a conservative interval of the ratio of two independent medians.
* :func:`robust_center`: the median and the scaled MAD (1.4826 x MAD: the standard deviation of a
  normal sample) of a set of figures.
* :func:`expected_max`: the expected maximum of N independent draws from an empirical distribution
  (order statistics of the empirical CDF), exact for that distribution and stable for N up to
  1e5 and beyond.
* :func:`batch_interval`: the 95% interval of a quantile of a time series by batch means: robust
  to the series' autocorrelation, which iid intervals are not.
* :func:`batch_mean_interval`: the 95% interval of the mean of a time series by batch means
  (Student t over the batches' means).
* :func:`bootstrap_sum_ratio`: the percentile-bootstrap interval of a ratio of sums over paired
  rounds (seeded, 2000 resamples).
* :func:`slowdown_verdict`: ``pass``/``fail``/``inconclusive`` of a slowdown interval against a limit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from mystique.stopping import above_limit_verdict

LEVEL = 0.95
MAD_SCALE = 1.4826  # MAD x this estimates the standard deviation of a normal sample
BOOTSTRAP = 2000


def _binom_cdf_table(n: int, q: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, q), from log-pmfs (no overflow for large n)."""
    if q <= 0.0 or q >= 1.0:
        raise ValueError(f"quantile {q} must be strictly inside 0..1")
    lq, l1q = math.log(q), math.log1p(-q)
    lg = math.lgamma(n + 1)
    out, acc = [], 0.0
    for k in range(n + 1):
        acc += math.exp(lg - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q)
        out.append(min(acc, 1.0))
    return out


def quantile_interval(values: Sequence[float], q: float = 0.5, level: float = LEVEL) -> tuple[float, float]:
    """Distribution-free ``level`` interval of the ``q`` quantile of ``values``.

    ``[x_(l), x_(u)]`` (1-based order statistics) with ``l`` the largest rank such that
    ``P(B < l) <= alpha/2`` and ``u`` the smallest with ``P(B >= u) <= alpha/2``, ``B ~ Bin(n, q)``
    the count of values below the true quantile. Too few values for that coverage: the extremes.
    """
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    alpha = (1.0 - level) / 2.0
    cdf = _binom_cdf_table(n, q)
    lo = 1
    for rank in range(1, n + 1):  # P(B < rank) = cdf[rank - 1]
        if cdf[rank - 1] <= alpha:
            lo = rank
        else:
            break
    hi = n
    for rank in range(n, 0, -1):  # P(B >= rank) = 1 - cdf[rank - 1]
        if 1.0 - cdf[rank - 1] <= alpha:
            hi = rank
        else:
            break
    return xs[lo - 1], xs[hi - 1]


def quantile_interval_size(q: float, level: float = LEVEL) -> int:
    """The fewest values for which :func:`quantile_interval` of the ``q`` quantile has its coverage at both
    ends: the sample's extremes bound the quantile with ``alpha/2`` each only once ``(1-q)^n`` and ``q^n``
    are at most ``alpha/2`` (36 values for the p10 at 95%: ``0.9^36 = 0.023``). Below it the interval is
    the extremes, which cover less than ``level``: a verdict read from it is not a 95% verdict."""
    alpha = (1.0 - level) / 2.0
    worst = max(q, 1.0 - q)
    return max(1, math.ceil(math.log(alpha) / math.log(worst) - 1e-12))


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation between order statistics)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (pos - i)


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample standard deviation over mean); NaN with fewer than 2 values."""
    if len(values) < 2:
        return math.nan
    m = statistics.fmean(values)
    return statistics.stdev(values) / m if m else math.nan


def ratio_interval(num: tuple[float, float], den: tuple[float, float]) -> tuple[float, float]:
    """Conservative interval of ``num / den`` from the intervals of both (positive figures):
    ``[num_lo / den_hi, num_hi / den_lo]``. Each covers its median with 95%, so the ratio's
    interval covers with at least 0.95^2 ~ 90% when both are independent."""
    if not (den[0] > 0 and den[1] > 0):
        return (math.nan, math.nan)
    return num[0] / den[1], num[1] / den[0]


def robust_center(values: Sequence[float]) -> tuple[float, float]:
    """(median, 1.4826 x MAD) of ``values`` (NaN, NaN when empty)."""
    xs = [float(v) for v in values if math.isfinite(float(v))]
    if not xs:
        return (math.nan, math.nan)
    m = statistics.median(xs)
    return m, MAD_SCALE * statistics.median(abs(x - m) for x in xs)


def expected_max(samples: Sequence[float], n: int) -> float:
    """E[max of ``n`` independent draws] from the empirical distribution of ``samples``.

    With sorted ``x_1 <= ... <= x_m``, ``P(max <= x_i) = (i/m)^n``, so
    ``E = sum_i x_i ((i/m)^n - ((i-1)/m)^n)``; the powers are taken as ``exp(n log(i/m))``.
    """
    xs = sorted(float(v) for v in samples)
    m = len(xs)
    if m == 0 or n < 1:
        return math.nan
    total, prev = 0.0, 0.0
    for i, x in enumerate(xs, start=1):
        cur = math.exp(n * math.log(i / m))
        total += x * (cur - prev)
        prev = cur
    return total


#: ``fail`` when the slowdown interval ``[lo, hi]`` lies wholly above ``limit`` (slower with confidence),
#: ``pass`` when it lies at or below it, ``inconclusive`` when it straddles it: the adaptive stop's rule
slowdown_verdict = above_limit_verdict


def bootstrap_sum_ratio(a: Sequence[float], b: Sequence[float], seed: int, level: float = LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap ``level`` interval of ``sum(a) / sum(b)`` over pairs ``(a_i, b_i)``
    (``BOOTSTRAP`` resamples, seeded); NaNs with fewer than 2 pairs."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(BOOTSTRAP, len(x)))
    ratios = x[idx].sum(axis=1) / y[idx].sum(axis=1)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1.0 - alpha))


BATCHES = 10
MIN_BATCH = 3


def batch_interval(values: Sequence[float], figure: Callable[[Sequence[float]], float],
                   level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` interval of ``figure`` of a series taken in time order, by batch means.

    Consecutive values are not independent (a neighbour's busy phase, a clock step slows a run of
    steps), so an interval that treats them as iid is too narrow, and a transient phase can carry a
    whole run's figure past a limit. The series is cut into ``BATCHES`` contiguous batches (fewer,
    of at least ``MIN_BATCH`` values each, when short); ``figure`` of each batch is nearly
    independent of the others', and the interval is the distribution-free interval of their median
    (:func:`quantile_interval`): the figure of a typical stretch of the run. A phase that spans a
    batch or two moves its extremes, not that interval (the batch means method of simulation output
    analysis)."""
    xs = [float(v) for v in values]
    batches = _batches(xs)
    if len(batches) < 2:
        return quantile_interval([figure(xs)] if xs else [], 0.5, level)
    return quantile_interval([figure(b) for b in batches], 0.5, level)


def _batches(xs: list[float]) -> list[list[float]]:
    """``xs`` cut into ``BATCHES`` contiguous batches of near-equal size (fewer, of at least ``MIN_BATCH``
    values each, when short; none below two)."""
    k = min(BATCHES, len(xs) // MIN_BATCH)
    if k < 2:
        return []
    edges = [round(i * len(xs) / k) for i in range(k + 1)]
    return [xs[edges[i]:edges[i + 1]] for i in range(k)]


def batch_mean_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` interval of the mean of a series taken in time order, by batch means.

    The mean is the figure that occasional stalls move (what a synchronous job pays for them), so its
    interval must be the mean's, not a typical stretch's (:func:`batch_interval` would leave a few
    batches with a stall out of its interval, and the run's own mean above it). The series is cut into
    batches as :func:`batch_interval` cuts it; their means are nearly independent and, by the central
    limit theorem, nearly normal, so the interval is the series' mean +- ``t_{k-1}`` x the standard
    error of the ``k`` batch means (the batch means method of simulation output analysis, Law and
    Kelton). It contains the mean; a stall or a slow phase in a few batches widens it. Fewer than two
    batches: ``(-inf, inf)`` (no interval).
    """
    from scipy.stats import t as student_t

    xs = [float(v) for v in values]
    means = [statistics.fmean(b) for b in _batches(xs)]
    k = len(means)
    if k < 2:
        return (-math.inf, math.inf)
    half = float(student_t.ppf(0.5 + level / 2.0, k - 1)) * statistics.stdev(means) / math.sqrt(k)
    m = statistics.fmean(xs)
    return (m - half, m + half)
