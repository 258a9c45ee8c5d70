"""The replay section: fidelity (original vs replay step time, coverage), paired rounds, operators.

Built from the replay suite's rows and the replay artifacts found beside them (a run's
summary.json and ops.csv, :class:`..inputs.ReplayArtifacts`):

- a fidelity table and chart, one entry per (run, workload or benchmark);
- per paired replay (``ratio_kind`` ``"paired"`` in summary.json, whose ``timing`` keeps the
  replay and original step time of every round and their ratios) a chart of those ratios with
  their median, its 95% interval and the verdict band; a recorded ratio (replay against the
  trace's recorded step time) gets a one-line note instead;
- per replay with an ops.csv, the time by operator type, its top operators and those not replayed.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

import pandas as pd

from ...placement import placement_words
from ..blocks import (
    Ids,
    as_float,
    chart,
    column,
    finite,
    fmt,
    heading,
    label,
    note,
    ratio,
    records_table,
    run_column,
)
from ..charts import grouped_bars, paired_rounds, stacked_breakdown
from ..inputs import ReplayArtifacts
from .base import SuiteRows

TOP_OPS = 25
TOP_OP_TYPES = 15
#: The verdict band of the paired ratio (mystique.replay.fidelity.RATIO_LOW/HIGH; not imported:
#: that module imports torch).
BAND = (0.90, 1.10)
_FIDELITY = ("original_step_ms", "replay_step_ms", "ratio", "coverage", "coverage_by_time", "device_busy")
#: replay rows whose (check, metric) carry a fidelity figure under another name
_FIDELITY_ALIASES = {
    ("replay_step_time", "median_ms"): "replay_step_ms",
    ("original_step_time", "median_ms"): "original_step_ms",
    ("replay_device_busy", "busy_fraction"): "device_busy",
}
#: ops.csv statuses of an operator that was replayed
_REPLAYED = ("", "replayed", "ok", "pass")


# ----------------------------------------------------------------------------------------------
# fidelity


def _fidelity_entries(rows: SuiteRows, run_no: dict[tuple[str, str], Any]) -> list[dict[str, Any]]:
    """One entry per (run, subject): the fidelity figures of its rows, completed from its summary.json."""
    entries: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in rows.df.itertuples():
        if r.check == "cpu_placement":  # where the timing thread ran (its detail says it in words)
            e = entries.setdefault((r.run_no, r.subject), {"run": r.run_no, "subject": r.subject})
            e.setdefault("placement", str(r.detail).split("; reproduce:")[0].split("; --cpu-affinity")[0])
            continue
        key = r.metric if r.metric in _FIDELITY else _FIDELITY_ALIASES.get((r.check, r.metric))
        if key is None:
            continue
        e = entries.setdefault((r.run_no, r.subject), {"run": r.run_no, "subject": r.subject})
        e.setdefault(key, r.value)
    for art in rows.replays:
        rn = run_no.get((art.run_id, art.device), "")
        e = entries.setdefault((rn, art.label), {"run": rn, "subject": art.label})
        if art.summary:
            for k in _FIDELITY:
                if art.summary.get(k) is not None and not finite(e.get(k)):
                    e[k] = art.summary[k]
            e["ops_total"] = art.summary.get("ops_total")
            e["ops_replayed"] = art.summary.get("ops_replayed")
            e["ops_skipped"] = art.summary.get("ops_skipped") or {}
            e["bound_by"] = art.summary.get("bound_by")
            e["basis"] = (art.summary.get("timing") or {}).get("basis")
            if (art.summary.get("timing") or {}).get("cpu_placement"):
                e["placement"] = placement_words(art.summary["timing"]["cpu_placement"])
    items = list(entries.values())
    for e in items:
        if (
            not finite(e.get("ratio"))
            and finite(e.get("original_step_ms"))
            and finite(e.get("replay_step_ms"))
            and e["original_step_ms"] > 0
        ):
            e["ratio"] = e["replay_step_ms"] / e["original_step_ms"]
    return items


def _bound_text(e: dict[str, Any]) -> str:
    """'host (judged on host timeline)': what bounds the step and the time its verdict judged."""
    bound = e.get("bound_by")
    if not bound:
        return ""
    return f"{bound} (judged on {e['basis']})" if e.get("basis") else str(bound)


def _skipped_text(e: dict[str, Any]) -> str:
    skipped = e.get("ops_skipped") or {}
    text = ", ".join(f"{k}×{v}" for k, v in sorted(skipped.items(), key=lambda kv: -kv[1])[:6])
    return text + (f", … ({len(skipped)} kinds)" if len(skipped) > 6 else "")


def _ops_text(e: dict[str, Any]) -> str:
    return f"{fmt(e.get('ops_replayed'))} / {fmt(e.get('ops_total'))}" if finite(e.get("ops_total")) else ""


def _fidelity_blocks(items: list[dict[str, Any]], multi: bool, ids: Ids) -> list[dict[str, Any]]:
    """The step-time chart (entries with a time) and the fidelity table of every entry."""
    out: list[dict[str, Any]] = []
    timed = [e for e in items if finite(e.get("original_step_ms")) or finite(e.get("replay_step_ms"))]
    if timed:
        svg = grouped_bars(
            [label(e["run"], multi, e["subject"]) for e in timed],
            {
                "original step": [as_float(e.get("original_step_ms")) for e in timed],
                "replay step": [as_float(e.get("replay_step_ms")) for e in timed],
            },
            xlabel="step time (ms, median)",
            title="Original vs replay step time",
            uid=ids(),
        )
        out.append(chart(svg, "Median step time of the captured workload and of its replay, same device."))
    columns = run_column(multi, "run") + [
        column("workload / benchmark", "subject"),
        column("original ms", lambda e: e.get("original_step_ms"), "num"),
        column("replay ms", lambda e: e.get("replay_step_ms"), "num"),
        column("ratio", lambda e: e.get("ratio"), "num"),
        column("coverage", lambda e: e.get("coverage"), "pct"),
        column("coverage by time", lambda e: e.get("coverage_by_time"), "pct"),
        column("device busy", lambda e: e.get("device_busy"), "pct"),
        column("bound by", _bound_text, "detail"),
        column("CPU placement", lambda e: e.get("placement") or "", "detail"),
        column("ops replayed", _ops_text, "num"),
        column("skipped ops", _skipped_text, "detail"),
    ]
    out.append(records_table(items, columns, row_cls=None, cls="fidelity",
                             caption="Replay fidelity (ratio = replay / original)"))
    return out


# ----------------------------------------------------------------------------------------------
# paired rounds


def _num(v: Any) -> float:
    """A JSON number of summary.json as a float; NaN for anything else (a bool, a string, null, inf)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan


