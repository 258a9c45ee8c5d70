"""The replay plan (``benchmark.json``) of one iteration of an execution trace: the model
(:class:`Plan`) and its building (:func:`build_plan`, :func:`plan_from_path`).

The plan is self-contained JSON with no code (its format and codec: :mod:`mystique.replay.runtime.format`):
``{"format": "mystique-benchmark", "version": 1, "metadata": {...}, "storages": [...],
"tensors": [...], "inputs": [...], "ops": [...]}``.

* ``ops``: the outermost operators of the iteration in execution order, each ``{"index",
  "node_id", "rf_id", "name", "op" (resolved overload, ``aten::addmm.default``), "schema",
  "action" ("call" | "noop" | "skip"), "reason", "args" [...], "kwargs" {...}, "outputs" [...],
  "orig_us" (Kineto host time or null), "scope" (label nodes above it), "grad" (it ran with
  autograd recording: replayed with grad enabled on inputs that require grad), "gap_us" (host
  time in us between the end of the previous op's Kineto event and this op's start, on one
  thread, or null: what ``Executor(pacing="recorded")`` waits before the op)}``.
* ``tensors``: ``{"id", "storage", "offset", "shape", "strides", "dtype", "device", "source"}``
  where ``source`` is ``external`` (materialised before the step), ``output`` (bound to an op's
  result) or ``derived`` (a view of a storage an earlier op produced, e.g. made by a nested op).
* ``storages``: ``{"id", "nbytes", "dtype", "device", "external", "anchor", "recipe",
  "trace_storage_id"}``; ``recipe`` is the data recipe (:mod:`mystique.replay.recipes`).

The parts: :mod:`.classify` (each op's action and schema), :mod:`.builder` (ops, tensors and
storages), :mod:`.recipes` (data recipes), :mod:`.plan_check` (validation of a loaded plan),
:mod:`.capture_info` (what the capture folder says beside the trace).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..io import atomic_write_text, show
from ..trace.analysis import replay_ops, select_iteration
from ..trace.kineto import read_kineto
from ..trace.loader import load_trace
from ..trace.model import Node, Trace
from ..trace.pacing import pacing_spans
from ..trace.values import read_values
from .builder import PlanBuilder, finite, original_device
from .capture_info import capture_original_step, capture_step_ms, capture_subject, find_kineto, read_capture
from .pins import is_routing, pin_values
from .plan_check import plan_problem
from .runtime.format import PLAN_FORMAT, PLAN_VERSION, ReplayError, load_plan, op_input_ids, op_output_ids
from .runtime.schemas import plan_refusal


@dataclass
class Plan:
    """A replay plan: the JSON document (``data``) with helpers to save and load it."""

    data: dict[str, Any]

    @property
    def ops(self) -> list[dict[str, Any]]:
        return self.data["ops"]

    @property
    def tensors(self) -> list[dict[str, Any]]:
        return self.data["tensors"]

    @property
    def storages(self) -> list[dict[str, Any]]:
        return self.data["storages"]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.data["metadata"]

    def to_json(self, indent: int | None = None) -> str:
        """The plan as JSON text (strict JSON: no NaN). An obfuscated plan drops ``original_step``
        (it names the captured workload or function)."""
        data = self.data
        meta = data.get("metadata") or {}
        if meta.get("obfuscated") and meta.get("original_step") is not None:
            data = {**data, "metadata": {**meta, "original_step": None}}
        return json.dumps(data, indent=indent, allow_nan=False, separators=(",", ":") if indent is None else None)

    def save(self, path: str | os.PathLike) -> Path:
        return atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike, allow_ops: Sequence[str] = ()) -> Plan:
        """Read a ``benchmark.json`` (UsageError when missing, not a plan, or calling an operator the
        operator policy refuses and no pattern of ``allow_ops`` allows: :func:`runtime.plan_refusal`)."""
        p = Path(path)
        if not p.exists():
            raise UsageError(f"{show(p)} does not exist")
        try:
            data = load_plan(p)
        except ReplayError as exc:
            raise UsageError(f"{show(p)}: {show(exc)}") from exc
        except (ValueError, RecursionError) as exc:  # a 5000-digit number; JSON nested too deeply
            raise UsageError(f"{show(p)}: not a usable benchmark plan: {type(exc).__name__}") from exc
        problem = plan_problem(data)
        if problem:
            raise UsageError(f"{show(p)}: malformed benchmark plan: {problem}")
        refused = plan_refusal(data["ops"], allow_ops)
        if refused:
            raise UsageError(f"{show(p)}: {refused}")
        return cls(data)

    def copy(self) -> Plan:
        return Plan(json.loads(json.dumps(self.data)))


def build_plan(
    trace: Trace,
    iteration: int | None = None,
    *,
    kineto: dict[int, float] | None = None,
    capture: dict[str, Any] | None = None,
    nodes: list[Node] | None = None,
    kineto_times: Any = None,
    allow_ops: Sequence[str] = (),
    gaps: tuple[dict[int, tuple[float, float]] | None, str] | None = None,
    values: dict[int, dict[int, dict[str, Any]]] | None = None,
) -> Plan:
    """The replay plan of one iteration of ``trace``.

    ``iteration``: a ``ProfilerStep#N`` number (None: the last complete one, see
    :func:`mystique.trace.analysis.select_iteration`; UsageError when absent). ``kineto``: rf_id ->
    host duration (us) of the same run; ``capture``: the ``capture.json`` document (gives the
    original step time). ``nodes``: the ops to replay (default :func:`replay_ops`), e.g. in tests.
    ``kineto_times``: the whole :class:`mystique.trace.kineto.KinetoTimes` of that run, for each op's
    device time (``orig_device_us``: the kernels its ET subtree launched) and the step's recorded span
    (metadata ``original_step_span_ms``, ``original_device_step_ms``). ``allow_ops``: fnmatch
    patterns (``ns::name``) of operators outside :data:`runtime.ALLOWED_OP_NAMESPACES` to replay;
    any other such op is skipped with the reason (``--allow-ops``). ``gaps``: ``(spans, source)``
    from :func:`mystique.trace.pacing.pacing_spans`: rf_id -> host span behind each op's ``gap_us``
    (None: the spans of ``kineto_times``), and where they came from (metadata ``gap_source``).
    ``values``: the capture's recorded integral inputs (:func:`mystique.trace.values.read_values`),
    pinned into the ops that read them (:mod:`.pins`).
    """
    it = None
    if nodes is None:
        it = select_iteration(trace, iteration)
        nodes = replay_ops(trace, iteration)
    b = PlanBuilder(trace, allow_ops)
    spans, gap_source = gaps if gaps is not None else (None, "")
    b.kineto_spans = spans if spans is not None else getattr(kineto_times, "cpu_spans_us", None)  # per-op gap_us
    if kineto is None and kineto_times is not None:
        kineto = kineto_times.cpu_us
    ops = [b.build_op(i, n, kineto) for i, n in enumerate(nodes)]
    _device_times(trace, ops, nodes, kineto_times)
    b.data.apply(ops)
    pins = pin_values(ops, b.tensors, b.storages, values or {})
    for op in ops:
        op.pop("_schema", None)
    known = [op["orig_us"] for op in ops if op["orig_us"] is not None]
    meta = {
        "source": os.path.basename(trace.source) if trace.source else "",
        "schema": trace.schema,
        "iteration": it.step if it is not None else iteration,
        "original_device": original_device(b.devices),
        "ops_total": None,  # this key and the next three: see normalise
        "op_counts": None,
        "skipped": None,
        "original_op_times": None,
        "original_ops_us": sum(known) if known else None,
        "original_step_ms": capture_step_ms(capture),
        "original_threads": (capture or {}).get("threads"),
        "captured_on": (capture or {}).get("device_name"),
        "subject": capture_subject(capture),
        "original_step": capture_original_step(capture),
        **_step_spans(kineto, kineto_times, it),
        "original_device_op_times": any(op.get("orig_device_us") for op in ops),
        "gap_source": gap_source or None,  # where the ops' gap_us came from (pacing)
        "transforms": [],
        "pins": pins,  # recorded values the replay gives ops instead of computed ones (pins.py)
        "routing": "recorded" if any(is_routing(p) for p in pins) else None,
    }
    data = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "metadata": meta, "storages": b.storages,
            "tensors": b.tensors, "inputs": [], "ops": ops}
    return normalise(Plan(data))


def _device_times(trace: Trace, ops: list[dict[str, Any]], nodes: list[Node], kineto_times: Any) -> None:
    """Each op's ``orig_device_us``: the recorded time of the kernels its ET subtree launched (None
    without Kineto device times)."""
    dev_us = getattr(kineto_times, "device_us", None) or {}
    for op, n in zip(ops, nodes):
        op["orig_device_us"] = None
        if dev_us:
            total = sum(dev_us.get(m.rf_id, 0.0) for m in trace.preorder(n.id) if m.rf_id is not None)
            op["orig_device_us"] = finite(total)


def _step_spans(kineto: dict[int, float] | None, kineto_times: Any, it: Any) -> dict[str, float | None]:
    """The recorded host and device spans (ms) of the iteration's ``ProfilerStep``."""
    span_ms = device_span_ms = None
    if kineto_times is not None and it is not None:
        span = kineto.get(it.node.rf_id) if kineto and it.node.rf_id is not None else None
        if span is None:
            span = kineto_times.steps_us.get(it.step)
        span_ms = finite(span / 1e3) if span else None
        dspan = kineto_times.device_steps_us.get(it.step)
        device_span_ms = finite(dspan / 1e3) if dspan else None
    return {"original_step_span_ms": span_ms, "original_device_step_ms": device_span_ms}


