"""``mystique generate --batch-scale`` (and ``mystique predict --batch-scale``): the plan with its
batch dimension scaled.

The batch size ``B`` is the leading dim of the data inputs (:func:`infer_batch`). External tensors
get every dim equal to ``B`` scaled; then the plan runs on the meta device (shape propagation), and
each op's result takes the shape it gets there. An op's size arguments are scaled as the op needs:

- a view or reshape (``view``, ``reshape``, ``_unsafe_view``, ``_reshape_alias``) keeps its element
  count: its size list is aligned with its input's recorded shape in groups of equal products, and
  each group takes the change its input group had (a split of the batch dim scales the split's
  batch entry; a split of any other dim is kept, even where an entry equals ``B``: heads, say);
- ``expand`` follows its input dim by dim from the right (an expanded unit dim, or a new leading
  one, equal to ``B`` is the batch);
- a backward op's ``input_sizes`` (``select_backward``...) follows the gradient's dims it holds;
- any other size list (a factory's ``size``) scales its entries equal to ``B`` or to a product of
  input dims that includes ``B``; dim indices, kernel sizes, paddings and normalised shapes are
  never sizes of the batch.

The first three are resolved while the plan runs on the meta device, from the shapes the op's
inputs have there; a view the meta device refuses for its strides alone (a transposed attention
output, which the real kernel returns contiguous) is propagated as a reshape. An op that fails with
the scaled shapes but not with the recorded ones makes the rescale inconsistent: one line naming it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

import mystique.replay.runtime as ex

from ..errors import UsageError
from .plan import Plan
from .recipes import EMBEDDING_BAG_OPS, DataRecipes, named_args, offsets_segment

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_SIZE_TYPES = ("int[]", "SymInt[]")


def one_line(v: Any) -> str:
    """Text from a trace or from torch for a one-line message: the first line, control characters escaped."""
    s = str(v).strip().split("\n", 1)[0]
    return s if s.isprintable() else ascii(s)[1:-1]


def _mutated_inputs(plan: Plan) -> set[int]:
    """Tensor ids an op writes in place (outputs that are also inputs, and ``Tensor(a!)`` arguments)."""
    out: set[int] = set()
    for op in plan.ops:
        ins = set(ex.op_input_ids(op))
        out.update(t for t in ex.op_output_ids(op) if t in ins)
        if op.get("schema"):
            try:
                sch = ex.parse_schema(op["schema"])
            except ValueError:
                continue
            pos = [a for a in sch.args if not a.kwarg_only]
            for sa, v in list(zip(pos, op["args"])) + [(a, op["kwargs"].get(a.name)) for a in sch.args
                                                        if a.kwarg_only]:
                if sa.mutable:
                    ids: list[int] = []
                    ex.walk_tensor_ids(v, ids)
                    out.update(ids)
    return out


def infer_batch(plan: Plan) -> int:
    """The batch size: the leading dim of the data inputs.

    Data inputs are external tensors that no op writes in place (parameters and optimizer
    states are written by the optimizer step); integer inputs (token ids, indices) are preferred,
    then floating ones with at least two dims, in the order ops consume them.
    """
    pool = _data_inputs(plan, _mutated_inputs(plan))
    if not pool:
        raise UsageError("cannot infer the batch size: the benchmark has no data inputs")
    counts = Counter(t["shape"][0] for t in pool)
    best = max(counts.values())
    # the most common leading dim; among equally common ones, that of the input consumed first
    return next(t["shape"][0] for t in pool if counts[t["shape"][0]] == best)


def _data_inputs(plan: Plan, mutated: set[int]) -> list[dict[str, Any]]:
    """The external tensors :func:`infer_batch` takes the batch from (see there), in consumption order."""
    tensors = {t["id"]: t for t in plan.tensors}
    order: list[int] = []
    seen: set[int] = set()
    for op in plan.ops:
        for tid in ex.op_input_ids(op):
            if tid not in seen and tensors[tid]["source"] == "external":
                seen.add(tid)
                order.append(tid)
    cands = [tensors[t] for t in order if t not in mutated and tensors[t]["shape"] and tensors[t]["shape"][0] > 0]
    ints = [t for t in cands if t["dtype"] not in FLOAT_DTYPES and t["dtype"] != "bool"]
    floats = [t for t in cands if t["dtype"] in FLOAT_DTYPES and len(t["shape"]) >= 2]
    pool = ints or floats
    # a leading unit dim is a broadcast buffer's (position ids), not a batch, where a data input of two or
    # more dims has a leading dim over 1 (a batch of 1 sequence stays a batch of 1)
    if any(t["shape"][0] > 1 and len(t["shape"]) >= 2 for t in pool):
        pool = [t for t in pool if t["shape"][0] > 1]
    return pool


def _rescale_dims(shape: list[int], b: int, nb: int) -> list[int]:
    return [nb if d == b else d for d in shape]


def _rescale_sizes(values: list[Any], ref_shape: list[int] | None, b: int, nb: int) -> list[Any]:
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            out.append(v)
            continue
        if v == b:
            out.append(nb)
            continue
        new = v
        if ref_shape and v % b == 0:
            # a product of consecutive input dims that includes a batch dim: rescale that factor
            n = len(ref_shape)
            for i in range(n):
                prod = 1
                for j in range(i, n):
                    prod *= ref_shape[j]
                    if prod == v and b in ref_shape[i:j + 1]:
                        new = v // b * nb
                        break
                    if prod > v:
                        break
                if new != v:
                    break
        out.append(new)
    return out



def _called_ops(ops: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Any]]:
    """The plan's called ops with a schema that parses, each with its parsed schema."""
    for op in ops:
        if op["action"] != "call" or not op.get("schema"):
            continue
        try:
            yield op, ex.parse_schema(op["schema"])
        except ValueError:
            continue


