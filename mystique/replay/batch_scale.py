"""``mystique generate --batch-scale`` (and ``mystique predict --batch-scale``): the plan with its
batch dimension scaled.

The batch size ``B`` is the leading dim of the data inputs where the step consumes them
(:mod:`mystique.replay.batch_infer`). External tensors get every dim equal to ``B`` scaled (a data
input read slice by slice keeps its loop dims, an embedding bag's ids scale their length with the
batch); then the plan runs on the meta device (shape propagation), and
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
from collections.abc import Iterator, Sequence
from typing import Any

import torch

import mystique.replay.runtime as ex

from ..errors import UsageError
from .batch_infer import (
    FLOAT_DTYPES,
    DataInput,
    batch_pool,
    data_inputs,
    infer_batch,
    mutated_inputs,
    rescaled_data_shape,
)
from .plan import Plan
from .recipes import EMBEDDING_BAG_OPS, DataRecipes, named_args, offsets_segment

__all__ = ["FLOAT_DTYPES", "infer_batch", "rescale_batch", "recompute_nbytes", "view_sizes", "expand_sizes",
           "grad_sizes", "one_line"]
_SIZE_TYPES = ("int[]", "SymInt[]")


def one_line(v: Any) -> str:
    """Text from a trace or from torch for a one-line message: the first line, control characters escaped."""
    s = str(v).strip().split("\n", 1)[0]
    return s if s.isprintable() else ascii(s)[1:-1]


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


def _saved_activations(plan: Plan, b: int, mutated: set[int], inputs: list[DataInput]) -> tuple[set[int], set[int]]:
    """External tensors first read by a backward op (activations autograd saved inside a forward
    composite, such as ``cross_entropy_loss``'s log-softmax or attention's log-sum-exp, which the trace
    holds as inputs), and the sizes the batch takes flattened with a data input's following dims
    (``B x L`` of ``[B, L]`` token ids). Such a tensor's leading dim is its batch: where it is ``B`` or
    one of those products, only it scales (a later dim equal to ``B``, heads say, is kept). ``inputs``: the
    plan's :func:`data_inputs`."""
    tensors = {t["id"]: t for t in plan.tensors}
    products: set[int] = {b}
    for di in batch_pool(inputs):
        if di.dims[0] == b:
            p = b
            for d in di.dims[1:]:
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
    mutated = mutated_inputs(plan)
    inputs = data_inputs(plan, mutated)
    b = infer_batch(plan, inputs)
    nb = max(1, int(round(b * factor)))
    if b == 1:
        raise UsageError("the batch size is 1: its dimension cannot be told apart from other unit dims, "
                         "so the batch cannot be rescaled consistently")
    if nb == b:
        raise UsageError(f"--batch-scale {factor} leaves the batch size {b} unchanged")
    tensors = {t["id"]: t for t in plan.tensors}
    params = [t for t in plan.tensors if t["source"] == "external" and t["id"] in mutated and b in t["shape"]]
    if params:
        t = params[0]
        raise UsageError(f"cannot rescale the batch size {b}: tensors the step updates in place have a dim "
                         f"of the same size (e.g. shape {t['shape']}), so the batch dim is ambiguous")
    before = _meta_failures(plan, allow_ops)
    new = plan.copy()
    nt = {t["id"]: t for t in new.tensors}
    saved, _products = _saved_activations(plan, b, mutated, inputs)
    data = {d.t["id"]: d for d in inputs}
    for t in new.tensors:
        if t["source"] in ("external", "unused"):
            d = data.get(t["id"])
            shape = rescaled_data_shape(d, b, nb) if d is not None else _rescale_dims(t["shape"], b, nb)
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
    _rebase_views(plan, new)
    _remap_segments(plan, new)
    _rescale_offsets(new)
    recompute_nbytes(new)
    new.metadata["transforms"].append({"batch_scale": factor, "batch": b, "new_batch": nb})
    new.metadata["batch_size"] = nb
    return new


def rebased_offset(offset: int, base_offset: int, old_shape: list[int], old_strides: list[int],
                   new_strides: list[int]) -> int | None:
    """The storage offset of a view into a base tensor whose strides went from ``old_strides`` to
    ``new_strides``: the view's start, read as an element of the base (its index along each dim, the
    largest strides first), placed at that element's new position (``select(0, k)`` of ``[T, B]``
    rescaled to ``[T, 2B]`` starts at ``k x 2B``, not ``k x B``). None when the start is not an
    element of the base."""
    rem = offset - base_offset
    if rem < 0 or len(old_shape) != len(old_strides) or len(new_strides) != len(old_strides):
        return None
    out = base_offset
    for i in sorted(range(len(old_shape)), key=lambda k: -old_strides[k]):
        st = old_strides[i]
        if st <= 0:
            continue
        idx = rem // st
        if idx >= max(old_shape[i], 1):
            return None
        rem -= idx * st
        out += idx * new_strides[i]
    return out if rem == 0 else None


def _rebase_views(old: Plan, new: Plan) -> None:
    """Views into an external tensor whose layout the rescale changed take their start at the same
    element of it (:func:`rebased_offset`): DLRM's per-table ``offsets[k]``."""
    before = {t["id"]: t for t in old.tensors}
    bases: dict[int, dict[str, Any]] = {}
    for t in new.tensors:
        o = before[t["id"]]
        if t["source"] == "external" and (t["shape"] != o["shape"] or t.get("strides") != o.get("strides")):
            bases.setdefault(t["storage"], t)
    for t in new.tensors:
        base = bases.get(t["storage"])
        if base is None or t is base or t["source"] == "external" or int(t["offset"]) == int(base["offset"]):
            continue
        ob = before[base["id"]]
        got = rebased_offset(int(before[t["id"]]["offset"]), int(ob["offset"]), ob["shape"],
                             ob.get("strides") or ex.contiguous_strides(ob["shape"]),
                             base.get("strides") or ex.contiguous_strides(base["shape"]))
        if got is not None:
            t["offset"] = got


def _view_key(t: dict[str, Any]) -> tuple[int, int, int]:
    """A view's place in its storage as value recipes' segments name it: (offset, elements, last stride)."""
    strides = t.get("strides") or [1]
    return int(t["offset"]), int(math.prod(t["shape"])), int(strides[-1] or 1) if t["shape"] else 1


def _remap_segments(old: Plan, new: Plan) -> None:
    """Value recipes kept per view of a storage (``segments``: ``[start, count, stride, ...]``, an
    embedding bag's ids drawn below each table's rows) follow their views to where the rescale put them:
    table k's ids start at ``k x`` the new ids per table and hold as many (bag offsets: see
    :func:`_rescale_offsets`)."""
    before = {t["id"]: t for t in old.tensors}
    moved: dict[int, dict[tuple[int, int, int], tuple[int, int, int]]] = {}
    for t in new.tensors:
        k0, k1 = _view_key(before[t["id"]]), _view_key(t)
        if k0 != k1:
            moved.setdefault(t["storage"], {}).setdefault(k0, k1)
    for st in new.storages:
        recipe = st.get("recipe") or {}
        if st["id"] not in moved or recipe.get("kind") == "offsets" or not isinstance(recipe.get("segments"), list):
            continue
        m = moved[st["id"]]
        segs = [list(m.get(tuple(seg[:3]), tuple(seg[:3]))) + list(seg[3:]) if len(seg) >= 3 else seg
                for seg in recipe["segments"]]
        st["recipe"] = {**recipe, "segments": segs}


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
