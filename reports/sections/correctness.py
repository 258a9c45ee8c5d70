"""The correctness section: the first operators where the device under test leaves the reference."""

from __future__ import annotations

from typing import Any

from ..blocks import column, fields, records_table, run_column
from .base import SuiteRows


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    """The table of the ``first_divergent`` rows, or nothing when there are none."""
    div = rows.df[rows.df["check"].str.contains("first_divergent")]
    if not len(div):
        return []
    columns = (
        run_column(rows.multi)
        + fields("status", "check")
        + [column("subject", "subject", "code")]
        + fields("dtype", "metric", "value", "threshold")
        + [column("where it diverges", "detail", "detail")]
    )
    return [
        records_table(
            div.itertuples(),
            columns,
            cls="divergence",
            caption="First divergent operators: where the device under test first leaves the reference",
        )
    ]
