"""Cells, rows, tables and other blocks of the report: plain dicts the template loops over.

The template escapes every string. Shared by the page (:mod:`.html`) and the suite sections
(:mod:`.sections`). A table of records is declared as columns (:func:`column`, :func:`run_column`)
and built by :func:`records_table`. Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from markupsafe import Markup


def fmt(v: Any, digits: int = 4) -> str:
    """A number as a short string: '' for NaN/None, integers without a decimal point, else
    ``digits`` significant digits."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}g}"


def fmt_pct(v: Any) -> str:
    """A fraction as a signed percentage ('+12.5%'), '' for NaN."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(x):
        return ""
    return f"{x * 100:+.3g}%"


def cell(text: Any, cls: str = "", *, code: bool = False, title: str = "") -> dict[str, Any]:
    return {"text": fmt(text), "cls": cls, "code": code, "title": title}


def num(v: Any) -> dict[str, Any]:
    return cell(v, "num")


def status_cell(s: str, title: str = "") -> dict[str, Any]:
    return cell(s, f"status st-{s}", title=title)


def table(
    headers: Sequence[str | tuple[str, str]],
    rows: list[dict[str, Any]],
    *,
    cls: str = "",
    caption: str = "",
    attrs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A table block. ``rows`` are ``{"cells": [...], "cls": str}``; a header may be ``(text, css class)``."""
    cols = [h if isinstance(h, tuple) else (h, "") for h in headers]
    return {
        "kind": "table",
        "columns": cols,
        "rows": rows,
        "cls": cls,
        "caption": caption,
        "attrs": attrs or {},
    }


def row(cells: list[dict[str, Any]], cls: str = "") -> dict[str, Any]:
    return {"cells": cells, "cls": cls}


def chart(svg: str, caption: str = "") -> dict[str, Any]:
    return {"kind": "chart", "svg": Markup(svg), "caption": caption}


def note(text: str, cls: str = "") -> dict[str, Any]:
    return {"kind": "note", "text": text, "cls": cls}


def heading(text: str) -> dict[str, Any]:
    return {"kind": "heading", "text": text}


def details(summary: str, blocks: list[dict[str, Any]], *, open_: bool = False) -> dict[str, Any]:
    return {"kind": "details", "summary": summary, "blocks": blocks, "open": open_}


class Ids:
    """Chart id prefixes, unique within one page and the same on every rendering of the same inputs."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"c{self.n}"


# ----------------------------------------------------------------------------------------------
# numbers


def finite(v: Any) -> bool:
    """True for a value that reads as a finite number."""
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def as_float(v: Any, default: Any = math.nan) -> float:
    """``v`` as a float, else ``default`` (NaN when that is not a finite number either)."""
    return float(v) if finite(v) else (float(default) if finite(default) else math.nan)


def ratio(a: Any, b: Any) -> float:
    """``a / b``, NaN unless both are finite and ``b`` is positive."""
    return float(a) / float(b) if finite(a) and finite(b) and float(b) > 0 else math.nan


def pct(v: Any) -> str:
    """A fraction as a percentage with one decimal ('12.5%'), '' for a non-number."""
    return f"{float(v) * 100:.1f}%" if finite(v) else ""


def label(run_no: Any, multi: bool, *parts: str) -> str:
    """Chart label of a row: its parts joined, prefixed by ``[run]`` when the report holds several runs."""
    text = " · ".join(p for p in parts if p)
    return f"[{run_no}] {text}" if multi else text


# ----------------------------------------------------------------------------------------------
# tables of records


#: how a column of each kind shows a value: (header css class, cell maker)
_KINDS: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "": ("", cell),
    "num": ("num", num),
    "pct": ("num", lambda v: cell(pct(v), "num")),
    "status": ("", status_cell),
    "code": ("", lambda v: cell(v, code=True)),
    "detail": ("", lambda v: cell(v, "detail")),
}

#: a column of :func:`records_table`: its header and the cell of a record
Column = tuple[Any, Callable[[Any], dict[str, Any]]]


def _get(record: Any, field: str | Callable[[Any], Any]) -> Any:
    if callable(field):
        return field(record)
    return record[field] if isinstance(record, dict) else getattr(record, field)


def column(header: str, field: str | Callable[[Any], Any], kind: str = "") -> Column:
    """A column showing ``field`` of each record (an attribute, a key or a function of the record) as
    a cell of ``kind``: '' (text), 'num', 'pct', 'status', 'code' or 'detail'."""
    css, make = _KINDS[kind]
    return ((header, css) if css else header), (lambda r: make(_get(r, field)))


#: the kind of cell each results field is shown in by :func:`fields`
_FIELD_KINDS = {"value": "num", "threshold": "num", "status": "status", "detail": "detail"}


def fields(*names: str) -> list[Column]:
    """Columns of results fields under their own names (``value`` and ``threshold`` as numbers,
    ``status`` as a status, ``detail`` as a detail), in the order given."""
    return [column(n, n, _FIELD_KINDS.get(n, "")) for n in names]


def run_column(multi: bool, field: str = "run_no") -> list[Column]:
    """The leading run-number column, present only when the report holds several runs."""
    return [("run", lambda r: cell(_get(r, field)))] if multi else []


def status_row(record: Any) -> str:
    """The row class of a record with a status (``row-<status>``)."""
    return f"row-{_get(record, 'status')}"


def records_table(
    records: Iterable[Any],
    columns: Sequence[Column],
    *,
    row_cls: Callable[[Any], str] | None = status_row,
    cls: str = "",
    caption: str = "",
    attrs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A table block of one row per record (named tuples or dicts), one cell per column."""
    body = [row([make(r) for _, make in columns], row_cls(r) if row_cls else "") for r in records]
    return table([h for h, _ in columns], body, cls=cls, caption=caption, attrs=attrs)
