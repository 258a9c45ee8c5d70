"""The HTML report page: one self-contained file built from results tables and replay artifacts alone.

:func:`render_html` is pure (inputs in, markup out) and assembles the page: verdict and runs,
summary by suite, failures, comparison of runs, then one part per suite (its section from
:mod:`.sections`, then all its rows). :func:`render_report` reads the files, renders and writes the
page atomically. Never imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_text
from ..results import BAD_STATUSES, STATUSES, SUITES, validate
from ..results import counts as count_statuses
from .blocks import Ids, cell, details, finite, fmt, fmt_pct, num, row, table
from .inputs import ReportInputs, load_inputs
from .sections import SECTIONS, SuiteRows, rows_table
from .tables import compare_runs, runs, status_counts, verdict_of, with_run_labels

SUITE_TITLES = {
    "capture": "Capture",
    "replay": "Replay fidelity",
    "numerics": "Numerics",
    "soft_errors": "Soft errors",
    "correctness": "Correctness",
    "onnx": "ONNX export",
    "distributed": "Distributed",
    "performance": "Performance",
    "selftest": "Self-test",
}
#: suites whose section leads the report when present (the self-test is the headline of a self-test run)
_LEADING = ("selftest",)
#: how a status is named where rows are counted
STATUS_WORDS = {"pass": "passed", "fail": "failed", "inconclusive": "inconclusive", "skip": "skipped",
                "error": "errors", "info": "measurements"}
#: the statuses counted in a column each (measurements, ``info``, come after the checks column)
_SUMMARY_STATUSES = ("pass", "fail", "inconclusive", "error", "skip")


def _comparison(df: pd.DataFrame, run_table: pd.DataFrame) -> dict[str, Any] | None:
    """The comparison of runs (:func:`~.tables.compare_runs`): the checks that differ, those that are
    the same, and the status changes; None when no check is present in several runs."""
    comp = compare_runs(df, run_table)
    if not len(comp):
        return None
    labels = list(run_table["label"])
    headers: list[Any] = ["suite", "check", "subject", "dtype", "metric"]
    for i in range(1, len(labels) + 1):
        headers.append((f"[{i}] value", "num"))
        if i > 1:
            headers += [(f"[{i}] Δ", "num"), (f"[{i}] Δ%", "num")]
    differing, same, changes = [], [], []
    keys = ["suite", "check", "subject", "dtype", "metric", "occurrence"]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for rec in comp.to_dict("records"):  # comp is ordered; dicts keep that order
        groups.setdefault(tuple(rec[k] for k in keys), []).append(rec)
    for key, recs in groups.items():
        by_run = {r["run_no"]: r for r in recs}
        cells = [cell(key[0]), cell(key[1]), cell(key[2]), cell(key[3]), cell(key[4])]
        for i in range(1, len(labels) + 1):
            r = by_run.get(i)
            if r is None:
                cells.append(cell("—", "num missing"))
                if i > 1:
                    cells += [cell("", "num"), cell("", "num")]
                continue
            status, base_status, delta = r["status"], r["baseline_status"], r["delta"]
            cls = f"num st-{status}" + (" changed" if r["status_changed"] else "")
            title = status + (f" (was {base_status})" if r["status_changed"] else "")
            # a measurement shows its value alone: it has no verdict to compare
            text = fmt(r["value"]) if status == "info" else f"{fmt(r['value'])} {status}"
            cells.append(cell(text, cls, title=title))
            if i > 1:
                direction = "" if not finite(delta) or delta == 0 else (" up" if delta > 0 else " down")
                cells += [
                    cell("" if r["is_baseline"] else fmt(delta), "num" + direction),
                    cell("" if r["is_baseline"] else fmt_pct(r["rel_delta"]), "num" + direction),
                ]
            if r["status_changed"]:
                what = " ".join(x for x in (f"{key[0]}/{key[1]}", key[2], key[3], key[4]) if x)
                text = f"{what}: {base_status} → {status} in [{i}]"
                changes.append({"text": text, "worse": bool(r["worsened"])})
        key_changed = any(r["key_changed"] for r in recs)
        moved = (
            key_changed
            or any(finite(r["delta"]) and r["delta"] != 0 for r in recs)
            or len({finite(r["value"]) for r in recs}) > 1
        )
        cls = "worse" if any(r["worsened"] for r in recs) else ("changed" if key_changed else "")
        (differing if moved else same).append(row(cells, cls))
    n_worse = sum(c["worse"] for c in changes)
    return {
        "table": table(headers, differing, cls="comparison") if differing else None,
        "same": table(headers, same, cls="comparison same") if same else None,
        "n_same": len(same),
        "changes": changes,
        "summary": f"{len(differing) + len(same)} checks and measurements present in several runs: "
        f"{len(differing)} differ, {len(same)} identical; {len(changes)} status change(s), {n_worse} for "
        "the worse (to fail, inconclusive or error). Δ is against run [1], the oldest.",
        "runs": labels,
    }


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("mystique.reports", "templates"),
        autoescape=jinja2.select_autoescape(("html", "j2", "html.j2"), default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


_REPRODUCE = "reproduce:"


def reproduce_of(detail: str) -> str:
    """The command a row's ``detail`` ends with (``...; reproduce: mystique replay BENCH -o OUT``), for the
    failure's reproduce line; a detail without one says so instead of passing a description off as a command."""
    text = str(detail or "")
    i = text.rfind(_REPRODUCE)
    if i >= 0 and text[i + len(_REPRODUCE):].strip():
        return text[i + len(_REPRODUCE):].strip()
    return f"(no command recorded; detail: {text})" if text else ""


