"""Collectives of an execution trace: what each one was, and how a rank replays it.

A trace records a collective as a ``c10d::*`` operator (``c10d::allreduce_``,
``c10d::alltoall_base_``, ...) whose subtree holds a ``record_param_comms`` node with the message
(``collective_name``, ``in_msg_nelems``, ``out_msg_nelems``, split sizes, ``pg_name``,
``pg_desc``, ``pg_size``: attributes from schema 1.1, positional inputs before), as a
``_c10d_functional::*`` operator, or as a bare ``record_param_comms`` node (``wait``, and the
collectives of older traces). The ``## process_group:init ##`` node of newer traces lists the
process groups (``pg_name``, ``pg_desc``, ``ranks``, ``group_size``, ``backend_config``); 1.0.1
traces have none: their collectives ran on the default (world) group.

:func:`comm_specs` turns the collectives of a replay plan into :class:`CommSpec` records (one per
plan op, keyed by trace node id); :class:`CollectiveRunner` replays them with
``torch.distributed`` from inside the torch-only executor (installed through
``executor.COLLECTIVE_HANDLER``), in order with that rank's compute, times each one and keeps
the numbers for ``collectives.csv`` (bus bandwidth per the nccl-tests conventions, see
:func:`bus_factor`).

Collectives whose ``wait`` the trace records later in the same iteration are issued
asynchronously and waited at that ``wait``; the others block where they were issued.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

COLLECTIVE_COLUMNS = ["rank", "index", "op_index", "name", "kind", "pg_name", "pg_size", "dtype", "wire_dtype",
                      "in_nelems", "out_nelems", "size_bytes", "mode", "calls", "time_us", "algbw_gbps",
                      "busbw_gbps", "synthetic"]

# c10d / functional operator (without namespace and overload) -> normalised kind
_C10D_KINDS: dict[str, str] = {
    "allreduce_": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "allreduce_sparse_": "all_reduce",
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "allgather_": "all_gather", "allgather": "all_gather", "allgather_coalesced_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor", "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
    "all_gather_into_tensor": "all_gather_into_tensor", "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall_base_": "all_to_all_single", "all_to_all_single": "all_to_all_single", "alltoall_": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast", "broadcast_coalesced": "broadcast",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
    "barrier": "barrier", "monitored_barrier_": "barrier",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "wait_tensor": "wait",
}
# record_param_comms collective_name -> normalised kind
_RPC_KINDS: dict[str, str] = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "allgather_coalesced": "all_gather",
    "_allgather_base": "all_gather_into_tensor", "all_gather_into_tensor": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all": "all_to_all_single", "all_to_allv": "all_to_all_single", "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "gather": "gather",
    "scatter": "scatter", "barrier": "barrier", "send": "send", "recv": "recv", "recvAnySource": "recv",
    "wait": "wait",
}
KINDS = frozenset(_C10D_KINDS.values()) | frozenset(_RPC_KINDS.values())
# dtypes the gloo backend moves; others travel as their bytes (uint8), the byte count kept
GLOO_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"})
_ET_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
              "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


class CollectiveFailed(BaseException):  # noqa: N818 - a BaseException on purpose, see below
    """A collective could not complete (peer gone, timeout, mismatch).

    Derived from BaseException so that the executor's per-op error handling (which marks an op
    that raises ``Exception`` as skipped and goes on) lets it through: a rank that skipped a
    collective its peers run would deadlock them.
    """


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor.

    2(n-1)/n for all_reduce; (n-1)/n for all_gather, reduce_scatter and all_to_all; 1 for
    broadcast, reduce, send/recv, gather, scatter; 0 for barrier and wait (no payload).
    """
    if n <= 0:
        raise ValueError(f"group size must be positive, got {n}")
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                "all_to_all", "all_to_all_single"):
        return (n - 1) / n
    if kind in ("barrier", "wait"):
        return 0.0
    return 1.0