def normalise(plan: Plan) -> Plan:
    """Renumber ops and recompute each tensor's source and each storage's role from the op list.

    A tensor first seen as an op's output is ``output``; first seen as an input, it is
    ``derived`` when an earlier op produced a tensor of its storage, else ``external`` (and its
    storage is external); tensors no op references are ``unused`` (never materialised). Used after
    ops were removed (``--keep``/``--drop``) so that removed producers become synthetic inputs.
    """
    tensors = {t["id"]: t for t in plan.tensors}
    storages = {s["id"]: s for s in plan.storages}
    seen: set[int] = set()
    produced: set[int] = set()
    external: set[int] = set()
    anchors: dict[int, int] = {}
    for i, op in enumerate(plan.ops):
        op["index"] = i
        for tid in op_input_ids(op):
            if tid in seen:
                continue
            seen.add(tid)
            sid = tensors[tid]["storage"]
            if sid in produced:
                tensors[tid]["source"] = "derived"
            else:
                tensors[tid]["source"] = "external"
                external.add(sid)
        for tid in op_output_ids(op):
            if tid in seen:
                continue
            seen.add(tid)
            tensors[tid]["source"] = "output"
            sid = tensors[tid]["storage"]
            if sid not in external and sid not in produced:
                produced.add(sid)
                anchors[sid] = tid
    for tid, t in tensors.items():
        if tid not in seen:
            t["source"] = "unused"
    for sid, st in storages.items():
        st["external"] = sid in external
        st["anchor"] = anchors.get(sid)
    plan.data["inputs"] = [t["id"] for t in plan.tensors if t["source"] == "external"]
    counts = Counter(op["name"] for op in plan.ops)
    plan.metadata["ops_total"] = len(plan.ops)
    plan.metadata["op_counts"] = dict(sorted(counts.items()))
    skipped: dict[str, dict[str, Any]] = {}
    for op in plan.ops:
        if op["action"] == "skip":
            s = skipped.setdefault(op["name"], {"count": 0, "reason": op["reason"]})
            s["count"] += 1
    plan.metadata["skipped"] = skipped
    known = [op["orig_us"] for op in plan.ops if op.get("orig_us") is not None]
    plan.metadata["original_op_times"] = bool(known)
    return plan


