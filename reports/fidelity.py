"""The paired-rounds part of the replay section: per paired replay, a chart of the ratio of each round.

A replay's summary.json (``mystique replay``) keeps, under ``timing`` when ``ratio_kind`` is
``"paired"``, the replay and original step time of every round and their ratios; the chart shows
those ratios with their median, its 95% interval and the verdict band. A recorded ratio (replay
against the trace's recorded step time) gets a one-line note instead. Never imports torch.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from . import charts
from .blocks import Ids, chart, fmt, note
from .inputs import ReplayArtifacts

#: The verdict band of the paired ratio (mystique.replay.fidelity.RATIO_LOW/HIGH; not imported:
#: that module imports torch).
BAND = (0.90, 1.10)


def _num(v: Any) -> float:
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
    ratio = _num(summary.get("ratio"))
    if not math.isfinite(ratio) and ratios:
        ratio = statistics.median(ratios)
    parts = [
        f"{n} paired rounds (warm-up {fmt(t.get('warmup_rounds')) or '?'})",
        f"ratio {_r(ratio)} [{_r(_num(summary.get('ratio_low')))}, {_r(_num(summary.get('ratio_high')))}]",
        f"verdict {summary.get('verdict') or 'none'}",
        f"stopped: {t.get('stop') or 'unknown'}",
        f"clock {t.get('clock') or 'unknown'}",
    ]
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
    svg = charts.paired_rounds(
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