def bandwidth(kind: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes/s) of a collective of ``size_bytes`` taking ``seconds``.

    ``size_bytes`` follows nccl-tests: the buffer for all_reduce/broadcast/reduce, the whole
    gathered (all_gather) or scattered (reduce_scatter) buffer, all bytes one rank sends for
    all_to_all. NaN when the time is unknown or zero.
    """
    if not seconds or seconds <= 0 or not math.isfinite(seconds):
        return math.nan, math.nan
    alg = size_bytes / seconds / 1e9
    return alg, alg * bus_factor(kind, n)


# ----------------------------------------------------------------------------------------------
# What each collective was
# ----------------------------------------------------------------------------------------------


@dataclass
class CommSpec:
    """One collective (or wait) of a rank's plan, as the trace recorded it.

    ``kind``: normalised (:data:`KINDS`); ``seq``: the ``record_param_comms`` sequence number that
    its ``wait`` names (None when unrecorded); ``pg_name``: process group (None: the default
    group); ``in_nelems``/``out_nelems``: recorded message elements; ``in_splits``/
    ``out_splits``: all_to_all split sizes (rows of dim 0); ``root``: group rank of the root
    (broadcast, reduce, gather, scatter) or peer (send, recv); ``asynchronous``: a later ``wait``
    in the plan completes it.
    """

    node_id: int
    op_index: int
    name: str
    kind: str
    seq: int | None = None
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    dtype: str = ""
    in_nelems: int | None = None
    out_nelems: int | None = None
    in_splits: list[int] = field(default_factory=list)
    out_splits: list[int] = field(default_factory=list)
    root: int | None = None
    asynchronous: bool = False
    index: int = -1  # ordinal among the plan's collectives (waits excluded)

    def describe(self) -> str:
        """One human line: ``#3 all_reduce (c10d::allreduce_, 131392 float32, pg 0)``."""
        n = self.in_nelems if self.in_nelems is not None else self.out_nelems
        size = f", {n} {self.dtype or 'elements'}" if n is not None and self.kind != "wait" else ""
        seq = f", seq {self.seq}" if self.seq is not None and self.kind == "wait" else ""
        return f"#{self.index} {self.kind} ({self.name}{size}, pg {self.pg_name or 'default'}{seq})"


@dataclass
class ProcessGroupSpec:
    """A process group from the trace: name, description, global ranks ([] = all), size, backend."""

    pg_name: str
    pg_desc: str = ""
    ranks: list[int] = field(default_factory=list)
    group_size: int | None = None
    backend_config: str = ""
    backend_id: int | None = None


def _plain(v: Any) -> Any:
    """An Arg value with nested Args unwrapped to plain Python values."""
    if isinstance(v, list):
        return [_plain(getattr(e, "value", e)) for e in v]
    return v


def process_groups(trace: Any) -> list[ProcessGroupSpec]:
    """Process groups recorded by the ``## process_group:init ##`` node (empty list when none)."""
    out: list[ProcessGroupSpec] = []
    for node in trace.nodes.values():
        if not node.name.startswith("## process_group:init"):
            continue
        for a in node.inputs:
            if not isinstance(a.value, str):
                continue
            try:
                doc = json.loads(a.value)
            except json.JSONDecodeError:
                continue
            for pg in doc if isinstance(doc, list) else [doc]:
                if not isinstance(pg, dict) or "pg_name" not in pg:
                    continue
                out.append(ProcessGroupSpec(
                    pg_name=str(pg["pg_name"]), pg_desc=str(pg.get("pg_desc", "")),
                    ranks=[int(r) for r in pg.get("ranks") or []],
                    group_size=int(pg["group_size"]) if isinstance(pg.get("group_size"), int) else None,
                    backend_config=str(pg.get("backend_config", "")),
                    backend_id=int(pg["backend_id"]) if isinstance(pg.get("backend_id"), int) else None))
        break
    return out


