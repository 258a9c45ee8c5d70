"""Data recipes: what each storage of a replay plan is filled with.

A storage's ``recipe`` is one of ``randn``, ``randint``, ``uniform_pos``, ``bernoulli``, ``offsets``
and ``ones`` (materialised by :func:`mystique.replay.runtime.fill_storage`). Operators constrain
the data of their inputs: an index lies within the table it indexes, a logarithm's argument is
positive, a bag's offsets start at 0. Each such operator has a small function in :data:`RECIPES`,
keyed by op name (``aten::embedding``): ``fn(data, args)`` with ``data`` the plan's
:class:`DataRecipes` and ``args`` the op's arguments by schema name. A new op recipe is one function
and one table entry. Storages no op constrains get the default of their dtype (:meth:`DataRecipes.assign`).

Index data takes the range the consumers allow (and the trace's recorded min/max); embedding-bag
indices are Zipf-skewed (:data:`EMBEDDING_BAG_ZIPF`); 0-dim floats (wrapped Python numbers whose
values the trace does not keep) are 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .recipes_fbgemm import FBGEMM_RECIPES
from .runtime.format import contiguous_strides, walk_tensor_ids
from .runtime.schemas import Schema

FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
EMBEDDING_BAG_OPS = frozenset({
    "aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
})
# Exponent of the Zipf law drawn for embedding-bag indices (recommendation tables). The trace records only
# each index tensor's min and max; uniform indices over a large table touch more distinct rows than the
# power-law popularity of real categorical features does, so a replay with uniform indices misses the
# caches the original hit (Criteo's fit is about 1.05, as in the reference DLRM workload). Token ids
# (``aten::embedding``) stay uniform.
EMBEDDING_BAG_ZIPF = 1.05


def named_args(sch: Schema, op: dict[str, Any]) -> dict[str, Any]:
    """An op's encoded arguments by schema name (positional ones matched in order, then kwargs)."""
    named: dict[str, Any] = {}
    pos = [a for a in sch.args if not a.kwarg_only]
    for sa, v in zip(pos, op["args"]):
        named[sa.name] = v
    named.update(op["kwargs"])
    return named


def offsets_segment(offsets: dict[str, Any], indices: dict[str, Any], include_last: Any) -> list[Any]:
    """The ``offsets`` recipe segment of one view of a bag's offsets: ``[start, count, stride, total,
    include_last]`` (positions into the storage; ``total``: the element count of the bag's indices)."""
    strides = offsets.get("strides") or [1]
    return [int(offsets["offset"]), int(math.prod(offsets["shape"])), int(strides[-1] or 1),
            int(math.prod(indices["shape"])), bool(include_last or False)]


