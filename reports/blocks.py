"""Cells, rows, tables and other blocks of the report: plain dicts the template loops over.

The template escapes every string. Shared by :mod:`.html` and the suite sections kept in their own
modules (:mod:`.selftest`). Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