def _rpc_fields(node: Any, pgs: list[ProcessGroupSpec]) -> dict[str, Any]:
    """Fields of a ``record_param_comms`` node, from its attributes (1.1) or positional inputs."""
    a = node.attrs or {}
    vals = [_plain(x.value) for x in node.inputs]
    kinds = [x.kind for x in node.inputs]
    out: dict[str, Any] = {}
    i = next((k for k, (kd, v) in enumerate(zip(kinds, vals)) if kd == "String" and isinstance(v, str)), None)
    if i is not None:
        out["collective_name"] = vals[i]
        if i >= 3 and isinstance(vals[i - 3], int):
            out["seq"] = vals[i - 3]
        pg = vals[i - 2] if i >= 2 else None
        if isinstance(pg, list) and pg and isinstance(pg[0], str):
            out["pg_name"] = pg[0] or None
            out["pg_desc"] = pg[1] if len(pg) > 1 else ""
        elif isinstance(pg, int) and pg:
            named = [p for p in pgs if p.backend_id == pg]
            if named:
                out["pg_name"] = named[0].pg_name
        if i + 2 < len(vals):
            if isinstance(vals[i + 1], list):
                out["in_splits"] = [int(x) for x in vals[i + 1] if isinstance(x, (int, float))]
            if isinstance(vals[i + 2], list):
                out["out_splits"] = [int(x) for x in vals[i + 2] if isinstance(x, (int, float))]
        tail = vals[i + 3:]
        if tail and isinstance(tail[-1], int) and tail[-1] > 0 and out["collective_name"] != "wait":
            out["pg_size"] = tail[-1]
    for key in ("collective_name", "pg_name", "pg_desc"):
        if a.get(key) not in (None, ""):
            out[key] = str(a[key])
    for key in ("in_msg_nelems", "out_msg_nelems", "pg_size"):
        if isinstance(a.get(key), int):
            out[key] = int(a[key])
    for key, dst in (("in_split_size", "in_splits"), ("out_split_size", "out_splits")):
        if isinstance(a.get(key), str):
            try:
                out[dst] = [int(x) for x in json.loads(a[key])]
            except (json.JSONDecodeError, TypeError, ValueError):
                pass
    if isinstance(a.get("dtype"), str):
        out["dtype"] = _ET_DTYPES.get(a["dtype"], a["dtype"].lower())
    return out


def _tensors_of(args: Sequence[Any]) -> list[Any]:
    from ..trace.analysis import tensors

    return tensors(args)


def spec_of_node(node: Any, trace: Any, op_index: int, pgs: list[ProcessGroupSpec]) -> CommSpec | None:
    """The :class:`CommSpec` of a collective node of ``trace`` (None when it is not one)."""
    name = node.name
    rpc = None
    if name == "record_param_comms":
        rpc = node
    else:
        for sub in trace.preorder(node.id):
            if sub.name == "record_param_comms":
                rpc = sub
                break
    fields = _rpc_fields(rpc, pgs) if rpc is not None else {}
    kind = None
    if "::" in name:
        base = name.split("::", 1)[1].split(".", 1)[0]
        kind = _C10D_KINDS.get(base)
    if kind is None and fields.get("collective_name"):
        kind = _RPC_KINDS.get(fields["collective_name"])
    if kind is None:
        return None
    if kind == "all_to_all_single" and fields.get("collective_name") == "alltoall":
        kind = "all_to_all"
    ins = _tensors_of(node.inputs)
    outs = _tensors_of(node.outputs)
    dtype = fields.get("dtype") or (ins[0].dtype if ins else (outs[0].dtype if outs else ""))
    spec = CommSpec(node_id=node.id, op_index=op_index, name=name, kind=kind, seq=fields.get("seq"),
                    pg_name=fields.get("pg_name"), pg_desc=fields.get("pg_desc"), pg_size=fields.get("pg_size"),
                    dtype=dtype, in_nelems=fields.get("in_msg_nelems"), out_nelems=fields.get("out_msg_nelems"),
                    in_splits=list(fields.get("in_splits") or []), out_splits=list(fields.get("out_splits") or []))
    vals = [_plain(a.value) for a in node.inputs]
    if name.startswith("c10d::"):
        base = name.split("::", 1)[1].split(".", 1)[0]
        if kind == "all_to_all_single" and len(vals) >= 5:
            if isinstance(vals[3], list) and isinstance(vals[4], list):
                spec.out_splits = [int(x) for x in vals[3]]
                spec.in_splits = [int(x) for x in vals[4]]
        root_at = {"broadcast_": 2, "reduce_": 3, "gather_": 3, "scatter_": 3, "send": 2, "recv_": 2}.get(base)
        if root_at is not None and len(vals) > root_at and isinstance(vals[root_at], int):
            spec.root = int(vals[root_at])
    if spec.in_nelems is None and kind != "wait":
        spec.in_nelems = _payload_nelems(kind, node, "in")
    if spec.out_nelems is None and kind != "wait":
        spec.out_nelems = _payload_nelems(kind, node, "out")
    return spec


_OUT_IN_KINDS = frozenset({"all_gather", "all_gather_into_tensor", "all_to_all_single", "all_to_all",
                           "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter"})


