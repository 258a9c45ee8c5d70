"""What a trace's collectives were: one :class:`CommSpec` per collective op of a rank's plan.

A trace records a collective as a ``c10d::*`` operator (``c10d::allreduce_``,
``c10d::alltoall_base_``, ...) whose subtree holds a ``record_param_comms`` node with the message
(``collective_name``, ``in_msg_nelems``, ``out_msg_nelems``, split sizes, ``pg_name``,
``pg_desc``, ``pg_size``: attributes from schema 1.1, positional inputs before), as a
``_c10d_functional::*`` operator, or as a bare ``record_param_comms`` node (``wait``, and the
collectives of older traces). The ``## process_group:init ##`` node of newer traces lists the
process groups (``pg_name``, ``pg_desc``, ``ranks``, ``group_size``, ``backend_config``); 1.0.1
traces have none: their collectives ran on the default (world) group.

:func:`comm_specs` turns the collectives of a replay plan into :class:`CommSpec` records (keyed by
trace node id); :func:`mirror_for_peer` derives a synthetic peer's; :func:`bandwidth` follows the
nccl-tests conventions (:func:`bus_factor`). Collectives whose ``wait`` the trace records later in
the same iteration are marked ``asynchronous``. Replaying them: :mod:`mystique.distributed.runner`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..trace.analysis import tensors

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
_ET_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
              "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


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
