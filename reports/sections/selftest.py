"""The self-test section (suite ``selftest``): does the suite tell a healthy device from a broken one?

`mystique selftest` records one ``healthy_false_failures`` row (the failed checks of the healthy
qualification run), one ``fault_caught`` row per fault simulation (the failed checks of the run
under that fault; the detail names them: ``caught by suite.check xN; ...; rows in ...``) and one
``run_time`` measurement per run. This section shows them as a verdict line and a matrix: one row
per qualification run (the healthy one first), one column per ``suite.check`` that failed in any
of them. Reads result rows only; never imports torch.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from ...results import SUITES
from ..blocks import cell, fmt, note, num, row, status_cell, table
from .base import SuiteRows

HEALTHY = "healthy"  # the subject of the healthy run's run_time row
_CAUGHT = re.compile(r"(?:\bcaught by|\bfailing:) (?P<items>.*?)(?:; rows in |$)")
_ITEM = re.compile(r"^(?P<key>[^\s;]+) x(?P<n>\d+)$")


def parse_caught_by(detail: str) -> dict[str, int]:
    """The checks named in a selftest row's detail, ``suite.check`` -> how many of its rows failed.

    Reads the text after ``caught by `` (a ``fault_caught`` row) or ``failing: `` (the
    ``healthy_false_failures`` row) up to the first ``; rows in``: items ``suite.check xN``
    separated by ``; ``. Items of another shape are ignored; ``{}`` when nothing is named (a fault
    NOT caught, a run that did not finish).
    """
    m = _CAUGHT.search(detail or "")
    if not m:
        return {}
    out: dict[str, int] = {}
    for item in m["items"].split("; "):
        hit = _ITEM.match(item.strip())
        if hit:
            out[hit["key"]] = out.get(hit["key"], 0) + int(hit["n"])
    return out


def _column_order(keys: list[str]) -> list[str]:
    """``suite.check`` columns in suite order (``mystique.results.SUITES``), then first appearance."""
    rank = {s: i for i, s in enumerate(SUITES)}
    first = {k: i for i, k in enumerate(keys)}
    return sorted(first, key=lambda k: (rank.get(k.split(".", 1)[0], len(rank)), first[k]))


def _verdict(healthy: pd.DataFrame, faults: pd.DataFrame) -> tuple[str, bool]:
    """One line (healthy device: N false failures; faults caught: K of F) and whether all is well."""
    parts, good = [], True
    for r in healthy.itertuples():
        if r.status == "error":
            parts.append(f"healthy device ({r.subject}): the qualification did not finish")
        elif r.status == "skip":
            parts.append(f"healthy device ({r.subject}): nothing was checked")
        else:
            n = int(r.value) if math.isfinite(r.value) else 0
            parts.append(f"healthy device ({r.subject}): {n} false failure{'s' if n != 1 else ''}")
        good = good and r.status == "pass"
    if len(faults):
        caught = faults[faults["status"] == "pass"]
        missed = faults[faults["status"] == "fail"]
        broken = faults[faults["status"] == "error"]
        why = [f"not caught: {', '.join(missed['subject'])}" if len(missed) else "",
               f"did not finish: {', '.join(broken['subject'])}" if len(broken) else ""]
        why_text = "; ".join(w for w in why if w)
        parts.append(f"faults caught: {len(caught)} of {len(faults)}" + (f" ({why_text})" if why_text else ""))
        good = good and len(caught) == len(faults)
    else:
        parts.append("no fault simulation was run")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + ".", good


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    """The verdict line and the fault x check matrix of the selftest rows.

    Run numbers are shown when the selftest rows come from several runs (``rows.multi`` tells of
    the whole report, where a self-test's own healthy qualification run is another run).
    """
    df = rows.df
    multi = df["run_no"].nunique() > 1
    out: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    for run_no, g in df.groupby("run_no", sort=False):
        healthy = g[g["check"] == "healthy_false_failures"]
        faults = g[g["check"] == "fault_caught"]
        if not len(healthy) and not len(faults):
            continue
        times = {r.subject: r.value for r in g[g["check"] == "run_time"].itertuples()}
        text, good = _verdict(healthy, faults)
        out.append(note(f"[{run_no}] {text}" if multi else text, "selftest-verdict " + ("good" if good else "bad")))
        for r in healthy.itertuples():
            entries.append({"run_no": run_no, "name": HEALTHY, "healthy": True, "row": r,
                            "seconds": times.get(HEALTHY, math.nan), "hits": parse_caught_by(r.detail)})
        for r in faults.itertuples():
            entries.append({"run_no": run_no, "name": r.subject, "healthy": False, "row": r,
                            "seconds": times.get(r.subject, math.nan), "hits": parse_caught_by(r.detail)})
    if not entries:
        return out
    columns = _column_order([k for e in entries for k in e["hits"]])
    body = []
    for e in entries:
        r = e["row"]
        cells = [cell(e["run_no"])] if multi else []
        cells += [cell(e["name"], code=not e["healthy"], title=r.subject if e["healthy"] else ""),
                  status_cell(r.status, title=r.detail), num(r.value)]
        for k in columns:
            n = e["hits"].get(k, 0)
            if not n:
                cells.append(cell("", "num"))
                continue
            what = "falsely failed on the healthy device" if e["healthy"] else f"caught {e['name']}"
            cells.append(cell(n, "num false-hit" if e["healthy"] else "num hit",
                              title=f"{k} {what}: {n} failed row{'s' if n != 1 else ''}"))
        cells.append(cell(fmt(e["seconds"], 3), "num"))
        body.append(row(cells, f"row-{r.status}"))
    headers: list[Any] = (["run"] if multi else []) + ["qualification run", "status", ("failed checks", "num")]
    headers += [(k, "num check-col") for k in columns]
    headers.append(("run time (s)", "num"))
    return out + [
        table(
            headers,
            body,
            cls="selftest",
            caption="Failed checks per qualification run: the healthy device should fail none, each fault "
            "simulation at least one. A cell counts the failed rows of one check (suite.check) in that run.",
        )
    ]
