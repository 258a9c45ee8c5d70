"""The layout the fused compiled lookup reads a table in (float32 rows or 8-bit row-wise rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .bag_verdict import EmbeddingChecks

#: Bytes an 8-bit row of the fused layout carries after its D codes: the fp32 scale and bias (fbgemm's), then the
#: row's fp32 checksum (:func:`row_layout`)
TAIL_8BIT = 12
#: The fused layout's 8-bit row stride is a multiple of this many bytes, and the layout starts on a cache line
ROW_ALIGN, LINE = 16, 64


@dataclass(frozen=True)
class FusedTable:
    """What the fused compiled lookup needs of a table, checked once per table (see :func:`fused_table`).

    ``view``: the rows the kernel reads; float32 rows: the table's own memory; 8-bit rows: the layout of
    :func:`row_layout` (a copy, with each row's checksum beside it). ``version``: the table's version counter
    when ``view`` was made (:func:`cached_fused` makes the copy again after an in-place write).
    """

    tensor: torch.Tensor
    view: np.ndarray
    rowsum: np.ndarray
    checks: EmbeddingChecks
    d: int
    quantized: bool
    version: int = 0


def fused_table(table: torch.Tensor, checks: EmbeddingChecks, d: int) -> FusedTable | None:
    """The :class:`FusedTable` of a float32 (R x D) or 8-bit row-wise uint8 (R x (D + 8)) CPU table, or
    None where the fused lookup cannot read it (another device or dtype, not contiguous; an 8-bit inference
    tensor, whose in-place writes no version counter records: see :func:`cached_fused`)."""
    quantized = table.dtype == torch.uint8
    if table.device.type != "cpu" or table.dim() != 2 or not table.is_contiguous() or \
            table.shape[1] != d + (8 if quantized else 0) or table.dtype not in (torch.float32, torch.uint8) or \
            checks.rowsum.device.type != "cpu" or checks.rowsum.shape[0] != table.shape[0]:
        return None
    rowsum = checks.rowsum_view()
    if not quantized:
        return FusedTable(table, table.detach().numpy(), rowsum, checks, d, False)
    version = _version(table)
    if version is None:
        return None
    return FusedTable(table, row_layout(table.detach().numpy(), rowsum, d), rowsum, checks, d, True, version)


def row_layout(packed: np.ndarray, rowsum: np.ndarray, d: int) -> np.ndarray:
    """8-bit rows (fbgemm's: D codes, fp32 scale, fp32 bias) with each row's fp32 checksum beside them: an
    (R x S) uint8 array, row r = ``packed[r]`` (D + 8 bytes), ``rowsum[r]`` (4 bytes), zeros to S.

    The fused lookup reads a row and its checksum with one index. With the checksums in an array of their
    own, each index costs one more cache line, fetched from beyond the caches when the rows are not in them
    (in production, where other work runs between lookups, and in the overhead group's rounds): 100000 x 64
    rows, 2048 bags of 40, the bare kernel against itself on this layout with the caches evicted before each
    call (600 paired rounds, this 2-core host): -10.1% [-11.5, -9.2] and -10.4% [-12.4, -8.6]. The stride S
    = D + 12 rounded up to a multiple of 16 bytes from a cache-line aligned start keeps a row of D = 64 (80
    bytes) in two cache lines, as fbgemm's 72-byte rows are. The checksum is stored in fp32 (not a code
    dequantized with the row's scale and bias, which a flip of those would move with the output), as
    ``rowsum``; the layout costs S / (D + 8) of the packed table (D = 64: 1.11x) besides it.
    """
    rows = packed.shape[0]
    stride = -(-(d + TAIL_8BIT) // ROW_ALIGN) * ROW_ALIGN
    raw = np.zeros(rows * stride + LINE, np.uint8)
    start = -raw.ctypes.data % LINE
    out = raw[start:start + rows * stride].reshape(rows, stride)
    out[:, :d + 8] = packed
    out[:, d + 8:d + TAIL_8BIT] = np.ascontiguousarray(rowsum, dtype=np.float32).view(np.uint8).reshape(rows, 4)
    return out


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place write through torch), or None for an inference
    tensor, which has none."""
    try:
        return t._version
    except RuntimeError:
        return None


def cached_fused(owner: Any, table: torch.Tensor, checks: EmbeddingChecks, d: int) -> FusedTable | None:
    """``fused_table(table, checks, d)``, cached on ``owner`` while ``table`` and ``checks`` are these
    objects and, for an 8-bit table (whose layout is a copy), while the table's version counter is unchanged:
    an in-place write through torch (an update, a simulated fault) makes the copy again, so the checked
    lookup reads what torch's would. A write that no version counter records (``.data``, a NumPy view) is
    not seen by the 8-bit copy: rebuild the :class:`.QuantizedTable` after one."""
    hit = owner.__dict__.get("_fused")
    if hit is None or hit[0] is not table or hit[1] is not checks or \
            (hit[2] is not None and hit[2].quantized and hit[2].version != table._version):
        hit = owner.__dict__["_fused"] = (table, checks, fused_table(table, checks, d))
    return hit[2]
