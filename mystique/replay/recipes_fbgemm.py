"""Data recipes of FBGEMM's operators (``fbgemm::``): the sparse features and the table-batched
embedding (TBE) lookups of DLRM.

A TBE lookup reads ``T`` tables packed in one weights tensor, described by metadata tensors that must
agree with each other and with the weights: ``D_offsets`` (``T + 1`` cumulative row widths, last =
``total_D``), ``weights_offsets`` (where each table starts in the weights), ``hash_size_cumsum``
(``T + 1`` cumulative row counts), the placements, and for the optimizer-fused lookups each state's
``momentumK_offsets`` (per element like the weights, or one per row for the row-wise optimizers).
The trace keeps none of their values, so each lookup gets an even layout its recorded shapes allow:
``D`` per table from ``total_D``/``max_D``, ``R`` rows per table from the weights' size. Its indices
lie in ``[0, R)`` (Zipf-skewed like embedding-bag indices) and the ``bounds_check_indices`` that
guards them gets ``rows_per_table = R``. Tables larger than :data:`TBE_MAX_ROWS` rows are shrunk to
it (weights and states), so that a production trace (PARAM's DLRM: 40 M rows per table, 5 GiB of
weights and state per rank) replays on one host; the lookups then read the same number of rows per
batch from a smaller table.

The same holds for the PT2 lookups (``..._function_pt2``: weights and states as ``Tensor[]`` of
packed tensor, placements and offsets) and for the inference lookup
(``int_nbit_split_embedding_codegen_lookup_function``: byte rows of the type its ``max_<type>_D``
names, :func:`_nbit_lookup`). ``permute_2D_sparse_data`` gets a permutation and lengths that add up
to its values' count.
Functions take ``(data, args)`` like those of :mod:`mystique.replay.recipes`, which lists them.
"""

from __future__ import annotations

import math
from typing import Any

TBE_MAX_ROWS = 1 << 20  # rows per table kept in a replay (64 MiB per fp32 table of D = 16)
HOST_PLACEMENT = 3  # FBGEMM's EmbeddingLocation.HOST: where a CPU replay's tables live


def _numel(d: Any, tid: int | None) -> int:
    return int(math.prod(d.tensors[tid]["shape"])) if tid is not None else 0


def _values(d: Any, enc: Any, values: list[int]) -> None:
    tid = d.tid(enc)
    if tid is not None:
        d.recipe(tid, {"kind": "values", "values": [int(v) for v in values]})


