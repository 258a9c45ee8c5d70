"""TF32 where CUDA's flags allow it: fp32 GEMMs and convolutions read 10 mantissa bits of each input.

On an Ampere-or-later GPU, cuBLAS computes fp32 matrix products on TF32 tensor cores when
``torch.backends.cuda.matmul.allow_tf32`` is set, i.e. when ``torch.get_float32_matmul_precision()``
is not ``"highest"`` (off by default), and cuDNN computes fp32 convolutions that way when
``torch.backends.cudnn.allow_tf32`` is set, which it is by default. PyTorch's numerical-accuracy
note: "When an operation is performed using TF32 tensor cores, only the first 10 bits of the input
mantissa are read." The products are accumulated in fp32 and the output stays fp32.

The emulation keeps the first 10 mantissa bits of the fp32 matrix operands (truncation, as the note
describes, and the worse of the two conversions a library may use: its error is below 2^-10
relative, twice that of rounding) and runs the host's fp32 kernel on them. The added term of
``addmm``/``baddbmm``/``addbmm`` and a convolution's bias are read in fp32 (they do not pass through
the tensor cores). The flag readers here are the ones validators use to decide whether a device of
type CUDA may use TF32, so an emulated and a real device are judged alike.
"""

from __future__ import annotations

from typing import Any

import torch

from ..faults.schema import bind, op_name, replace_args
from .difference import PASS, Difference

# aten base name -> the schema arguments that are matrix operands of the product
_GEMM_OPERANDS = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"), "addmm_": ("mat1", "mat2"),
    "baddbmm": ("batch1", "batch2"), "baddbmm_": ("batch1", "batch2"), "addbmm": ("batch1", "batch2"),
    "addbmm_": ("batch1", "batch2"), "_addmm_activation": ("mat1", "mat2"),
}
_CONV_OPERANDS = {"convolution": ("input", "weight"), "_convolution": ("input", "weight")}


def matmul_tf32_allowed() -> bool:
    """CUDA's rule for fp32 GEMMs: ``allow_tf32`` or a float32 matmul precision other than ``highest``."""
    return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"


def conv_tf32_allowed() -> bool:
    """CUDA's rule for fp32 convolutions: ``torch.backends.cudnn.allow_tf32`` (True by default)."""
    return bool(torch.backends.cudnn.allow_tf32)


def truncate_to_tf32(x: Any) -> Any:
    """fp32 ``x`` with only its first 10 explicit mantissa bits (the low 13 bits cleared); NaN/inf kept."""
    bits = x.contiguous().view(torch.int32)
    kept = (bits & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), kept, x).view(x.shape)


def _tf32_operands(func: Any, args: tuple, kwargs: dict, names: tuple[str, str]) -> Any:
    b = bind(func, args, kwargs)
    ops = [b.get(n) for n in names]
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.layout == torch.strided
               and t.numel() > 0 for t in ops):
        return PASS
    args, kwargs = replace_args(func, args, kwargs, **{n: truncate_to_tf32(t) for n, t in zip(names, ops)})
    return func(*args, **kwargs)


def _gemm(func: Any, args: tuple, kwargs: dict) -> Any:
    if not matmul_tf32_allowed():
        return PASS
    names = _GEMM_OPERANDS.get(op_name(func))
    return PASS if names is None else _tf32_operands(func, args, kwargs, names)


def _conv(func: Any, args: tuple, kwargs: dict) -> Any:
    if not conv_tf32_allowed():
        return PASS
    names = _CONV_OPERANDS.get(op_name(func))
    return PASS if names is None else _tf32_operands(func, args, kwargs, names)


DIFFERENCES = [
    Difference(
        name="tf32_matmul",
        summary="fp32 mm/bmm/addmm/baddbmm/addbmm (so linear/matmul) read 10 mantissa bits of their matrix operands "
                "when torch.backends.cuda.matmul.allow_tf32 is set (float32 matmul precision not 'highest')",
        documented="PyTorch docs, notes/cuda.rst 'TensorFloat-32 (TF32) on Ampere (and later) devices' and "
                   "notes/numerical_accuracy.rst ('only the first 10 bits of the input mantissa are read')",
        ops=frozenset(_GEMM_OPERANDS),
        run=_gemm,
    ),
    Difference(
        name="tf32_conv",
        summary="fp32 convolutions read 10 mantissa bits of input and weight when torch.backends.cudnn.allow_tf32 "
                "is set (the default)",
        documented="PyTorch docs, notes/cuda.rst: torch.backends.cudnn.allow_tf32 defaults to True; "
                   "notes/numerical_accuracy.rst",
        ops=frozenset(_CONV_OPERANDS),
        run=_conv,
    ),
]
