"""The execution graph of one step, from a capture (execution trace + Kineto trace) or from a
benchmark (its plan, timed by the capture it came from or by its replay's ``ops.csv``).

What the graph holds (:func:`build_graph`, tasks of :mod:`.sim`):

- each host thread's operators in execution order (lane ``host:<tid>``), each preceded by its host
  gap (the time between operators: Python, the framework; class ``host``), and the step's lead and
  tail (from the step's start to its first operator, and from its last to its end);
- each operator's kernels on their device streams (lane ``stream:<id>``), launched at the point of
  the operator's host span where the trace saw the launch; a stream runs its kernels in order;
- data dependencies: an operator on another thread, or a kernel on another stream, waits for the
  producer of each of its input tensors;
- synchronisations: an operator that blocked on the device (a sync call in its span) is split at
  that point, and its remainder waits for every kernel launched so far;
- collectives: communication operators and NCCL kernels, class ``communication``, on their stream.

Host times come from the lightest profile the capture holds: ``pacing.json.gz`` (steps under the
Kineto profiler alone, matched to the trace by :mod:`mystique.trace.pacing`; each op's median over
them, less the profiler's measured cost per event: :mod:`.light`), else the Kineto trace
recorded with the execution-trace observer, else the plan's recorded times or an ``ops.csv``'s
replay times. Everything read is untrusted: a malformed file is a :class:`UsageError` naming it.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..io import show
from ..replay.capture_info import find_kineto, read_capture
from ..replay.plan import Plan, build_plan, plan_from_path
from ..trace.files import read_json_document
from ..trace.kineto import parse_kineto_document
from ..trace.loader import load_trace
from ..trace.pacing import align_spans, find_pacing
from ..trace.profiler_cost import event_cost_us
from .kernels import DeviceWork, Kernel, device_work
from .light import light_times, match_steps
from .opmodel import kernel_class, op_class, tensor_ids
from .sim import Graph, Task

_MAX_OPS_CSV_BYTES = 256 * 1024**2


@dataclass
class OpTiming:
    """One operator of the step as the graph sees it (times in microseconds)."""

    index: int
    name: str
    cls: str
    lane: str
    host_us: float
    gap_us: float
    kernels: list[Kernel] = field(default_factory=list)
    syncs: list[float] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)


@dataclass
class Step:
    """A step read from a capture or a benchmark: its plan, its operators' timings and where they came from."""

    plan: Plan
    kind: str  # "trace" | "benchmark"
    ops: list[OpTiming]
    lead_us: float = 0.0
    tail_us: float = 0.0
    capture: dict[str, Any] | None = None
    times_from: str = ""
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def on_device(self) -> bool:
        return any(o.kernels for o in self.ops)


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None


def _align(kin: Any, timeline: list[tuple[str, float, float]]) -> tuple[dict[int, tuple[float, float]], float]:
    """rf_id -> its span in the light profile: one to one where both runs called the same operators in
    the same order (the usual case, linear), else :func:`mystique.trace.pacing.align_spans`."""
    ref = sorted((span[0], -span[1], rf) for rf, span in kin.cpu_spans_us.items()
                 if not kin.names.get(rf, "").startswith("ProfilerStep#"))
    if ref and len(ref) == len(timeline) and all(kin.names.get(r[2], "") == e[0] for r, e in zip(ref, timeline)):
        return {r[2]: (e[1], e[2]) for r, e in zip(ref, timeline)}, 1.0
    return align_spans(kin, timeline)