def _nums(v: Any) -> list[float]:
    return [_num(x) for x in v] if isinstance(v, (list, tuple)) else []


def _r(v: float) -> str:
    return f"{v:.3f}" if math.isfinite(v) else "n/a"


def paired_caption(summary: dict[str, Any]) -> str:
    """'N paired rounds (warm-up W), ratio R [lo, hi], verdict V, stopped: S, clock C, T threads'."""
    t = summary.get("timing") or {}
    ratios = [x for x in _nums(t.get("ratios")) if math.isfinite(x)]
    n = t.get("rounds") if isinstance(t.get("rounds"), int) else len(ratios)
    mid = _num(summary.get("ratio"))
    if not math.isfinite(mid) and ratios:
        mid = statistics.median(ratios)
    parts = [
        f"{n} paired rounds (warm-up {fmt(t.get('warmup_rounds')) or '?'})",
        f"ratio {_r(mid)} [{_r(_num(summary.get('ratio_low')))}, {_r(_num(summary.get('ratio_high')))}]",
        f"verdict {summary.get('verdict') or 'none'}",
        f"stopped: {t.get('stop') or 'unknown'}",
        f"clock {t.get('clock') or 'unknown'}",
    ]
    if t.get("basis"):
        parts.append(f"judged on the {t['basis']} ({summary.get('bound_by') or '?'}-bound step)")
    threads = t.get("threads")
    if threads is not None:
        parts.append(f"{fmt(threads)} thread{'' if threads == 1 else 's'}")
    return ", ".join(parts)


def paired_round_blocks(art: ReplayArtifacts, name: str, ids: Ids) -> list[dict[str, Any]]:
    """The blocks of one replay: the paired-rounds chart, the recorded-ratio note, or nothing."""
    s = art.summary or {}
    kind = s.get("ratio_kind")
    t = s.get("timing") or {}
    if kind == "recorded":
        why = t.get("why_not_paired")
        return [
            note(
                f"{name}: ratio {_r(_num(s.get('ratio')))} is recorded (replay against the step time the "
                f"trace recorded), not paired" + (f" ({why})" if why else "") + "; no interval, no verdict."
            )
        ]
    if kind != "paired":
        return []
    ratios = _nums(t.get("ratios"))
    caption = paired_caption(s)
    if not any(math.isfinite(x) for x in ratios):
        return [note(f"{name}: {caption} (no per-round ratios kept).")]
    median = _num(s.get("ratio"))
    if not math.isfinite(median):
        median = statistics.median(x for x in ratios if math.isfinite(x))
    svg = paired_rounds(
        ratios,
        median=median,
        low=_num(s.get("ratio_low")),
        high=_num(s.get("ratio_high")),
        band=BAND,
        replay_ms=_nums(t.get("replay_ms")),
        original_ms=_nums(t.get("original_ms")),
        title=f"Paired rounds of {name}",
        uid=ids(),
    )
    return [
        chart(
            svg,
            f"{name}: {caption}. Points: replay / original step time of each round; line: their median; "
            f"shaded: its 95% interval; dashed: the {BAND[0]:.2f}-{BAND[1]:.2f} verdict band. "
            "Below: both step times per round.",
        )
    ]


