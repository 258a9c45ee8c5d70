"""The prediction section (suite ``predict``, `mystique predict`): predicted step time against the
measured one, and where the predicted time goes.

From the rows alone (never a detail's sentence): per prediction (run, subject), a timeline chart of
the predicted step, its critical path laid out by operator class, beside the measured step (the
capture's own timing, a rerun here, or for a transform the untransformed step's prediction scaled by
the measured paired ratio), and a table of the per-class breakdown with each ``prediction_error``, its
interval and verdict. Never imports torch.
"""

from __future__ import annotations

import math
from typing import Any

from ..blocks import as_float, cell, chart, fmt, note, num, row, status_cell, table
from ..charts import stacked_breakdown
from .base import SuiteRows

#: the operator classes of mystique.predict.sim.CLASSES (not imported: that package imports torch)
CLASSES = ("gemm", "attention", "memory", "communication", "host")
_AGAINST = {"vs_capture": "measured by the capture", "vs_rerun": "measured here (rerun)",
            "vs_paired_replay": "measured (paired replay ratio)", "vs_replay": "measured by its replay"}


def _entries(rows: SuiteRows) -> list[dict[str, Any]]:
    entries: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in rows.df.itertuples():
        e = entries.setdefault((r.run_no, r.subject), {"run": r.run_no, "subject": r.subject, "crit": {},
                                                      "errors": [], "measured": {}})
        v = as_float(r.value)
        if r.check == "predicted_step_time":
            e["predicted"] = v
        elif r.check == "predicted_base_step_time":
            e["base"] = v
        elif r.check == "critical_path":
            e["critical"] = v
        elif r.check == "critical_path_class" and r.metric in CLASSES:
            e["crit"][r.metric] = v
        elif r.check in ("measured_step_time", "measured_ratio"):
            e["measured"][r.metric] = (r.check, v, as_float(r.low), as_float(r.high))
        elif r.check == "prediction_error":
            e["errors"].append(r)
    return [e for e in entries.values() if math.isfinite(e.get("predicted", math.nan))]


def _measured_ms(e: dict[str, Any], metric: str) -> float:
    got = e["measured"].get(metric)
    if got is None:
        return math.nan
    check, v, _, _ = got
    if check == "measured_ratio":  # the transformed step as the untransformed prediction times the measured change
        return v * e.get("base", math.nan)
    return v


def _label(e: dict[str, Any], multi: bool, what: str) -> str:
    head = f"run {e['run']}: " if multi else ""
    return f"{head}{e['subject']} · {what}"


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    entries = _entries(rows)
    if not entries:
        return []
    out: list[dict[str, Any]] = []
    bars: dict[str, dict[str, float]] = {}
    for e in entries:
        bars[_label(e, rows.multi, "predicted")] = {c: e["crit"].get(c, 0.0) for c in CLASSES}
        for metric in e["measured"]:
            ms = _measured_ms(e, metric)
            if math.isfinite(ms):
                bars[_label(e, rows.multi, _AGAINST.get(metric, metric))] = {"measured step": ms}
    out.append(chart(stacked_breakdown(bars, xlabel="ms", title="Step timeline: predicted (critical path by "
                                       "operator class) beside measured", uid=rows.ids()),
                     "Each predicted step is its critical path laid out by class: where the step's time goes; "
                     "the bar below it is the step as measured."))
    body = []
    for e in entries:
        errs = e["errors"] or [None]
        for r in errs:
            cells = [cell(e["subject"]), num(e.get("predicted")), num(e.get("critical"))]
            cells += [num(e["crit"].get(c)) for c in CLASSES]
            if r is None:
                cells += [cell(""), cell(""), cell(""), cell("")]
            else:
                lo, hi = as_float(r.low), as_float(r.high)
                interval = f"[{lo:+.1%}, {hi:+.1%}]" if math.isfinite(lo) and math.isfinite(hi) else ""
                cells += [cell(_AGAINST.get(r.metric, r.metric)),
                          cell(f"{as_float(r.value):+.2%}" if math.isfinite(as_float(r.value)) else ""),
                          cell(interval), status_cell(r.status)]
            body.append(row(cells, f"row-{r.status}" if r is not None else ""))
    headers = ["prediction", ("predicted ms", "num"), ("critical path ms", "num")]
    headers += [(f"{c} ms", "num") for c in CLASSES]
    headers += ["checked against", "error", "95% interval", "status"]
    out.append(table(headers, body, cls="predict",
                     caption="Predicted step, its critical path by operator class, and the prediction's error "
                             "(predicted / measured - 1)"))
    if any(not e["errors"] for e in entries):
        out.append(note("A prediction without an error row was not checked: a what-if this machine cannot run "
                        f"(--scale, --target-profile) or a benchmark with no measured step ({fmt(len(entries))} "
                        "predictions in all)."))
    return out
