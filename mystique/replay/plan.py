"""Build the replay plan (``benchmark.json``) of one iteration of an execution trace.

The plan is self-contained JSON with no code (see :mod:`mystique.replay.executor` for how it
runs): ``{"format": "mystique-benchmark", "version": 1, "metadata": {...}, "storages": [...],
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
  "trace_storage_id"}``; ``recipe`` is the data recipe (``randn``, ``randint``, ``uniform_pos``,
  ``bernoulli``, ``offsets``, ``ones``; see :func:`mystique.replay.executor.fill_storage`). Index
  data takes the range the consumers allow (and the trace's recorded min/max); embedding-bag
  indices are Zipf-skewed (:data:`EMBEDDING_BAG_ZIPF`); 0-dim floats (wrapped Python numbers
  whose values the trace does not keep) are 1.

Tensor and storage ids of the trace are reused by the observer once memory is freed, so the
builder renames them: a trace tensor gets a new plan id each time an op produces it, and a new
storage version starts whenever an op outputs a tensor whose storage is not one of its inputs'.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..trace.model import Arg, Node, TensorRef, Trace
from . import executor as ex

_UNIFORM_POS_OPS = frozenset({
    "aten::log", "aten::log_", "aten::log2", "aten::log10", "aten::sqrt", "aten::sqrt_", "aten::rsqrt",
    "aten::rsqrt_", "aten::reciprocal", "aten::_foreach_sqrt", "aten::_foreach_sqrt_", "aten::_foreach_log",
    "aten::_foreach_log_", "aten::_foreach_rsqrt", "aten::lgamma", "aten::digamma",
})
_PROBABILITY_OPS = frozenset({
    "aten::binary_cross_entropy", "aten::binary_cross_entropy_backward",
})
_POW_OPS = frozenset({"aten::pow", "aten::pow_", "aten::_foreach_pow", "aten::_foreach_pow_"})
_EMBEDDING_BAG_OPS = frozenset({
    "aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
})
_DIM_INDEX_OPS = frozenset({
    "aten::gather", "aten::scatter", "aten::scatter_", "aten::scatter_add", "aten::scatter_add_",
    "aten::scatter_reduce", "aten::scatter_reduce_", "aten::index_select", "aten::index_add",
    "aten::index_add_", "aten::index_copy", "aten::index_copy_", "aten::index_fill", "aten::index_fill_",
    "aten::take_along_dim", "aten::index_reduce", "aten::index_reduce_",
})
_INDEX_LIST_OPS = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
                             "aten::_unsafe_index", "aten::_unsafe_index_put"})
_NLL_OPS = frozenset({"aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward", "aten::nll_loss2d",
                      "aten::nll_loss2d_forward", "aten::cross_entropy_loss"})
_NLL_BACKWARD_OPS = frozenset({"aten::nll_loss_backward", "aten::nll_loss2d_backward"})
_FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
# Exponent of the Zipf law drawn for embedding-bag indices (recommendation tables). The trace records only
# each index tensor's min and max; uniform indices over a large table touch ~3x more distinct rows than the
# power-law popularity of real categorical features does (Criteo's fit is about 1.05, as in the reference
# DLRM workload), so a replay with uniform indices misses the caches the original hit and runs the
# embedding ops (forward and backward) slower. Token ids (``aten::embedding``) stay uniform.
EMBEDDING_BAG_ZIPF = 1.05


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
        from ..io import atomic_write_text

        return atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        """Read a ``benchmark.json`` (UsageError when missing or not a plan)."""
        p = Path(path)
        if not p.exists():
            raise UsageError(f"{_shown(p)} does not exist")
        try:
            data = ex.load_plan(p)
        except ex.ReplayError as exc:
            raise UsageError(f"{_shown(p)}: {_shown(exc)}") from exc
        except (ValueError, RecursionError) as exc:  # a 5000-digit number; JSON nested too deeply
            raise UsageError(f"{_shown(p)}: not a usable benchmark plan: {type(exc).__name__}") from exc
        problem = plan_problem(data)
        if problem:
            raise UsageError(f"{_shown(p)}: malformed benchmark plan: {problem}")
        return cls(data)

    def copy(self) -> Plan:
        return Plan(json.loads(json.dumps(self.data)))


# ----------------------------------------------------------------------------------------------
# Validation of a loaded plan (a benchmark.json is untrusted input, like a trace)
# ----------------------------------------------------------------------------------------------

_MAX_PLAN_BYTES = 2**60  # one storage or tensor extent (1 EiB): beyond any device, far from 64-bit overflow
_MAX_ENC_DEPTH = 32
_ENC_KEYS = frozenset({"t", "dtype", "layout", "memory_format", "device", "float", "none"})


def _shown(v: Any) -> str:
    s = str(v)
    return s if s.isprintable() else ascii(s)[1:-1]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _nat_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) and 0 <= x <= _MAX_PLAN_BYTES for x in v)


def plan_problem(data: Any) -> str:
    """What makes a decoded plan unusable by the executor, in one line ("" when nothing does).

    Checked: the tables' types, that ids are ``0..n-1`` (the executor sizes arrays by them), that
    every reference (a tensor's storage, ``{"t": id}`` in an op, an anchor, an input) exists,
    non-negative sizes, offsets and strides with extents below 1 EiB, op names and actions, the
    argument encodings' shapes and the data recipes' types. Unknown keys are left alone.
    """
    if not isinstance(data, dict):
        return "not an object"
    for key, kind in (("metadata", dict), ("storages", list), ("tensors", list), ("ops", list)):
        if not isinstance(data.get(key), kind):
            return f"{key!r} is not a{'n object' if kind is dict else ' list'}"
    storages, tensors = data["storages"], data["tensors"]
    for table, rows in (("storages", storages), ("tensors", tensors)):
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or row.get("id") != i or not _is_int(row.get("id")):
                return f"{table}[{i}] has no id {i} (ids are 0..n-1 in order)"
    for s in storages:
        where = f"storage {s['id']}"
        if not _is_int(s.get("nbytes")) or not 0 <= s["nbytes"] <= _MAX_PLAN_BYTES:
            return f"{where} has nbytes {_short_value(s.get('nbytes'))}"
        if not isinstance(s.get("dtype"), str):
            return f"{where} has dtype {_short_value(s.get('dtype'))}"
        if s.get("device") is not None and not isinstance(s["device"], str):
            return f"{where} has device {_short_value(s['device'])}"
        anchor = s.get("anchor")
        if anchor is not None and not (_is_int(anchor) and 0 <= anchor < len(tensors)):
            return f"{where} has anchor {_short_value(anchor)}, not a tensor"
        recipe = s.get("recipe")
        if recipe is not None and not _recipe_ok(recipe):
            return f"{where} has recipe {_short_value(recipe)}"
    for t in tensors:
        where = f"tensor {t['id']}"
        if not (_is_int(t.get("storage")) and 0 <= t["storage"] < len(storages)):
            return f"{where} has storage {_short_value(t.get('storage'))}, not a storage"
        shape, strides, offset = t.get("shape"), t.get("strides"), t.get("offset")
        if not _nat_list(shape):
            return f"{where} has shape {_short_value(shape)}, expected non-negative integers"
        if strides is not None and not (_nat_list(strides) and len(strides) == len(shape)):
            return f"{where} has strides {_short_value(strides)} for shape {_short_value(shape)}"
        if not (_is_int(offset) and 0 <= offset <= _MAX_PLAN_BYTES):
            return f"{where} has offset {_short_value(offset)}"
        if not isinstance(t.get("dtype"), str):
            return f"{where} has dtype {_short_value(t.get('dtype'))}"
        if t.get("source", "unused") not in ("external", "output", "derived", "unused"):
            return f"{where} has source {_short_value(t.get('source'))}"
        if t.get("device") is not None and not isinstance(t["device"], str):
            return f"{where} has device {_short_value(t['device'])}"
        numel = math.prod(shape)
        extent = ex._extent(shape, strides or ex.contiguous_strides(shape), offset)
        if numel > _MAX_PLAN_BYTES or extent * 16 > _MAX_PLAN_BYTES:
            return f"{where} of shape {_short_value(shape)} spans more than any device holds"
    inputs = data.get("inputs", [])
    if not isinstance(inputs, list) or not all(_is_int(i) and 0 <= i < len(tensors) for i in inputs):
        return "'inputs' is not a list of tensor ids"
    for i, op in enumerate(data["ops"]):
        where = f"op {i}"
        if not isinstance(op, dict):
            return f"{where} is not an object"
        for key in ("name", "op", "schema"):
            if op.get(key) is not None and not isinstance(op[key], str):
                return f"{where} has {key} {_short_value(op[key])}, expected a string"
        if not isinstance(op.get("name"), str):
            return f"{where} has no name"
        if op.get("action") not in ("call", "noop", "skip"):
            return f"{where} has action {_short_value(op.get('action'))}, expected call, noop or skip"
        if not isinstance(op.get("args", []), list) or not isinstance(op.get("outputs", []), list):
            return f"{where} has args or outputs that are not lists"
        kwargs = op.get("kwargs", {})
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            return f"{where} has kwargs that are not an object"
        for label, enc in (("args", op.get("args", [])), ("kwargs", list(kwargs.values())),
                           ("outputs", op.get("outputs", []))):
            bad = _encoding_problem(enc, len(tensors))
            if bad:
                return f"{where} ({_shown(op['name'])[:60]}) {label}: {bad}"
    return ""


def _recipe_ok(recipe: Any) -> bool:
    if not isinstance(recipe, dict) or not isinstance(recipe.get("kind", ""), str):
        return False
    for k, v in recipe.items():
        if k == "segments":  # [start, count, stride, ...two numbers]: positions into the storage
            if not (isinstance(v, list) and all(
                    isinstance(seg, list) and len(seg) == 5 and all(_is_int(x) and 0 <= x <= _MAX_PLAN_BYTES
                                                                    for x in seg[:3])
                    and all(isinstance(x, (int, float)) and math.isfinite(x) for x in seg[3:]) for seg in v)):
                return False
        elif k in ("low", "high", "total", "std", "zipf") and not (
                isinstance(v, (int, float)) and math.isfinite(v)):
            return False
    return True


def _encoding_problem(enc: Any, n_tensors: int) -> str:
    stack = [(enc, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > _MAX_ENC_DEPTH:
            return f"nested more than {_MAX_ENC_DEPTH} levels"
        if isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, dict):
            if len(v) != 1 or not set(v) <= _ENC_KEYS:
                return f"unknown encoding {_short_value(v)}"
            ((key, val),) = v.items()
            if key == "t":
                if not (_is_int(val) and 0 <= val < n_tensors):
                    return f"tensor reference {_short_value(val)} names no tensor"
            elif key != "none" and not isinstance(val, str):
                return f"encoding {_short_value(v)} holds no string"
        elif v is not None and not isinstance(v, (bool, int, float, str)):
            return f"value {_short_value(v)}"
    return ""


def _short_value(v: Any) -> str:
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxlong, r.maxother = 2, 4, 3, 40, 24, 30
    return _shown(r.repr(v))[:80]


# ----------------------------------------------------------------------------------------------
# Classification and schemas
# ----------------------------------------------------------------------------------------------


def classify(node: Node) -> tuple[str, str]:
    """``(action, reason)`` of an outermost node: ``call``, ``noop`` or ``skip``."""
    name = node.name
    if name in ex.COLLECTIVE_NAMES or name.startswith(ex.COLLECTIVE_PREFIXES):
        return "skip", "collective"
    if name in ex.NOOP_NAMES or name.startswith("profiler::") or name.startswith("[pytorch|profiler"):
        return "noop", "profiler/stream bookkeeping"
    if node.kernel_backend:
        return "skip", f"compiled kernel ({node.kernel_backend})"
    if "::" not in name and not node.op_schema:
        return "skip", "not an operator"
    return "call", ""


def _value_kind(a: Arg) -> str:
    if isinstance(a.value, TensorRef):
        return "Tensor"
    if isinstance(a.value, list):
        return "list"
    if a.value is None:
        return "None"
    if isinstance(a.value, bool):
        return "bool"
    if isinstance(a.value, int):
        return "int"
    if isinstance(a.value, float):
        return "float"
    return "str"


def _type_accepts(stype: str, a: Arg) -> bool:
    base = stype.replace("?", "")
    k = _value_kind(a)
    if k == "None":
        return "?" in stype or base.startswith(("Generator", "Tensor"))
    if base.startswith("Tensor") and "[" not in base:
        return k == "Tensor"
    if "[" in base:
        return k in ("list", "int") if not base.startswith("Tensor") else k == "list"
    if base in ("int", "SymInt"):
        return k in ("int", "bool")
    if base == "float":
        return k in ("int", "float")
    if base == "bool":
        return k in ("bool", "int")
    if base == "Scalar":
        return k in ("int", "float", "bool")
    if base in ("ScalarType", "Layout", "MemoryFormat"):
        return k == "int"
    if base == "Device":
        return k in ("str", "int")
    if base == "str":
        return k == "str"
    return True


def match_schema(name: str, inputs: list[Arg], allow_ops: Sequence[str] = ()) -> str | None:
    """The schema of the overload of ``name`` that accepts ``inputs`` (None when none does, or when
    :func:`executor.op_refusal` refuses ``name`` with ``allow_ops``)."""
    best = None
    for text in ex.overload_schemas(name, allow_ops):
        try:
            sch = ex.parse_schema(text)
        except ValueError:
            continue
        if len(inputs) > len(sch.args):
            continue
        if any(a.default is None and i >= len(inputs) for i, a in enumerate(sch.args)):
            continue
        if all(_type_accepts(sa.type, a) for sa, a in zip(sch.args, inputs)):
            if best is None or (sch.overload != "out" and len(sch.args) < len(best[1].args)):
                best = (text, sch)
    return best[0] if best else None


# ----------------------------------------------------------------------------------------------
# The builder
# ----------------------------------------------------------------------------------------------


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
    return ex.contiguous_strides(t.shape)


class _Builder:
    def __init__(self, trace: Trace, allow_ops: Sequence[str] = ()):
        self.trace = trace
        self.allow_ops = tuple(allow_ops)  # patterns of ops outside ex.ALLOWED_OP_NAMESPACES to call
        self.tensors: list[dict[str, Any]] = []
        self.storages: list[dict[str, Any]] = []
        self.cur_tensor: dict[tuple, int] = {}
        self.cur_storage: dict[int, int] = {}
        self.ranges: dict[int, list[tuple[int, int]]] = {}  # plan storage -> [(low, high)]
        # plan storage -> {(offset, numel, stride): [(low, high)]}: ranges of each view of a storage
        self.view_ranges: dict[int, dict[tuple[int, int, int], list[tuple[int, int]]]] = {}
        self.trace_ranges: dict[int, tuple[int, int]] = {}
        self.devices: Counter[str] = Counter()
        self.skewed: set[int] = set()  # plan storages of embedding-bag indices (Zipf-skewed recipe)
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
        return _finite(round(max(0.0, span[0] - prev[1]), 3))

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

    def _new_storage(self, t: TensorRef, external: bool, anchor: int | None) -> int:
        sid = len(self.storages)
        self.storages.append({
            "id": sid, "nbytes": 0, "dtype": t.dtype, "device": t.device, "external": external,
            "anchor": anchor, "recipe": None, "trace_storage_id": t.storage_id,
        })
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
        nbytes = ex._extent(t.shape, strides, int(t.offset)) * int(t.itemsize or 1)
        st = self.storages[sid]
        st["nbytes"] = max(int(st["nbytes"]), int(nbytes))
        if t.device:
            self.devices[t.device] += 1
        if t.value_range is not None and t.dtype not in _FLOAT_DTYPES and t.dtype != "bool":
            lo, hi = t.value_range
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lo, hi)):
                self.trace_ranges[tid] = (int(lo), int(hi) + 1)
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
                sid = len(self.storages)
                self.storages.append({
                    "id": sid, "nbytes": 0, "dtype": t.dtype, "device": t.device, "external": True,
                    "anchor": None, "recipe": None, "trace_storage_id": t.storage_id,
                })
                self.scalar_storage[skey] = sid
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

    def encode(self, a: Arg, stype: str | None, tensor_fn) -> Any:
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
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(ex.SCALAR_TYPES):
                return {"dtype": ex.SCALAR_TYPES[v]}
            if isinstance(v, str):
                return {"dtype": v.replace("torch.", "")}
        if base.startswith("Layout") or a.kind == "Layout":
            if isinstance(v, int) and 0 <= v < len(ex.LAYOUTS):
                return {"layout": ex.LAYOUTS[v]}
        if base.startswith("MemoryFormat") or a.kind == "MemoryFormat":
            if isinstance(v, int) and 0 <= v < len(ex.MEMORY_FORMATS):
                return {"memory_format": ex.MEMORY_FORMATS[v]}
        if base.startswith("Device") or a.kind == "Device":
            return {"device": str(v)}
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return {"float": repr(v)}
        if base in ("int", "SymInt") and isinstance(v, float) and v.is_integer():
            return int(v)
        return v

    def build_op(self, index: int, node: Node, kineto: dict[int, float] | None) -> dict[str, Any]:
        action, reason = classify(node)
        schema_text = node.op_schema
        sch: ex.Schema | None = None
        refused = ex.op_refusal(node.name, self.allow_ops) if action == "call" else ""
        if refused:
            action, reason = "skip", refused  # an operator of a namespace not allowed: never resolved
        if action == "call":
            if not schema_text:
                schema_text = match_schema(node.name, node.inputs, self.allow_ops) or ""
            if schema_text:
                try:
                    sch = ex.parse_schema(schema_text)
                except ValueError:
                    sch = None
            if sch is None:
                ns = node.name.split("::", 1)[0]
                action = "skip"
                reason = ("custom op unavailable"
                          if ns not in ("aten", "prims") and not ex.overload_schemas(node.name, self.allow_ops)
                          else "no operator schema recorded or matched")
            elif ex.op_refusal(sch.qualified, self.allow_ops):  # a recorded schema of another namespace
                action, reason = "skip", ex.op_refusal(sch.qualified, self.allow_ops)
            elif len(node.inputs) > len(sch.args):
                action, reason = "skip", "recorded arguments do not match the schema"
            elif any(a.kind in ("Storage",) for a in node.inputs):
                action, reason = "skip", "storage arguments are not replayable"
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        in_keys: dict[tuple, int] = {}
        in_storages: set[int] = set()

        def as_input(t: TensorRef) -> int:
            tid = self.input_tensor(t)
            in_keys[_tensor_key(t)] = tid
            in_storages.add(t.storage_id)
            return tid

        if sch is not None:
            by_name = False  # once a positional argument is left out, the later ones go by name
            for sa, a in zip(sch.args, node.inputs):
                enc = self.encode(a, sa.type, as_input)
                if enc is None and not sa.optional and sa.default is not None:
                    by_name = True
                    continue  # an absent value with a default: let the operator use it
                if sa.kwarg_only or by_name:
                    kwargs[sa.name] = enc
                else:
                    args.append(enc)
        else:
            args = [self.encode(a, None, as_input) for a in node.inputs]
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
            "orig_us": _finite(kineto.get(node.rf_id)) if kineto and node.rf_id is not None else None,
            "scope": self.scope(node),
            # the op recorded an autograd node (a forward op run with grad enabled)
            "grad": bool(action == "call" and self.records_autograd(node)),
            # host time between the previous op and this one in the captured step (pacing="recorded")
            "gap_us": self.host_gap(node),
        }
        if sch is not None:
            op["_schema"] = sch
        return op

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

    # data recipes --------------------------------------------------------------------------

    def constrain(self, tid: int | None, low: int, high: int) -> None:
        if tid is None:
            return
        t = self.tensors[tid]
        self.ranges.setdefault(t["storage"], []).append((int(low), int(high)))
        self._view_range(tid, int(low), int(high))

    def _view_range(self, tid: int, low: int, high: int, first: bool = False) -> None:
        t = self.tensors[tid]
        strides = t.get("strides") or [1]
        if len(t["shape"]) > 1 and list(strides) != ex.contiguous_strides(t["shape"]):
            return  # only 1-D or contiguous views are tracked as segments
        key = (int(t["offset"]), int(math.prod(t["shape"])), int(strides[-1] or 1) if t["shape"] else 1)
        lst = self.view_ranges.setdefault(t["storage"], {}).setdefault(key, [])
        lst.insert(0, (low, high)) if first else lst.append((low, high))

    def recipes(self, ops: list[dict[str, Any]]) -> None:
        kinds: dict[int, dict[str, Any]] = {}
        for op in ops:
            sch: ex.Schema | None = op.get("_schema")
            if sch is None or op["action"] != "call":
                continue
            named = _named_args(sch, op)
            name = f"{sch.namespace}::{sch.name}"
            shape = lambda enc: self.tensors[enc["t"]]["shape"] if isinstance(enc, dict) and "t" in enc else None  # noqa: E731
            tid = lambda enc: enc["t"] if isinstance(enc, dict) and "t" in enc else None  # noqa: E731
            if name in ("aten::embedding",):
                w = shape(named.get("weight"))
                if w:
                    self.constrain(tid(named.get("indices")), 0, w[0])
            elif name in ("aten::embedding_dense_backward", "aten::embedding_backward",
                          "aten::embedding_sparse_backward"):
                nw = named.get("num_weights")
                if isinstance(nw, int) and nw > 0:
                    self.constrain(tid(named.get("indices")), 0, nw)
            elif name in _EMBEDDING_BAG_OPS:
                w = shape(named.get("weight"))
                ind = tid(named.get("indices"))
                if w:
                    self.constrain(ind, 0, w[0])
                if ind is not None:
                    self.skewed.add(self.tensors[ind]["storage"])
                off = tid(named.get("offsets"))
                if off is not None and ind is not None:
                    # one segment per offsets view: several tables' offsets often share one storage
                    # (a (T, B) tensor selected row by row), and each row must start at 0 for its table
                    total = math.prod(self.tensors[ind]["shape"])
                    t_off = self.tensors[off]
                    strides = t_off.get("strides") or [1]
                    segment = [int(t_off["offset"]), int(math.prod(t_off["shape"])), int(strides[-1] or 1),
                               int(total), bool(named.get("include_last_offset") or False)]
                    rec = kinds.setdefault(t_off["storage"], {"kind": "offsets", "segments": []})
                    if rec.get("kind") == "offsets" and segment not in rec["segments"]:
                        rec["segments"].append(segment)
            elif name in _DIM_INDEX_OPS:
                s = shape(named.get("self"))
                dim = named.get("dim")
                if s is not None and isinstance(dim, int) and s:
                    d = dim % len(s)
                    self.constrain(tid(named.get("index")), 0, max(s[d], 1))
            elif name in _INDEX_LIST_OPS:
                s = shape(named.get("self"))
                idx = named.get("indices")
                if s is not None and isinstance(idx, list):
                    for k, e in enumerate(idx):
                        t = tid(e)
                        if t is not None and k < len(s) and self.tensors[t]["dtype"] not in ("bool", "uint8"):
                            self.constrain(t, 0, max(s[k], 1))
            elif name in _NLL_OPS or name in _NLL_BACKWARD_OPS:
                s = shape(named.get("self"))
                t = tid(named.get("target"))
                if s and t is not None and self.tensors[t]["dtype"] not in _FLOAT_DTYPES:
                    c = s[1] if len(s) >= 2 else s[0]
                    self.constrain(t, 0, max(c, 1))
            elif name == "aten::one_hot":
                nc = named.get("num_classes")
                if isinstance(nc, int) and nc > 0:
                    self.constrain(tid(named.get("self")), 0, nc)
            elif name in _PROBABILITY_OPS:
                # binary cross-entropy: predictions and targets are probabilities in [0, 1]
                for arg in ("self", "target"):
                    for e in _tensor_encs(named.get(arg)):
                        kinds.setdefault(self.tensors[e]["storage"], {"kind": "uniform_pos"})
            elif name in _UNIFORM_POS_OPS:
                for e in _tensor_encs(named.get("self")):
                    kinds.setdefault(self.tensors[e]["storage"], {"kind": "uniform_pos"})
            elif name in _POW_OPS:
                ex_ = named.get("exponent")
                if isinstance(ex_, float) and not float(ex_).is_integer():
                    for e in _tensor_encs(named.get("self")):
                        kinds.setdefault(self.tensors[e]["storage"], {"kind": "uniform_pos"})
            elif name in ("aten::addcdiv", "aten::addcdiv_", "aten::_foreach_addcdiv", "aten::_foreach_addcdiv_"):
                for e in _tensor_encs(named.get("tensor2")):
                    kinds.setdefault(self.tensors[e]["storage"], {"kind": "uniform_pos"})
        first_shape: dict[int, list[int]] = {}
        for t in self.tensors:
            first_shape.setdefault(t["storage"], t["shape"])
        for tid_, (lo, hi) in self.trace_ranges.items():
            self.ranges.setdefault(self.tensors[tid_]["storage"], []).insert(0, (lo, hi))
            self._view_range(tid_, lo, hi, first=True)
        for st in self.storages:
            sid = st["id"]
            if st["dtype"] == "bool":
                st["recipe"] = {"kind": "bernoulli"}
                continue
            if sid in kinds:
                st["recipe"] = kinds[sid]
                continue
            rs = self.ranges.get(sid)
            if rs:
                lo = max(r[0] for r in rs)
                hi = min(r[1] for r in rs)
                if hi <= lo:  # disagreeing constraints: the consumers' (last ones) win
                    lo, hi = rs[-1]
                st["recipe"] = {"kind": "randint", "low": int(lo), "high": int(max(hi, lo + 1))}
                if sid in self.skewed:
                    st["recipe"]["zipf"] = EMBEDDING_BAG_ZIPF
                views = self.view_ranges.get(sid, {})
                if len(views) > 1:
                    # views of one storage with ranges of their own (e.g. one row of indices per
                    # embedding table): each view keeps its own range instead of the intersection
                    segments = []
                    for (off, cnt, stride), vr in sorted(views.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
                        vlo, vhi = max(r[0] for r in vr), min(r[1] for r in vr)
                        if vhi <= vlo:
                            vlo, vhi = vr[-1]
                        segments.append([off, cnt, stride, int(vlo), int(max(vhi, vlo + 1))])
                    st["recipe"]["segments"] = segments
            elif st["dtype"] in _FLOAT_DTYPES or st["dtype"].startswith(("complex", "float8")):
                st["recipe"] = {"kind": "randn"}
                shape = first_shape.get(sid)
                if shape is not None and math.prod(shape) <= 1:
                    # a 0-dim float: usually a Python number the op wrapped (an optimizer's beta2, its
                    # weight-decay factor 1 - lr * wd, eps, a bias correction); the values are lost. They
                    # multiply or divide state that persists across iterations (`exp_avg_sq.mul_(beta2)`,
                    # `param.mul_(1 - lr * wd)`): a random sign or a near-zero value turns the arithmetic into
                    # NaN/inf, and any constant below 1 shrinks parameters geometrically, iteration after
                    # iteration, until gradients are denormal and every matmul runs several times slower.
                    # 1 is neutral in products and quotients, so the replayed state keeps its scale however
                    # many iterations run (the real factors are within 1e-3 of 1 for the betas and decay)
                    st["recipe"] = {"kind": "ones"}
                    continue
                if shape and len(shape) >= 2 and math.prod(shape[1:]) > 1:
                    # weights are initialised with a spread of about 1/sqrt(fan_in); unit-variance data in
                    # their place drives activations into ranges (denormals, saturation) the model never saw
                    st["recipe"]["std"] = round(1.0 / math.sqrt(math.prod(shape[1:])), 6)
            else:
                st["recipe"] = {"kind": "randint", "low": 0, "high": 2}


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _tensor_encs(enc: Any) -> list[int]:
    out: list[int] = []
    ex._walk_tensor_ids(enc, out)
    return out


def _named_args(sch: ex.Schema, op: dict[str, Any]) -> dict[str, Any]:
    named: dict[str, Any] = {}
    pos = [a for a in sch.args if not a.kwarg_only]
    for sa, v in zip(pos, op["args"]):
        named[sa.name] = v
    named.update(op["kwargs"])
    return named


def _original_device(devices: Counter[str]) -> str:
    """The accelerator most tensors were on (else ``cpu``). Only device strings torch parses count: a
    trace's device strings are untrusted (``cuda:-1``, a type of a backend not installed here), and the
    plan's ``original_device`` is handed to ``torch.device`` by the executor."""
    accel = [(n, d) for d, n in devices.items() if d and not d.startswith("cpu") and _parses_as_device(d)]
    if accel:
        return max(accel)[1]
    return "cpu"


def _parses_as_device(text: str) -> bool:
    import torch

    try:
        return isinstance(text, str) and text.isprintable() and str(torch.device(text)) == text
    except (RuntimeError, ValueError, TypeError):
        return False


def read_capture(trace_path: str | os.PathLike) -> dict[str, Any] | None:
    """``capture.json`` beside a trace (or inside a trace dir), or None."""
    p = Path(trace_path)
    folder = p if p.is_dir() else p.parent
    cap = folder / "capture.json"
    if not cap.is_file():
        return None
    try:
        if cap.stat().st_size > _MAX_CAPTURE_BYTES:  # a few KB when we write it: anything huge is not ours
            return None
        data = json.loads(cap.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON, bad UTF-8, a 5000-digit number
        return None
    return data if isinstance(data, dict) and _nesting(data) <= _MAX_CAPTURE_DEPTH else None


_MAX_CAPTURE_BYTES = 16 * 1024**2
_MAX_CAPTURE_DEPTH = 16  # capture.json nests 3 levels; values copied from it go into the plan's metadata


def _nesting(doc: Any) -> int:
    deepest, stack = 0, [(doc, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def capture_step_ms(capture: dict[str, Any] | None) -> float | None:
    """The median uninstrumented step time (ms) recorded in ``capture.json``, or None."""
    if not capture:
        return None
    st = capture.get("step_time")
    if isinstance(st, dict):
        v = st.get("median_ms")
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            return float(v)
    return None


def capture_subject(capture: dict[str, Any] | None) -> str | None:
    """What ``capture.json`` says was captured: ``workload/config/mode`` for a built-in workload, the
    ``package.module:function`` of a user's step, else its ``target``; None without one."""
    if not capture:
        return None
    w, cfg, mode = capture.get("workload"), capture.get("config"), capture.get("mode")
    if isinstance(w, str) and w:
        return "/".join(str(x) for x in (w, cfg, mode) if x)
    for key in ("function", "target"):
        v = capture.get(key)
        if isinstance(v, str) and v:
            return v
    return None


# what of capture.json rebuilds the captured step in another process (mystique.capture.rebuild_step)
ORIGINAL_STEP_KEYS = ("target", "kind", "config", "mode", "dtype", "seed", "device", "threads")


def capture_original_step(capture: dict[str, Any] | None) -> dict[str, Any] | None:
    """The description of the captured step that :func:`mystique.capture.rebuild_step` needs: the
    capture's target (a built-in workload or ``package.module:function``), config, mode, dtype, seed,
    device and thread count. None without a ``capture.json``, for a multi-rank capture (its step
    runs under a process group) or when the target is missing."""
    if not capture or capture.get("distributed"):
        return None
    if not isinstance(capture.get("target"), str) or not capture["target"]:
        return None
    if capture.get("kind") not in ("workload", "user"):
        return None
    return {k: capture.get(k) for k in ORIGINAL_STEP_KEYS}


def find_kineto(trace_path: str | os.PathLike) -> Path | None:
    p = Path(trace_path)
    folder = p if p.is_dir() else p.parent
    for name in ("kineto.json.gz", "kineto.json"):
        if (folder / name).is_file():
            return folder / name
    return None


def build_plan(
    trace: Trace,
    iteration: int | None = None,
    *,
    kineto: dict[int, float] | None = None,
    capture: dict[str, Any] | None = None,
    nodes: list[Node] | None = None,
    kineto_times: Any = None,
    allow_ops: Sequence[str] = (),
) -> Plan:
    """The replay plan of one iteration of ``trace``.

    ``iteration``: a ``ProfilerStep#N`` number (None: the last complete one, see
    :func:`mystique.trace.analysis.select_iteration`; UsageError when absent). ``kineto``: rf_id ->
    host duration (us) of the same run; ``capture``: the ``capture.json`` document (gives the
    original step time). ``nodes``: the ops to replay (default :func:`replay_ops`), e.g. in tests.
    ``kineto_times``: the whole :class:`mystique.trace.kineto.KinetoTimes` of that run, for each op's
    device time (``orig_device_us``: the kernels its ET subtree launched) and the step's recorded span
    (metadata ``original_step_span_ms``, ``original_device_step_ms``). ``allow_ops``: fnmatch
    patterns (``ns::name``) of operators outside :data:`executor.ALLOWED_OP_NAMESPACES` to replay;
    any other such op is skipped with the reason (``--allow-ops``).
    """
    from ..trace.analysis import replay_ops, select_iteration

    it = None
    if nodes is None:
        it = select_iteration(trace, iteration)
        nodes = replay_ops(trace, iteration)
    b = _Builder(trace, allow_ops)
    b.kineto_spans = getattr(kineto_times, "cpu_spans_us", None)  # per-op gap_us
    if kineto is None and kineto_times is not None:
        kineto = kineto_times.cpu_us
    ops = [b.build_op(i, n, kineto) for i, n in enumerate(nodes)]
    dev_us = getattr(kineto_times, "device_us", None) or {}
    for op, n in zip(ops, nodes):
        op["orig_device_us"] = None
        if dev_us:
            total = sum(dev_us.get(m.rf_id, 0.0) for m in trace.preorder(n.id) if m.rf_id is not None)
            op["orig_device_us"] = _finite(total)
    span_ms = device_span_ms = None
    if kineto_times is not None and it is not None:
        span = kineto.get(it.node.rf_id) if kineto and it.node.rf_id is not None else None
        if span is None:
            span = kineto_times.steps_us.get(it.step)
        span_ms = _finite(span / 1e3) if span else None
        dspan = kineto_times.device_steps_us.get(it.step)
        device_span_ms = _finite(dspan / 1e3) if dspan else None
    b.recipes(ops)
    for op in ops:
        op.pop("_schema", None)
    inputs = [t["id"] for t in b.tensors if t["source"] == "external"]
    counts = Counter(op["name"] for op in ops)
    skipped: dict[str, dict[str, Any]] = {}
    for op in ops:
        if op["action"] == "skip":
            s = skipped.setdefault(op["name"], {"count": 0, "reason": op["reason"]})
            s["count"] += 1
    known = [op["orig_us"] for op in ops if op["orig_us"] is not None]
    meta = {
        "source": os.path.basename(trace.source) if trace.source else "",
        "schema": trace.schema,
        "iteration": it.step if it is not None else iteration,
        "original_device": _original_device(b.devices),
        "ops_total": len(ops),
        "op_counts": dict(sorted(counts.items())),
        "skipped": skipped,
        "original_op_times": bool(known),
        "original_ops_us": sum(known) if known else None,
        "original_step_ms": capture_step_ms(capture),
        "original_threads": (capture or {}).get("threads"),
        "captured_on": (capture or {}).get("device_name"),
        "subject": capture_subject(capture),
        "original_step": capture_original_step(capture),
        "original_step_span_ms": span_ms,
        "original_device_step_ms": device_span_ms,
        "original_device_op_times": any(op.get("orig_device_us") for op in ops),
        "transforms": [],
    }
    data = {
        "format": ex.PLAN_FORMAT,
        "version": ex.PLAN_VERSION,
        "metadata": meta,
        "storages": b.storages,
        "tensors": b.tensors,
        "inputs": inputs,
        "ops": ops,
    }
    return normalise(Plan(data))


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
        for tid in ex.op_input_ids(op):
            if tid in seen:
                continue
            seen.add(tid)
            sid = tensors[tid]["storage"]
            if sid in produced:
                tensors[tid]["source"] = "derived"
            else:
                tensors[tid]["source"] = "external"
                external.add(sid)
        for tid in ex.op_output_ids(op):
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
    from ..trace import load_trace
    from ..trace.kineto import read_kineto

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{_shown(p)} does not exist")
    if p.is_dir() and (p / "benchmark.json").is_file():
        p = p / "benchmark.json"
    if p.is_file() and p.name.endswith(".json") and _looks_like_plan(p):
        if iteration is not None:
            raise UsageError("--iteration applies to traces; a benchmark holds one iteration already")
        return Plan.load(p), "benchmark"
    trace = load_trace(p)
    kin = find_kineto(p)
    kineto = None
    if kin is not None:
        try:
            kineto = read_kineto(kin)
        except UsageError:
            kineto = None
    plan = build_plan(trace, iteration, kineto_times=kineto, capture=read_capture(p), allow_ops=allow_ops)
    return plan, "trace"


def _looks_like_plan(p: Path) -> bool:
    try:
        with open(p, encoding="utf-8") as fh:
            head = fh.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return '"mystique-benchmark"' in head