def _widths(total_d: int, max_d: int, tables: int) -> list[int]:
    """Row widths of ``tables`` tables adding up to ``total_d``, none wider than ``max_d``, the first
    ``max_d`` when the rest can share what is left evenly."""
    if tables <= 0:
        return []
    rest = total_d - max_d
    if tables > 1 and 0 < rest and rest % (tables - 1) == 0 and rest // (tables - 1) <= max_d:
        return [max_d] + [rest // (tables - 1)] * (tables - 1)
    base, extra = divmod(max(total_d, tables), tables)
    return [base + (1 if t < extra else 0) for t in range(tables)]


def _cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _shrink(d: Any, tid: int | None, numel: int) -> None:
    """Tensor ``tid`` (the only view of its storage, from its start) holds ``numel`` elements."""
    if tid is None or _numel(d, tid) <= numel:
        return
    t = d.tensors[tid]
    sid = t["storage"]
    if int(t.get("offset") or 0) != 0 or sum(1 for u in d.tensors if u["storage"] == sid) != 1:
        return
    st = next(s for s in d.storages if s["id"] == sid)
    st["nbytes"] = int(st["nbytes"]) * numel // max(_numel(d, tid), 1)
    t["shape"] = [numel]


def _rows_known(d: Any, ind: int | None, rows: int) -> None:
    """The indices ``ind`` address tables of ``rows`` rows: constrain them, and every
    ``rows_per_table`` of a bounds check over them."""
    if ind is None:
        return
    sid = d.tensors[ind]["storage"]
    d.constrain(ind, 0, rows)
    d.skewed.add(sid)
    d.tables[("rows", sid)] = rows
    for rpt in d.tables.pop(("pending", sid), []):
        d.recipe(rpt, {"kind": "values", "values": [rows]})


def _split(a: dict[str, Any], name: str, k: int | None = None) -> dict[str, Any] | None:
    """One packed tensor of a lookup (the weights, ``k``: optimizer state k) and its uvm copy,
    placements and offsets: named arguments (``dev_weights``/``host_weights``, ``momentum1_dev``...),
    or the ``Tensor[]`` of the PT2 lookups (host: ``[host, placements, offsets]``; device: ``[dev,
    uvm, placements, offsets, lxu_cache]``)."""
    packed = a.get(name if k is None else f"momentum{k}")
    if isinstance(packed, list) and len(packed) >= 3:
        if len(packed) == 3:
            return {"w": packed[0], "uvm": None, "placements": packed[1], "offsets": packed[2]}
        return {"w": packed[0], "uvm": packed[1], "placements": packed[2], "offsets": packed[3]}
    pre = "weights_" if k is None else f"momentum{k}_"
    w = a.get("dev_weights", a.get("host_weights")) if k is None else a.get(f"{pre}dev", a.get(f"{pre}host"))
    if w is None:
        return None
    return {"w": w, "uvm": a.get("uvm_weights" if k is None else f"{pre}uvm"),
            "placements": a.get(f"{pre}placements"), "offsets": a.get(f"{pre}offsets")}


def _packed(d: Any, part: dict[str, Any]) -> int | None:
    """The tensor holding the rows of ``part`` (the device copy, or the uvm one when that is empty)."""
    w = d.tid(part["w"])
    return d.tid(part["uvm"]) if w is not None and _numel(d, w) == 0 and d.tid(part["uvm"]) is not None else w


def _tbe_lookup(d: Any, a: dict[str, Any]) -> None:
    weights = _split(a, "weights")
    total_d, max_d = a.get("total_D"), a.get("max_D")
    w = _packed(d, weights) if weights else None
    wo = d.shape(weights["offsets"]) if weights else None
    if w is None or not wo or not isinstance(total_d, int) or not isinstance(max_d, int):
        return
    tables = wo[0]
    widths = _widths(total_d, max_d, tables)
    width = sum(widths)
    rows = min(max(_numel(d, w) // max(width, 1), 1), TBE_MAX_ROWS)
    per_element = [rows * c for c in _cumsum(widths)[:-1]]
    per_row = [rows * t for t in range(tables)]
    for k in range(1, 5):  # the optimizer states first: their size says per element or per row
        state = _split(a, "momentum", k)
        tid = _packed(d, state) if state else None
        if tid is None:
            break
        full = _numel(d, tid) >= _numel(d, w)
        _shrink(d, tid, rows * width if full else rows * tables)
        _values(d, state["offsets"], per_element if full else per_row)
        _values(d, state["placements"], [HOST_PLACEMENT] * tables)
    _shrink(d, w, rows * width)
    _values(d, weights["offsets"], per_element)
    _values(d, weights["placements"], [HOST_PLACEMENT] * tables)
    _values(d, a.get("D_offsets"), _cumsum(widths))
    _values(d, a.get("hash_size_cumsum"), [rows * t for t in range(tables + 1)])
    _indices_and_offsets(d, a, rows)


def _indices_and_offsets(d: Any, a: dict[str, Any], rows: int) -> None:
    ind, off = d.tid(a.get("indices")), d.tid(a.get("offsets"))
    _rows_known(d, ind, rows)
    if off is not None and ind is not None:
        d.recipe(off, {"kind": "offsets", "segments": [[0, _numel(d, off), 1, _numel(d, ind), True]]})


# FBGEMM's SparseType codes of the inference lookup's ``weights_tys``, with the ``max_<type>_D``
# argument that names each and the bytes of one row of D elements (8- to 2-bit rows carry an fp16
# scale and bias, 4 bytes)
_NBIT_TYPES = (("max_float32_D", 0, lambda dim: 4 * dim), ("max_float16_D", 1, lambda dim: 2 * dim),
               ("max_int8_D", 2, lambda dim: dim + 4), ("max_int4_D", 3, lambda dim: (dim + 1) // 2 + 4),
               ("max_int2_D", 4, lambda dim: (dim + 3) // 4 + 4))


def _nbit_lookup(d: Any, a: dict[str, Any]) -> None:
    """``int_nbit_split_embedding_codegen_lookup_function`` (inference): the tables' type is the one
    with the widest ``max_<type>_D``; rows are ``row_alignment``-aligned bytes of that type. The
    bytes are drawn below 60: every fp16 scale, bias and fp32 element they form is finite."""
    wo, total_d = d.shape(a.get("weights_offsets")), a.get("total_D")
    w = d.tid(a.get("dev_weights"))
    if w is not None and _numel(d, w) == 0:
        w = d.tid(a.get("uvm_weights"))
    if w is None or not wo or not isinstance(total_d, int):
        return
    tables = wo[0]
    arg, code, row_bytes = max(_NBIT_TYPES, key=lambda ty: a.get(ty[0]) or 0)
    widths = _widths(total_d, max(int(a.get(arg) or 1), 1), tables)
    align = max(int(a.get("row_alignment") or 1), 1)
    sizes = [-(-row_bytes(dim) // align) * align for dim in widths]
    rows = min(max(_numel(d, w) // max(sum(sizes), 1), 1), TBE_MAX_ROWS)
    _shrink(d, w, rows * sum(sizes))
    d.recipe(w, {"kind": "randint", "low": 0, "high": 60})
    _values(d, a.get("weights_offsets"), [rows * c for c in _cumsum(sizes)[:-1]])
    _values(d, a.get("weights_tys"), [code] * tables)
    _values(d, a.get("weights_placements"), [HOST_PLACEMENT] * tables)
    _values(d, a.get("D_offsets"), _cumsum(widths))
    _indices_and_offsets(d, a, rows)


def _bounds_check(d: Any, a: dict[str, Any]) -> None:
    ind, rpt = d.tid(a.get("indices")), d.tid(a.get("rows_per_table"))
    _values(d, a.get("warning"), [0])
    if ind is None or rpt is None:
        return
    rows = d.tables.get(("rows", d.tensors[ind]["storage"]))
    if rows is not None:
        d.recipe(rpt, {"kind": "values", "values": [rows]})
    else:  # the lookup that reads these indices comes later: it sets the rows
        d.tables.setdefault(("pending", d.tensors[ind]["storage"]), []).append(rpt)


def _permute_2d(d: Any, a: dict[str, Any]) -> None:
    perm, lengths, values = d.tid(a.get("permute")), d.tid(a.get("lengths")), d.tid(a.get("values"))
    if perm is not None:
        d.recipe(perm, {"kind": "randperm"})
    if lengths is not None and values is not None:
        d.recipe(lengths, {"kind": "lengths", "total": _numel(d, values)})


#: rows of :data:`mystique.replay.recipes.RECIPES`: (op names, recipe function)
FBGEMM_RECIPES: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("fbgemm::dense_embedding_codegen_lookup_function",)
     + tuple(f"fbgemm::split_embedding_codegen_lookup_{opt}_function{sfx}"
             for opt in ("adagrad", "rowwise_adagrad", "sgd", "adam", "partial_rowwise_adam", "lamb",
                         "partial_rowwise_lamb", "lars_sgd", "rowwise_weighted_adagrad", "approx_sgd",
                         "approx_rowwise_adagrad", "rowwise_adagrad_with_weight_decay", "none")
             for sfx in ("", "_cpu", "_pt2")), _tbe_lookup),
    (("fbgemm::int_nbit_split_embedding_codegen_lookup_function",), _nbit_lookup),
    (("fbgemm::bounds_check_indices",), _bounds_check),
    (("fbgemm::permute_2D_sparse_data", "fbgemm::permute_1D_sparse_data"), _permute_2d),
)
