"""CUDA's GEMM kernel set: no integer GEMM, GEMV or dot; int8 only through ``_int_mm``; half inputs
with an fp32 output.

A CUDA device raises ``NotImplementedError: "addmv_impl_cuda" not implemented for 'Long'`` (and
``"addmm_cuda" ...``) for int64 products the CPU computes. In aten/src/ATen/native/cuda/Blas.cpp every BLAS op dispatches its cuBLAS call over
``AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES_AND2(Half, BFloat16, ...)``, which refuses every integer
and bool dtype with ``TORCH_CHECK_NOT_IMPLEMENTED`` (a ``NotImplementedError``) naming its dispatch:
``addmm_cuda`` (mm, addmm and addbmm: ``addmm_out_cuda_impl``, whose dtype is that of ``mat1``),
``baddbmm_cuda`` (bmm, baddbmm: ``baddbmm_out_cuda_impl``, ``batch1``), ``addmv_impl_cuda`` (mv,
addmv: ``addmv_out_cuda``, ``mat``) and ``dot`` (dot, and vdot of real tensors, ``dot_cuda``).
Empty problems return before the dispatch (an empty result, or an empty reduction dimension,
which gives zeros or ``beta * self``): those run on the host as CUDA runs them. ``matmul``,
``linear``, ``einsum``, ``tensordot`` reach these ops decomposed, so they refuse integers too.
The CPU refuses bool and uint16/32/64 as well (with its own wording); the CPU computes every other
integer product.

The int8 GEMM CUDA has is ``torch._int_mm`` (int8 x int8 -> int32, cuBLASLt): ``_int_mm_out_cuda``
checks, in this order, 2-D operands, ``self.size(0) > 16``, ``self.size(1)`` a positive multiple of
8, matching inner sizes, ``mat2.size(1)`` a positive multiple of 8 and an int32 ``out``, each a
``RuntimeError`` with the wording reproduced here; the host computes the product where they hold.

Half precision with an fp32 output: ``torch.mm/addmm/bmm/baddbmm(..., out_dtype=torch.float32)``
(``aten::mm.dtype`` and friends: ``_mm_dtype_out_cuda``, ``_addmm_dtype_out_cuda``,
``_baddbmm_dtype_cuda``, ``_bmm_dtype_cuda``) run cuBLAS's bf16/fp16 GEMM with compute type 32F
into an fp32 result; torch 2.13 registers no CPU kernel for them (``Could not run 'aten::mm.dtype'
with arguments from the 'CPU' backend``). Reproduced as the host's fp32 product of the upcast
operands: bf16/fp16 values are exact in fp32, their products exact, the sums fp32 (another order
than cuBLAS's, which is legal). Not modelled: ``allow_fp16_accumulation`` (compute type 16F).
"""

from __future__ import annotations

from typing import Any

import torch

from ..faults.schema import op_name
from .difference import PASS, Difference

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
}
#: aten base name -> (argument whose dtype CUDA dispatches on, the dispatch name in its error)
_KERNELS: dict[str, tuple[str, str]] = {
    "mm": ("self", "addmm_cuda"), "addmm": ("mat1", "addmm_cuda"), "addbmm": ("batch1", "addmm_cuda"),
    "bmm": ("self", "baddbmm_cuda"), "baddbmm": ("batch1", "baddbmm_cuda"),
    "mv": ("self", "addmv_impl_cuda"), "addmv": ("mat", "addmv_impl_cuda"),
    "dot": ("self", "dot"), "vdot": ("self", "dot"),
}
_HALF = (torch.float16, torch.bfloat16)


def _bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name."""
    bound: dict[str, Any] = {}
    positional = iter(args)
    for arg in func._schema.arguments:
        if not arg.kwarg_only:
            try:
                bound[arg.name] = next(positional)
                continue
            except StopIteration:
                pass
        if arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
    return bound


def _reaches_dispatch(name: str, a: dict[str, Any]) -> bool:
    """Whether CUDA's kernel gets to its dtype dispatch (not for an empty result or reduction dimension)."""
    if name == "mm":
        m1, m2 = a["self"], a["mat2"]
        return m1.dim() == 2 and m2.dim() == 2 and m1.shape[0] * m2.shape[1] > 0 and m1.shape[1] > 0
    if name == "addmm":
        m1, m2 = a["mat1"], a["mat2"]
        return m1.dim() == 2 and m2.dim() == 2 and m1.shape[0] * m2.shape[1] > 0 and m1.shape[1] > 0
    if name in ("bmm", "baddbmm", "addbmm"):
        b1, b2 = (a["self"], a["mat2"]) if name == "bmm" else (a["batch1"], a["batch2"])
        if b1.dim() != 3 or b2.dim() != 3:
            return True
        out = b1.shape[1] * b2.shape[2] * (1 if name == "addbmm" else b1.shape[0])
        return out > 0 and b1.shape[2] > 0 and b1.shape[0] > 0
    if name in ("mv", "addmv"):
        return a["self" if name == "mv" else "mat"].numel() > 0
    return True  # dot: dispatches whatever the length


def _integer_gemm(func: Any, args: tuple, kwargs: dict) -> Any:
    name = op_name(func)
    which, kernel = _KERNELS[name]
    a = _bind(func, args, kwargs)
    t = a.get(which)
    if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPE_NAMES or not _reaches_dispatch(name, a):
        return PASS
    out_dtype = a.get("out_dtype")
    if out_dtype is not None and out_dtype != t.dtype:
        raise RuntimeError("out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs")
    raise NotImplementedError(f'"{kernel}" not implemented for \'{_DTYPE_NAMES[t.dtype]}\'')