# ----------------------------------------------------------------------------------------------
# operators


def _overload(name: str, overload: str) -> str:
    """The overload without the operator name it repeats (``aten::mm.default`` of ``aten::mm`` -> ``default``)."""
    return overload[len(name) + 1 :] if overload.startswith(name + ".") else overload


def _compact(meta: str) -> str:
    """Shapes or dtypes lists without quotes and with one space after commas, for narrow cells."""
    return re.sub(r",\s*", ", ", meta.replace('"', "").replace("'", ""))


def _breakdown(named: list[tuple[str, ReplayArtifacts]], ids: Ids) -> list[dict[str, Any]]:
    """The chart of summed operator times by operator name, original and replay of each replay."""
    bars: dict[str, dict[str, float]] = {}
    for name, art in named:
        for kind in ("original", "replay"):
            col = f"{kind}_ms"
            if art.ops[col].notna().any():
                bars[f"{name} {kind}"] = art.ops.groupby("name", sort=False)[col].sum(min_count=1).dropna().to_dict()
    if not bars:
        return []
    svg = stacked_breakdown(bars, xlabel="time per step (ms)", title="Time by operator type", uid=ids())
    return [chart(svg, "Summed operator times of one iteration, by operator name (largest types; the rest as other).")]


def _op_types_table(ops: pd.DataFrame) -> dict[str, Any]:
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
    columns = [
        column("operator type", "name", "code"),
        column("count", "count", "num"),
        column("original ms", "original_ms", "num"),
        column("replay ms", "replay_ms", "num"),
        column("replay / original", lambda t: ratio(t.replay_ms, t.original_ms), "num"),
        column("share of replay",
               lambda t: f"{t.replay_ms / total * 100:.1f}%" if total > 0 and finite(t.replay_ms) else "", "num"),
    ]
    return records_table(by_type.itertuples(), columns, row_cls=None, cls="optypes",
                         caption=f"Top {len(by_type)} operator types of {ops['name'].nunique()} by time")


def _top_ops_table(ops: pd.DataFrame) -> dict[str, Any]:
    timed = ops.assign(key=ops[["original_ms", "replay_ms"]].max(axis=1)).dropna(subset=["key"])
    top = timed.sort_values("key", ascending=False, kind="stable").head(TOP_OPS)
    columns = [
        column("#", "index", "num"),
        column("operator", "name", "code"),
        column("overload", lambda o: _overload(o.name, o.overload)),
        column("input shapes", lambda o: _compact(o.input_shapes), "detail"),
        column("input dtypes", lambda o: _compact(o.input_dtypes), "detail"),
        column("original ms", "original_ms", "num"),
        column("replay ms", "replay_ms", "num"),
        column("replay / original", lambda o: ratio(o.replay_ms, o.original_ms), "num"),
    ]
    return records_table(top.itertuples(), columns, cls="ops",
                         row_cls=lambda o: "row-slow" if ratio(o.replay_ms, o.original_ms) > 2 else "",
                         caption=f"Top {len(top)} of {len(timed)} timed operators by time")


def _not_replayed_table(ops: pd.DataFrame) -> list[dict[str, Any]]:
    missed = ops[~ops["status"].isin(_REPLAYED)]
    if not len(missed):
        return []
    shown = missed.head(TOP_OPS * 2)
    more = f" (first {len(shown)})" if len(missed) > len(shown) else ""
    columns = [column("#", "index", "num"), column("operator", "name", "code"),
               column("status", "status"), column("reason", "reason", "detail")]
    return [records_table(shown.itertuples(), columns, row_cls=None, cls="not-replayed",
                          caption=f"{len(missed)} operators not replayed{more}")]


def _operator_blocks(named: list[tuple[str, ReplayArtifacts]], ids: Ids) -> list[dict[str, Any]]:
    """Per replay with an ops.csv: the time by operator type, the top operators, those not replayed."""
    with_ops = [(name, art) for name, art in named if art.ops is not None and len(art.ops)]
    if not with_ops:
        return []
    out = _breakdown(with_ops, ids)
    for name, art in with_ops:
        out += [heading(f"Operators of {name}"), _op_types_table(art.ops), _top_ops_table(art.ops)]
        out += _not_replayed_table(art.ops)
    return out


def blocks(rows: SuiteRows) -> list[dict[str, Any]]:
    """Fidelity, then each replay's paired rounds, then each replay's operators."""
    run_no = {(r.run_id, r.device): r.run for r in rows.run_table.itertuples()}
    named = [(label(run_no.get((a.run_id, a.device), ""), rows.multi, a.label), a) for a in rows.replays]
    items = _fidelity_entries(rows, run_no)
    out = _fidelity_blocks(items, rows.multi, rows.ids) if items else []
    for name, art in named:
        out += paired_round_blocks(art, name, rows.ids)
    return out + _operator_blocks(named, rows.ids)