def _payload_nelems(kind: str, node: Any, side: str) -> int:
    """Message elements when the trace did not record them, from the op's tensor arguments.

    c10d ops of :data:`_OUT_IN_KINDS` take ``(outputs, inputs, ...)``; the others take the
    buffer first; other nodes list inputs in ``inputs`` and results in ``outputs``.
    """
    if node.name.startswith("c10d::") and node.inputs:
        if kind in _OUT_IN_KINDS:
            arg = node.inputs[0] if side == "out" else (node.inputs[1] if len(node.inputs) > 1 else None)
        else:
            arg = node.inputs[0]
        return int(sum(t.numel for t in _tensors_of([arg]))) if arg is not None else 0
    ts = _tensors_of(node.inputs if side == "in" else (node.outputs or node.inputs))
    return int(sum(t.numel for t in ts))


def comm_specs(trace: Any, plan: Any) -> dict[int, CommSpec]:
    """Collective specs of the plan's collective ops, keyed by trace node id (plan order).

    Marks a collective ``asynchronous`` when a ``wait`` with its sequence number comes later in
    the plan, and numbers the collectives (``index``, waits excluded) in plan order.
    """
    pgs = process_groups(trace)
    out: dict[int, CommSpec] = {}
    for op in plan.ops:
        if op.get("reason") != "collective" or op.get("node_id") not in trace.nodes:
            continue
        spec = spec_of_node(trace.nodes[op["node_id"]], trace, op["index"], pgs)
        if spec is not None:
            out[op["node_id"]] = spec
    specs = list(out.values())
    k = 0
    for i, s in enumerate(specs):
        if s.kind == "wait":
            continue
        s.index = k
        k += 1
        if s.seq is not None:
            s.asynchronous = any(w.kind == "wait" and w.seq == s.seq for w in specs[i + 1:])
    return out


def world_size_of(trace: Any) -> int | None:
    """The world size the trace recorded: the default group's size, else the largest ``pg_size``."""
    for pg in process_groups(trace):
        if pg.pg_name == "0" and pg.group_size:
            return pg.group_size
    best = None
    for node in trace.nodes.values():
        if node.name == "record_param_comms":
            n = _rpc_fields(node, []).get("pg_size")
            if isinstance(n, int) and n > 0:
                best = max(best or 0, n)
    return best