def plan_from_path(path: str | os.PathLike, iteration: int | None = None,
                   allow_ops: Sequence[str] = ()) -> tuple[Plan, str]:
    """A plan from a benchmark dir, a ``benchmark.json``, a trace dir or an ET file (``allow_ops``:
    see :func:`build_plan`; a benchmark's executor applies it again).

    Returns ``(plan, kind)`` with kind ``benchmark`` or ``trace``. UsageError for anything else.
    """
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{show(p)} does not exist")
    if p.is_dir() and (p / "benchmark.json").is_file():
        p = p / "benchmark.json"
    if p.is_file() and p.name.endswith(".json") and _looks_like_plan(p):
        if iteration is not None:
            raise UsageError("--iteration applies to traces; a benchmark holds one iteration already")
        return Plan.load(p, allow_ops), "benchmark"
    trace = load_trace(p)
    kin = find_kineto(p)
    kineto = None
    if kin is not None:
        try:
            kineto = read_kineto(kin)
        except UsageError:
            kineto = None
    gaps = pacing_spans(p, kineto) if kineto is not None else None
    plan = build_plan(trace, iteration, kineto_times=kineto, capture=read_capture(p), allow_ops=allow_ops,
                      gaps=gaps, values=read_values(p))
    return plan, "trace"


def _looks_like_plan(p: Path) -> bool:
    try:
        with open(p, encoding="utf-8") as fh:
            head = fh.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return '"mystique-benchmark"' in head
