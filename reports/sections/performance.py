"""The performance section (suite ``performance``): throughput, steadiness, the fleet.

Charts, each from result rows only (never torch): GEMM throughput, its curve over sizes and layouts, at
the shapes of ``--shapes-from`` steps, attention's over sizes, and memory/transfer bandwidth
(``gemm_throughput``, ``gemm_curve``, ``gemm_shape``, ``attention_curve``, ``memory_bandwidth``, ``transfer_bandwidth``); median step time per workload
with its 95% interval (``step_time``; ``step_time_disturbed`` labelled as not compared); clocks, power and temperature over the sustained run
(``clock_trace``, one chart per workload and unit); for `mystique fleet`: one chart per compared
figure with every device's value coloured by its outlier verdict (``fleet_member``,
``fleet_outlier``) and the expected slowdown of a synchronous job against its size
(``sync_slowdown``); for `mystique fleet-campaign`: every run's slowdown against its fleet, coloured by
the verdict, per compared figure (``campaign_slowdown``). Then the table of the checks with a verdict.
"""

from __future__ import annotations

import math
from typing import Any

from ..blocks import chart, fields, note, records_table, run_column
from ..charts import grouped_bars, interval_points, line_series, ranking_bars
from .base import SuiteRows

MAX_FLEET_CHARTS = 12
SYNC_METRIC = "expected_slowdown_"  # sync_slowdown metrics: this prefix, then the distribution


def _label(r: Any, multi: bool, *parts: str) -> str:
    text = " ".join(p for p in parts if p)
    return f"[{r.run_no}] {text}" if multi else text


def _rates(rows: SuiteRows) -> list[dict[str, Any]]:
    rates = ("gemm_throughput", "gemm_curve", "gemm_shape", "attention_curve", "memory_bandwidth", "transfer_bandwidth")
    df = rows.df[rows.df["check"].isin(rates + tuple(f"{c}_disturbed" for c in rates)) & (rows.df["status"] == "info")]
    out = []
    for check, g in df.groupby("check", sort=False):
        unit = str(g["unit"].iloc[0])
        labels = [_label(r, rows.multi, r.subject, r.dtype) for r in g.itertuples()]
        out.append(chart(ranking_bars(labels, list(g["value"]), title=f"{check.replace('_', ' ')} ({unit})",
                                      xlabel=unit, uid=rows.ids()),
                         "Median rate of repeated timed calls on the device under test (the interval is in each row)."))
    return out


def _steps(rows: SuiteRows) -> list[dict[str, Any]]:
    df = rows.df[rows.df["check"].isin(("step_time", "step_time_disturbed")) & (rows.df["metric"] == "median_ms")]
    if not len(df):
        return []
    labels = [_label(r, rows.multi, r.subject, "(host too busy: not compared)" if r.check != "step_time" else "")
              for r in df.itertuples()]
    svg = interval_points(labels, list(df["value"]), list(df["low"]), list(df["high"]), list(df["device"]),
                          title="Median step time under sustained load", xlabel="ms", xlim=None, uid=rows.ids())
    return [chart(svg, "Median step time of each reference workload's benchmark with its 95% interval (none "
                       "drawn for a results.csv from before the low and high columns).")]


def _clocks(rows: SuiteRows) -> list[dict[str, Any]]:
    df = rows.df[rows.df["check"] == "clock_trace"]
    out = []
    for (run_no, subject, unit), g in df.groupby(["run_no", "subject", "unit"], sort=False):
        series: dict[str, tuple[list[float], list[float]]] = {}
        for r in g.itertuples():  # in the order sampled (the time of each sample is in its detail)
            xs, ys = series.setdefault(r.metric, ([], []))
            xs.append(float(len(xs)))
            ys.append(r.value)
        title = f"{'[' + str(run_no) + '] ' if rows.multi else ''}{subject}: {unit} during the sustained run"
        out.append(chart(line_series(series, title=title, xlabel="sample, in time order", ylabel=unit, uid=rows.ids()),
                         "Clock evidence sampled at a steady interval while the workload ran (NVML on NVIDIA GPUs, "
                         "CPU frequency on CPUs): a drop under load is throttling."))
    return out


def _fleet(rows: SuiteRows) -> list[dict[str, Any]]:
    members = rows.df[rows.df["check"] == "fleet_member"]
    if not len(members):
        return []
    verdicts = {(r.subject, r.dtype): r.status for r in rows.df[rows.df["check"] == "fleet_outlier"].itertuples()}
    out = []
    keys = list(dict.fromkeys(zip(members["subject"].str.rsplit("@", n=1).str[0], members["dtype"],
                                  members["metric"])))
    for key, dtype, metric in keys[:MAX_FLEET_CHARTS]:
        g = members[members["subject"].str.startswith(key + "@") & (members["dtype"] == dtype)
                    & (members["metric"] == metric)].sort_values("value", ascending=False)
        labels = [s.rsplit("@", 1)[1] for s in g["subject"]]
        statuses = [verdicts.get((s, dtype), "info") for s in g["subject"]]
        out.append(chart(ranking_bars(labels, list(g["value"]), statuses=statuses, uid=rows.ids(),
                                      title=f"{key} {dtype} {metric}: every device", xlabel=str(g["unit"].iloc[0])),
                         "Each device's figure; red: slower than the others beyond the limit with confidence "
                         "(fleet_outlier), amber: inconclusive."))
    if len(keys) > MAX_FLEET_CHARTS:
        out.append(note(f"{len(keys) - MAX_FLEET_CHARTS} more figures: see the fleet_member rows."))
    return out