def _suite_order() -> dict[str, int]:
    return {s: i for i, s in enumerate(dict.fromkeys((*_LEADING, *SUITES)))}


def _by_suite(df: pd.DataFrame) -> pd.DataFrame:
    """Rows counted by status per suite, leading suites first, then in the order of ``SUITES``."""
    order = _suite_order()
    by_suite = status_counts(df)
    by_suite["_o"] = by_suite["suite"].map(lambda s: order.get(s, len(order)))
    return by_suite.sort_values(["_o"], kind="stable")


def _summary_table(by_suite: pd.DataFrame) -> dict[str, Any]:
    summary_rows = [
        row(
            [cell(SUITE_TITLES.get(r["suite"], r["suite"]))]
            + [num(r[s]) for s in _SUMMARY_STATUSES]
            + [num(r["checks"]), num(r["info"])],
            _bad_row_class(r),
        )
        for r in by_suite.to_dict("records")
    ]
    return table(
        ["suite"]
        + [(s, f"num st-{s}") for s in _SUMMARY_STATUSES]
        + [("checks", "num"), ("measurements", "num st-info")],
        summary_rows,
        cls="by-suite",
        caption="checks: rows with a verdict (pass, fail, inconclusive, error); measurements (info) "
        "are shown and never counted as passed checks",
    )


def _failures(df: pd.DataFrame, multi: bool) -> list[dict[str, Any]]:
    """The bad rows (fail, inconclusive, error) in suite order, each with the command that reproduces it."""
    order = _suite_order()
    fails = df[df["status"].isin(BAD_STATUSES)].copy()
    fails["_o"] = fails["suite"].map(lambda s: order.get(s, len(order)))
    fails = fails.sort_values(["_o", "run_no"], kind="stable")
    return [
        {
            "status": r.status,
            "suite": r.suite,
            "check": r.check,
            "subject": r.subject,
            "dtype": r.dtype,
            "metric": r.metric,
            "value": fmt(r.value),
            "threshold": fmt(r.threshold),
            "unit": r.unit,
            # the page's "reproduce:" line: the command the row's detail ends with, not its description
            "detail": reproduce_of(r.detail),
            "description": r.detail,
            "run": f"[{r.run_no}] {r.run}" if multi else "",
        }
        for r in fails.itertuples()
    ]


def _run_rows(run_table: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            "no": r["run"],
            "label": r["label"],
            "device": r["device"],
            "device_name": r["device_name"],
            "torch_version": r["torch_version"],
            "host": r["host"],
            "run_id": r["run_id"],
            "dates": r["first"] if r["first"] == r["last"] else f"{r['first']} … {r['last']}",
            "suites": r["suites"],
            "counts": [(s, r[s]) for s in _SUMMARY_STATUSES] + [("info", r["info"])],
            "cls": _bad_row_class(r),
        }
        for r in run_table.to_dict("records")
    ]


def _suite_part(suite: str, rows: SuiteRows) -> dict[str, Any]:
    """One suite's part of the page: its section's blocks (when it has a section), then all its rows."""
    sdf, title = rows.df, SUITE_TITLES.get(suite, suite)
    counts = [(s, f"{n} {STATUS_WORDS[s]}") for s in STATUSES if (n := int((sdf["status"] == s).sum()))]
    special = SECTIONS[suite].blocks(rows) if suite in SECTIONS else []
    all_rows = rows_table(sdf, rows.multi, cls="results-all", attrs={"data-suite": suite})
    blocks = special + [details(f"All {len(sdf)} {title.lower()} rows", [all_rows], open_=not special)]
    return {"suite": suite, "title": title, "counts": counts, "blocks": blocks}


