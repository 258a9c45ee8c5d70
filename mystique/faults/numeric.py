"""Rounding faults: ``truncating_casts`` (a conversion unit rounding toward zero),
``low_precision_accum`` (matrix units accumulating in bf16/fp16) and ``subnormal_flush`` (FTZ/DAZ
left on). Each changes only what its class docstring says; everything else runs untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from mystique import dtypes
from mystique.errors import UsageError

from .modes import MATMUL_OPERANDS, FaultMode, grouped_parts, matmul_selection
from .schema import (
    base_name,
    bind,
    finish,
    is_float,
    is_view,
    map_outputs,
    op_name,
    replace_args,
    written_args,
)

_DTYPES_BY_NAME = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def round_toward_zero_fix(rounded: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Turn a round-to-nearest conversion ``rounded`` of ``source`` into round-toward-zero.

    Where the rounded magnitude exceeds the source's, the result steps one ulp toward zero
    (the bit pattern of a non-zero float minus one; infinity becomes the largest finite value).
    NaNs and exact conversions are unchanged. Returns a new tensor in ``rounded``'s dtype.
    """
    wide = torch.promote_types(rounded.dtype, source.dtype)
    src = source.to(device=rounded.device, dtype=wide)
    if src.shape != rounded.shape:
        src = src.expand(rounded.shape)
    away = rounded.to(wide).abs() > src.abs()
    int_dtype = dtypes.int_dtype(rounded.dtype)
    stepped = (rounded.contiguous().view(int_dtype) - 1).view(rounded.dtype)
    return torch.where(away, stepped, rounded)


class TruncatingCastMode(FaultMode):
    """Float conversions into ``dtypes`` round toward zero instead of to nearest even.

    Covers the explicit conversions the dispatcher sees: ``_to_copy`` (``.to``, ``.half()``,
    ``.bfloat16()``, ``type_as``), ``to`` and ``copy``/``copy_`` into a tensor of the lower
    dtype, including their ``out=`` forms. Conversions from integer types and all arithmetic are
    untouched.
    """

    name = "truncating_casts"
    _SOURCE_ARG = {"_to_copy": "self", "to": "self", "copy": "src", "copy_": "src"}

    def __init__(self, dtypes: str = "bfloat16+float16"):
        super().__init__()
        names = [d.strip() for d in dtypes.replace("+", ",").split(",") if d.strip()]
        bad = [d for d in names if d not in _DTYPES_BY_NAME]
        if bad or not names:
            raise UsageError(f"--inject truncating_casts: dtypes={dtypes!r}: expected bfloat16 and/or float16 "
                             "(joined with +)")
        self.dtypes = {_DTYPES_BY_NAME[d] for d in names}

    def fault(self, func, args, kwargs):
        out = func(*args, **kwargs)
        source_arg = self._SOURCE_ARG.get(op_name(func))
        if source_arg is None or not isinstance(out, torch.Tensor) or out.dtype not in self.dtypes:
            return out
        source = bind(func, args, kwargs).get(source_arg)
        if not is_float(source) or source.dtype == out.dtype or out.numel() == 0:
            return out
        fixed = round_toward_zero_fix(out, source)
        if func._schema.is_mutable:
            out.copy_(fixed)
            return out
        return fixed


