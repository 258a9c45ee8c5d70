"""The layout the fused compiled lookup reads a table in (float32 rows or 8-bit row-wise rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .bag_verdict import EmbeddingChecks


@dataclass(frozen=True)
class FusedTable:
    """What the fused compiled lookup needs of a table, checked once per table (see :func:`fused_table`)."""

    tensor: torch.Tensor
    view: np.ndarray
    rowsum: np.ndarray
    checks: EmbeddingChecks
    d: int
    quantized: bool


def fused_table(table: torch.Tensor, checks: EmbeddingChecks, d: int) -> FusedTable | None:
    """The :class:`FusedTable` of a float32 (R x D) or 8-bit row-wise uint8 (R x (D + 8)) CPU table, or
    None where the fused lookup cannot read it (another device or dtype, not contiguous)."""
    quantized = table.dtype == torch.uint8
    if table.device.type != "cpu" or table.dim() != 2 or not table.is_contiguous() or \
            table.shape[1] != d + (8 if quantized else 0) or table.dtype not in (torch.float32, torch.uint8) or \
            checks.rowsum.device.type != "cpu" or checks.rowsum.shape[0] != table.shape[0]:
        return None
    return FusedTable(table, table.detach().numpy(), checks.rowsum_view(), checks, d, quantized)


def cached_fused(owner: Any, table: torch.Tensor, checks: EmbeddingChecks, d: int) -> FusedTable | None:
    hit = owner.__dict__.get("_fused")
    if hit is None or hit[0] is not table or hit[1] is not checks:
        hit = owner.__dict__["_fused"] = (table, checks, fused_table(table, checks, d))
    return hit[2]
