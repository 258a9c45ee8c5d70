"""Questions asked of a loaded :class:`~mystique.trace.model.Trace`: iterations, the operators to
replay, per-operator statistics and data dependencies.

Iterations. ``torch.profiler`` wraps each step in a ``ProfilerStep#N`` record function on the
stepping thread. Operators run by other threads during the step (the autograd engine's backward
thread, for example: in the GPT-2 trace all backward operators hang below a second
``[pytorch|profiler|execution_trace|thread]`` node, not below ``ProfilerStep#0``) are not in that
subtree. Node ids are handed out from one counter at operator start, so iteration N is taken as
every node whose id lies in ``[id(ProfilerStep#N), id(next ProfilerStep))`` (to the end of the
trace for the last step). An iteration is *complete* when a later ``ProfilerStep`` exists (the
last step is often cut short: GPT-2's ``ProfilerStep#1`` is empty).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..io import show as show_path
from .kineto import KinetoTimes, read_kineto
from .model import Node, TensorRef, Trace

if TYPE_CHECKING:
    import pandas

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class Iteration:
    """One profiler step: its number ``N`` (from ``ProfilerStep#N``), its node, and the id span
    ``[first_id, end_id)`` of the nodes that ran during it (``end_id`` None: to the end)."""

    step: int
    node: Node
    first_id: int
    end_id: int | None
    complete: bool

    def contains(self, node_id: int) -> bool:
        return node_id >= self.first_id and (self.end_id is None or node_id < self.end_id)


def iterations(trace: Trace) -> list[Node]:
    """Return the ``ProfilerStep#N`` nodes of the trace, in execution (id) order."""
    return [n for n in sorted(trace.nodes.values(), key=lambda n: n.id) if _STEP.match(n.name)]


def iteration_spans(trace: Trace) -> list[Iteration]:
    """Return every profiler step with the id span of what ran during it (see module docs)."""
    steps = iterations(trace)
    out = []
    for i, node in enumerate(steps):
        end = steps[i + 1].id if i + 1 < len(steps) else None
        m = _STEP.match(node.name)
        assert m is not None
        out.append(Iteration(int(m.group(1)), node, node.id, end, end is not None))
    return out


def select_iteration(trace: Trace, iteration: int | None = None) -> Iteration | None:
    """Return the iteration to replay.

    ``iteration`` is a step number ``N`` as in ``ProfilerStep#N`` (:class:`UsageError` naming the
    recorded ones when absent). None picks the last complete iteration; if none is complete, the
    last step that holds an operator; None when the trace has no steps (or only empty ones), which
    means the whole trace.
    """
    spans = iteration_spans(trace)
    if iteration is not None:
        for it in spans:
            if it.step == iteration:
                return it
        have = ", ".join(str(it.step) for it in spans[:20]) + (f", ... ({len(spans)} steps)" if len(spans) > 20 else "")
        have = have or "none"
        raise UsageError(f"{show_path(trace.source or 'trace')}: no ProfilerStep#{iteration}; recorded steps: {have}")
    complete = [it for it in spans if it.complete]
    if complete:
        return complete[-1]
    for it in reversed(spans):
        if any(n.is_op for n in trace.preorder(it.node.id)):
            return it
    return None


def _outermost_ops(trace: Trace, start: int | None = None) -> list[Node]:
    out: list[Node] = []
    nodes = trace.nodes
    stack = [trace.root_id if start is None else start]
    while stack:
        node = nodes[stack.pop()]
        if node.is_op:
            out.append(node)
            continue
        stack.extend(reversed(node.children))
    return out


def replay_ops(trace: Trace, iteration: int | None = None) -> list[Node]:
    """Return the operators to replay, in execution order.

    These are the outermost operator nodes (:attr:`Node.is_op`: ``aten::*``, custom ``ns::op``,
    ``c10d::*``, ``record_param_comms``, Triton kernels, ...) below label nodes (``## forward ##``,
    ``ProfilerStep#N``, ``Optimizer.step#...``, profiler thread nodes, autograd engine labels),
    which are descended into; an operator's own children are not returned. ``iteration``: a step
    number as in ``ProfilerStep#N``; None picks as :func:`select_iteration` does (the whole trace
    when there are no steps). Execution order is id order, which interleaves threads by start.
    """
    it = select_iteration(trace, iteration)
    ops = _outermost_ops(trace)
    if it is not None:
        ops = [n for n in ops if it.contains(n.id)]
    ops.sort(key=lambda n: n.id)
    return ops


def all_ops(trace: Trace, iteration: int | None = None, *, whole_trace: bool = False) -> list[Node]:
    """Return every operator node (outermost or nested) of the chosen iteration, in id order.

    ``whole_trace=True`` ignores ``iteration`` and returns the operators of the whole trace.
    """
    it = None if whole_trace else select_iteration(trace, iteration)
    return [n for n in sorted(trace.nodes.values(), key=lambda n: n.id)
            if n.is_op and (it is None or it.contains(n.id))]


def tensors(args: Iterable) -> list[TensorRef]:
    """Return the tensors among ``args`` (a list of :class:`Arg`), nested lists flattened, in order."""
    out: list[TensorRef] = []
    stack = list(args)[::-1]
    while stack:
        a = stack.pop()
        v = a.value
        if isinstance(v, TensorRef):
            out.append(v)
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return out


def producers(trace: Trace, ops: list[Node] | None = None) -> dict[int, Node]:
    """Map tensor id -> the operator that produced it.

    Considered are ``ops`` (default: :func:`replay_ops` of the trace) in execution order; a tensor
    is produced by the first op that has it among its outputs without having it among its inputs
    (an in-place op's output is its input and does not count). Tensors absent from the map come
    from outside (parameters, data, earlier iterations). Note that tensor ids may be reused by
    the observer after a tensor is freed; the first producer wins.
    """
    if ops is None:
        ops = replay_ops(trace)
    made: dict[int, Node] = {}
    for node in sorted(ops, key=lambda n: n.id):
        ins = {t.tensor_id for t in tensors(node.inputs)}
        for t in tensors(node.outputs):
            if t.tensor_id not in ins and t.tensor_id not in made:
                made[t.tensor_id] = node
    return made


def data_dependencies(trace: Trace, ops: list[Node] | None = None) -> dict[int, list[int]]:
    """Map node id -> ids of the earlier ops (among ``ops``, default :func:`replay_ops`) whose
    outputs it reads: the most recent earlier writer of each input tensor id, in order."""
    if ops is None:
        ops = replay_ops(trace)
    last_writer: dict[int, int] = {}
    deps: dict[int, list[int]] = {}
    for node in sorted(ops, key=lambda n: n.id):
        mine: list[int] = []
        for t in tensors(node.inputs):
            w = last_writer.get(t.tensor_id)
            if w is not None and w not in mine:
                mine.append(w)
        deps[node.id] = mine
        for t in tensors(node.outputs):
            last_writer[t.tensor_id] = node.id
    return deps


def subtree_ids(trace: Trace, node_id: int) -> list[int]:
    """Return the ids of ``node_id`` and all its descendants."""
    return [n.id for n in trace.preorder(node_id)]


OP_STATS_COLUMNS = ["name", "count", "total_time_us", "mean_time_us", "device_time_us", "op_schema"]


def op_stats(
    trace: Trace,
    kineto: KinetoTimes | Mapping[int, float] | str | os.PathLike | None = None,
    iteration: int | None = None,
    *,
    outermost: bool = True,
) -> pandas.DataFrame:
    """Per-operator statistics of one iteration (chosen as in :func:`replay_ops`).

    ``kineto``: the Kineto trace of the same run (a path, a :class:`~mystique.trace.kineto.KinetoTimes`
    or a mapping rf_id -> CPU duration in us), joined by ``rf_id``. ``outermost=False`` counts
    every operator node, nested ones included.

    Returns a DataFrame, one row per operator name, sorted by total time (descending, where
    known) then count, with columns:

    - ``name``: operator name (``aten::mm``, ``record_param_comms``, ``triton_...``)
    - ``count``: number of calls
    - ``total_time_us``: summed CPU (host) duration from Kineto, NaN when unknown
    - ``mean_time_us``: ``total_time_us / calls with a known time``, NaN when unknown
    - ``device_time_us``: summed device-kernel time launched by the op and its children, NaN
      when unknown (no Kineto trace or no device events)
    - ``op_schema``: the schema of the first call ("" when the trace records none)
    """
    import pandas as pd

    times: KinetoTimes | None
    if kineto is None:
        times = None
    elif isinstance(kineto, KinetoTimes):
        times = kineto
    elif isinstance(kineto, Mapping):
        times = KinetoTimes(cpu_us=dict(kineto), device_us={})
    else:
        times = read_kineto(kineto)
    ops = replay_ops(trace, iteration) if outermost else all_ops(trace, iteration)
    rows: dict[str, dict] = {}
    for node in ops:
        row = rows.get(node.name)
        if row is None:
            row = rows[node.name] = {"name": node.name, "count": 0, "timed": 0, "total": 0.0,
                                     "device": 0.0, "device_seen": False, "op_schema": node.op_schema}
        row["count"] += 1
        if times is None:
            continue
        if node.rf_id is not None and node.rf_id in times.cpu_us:
            row["timed"] += 1
            row["total"] += times.cpu_us[node.rf_id]
        if times.device_us:
            for sub in trace.preorder(node.id):
                if sub.rf_id is not None and sub.rf_id in times.device_us:
                    row["device"] += times.device_us[sub.rf_id]
                    row["device_seen"] = True
    records = []
    for r in rows.values():
        total = r["total"] if r["timed"] else math.nan
        records.append({
            "name": r["name"],
            "count": r["count"],
            "total_time_us": total,
            "mean_time_us": total / r["timed"] if r["timed"] else math.nan,
            "device_time_us": r["device"] if r["device_seen"] else math.nan,
            "op_schema": r["op_schema"],
        })
    df = pd.DataFrame.from_records(records, columns=OP_STATS_COLUMNS)
    if len(df):
        df = df.sort_values(["total_time_us", "count", "name"], ascending=[False, False, True],
                            na_position="last", kind="mergesort").reset_index(drop=True)
    return df


__all__ = [
    "OP_STATS_COLUMNS",
    "Iteration",
    "all_ops",
    "data_dependencies",
    "iteration_spans",
    "iterations",
    "op_stats",
    "producers",
    "replay_ops",
    "select_iteration",
    "subtree_ids",
    "tensors",
]