def mirror_for_peer(specs: dict[int, CommSpec], template_rank: int, peer: int, world: int) -> dict[int, CommSpec]:
    """Specs for a synthetic ``peer`` issuing the collectives matching ``template_rank``'s.

    Symmetric collectives stay as they are. all_to_all splits are rebuilt so that every pair
    agrees: the peer sends the template rank what it expects (its ``out_splits[peer]``) and
    receives what the template sends it (its ``in_splits[peer]``); between peers, the template's
    input splits are used. Send becomes recv and the other way round.
    """
    out: dict[int, CommSpec] = {}
    for nid, s in specs.items():
        m = CommSpec(**{k: (list(v) if isinstance(v, list) else v) for k, v in asdict(s).items()})
        if s.kind == "all_to_all_single" and s.in_splits and s.out_splits and len(s.in_splits) == world:
            ins = [s.in_splits[q] for q in range(world)]
            ins[template_rank] = s.out_splits[peer]
            outs = [s.in_splits[peer]] * world
            outs[template_rank] = s.in_splits[peer]
            m.in_splits, m.out_splits = ins, outs
            row = 1
            if s.in_nelems and sum(s.in_splits):
                row = max(1, s.in_nelems // sum(s.in_splits))
            m.in_nelems, m.out_nelems = sum(ins) * row, sum(outs) * row
        elif s.kind in ("send", "recv"):
            m.kind = "recv" if s.kind == "send" else "send"
            m.root = template_rank
        out[nid] = m
    return out


# ----------------------------------------------------------------------------------------------
# Replaying them
# ----------------------------------------------------------------------------------------------


def _flatten(v: Any, out: list[Any]) -> list[Any]:
    if isinstance(v, (list, tuple)):
        for e in v:
            _flatten(e, out)
    else:
        out.append(v)
    return out


@dataclass
class _Record:
    spec: CommSpec
    size_bytes: int = 0
    wire_dtype: str = ""
    times: list[float] = field(default_factory=list)


class CollectiveRunner:
    """Replays the collectives of one rank's plan with ``torch.distributed``.

    ``CollectiveRunner(specs, groups, rank, world, device, status=None, fault=None)``:
    ``groups`` maps pg name -> ProcessGroup (None: the default group); ``status`` is an optional
    shared integer array ``[entered, left, current index]`` the launcher's watchdog reads.
    ``handler`` is what ``executor.COLLECTIVE_HANDLER`` takes: ``handler(op, executor)`` returns
    the callable that replays op (or None for ops it does not know).
    """

    def __init__(self, specs: dict[int, CommSpec], groups: dict[str, Any], rank: int, world: int,
                 device: Any, status: Any = None, fault: str | None = None):
        import torch

        self.torch = torch
        self.specs = specs
        self.groups = groups
        self.rank = rank
        self.world = world
        self.device = torch.device(device)
        self.status = status
        self.records: dict[int, _Record] = {}
        self.pending: dict[int, tuple[Any, float, _Record, list[Callable[[], None]]]] = {}
        self.calls = 0
        self.fault = parse_fault(fault, rank)
        self.backend = None

    # -- the executor hook -----------------------------------------------------------------

    def handler(self, op: dict[str, Any], executor: Any) -> Callable[..., Any] | None:
        spec = self.specs.get(op.get("node_id"))
        if spec is None:
            return None
        rec = self.records.setdefault(spec.node_id, _Record(spec))
        outputs_enc = op.get("outputs", [])
        args_enc = op.get("args", [])

        def call(*args: Any, **_kw: Any) -> Any:
            by_tid: dict[int, Any] = {}
            _zip_tensors(args_enc, list(args), by_tid)
            return self._run(spec, rec, list(args), by_tid, executor, outputs_enc)

        return call

    # -- running one collective ------------------------------------------------------------

    def _group(self, spec: CommSpec) -> Any:
        if spec.pg_name is not None and spec.pg_name in self.groups:
            return self.groups[spec.pg_name]
        return None

    def _global(self, group: Any, group_rank: int) -> int:
        import torch.distributed as dist

        if group is None:
            return int(group_rank)
        return int(dist.get_global_rank(group, int(group_rank)))

    def _mark(self, spec: CommSpec, entering: bool) -> None:
        if self.status is None:
            return
        if entering:
            self.status[2] = spec.index
            self.status[0] += 1
        else:
            self.status[1] += 1

    def _run(self, spec: CommSpec, rec: _Record, args: list[Any], by_tid: dict[int, Any], executor: Any,
             outputs_enc: Any) -> Any:
        if spec.kind == "wait":
            self._wait(spec)
            return _mirror(outputs_enc, by_tid)
        self.calls += 1
        if self.fault is not None and self.fault[1] == spec.index:
            _inject(self.fault[0])
        self._mark(spec, True)
        t0 = time.perf_counter()
        try:
            work, finish = self._issue(spec, rec, args, by_tid, executor, outputs_enc)
            if spec.asynchronous and work is not None and spec.seq is not None:
                self.pending[spec.seq] = (work, t0, rec, finish)
            else:
                if work is not None:
                    work.wait()
                for f in finish:
                    f()
                if self.device.type != "cpu":
                    from .executor import synchronize

                    synchronize(self.device)
                rec.times.append(time.perf_counter() - t0)
                self._mark(spec, False)
        except CollectiveFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure aborts the whole replay of this rank
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CollectiveFailed(f"rank {self.rank}: collective {spec.describe()} failed: "
                                   f"{type(exc).__name__}: {msg[:300]}") from exc
        return _mirror(outputs_enc, by_tid)

    def _wait(self, spec: CommSpec) -> None:
        entry = self.pending.pop(spec.seq, None) if spec.seq is not None else None
        if entry is None:
            return  # the wait of a collective issued before the replayed iteration
        work, t0, rec, finish = entry
        try:
            work.wait()
            for f in finish:
                f()
        except Exception as exc:  # noqa: BLE001
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CollectiveFailed(f"rank {self.rank}: wait of collective {rec.spec.describe()} failed: "
                                   f"{type(exc).__name__}: {msg[:300]}") from exc
        rec.times.append(time.perf_counter() - t0)
        self._mark(rec.spec, False)

    def drain(self) -> None:
        """Wait for every collective still in flight (end of an iteration or of the run)."""
        for seq in list(self.pending):
            self._wait(CommSpec(node_id=-1, op_index=-1, name="wait", kind="wait", seq=seq))

    def _wire(self, t: Any) -> tuple[Any, Callable[[], None] | None]:
        """A contiguous tensor of a dtype the backend moves, with the same bytes, and how to copy back.

        Non-contiguous tensors travel as a contiguous copy (copied back once the collective
        completed); dtypes gloo cannot move travel as their bytes (a uint8 view, byte count kept).
        """
        c = t if t.is_contiguous() else t.contiguous()
        w = c
        if self.backend == "gloo" and str(c.dtype).replace("torch.", "") not in GLOO_DTYPES:
            w = c.reshape(-1).view(self.torch.uint8)
        if c.data_ptr() == t.data_ptr() and c is t:
            return w, None
        return w, lambda: t.copy_(c)

    def _buffer(self, nelems: int, like: Any) -> Any:
        return self.torch.empty(max(int(nelems), 0), dtype=like.dtype if like is not None else self.torch.float32,
                                device=like.device if like is not None else self.device)

    def _issue(self, spec: CommSpec, rec: _Record, args: list[Any], by_tid: dict[int, Any], executor: Any,
               outputs_enc: Any) -> tuple[Any, list[Callable[[], None]]]:
        """Start the collective; returns (work or None, copy-backs to run once it completed)."""
        import torch.distributed as dist

        torch = self.torch
        group = self._group(spec)
        n = dist.get_world_size(group)
        a = True  # every call is issued asynchronously; the caller waits (now, or at the recorded wait)
        finish: list[Callable[[], None]] = []
        kind = spec.kind
        c10d = spec.name.startswith("c10d::")
        first = [x for x in _flatten(args[:1], []) if isinstance(x, torch.Tensor)] if args else []
        second = [x for x in _flatten(args[1:2], []) if isinstance(x, torch.Tensor)] if len(args) > 1 else []
        if not c10d:  # record_param_comms / functional: inputs first; outputs allocated here
            ins = first
            outs = [self._alloc_out(tid, executor, by_tid) for tid in _out_tids(outputs_enc)]
            outs = [o for o in outs if o is not None]
            if spec.name.startswith(("_c10d_functional::", "c10d_functional::")) and kind in ("all_reduce", "broadcast"):
                for o, i in zip(outs, ins):
                    o.copy_(i)
                ins = outs
        else:
            outs, ins = first, second
        ins = [t for t in ins if t is not None]
        outs = [t for t in outs if t is not None]

        def wired(ts: list[Any]) -> list[Any]:
            res = []
            for t in ts:
                w, back = self._wire(t)
                if back is not None:
                    finish.append(back)
                res.append(w)
            return res

        if kind in ("all_reduce", "broadcast", "reduce", "send", "recv") and c10d:
            ins = first  # these take the buffer first
        bufs = ins
        rec.wire_dtype = ""
        if kind == "barrier":
            rec.size_bytes = 0
            return dist.barrier(group=group, async_op=a), finish
        if kind in ("all_reduce", "broadcast", "reduce", "send", "recv"):
            ts = wired(bufs or [])
            if not ts:
                ts = [self._buffer(spec.in_nelems or 0, None)]
            rec.size_bytes = sum(t.numel() * t.element_size() for t in ts)
            rec.wire_dtype = str(ts[0].dtype).replace("torch.", "")
            works = []
            for t in ts:
                if kind == "all_reduce":
                    works.append(dist.all_reduce(t, group=group, async_op=a))
                elif kind == "broadcast":
                    works.append(dist.broadcast(t, src=self._global(group, spec.root or 0), group=group, async_op=a))
                elif kind == "reduce":
                    works.append(dist.reduce(t, dst=self._global(group, spec.root or 0), group=group, async_op=a))
                elif kind == "send":
                    works.append(dist.isend(t, dst=self._global(group, spec.root or 0), group=group))
                else:
                    works.append(dist.irecv(t, src=self._global(group, spec.root or 0), group=group))
            return _Works(works), finish
        if kind in ("all_gather", "all_gather_into_tensor"):
            src = ins[0] if ins else self._buffer(spec.in_nelems or 0, outs[0] if outs else None)
            total = src.numel() * n
            out_flat = outs[0] if (len(outs) == 1 and outs[0].numel() == total) else None
            (s,) = wired([src])
            if out_flat is not None:
                (o,) = wired([out_flat])
            else:
                o = self._buffer(s.numel() * n, s)
                if len(outs) == n and all(x.numel() == src.numel() for x in outs):
                    chunks = list(outs)
                    finish.append(lambda: [c.view(-1).copy_(p.view(c.dtype) if p.dtype != c.dtype else p)
                                           for c, p in zip(chunks, o.view(n, -1))])
            rec.size_bytes = o.numel() * o.element_size()
            rec.wire_dtype = str(o.dtype).replace("torch.", "")
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
            return gather(o, s, group=group, async_op=a), finish
        if kind in ("reduce_scatter", "reduce_scatter_tensor"):
            if outs and ins and ins[0].numel() == outs[0].numel() * n and len(ins) == 1:
                src, dst = ins[0], outs[0]
            elif outs and len(ins) == n:
                dst = outs[0]
                src = torch.cat([t.reshape(-1) for t in ins])
            else:
                dst = outs[0] if outs else self._buffer(spec.out_nelems or 0, None)
                src = self._buffer(dst.numel() * n, dst)
            (s, d) = wired([src, dst])
            rec.size_bytes = s.numel() * s.element_size()
            rec.wire_dtype = str(s.dtype).replace("torch.", "")
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in 2.13
            return scatter(d, s, group=group, async_op=a), finish
        if kind in ("all_to_all_single", "all_to_all"):
            if kind == "all_to_all" and len(ins) == n and len(outs) == n:
                src = torch.cat([t.reshape(-1) for t in ins])
                dst = self._buffer(sum(t.numel() for t in outs), outs[0])
                in_sp = [t.numel() for t in ins]
                out_sp = [t.numel() for t in outs]
                chunks = list(outs)
                finish.append(lambda: [c.view(-1).copy_(p) for c, p in zip(chunks, dst.split(out_sp))])
            else:
                src = ins[0] if ins else self._buffer(spec.in_nelems or 0, None)
                dst = outs[0] if outs else self._buffer(spec.out_nelems or src.numel(), src)
                in_sp = list(spec.in_splits) if len(spec.in_splits) == n else None
                out_sp = list(spec.out_splits) if len(spec.out_splits) == n else None
                if in_sp is not None and src.dim() and sum(in_sp) != src.shape[0]:
                    src = self._buffer(sum(in_sp) * _row(src), src)
                if out_sp is not None and (not dst.dim() or sum(out_sp) != dst.shape[0]):
                    dst = self._buffer(sum(out_sp) * _row(src), src)
                if in_sp is None and src.numel() % n:
                    in_sp = _even(src.shape[0] if src.dim() else 1, n)
                if out_sp is None and dst.numel() % n:
                    out_sp = _even(dst.shape[0] if dst.dim() else 1, n)
            row_in, row_out = _row(src), _row(dst)
            s, d = wired([src.reshape(-1), dst.reshape(-1)])
            scale = s.numel() // max(src.numel(), 1) if src.numel() else 1
            in_e = [x * row_in * scale for x in in_sp] if in_sp is not None else None
            out_e = [x * row_out * scale for x in out_sp] if out_sp is not None else None
            rec.size_bytes = s.numel() * s.element_size()
            rec.wire_dtype = str(s.dtype).replace("torch.", "")
            return dist.all_to_all_single(d, s, out_e, in_e, group=group, async_op=a), finish
        if kind in ("gather", "scatter"):
            me = dist.get_rank(group) if group is not None else dist.get_rank()
            root = spec.root or 0
            if kind == "gather":
                src = ins[0] if ins else self._buffer(spec.in_nelems or 0, None)
                (s,) = wired([src])
                lst = [self._buffer(s.numel(), s) for _ in range(n)] if me == root else None
                rec.size_bytes = s.numel() * s.element_size() * n
                rec.wire_dtype = str(s.dtype).replace("torch.", "")
                return dist.gather(s, lst, dst=self._global(group, root), group=group, async_op=a), finish
            dst = outs[0] if outs else self._buffer(spec.out_nelems or 0, None)
            (d,) = wired([dst])
            lst = [self._buffer(d.numel(), d) for _ in range(n)] if me == root else None
            rec.size_bytes = d.numel() * d.element_size() * n
            rec.wire_dtype = str(d.dtype).replace("torch.", "")
            return dist.scatter(d, lst, src=self._global(group, root), group=group, async_op=a), finish
        raise CollectiveFailed(f"rank {self.rank}: collective kind {kind!r} of {spec.describe()} is not replayable")

    def _alloc_out(self, tid: int, executor: Any, by_tid: dict[int, Any]) -> Any:
        if tid in by_tid:
            return by_tid[tid]
        t = executor.tensors.get(tid)
        if t is None:
            return None
        from .executor import dtype_from_name

        out = self.torch.empty(list(t["shape"]), dtype=dtype_from_name(t["dtype"]),
                               device=executor.map_device(t.get("device")))
        by_tid[tid] = out
        return out

    # -- results ---------------------------------------------------------------------------

    def rows(self, synthetic: bool = False) -> list[dict[str, Any]]:
        """One dict per collective (columns :data:`COLLECTIVE_COLUMNS`), in plan order.

        ``time_us`` is the median over every call but the first (the probe iteration), or the
        only call; ``calls`` counts them all.
        """
        import torch.distributed as dist

        out = []
        for rec in sorted(self.records.values(), key=lambda r: r.spec.op_index):
            s = rec.spec
            if s.kind == "wait":
                continue
            times = rec.times[1:] if len(rec.times) > 1 else rec.times
            med = statistics.median(times) if times else math.nan
            group = self._group(s)
            n = dist.get_world_size(group) if dist.is_initialized() else (s.pg_size or self.world)
            alg, bus = bandwidth(s.kind, rec.size_bytes, med, n)
            out.append({
                "rank": self.rank, "index": s.index, "op_index": s.op_index, "name": s.name, "kind": s.kind,
                "pg_name": s.pg_name or "default", "pg_size": n, "dtype": s.dtype, "wire_dtype": rec.wire_dtype,
                "in_nelems": s.in_nelems, "out_nelems": s.out_nelems, "size_bytes": rec.size_bytes,
                "mode": "async" if s.asynchronous else "sync", "calls": len(rec.times),
                "time_us": med * 1e6 if math.isfinite(med) else math.nan,
                "algbw_gbps": alg, "busbw_gbps": bus, "synthetic": synthetic,
            })
        return out


class _Works:
    """Several works waited as one."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            if w is not None:
                w.wait()
        return True


def _row(t: Any) -> int:
    """Elements per dim-0 row of ``t`` (1 for 0-d and 1-d tensors)."""
    if t.dim() <= 1:
        return 1
    return int(math.prod(t.shape[1:]))


def _even(rows: int, n: int) -> list[int]:
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _out_tids(enc: Any) -> list[int]:
    out: list[int] = []
    if isinstance(enc, list):
        for e in enc:
            out.extend(_out_tids(e))
    elif isinstance(enc, dict) and "t" in enc:
        out.append(int(enc["t"]))
    return out


def _zip_tensors(enc: Any, val: Any, out: dict[int, Any]) -> None:
    """Map plan tensor ids of an op's encoded arguments to the tensors the executor passed."""
    if isinstance(enc, dict) and "t" in enc:
        if val is not None and hasattr(val, "data_ptr"):
            out[int(enc["t"])] = val
    elif isinstance(enc, list) and isinstance(val, (list, tuple)):
        for e, v in zip(enc, val):
            _zip_tensors(e, v, out)


def _mirror(enc: Any, by_tid: dict[int, Any]) -> Any:
    """The op's result shaped like its recorded outputs: tensors we hold, None elsewhere."""
    if isinstance(enc, list):
        return [_mirror(e, by_tid) for e in enc]
    if isinstance(enc, dict) and "t" in enc:
        return by_tid.get(int(enc["t"]))
    return None


# ----------------------------------------------------------------------------------------------
# Fault injection (tests of the watchdog): MYSTIQUE_DIST_FAULT="die:RANK:INDEX" or "hang:RANK:INDEX"
# ----------------------------------------------------------------------------------------------


FAULT_ENV = "MYSTIQUE_DIST_FAULT"


def parse_fault(spec: str | None, rank: int) -> tuple[str, int] | None:
    """``"die:1:2"``: rank 1 exits abruptly when it reaches collective #2; ``"hang:1:2"``: it
    sleeps forever there. Returns ``(action, index)`` for this rank, or None."""
    spec = spec if spec is not None else os.environ.get(FAULT_ENV)
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in ("die", "hang") or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected die:RANK:INDEX or hang:RANK:INDEX")
    if int(parts[1]) != rank:
        return None
    return parts[0], int(parts[2])


def _inject(action: str) -> None:
    if action == "die":
        os._exit(17)
    while True:  # hang: a rank that never reaches the collective
        time.sleep(3600)
