"""Operator times from a capture's light profile (``pacing.json.gz``): each op's median over the
profile's steps, less the profiler's own cost per recorded event.

A capture records several steps under the Kineto profiler alone (:data:`mystique.capture.PACING_STEPS`;
older captures one). Each step is matched to the execution trace's ops by order
(:func:`mystique.trace.pacing.align_spans`), and for each of the plan's operators it gives the
operator's host span, the gap before it (from the end of the previous operator on its thread) and
the step's lead and tail (from the step's start to its first operator, from its last to its end).
The step the graph is built from takes, for each of these, the median over the matched steps: a
step that ran slow as a whole (the first after the execution trace was written) or an operator
preempted in one step sets nothing.

The profiler's cost (``c`` us per recorded event, measured at capture time by
:mod:`mystique.trace.profiler_cost`; 0 for a capture made before it was) is taken out event by event,
where it fell: every event that started inside an operator's span (the operators it called) costs
that operator ``c``; the operator's own event and every event between two operators (a wrapper such
as an autograd node's, whose entry and exit lie outside the operators it encloses) cost the gap
before the next operator ``c``, and the events before the first operator and after the last the
step's lead and tail. Where a gap is shorter than what it is charged, the rest comes off the
operator after it; no time goes below 0. The step so corrected is the profiled step less
``c x`` (the events it recorded), whatever the split.

The medians are then scaled by one factor per capture so that they add up to the median step. An
op's time varies from step to step mostly by what only adds time (preemption, a cold cache, a lower
clock), so its distribution leans right and its median lies below its mean; the median of a sum of
many such parts lies near the sum of their means, above the sum of their medians. Summed as they
are, the medians would predict a step shorter than the steps they came from: in the 9 reference
captures of issue #35 (run4 and a rebuilt dlrm train) they summed 0.1% to 7.5% below the median of
the steps' own totals, in every one, and the self-prediction errors leaned negative by as much.
The step is judged by its median (the reference is the median of plain steps), so each time is
multiplied by ``k = median over the steps of (the step's total / the medians summed over the same
op times)``: the total is the median step's (a slow step still sets nothing), split among the ops,
gaps, lead and tail as their medians are. ``k`` is 1 for one step.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..trace.pacing import MIN_MATCHED, StepTimeline, median_step, step_timelines

Span = tuple[float, float]


@dataclass
class LightTimes:
    """What the light profile gives the step (times in us, per op index of the plan)."""

    host_us: dict[int, float] = field(default_factory=dict)
    gap_us: dict[int, float] = field(default_factory=dict)
    lead_us: float = 0.0
    tail_us: float = 0.0
    steps: int = 0  # steps matched and used
    recorded: int = 0  # steps the profile holds
    matched: float = 0.0  # the smallest share of the trace's ops matched in a used step
    events: int = 0  # events per step (median) the correction took out
    cost_us: float | None = None  # the per-event cost taken out (None: the capture recorded none)
    scale: float = 1.0  # the factor that makes the medians add up to the median step (module docstring)

    def describe(self, name: str) -> str:
        steps = (f"median of {self.steps} steps" if self.steps > 1 else "its one step") + (
            f" ({self.recorded - self.steps} of {self.recorded} not matched)" if self.recorded > self.steps else "")
        cost = ("; no per-event profiler cost recorded (a capture made before it was measured)" if self.cost_us is None
                else f"; the profiler's {self.cost_us:.3g} us per event taken out ({self.events} events per step)")
        scaled = ("" if self.scale == 1.0 else
                  f"; the medians scaled by {self.scale:.4f} to add up to the median step's total")
        return f"{name} (the step under the Kineto profiler alone, {steps}, {self.matched:.0%} matched{cost}{scaled})"


@dataclass
class _StepOps:
    host: list[float | None]
    gap: list[float | None]
    lead: float
    tail: float
    events: int


def _one_step(st: StepTimeline, aligned: dict[int, Span], rfs: list[int | None], threads: list[Any],
              cost: float) -> _StepOps | None:
    """One matched step's op times, corrected for the profiler's cost (see the module docstring)."""
    n = len(rfs)
    spans: list[Span | None] = [aligned.get(rf) if rf is not None else None for rf in rfs]
    known = sorted((i for i in range(n) if spans[i] is not None), key=lambda i: spans[i][0])
    if not known:
        return None
    host: list[float | None] = [(s[1] - s[0]) if s is not None else None for s in spans]
    gap: list[float | None] = [None] * n
    for i in range(1, n):
        a, b = spans[i - 1], spans[i]
        if a is not None and b is not None and threads[i] == threads[i - 1]:
            gap[i] = max(0.0, b[0] - a[1])
    lead = max(spans[known[0]][0] - st.start, 0.0)  # known[0]: the op that starts first
    tail = max(st.end - max(spans[i][1] for i in known), 0.0)
    n_in = [0] * n
    n_gap = [0] * n
    n_lead = n_tail = 0
    starts = [spans[i][0] for i in known]
    for _name, t, _end in st.ops:
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0 and t <= spans[known[k]][1]:
            n_in[known[k]] += 1  # inside op known[k]'s span (its own event too: moved to its gap below)
        elif k + 1 < len(known):
            n_gap[known[k + 1]] += 1
        else:
            n_tail += 1 if k >= 0 else 0
            n_lead += 1 if k < 0 else 0
    for i in known:
        if n_in[i]:
            n_in[i] -= 1
            n_gap[i] += 1
    if cost > 0:
        for i in known:
            take_gap = cost * n_gap[i]
            h = host[i] - cost * n_in[i]
            if gap[i] is not None:
                g = gap[i] - take_gap
                gap[i] = max(g, 0.0)
                h += min(g, 0.0)
            elif i == known[0]:
                n_lead += n_gap[i]  # the first op's gap is the step's lead
            else:
                h -= take_gap
            host[i] = max(h, 0.0)
        lead = max(lead - cost * n_lead, 0.0)
        tail = max(tail - cost * n_tail, 0.0)
    return _StepOps(host, gap, lead, tail, len(st.ops))


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


Matched = list[tuple[StepTimeline, dict[int, Span], float]]


def match_steps(pacing: Path, kin: Any, align: Any) -> tuple[Matched, int, dict[int, Span] | None]:
    """The light profile's steps that match the trace (``align(kin, timeline) -> (rf_id -> span,
    share matched)``, each kept at :data:`MIN_MATCHED` or more), how many it recorded, and the spans of
    the matched step of median length (the plan's gaps, as ``--pacing recorded`` paces them)."""
    steps = step_timelines(pacing)
    used: Matched = []
    for st in steps:
        aligned, matched = align(kin, st.ops)
        if matched >= MIN_MATCHED:
            used.append((st, aligned, matched))
    mid = median_step([st for st, _al, _m in used])
    return used, len(steps), next((al for st, al, _m in used if st is mid), None)


def light_times(used: Matched, recorded: int, plan_ops: list[dict[str, Any]], threads: list[Any],
                cost_us: float | None) -> LightTimes | None:
    """The plan's op times from the matched light steps (see the module docstring; ``threads``: each
    op's thread, ``cost_us``: the profiler's cost per event, None when the capture recorded none), or
    None when no step gives any op a time."""
    cost = cost_us or 0.0
    rfs = [op.get("rf_id") for op in plan_ops]
    per = [r for st, al, _m in used if (r := _one_step(st, al, rfs, threads, cost)) is not None]
    if not per:
        return None
    out = LightTimes(steps=len(per), recorded=recorded, matched=min(m for _st, _al, m in used), cost_us=cost_us,
                     events=int(statistics.median(p.events for p in per)))
    for i, op in enumerate(plan_ops):
        h = _median([p.host[i] for p in per])
        if h is not None:
            out.host_us[op["index"]] = h
        g = _median([p.gap[i] for p in per])
        if g is not None:
            out.gap_us[op["index"]] = g
    out.lead_us = statistics.median(p.lead for p in per)
    out.tail_us = statistics.median(p.tail for p in per)
    k = median_step_scale(per, plan_ops, out)
    if k != 1.0:
        out.scale = k
        out.host_us = {i: v * k for i, v in out.host_us.items()}
        out.gap_us = {i: v * k for i, v in out.gap_us.items()}
        out.lead_us *= k
        out.tail_us *= k
    return out


def median_step_scale(per: list[_StepOps], plan_ops: list[dict[str, Any]], med: LightTimes) -> float:
    """``k``: the median over the steps of each step's total over its op times, gaps, lead and tail,
    divided by the medians summed over the same times (see the module docstring); 1 where undefined."""
    ratios = []
    for p in per:
        total = p.lead + p.tail
        summed = med.lead_us + med.tail_us
        for i, op in enumerate(plan_ops):
            if p.host[i] is not None and op["index"] in med.host_us:
                total += p.host[i]
                summed += med.host_us[op["index"]]
            if p.gap[i] is not None and op["index"] in med.gap_us:
                total += p.gap[i]
                summed += med.gap_us[op["index"]]
        if summed > 0 and total > 0:
            ratios.append(total / summed)
    return statistics.median(ratios) if ratios else 1.0


__all__ = ["LightTimes", "light_times", "match_steps"]
