"""The dtype vocabulary, written once: names, bit layout, unit roundoff and integer views.

Used by fault injection (bit flips), the numerics and correctness bounds, and the soft-error checks.
Floating layouts are IEEE-754 style: ``(total bits, exponent bits, mantissa bits)``; bit 0 is the
least significant bit of the element's storage.
"""

from __future__ import annotations

import torch

# dtype -> (total bits, exponent bits, explicit mantissa bits)
FLOAT_LAYOUT: dict[torch.dtype, tuple[int, int, int]] = {
    torch.float64: (64, 11, 52),
    torch.float32: (32, 8, 23),
    torch.bfloat16: (16, 8, 7),
    torch.float16: (16, 5, 10),
}
HALF_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_BITS: dict[torch.dtype, int] = {
    torch.int8: 8, torch.uint8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64,
}
# width in bits -> the signed integer dtype of that width (the storage view used for bit flips)
INT_OF_WIDTH: dict[int, torch.dtype] = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
# names a user may type -> dtype (short aliases included)
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float64": torch.float64, "double": torch.float64, "fp64": torch.float64,
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
}


def name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def from_name(text: str) -> torch.dtype | None:
    """The dtype a user's name means (``bf16``, ``torch.float16``, ``float32``...), or None."""
    return DTYPE_NAMES.get(str(text).strip().replace("torch.", ""))


def bits(dtype: torch.dtype) -> int:
    """Width in bits of one element of ``dtype`` (floats of :data:`FLOAT_LAYOUT` and integers);
    ValueError for other dtypes."""
    if dtype in FLOAT_LAYOUT:
        return FLOAT_LAYOUT[dtype][0]
    if dtype in INT_BITS:
        return INT_BITS[dtype]
    raise ValueError(f"no bit layout is defined for dtype {dtype}")


def fields(dtype: torch.dtype) -> dict[str, tuple[int, int]]:
    """Bit-index ranges (first, last; inclusive) of ``sign``, ``exponent`` and ``mantissa``."""
    width, e, m = FLOAT_LAYOUT[dtype]
    return {"sign": (width - 1, width - 1), "exponent": (m, m + e - 1), "mantissa": (0, m - 1)}


def int_dtype(dtype: torch.dtype) -> torch.dtype:
    """The signed integer dtype of the width of ``dtype`` (for bit views)."""
    return INT_OF_WIDTH[bits(dtype)]


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The same storage viewed as a signed integer tensor of the element width."""
    return t.view(int_dtype(t.dtype))


def unit_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff (half an ulp at 1) of a floating dtype; ValueError for non-floating dtypes."""
    if dtype in FLOAT_LAYOUT:
        return 2.0 ** -(FLOAT_LAYOUT[dtype][2] + 1)
    if dtype.is_floating_point:  # float8 and friends
        return float(torch.finfo(dtype).eps) / 2
    raise ValueError(f"{dtype} is not a floating dtype")