def render_html(inputs: ReportInputs | pd.DataFrame, *, title: str | None = None) -> str:
    """The report page for ``inputs`` as one self-contained HTML string (no network references).

    ``inputs`` is a :class:`ReportInputs` (see :func:`load_inputs`) or a bare results table (then
    without replay artifacts; ValueError if it does not follow the results schema). Pure: the same
    inputs give the same markup. Sections: verdict and runs (devices), summary by suite, failures
    first with the detail that reproduces them (inconclusive ones among them), comparison of runs
    (when several runs share checks), then one section per suite that has rows, the self-test's
    first. The verdict is :func:`~.tables.verdict_of`'s; the headline counts checks (rows with a
    verdict) and measurements (``info``) apart, like :attr:`mystique.results.Counts.line`.
    """
    if isinstance(inputs, pd.DataFrame):
        inputs = ReportInputs(results=validate(inputs))
    df = inputs.results.copy()
    run_table = runs(df)
    multi = len(run_table) > 1
    df["run"] = with_run_labels(df, run_table)
    df["run_no"] = df["run"].map({lab: i for i, lab in enumerate(run_table["label"], 1)})
    verdict = verdict_of(df)
    ids = Ids()
    by_suite = _by_suite(df)
    sections = [
        _suite_part(suite, SuiteRows(df[df["suite"] == suite], multi, ids, inputs.replays, run_table))
        for suite in by_suite["suite"]
    ]
    return (
        _env()
        .get_template("report.html.j2")
        .render(
            title=title or _default_title(run_table),
            verdict=verdict,
            headline=_headline(df, len(run_table)),
            nothing_checked=verdict == "NOTHING CHECKED",
            by_status={s: int((df["status"] == s).sum()) for s in STATUSES},
            runs=_run_rows(run_table),
            multi=multi,
            summary=_summary_table(by_suite),
            summary_links=[{"suite": s, "title": SUITE_TITLES.get(s, s)} for s in by_suite["suite"]],
            failures=_failures(df, multi),
            comparison=_comparison(df, run_table) if multi else None,
            sections=sections,
            sources=list(inputs.sources),
        )
    )


def _bad_row_class(counts: dict[str, Any]) -> str:
    """``row-fail`` for a table row counting a failure or an error, ``row-inconclusive`` for one
    whose only bad rows are inconclusive, else ''."""
    if counts["fail"] or counts["error"]:
        return "row-fail"
    return "row-inconclusive" if counts["inconclusive"] else ""


def _headline(df: pd.DataFrame, n_runs: int) -> list[dict[str, str]]:
    """The counts under the verdict, read like :attr:`mystique.results.Counts.line`: checks (rows with
    a verdict), how many passed and failed (errors named inside), the undecided (inconclusive) ones
    and skips when any, measurements apart, then the number of runs."""
    c = count_statuses(df)
    n_error = int((df["status"] == "error").sum())
    inside_text = f"{n_error} error{'s' if n_error != 1 else ''}" if n_error else ""
    chips = [
        {"text": f"{c.checks} checks", "cls": ""},
        {"text": f"{c.checks - c.failed} passed", "cls": "st-pass"},
        {"text": f"{c.decided_failures} failed" + (f" ({inside_text})" if inside_text else ""),
         "cls": "st-fail" if c.decided_failures else ""},
    ]
    if c.inconclusive:
        chips.append({"text": f"{c.inconclusive} undecided", "cls": "st-inconclusive"})
    if c.skipped:
        chips.append({"text": f"{c.skipped} skipped", "cls": "st-skip"})
    chips.append({"text": f"{c.measurements} measurements", "cls": "st-info"})
    chips.append({"text": f"{n_runs} run{'s' if n_runs != 1 else ''}", "cls": ""})
    return chips


def _default_title(run_table: pd.DataFrame) -> str:
    devices = list(dict.fromkeys(run_table["device"])) if len(run_table) else []
    if not devices:
        return "Mystique report"
    shown = ", ".join(devices[:3]) + (f" and {len(devices) - 3} more" if len(devices) > 3 else "")
    return f"Mystique report: {shown}"


def render_report(
    results_paths: str | os.PathLike | Sequence[str | os.PathLike],
    out_html: str | os.PathLike,
    *,
    title: str | None = None,
    force: bool = False,
) -> Path:
    """Read results files (or folders of them), render the report and write it atomically to ``out_html``.

    Returns the path written. UsageError (one line) on bad input, or when ``out_html`` exists and
    ``force`` is false, or is a folder.
    """
    out = Path(out_html)
    if out.is_dir():
        raise UsageError(f"report path {out} is a folder; give a file name such as {out / 'report.html'}")
    if out.exists() and not force:
        raise UsageError(f"report {out} exists; pass --force to replace it")
    page = render_html(load_inputs(results_paths), title=title)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror or exc}") from exc
    return atomic_write_text(out, page)
