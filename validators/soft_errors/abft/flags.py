"""The flags of PyTorch's CUDA backend that change what a device GEMM computes, as the checks read them.

* TF32: with ``torch.backends.cuda.matmul.allow_tf32`` set (``torch.get_float32_matmul_precision()``
  not ``"highest"``), cuBLAS computes fp32 products on TF32 tensor cores, reading the first 10
  mantissa bits of each operand (PyTorch's numerical-accuracy note). The checks compute their own
  checksum GEMMs in full fp32 (:func:`precise_fp32`) and put the operands' reading in the bound of
  the checked product (:data:`U_TF32_PRODUCT`).
* Reduced-precision reductions: ``allow_bf16_reduced_precision_reduction`` /
  ``allow_fp16_reduced_precision_reduction`` (on by default) let cuBLAS reduce split-K partial sums
  of a half GEMM with a half output in the half dtype (:func:`reduced_reduction_allowed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: relative error of one product of two TF32-read fp32 operands (each truncated: below 2^-10)
U_TF32_PRODUCT = 2 * 2.0**-10 + 2.0**-20
REDUCED_FLAG = {torch.bfloat16: "allow_bf16_reduced_precision_reduction",
                 torch.float16: "allow_fp16_reduced_precision_reduction"}


@contextlib.contextmanager
def precise_fp32() -> Iterator[None]:
    """Full fp32 GEMMs (TF32 off) for the checksum products, the user's setting restored after."""
    old = torch.get_float32_matmul_precision()
    if old == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def reduced_reduction_allowed(dtype: torch.dtype) -> bool:
    """Whether cuBLAS may reduce split-K partial sums of a ``dtype`` GEMM in that dtype (torch's flag)."""
    flag = REDUCED_FLAG.get(dtype)
    return flag is not None and bool(getattr(torch.backends.cuda.matmul, flag, False))
