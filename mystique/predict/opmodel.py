"""What an operator is, for the performance model: its class (GEMM, attention, memory-bound,
communication; host time is the gaps between operators), its floating-point work and the bytes it
touches, from the shapes and dtypes a plan records. No torch.

Work (FLOPs, multiply-add = 2): ``mm``/``addmm`` ``2mkn``; ``bmm``/``baddbmm`` ``2bmkn``;
``linear``/``matmul`` ``2 * (output elements) * k``; scaled dot-product attention forward ``4 B H L S D``
(two GEMMs), its backward ``8 B H L S D``. Every other operator is counted by bytes alone (inputs read
plus outputs written): the roofline of :mod:`.whatif` treats it as memory-bound.

A GEMM's layout (:func:`gemm_layout`): ``n`` or ``t`` per operand of the product ``A @ B``, ``t`` when the
operand is read column-major (its last stride 1 in the row dimension, not the column one). ``linear(x, W)``
computes ``x @ W.T``, so a row-major weight is a ``t`` operand. A BLAS without a native kernel for a dtype
(bf16 on a CPU without AVX512-BF16) runs the layouts at throughputs up to 15x apart, so the device profile
samples each (:mod:`mystique.validators.performance.micro`) and :mod:`.whatif` reads the op's own.
A batched GEMM (``bmm``, ``baddbmm``, a ``matmul`` of two batched operands) is ``products`` independent
products of ``flops / products`` FLOPs each, run one after another, so its throughput is that of one
product's size. An attention operator's "layout" is ``sdpa`` (forward) or ``sdpa_bwd`` (backward): its
kernels are not the GEMM's, and the profile measures them apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..replay.runtime.schemas import COLLECTIVE_NAMES, COLLECTIVE_PREFIXES

_GEMM = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "_addmm_activation", "einsum",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "convolution_backward", "mkldnn_convolution",
    "mkldnn_linear", "_int_mm", "addmv", "mv", "dot", "vdot", "tensordot", "linear_backward",
})
_ATTENTION_WORDS = ("attention", "flash", "sdpa", "_efficient_attn")
_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
             "float8_e5m2": 1}
FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16")


def op_class(name: str) -> str:
    """``gemm``, ``attention``, ``communication`` or ``memory`` for an operator name (``aten::mm``)."""
    if name in COLLECTIVE_NAMES or name.startswith(COLLECTIVE_PREFIXES) or "nccl" in name.lower():
        return "communication"
    base = name.split("::", 1)[-1].split(".", 1)[0]
    low = base.lower()
    if any(w in low for w in _ATTENTION_WORDS):
        return "attention"
    if base in _GEMM:
        return "gemm"
    return "memory"


def kernel_class(name: str) -> str:
    """The class of a device kernel from its name (cuBLAS/CUTLASS GEMMs, flash attention, NCCL)."""
    low = name.lower()
    if "nccl" in low:
        return "communication"
    if any(w in low for w in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if any(w in low for w in ("gemm", "sgemm", "hgemm", "cutlass", "cublas", "xmma", "matmul", "wgmma", "s16816",
                               "s1688", "conv")):
        return "gemm"
    return "memory"


@dataclass(frozen=True)
class TensorShape:
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...] | None = None

    @property
    def column_major(self) -> bool:
        """Whether the last two dimensions are stored column-major (unit stride along the rows, not the
        columns): a transposed view, which a GEMM reads as a ``t`` operand."""
        if self.strides is None or len(self.shape) < 2:
            return False
        (r, c), (sr, sc) = self.shape[-2:], self.strides[-2:]
        return sc != 1 and c > 1 and (sr == 1 or r == 1)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _ITEMSIZE.get(self.dtype, 4)


@dataclass(frozen=True)
class Work:
    """An operator's work: FLOPs, bytes touched, the dtype of its first floating input ('' if none) and, for
    a GEMM, its layout (``nn``, ``nt``, ``tn``, ``tt``; an attention operator's ``sdpa`` or ``sdpa_bwd``; ''
    otherwise), the independent products it is made of (a batched GEMM's batch; see the module docstring) and,
    for a GEMM whose product the device profile can measure at its own shape, ``(batch, M, N, K)``
    (:func:`gemm_dims`)."""

    flops: float
    bytes: float
    dtype: str
    layout: str = ""
    products: int = 1
    dims: tuple[int, int, int, int] | None = None

    @property
    def unit_flops(self) -> float:
        """The FLOPs of one of its products: the size its throughput is read at."""
        return self.flops / max(self.products, 1)


def _walk(value: Any, out: list[int]) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            t = v.get("t")
            if isinstance(t, int) and not isinstance(t, bool) and len(v) == 1:
                out.append(t)
        elif isinstance(v, list):
            stack.extend(reversed(v))


def tensor_ids(values: Iterable[Any]) -> list[int]:
    out: list[int] = []
    for v in values:
        _walk(v, out)
    return out


def _shape(t: dict[str, Any]) -> TensorShape | None:
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        return None
    strides = t.get("strides")
    ok = isinstance(strides, list) and len(strides) == len(shape) and all(isinstance(x, int) for x in strides)
    return TensorShape(tuple(shape), str(t.get("dtype", "")), tuple(strides) if ok else None)


def op_tensors(op: dict[str, Any], tensors: dict[int, dict[str, Any]]) -> tuple[list[TensorShape], list[TensorShape]]:
    """The input and output tensors of a plan op (shapes and dtypes), unknown ids left out."""
    ins = [s for i in tensor_ids([op.get("args", []), list((op.get("kwargs") or {}).values())])
           if (t := tensors.get(i)) is not None and (s := _shape(t)) is not None]
    outs = [s for i in tensor_ids([op.get("outputs", [])])
            if (t := tensors.get(i)) is not None and (s := _shape(t)) is not None]
    return ins, outs


def _gemm_flops(base: str, ins: list[TensorShape], outs: list[TensorShape]) -> float:
    mats = [t for t in ins if len(t.shape) >= 1 and t.dtype in FLOAT_DTYPES + ("int8",)]
    if base in ("addmm", "baddbmm", "addbmm", "_addmm_activation") and len(mats) >= 3:
        mats = mats[1:]
    if len(mats) < 2 or not outs:
        return 0.0
    a = mats[0]
    if base in ("linear", "mkldnn_linear"):
        k = a.shape[-1] if a.shape else 1
    elif base in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "mkldnn_convolution",
                  "convolution_backward"):
        w = mats[1]
        k = math.prod(w.shape[1:]) if len(w.shape) > 1 else 1
    else:
        k = a.shape[-1] if a.shape else 1
    return 2.0 * outs[0].numel * k


def gemm_layout(base: str, ins: list[TensorShape]) -> str:
    """The layout of a GEMM's product ``A @ B`` (see the module docstring): ``nn``, ``nt``, ``tn`` or ``tt``."""
    mats = [t for t in ins if len(t.shape) >= 1 and t.dtype in FLOAT_DTYPES + ("int8",)]
    if base in ("addmm", "baddbmm", "addbmm", "_addmm_activation") and len(mats) >= 3:
        mats = mats[1:]
    if len(mats) < 2:
        return "nn"
    a, b = mats[0], mats[1]
    if base in ("linear", "mkldnn_linear"):  # x @ W.T: a row-major W is read transposed
        wt = len(b.shape) >= 2 and not b.column_major
        return ("t" if a.column_major else "n") + ("t" if wt else "n")
    return ("t" if a.column_major else "n") + ("t" if b.column_major else "n")


#: the GEMMs whose product ``A @ B`` :func:`gemm_dims` names (``torch.mm``/``torch.bmm`` of that shape and layout)
_DIMS_OPS = frozenset({"mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "linear", "matmul"})


def gemm_dims(base: str, ins: list[TensorShape], outs: list[TensorShape]) -> tuple[int, int, int, int] | None:
    """``(batch, M, N, K)`` of a GEMM's product ``A @ B`` (``A``: ``M x K``, ``B``: ``K x N``, ``batch`` such
    products), or None where the operator is not one product of that shape (a convolution, a matrix-vector
    product, shapes that do not chain). ``linear(x, W)`` is ``x`` folded to ``M x K`` times ``W.T``; a
    ``matmul`` with a 2-D right operand folds its left one the same way (as torch does), else it is batched
    over its output's leading dimensions. The shapes are the trace's, checked to chain (``K`` shared, ``batch
    * M * N`` the output's elements)."""
    if base not in _DIMS_OPS or not outs:
        return None
    mats = [t.shape for t in ins if t.shape and t.dtype in FLOAT_DTYPES]
    if base in ("addmm", "baddbmm", "_addmm_activation") and len(mats) >= 3:
        mats = mats[1:]
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    if base == "linear":
        if len(b) != 2 or b[1] != a[-1]:
            return None
        dims = (1, math.prod(a[:-1]), b[0], a[-1])
    elif base in ("mm", "addmm", "_addmm_activation"):
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            return None
        dims = (1, a[0], b[1], a[1])
    elif len(a) < 2 or len(b) < 2 or a[-1] != b[-2] or (base != "matmul" and (len(a) != 3 or len(b) != 3 or a[0] != b[0])):
        return None
    elif base == "matmul" and len(b) == 2:
        dims = (1, math.prod(a[:-1]), b[1], a[-1])
    else:
        dims = (math.prod(outs[0].shape[:-2]), a[-2], b[-1], a[-1])
    if min(dims) < 1 or dims[0] * dims[1] * dims[2] != outs[0].numel:
        return None
    return dims


def _attention_flops(base: str, ins: list[TensorShape]) -> float:
    qkv = [t for t in ins if len(t.shape) == 4 and t.dtype in FLOAT_DTYPES]
    if len(qkv) < 3:
        return 0.0
    q, k = qkv[0], qkv[1]
    b, h, lq, d = q.shape
    s = k.shape[2]
    return (8.0 if "backward" in base else 4.0) * b * h * lq * s * d


def op_work(op: dict[str, Any], tensors: dict[int, dict[str, Any]]) -> Work:
    """FLOPs and bytes of a plan op (see the module docstring)."""
    name = str(op.get("name", ""))
    ins, outs = op_tensors(op, tensors)
    nbytes = float(sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs))
    dtype = next((t.dtype for t in ins if t.dtype in FLOAT_DTYPES), "")
    cls = op_class(name)
    base = name.split("::", 1)[-1].split(".", 1)[0]
    flops, layout, products, dims = 0.0, "", 1, None
    if cls == "gemm":
        flops, layout, dims = _gemm_flops(base, ins, outs), gemm_layout(base, ins), gemm_dims(base, ins, outs)
        mats = [t for t in ins if t.dtype in FLOAT_DTYPES + ("int8",)]
        batched = base in ("bmm", "baddbmm") or (base == "matmul" and len(mats) >= 2 and min(len(m.shape) for m in mats[:2]) >= 3)
        if batched and outs and len(outs[0].shape) >= 3:
            products = math.prod(outs[0].shape[:-2]) or 1
    elif cls == "attention":
        flops = _attention_flops(base.lower(), ins)
        layout = "sdpa_bwd" if "backward" in base.lower() else "sdpa"
    return Work(flops, nbytes, dtype, layout, products, dims)


__all__ = ["FLOAT_DTYPES", "TensorShape", "Work", "gemm_dims", "gemm_layout", "kernel_class", "op_class", "op_tensors", "op_work", "tensor_ids"]