def low_precision_matmul(a: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
    """``a @ b`` (``(..., M, K) @ (..., K, N)``) with a low-precision accumulator.

    Each K-chunk of ``chunk`` products is summed in float32 (as one matrix-unit step does), then
    added to an accumulator that is rounded to ``a.dtype`` after every partial sum. Returns the
    accumulator in ``a.dtype``.
    """
    low = a.dtype
    k = a.shape[-1]
    acc = None
    for start in range(0, k, chunk):
        part = torch.matmul(a[..., start:start + chunk].float(), b[..., start:start + chunk, :].float())
        acc = part.to(low) if acc is None else (acc.float() + part).to(low)
    if acc is None:
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        acc = torch.zeros(shape, dtype=low, device=a.device)
    return acc


def _scaled_sum(bias: torch.Tensor, product: torch.Tensor, beta: Any, alpha: Any, low: torch.dtype) -> torch.Tensor:
    """``beta * bias + alpha * product`` in float32, rounded once to ``low`` (``bias`` ignored when beta is 0)."""
    value = product.float() * alpha if alpha != 1 else product.float()
    if beta != 0:
        value = value + bias.float() * beta
    return value.to(low)


class LowPrecisionAccumMode(FaultMode):
    """bf16/fp16 matrix multiplies accumulate in the low dtype instead of float32.

    ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``mv``, ``addmv``, ``dot`` (and so
    ``linear``/``matmul``, which decompose into them) and ``_grouped_mm`` (``ops``, a regular
    expression, narrows them) whose operands are float16 or bfloat16 are computed with
    :func:`low_precision_matmul` (partial sums of ``chunk`` products, the accumulator rounded to the
    operand dtype after each): a grouped matmul group by group (:func:`.modes.grouped_parts`), each
    group's K reduction as one GEMM's, output rows of no group as the device wrote them. Float32/64
    multiplies are untouched.
    """

    name = "low_precision_accum"

    def __init__(self, chunk: int = 16, ops: str = ""):
        super().__init__()
        if chunk < 1:
            raise UsageError(f"--inject low_precision_accum: chunk={chunk} must be at least 1")
        self.chunk = chunk
        self.ops = matmul_selection(ops, self.name) - {"vdot"}  # a complex dot has no low-precision form here
        if not self.ops:
            raise UsageError(f"--inject low_precision_accum: ops={ops!r} selects only vdot, which it leaves alone")

    def fault(self, func, args, kwargs):
        name = base_name(func)
        if name not in self.ops:
            return func(*args, **kwargs)
        b = bind(func, args, kwargs)
        if name == "_grouped_mm":
            return self._grouped(func, args, kwargs, b)
        value = self._compute(name, b)
        if value is None:
            return func(*args, **kwargs)
        out_dtype = b.get("out_dtype")  # mm(a, b, out_dtype=float32): the low accumulator, a wider result
        if isinstance(out_dtype, torch.dtype) and value.dtype != out_dtype:
            value = value.to(out_dtype)
        return finish(func, b, value)

    def _grouped(self, func: Any, args: tuple, kwargs: dict, b: dict[str, Any]) -> torch.Tensor:
        out = func(*args, **kwargs)
        x, y = b["self"], b["mat2"]
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or \
                x.dtype not in dtypes.HALF_DTYPES or y.dtype != x.dtype:
            return out
        value = out.clone()
        for index, a_g, b_g in grouped_parts(x, y, b["offs"]):
            value[index] = low_precision_matmul(a_g, b_g, self.chunk).to(value.dtype)
        return value

    def _compute(self, name: str, b: dict[str, Any]) -> torch.Tensor | None:
        operands = MATMUL_OPERANDS[name]
        x, y = b[operands[0]], b[operands[1]]
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or \
                x.dtype not in dtypes.HALF_DTYPES or y.dtype != x.dtype:
            return None
        low, c = x.dtype, self.chunk
        if name in ("mm", "bmm", "addmm", "baddbmm"):
            prod = low_precision_matmul(x, y, c)
        elif name == "addbmm":  # sum over the batch is part of the same reduction
            nb, m, k = x.shape
            prod = low_precision_matmul(x.transpose(0, 1).reshape(m, nb * k), y.reshape(nb * k, y.shape[-1]), c)
        elif name in ("mv", "addmv"):
            prod = low_precision_matmul(x, y.unsqueeze(-1), c).squeeze(-1)
        else:  # dot
            prod = low_precision_matmul(x.unsqueeze(0), y.unsqueeze(-1), c).reshape(())
        if name in ("addmm", "baddbmm", "addbmm", "addmv"):  # beta * self (broadcast) + alpha * product
            return _scaled_sum(b["self"], prod, b["beta"], b["alpha"], low)
        return prod



# Operators that move or create data without floating arithmetic: FTZ/DAZ hardware does not
# flush loads, stores, copies, indexing or constant fills.
_DATA_MOVEMENT = frozenset({
    "clone", "copy", "copy_", "_copy_from", "_copy_from_and_resize", "contiguous", "detach", "alias",
    "lift_fresh", "lift_fresh_copy", "_unsafe_view", "cat", "stack", "index", "index_select", "gather",
    "scatter", "index_put", "index_put_", "index_copy", "masked_select", "masked_scatter", "take",
    "slice_scatter", "select_scatter", "as_strided_scatter", "constant_pad_nd", "flip", "roll", "repeat",
    "expand_copy", "permute_copy", "t_copy", "transpose_copy", "view_copy", "unsqueeze_copy", "squeeze_copy",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "fill", "fill_", "zero_", "scalar_tensor",
    "_local_scalar_dense", "item", "set_", "resize_", "resize_as_", "randn", "rand", "randn_like", "rand_like",
    "normal", "normal_", "uniform_", "randint", "randperm", "bernoulli", "bernoulli_", "arange", "linspace",
    "tril", "triu", "diag_embed", "split_with_sizes_copy", "unbind_copy", "_to_dense", "to",
})


def _subnormal_mask(t: torch.Tensor) -> torch.Tensor:
    return (t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)


def flush_subnormals(t: torch.Tensor) -> torch.Tensor:
    """``t`` with subnormal values replaced by zeros of the same sign; ``t`` itself when it has none."""
    mask = _subnormal_mask(t)
    if not bool(mask.any()):
        return t
    return torch.where(mask, t * 0, t)


class SubnormalFlushMode(FaultMode):
    """Flush-to-zero (results) and denormals-are-zero (inputs) on floating arithmetic.

    With ``outputs`` (FTZ) subnormal results of floating operators become zero; with ``inputs``
    (DAZ) subnormal operands are read as zero. Data movement (copies, views, indexing, fills,
    random generation, same-dtype ``_to_copy``) is untouched, as it is on real hardware; a
    conversion to another dtype flushes.
    """

    name = "subnormal_flush"

    def __init__(self, inputs: bool = True, outputs: bool = True):
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs

    def _applies(self, func: Any, args: tuple, kwargs: dict) -> bool:
        name = op_name(func)
        if is_view(func) or name in _DATA_MOVEMENT:
            return False
        if name == "_to_copy":
            dtype = kwargs.get("dtype")
            return dtype is not None and isinstance(args[0], torch.Tensor) and dtype != args[0].dtype
        return True

    def fault(self, func, args, kwargs):
        if not self._applies(func, args, kwargs):
            return func(*args, **kwargs)
        if self.inputs:
            args, kwargs = self._flush_inputs(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.outputs:
            out = map_outputs(func, args, kwargs, out, flush_subnormals)
        return out

    def _flush_inputs(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        written = written_args(func)
        in_place = {name for name, kw_only in written if not kw_only}
        out_args = {name for name, kw_only in written if kw_only}
        b = bind(func, args, kwargs)
        new: dict[str, Any] = {}
        for name, value in b.items():
            if name in out_args:
                continue
            if name in in_place:
                if is_float(value):
                    flushed = flush_subnormals(value)
                    if flushed is not value:
                        value.copy_(flushed)  # read-modify-write of the in-place operand
                continue
            replaced = tree_map(lambda x: flush_subnormals(x) if is_float(x) else x, value)
            if replaced is not value and _differs(replaced, value):
                new[name] = replaced
        return replace_args(func, args, kwargs, **new) if new else (args, kwargs)


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is not b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return any(_differs(x, y) for x, y in zip(a, b))
    return False