def _ops_csv_times(path: str | os.PathLike, n_ops: int) -> list[float | None]:
    """``replay_us`` by op index from a replay's ops.csv (UsageError when it is not one)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{show(p)}: no such ops.csv")
    if p.stat().st_size > _MAX_OPS_CSV_BYTES:
        raise UsageError(f"{show(p)}: larger than {_MAX_OPS_CSV_BYTES >> 20} MiB: not a replay's ops.csv")
    out: list[float | None] = [None] * n_ops
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if not reader.fieldnames or not {"index", "replay_us"} <= set(reader.fieldnames):
                raise UsageError(f"{show(p)}: not a replay ops.csv (needs columns index and replay_us)")
            for k, row in enumerate(reader, start=2):
                try:
                    i = int(row["index"])
                    v = float(row["replay_us"]) if row["replay_us"] not in ("", None) else math.nan
                except (TypeError, ValueError) as exc:
                    raise UsageError(f"{show(p)} line {k}: index or replay_us is not a number") from exc
                if not 0 <= i < n_ops:
                    raise UsageError(f"{show(p)} line {k}: op index {i} is not one of the benchmark's {n_ops} ops")
                out[i] = _finite(v)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"{show(p)}: not a readable CSV: {type(exc).__name__}") from exc
    return out


def load_step(path: str | os.PathLike, *, ops_csv: str | os.PathLike | None = None, iteration: int | None = None,
              allow_ops: tuple[str, ...] = ()) -> Step:
    """Read a capture folder, an ET file or a benchmark (with ``ops_csv``: its replay's op times)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{show(p)} does not exist")
    is_bench = (p.is_dir() and (p / "benchmark.json").is_file()) or (p.is_file() and p.name == "benchmark.json")
    if is_bench:
        plan, _ = plan_from_path(p, None, allow_ops)
        return _benchmark_step(plan, p, ops_csv)
    if ops_csv is not None:
        raise UsageError("--ops applies to a benchmark: a capture's op times are its own")
    trace = load_trace(p)
    kin_path = find_kineto(p)
    kin = doc = None
    if kin_path is not None:
        doc = read_json_document(kin_path, what="Kineto trace")
        kin = parse_kineto_document(doc, source=str(kin_path))
    spans, source = None, "kineto.json.gz (recorded beside the execution-trace observer)"
    pacing = find_pacing(p)
    matched_steps, recorded = [], 0
    if kin is not None and pacing is not None:
        matched_steps, recorded, spans = match_steps(pacing, kin, _align)
        if spans is not None:
            source = f"{pacing.name} (the step under the Kineto profiler alone)"
    capture = read_capture(p)
    plan = build_plan(trace, iteration, kineto_times=kin, capture=capture, allow_ops=allow_ops,
                      gaps=(spans, source) if kin is not None else None)
    light = None
    if matched_steps:
        threads = [getattr(trace.nodes.get(op.get("node_id")), "tid", None) for op in plan.ops]
        light = light_times(matched_steps, recorded, plan.ops, threads, event_cost_us(capture))
        if light is not None:
            source = light.describe(pacing.name)
    work = device_work(doc) if doc is not None else DeviceWork()
    step = Step(plan, "trace", [], capture=capture, times_from=source if kin is not None else "", source=str(p))
    node_rfs = {}  # outermost op -> every rf_id of its subtree (its kernels and syncs)
    for op in plan.ops:
        nid = op.get("node_id")
        if nid in trace.nodes:
            node_rfs[op["index"]] = [n.rf_id for n in trace.preorder(nid) if n.rf_id is not None]
    all_spans = spans if spans is not None else (kin.cpu_spans_us if kin is not None else {})
    for op in plan.ops:
        rf = op.get("rf_id")
        host = light.host_us.get(op["index"]) if light is not None else None
        if host is None and rf in all_spans:
            a, b = all_spans[rf]
            host = b - a
        if host is None and kin is not None and rf in kin.cpu_us:
            host = kin.cpu_us[rf]
        if host is None:
            host = _finite(op.get("orig_us"))
        node = trace.nodes.get(op.get("node_id"))
        t = _op_timing(op, host, f"host:{node.tid if node is not None and node.tid is not None else 0}")
        if light is not None:
            t.gap_us = light.gap_us.get(op["index"], 0.0)
        for r in node_rfs.get(op["index"], []):
            t.kernels.extend(work.kernels.get(r, []))
            t.syncs.extend(work.syncs.get(r, []))
        step.ops.append(t)
    if light is not None:
        step.lead_us, step.tail_us = light.lead_us, light.tail_us
    if work.unlinked:
        step.notes.append(f"{work.unlinked} device events link to no operator (left out)")
    _check_times(step)
    return step


def _op_timing(op: dict[str, Any], host: float | None, lane: str) -> OpTiming:
    ins = tensor_ids([op.get("args", []), list((op.get("kwargs") or {}).values())])
    outs = tensor_ids([op.get("outputs", [])])
    return OpTiming(op["index"], str(op.get("name", "")), op_class(str(op.get("name", ""))), lane,
                    host if host is not None else math.nan, _finite(op.get("gap_us")) or 0.0, inputs=ins, outputs=outs)


def _benchmark_step(plan: Plan, p: Path, ops_csv: str | os.PathLike | None) -> Step:
    replay = _ops_csv_times(ops_csv, len(plan.ops)) if ops_csv is not None else None
    step = Step(plan, "benchmark", [], capture=None, source=str(p),
                times_from=f"{show(Path(ops_csv))} (replay times)" if ops_csv is not None
                else "the benchmark's recorded op times (the capture's Kineto trace)")
    for op in plan.ops:
        host = replay[op["index"]] if replay is not None else _finite(op.get("orig_us"))
        t = _op_timing(op, host, "host:0")
        if replay is not None:
            t.gap_us = 0.0  # a replay runs its ops back to back
        step.ops.append(t)
    _check_times(step)
    return step


def _check_times(step: Step) -> None:
    missing = [o for o in step.ops if not math.isfinite(o.host_us)]
    if not step.ops:
        raise UsageError(f"{show(step.source)}: the step holds no operator")
    if len(missing) == len(step.ops):
        raise UsageError(f"{show(step.source)}: no operator has a recorded time (no Kineto trace beside the "
                         "execution trace): generate a benchmark from it, replay that, and predict the benchmark with --ops REPLAY_OUT/ops.csv")
    for o in missing:
        o.host_us = 0.0
    if missing:
        step.notes.append(f"{len(missing)} of {len(step.ops)} ops have no recorded time (counted as 0)")


def build_graph(step: Step) -> Graph:
    """The execution graph of ``step`` (see the module docstring)."""
    g = Graph(source=step.source, notes=list(step.notes))
    producer: dict[int, tuple[str, int]] = {}  # tensor id -> (lane, task) of its producer's last task
    kernel_of: dict[int, tuple[str, int]] = {}  # tensor id -> (stream, kernel task) that produced it
    last_kernel: dict[str, int] = {}  # stream -> its last kernel task
    device = step.on_device
    lanes = list(dict.fromkeys(o.lane for o in step.ops)) or ["host:0"]
    if step.lead_us > 0:
        g.add(Task("step lead", "host", lanes[0], step.lead_us))
    for o in step.ops:
        if o.gap_us > 0:
            g.add(Task("gap", "host", o.lane, o.gap_us, op=o.index))
        deps = tuple((t, None) for i in o.inputs if (pl := producer.get(i)) is not None and pl[0] != o.lane
                     for t in (pl[1],))
        cls = "host" if device and o.cls != "communication" else o.cls
        cut = min(o.syncs) if o.syncs else None
        pre = o.host_us * cut if cut is not None else o.host_us
        host_task = g.add(Task(o.name, cls, o.lane, pre, deps, op=o.index))
        for k in o.kernels:
            kdeps = [(host_task, k.launch * o.host_us)]
            kdeps += [(t, None) for i in o.inputs if (pk := kernel_of.get(i)) is not None and pk[0] != k.stream
                      for t in (pk[1],)]
            kc = kernel_class(k.name)
            kt = g.add(Task(k.name, kc if kc != "memory" else (o.cls if o.cls != "host" else "memory"), f"stream:{k.stream}",
                            k.dur_us, tuple(kdeps), op=o.index))
            last_kernel[k.stream] = kt
            for i in o.outputs:
                kernel_of[i] = (k.stream, kt)
        last = host_task
        if cut is not None:
            waits = tuple((t, None) for t in last_kernel.values())
            last = g.add(Task(o.name + " (after sync)", cls, o.lane, o.host_us * (1 - cut), waits, op=o.index))
        for i in o.outputs:
            producer[i] = (o.lane, last)
    if step.tail_us > 0:
        waits = tuple((t, None) for t in last_kernel.values())
        g.add(Task("step tail", "host", lanes[0], step.tail_us, waits))
    return g


__all__ = ["OpTiming", "Step", "build_graph", "load_step"]
