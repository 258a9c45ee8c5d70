"""The numerics section: every error held to a bound, as a ratio to that bound, largest first."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..blocks import chart, column, fields, label, records_table, run_column
from ..charts import MAX_BARS, ratio_bars
from .base import SuiteRows


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    """A chart of the largest error / bound ratios and the table of all of them."""
    df, multi = rows.df, rows.multi
    # rows held to a positive bound with a measured value; NaN/inf values count when they failed
    measured = df["value"].notna() | (df["status"] == "fail")
    bounded = df[measured & np.isfinite(df["threshold"]) & (df["threshold"] > 0)].copy()
    if not len(bounded):
        return []
    bounded["ratio"] = bounded["value"] / bounded["threshold"]
    bounded["_rank"] = bounded["ratio"].fillna(math.inf)
    bounded = bounded.sort_values("_rank", ascending=False, kind="stable")
    shown = bounded.head(MAX_BARS)
    labels = [label(r.run_no, multi, r.subject, r.dtype, r.metric) for r in shown.itertuples()]
    more = f" The {len(shown)} largest of {len(bounded)} are drawn." if len(bounded) > len(shown) else ""
    svg = ratio_bars(
        labels,
        shown["ratio"].tolist(),
        shown["status"].tolist(),
        title="Error against its bound, per operator and dtype",
        uid=rows.ids(),
    )
    columns = (
        run_column(multi)
        + [column("op", "subject", "code")]
        + fields("dtype", "check", "metric", "value", "threshold")
        + [column("value / threshold", "ratio", "num")]
        + fields("unit", "status")
    )
    return [
        chart(svg, "Measured error divided by the bound it was held to; past the dashed line is out of bound." + more),
        records_table(bounded.itertuples(), columns, cls="numerics",
                      caption="Errors against bounds, largest ratio first"),
    ]
