"""The batch size of a plan, for ``--batch-scale`` (:mod:`mystique.replay.batch_scale`): the leading dim
of the data inputs, read where the step consumes them.

Data inputs are external tensors whose storage no op writes (parameters, optimizer states and views
of them are written by the optimizer step; an op that returns its input unchanged, ``aten::to`` to
the same dtype, writes nothing: only an argument its schema marks ``(a!)`` is written). How a data
input is consumed says which of its dims is the batch:

- a tensor read only slice by slice along its leading dim (``select(0, k)``, ``unbind(0)``: a
  loop over tables, say DLRM's ``indices[k]`` / ``offsets[k]`` of ``(T, N)`` / ``(T, B)``) has a
  loop dim there, not a batch: its batch dim is the slices' leading dim;
- an embedding bag's ``indices`` (and ``per_sample_weights``) hold the ids of all the bags, ``B x
  pooling`` of them: their length is not the batch, it scales with it (:attr:`DataInput.ids`);
- an embedding bag's ``offsets`` with ``include_last_offset`` hold ``B + 1`` entries.

Integer inputs (token ids, bag offsets) are preferred, then floating ones of two or more dims; the
batch is the most common leading dim among them (ties: the input consumed first).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import mystique.replay.runtime as ex

from ..errors import UsageError
from .plan import Plan
from .recipes import EMBEDDING_BAG_OPS

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
#: ops that read one slice of their input along a dim (``select(self, dim, index)``, ``unbind(self, dim)``)
SLICE_OPS = frozenset({"aten::select", "aten::unbind"})
#: an embedding bag's arguments that hold one entry per id of all its bags (not one per bag)
BAG_ID_ARGS = ("indices", "per_sample_weights")


@dataclass(frozen=True)
class DataInput:
    """A data input (a plan tensor dict) and how the step consumes it."""

    t: dict[str, Any]
    loop: int = 0  # leading dims read slice by slice (kept by a rescale)
    ids: bool = False  # an embedding bag's ids (or their weights): the length scales with the batch
    last_offset: bool = False  # an embedding bag's offsets with include_last_offset: B + 1 entries

    @property
    def dims(self) -> list[int]:
        """The dims the step consumes as data (after the loop dims)."""
        return list(self.t["shape"][self.loop:])

    @property
    def batch_dim(self) -> int | None:
        """The batch this input says (None: its length is not the batch: bag ids, or no dims)."""
        d = self.dims
        if self.ids or not d:
            return None
        return d[0] - 1 if self.last_offset else d[0]


def parsed_schema(op: dict[str, Any]) -> Any:
    """The op's parsed schema, or None."""
    if not op.get("schema"):
        return None
    try:
        return ex.parse_schema(op["schema"])
    except ValueError:
        return None


def mutated_inputs(plan: Plan) -> set[int]:
    """Tensor ids an op writes in place: ``Tensor(a!)`` arguments, and for an op without a schema that
    parses, outputs that are also inputs (an op with a schema that returns an input, as ``aten::to``
    to its own dtype does, writes nothing unless the schema says so)."""
    out: set[int] = set()
    for op in plan.ops:
        sch = parsed_schema(op)
        if sch is None:
            ins = set(ex.op_input_ids(op))
            out.update(t for t in ex.op_output_ids(op) if t in ins)
            continue
        pos = [a for a in sch.args if not a.kwarg_only]
        for sa, v in list(zip(pos, op["args"])) + [(a, op["kwargs"].get(a.name)) for a in sch.args if a.kwarg_only]:
            if sa.mutable:
                ids: list[int] = []
                ex.walk_tensor_ids(v, ids)
                out.update(ids)
    return out


def _reads(plan: Plan) -> dict[int, list[tuple[str, str, dict[str, Any]]]]:
    """Each tensor id's reads: (op name, argument name, op), in plan order."""
    reads: dict[int, list[tuple[str, str, dict[str, Any]]]] = {}
    for op in plan.ops:
        sch = parsed_schema(op)
        name = f"{sch.namespace}::{sch.name}" if sch is not None else str(op.get("name", ""))
        args: list[tuple[str, Any]] = []
        if sch is not None:
            pos = [a for a in sch.args if not a.kwarg_only]
            args = [(sa.name, v) for sa, v in zip(pos, op["args"])] + list(op["kwargs"].items())
        else:
            args = [("", v) for v in op.get("args", [])] + list(op.get("kwargs", {}).items())
        for arg, v in args:
            ids: list[int] = []
            ex.walk_tensor_ids(v, ids)
            for tid in ids:
                reads.setdefault(tid, []).append((name, arg, op))
    return reads


def _slice_dim(name: str, op: dict[str, Any]) -> int | None:
    """The dim a slicing op reads its input along (None: not a slice, or its dim is not a constant)."""
    if name not in SLICE_OPS:
        return None
    d = op["args"][1] if len(op["args"]) > 1 else op["kwargs"].get("dim", 0 if name == "aten::unbind" else None)
    return d if isinstance(d, int) and not isinstance(d, bool) else None


