"""8-bit row-wise quantized embedding tables (fbgemm layout) and their unchecked lookup."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mystique.errors import EnvironmentUnsupported, UsageError

from .bag_verdict import EmbeddingChecks, bag_lengths
from .device_check import cuda_like
from .fused_layout import FusedTable, cached_fused


@dataclass
class QuantizedTable:
    """An 8-bit row-wise quantized table (fbgemm layout: D uint8 codes, fp32 scale, fp32 bias per row).

    ``checks`` holds, per row, the checksum ``sum_d (s q_d + b)`` and the magnitude
    ``sum_d (|s q_d| + |b|)``, computed in fp64 from the packed bytes.
    """

    packed: torch.Tensor
    checks: EmbeddingChecks
    dim: int

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> QuantizedTable:
        try:
            packed = torch.ops.quantized.embedding_bag_byte_prepack(weight.detach().float().cpu().contiguous())
        except (RuntimeError, AttributeError) as exc:
            raise EnvironmentUnsupported(f"this torch build lacks 8-bit embedding ops: {exc}") from exc
        packed = packed.to(weight.device)
        return cls(packed, cls.compute_checks(packed), weight.shape[1])

    @staticmethod
    def compute_checks(packed: torch.Tensor) -> EmbeddingChecks:
        return EmbeddingChecks.from_rows(*QuantizedTable.row_sums64(packed))

    @staticmethod
    def row_sums64(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of packed 8-bit rows, ``(sum_d (s q_d + b), sum_d (|s q_d| + |b|))`` in fp64 (the
        checksums, before their rounding to fp32)."""
        d = packed.shape[1] - 8
        q = packed[:, :d].to(torch.float64)
        sb = packed[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32).to(torch.float64)
        scale, bias = sb[:, 0:1], sb[:, 1:2]
        return (q * scale + bias).sum(1), (q * scale.abs() + bias.abs()).sum(1)

    def fused(self) -> FusedTable | None:
        """The packed table as the fused compiled lookup reads it (cached while ``packed`` is this tensor)."""
        return cached_fused(self, self.packed, self.checks, self.dim)

    def dequantize(self) -> torch.Tensor:
        d = self.dim
        q = self.packed[:, :d].to(torch.float32)
        sb = self.packed[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32)
        return q * sb[:, 0:1] + sb[:, 1:2]


def quantized_embedding_bag(table: QuantizedTable, indices: torch.Tensor, offsets: torch.Tensor,
                            mode: str = "sum") -> torch.Tensor:
    """The fused 8-bit row-wise EmbeddingBag (unchecked), on the device of the table.

    The fused kernel is called in sum mode and mean pooling divides by the bag length afterwards:
    on torch 2.13 CPU ``embedding_bag_byte_rowwise_offsets`` silently returns sums when asked for
    mode=1 (mean), which the clean campaign of this checker flagged.
    """
    if table.packed.is_cpu and not cuda_like(table.packed):
        out = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            table.packed, indices, offsets, False, 0, False, None, None, False)
    else:
        out = torch_ops_8bit_bag(table, indices, offsets)
    if mode == "mean":
        lengths = bag_lengths(indices, offsets, out.shape[0]).clamp(min=1).to(out.dtype)
        out = out / lengths[:, None]
    elif mode != "sum":
        raise UsageError(f"8-bit EmbeddingBag supports sum and mean pooling, got {mode!r}")
    return out


def torch_ops_8bit_bag(table: QuantizedTable, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The 8-bit row-wise EmbeddingBag (sum) with torch operations every device has (``quantized::
    embedding_bag_byte_rowwise_offsets`` is a CPU kernel, fbgemm's): the looked-up packed rows are
    gathered (D + 8 bytes per index), dequantized in fp32 as the CPU kernel does (``q * scale + bias``,
    one fused multiply-add per element there, two roundings here: inside the check's bound, which
    counts ``extra`` = 6 roundings per element) and pooled by an EmbeddingBag over the gathered rows
    in order."""
    d = table.dim
    rows = table.packed.index_select(0, indices.reshape(-1))
    sb = rows[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32)  # (a copy: offset 0)
    vals = rows[:, :d].to(torch.float32).mul_(sb[:, 0:1]).add_(sb[:, 1:2])
    pos = torch.arange(vals.shape[0], device=vals.device)
    return F.embedding_bag(pos, vals, offsets, mode="sum")
