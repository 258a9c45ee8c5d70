"""What every suite section is given (:class:`SuiteRows`) and the table of all its rows.

A section module (one per suite, listed in :data:`reports.sections.SECTIONS`) exposes
``blocks(rows: SuiteRows) -> list[dict]``: the charts, tables and notes that lead its suite's part
of the page, before the table of all its rows. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..blocks import Ids, fields, records_table, run_column
from ..inputs import ReplayArtifacts


@dataclass(frozen=True)
class SuiteRows:
    """The rows of one suite and what a section may need beside them.

    ``df``: the suite's results rows with ``run`` (label) and ``run_no`` (1 = oldest) added;
    ``multi``: the report holds several runs (then rows name their run); ``ids``: the page's chart
    id source; ``replays``: the replay artifacts of the report; ``run_table``: :func:`..tables.runs`.
    """

    df: pd.DataFrame
    multi: bool
    ids: Ids
    replays: Sequence[ReplayArtifacts] = ()
    run_table: pd.DataFrame | None = None


def rows_table(df: pd.DataFrame, multi: bool, *, cls: str, caption: str = "",
               attrs: dict[str, str] | None = None) -> dict[str, Any]:
    """Every column a reader needs of each results row (run number first when several runs)."""
    columns = run_column(multi) + fields("check", "subject", "dtype", "metric", "value", "unit", "threshold",
                                         "status", "detail")
    return records_table(df.itertuples(), columns, cls=cls, caption=caption, attrs=attrs)
