"""`mystique fleet RESULTS...`: many devices of one model summarised (no torch).

For each figure the performance validator measures (see :data:`.fleet.COMPARED`) and each device
model among the results:

* ``fleet_distribution`` (info): the fleet median, with its scaled MAD, minimum, maximum and size
  in the detail;
* ``fleet_member`` (info): each device's figure (subject ``check:subject@peer``) with its 95% interval
  in ``low`` and ``high``, the chart's bars;
* ``fleet_outlier`` (check): each device against the others (leave one out, so an outlier does not
  widen its own limit), judged as the ``fleet`` group judges a device (:func:`.fleet.judge`): the
  slowdown, its interval in ``low`` and ``high`` and the limit as threshold. A device whose row has no
  interval (a results.csv from before those columns) is inconclusive, and its row says so;
* ``sync_slowdown`` (info): for each workload's step time, the expected slowdown of a synchronous
  job of N devices drawn from this fleet, ``E[max of N draws] / median``, from the empirical CDF
  (:func:`.stats.expected_max`). Two distributions, each its own metric:
  ``expected_slowdown_device_medians`` (each device's median step time: persistent device-to-device
  differences) and, where a run's ``step_times.csv`` lies beside its results,
  ``expected_slowdown_pooled_steps`` (every device's undisturbed steps (:mod:`.timed`), 200 quantiles
  each so every device weighs the same: step-to-step jitter too, as a job whose N devices each draw
  one step). N beyond the fleet's size extrapolates nothing: the maximum of the empirical
  distribution bounds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mystique import results

from .fleet import (
    COMPARED,
    DEFAULT_MARGIN,
    SYNC_NS,
    judgement,
    measured_rows,
    results_paths,
    sync_slowdown,
)
from .stats import quantile, robust_center
from .timed import MIN_UNDISTURBED

QUANTILES_PER_DEVICE = 200


def _model(name: str) -> str:
    return name.split(" (emulating", 1)[0].strip()


def _pooled_steps(paths: Sequence[Path], subject: str) -> list[float]:
    """Every device's step-time quantiles of ``subject`` (ms), where step_times.csv lies beside."""
    pooled: list[float] = []
    for p in paths:
        f = p.parent / "step_times.csv"
        if not f.is_file():
            continue
        df = pd.read_csv(f)
        keep = df["subject"] == subject
        if "undisturbed" in df and (df.loc[keep, "undisturbed"] == 1).sum() >= MIN_UNDISTURBED:
            keep &= df["undisturbed"] == 1  # the steps the host left alone (see .timed)
        xs = [float(x) * 1e3 for x in df.loc[keep, "seconds"]]
        if xs:
            pooled += [quantile(xs, (i + 0.5) / QUANTILES_PER_DEVICE) for i in range(QUANTILES_PER_DEVICE)]
    return pooled


def summarise(paths: Sequence[str], ns: Sequence[int] = SYNC_NS, margin: float = DEFAULT_MARGIN) -> pd.DataFrame:
    """The fleet rows of the results files ``paths`` (UsageError for unreadable ones)."""
    files = results_paths(paths)
    rows = measured_rows([str(p) for p in files])
    models = sorted(set(rows["device_name"].map(_model))) if len(rows) else []
    res = results.Results(results.RunContext(device="fleet", device_name="; ".join(models)), "performance")
    if not len(rows):
        res.add("fleet_distribution", "fleet", "devices", 0, status="skip",
                detail=f"no performance figures in {len(files)} results file(s)")
        return res.frame()
    for model in models:
        same = rows[rows["device_name"].map(_model) == model]
        for (check, subject, dtype, metric), g in same.groupby(["check", "subject", "dtype", "metric"], sort=True):
            _figure_rows(res, files, model, check, subject, dtype, metric, g, ns, margin)
    return res.frame()


def _figure_rows(res: results.Results, files: Sequence[Path], model: str, check: str, subject: str, dtype: str,
                 metric: str, g: pd.DataFrame, ns: Sequence[int], margin: float) -> None:
    per_peer = g.groupby("peer").agg(value=("value", "median"), low=("low", "first"), high=("high", "first"),
                                     detail=("detail", "first"), unit=("unit", "first"))
    values = [float(v) for v in per_peer["value"]]
    m, s = robust_center(values)
    unit = str(per_peer["unit"].iloc[0])
    key = f"{check}:{subject}"
    res.add("fleet_distribution", key, metric, m, unit=unit, dtype=dtype, status="info",
            detail=f"{model}: {len(values)} devices; median {m:.6g}, scaled MAD {s:.4g}, min {min(values):.6g}, "
                   f"max {max(values):.6g}")
    higher = COMPARED[(check, metric)]
    for peer, r in per_peer.iterrows():
        res.add("fleet_member", f"{key}@{peer}", metric, r["value"], unit=unit, dtype=dtype, status="info",
                low=r["low"], high=r["high"], detail=f"{model}; {r['detail']}")
        others = [float(v) for p, v in per_peer["value"].items() if p != peer]
        if not others:
            continue
        j = judgement(float(r["value"]), float(r["low"]), float(r["high"]), others, higher, margin)
        res.add("fleet_outlier", f"{key}@{peer}", f"{metric}_slowdown", j.slowdown, threshold=j.limit, low=j.low,
                high=j.high, dtype=dtype, status=j.status, detail=f"{peer} against the {len(others)} others: {j.detail}")
    if (check, metric) != ("step_time", "median_ms"):
        return
    how = "E[max of N draws]/median from the empirical CDF (order statistics)"
    for what, samples in (("device medians", values), ("pooled steps", _pooled_steps(files, subject))):
        for n, slow in sync_slowdown(samples, ns).items():
            res.add("sync_slowdown", f"{subject} N={n}", f"expected_slowdown_{what.replace(' ', '_')}", slow,
                    dtype=dtype, status="info",
                    detail=f"{model}; {what} ({len(samples)} samples); {how}; a synchronous step waits for the "
                           f"slowest of {n} devices")
