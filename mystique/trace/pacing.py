"""Host gaps between ops from a light profile, for ``--pacing recorded``.

The Kineto trace recorded beside an execution trace (``kineto.json.gz``) shares its step with the
ET observer, and the observer's work (serialising every op's inputs) lands in the gaps between ops:
replaying those gaps would pace a step slower than it ran. A capture therefore records more steps
under the Kineto profiler alone (``pacing.json.gz``: CPU events, no shapes; one in captures made
before several were, :func:`step_timelines` splits them; the replay paces the step of median
length). Its events carry no record-function ids, so its ops are matched to the ET-joined Kineto
events by order: both runs of the step call the same operators in the same order, and
:func:`align_spans` pairs the two name sequences (longest matching blocks), so an op missing from
one side shifts nothing after it.
"""

from __future__ import annotations

import bisect
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import beside, read_json_document
from .kineto import CPU_CATEGORIES, KinetoTimes

PACING_FILE_NAMES = ("pacing.json.gz", "pacing.json")
# below this share of matched ops the two runs did not do the same thing: the light timeline is not used
MIN_MATCHED = 0.9
# longer sequences are not aligned (difflib's matching is quadratic in the worst case)
MAX_ALIGNED_OPS = 200_000

Span = tuple[float, float]


def find_pacing(trace_path: str | os.PathLike) -> Path | None:
    """The pacing trace beside a trace file (or in a trace dir), or None."""
    return beside(trace_path, PACING_FILE_NAMES)


def read_timeline(path: str | os.PathLike) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of every host op event of a Kineto trace, in start order
    (an enclosing op before the ops it encloses); ``ProfilerStep#N`` regions left out."""
    doc = read_json_document(Path(path), what="Kineto pacing trace")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    out = []
    for ev in events if isinstance(events, list) else ():
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") not in CPU_CATEGORIES:
            continue
        name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur")
        if (isinstance(name, str) and not name.startswith("ProfilerStep#")
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ts, dur))):
            out.append((name, float(ts), float(ts) + float(dur)))
    out.sort(key=lambda e: (e[1], -e[2]))
    return out


@dataclass(frozen=True)
class StepTimeline:
    """One ``ProfilerStep#N`` of a light profile: its span (us) and the host op events that started
    within it, ``(name, start_us, end_us)`` in start order (as :func:`read_timeline` orders them)."""

    start: float
    end: float
    ops: list[tuple[str, float, float]]

    @property
    def dur(self) -> float:
        return self.end - self.start


def step_timelines(path: str | os.PathLike) -> list[StepTimeline]:
    """Each recorded step of a light profile, in time order (a capture records several, see
    :func:`mystique.capture.record_pacing`); a profile with no ``ProfilerStep#N`` region is one step
    spanning all its ops (an empty list when it holds no op)."""
    timeline = read_timeline(path)
    doc = read_json_document(Path(path), what="Kineto pacing trace")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    spans = sorted({(float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
                    for ev in (events if isinstance(events, list) else ())
                    if isinstance(ev, dict) and ev.get("ph") == "X" and ev.get("cat") in CPU_CATEGORIES
                    and isinstance(ev.get("name"), str) and ev["name"].startswith("ProfilerStep#")
                    and all(isinstance(ev.get(k), (int, float)) and not isinstance(ev.get(k), bool) for k in ("ts", "dur"))})
    if not spans:
        return [StepTimeline(timeline[0][1], max(e[2] for e in timeline), timeline)] if timeline else []
    starts = [a for a, _ in spans]
    by_step: list[list[tuple[str, float, float]]] = [[] for _ in spans]
    for ev in timeline:
        k = bisect.bisect_right(starts, ev[1]) - 1
        if k >= 0 and ev[1] <= spans[k][1]:
            by_step[k].append(ev)
    return [StepTimeline(a, b, ops) for (a, b), ops in zip(spans, by_step) if ops]


def median_step(steps: list[StepTimeline]) -> StepTimeline | None:
    """The step of median duration (the lower median of an even count), None for none."""
    if not steps:
        return None
    return sorted(steps, key=lambda s: s.dur)[(len(steps) - 1) // 2]


def align_spans(reference: KinetoTimes, timeline: list[tuple[str, float, float]]) -> tuple[dict[int, Span], float]:
    """rf_id (of ``reference``, the ET-joined trace) -> the span of the same op in ``timeline``, and
    the share of the reference's ops matched."""
    ref = sorted(((span[0], -span[1], rf) for rf, span in reference.cpu_spans_us.items()
                  if not reference.names.get(rf, "").startswith("ProfilerStep#")))
    if not ref or not timeline or max(len(ref), len(timeline)) > MAX_ALIGNED_OPS:
        return {}, 0.0
    ref_names = [reference.names.get(rf, "") for _, _, rf in ref]
    matcher = difflib.SequenceMatcher(None, ref_names, [e[0] for e in timeline], autojunk=False)
    spans: dict[int, Span] = {}
    for a, b, n in matcher.get_matching_blocks():
        for k in range(n):
            spans[ref[a + k][2]] = (timeline[b + k][1], timeline[b + k][2])
    return spans, len(spans) / len(ref)


def pacing_spans(trace_path: str | os.PathLike, reference: Any) -> tuple[dict[int, Span] | None, str]:
    """The per-op host spans ``--pacing recorded`` reproduces, and where they came from.

    From the light profile (:func:`find_pacing`) when one is there and matches the reference; else
    None (the caller keeps the reference's own spans) with the reason."""
    path = find_pacing(trace_path)
    if path is None or not isinstance(reference, KinetoTimes):
        return None, "kineto.json.gz (recorded beside the execution-trace observer: gaps include its work)"
    # a capture records several light steps: the gaps of the one of median length (read_timeline's
    # whole file for a profile with no step region)
    step = median_step(step_timelines(path))
    spans, matched = align_spans(reference, step.ops if step is not None else [])
    if matched < MIN_MATCHED:
        return None, (f"kineto.json.gz: {path.name} matched only {matched:.0%} of the ops (under "
                      f"{MIN_MATCHED:.0%}), so its gaps were not used; gaps include the observer's work")
    return spans, f"{path.name} (one step under the Kineto profiler alone; {matched:.0%} of ops matched)"