# --- size lists that follow their input (see the module docstring) -----------------------------------

#: ops whose size list is their result's shape, holding their input's elements
VIEW_OPS = frozenset({"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::_reshape_alias"})
EXPAND_OPS = frozenset({"aten::expand"})
#: size-list arguments of backward ops that hold the shape of the forward's input (the gradient's dims)
GRAD_SIZE_ARGS = frozenset({"input_sizes", "self_sizes"})
#: size-list arguments that never hold the batch: dim indices, window geometry, strides, trailing shapes
NOT_BATCH_ARGS = frozenset({"dim", "dims", "dim0", "dim1", "normalized_shape", "kernel_size", "stride", "padding",
                            "dilation", "output_padding", "pad", "shifts", "perm", "output_size"})


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _groups(a: list[int], s: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """Consecutive dims of ``a`` and ``s`` paired into groups of equal products (None when there are none)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(s):
        gi, gj, pa, ps = [], [], 1, 1
        if i < len(a):
            gi, pa, i = [i], a[i], i + 1
        if j < len(s):
            gj, ps, j = [j], s[j], j + 1
        while pa != ps:
            if pa < ps and i < len(a):
                gi.append(i)
                pa, i = pa * a[i], i + 1
            elif ps < pa and j < len(s):
                gj.append(j)
                ps, j = ps * s[j], j + 1
            else:
                return None
        groups.append((gi, gj))
    return groups


def view_sizes(sizes: list[Any], old_in: list[int], new_in: list[int]) -> list[int] | None:
    """The size list of a view or reshape of an input whose shape went from ``old_in`` to ``new_in``:
    each group of equal products takes its input group's change (None when the list does not hold the
    input's elements, or no entry can take the change)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes) or 0 in old_in or len(new_in) != len(old_in):
        return None
    s = list(sizes)
    neg = [k for k, v in enumerate(s) if v == -1]
    numel = _prod(old_in)
    if len(neg) > 1 or any(v < -1 for v in s):
        return None
    if neg:
        rest = _prod(v for v in s if v != -1)
        if rest <= 0 or numel % rest:
            return None
        s[neg[0]] = numel // rest
    groups = _groups(old_in, s) if _prod(s) == numel else None
    if groups is None:
        return None
    out = list(s)
    for gi, gj in groups:
        old, new = [old_in[k] for k in gi], [new_in[k] for k in gi]
        if old == new or not gj:
            continue
        if old == [s[k] for k in gj]:  # the same dims: they change as the input's did
            for k, v in zip(gj, new):
                out[k] = v
            continue
        num, den = _prod(new), _prod(old)
        changed = {o for o, n in zip(old, new) if o != n}
        fits = [k for k in gj if s[k] * num % den == 0]
        # one entry takes the change: the leftmost equal to a dim that changed, else the leftmost that can
        pick = next((k for k in fits if s[k] in changed), fits[0] if fits else None)
        if pick is None:
            return None
        out[pick] = s[pick] * num // den
    if neg:
        out[neg[0]] = -1
    return out


def expand_sizes(sizes: list[Any], old_in: list[int], new_in: list[int], b: int, nb: int) -> list[Any] | None:
    """``expand``'s size list for an input whose shape went from ``old_in`` to ``new_in``: each entry
    over a non-unit input dim (aligned from the right) follows that dim; an expanded unit dim or a new
    leading dim is the batch where it equals ``b``."""
    n, m = len(sizes), len(old_in)
    if m > n or len(new_in) != m:
        return None
    out = list(sizes)
    for k, v in enumerate(sizes):
        d = k - (n - m)
        if not isinstance(v, int) or isinstance(v, bool) or v == -1:
            continue
        if d >= 0 and old_in[d] != 1:
            out[k] = new_in[d] if v == old_in[d] else v
        elif v == b:
            out[k] = nb
    return out


def grad_sizes(sizes: list[Any], old_in: list[int], new_in: list[int], dim: Any) -> list[Any] | None:
    """A backward op's ``input_sizes`` for a gradient whose shape went from ``old_in`` to ``new_in``:
    the entries over the gradient's dims follow them where they held them (a ``select_backward``'s
    selected dim, one more than the gradient has, is kept)."""
    s = list(sizes)
    drop = None
    if len(s) == len(old_in) + 1 and isinstance(dim, int) and not isinstance(dim, bool) and -len(s) <= dim < len(s):
        drop = dim % len(s)
        s.pop(drop)
    if len(s) != len(old_in) or len(new_in) != len(old_in):
        return None
    out = [n if v == o and o != n else v for v, o, n in zip(s, old_in, new_in)]
    if drop is not None:
        out.insert(drop, sizes[drop])
    return out


def _fill(v: Any, vals: list[Any]) -> Any:
    if isinstance(v, ex.TensorSlot):
        return vals[v.tid]
    if isinstance(v, list):
        return [_fill(e, vals) for e in v]
    return v


class _Propagation(ex.Executor):
    """The rescaled plan run on the meta device: results take the shapes they get there; views,
    expands and backward ``input_sizes`` resolve their size lists from their inputs' shapes there, and a
    tensor derived from a storage (a view no op of the plan made) follows its anchor's change as a view
    of it would (see the module docstring). ``old``: the plan before the rescale."""

    def __init__(self, new: Plan, old: Plan, b: int, nb: int, allow_ops: Sequence[str]):
        super().__init__(new.data, "meta", check_memory=False, allow_ops=allow_ops)
        self.record_shapes = True
        self.propagate = True
        self.new, self.old, self.b, self.nb = new, old, b, nb
        self.old_shapes = {t["id"]: t["shape"] for t in old.tensors}

    def _compile(self) -> None:
        super()._compile()
        schemas = {id(op): sch for op, sch in _called_ops(self.new.ops)}
        for c in self._compiled:
            op = self.new.ops[c.index]
            sch = schemas.get(id(op))
            if c.fn is None or sch is None:
                continue
            name = f"{sch.namespace}::{sch.name}"
            pos = [a for a in sch.args if not a.kwarg_only]
            kind = "view" if name in VIEW_OPS else "expand" if name in EXPAND_OPS else "grad"
            slots = [i for i, a in enumerate(pos) if i < len(op["args"]) and a.base_type in _SIZE_TYPES
                     and isinstance(op["args"][i], list)
                     and (a.name in GRAD_SIZE_ARGS if kind == "grad" else a.name in ("size", "shape"))]
            ins = ex.op_input_ids(op)
            if slots and ins and ins[0] in self.old_shapes:
                dim_at = next((i for i, a in enumerate(pos) if a.name == "dim"), None)
                c.call = _resolving_call(c, kind, slots, self.old.ops[c.index], op, self.old_shapes[ins[0]],
                                         self.b, self.nb, dim_at)

    def _derive(self, tid: int, base: Any = ex.TensorSlot) -> torch.Tensor:
        anchor = self.anchor_of(tid)
        if base is ex.TensorSlot:
            base = self.vals[anchor] if anchor is not None else None
        old_t, old_a = self.old_shapes.get(tid), self.old_shapes.get(anchor) if anchor is not None else None
        if isinstance(base, torch.Tensor) and old_t is not None and old_a is not None and _prod(old_t) == _prod(old_a):
            shape = view_sizes(old_t, old_a, list(base.shape))
            if shape is not None:
                out = torch.empty(shape, dtype=ex.dtype_from_name(self.tensors[tid]["dtype"]), device=base.device)
                self.output_shapes[tid] = (list(out.shape), list(out.stride()))
                return out
        return super()._derive(tid, base)


def _resolving_call(c: Any, kind: str, slots: list[int], old_op: dict[str, Any], op: dict[str, Any],
                    old_in: list[int], b: int, nb: int, dim_at: int | None):
    fn = c.direct if c.direct is not None else c.fn

    def call(vals: list[Any]) -> Any:
        args = [_fill(a, vals) for a in c.args]
        kwargs = {k: _fill(v, vals) for k, v in c.kwargs.items()}
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if x is None:
            return fn(*args, **kwargs)
        new_in = list(x.shape)
        for i in slots:
            sizes = old_op["args"][i]
            got = (view_sizes(sizes, old_in, new_in) if kind == "view" else
                   expand_sizes(sizes, old_in, new_in, b, nb) if kind == "expand" else
                   grad_sizes(sizes, old_in, new_in, old_op["args"][dim_at] if dim_at is not None
                              and dim_at < len(old_op["args"]) else None))
            if got is not None:
                args[i] = op["args"][i] = got
        try:
            return fn(*args, **kwargs)
        except RuntimeError:
            if kind != "view":
                raise
            # a view the meta device refuses for its input's strides alone: its shape is the reshape's
            return torch.reshape(x, args[1])

    return call


def _saved_activations(plan: Plan, b: int, mutated: set[int]) -> tuple[set[int], set[int]]:
    """External tensors first read by a backward op (activations autograd saved inside a forward
    composite, such as ``cross_entropy_loss``'s log-softmax or attention's log-sum-exp, which the trace
    holds as inputs), and the sizes the batch takes flattened with a data input's following dims
    (``B x L`` of ``[B, L]`` token ids). Such a tensor's leading dim is its batch: where it is ``B`` or
    one of those products, only it scales (a later dim equal to ``B``, heads say, is kept)."""
    tensors = {t["id"]: t for t in plan.tensors}
    products: set[int] = {b}
    for t in _data_inputs(plan, mutated):
        if t["shape"][0] == b:
            p = b
            for d in t["shape"][1:]:
                p *= d
                products.add(p)
    out: set[int] = set()
    seen: set[int] = set()
    for op in plan.ops:
        backward = "_backward" in str(op.get("name", ""))
        for tid in ex.op_input_ids(op):
            if tid in seen:
                continue
            seen.add(tid)
            t = tensors[tid]
            if backward and t["source"] == "external" and tid not in mutated and t["shape"] and t["shape"][0] in products:
                out.add(tid)
    return out, products


def rescale_batch(plan: Plan, factor: float, allow_ops: Sequence[str] = ()) -> Plan:
    """Scale the batch dimension by ``factor`` (UsageError when no consistent rescale exists; see the
    module docstring). ``allow_ops``: as for :class:`runtime.Executor`."""
    if not (factor > 0 and math.isfinite(factor)):
        raise UsageError(f"--batch-scale must be a positive number, not {factor}")
    if factor == 1:
        return plan
    b = infer_batch(plan)
    nb = max(1, int(round(b * factor)))
    if b == 1:
        raise UsageError("the batch size is 1: its dimension cannot be told apart from other unit dims, "
                         "so the batch cannot be rescaled consistently")
    if nb == b:
        raise UsageError(f"--batch-scale {factor} leaves the batch size {b} unchanged")
    tensors = {t["id"]: t for t in plan.tensors}
    mutated = _mutated_inputs(plan)
    params = [t for t in plan.tensors if t["source"] == "external" and t["id"] in mutated and b in t["shape"]]
    if params:
        t = params[0]
        raise UsageError(f"cannot rescale the batch size {b}: tensors the step updates in place have a dim "
                         f"of the same size (e.g. shape {t['shape']}), so the batch dim is ambiguous")
    before = _meta_failures(plan, allow_ops)
    new = plan.copy()
    nt = {t["id"]: t for t in new.tensors}
    saved, _products = _saved_activations(plan, b, mutated)
    for t in new.tensors:
        if t["source"] in ("external", "unused"):
            shape = _rescale_dims(t["shape"], b, nb)
            if t["id"] in saved:
                shape = [t["shape"][0] // b * nb] + t["shape"][1:]
            if shape != t["shape"]:
                t["strides"] = _dense_like(t["shape"], t.get("strides"), shape)
                t["shape"] = shape
    for op, sch in _called_ops(new.ops):
        ins = ex.op_input_ids(op)
        ref = tensors[ins[0]]["shape"] if ins else None
        pos = [a for a in sch.args if not a.kwarg_only]
        for i, (sa, v) in enumerate(zip(pos, op["args"])):
            if sa.base_type in _SIZE_TYPES and isinstance(v, list) and sa.name not in NOT_BATCH_ARGS:
                op["args"][i] = _rescale_sizes(v, ref, b, nb)
        for sa in sch.args:
            if (sa.kwarg_only and sa.base_type in _SIZE_TYPES and isinstance(op["kwargs"].get(sa.name), list)
                    and sa.name not in NOT_BATCH_ARGS):
                op["kwargs"][sa.name] = _rescale_sizes(op["kwargs"][sa.name], ref, b, nb)
    e = _Propagation(new, plan, b, nb, allow_ops)
    e.probe()
    after = {st.index: st.reason for st in e.status if st.state == "skipped"}
    broken = sorted(set(after) - set(before))
    if broken:
        i = broken[0]
        raise UsageError(f"batch rescale {b} -> {nb} is inconsistent: op #{i} {one_line(new.ops[i]['name'])} fails with "
                         f"the rescaled shapes ({one_line(after[i])})")
    for tid, (shape, strides) in e.output_shapes.items():
        if nt[tid]["source"] in ("output", "derived"):
            nt[tid]["shape"], nt[tid]["strides"] = list(shape), list(strides)
    for t in new.tensors:
        if t["source"] in ("output", "derived") and t["id"] not in e.output_shapes:
            shape = _rescale_dims(t["shape"], b, nb)
            if shape != t["shape"]:
                t["strides"] = _dense_like(t["shape"], t.get("strides"), shape)
                t["shape"] = shape
    _rescale_offsets(new)
    recompute_nbytes(new)
    new.metadata["transforms"].append({"batch_scale": factor, "batch": b, "new_batch": nb})
    new.metadata["batch_size"] = nb
    return new


def _rescale_offsets(plan: Plan) -> None:
    """Re-derive the bag offsets recipes (``segments``) of embedding-bag inputs from the rescaled
    tensors, as the plan builder derives them: one segment ``[start, count, stride, total,
    include_last]`` per offsets view, ``total`` the element count of the bag's indices."""
    tensors = {t["id"]: t for t in plan.tensors}
    tid = DataRecipes.tid
    segments: dict[int, list[list[Any]]] = {}
    for op, sch in _called_ops(plan.ops):
        if f"{sch.namespace}::{sch.name}" not in EMBEDDING_BAG_OPS:
            continue
        named = named_args(sch, op)
        ind, off = tid(named.get("indices")), tid(named.get("offsets"))
        if ind is None or off is None or ind not in tensors or off not in tensors:
            continue
        seg = offsets_segment(tensors[off], tensors[ind], named.get("include_last_offset"))
        segs = segments.setdefault(tensors[off]["storage"], [])
        if seg not in segs:
            segs.append(seg)
    for st in plan.storages:
        recipe = st.get("recipe")
        if recipe and recipe.get("kind") == "offsets" and st["id"] in segments:
            st["recipe"] = {k: v for k, v in recipe.items() if k not in ("total", "include_last")}
            st["recipe"]["segments"] = segments[st["id"]]


def _dense_like(old_shape: list[int], old_strides: list[int] | None, shape: list[int]) -> list[int]:
    """Dense strides for ``shape`` with the dim order (by stride) of the old layout."""
    if not old_strides or len(old_strides) != len(shape):
        return ex.contiguous_strides(shape)
    order = sorted(range(len(shape)), key=lambda i: (old_strides[i], -i))
    out = [0] * len(shape)
    acc = 1
    for i in order:
        out[i] = acc
        acc *= max(shape[i], 1)
    return out


def _meta_failures(plan: Plan, allow_ops: Sequence[str] = ()) -> dict[int, str]:
    e = ex.Executor(plan.data, "meta", check_memory=False, allow_ops=allow_ops)
    e.probe()
    return {st.index: st.reason for st in e.status if st.state == "skipped"}




def recompute_nbytes(plan: Plan) -> None:
    """Each storage's byte count: what its tensors' shapes, strides and offsets reach."""
    need: dict[int, int] = {}
    for t in plan.tensors:
        size = torch.empty((), dtype=ex.dtype_from_name(t["dtype"])).element_size()
        strides = t.get("strides") or ex.contiguous_strides(t["shape"])
        nb = ex.extent(t["shape"], strides, int(t["offset"])) * size
        need[t["storage"]] = max(need.get(t["storage"], 0), nb)
    for s in plan.storages:
        s["nbytes"] = int(need.get(s["id"], s["nbytes"]))
