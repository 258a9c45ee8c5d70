"""The plan builder: turns the outermost operators of one iteration of a trace into plan ops, with
their tensors and storages.

Tensor and storage ids of the trace are reused by the observer once memory is freed, so the
builder renames them: a trace tensor gets a new plan id each time an op produces it, and a new
storage version starts whenever an op outputs a tensor whose storage is not one of its inputs'.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import UsageError
from ..io import show
from ..trace.model import Arg, Node, TensorRef, Trace
from .classify import resolve
from .recipes import FLOAT_DTYPES, DataRecipes
from .runtime.format import LAYOUTS, MEMORY_FORMATS, SCALAR_TYPES, contiguous_strides, extent
from .runtime.schemas import Schema, policy_refusal


def _tensor_key(t: TensorRef) -> tuple:
    return (t.tensor_id, t.storage_id, t.offset, t.numel, t.itemsize, t.device, tuple(t.shape),
            tuple(t.strides) if t.strides is not None else None, t.dtype)


def _wrapped_scalar_clash(t: TensorRef, storage: dict[str, Any]) -> bool:
    """Whether ``t``, an input naming a storage the plan already knows, is a 0-dim tensor of another dtype.

    Such a tensor cannot share that storage: it is a Python number wrapped by the op's caller (a
    double or a long) allocated at the address of a freed tensor, whose storage id the observer reuses.
    """
    return not t.shape and t.dtype != storage["dtype"] and t.dtype != "undefined"


def _strides(t: TensorRef) -> list[int]:
    if t.strides is not None and len(t.strides) == len(t.shape):
        return [int(s) for s in t.strides]
    return contiguous_strides(t.shape)


class PlanBuilder:
    """Builds the ops, tensors and storages of a plan, one outermost node at a time (:meth:`build_op`)."""

    def __init__(self, trace: Trace, allow_ops: Sequence[str] = ()):
        self.trace = trace
        self.allow_ops = tuple(allow_ops)  # patterns of ops outside runtime.ALLOWED_OP_NAMESPACES to call
        self.tensors: list[dict[str, Any]] = []
        self.storages: list[dict[str, Any]] = []
        self.cur_tensor: dict[tuple, int] = {}
        self.cur_storage: dict[int, int] = {}
        self.data = DataRecipes(self.tensors, self.storages)  # the storages' data recipes
        self.devices: Counter[str] = Counter()
        # (trace storage id, dtype) -> plan storage of wrapped Python numbers whose storage id clashed
        self.scalar_storage: dict[tuple[int, str], int] = {}
        # rf_id -> (start, end) in us of the op's first Kineto event: the host timeline behind gap_us
        self.kineto_spans: dict[int, tuple[float, float]] | None = None
        self._prev_span: tuple[Any, float] | None = None  # (thread, end) of the previous op built
        self._seq_index: dict[Any, tuple[list[int], list[int]]] | None = None

    # per-op host timeline and autograd ---------------------------------------------------

    def host_gap(self, node: Node) -> float | None:
        """``gap_us``: host time (us) from the end of the previous op's Kineto event to the start of
        this op's, when both are known and ran on one thread (clamped at 0); None otherwise (the
        first op, an op without a Kineto event, a change of thread). Call in op order."""
        spans = self.kineto_spans
        span = spans.get(node.rf_id) if spans and node.rf_id is not None else None
        prev, self._prev_span = self._prev_span, ((node.tid, span[1]) if span is not None else None)
        if span is None or prev is None or prev[0] != node.tid:
            return None
        return finite(round(max(0.0, span[0] - prev[1]), 3))

    def records_autograd(self, node: Node) -> bool:
        """Whether the op recorded an autograd node when captured.

        ``seq_id`` is the thread's autograd sequence number *peeked* when an op dispatches with
        grad mode on; it is only consumed (incremented) when an autograd node is created. So an op
        run in grad mode on inputs that do not require grad (a step of ``torch.add`` on plain
        tensors) records the same ``seq_id`` as the next op. The op recorded a node when the next
        op with a ``seq_id`` on its thread after its subtree has a larger one; with no such op, when
        a node of its subtree does, else (the last op) as before: whenever it has a ``seq_id``.
        """
        seq = node.seq_id
        if seq is None or seq < 0:
            return False
        if self._seq_index is None:
            by_thread: dict[Any, list[tuple[int, int]]] = {}
            for n in self.trace.nodes.values():
                if n.seq_id is not None and n.seq_id >= 0:
                    by_thread.setdefault(n.tid, []).append((n.id, n.seq_id))
            self._seq_index = {}
            for k, v in by_thread.items():
                v.sort()
                self._seq_index[k] = ([i for i, _ in v], [q for _, q in v])
        ids, seqs = self._seq_index.get(node.tid, ([], []))
        sub = list(self.trace.preorder(node.id))
        j = bisect.bisect_right(ids, max(m.id for m in sub))
        if j < len(ids):
            return seqs[j] > seq
        return True

    # tensors and storages ------------------------------------------------------------------

    def _new_storage(self, t: TensorRef, external: bool, anchor: int | None, current: bool = True) -> int:
        """A new plan storage for ``t``'s; ``current``: it becomes the one its trace storage id names."""
        sid = len(self.storages)
        self.storages.append({
            "id": sid, "nbytes": 0, "dtype": t.dtype, "device": t.device, "external": external,
            "anchor": anchor, "recipe": None, "trace_storage_id": t.storage_id,
        })
        if current:
            self.cur_storage[t.storage_id] = sid
        return sid

    def _new_tensor(self, t: TensorRef, sid: int, source: str) -> int:
        tid = len(self.tensors)
        strides = _strides(t)
        self.tensors.append({
            "id": tid, "storage": sid, "offset": int(t.offset), "shape": [int(s) for s in t.shape],
            "strides": strides, "dtype": t.dtype, "device": t.device, "source": source,
            "trace_id": t.tensor_id,
        })
        nbytes = extent(t.shape, strides, int(t.offset)) * int(t.itemsize or 1)
        st = self.storages[sid]
        st["nbytes"] = max(int(st["nbytes"]), int(nbytes))
        if t.device:
            self.devices[t.device] += 1
        if t.value_range is not None and t.dtype not in FLOAT_DTYPES and t.dtype != "bool":
            lo, hi = t.value_range
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lo, hi)):
                self.data.trace_range(tid, int(lo), int(hi) + 1)
        return tid

    def input_tensor(self, t: TensorRef) -> int:
        key = _tensor_key(t)
        tid = self.cur_tensor.get(key)
        if tid is not None:
            return tid
        sid = self.cur_storage.get(t.storage_id)
        if sid is not None and _wrapped_scalar_clash(t, self.storages[sid]):
            # a Python number the op wrapped into a 0-dim tensor (float -> double, int -> long) where a
            # freed tensor of another dtype lived: the observer reused the freed storage's id. Binding it
            # to that storage would read the number's bits out of unrelated data (a float32 loss read as
            # a double, an int64 step count read as a denormal double): it gets a storage of its own
            skey = (t.storage_id, t.dtype)
            sid = self.scalar_storage.get(skey)
            if sid is None:
                sid = self.scalar_storage[skey] = self._new_storage(t, external=True, anchor=None, current=False)
            tid = self._new_tensor(t, sid, "external")
            self.cur_tensor[key] = tid
            return tid
        if sid is None:
            sid = self._new_storage(t, external=True, anchor=None)
            source = "external"
        else:
            source = "external" if self.storages[sid]["external"] else "derived"
        tid = self._new_tensor(t, sid, source)
        self.cur_tensor[key] = tid
        return tid

    def output_tensor(self, t: TensorRef, in_keys: dict[tuple, int], in_storages: set[int]) -> int:
        key = _tensor_key(t)
        if key in in_keys:
            return in_keys[key]
        if t.storage_id in in_storages and t.storage_id in self.cur_storage:
            sid = self.cur_storage[t.storage_id]
            tid = self._new_tensor(t, sid, "output")
        else:
            sid = self._new_storage(t, external=False, anchor=None)
            tid = self._new_tensor(t, sid, "output")
            self.storages[sid]["anchor"] = tid
        self.cur_tensor[key] = tid
        return tid

    # arguments -----------------------------------------------------------------------------

    def encode(self, a: Arg, stype: str | None, tensor_fn: Callable[[TensorRef], int]) -> Any:
        """The plan encoding of argument ``a`` (of schema type ``stype``); ``tensor_fn`` gives a tensor's plan id."""
        v = a.value
        if isinstance(v, TensorRef):
            if v.dtype == "undefined":
                return None
            return {"t": tensor_fn(v)}
        base = (stype or "").replace("?", "")
        if isinstance(v, list):
            elem = None
            if stype and "[" in stype:
                elem = stype[: stype.index("[")]
            return [self.encode(e, elem, tensor_fn) for e in v]
        if v is None:
            return None if a.kind not in ("Generator", "Stream") else {"none": a.kind}
        if a.kind in ("Generator", "Stream", "Storage"):
            return {"none": a.kind}
        if base.startswith("ScalarType") or a.kind == "ScalarType":
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(SCALAR_TYPES):
                return {"dtype": SCALAR_TYPES[v]}
            if isinstance(v, str):
                return {"dtype": v.replace("torch.", "")}
        if base.startswith("Layout") or a.kind == "Layout":
            if isinstance(v, int) and 0 <= v < len(LAYOUTS):
                return {"layout": LAYOUTS[v]}
        if base.startswith("MemoryFormat") or a.kind == "MemoryFormat":
            if isinstance(v, int) and 0 <= v < len(MEMORY_FORMATS):
                return {"memory_format": MEMORY_FORMATS[v]}
        if base.startswith("Device") or a.kind == "Device":
            return {"device": str(v)}
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return {"float": repr(v)}
        if base in ("int", "SymInt") and isinstance(v, float) and v.is_integer():
            return int(v)
        return v

    def build_op(self, index: int, node: Node, kineto: dict[int, float] | None) -> dict[str, Any]:
        """The plan op of outermost ``node`` (``kineto``: rf_id -> recorded host time in us); UsageError
        when it calls an operator the operator policy refuses (a trace is data, not a program)."""
        action, reason, schema_text, sch = resolve(node, self.allow_ops)
        refused = policy_refusal(sch.qualified, self.allow_ops) if action == "call" and sch is not None else ""
        if refused:
            raise UsageError(f"trace node {node.id} ({show(node.name)[:60]}): {refused}")
        in_keys: dict[tuple, int] = {}
        in_storages: set[int] = set()

        def as_input(t: TensorRef) -> int:
            tid = self.input_tensor(t)
            in_keys[_tensor_key(t)] = tid
            in_storages.add(t.storage_id)
            return tid

        args, kwargs = self.encode_inputs(node.inputs, sch, as_input)
        outputs = [self.encode(a, None, lambda t: self.output_tensor(t, in_keys, in_storages))
                   for a in node.outputs]
        op = {
            "index": index,
            "node_id": node.id,
            "rf_id": node.rf_id,
            "name": node.name,
            "op": sch.qualified if sch is not None else node.name,
            "schema": schema_text,
            "action": action,
            "reason": reason,
            "args": args,
            "kwargs": kwargs,
            "outputs": outputs,
            "orig_us": finite(kineto.get(node.rf_id)) if kineto and node.rf_id is not None else None,
            "scope": self.scope(node),
            # the op recorded an autograd node (a forward op run with grad enabled)
            "grad": bool(action == "call" and self.records_autograd(node)),
            # host time between the previous op and this one in the captured step (pacing="recorded")
            "gap_us": self.host_gap(node),
        }
        if sch is not None:
            op["_schema"] = sch
        return op

    def encode_inputs(self, inputs: list[Arg], sch: Schema | None,
                      as_input: Callable[[TensorRef], int]) -> tuple[list[Any], dict[str, Any]]:
        """An op's encoded ``(args, kwargs)``: by the schema where there is one (kwarg-only arguments and
        those after a left-out default go by name), else all positional."""
        if sch is None:
            return [self.encode(a, None, as_input) for a in inputs], {}
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        by_name = False  # once a positional argument is left out, the later ones go by name
        for sa, a in zip(sch.args, inputs):
            enc = self.encode(a, sa.type, as_input)
            if enc is None and not sa.optional and sa.default is not None:
                by_name = True
                continue  # an absent value with a default: let the operator use it
            if sa.kwarg_only or by_name:
                kwargs[sa.name] = enc
            else:
                args.append(enc)
        return args, kwargs

    def scope(self, node: Node) -> str:
        """The names of the label nodes above ``node`` (outermost first), thread/process nodes left out."""
        names = []
        nodes = self.trace.nodes
        parent = node.parent
        hops = 0
        while parent is not None and parent in nodes and hops < 64:
            p = nodes[parent]
            if p.name.startswith("[pytorch|profiler") or p.id == parent and p.parent == p.id:
                break
            names.append(p.name)
            if p.parent == p.id:
                break
            parent = p.parent
            hops += 1
        return " / ".join(reversed(names))


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number, else None."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def original_device(devices: Counter[str]) -> str:
    """The accelerator most tensors were on (else ``cpu``). Only device strings torch parses count: a
    trace's device strings are untrusted (``cuda:-1``, a type of a backend not installed here), and the
    plan's ``original_device`` is handed to ``torch.device`` by the executor."""
    accel = [(n, d) for d, n in devices.items() if d and not d.startswith("cpu") and _parses_as_device(d)]
    if accel:
        return max(accel)[1]
    return "cpu"


def _parses_as_device(text: str) -> bool:
    try:
        return isinstance(text, str) and text.isprintable() and str(torch.device(text)) == text
    except (RuntimeError, ValueError, TypeError):
        return False
