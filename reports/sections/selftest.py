"""The self-test section (suite ``selftest``): does the suite tell a healthy device from a broken one?

`mystique selftest` records one ``healthy_false_failures`` row (what went wrong on the healthy
device), one ``fault_caught`` row per fault simulation (the fail rows of the run under that fault),
``failed_check`` measurements (one per run and ``suite.check`` with failed rows: subject the run,
metric the check, value the rows) and one ``run_time`` measurement per run. This section shows them
as a verdict line and a matrix: one row per qualification run (the healthy one first), one column
per ``suite.check`` that failed in any of them. It reads columns only, never the sentence in a
detail: a self-test written before the ``failed_check`` rows shows its verdicts without the matrix's
check columns. Reads result rows only; never imports torch.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ...results import SUITES
from ..blocks import cell, fmt, note, num, row, status_cell, table
from .base import SuiteRows

HEALTHY = "healthy"  # the subject of the healthy run's run_time and failed_check rows


def failed_checks(g: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Run (``healthy`` or a fault) -> ``suite.check`` -> failed rows, from the ``failed_check`` rows of ``g``."""
    out: dict[str, dict[str, int]] = {}
    for r in g[g["check"] == "failed_check"].itertuples():
        if math.isfinite(r.value):
            hits = out.setdefault(r.subject, {})
            hits[r.metric] = hits.get(r.metric, 0) + int(r.value)
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
        hits = failed_checks(g)
        text, good = _verdict(healthy, faults)
        out.append(note(f"[{run_no}] {text}" if multi else text, "selftest-verdict " + ("good" if good else "bad")))
        for r in healthy.itertuples():
            entries.append({"run_no": run_no, "name": HEALTHY, "healthy": True, "row": r,
                            "seconds": times.get(HEALTHY, math.nan), "hits": hits.get(HEALTHY, {})})
        for r in faults.itertuples():
            entries.append({"run_no": run_no, "name": r.subject, "healthy": False, "row": r,
                            "seconds": times.get(r.subject, math.nan), "hits": hits.get(r.subject, {})})
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
