"""The device's own half-precision (bf16/fp16) GEMM, as the checks of :mod:`.abft` run it.

A bf16/fp16 GEMM is checked on its fp32 accumulator (see :mod:`.abft`). Which kernel produces
that accumulator matters to a qualification: an fp32 GEMM of the upcast operands computes the
same sums but never runs the device's half-precision units, so a fault there would go unseen.

* :func:`device_half_mm` -- ``torch.mm(a, b, out_dtype=torch.float32)`` (``aten::mm.dtype``): the
  device's bf16/fp16 GEMM writing its fp32 accumulator. torch 2.13 implements it for CUDA
  (``_mm_dtype_cuda`` in aten/src/ATen/native/cuda/Blas.cpp: cuBLAS with compute type 32F and an
  fp32 output, so its split-K reductions are fp32 too: cuBLAS reduces in the output type only
  where that is narrower than the compute type) and not for the CPU, which has no kernel of bf16
  inputs with an fp32 output at all (``mm.dtype``, ``addmm.dtype``, ``bmm.dtype`` are refused,
  ``mm(out=fp32)`` and mixed-dtype ``addmm`` too).
* :func:`rounded_half_mm` -- the device's bf16/fp16 GEMM with its rounded half-precision output,
  what every backend has. Checked with the rounding in the threshold (``u_out``, see
  :func:`half_bounds`), which lets small flips through; used where ``device_half_mm`` is missing.
* :func:`accumulation_u` -- the unit roundoff of that GEMM's accumulation: fp32, except fp16 on
  CUDA with ``torch.backends.cuda.matmul.allow_fp16_accumulation`` (compute type 16F, also with
  an fp32 output).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

HALF = (torch.bfloat16, torch.float16)
U32 = 2.0**-24
#: unit roundoff of the half dtypes (round to nearest: |fl(x) - x| <= u |x| for normal results)
U_HALF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
#: half the spacing of the subnormals: the absolute rounding error bound below the normal range
SUBNORMAL_HALF_SPACING = {torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}

_MISSING: dict[str, bool] = {}


def missing(device: torch.device) -> bool:
    """Whether ``device`` is known to lack :func:`device_half_mm` (learnt on a call with no dispatch mode
    active: an emulated device or a fault simulation may add or change the kernel)."""
    return torch._C._len_torch_dispatch_stack() == 0 and _MISSING.get(device.type, False)


def device_half_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """The fp32 output of the device's own bf16/fp16 GEMM ``a @ b`` (``aten::mm.dtype``), or None where the
    backend has no such kernel."""
    quiet = torch._C._len_torch_dispatch_stack() == 0
    if quiet and _MISSING.get(a.device.type, False):
        return None
    try:
        out = torch.mm(a, b, out_dtype=torch.float32)
    except NotImplementedError:  # "Could not run 'aten::mm.dtype' with arguments from the 'CPU' backend"
        if quiet:
            _MISSING[a.device.type] = True
        return None
    if quiet:
        _MISSING[a.device.type] = False
    return out


@contextlib.contextmanager
def fp32_reductions(device: torch.device) -> Iterator[None]:
    """On CUDA, cuBLAS's reductions in the compute type (fp32) for the enclosed half-precision GEMMs with
    a half-precision output: by default torch lets cuBLAS reduce split-K partial sums in the output type
    (``allow_bf16/fp16_reduced_precision_reduction``), which the one-rounding bound of a rounded check
    does not cover. Elsewhere nothing changes (the CPU's kernels accumulate in fp32 and round once)."""
    if device.type != "cuda":
        yield
        return
    m = torch.backends.cuda.matmul
    old = {name: (getattr(m, name), getattr(m, f"{name}_split_k"))
           for name in ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction")}
    try:
        for name in old:
            setattr(m, name, False)
        yield
    finally:
        for name, value in old.items():
            setattr(m, name, value)


def rounded_half_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The device's own bf16/fp16 GEMM with its rounded output (reductions in fp32, see :func:`fp32_reductions`)."""
    with fp32_reductions(a.device):
        return torch.mm(a, b)


def accumulation_u(a: torch.Tensor) -> float:
    """Unit roundoff of the accumulation of the device's half-precision GEMM of ``a`` (see module docstring)."""
    if a.dtype == torch.float16 and a.device.type == "cuda" and \
            bool(getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", False)):
        return U_HALF[torch.float16]
    return U32


def describe(kind: str, dtype: torch.dtype) -> str:
    """One phrase naming the GEMM and the bound a half-precision check used (for results details)."""
    name = str(dtype).replace("torch.", "")
    if kind == "fp32_out":
        return (f"the device's {name} GEMM with fp32 output (torch.mm(out_dtype=float32), aten::mm.dtype), checked "
                "on that fp32 accumulator: threshold with u = 2^-24")
    if kind == "rounded":
        u = U_HALF[dtype]
        return (f"the device's {name} GEMM with its rounded {name} output (this backend has no half-precision GEMM "
                f"with fp32 output, aten::mm.dtype), checked on that output: threshold = the fp32 accumulation bound "
                f"(u = 2^-24) + u_out ||a_i|| ||r|| with u_out = 2^{int(math.log2(u))} "
                f"(each output rounded once to nearest: |fl(c) - c| <= u_out |c|, and sum_j |c_ij| <= ||a_i|| ||r||) "
                f"+ N x {SUBNORMAL_HALF_SPACING[dtype]:.3g} (the subnormal range)")
    return (f"fp32 GEMM of the upcast {name} operands (this backend has no half-precision GEMM with fp32 output, "
            "aten::mm.dtype)")