def _sync(rows: SuiteRows) -> list[dict[str, Any]]:
    df = rows.df[rows.df["check"] == "sync_slowdown"]
    if not len(df):
        return []
    out = []
    parts = df["subject"].str.rsplit(" N=", n=1)
    df = df.assign(workload=parts.str[0], n=parts.str[1].astype(int),
                   what=df["metric"].str.removeprefix(SYNC_METRIC).str.replace("_", " "))
    for workload, g in df.groupby("workload", sort=False):
        table = g.pivot_table(index="n", columns="what", values="value", aggfunc="first").sort_index()
        labels = [f"N={n:,}" for n in table.index]
        series = {str(c): list(table[c]) for c in table.columns}
        out.append(chart(grouped_bars(labels, series, xlabel="expected step time / fleet median",
                                      title=f"{workload}: synchronous job of N devices", uid=rows.ids()),
                         "E[max of N draws from the fleet] / median, by the empirical CDF (order statistics)."))
    return out


def campaign_verdicts(df: Any, bounds: Any) -> list[str]:
    """The fleet's verdict on each ``campaign_slowdown`` row of ``df``, from its columns alone: ``fail``
    when the interval (``low``, ``high``) lies above the limit (``threshold``), ``pass`` when it lies at
    or below the run's ``campaign_pass_bound`` (the limit where there is none), else ``inconclusive``;
    ``skip`` without a slowdown and ``info`` without an interval (a results.csv from before ``low`` and
    ``high``). ``bounds``: the ``campaign_pass_bound`` rows."""
    bound = {(r.run_no, r.subject, r.dtype, r.metric): r.value for r in bounds.itertuples()}
    out = []
    for r in df.itertuples():
        limit, lo, hi = r.threshold, r.low, r.high
        passes_at = bound.get((r.run_no, r.subject, r.dtype, r.metric), limit)
        if not math.isfinite(r.value):
            out.append("skip")
        elif not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(limit)):
            out.append("info")
        else:
            out.append("fail" if lo > limit else "pass" if hi <= min(passes_at, limit) else "inconclusive")
    return out


def _campaign(rows: SuiteRows) -> list[dict[str, Any]]:
    df = rows.df[rows.df["check"] == "campaign_slowdown"]
    if not len(df):
        return []
    bounds = rows.df[rows.df["check"] == "campaign_pass_bound"]
    parts = df["subject"].str.split(": ", n=1)
    df = df.assign(run=parts.str[0], figure=parts.str[1] + " " + df["metric"], verdict=campaign_verdicts(df, bounds))
    out = []
    for figure, g in list(df.groupby("figure", sort=False))[:MAX_FLEET_CHARTS]:
        g = g.sort_values("value", ascending=False)
        finite = sorted(x for x in g["threshold"] if math.isfinite(x))
        limits = (f"{finite[0]:.3f}-{finite[-1]:.3f}" if finite and finite[-1] > finite[0]
                  else f"{finite[0]:.3f}" if finite else "none")
        line = finite[len(finite) // 2] if finite else None
        out.append(chart(ranking_bars(list(g["run"]), list(g["value"]), statuses=list(g["verdict"]), limit=line,
                                      uid=rows.ids(), title=f"campaign: {figure} of every run against its fleet",
                                      xlabel="slowdown vs the healthy fleet's median"),
                         f"Each run against the healthy runs (a healthy run against the others); limit "
                         f"{limits} (dashed: the median limit); red: flagged (slower beyond the limit with confidence), amber: "
                         "inconclusive, green: within what the fleet allows, blue: no interval recorded."))
    return out


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    """Charts of rates, step times, clocks, the fleet and a campaign, then the table of the checks with a verdict."""
    out = _rates(rows) + _steps(rows) + _clocks(rows) + _fleet(rows) + _sync(rows) + _campaign(rows)
    checks = rows.df[~rows.df["status"].isin(("info",))]
    if len(checks):
        columns = run_column(rows.multi) + fields("status", "check", "subject", "dtype", "metric", "value",
                                                   "threshold", "detail")
        out.append(records_table(checks.itertuples(), columns, cls="performance-checks",
                                 caption="Performance checks: host contention, drift, clocks, the injected mode's cost, the fleet"))
    return out


