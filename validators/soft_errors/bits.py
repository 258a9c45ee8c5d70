"""Storage bits in soft-error reports: the hex of an element's bits and of two elements' XOR.

The bit-level fault model itself (bit classes, patterns, flips, :class:`FlipRecord`) is
:mod:`mystique.faults.bits`.
"""

from __future__ import annotations

import torch

from mystique.dtypes import int_view
from mystique.faults.bits import dtype_bits


def bits_hex(t: torch.Tensor) -> str:
    """Hex of the storage bits of a one-element tensor (for mismatch reports)."""
    width = dtype_bits(t.dtype)
    raw = int(int_view(t.reshape(1).clone()).item()) & ((1 << width) - 1)
    return f"0x{raw:0{width // 4}x}"


def xor_hex(a: torch.Tensor, b: torch.Tensor) -> str:
    """Hex XOR of the storage bits of two one-element tensors of one dtype."""
    width = dtype_bits(a.dtype)
    x = int(int_view(a.reshape(1).clone()).item()) ^ int(int_view(b.reshape(1).clone()).item())
    return f"0x{x & ((1 << width) - 1):0{width // 4}x}"