class DataRecipes:
    """The data constraints a plan's ops put on its tensors, and the storage recipes they give."""

    def __init__(self, tensors: list[dict[str, Any]], storages: list[dict[str, Any]]):
        self.tensors, self.storages = tensors, storages
        self.ranges: dict[int, list[tuple[int, int]]] = {}  # plan storage -> [(low, high)]
        # plan storage -> {(offset, numel, stride): [(low, high)]}: ranges of each view of a storage
        self.view_ranges: dict[int, dict[tuple[int, int, int], list[tuple[int, int]]]] = {}
        self.trace_ranges: dict[int, tuple[int, int]] = {}  # tensor -> the trace's recorded [min, max + 1)
        self.skewed: set[int] = set()  # plan storages of embedding-bag indices (Zipf-skewed recipe)
        self.kinds: dict[int, dict[str, Any]] = {}  # plan storage -> recipe an op asked for
        self.tables: dict[tuple[str, int], Any] = {}  # what FBGEMM's ops learn of their tables (recipes_fbgemm)

    # what recipe functions use -------------------------------------------------------------

    @staticmethod
    def tid(enc: Any) -> int | None:
        return enc["t"] if isinstance(enc, dict) and "t" in enc else None

    def shape(self, enc: Any) -> list[int] | None:
        tid = self.tid(enc)
        return self.tensors[tid]["shape"] if tid is not None else None

    def constrain(self, tid: int | None, low: int, high: int) -> None:
        """Values of tensor ``tid`` lie in ``[low, high)``."""
        if tid is None:
            return
        t = self.tensors[tid]
        self.ranges.setdefault(t["storage"], []).append((int(low), int(high)))
        self._view_range(tid, int(low), int(high))

    def recipe(self, tid: int, recipe: dict[str, Any]) -> dict[str, Any]:
        """Ask for ``recipe`` for the storage of tensor ``tid`` (the first op to ask wins); the recipe kept."""
        return self.kinds.setdefault(self.tensors[tid]["storage"], recipe)

    def positive(self, enc: Any) -> None:
        """The tensors of ``enc`` hold positive values (``uniform_pos``)."""
        out: list[int] = []
        walk_tensor_ids(enc, out)
        for tid in out:
            self.recipe(tid, {"kind": "uniform_pos"})

    def trace_range(self, tid: int, low: int, high: int) -> None:
        """The trace recorded the values of tensor ``tid`` within ``[low, high)``."""
        self.trace_ranges[tid] = (low, high)

    def _view_range(self, tid: int, low: int, high: int, first: bool = False) -> None:
        t = self.tensors[tid]
        strides = t.get("strides") or [1]
        if len(t["shape"]) > 1 and list(strides) != contiguous_strides(t["shape"]):
            return  # only 1-D or contiguous views are tracked as segments
        key = (int(t["offset"]), int(math.prod(t["shape"])), int(strides[-1] or 1) if t["shape"] else 1)
        lst = self.view_ranges.setdefault(t["storage"], {}).setdefault(key, [])
        lst.insert(0, (low, high)) if first else lst.append((low, high))

    # the plan's recipes --------------------------------------------------------------------

    def apply(self, ops: list[dict[str, Any]]) -> None:
        """Gather the constraints of ``ops`` (each called op carries its parsed ``_schema``), then set
        every storage's recipe."""
        for op in ops:
            sch: Schema | None = op.get("_schema")
            if sch is None or op["action"] != "call":
                continue
            fn = RECIPES.get(f"{sch.namespace}::{sch.name}")
            if fn is not None:
                fn(self, named_args(sch, op))
        self.assign()

    def assign(self) -> None:
        first_shape: dict[int, list[int]] = {}
        for t in self.tensors:
            first_shape.setdefault(t["storage"], t["shape"])
        for tid, (lo, hi) in self.trace_ranges.items():
            self.ranges.setdefault(self.tensors[tid]["storage"], []).insert(0, (lo, hi))
            self._view_range(tid, lo, hi, first=True)
        for st in self.storages:
            sid = st["id"]
            if st["dtype"] == "bool":
                st["recipe"] = {"kind": "bernoulli"}
            elif sid in self.kinds:
                st["recipe"] = self.kinds[sid]
            elif self.ranges.get(sid):
                st["recipe"] = self._integer_recipe(sid)
            elif st["dtype"] in FLOAT_DTYPES or st["dtype"].startswith(("complex", "float8")):
                st["recipe"] = _float_recipe(first_shape.get(sid))
            else:
                st["recipe"] = {"kind": "randint", "low": 0, "high": 2}

    def _integer_recipe(self, sid: int) -> dict[str, Any]:
        rs = self.ranges[sid]
        lo = max(r[0] for r in rs)
        hi = min(r[1] for r in rs)
        if hi <= lo:  # disagreeing constraints: the consumers' (last ones) win
            lo, hi = rs[-1]
        recipe: dict[str, Any] = {"kind": "randint", "low": int(lo), "high": int(max(hi, lo + 1))}
        if sid in self.skewed:
            recipe["zipf"] = EMBEDDING_BAG_ZIPF
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
            recipe["segments"] = segments
        return recipe


def _float_recipe(shape: list[int] | None) -> dict[str, Any]:
    if shape is not None and math.prod(shape) <= 1:
        # a 0-dim float: usually a Python number the op wrapped (an optimizer's beta2, its weight-decay
        # factor 1 - lr * wd, eps, a bias correction); the values are lost. They multiply or divide state
        # that persists across iterations (`exp_avg_sq.mul_(beta2)`, `param.mul_(1 - lr * wd)`): a random
        # sign or a near-zero value turns the arithmetic into NaN/inf, and any constant below 1 shrinks
        # parameters geometrically until gradients are denormal and every matmul runs slower. 1 is
        # neutral in products and quotients, so the replayed state keeps its scale however many
        # iterations run (the real factors are within 1e-3 of 1 for the betas and decay)
        return {"kind": "ones"}
    recipe: dict[str, Any] = {"kind": "randn"}
    if shape and len(shape) >= 2 and math.prod(shape[1:]) > 1:
        # weights are initialised with a spread of about 1/sqrt(fan_in); unit-variance data in
        # their place drives activations into ranges (denormals, saturation) the model never saw
        recipe["std"] = round(1.0 / math.sqrt(math.prod(shape[1:])), 6)
    return recipe


# ----------------------------------------------------------------------------------------------
# One function per op (family): fn(data, args by schema name)
# ----------------------------------------------------------------------------------------------


def _embedding(d: DataRecipes, a: dict[str, Any]) -> None:
    w = d.shape(a.get("weight"))
    if w:
        d.constrain(d.tid(a.get("indices")), 0, w[0])


def _embedding_backward(d: DataRecipes, a: dict[str, Any]) -> None:
    nw = a.get("num_weights")
    if isinstance(nw, int) and nw > 0:
        d.constrain(d.tid(a.get("indices")), 0, nw)


