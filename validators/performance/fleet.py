"""Fleet comparison: is this device as fast as its peers of the same model? (no torch)

A peer is one run of the performance validator on another device of the same model: its
``results.csv`` (``--baseline FILES``; a folder stands for its ``results.csv``). For each figure
the device measured (GEMM throughput per dtype, memory and transfer bandwidth, each workload's
median, p95 and mean step time over the steps its host left undisturbed) the fleet is summarised
robustly: its median ``M`` and its spread ``S``, Rousseeuw and Croux's Qn (:mod:`.spread`: as robust
as the MAD, twice as efficient on normal data). The device's slowdown against the fleet is
``value / M`` for a time and ``M / value`` for a rate, with the interval the device's own 95%
interval gives it.

The limit is ``1 + max(margin, k S / M)``: slower than the fleet by more than the stated margin (5%
by default) and by more than a healthy member can lie from the median. ``k`` is the 3-sigma
prediction factor of ``n`` peers (:func:`.spread.prediction_factor`: a Student t quantile, since
``S`` is itself estimated from the ``n`` peers; about 3.9 for 19 peers, 3.3 for 50, tending to 3), so
a normal fleet's healthy member exceeds the limit about 0.135% of the time and a noisy or small fleet
widens its own limit rather than flagging its members. The device fails when its whole interval lies
above the limit (slower with confidence) and passes when it lies at or below ``1 + max(margin, 3 S /
M)`` (what three spreads allow had ``S`` been exact); between the two, and wherever its interval
straddles a limit, it is inconclusive: a small fleet cannot tell there.
With fewer than 3 peers the spread cannot be estimated and the margin alone is the limit (said in
the row).

A figure's interval is read from its row's ``low`` and ``high`` columns, never from the sentence in
its ``detail``. A results.csv written before those columns existed has none: its figures have no
interval, and a verdict that needs one is inconclusive (the row says so).

:func:`summarise` is ``mystique fleet``: every device against the others (leave one out), per-metric
distributions, outliers, and the expected slowdown of a synchronous job of N devices drawn from the
fleet (:func:`sync_slowdown`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mystique import results
from mystique.errors import UsageError

from .spread import fleet_spread, prediction_factor
from .stats import expected_max, robust_center, slowdown_verdict

DEFAULT_MARGIN = 0.05
MIN_SPREAD_PEERS = 3
#: the known-spread 3-sigma factor: at or below 1 + max(margin, KNOWN_K S / M) a device passes
KNOWN_K = 3.0
#: the figures compared with the fleet: (check, metric) -> a rate (True) or a time (False)
COMPARED: dict[tuple[str, str], bool] = {
    ("gemm_throughput", "tflops"): True, ("memory_bandwidth", "gbps"): True, ("transfer_bandwidth", "gbps"): True,
    ("step_time", "median_ms"): False, ("step_time", "p95_ms"): False, ("step_time", "mean_ms"): False,
}
SYNC_NS: tuple[int, ...] = (1, 8, 64, 512, 4096, 32768, 100_000)


def results_paths(paths: Sequence[str]) -> list[Path]:
    """Each path as a results.csv (a folder: its results.csv); UsageError naming a missing one."""
    out = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            path = path / "results.csv"
        if not path.is_file():
            raise UsageError(f"{p}: no results.csv there")
        out.append(path)
    return out


def measured_rows(paths: Sequence[str]) -> pd.DataFrame:
    """The performance figures of the results files ``paths`` (the rows the fleet compares), with a
    ``peer`` column naming each run (``host/device/run_id``)."""
    df = results.read_csv([str(p) for p in results_paths(paths)])
    keep = [(c, m) in COMPARED for c, m in zip(df["check"], df["metric"])]
    df = df[(df["suite"] == "performance") & (df["status"] == "info") & pd.Series(keep, index=df.index)].copy()
    df["peer"] = df["host"] + "/" + df["device"] + "/" + df["run_id"]
    return df


def interval_of(row: Any) -> tuple[float, float]:
    """The 95% interval of a measured row (a Series or an ``itertuples`` row): its ``low`` and ``high``
    columns; (NaN, NaN) where it has none, as every row of a results.csv written before those columns."""
    get = row.get if isinstance(row, (pd.Series, dict)) else (lambda k, d: getattr(row, k, d))
    return float(get("low", math.nan)), float(get("high", math.nan))


@dataclass(frozen=True)
class Judgement:
    """One figure against its fleet: the verdict and every figure it was read from.

    ``slowdown`` with its interval ``[low, high]``; ``limit`` the prediction limit (fail when ``low``
    lies above it); ``pass_bound`` the bound at or below which ``high`` passes (``limit`` or less)."""

    status: str
    slowdown: float
    low: float
    high: float
    limit: float
    pass_bound: float
    detail: str


def verdict(low: float, high: float, limit: float, pass_bound: float) -> str:
    """``fail`` when the slowdown interval lies wholly above ``limit``, ``pass`` when it lies at or below
    ``pass_bound`` (at most ``limit``), else ``inconclusive`` (also without a finite interval)."""
    status = slowdown_verdict(low, high, limit)
    if status == "pass" and not high <= pass_bound:
        status = "inconclusive"
    return status


def judgement(value: float, lo: float, hi: float, peers: Sequence[float], higher_better: bool,
              margin: float = DEFAULT_MARGIN) -> Judgement:
    """One figure ``value`` (95% interval ``[lo, hi]``, NaN where it has none) against the ``peers``' figures."""
    m, s, estimator, efficiency = fleet_spread(peers)
    if not (math.isfinite(m) and m > 0 and value > 0):
        return Judgement("skip", math.nan, math.nan, math.nan, math.nan, math.nan,
                         "no positive fleet median to compare with")
    n = len(peers)
    k = prediction_factor(n, efficiency) if n >= MIN_SPREAD_PEERS else math.nan
    spread = k * s / m if n >= MIN_SPREAD_PEERS else 0.0
    limit = 1.0 + max(margin, spread)
    # within what 3 spreads allow, had the spread been known exactly: a pass; between that and the
    # prediction limit a small fleet cannot tell (inconclusive)
    known = 1.0 + max(margin, KNOWN_K * s / m) if n >= MIN_SPREAD_PEERS else limit
    has_interval = math.isfinite(lo) and math.isfinite(hi)
    if not has_interval:
        rlo = rhi = math.nan
    elif higher_better:
        rlo, rhi = (m / hi if hi > 0 else math.inf), (m / lo if lo > 0 else math.inf)
    else:
        rlo, rhi = lo / m, hi / m
    r = m / value if higher_better else value / m
    why = (f"{k:.3g} x {estimator} / median = {spread:.4f}, {k:.3g} the 3-sigma prediction factor of {n} peers"
           if n >= MIN_SPREAD_PEERS else f"fewer than {MIN_SPREAD_PEERS} peers: spread not estimable, margin only")
    interval = (f"95% interval [{rlo:.4f}, {rhi:.4f}]" if has_interval else
                "no 95% interval recorded (a results.csv from before the low and high columns): inconclusive")
    detail = (f"slowdown vs fleet {r:.4f} ({interval}); fleet of {n}: median {m:.6g}, "
              f"{estimator} {s:.4g}; limit 1+max(margin {margin:g}, {why}) = {limit:.4f}"
              + (f"; passes at or below {known:.4f} (3 x {estimator} / median: the spread taken as known)"
                 if known < limit else ""))
    return Judgement(verdict(rlo, rhi, limit, known), r, rlo, rhi, limit, known, detail)


def judge(value: float, lo: float, hi: float, peers: Sequence[float], higher_better: bool,
          margin: float = DEFAULT_MARGIN) -> tuple[str, float, float, str]:
    """(status, slowdown, limit, detail) of one figure against the ``peers``' figures (:func:`judgement`)."""
    j = judgement(value, lo, hi, peers, higher_better, margin)
    return j.status, j.slowdown, j.limit, j.detail


def sync_slowdown(samples: Sequence[float], ns: Sequence[int] = SYNC_NS) -> dict[int, float]:
    """N -> E[max of N draws from the empirical distribution of ``samples``] / its median: the
    expected slowdown of a synchronous step over N devices against a typical device."""
    xs = [float(x) for x in samples if math.isfinite(float(x))]
    if not xs:
        return {}
    med = robust_center(xs)[0]
    return {n: expected_max(xs, n) / med for n in ns}