def _int_mm(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    x, y = a["self"], a["mat2"]
    if x.dim() != 2:
        raise RuntimeError(f"Expected self to be of dimension 2 but got {x.dim()}")
    if y.dim() != 2:
        raise RuntimeError(f"Expected mat2 to be of dimension 2 but got {y.dim()}")
    if not x.shape[0] > 16:
        raise RuntimeError(f"self.size(0) needs to be greater than 16, but got {x.shape[0]}")
    if not (x.shape[1] > 0 and x.shape[1] % 8 == 0):
        raise RuntimeError(f"self.size(1) needs to be greater than 0 and a multiple of 8, but got {x.shape[1]}")
    if x.shape[1] != y.shape[0]:
        raise RuntimeError(f"self.size(1) needs to match mat2.size(0) but got {x.shape[1]} and {y.shape[0]}")
    if not (y.shape[1] > 0 and y.shape[1] % 8 == 0):
        raise RuntimeError(f"mat2.size(1) needs to be greater than 0 and a multiple of 8, but got {y.shape[1]}")
    out = a.get("out")
    if out is not None and out.dtype != torch.int32:
        raise RuntimeError(f"Expected result dtype to be of type kInt but got {out.dtype}")
    return PASS


def _half_fp32_output(func: Any, args: tuple, kwargs: dict) -> Any:
    overload = getattr(func, "_overloadname", "")
    if overload not in ("dtype", "dtype_out"):
        return PASS
    name = op_name(func)
    a = _bind(func, args, kwargs)
    first, second = {"mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"),
                     "baddbmm": ("batch1", "batch2")}[name]
    x, y, out_dtype = a[first], a[second], a["out_dtype"]
    if x.dtype in _DTYPE_NAMES:  # (the integer difference refuses these first)
        return PASS
    rank = 3 if name in ("bmm", "baddbmm") else 2
    for arg, t in ((first, x), (second, y)):
        if t.dim() != rank:
            raise RuntimeError(f"{arg} must be a 3D tensor" if rank == 3 else
                               f"{arg} must be a matrix, got {t.dim()}-D tensor")
    if x.shape[-1] != y.shape[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({x.shape[-2]}x{x.shape[-1]} and "
                           f"{y.shape[-2]}x{y.shape[-1]})")
    if x.dtype != y.dtype:
        raise RuntimeError("input dtypes must be the same")
    if not (out_dtype == x.dtype or (out_dtype == torch.float32 and x.dtype in _HALF)):
        raise RuntimeError("out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs")
    up = (lambda t: t.to(out_dtype)) if out_dtype != x.dtype else (lambda t: t)
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    if name == "mm":
        res = torch.mm(up(x), up(y))
    elif name == "bmm":
        res = torch.bmm(up(x), up(y))
    elif name == "addmm":
        res = torch.addmm(up(a["self"]), up(x), up(y), beta=beta, alpha=alpha)
    else:
        res = torch.baddbmm(up(a["self"]), up(x), up(y), beta=beta, alpha=alpha)
    out = a.get("out")
    if out is None:
        return res
    if out.dtype != out_dtype:
        raise RuntimeError("out_dtype must be the same as the dtype of the provided out tensor")
    out.resize_(res.shape).copy_(res)
    return out


DIFFERENCES: list[Difference] = [
    Difference(
        name="no_integer_gemm",
        summary="integer and bool mm/addmm/addbmm/bmm/baddbmm/mv/addmv/dot/vdot raise NotImplementedError "
                "(\"addmm_cuda\" not implemented for 'Long'); empty problems return as on the host",
        documented="aten/src/ATen/native/cuda/Blas.cpp (AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES_AND2 in "
                   "addmm_out_cuda_impl, baddbmm_out_cuda_impl, addmv_out_cuda, dot_cuda); seen on an H100 "
                   "2026-11-25 (issue 17)",
        ops=frozenset(_KERNELS),
        run=_integer_gemm,
    ),
    Difference(
        name="int_mm_shape_constraints",
        summary="torch._int_mm (int8 x int8 -> int32) needs M > 16 and K, N positive multiples of 8 "
                "(RuntimeError otherwise); the CPU takes any shape",
        documented="aten/src/ATen/native/cuda/Blas.cpp (_int_mm_out_cuda TORCH_CHECKs)",
        ops=frozenset({"_int_mm"}),
        run=_int_mm,
    ),
    Difference(
        name="half_gemm_fp32_output",
        summary="mm/addmm/bmm/baddbmm with out_dtype=float32 of bf16/fp16 operands (aten::mm.dtype ...) exist: "
                "the half-precision GEMM with fp32 accumulation and output; the CPU has no kernel for them",
        documented="aten/src/ATen/native/cuda/Blas.cpp (_mm_dtype_out_cuda, _addmm_dtype_out_cuda, "
                   "_bmm_dtype_cuda, _baddbmm_dtype_cuda; torch 2.13 CPU: 'Could not run aten::mm.dtype')",
        ops=frozenset({"mm", "addmm", "bmm", "baddbmm"}),
        run=_half_fp32_output,
    ),
]
