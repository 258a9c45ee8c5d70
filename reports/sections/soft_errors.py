"""The soft-errors section: detection rates with their intervals, PVF per layer, checker overheads."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from ..blocks import as_float, chart, column, fields, finite, heading, label, records_table, run_column
from ..charts import MAX_BARS, interval_points, ranking_bars
from ..tables import wilson_interval
from .base import SuiteRows, rows_table

_CI_SUFFIXES = ("_ci_low", "_ci_high")


def metric_groups(df: pd.DataFrame, main: Callable[[str, str], bool]) -> list[dict[str, Any]]:
    """Group rows sharing (run, check, subject, dtype) and pivot their metrics.

    ``main(check, metric)`` tells the principal metric of a group; other metrics of the group
    (``<main>_ci_low``, ``<main>_ci_high``, ``trials``, ...) become companions. Returns one dict per
    principal row: ``run_no, check, subject, dtype, metric, value, threshold, low, high, unit, status,
    detail, others`` (metric -> value); its status is the worst of the group.
    """
    out = []
    for _, g in df.groupby(["run_no", "check", "subject", "dtype"], sort=False):
        principal = g[[main(c, m) for c, m in zip(g["check"], g["metric"])]]
        others = {m: v for m, v in zip(g["metric"], g["value"])}
        statuses = set(g["status"])
        for r in principal.itertuples():
            worst = next((s for s in ("error", "fail", "inconclusive") if s in statuses), r.status)
            rec = {k: getattr(r, k) for k in ("run_no", "check", "subject", "dtype", "metric", "value",
                                               "threshold", "low", "high", "unit")}
            out.append({**rec, "status": worst, "detail": r.detail, "others": others})
    return out


def _is_rate(check: str, metric: str) -> bool:
    return metric == "detection_rate" or (metric.endswith("detection_rate") and not metric.endswith(_CI_SUFFIXES))


def _with_interval(e: dict[str, Any]) -> dict[str, Any]:
    """A detection-rate group with its trials and 95% interval: the rate row's ``low`` and ``high``, else
    its ``<metric>_ci_low``/``_ci_high`` rows, else Wilson's from its trials row (never the detail). The
    trials row of a rate ``PREFIX_detection_rate`` is ``PREFIX_trials`` where the group has one (a second
    rate of one subject), else ``trials``."""
    o, m = e["others"], e["metric"]
    trials = o.get(f"{m.removesuffix('detection_rate')}trials", o.get("trials", math.nan))
    lo, hi = e["low"], e["high"]
    if not (finite(lo) and finite(hi)):
        lo, hi = o.get(f"{m}_ci_low", math.nan), o.get(f"{m}_ci_high", math.nan)
    if not (finite(lo) and finite(hi)) and finite(trials) and finite(e["value"]):
        lo, hi = wilson_interval(e["value"] * trials, trials)
    e.update(trials=trials, lo=lo, hi=hi)
    return e


def _detection_blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    rates = [_with_interval(e) for e in metric_groups(rows.df, _is_rate)]
    if not rates:
        return []
    shown = rates[: MAX_BARS * 2]
    svg = interval_points(
        [label(e["run_no"], rows.multi, e["subject"], e["dtype"]) for e in shown],
        [e["value"] for e in shown],
        [as_float(e["lo"], e["value"]) for e in shown],
        [as_float(e["hi"], e["value"]) for e in shown],
        [e["check"] for e in shown],
        targets=[e["threshold"] for e in shown],
        title="Detection rate per bit class (95% Wilson interval)",
        xlabel="detection rate",
        uid=rows.ids(),
    )
    columns = (
        run_column(rows.multi)
        + [column("check", "check"), column("bit class", "subject"), column("dtype", "dtype")]
        + [column("trials", "trials", "num"), column("detection rate", "value", "num")]
        + [column("CI low", "lo", "num"), column("CI high", "hi", "num")]
        + fields("threshold", "status", "detail")
    )
    return [
        chart(svg, "Share of injected faults that the checker detected; bars are 95% Wilson score intervals; "
              "red ticks are the required rate."),
        records_table(rates, columns, cls="detection", caption="Detection rates"),
    ]


def _companion(suffix: str) -> Callable[[dict[str, Any]], Any]:
    return lambda e: e["others"].get(f"{e['metric']}{suffix}")


def _pvf_blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    df = rows.df
    pvf = metric_groups(df[df["check"].str.startswith("pvf")],
                        lambda c, m: not m.endswith(_CI_SUFFIXES) and m != "trials")
    if not pvf:
        return []
    pvf.sort(key=lambda e: -(e["value"] if finite(e["value"]) else -1))
    shown = pvf[:MAX_BARS]
    svg = ranking_bars(
        [label(e["run_no"], rows.multi, e["subject"], e["dtype"]) for e in shown],
        [e["value"] for e in shown],
        title="PVF ranking (most vulnerable first)",
        xlabel="PVF (share of faults that corrupt the output)",
        uid=rows.ids(),
    )
    for i, e in enumerate(pvf, 1):
        e["rank"] = i
    columns = (
        [column("rank", "rank", "num")]
        + run_column(rows.multi)
        + [column("layer", "subject")]
        + fields("dtype", "metric")
        + [column("PVF", "value", "num"), column("CI low", _companion("_ci_low"), "num")]
        + [column("CI high", _companion("_ci_high"), "num")]
        + [column("trials", lambda e: e["others"].get("trials"), "num")]
        + fields("status", "detail")
    )
    return [
        heading("Program vulnerability factor by layer"),
        chart(svg, "Layers ranked by program vulnerability factor."),
        records_table(pvf, columns, cls="pvf", caption="PVF per layer, highest first"),
    ]


def _overhead_blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    # the checker's overheads (metric abft_overhead, ...) and the floors of its memory traffic
    # (abft_floor), not the A/A timing-resolution rows beside them
    df = rows.df
    over = df[df["check"].str.contains("overhead") & df["metric"].str.contains("overhead|floor")]
    if not len(over):
        return []
    over = over.sort_values("value", ascending=False, kind="stable")
    shown = over.head(MAX_BARS)
    unit = next((u for u in shown["unit"] if u), "")
    svg = ranking_bars(
        [label(r.run_no, rows.multi, r.check, r.subject, r.dtype) for r in shown.itertuples()],
        shown["value"].tolist(),
        statuses=shown["status"].tolist(),
        title="Checker overhead",
        xlabel=f"overhead ({unit})" if unit else "overhead",
        uid=rows.ids(),
    )
    return [
        heading("Checker overheads"),
        chart(svg, "Extra time of the protected operator over the unprotected one, measured side by side "
              "(abft_floor: the bare memory traffic of a check, without its verdict)."),
        rows_table(over, rows.multi, cls="overheads", caption="Checker overheads"),
    ]


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    """Detection rates, then PVF per layer, then checker overheads: each part only when it has rows."""
    return _detection_blocks(rows) + _pvf_blocks(rows) + _overhead_blocks(rows)