def _embedding_bag(d: DataRecipes, a: dict[str, Any]) -> None:
    _embedding(d, a)
    ind, off = d.tid(a.get("indices")), d.tid(a.get("offsets"))
    if ind is not None:
        d.skewed.add(d.tensors[ind]["storage"])
    if off is not None and ind is not None:
        # one segment per offsets view: several tables' offsets often share one storage
        # (a (T, B) tensor selected row by row), and each row must start at 0 for its table
        segment = offsets_segment(d.tensors[off], d.tensors[ind], a.get("include_last_offset"))
        rec = d.recipe(off, {"kind": "offsets", "segments": []})
        if rec.get("kind") == "offsets" and segment not in rec["segments"]:
            rec["segments"].append(segment)


def _dim_index(d: DataRecipes, a: dict[str, Any]) -> None:
    s, dim = d.shape(a.get("self")), a.get("dim")
    if s is not None and isinstance(dim, int) and s:
        d.constrain(d.tid(a.get("index")), 0, max(s[dim % len(s)], 1))


def _index_list(d: DataRecipes, a: dict[str, Any]) -> None:
    s, idx = d.shape(a.get("self")), a.get("indices")
    if s is not None and isinstance(idx, list):
        for k, e in enumerate(idx):
            t = d.tid(e)
            if t is not None and k < len(s) and d.tensors[t]["dtype"] not in ("bool", "uint8"):
                d.constrain(t, 0, max(s[k], 1))


def _class_target(d: DataRecipes, a: dict[str, Any]) -> None:
    s, t = d.shape(a.get("self")), d.tid(a.get("target"))
    if s and t is not None and d.tensors[t]["dtype"] not in FLOAT_DTYPES:
        d.constrain(t, 0, max(s[1] if len(s) >= 2 else s[0], 1))


def _one_hot(d: DataRecipes, a: dict[str, Any]) -> None:
    nc = a.get("num_classes")
    if isinstance(nc, int) and nc > 0:
        d.constrain(d.tid(a.get("self")), 0, nc)


def _probabilities(d: DataRecipes, a: dict[str, Any]) -> None:
    # binary cross-entropy: predictions and targets are probabilities in [0, 1]
    d.positive(a.get("self"))
    d.positive(a.get("target"))


def _positive_self(d: DataRecipes, a: dict[str, Any]) -> None:
    d.positive(a.get("self"))


def _pow(d: DataRecipes, a: dict[str, Any]) -> None:
    e = a.get("exponent")
    if isinstance(e, float) and not float(e).is_integer():
        d.positive(a.get("self"))


def _addcdiv(d: DataRecipes, a: dict[str, Any]) -> None:
    d.positive(a.get("tensor2"))


RecipeFn = Callable[[DataRecipes, dict[str, Any]], None]


def _table(*rows: tuple[tuple[str, ...], RecipeFn]) -> dict[str, RecipeFn]:
    table: dict[str, RecipeFn] = {}
    for names, fn in rows:
        for name in names:
            if name in table:
                raise ValueError(f"two data recipes for {name}")
            table[name] = fn
    return table


#: op name (``ns::name``, no overload) -> its data recipe function
RECIPES: dict[str, RecipeFn] = _table(
    (("aten::embedding",), _embedding),
    (("aten::embedding_dense_backward", "aten::embedding_backward", "aten::embedding_sparse_backward"),
     _embedding_backward),
    (tuple(EMBEDDING_BAG_OPS), _embedding_bag),
    (("aten::gather", "aten::scatter", "aten::scatter_", "aten::scatter_add", "aten::scatter_add_",
      "aten::scatter_reduce", "aten::scatter_reduce_", "aten::index_select", "aten::index_add",
      "aten::index_add_", "aten::index_copy", "aten::index_copy_", "aten::index_fill", "aten::index_fill_",
      "aten::take_along_dim", "aten::index_reduce", "aten::index_reduce_"), _dim_index),
    (("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index",
      "aten::_unsafe_index_put"), _index_list),
    (("aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward", "aten::nll_loss2d",
      "aten::nll_loss2d_forward", "aten::cross_entropy_loss", "aten::nll_loss_backward",
      "aten::nll_loss2d_backward"), _class_target),
    (("aten::one_hot",), _one_hot),
    (("aten::binary_cross_entropy", "aten::binary_cross_entropy_backward"), _probabilities),
    (("aten::log", "aten::log_", "aten::log2", "aten::log10", "aten::sqrt", "aten::sqrt_", "aten::rsqrt",
      "aten::rsqrt_", "aten::reciprocal", "aten::_foreach_sqrt", "aten::_foreach_sqrt_", "aten::_foreach_log",
      "aten::_foreach_log_", "aten::_foreach_rsqrt", "aten::lgamma", "aten::digamma"), _positive_self),
    (("aten::pow", "aten::pow_", "aten::_foreach_pow", "aten::_foreach_pow_"), _pow),
    (("aten::addcdiv", "aten::addcdiv_", "aten::_foreach_addcdiv", "aten::_foreach_addcdiv_"), _addcdiv),
    *FBGEMM_RECIPES,
)