def _consumed(tid: int, reads: dict[int, list[tuple[str, str, dict[str, Any]]]], ndim: int,
              depth: int = 0) -> tuple[int, bool, bool]:
    """(loop dims, bag ids, offsets with the last one) of tensor ``tid`` as the step reads it."""
    rs = reads.get(tid, [])
    if rs and depth < ndim and all(_slice_dim(n, op) == 0 for n, _a, op in rs):
        subs = [_consumed(o, reads, ndim, depth + 1) for _n, _a, op in rs for o in ex.op_output_ids(op)]
        if subs:
            return (1 + min(s[0] for s in subs), any(s[1] for s in subs), any(s[2] for s in subs))
    ids = any(n in EMBEDDING_BAG_OPS and a in BAG_ID_ARGS for n, a, _op in rs)
    last = any(n in EMBEDDING_BAG_OPS and a == "offsets" and _include_last(op) for n, a, op in rs)
    return 0, ids, last


def _include_last(op: dict[str, Any]) -> bool:
    sch = parsed_schema(op)
    if sch is None:
        return False
    pos = [a.name for a in sch.args if not a.kwarg_only]
    named = dict(zip(pos, op["args"])) | op["kwargs"]
    return named.get("include_last_offset") is True


def data_inputs(plan: Plan, mutated: set[int] | None = None) -> list[DataInput]:
    """Every data input (see the module docstring), in the order ops consume them, with how it is consumed."""
    mutated = mutated_inputs(plan) if mutated is None else mutated
    tensors = {t["id"]: t for t in plan.tensors}
    written = {tensors[t]["storage"] for t in mutated if t in tensors}
    reads = _reads(plan)
    out: list[DataInput] = []
    seen: set[int] = set()
    for op in plan.ops:
        for tid in ex.op_input_ids(op):
            t = tensors.get(tid)
            if tid in seen or t is None or t["source"] != "external":
                continue
            seen.add(tid)
            if tid in mutated or t["storage"] in written or not t["shape"] or t["shape"][0] <= 0:
                continue
            loop, ids, last = _consumed(tid, reads, len(t["shape"]))
            out.append(DataInput(t, loop, ids, last))
    return out


def batch_pool(inputs: list[DataInput]) -> list[DataInput]:
    """The data inputs whose leading consumed dim says the batch (see the module docstring)."""
    cands = [d for d in inputs if d.batch_dim is not None and d.batch_dim > 0]
    ints = [d for d in cands if d.t["dtype"] not in FLOAT_DTYPES and d.t["dtype"] != "bool"]
    floats = [d for d in cands if d.t["dtype"] in FLOAT_DTYPES and len(d.dims) >= 2]
    pool = ints or floats
    # a leading unit dim is a broadcast buffer's (position ids), not a batch, where a data input of two or
    # more dims has a leading dim over 1 (a batch of 1 sequence stays a batch of 1)
    if any(d.batch_dim > 1 and len(d.dims) >= 2 for d in pool):
        pool = [d for d in pool if d.batch_dim > 1]
    return pool


def infer_batch(plan: Plan, inputs: list[DataInput] | None = None) -> int:
    """The batch size: the most common leading consumed dim of the data inputs (see the module docstring);
    ``inputs``: the plan's :func:`data_inputs`, where the caller has them."""
    pool = batch_pool(data_inputs(plan) if inputs is None else inputs)
    if not pool:
        raise UsageError("cannot infer the batch size: the benchmark has no data inputs")
    counts = Counter(d.batch_dim for d in pool)
    best = max(counts.values())
    # the most common leading dim; among equally common ones, that of the input consumed first
    return next(d.batch_dim for d in pool if counts[d.batch_dim] == best)


def rescaled_data_shape(d: DataInput, b: int, nb: int) -> list[int]:
    """A data input's shape with the batch ``b`` made ``nb``: loop dims kept; bag ids' length scaled by
    ``nb / b`` (the bags keep their mean size; rounded); offsets with the last one ``nb + 1`` long;
    other consumed dims equal to ``b`` made ``nb``."""
    shape = list(d.t["shape"])
    head, dims = shape[:d.loop], shape[d.loop:]
    if d.ids:
        dims[0] = max(1, int(round(dims[0] * nb / b)))
        rest = [nb if x == b else x for x in dims[1:]]
        return head + dims[:1] + rest
    if d.last_offset and dims[0] == b + 1:
        return head + [nb + 1] + [nb if x == b else x for x in dims[1:]]
    return head + [nb if x == b else x for x in dims]


__all__ = ["DataInput", "batch_pool", "data_inputs", "infer_batch", "mutated_inputs", "rescaled_data_shape"]
