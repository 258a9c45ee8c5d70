"""The HTML report: one self-contained file built from results tables and replay artifacts alone.

:func:`render_html` is pure (inputs in, markup out); :func:`render_report` reads the files, renders
and writes the page atomically. Never imports torch.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd

from ..errors import UsageError
from ..io import atomic_write_text
from ..results import BAD_STATUSES, STATUSES, SUITES, validate
from ..results import counts as count_statuses
from . import charts
from .blocks import Ids as _Ids
from .blocks import cell, chart, details, fmt, fmt_pct, heading, num, row, status_cell, table
from .fidelity import paired_round_blocks
from .inputs import ReplayArtifacts, ReportInputs, load_inputs
from .selftest import selftest_blocks
from .tables import compare_runs, runs, status_counts, verdict_of, wilson_interval, with_run_labels

TOP_OPS = 25
TOP_OP_TYPES = 15
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
_FIDELITY = ("original_step_ms", "replay_step_ms", "ratio", "coverage", "coverage_by_time")
#: replay rows whose (check, metric) carry a fidelity figure under another name
_REPLAYED = ("", "replayed", "ok", "pass")
_FIDELITY_ALIASES = {
    ("replay_step_time", "median_ms"): "replay_step_ms",
    ("original_step_time", "median_ms"): "original_step_ms",
}
_CI_SUFFIXES = ("_ci_low", "_ci_high")
_TRIALS = re.compile(r"\btrials\s*[=:]\s*(\d+)")


# ----------------------------------------------------------------------------------------------
# building blocks shared by the sections


def _label(r: Any, multi: bool, *parts: str) -> str:
    text = " · ".join(p for p in parts if p)
    return f"[{r}] {text}" if multi else text


def _rows_table(df: pd.DataFrame, multi: bool, *, cls: str, caption: str = "",
                attrs: dict[str, str] | None = None) -> dict[str, Any]:
    """Every column a reader needs of each results row (run number first when several runs)."""
    headers: list[Any] = [("run", "")] if multi else []
    headers += [
        "check",
        "subject",
        "dtype",
        "metric",
        ("value", "num"),
        "unit",
        ("threshold", "num"),
        "status",
        "detail",
    ]
    body = []
    for r in df.itertuples():
        cells = [cell(r.run_no)] if multi else []
        cells += [
            cell(r.check),
            cell(r.subject),
            cell(r.dtype),
            cell(r.metric),
            num(r.value),
            cell(r.unit),
            num(r.threshold),
            status_cell(r.status),
            cell(r.detail, "detail"),
        ]
        body.append(row(cells, f"row-{r.status}"))
    return table(headers, body, cls=cls, caption=caption, attrs=attrs)


def _metric_groups(df: pd.DataFrame, main: Callable[[str, str], bool]) -> list[dict[str, Any]]:
    """Group rows sharing (run, check, subject, dtype) and pivot their metrics.

    ``main(check, metric)`` tells the principal metric of a group; other metrics of the group
    (``<main>_ci_low``, ``<main>_ci_high``, ``trials``, ...) become companions. Returns one dict per
    principal row: ``run_no, check, subject, dtype, metric, value, threshold, unit, status, detail,
    others`` (metric -> value).
    """
    out = []
    for _, g in df.groupby(["run_no", "check", "subject", "dtype"], sort=False):
        principal = g[[main(c, m) for c, m in zip(g["check"], g["metric"])]]
        others = {m: v for m, v in zip(g["metric"], g["value"])}
        statuses = set(g["status"])
        for r in principal.itertuples():
            worst = next((s for s in ("error", "fail", "inconclusive") if s in statuses), r.status)
            out.append(
                {
                    "run_no": r.run_no,
                    "check": r.check,
                    "subject": r.subject,
                    "dtype": r.dtype,
                    "metric": r.metric,
                    "value": r.value,
                    "threshold": r.threshold,
                    "unit": r.unit,
                    "status": worst,
                    "detail": r.detail,
                    "others": others,
                }
            )
    return out


# ----------------------------------------------------------------------------------------------
# suite sections


def _replay_blocks(
    df: pd.DataFrame, replays: Sequence[ReplayArtifacts], run_table: pd.DataFrame, multi: bool, ids: _Ids
) -> list[dict[str, Any]]:
    run_no = {(r.run_id, r.device): r.run for r in run_table.itertuples()}
    entries: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in df.itertuples():
        key = r.metric if r.metric in _FIDELITY else _FIDELITY_ALIASES.get((r.check, r.metric))
        if key is None:
            continue
        e = entries.setdefault((r.run_no, r.subject), {"run": r.run_no, "subject": r.subject})
        e.setdefault(key, r.value)
    for art in replays:
        rn = run_no.get((art.run_id, art.device), "")
        e = entries.setdefault((rn, art.label), {"run": rn, "subject": art.label})
        if art.summary:
            for k in _FIDELITY:
                if art.summary.get(k) is not None and not _finite(e.get(k)):
                    e[k] = art.summary[k]
            e["ops_total"] = art.summary.get("ops_total")
            e["ops_replayed"] = art.summary.get("ops_replayed")
            e["ops_skipped"] = art.summary.get("ops_skipped") or {}
    blocks: list[dict[str, Any]] = []
    if entries:
        items = list(entries.values())
        for e in items:
            if (
                not _finite(e.get("ratio"))
                and _finite(e.get("original_step_ms"))
                and _finite(e.get("replay_step_ms"))
                and e["original_step_ms"] > 0
            ):
                e["ratio"] = e["replay_step_ms"] / e["original_step_ms"]
        timed = [e for e in items if _finite(e.get("original_step_ms")) or _finite(e.get("replay_step_ms"))]
        if timed:
            labels = [_label(e["run"], multi, e["subject"]) for e in timed]
            blocks.append(
                chart(
                    charts.grouped_bars(
                        labels,
                        {
                            "original step": [_f(e.get("original_step_ms")) for e in timed],
                            "replay step": [_f(e.get("replay_step_ms")) for e in timed],
                        },
                        xlabel="step time (ms, median)",
                        title="Original vs replay step time",
                        uid=ids(),
                    ),
                    "Median step time of the captured workload and of its replay, same device.",
                )
            )
        body = []
        for e in items:
            skipped = e.get("ops_skipped") or {}
            skipped_text = ", ".join(
                f"{k}×{v}" for k, v in sorted(skipped.items(), key=lambda kv: -kv[1])[:6]
            )
            if len(skipped) > 6:
                skipped_text += f", … ({len(skipped)} kinds)"
            ops = ""
            if _finite(e.get("ops_total")):
                ops = f"{fmt(e.get('ops_replayed'))} / {fmt(e.get('ops_total'))}"
            cells = [cell(e["run"])] if multi else []
            cells += [
                cell(e["subject"]),
                num(e.get("original_step_ms")),
                num(e.get("replay_step_ms")),
                num(e.get("ratio")),
                cell(_pct(e.get("coverage")), "num"),
                cell(_pct(e.get("coverage_by_time")), "num"),
                cell(ops, "num"),
                cell(skipped_text, "detail"),
            ]
            body.append(row(cells))
        headers = (["run"] if multi else []) + [
            "workload / benchmark",
            ("original ms", "num"),
            ("replay ms", "num"),
            ("ratio", "num"),
            ("coverage", "num"),
            ("coverage by time", "num"),
            ("ops replayed", "num"),
            "skipped ops",
        ]
        blocks.append(
            table(headers, body, cls="fidelity", caption="Replay fidelity (ratio = replay / original)")
        )
    for art in replays:
        blocks += paired_round_blocks(art, _label(run_no.get((art.run_id, art.device), ""), multi, art.label), ids)
    with_ops = [a for a in replays if a.ops is not None and len(a.ops)]
    if with_ops:
        bars: dict[str, dict[str, float]] = {}
        for art in with_ops:
            name = _label(run_no.get((art.run_id, art.device), ""), multi, art.label)
            for kind in ("original", "replay"):
                col = f"{kind}_ms"
                if art.ops[col].notna().any():
                    bars[f"{name} {kind}"] = (
                        art.ops.groupby("name", sort=False)[col].sum(min_count=1).dropna().to_dict()
                    )
        if bars:
            blocks.append(
                chart(
                    charts.stacked_breakdown(
                        bars, xlabel="time per step (ms)", title="Time by operator type", uid=ids()
                    ),
                    "Summed operator times of one iteration, by operator name "
                    "(largest types; the rest as other).",
                )
            )
        for art in with_ops:
            name = _label(run_no.get((art.run_id, art.device), ""), multi, art.label)
            ops = art.ops
            by_type = (
                ops.groupby("name", sort=False)
                .agg(
                    count=("name", "size"),
                    original_ms=("original_ms", lambda s: s.sum(min_count=1)),
                    replay_ms=("replay_ms", lambda s: s.sum(min_count=1)),
                )
                .reset_index()
            )
            by_type["key"] = by_type[["original_ms", "replay_ms"]].max(axis=1)
            by_type = by_type.sort_values("key", ascending=False, kind="stable").head(TOP_OP_TYPES)
            total = ops["replay_ms"].sum()
            body = [
                row(
                    [
                        cell(t.name, code=True),
                        num(t.count),
                        num(t.original_ms),
                        num(t.replay_ms),
                        num(_ratio(t.replay_ms, t.original_ms)),
                        cell(
                            f"{t.replay_ms / total * 100:.1f}%" if total > 0 and _finite(t.replay_ms) else "",
                            "num",
                        ),
                    ]
                )
                for t in by_type.itertuples()
            ]
            blocks.append(heading(f"Operators of {name}"))
            blocks.append(
                table(
                    [
                        "operator type",
                        ("count", "num"),
                        ("original ms", "num"),
                        ("replay ms", "num"),
                        ("replay / original", "num"),
                        ("share of replay", "num"),
                    ],
                    body,
                    cls="optypes",
                    caption=f"Top {len(by_type)} operator types of {ops['name'].nunique()} by time",
                )
            )
            timed = ops.assign(key=ops[["original_ms", "replay_ms"]].max(axis=1)).dropna(subset=["key"])
            top = timed.sort_values("key", ascending=False, kind="stable").head(TOP_OPS)
            body = [
                row(
                    [
                        num(o.index),
                        cell(o.name, code=True),
                        cell(_overload(o.name, o.overload)),
                        cell(_compact(o.input_shapes), "detail"),
                        cell(_compact(o.input_dtypes), "detail"),
                        num(o.original_ms),
                        num(o.replay_ms),
                        num(_ratio(o.replay_ms, o.original_ms)),
                    ],
                    "row-slow" if _ratio(o.replay_ms, o.original_ms) > 2 else "",
                )
                for o in top.itertuples()
            ]
            blocks.append(
                table(
                    [
                        ("#", "num"),
                        "operator",
                        "overload",
                        "input shapes",
                        "input dtypes",
                        ("original ms", "num"),
                        ("replay ms", "num"),
                        ("replay / original", "num"),
                    ],
                    body,
                    cls="ops",
                    caption=f"Top {len(top)} of {len(timed)} timed operators by time",
                )
            )
            missed = ops[~ops["status"].isin(_REPLAYED)]
            if len(missed):
                body = [
                    row([num(o.index), cell(o.name, code=True), cell(o.status), cell(o.reason, "detail")])
                    for o in missed.head(TOP_OPS * 2).itertuples()
                ]
                more = f" (first {len(body)})" if len(missed) > len(body) else ""
                blocks.append(
                    table(
                        [("#", "num"), "operator", "status", "reason"],
                        body,
                        cls="not-replayed",
                        caption=f"{len(missed)} operators not replayed{more}",
                    )
                )
    return blocks


def _numerics_blocks(df: pd.DataFrame, multi: bool, ids: _Ids) -> list[dict[str, Any]]:
    # rows held to a positive bound with a measured value; NaN/inf values count when they failed
    measured = df["value"].notna() | (df["status"] == "fail")
    bounded = df[measured & np.isfinite(df["threshold"]) & (df["threshold"] > 0)].copy()
    if not len(bounded):
        return []
    bounded["ratio"] = bounded["value"] / bounded["threshold"]
    bounded["_rank"] = bounded["ratio"].fillna(math.inf)
    bounded = bounded.sort_values("_rank", ascending=False, kind="stable")
    shown = bounded.head(charts.MAX_BARS)
    labels = [_label(r.run_no, multi, r.subject, r.dtype, r.metric) for r in shown.itertuples()]
    more = f" The {len(shown)} largest of {len(bounded)} are drawn." if len(bounded) > len(shown) else ""
    blocks = [
        chart(
            charts.ratio_bars(
                labels,
                shown["ratio"].tolist(),
                shown["status"].tolist(),
                title="Error against its bound, per operator and dtype",
                uid=ids(),
            ),
            "Measured error divided by the bound it was held to; past the dashed line is out of bound."
            + more,
        )
    ]
    body = []
    for r in bounded.itertuples():
        cells = [cell(r.run_no)] if multi else []
        cells += [
            cell(r.subject, code=True),
            cell(r.dtype),
            cell(r.check),
            cell(r.metric),
            num(r.value),
            num(r.threshold),
            num(r.ratio),
            cell(r.unit),
            status_cell(r.status),
        ]
        body.append(row(cells, f"row-{r.status}"))
    headers = (["run"] if multi else []) + [
        "op",
        "dtype",
        "check",
        "metric",
        ("value", "num"),
        ("threshold", "num"),
        ("value / threshold", "num"),
        "unit",
        "status",
    ]
    blocks.append(table(headers, body, cls="numerics", caption="Errors against bounds, largest ratio first"))
    return blocks


def _is_rate(check: str, metric: str) -> bool:
    return metric == "detection_rate" or (
        metric.endswith("detection_rate") and not metric.endswith(_CI_SUFFIXES)
    )


def _soft_error_blocks(df: pd.DataFrame, multi: bool, ids: _Ids) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    rates = _metric_groups(df, _is_rate)
    if rates:
        for e in rates:
            o = e["others"]
            m = e["metric"]
            trials = o.get("trials", math.nan)
            if not _finite(trials):
                hit = _TRIALS.search(e["detail"])
                trials = float(hit[1]) if hit else math.nan
            lo, hi = o.get(f"{m}_ci_low", math.nan), o.get(f"{m}_ci_high", math.nan)
            if not (_finite(lo) and _finite(hi)) and _finite(trials) and _finite(e["value"]):
                lo, hi = wilson_interval(e["value"] * trials, trials)
            e.update(trials=trials, lo=lo, hi=hi)
        shown = rates[: charts.MAX_BARS * 2]
        labels = [_label(e["run_no"], multi, e["subject"], e["dtype"]) for e in shown]
        blocks.append(
            chart(
                charts.interval_points(
                    labels,
                    [e["value"] for e in shown],
                    [_f(e["lo"], e["value"]) for e in shown],
                    [_f(e["hi"], e["value"]) for e in shown],
                    [e["check"] for e in shown],
                    targets=[e["threshold"] for e in shown],
                    title="Detection rate per bit class (95% Wilson interval)",
                    xlabel="detection rate",
                    uid=ids(),
                ),
                "Share of injected faults that the checker detected; bars are 95% Wilson score intervals; "
                "red ticks are the required rate.",
            )
        )
        body = []
        for e in rates:
            cells = [cell(e["run_no"])] if multi else []
            cells += [
                cell(e["check"]),
                cell(e["subject"]),
                cell(e["dtype"]),
                num(e["trials"]),
                num(e["value"]),
                num(e["lo"]),
                num(e["hi"]),
                num(e["threshold"]),
                status_cell(e["status"]),
                cell(e["detail"], "detail"),
            ]
            body.append(row(cells, f"row-{e['status']}"))
        headers = (["run"] if multi else []) + [
            "check",
            "bit class",
            "dtype",
            ("trials", "num"),
            ("detection rate", "num"),
            ("CI low", "num"),
            ("CI high", "num"),
            ("threshold", "num"),
            "status",
            "detail",
        ]
        blocks.append(table(headers, body, cls="detection", caption="Detection rates"))
    pvf = _metric_groups(
        df[df["check"].str.startswith("pvf")], lambda c, m: not m.endswith(_CI_SUFFIXES) and m != "trials"
    )
    if pvf:
        pvf.sort(key=lambda e: -(e["value"] if _finite(e["value"]) else -1))
        shown = pvf[: charts.MAX_BARS]
        blocks.append(heading("Program vulnerability factor by layer"))
        blocks.append(
            chart(
                charts.ranking_bars(
                    [_label(e["run_no"], multi, e["subject"], e["dtype"]) for e in shown],
                    [e["value"] for e in shown],
                    title="PVF ranking (most vulnerable first)",
                    xlabel="PVF (share of faults that corrupt the output)",
                    uid=ids(),
                ),
                "Layers ranked by program vulnerability factor.",
            )
        )
        body = []
        for i, e in enumerate(pvf, 1):
            o = e["others"]
            cells = [num(i)] + ([cell(e["run_no"])] if multi else [])
            cells += [
                cell(e["subject"]),
                cell(e["dtype"]),
                cell(e["metric"]),
                num(e["value"]),
                num(o.get(f"{e['metric']}_ci_low")),
                num(o.get(f"{e['metric']}_ci_high")),
                num(o.get("trials")),
                status_cell(e["status"]),
                cell(e["detail"], "detail"),
            ]
            body.append(row(cells, f"row-{e['status']}"))
        headers = (
            [("rank", "num")]
            + (["run"] if multi else [])
            + [
                "layer",
                "dtype",
                "metric",
                ("PVF", "num"),
                ("CI low", "num"),
                ("CI high", "num"),
                ("trials", "num"),
                "status",
                "detail",
            ]
        )
        blocks.append(table(headers, body, cls="pvf", caption="PVF per layer, highest first"))
    # the checker's overheads (metric abft_overhead, ...) and the floors of its memory traffic
    # (abft_floor), not the A/A timing-resolution rows beside them
    over = df[df["check"].str.contains("overhead") & df["metric"].str.contains("overhead|floor")]
    if len(over):
        over = over.sort_values("value", ascending=False, kind="stable")
        shown = over.head(charts.MAX_BARS)
        unit = next((u for u in shown["unit"] if u), "")
        blocks.append(heading("Checker overheads"))
        blocks.append(
            chart(
                charts.ranking_bars(
                    [_label(r.run_no, multi, r.check, r.subject, r.dtype) for r in shown.itertuples()],
                    shown["value"].tolist(),
                    statuses=shown["status"].tolist(),
                    title="Checker overhead",
                    xlabel=f"overhead ({unit})" if unit else "overhead",
                    uid=ids(),
                ),
                "Extra time of the protected operator over the unprotected one, measured side by side "
                "(abft_floor: the bare memory traffic of a check, without its verdict).",
            )
        )
        blocks.append(_rows_table(over, multi, cls="overheads", caption="Checker overheads"))
    return blocks


def _correctness_blocks(df: pd.DataFrame, multi: bool, ids: _Ids) -> list[dict[str, Any]]:
    div = df[df["check"].str.contains("first_divergent")]
    if not len(div):
        return []
    body = []
    for r in div.itertuples():
        cells = [cell(r.run_no)] if multi else []
        cells += [
            status_cell(r.status),
            cell(r.check),
            cell(r.subject, code=True),
            cell(r.dtype),
            cell(r.metric),
            num(r.value),
            num(r.threshold),
            cell(r.detail, "detail"),
        ]
        body.append(row(cells, f"row-{r.status}"))
    headers = (["run"] if multi else []) + [
        "status",
        "check",
        "subject",
        "dtype",
        "metric",
        ("value", "num"),
        ("threshold", "num"),
        "where it diverges",
    ]
    return [
        table(
            headers,
            body,
            cls="divergence",
            caption="First divergent operators: where the device under test first leaves the reference",
        )
    ]


_SUITE_BLOCKS = {
    "numerics": _numerics_blocks,
    "soft_errors": _soft_error_blocks,
    "correctness": _correctness_blocks,
    "selftest": selftest_blocks,
}
#: the statuses counted in a column each (measurements, ``info``, come after the checks column)
_SUMMARY_STATUSES = ("pass", "fail", "inconclusive", "error", "skip")


# ----------------------------------------------------------------------------------------------
# page


def _overload(name: str, overload: str) -> str:
    """The overload without the operator name it repeats (``aten::mm.default`` of ``aten::mm`` -> ``default``)."""
    return overload[len(name) + 1 :] if overload.startswith(name + ".") else overload


def _compact(meta: str) -> str:
    """Shapes or dtypes lists without quotes and with one space after commas, for narrow cells."""
    return re.sub(r",\s*", ", ", meta.replace('"', "").replace("'", ""))


def _finite(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _f(v: Any, default: Any = math.nan) -> float:
    return float(v) if _finite(v) else (float(default) if _finite(default) else math.nan)


def _ratio(a: Any, b: Any) -> float:
    return float(a) / float(b) if _finite(a) and _finite(b) and float(b) > 0 else math.nan


def _pct(v: Any) -> str:
    return f"{float(v) * 100:.1f}%" if _finite(v) else ""


def _comparison(df: pd.DataFrame, run_table: pd.DataFrame) -> dict[str, Any] | None:
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
                direction = "" if not _finite(delta) or delta == 0 else (" up" if delta > 0 else " down")
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
            or any(_finite(r["delta"]) and r["delta"] != 0 for r in recs)
            or len({_finite(r["value"]) for r in recs}) > 1
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
    suite_order = {s: i for i, s in enumerate(dict.fromkeys((*_LEADING, *SUITES)))}
    by_status = {s: int((df["status"] == s).sum()) for s in STATUSES}
    verdict = verdict_of(df)
    ids = _Ids()

    by_suite = status_counts(df)
    by_suite["_o"] = by_suite["suite"].map(lambda s: suite_order.get(s, len(suite_order)))
    by_suite = by_suite.sort_values(["_o"], kind="stable")
    summary_rows = [
        row(
            [cell(SUITE_TITLES.get(r["suite"], r["suite"]))]
            + [num(r[s]) for s in _SUMMARY_STATUSES]
            + [num(r["checks"]), num(r["info"])],
            _bad_row_class(r),
        )
        for r in by_suite.to_dict("records")
    ]
    summary = table(
        ["suite"]
        + [(s, f"num st-{s}") for s in _SUMMARY_STATUSES]
        + [("checks", "num"), ("measurements", "num st-info")],
        summary_rows,
        cls="by-suite",
        caption="checks: rows with a verdict (pass, fail, inconclusive, error); measurements (info) "
        "are shown and never counted as passed checks",
    )
    summary_links = [{"suite": s, "title": SUITE_TITLES.get(s, s)} for s in by_suite["suite"]]

    fails = df[df["status"].isin(BAD_STATUSES)].copy()
    fails["_o"] = fails["suite"].map(lambda s: suite_order.get(s, len(suite_order)))
    fails = fails.sort_values(["_o", "run_no"], kind="stable")
    failures = [
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

    run_rows = [
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

    sections = []
    for suite in by_suite["suite"]:
        sdf = df[df["suite"] == suite]
        c = [(s, f"{n} {STATUS_WORDS[s]}") for s in STATUSES if (n := int((sdf["status"] == s).sum()))]
        if suite == "replay":
            special = _replay_blocks(sdf, inputs.replays, run_table, multi, ids)
        elif suite in _SUITE_BLOCKS:
            special = _SUITE_BLOCKS[suite](sdf, multi, ids)
        else:
            special = []
        all_rows = _rows_table(sdf, multi, cls="results-all", attrs={"data-suite": suite})
        blocks = special + [
            details(
                f"All {len(sdf)} {SUITE_TITLES.get(suite, suite).lower()} rows", [all_rows], open_=not special
            )
        ]
        sections.append(
            {"suite": suite, "title": SUITE_TITLES.get(suite, suite), "counts": c, "blocks": blocks}
        )

    return (
        _env()
        .get_template("report.html.j2")
        .render(
            title=title or _default_title(run_table),
            verdict=verdict,
            headline=_headline(df, len(run_table)),
            nothing_checked=verdict == "NOTHING CHECKED",
            by_status=by_status,
            runs=run_rows,
            multi=multi,
            summary=summary,
            summary_links=summary_links,
            failures=failures,
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
    a verdict), how many passed and failed (inconclusive ones and errors named inside), skips when
    any, measurements apart, then the number of runs."""
    c = count_statuses(df)
    n_error = int((df["status"] == "error").sum())
    inside = [f"{c.inconclusive} inconclusive" if c.inconclusive else "",
              f"{n_error} error{'s' if n_error != 1 else ''}" if n_error else ""]
    inside_text = ", ".join(x for x in inside if x)
    fail_cls = "st-fail" if c.failed > c.inconclusive else ("st-inconclusive" if c.inconclusive else "")
    chips = [
        {"text": f"{c.checks} checks", "cls": ""},
        {"text": f"{c.checks - c.failed} passed", "cls": "st-pass"},
        {"text": f"{c.failed} failed" + (f" ({inside_text})" if inside_text else ""), "cls": fail_cls},
    ]
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
