"""Checked lookups of FBGEMM's quantized row-wise tables: the inference table-batched embedding
(``IntNBitTableBatchedEmbeddingBagsCodegen``, the kernel production DLRM serves with) over one table
of 8-bit or 4-bit rows, sum or mean pooling, checked by the EmbeddingBag check of
:mod:`.bag_verdict`.

FBGEMM stores a row as its codes and an fp16 scale and bias (``value = code * scale + bias``; 4-bit
codes two to a byte, low nibble first). The per-row checksums ``sum_d (s q_d + b)`` and
``sum_d (|s q_d| + |b|)`` are computed in fp64 from the module's own bytes, once per table, and kept
outside the rows (:class:`.bag_verdict.EmbeddingChecks`). FBGEMM dequantizes each element with one
fused multiply-add in fp32 and pools in fp32: the check's bound counts ``extra`` = 6 roundings per
element, as for torch's 8-bit kernel (:mod:`.quantized`). Mean pooling is checked against the bag
pooled over the checksums and divided by its length, which is what FBGEMM's MEAN mode computes (torch
2.13's CPU ``quantized::embedding_bag_byte_rowwise_offsets`` returns sums when asked for means; the
check group ``abft_fbgemm`` measures that beside FBGEMM's).

Needs ``fbgemm_gpu`` (``pip install -e '.[fbgemm]'``): :func:`fbgemm_available` says whether it loads.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
from mystique.workloads.dlrm_fbgemm import quantize_rows

from mystique.errors import EnvironmentUnsupported, UsageError

from .bag_verdict import Bags, EmbeddingChecks, compiled_bag_check, verify_bag_output
from .report import CheckReport

BITS = (8, 4)  # the row-wise code widths checked (FBGEMM's INT8 and INT4 sparse types)
EXTRA_ROUNDINGS = 6.0


def fbgemm_available() -> bool:
    """Whether ``fbgemm_gpu`` imports (absent, or built for another torch: False)."""
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return False
    try:
        import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm
    except Exception:  # noqa: BLE001 - a release built for another torch fails in many ways
        return False
    return True


def _tbe(rows: int, dim: int, bits: int, mode: str, device: torch.device) -> Any:
    if not fbgemm_available():
        raise EnvironmentUnsupported("FBGEMM is not installed (pip install -e '.[fbgemm]')")
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    kind = {8: SparseType.INT8, 4: SparseType.INT4}[bits]
    loc = EmbeddingLocation.DEVICE if device.type == "cuda" else EmbeddingLocation.HOST
    pooling = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[mode]
    return IntNBitTableBatchedEmbeddingBagsCodegen([("t", rows, dim, kind, loc)], device=device,
                                                   output_dtype=SparseType.FP32, pooling_mode=pooling)


@dataclass
class FbgemmTable:
    """One table in FBGEMM's inference TBE (``bits``-bit rows, ``mode`` pooling) and its checksums."""

    tbe: Any
    checks: EmbeddingChecks
    bits: int
    dim: int
    mode: str

    @classmethod
    def from_float(cls, weight: torch.Tensor, bits: int = 8, mode: str = "sum") -> FbgemmTable:
        if bits not in BITS or mode not in ("sum", "mean"):
            raise UsageError(f"FBGEMM row-wise tables: bits in {BITS}, sum or mean pooling; got {bits}, {mode!r}")
        rows, dim = weight.shape
        tbe = _tbe(rows, dim, bits, mode, weight.device)
        tbe.fill_random_weights()  # allocates; every row is overwritten
        codes, sb = quantize_rows(weight.detach().cpu(), bits)
        (packed, scale_shift), = tbe.split_embedding_weights(split_scale_shifts=True)
        with torch.no_grad():
            if bits == 4:
                pairs = torch.nn.functional.pad(codes, (0, dim % 2)).view(rows, -1, 2)
                codes_bytes = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
            else:
                codes_bytes = codes
            packed[:, :codes_bytes.shape[1]].copy_(codes_bytes.to(torch.uint8))
            scale_shift.view(torch.float16).copy_(sb)
        return cls(tbe, cls.compute_checks(tbe, bits, dim), bits, dim, mode)

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes (R, D) int64, scale_bias (R, 2) fp16) as the module holds them."""
        (packed, scale_shift), = self.tbe.split_embedding_weights(split_scale_shifts=True)
        p = packed.to(torch.int64).cpu()
        if self.bits == 4:
            p = torch.stack([p & 15, p >> 4], 2).reshape(p.shape[0], -1)
        return p[:, :self.dim], scale_shift.cpu().contiguous().view(torch.float16)

    @staticmethod
    def compute_checks(tbe: Any, bits: int, dim: int) -> EmbeddingChecks:
        codes, sb = FbgemmTable(tbe, None, bits, dim, "sum").stored()  # type: ignore[arg-type]
        q, scale, bias = codes.double(), sb[:, 0:1].double(), sb[:, 1:2].double()
        return EmbeddingChecks.from_rows((q * scale + bias).sum(1), (q * scale.abs() + bias.abs()).sum(1))

    def dequantize(self) -> torch.Tensor:
        codes, sb = self.stored()
        return codes.float() * sb[:, 0:1].float() + sb[:, 1:2].float()

    def tbe_args(self, indices: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The int32 indices and offsets (bag starts, then the end) that FBGEMM's TBE takes."""
        end = torch.full((1,), indices.numel(), dtype=torch.int32, device=offsets.device)
        return indices.int(), torch.cat([offsets.int(), end])

    def lookup(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """FBGEMM's own (unchecked) lookup: (bags, D) fp32; ``offsets`` the bag starts (no end)."""
        return self.tbe(*self.tbe_args(indices, offsets))


def checked_fbgemm_embedding_bag(table: FbgemmTable, indices: torch.Tensor, offsets: torch.Tensor, *,
                                 lam: float | None = None) -> tuple[torch.Tensor, CheckReport]:
    """FBGEMM's lookup of ``table`` checked against its row checksums: ``(output, CheckReport)``.

    On the CPU, with the compiled kernels, the check is one compiled call after FBGEMM's lookup
    (:func:`.bag_verdict.compiled_bag_check`), reading the int32 indices and offsets FBGEMM was given
    (no conversion or copy of its own); elsewhere :func:`verify_bag_output`.
    """
    idx, off = table.tbe_args(indices, offsets)
    out = table.tbe(idx, off)
    nb, op = offsets.shape[0], f"fbgemm_{table.bits}bit_{table.mode}"
    shape = (table.checks.rowsum.shape[0], table.dim, nb)
    rep = compiled_bag_check(out, table.checks, idx, off, table.mode, EXTRA_ROUNDINGS, lam, (op, "uint8", shape),
                             lambda: Bags(table.checks, idx, off, table.mode, None, nb, table.dim, EXTRA_ROUNDINGS,
                                          0.0, lam, op, "uint8", shape))  # (the offsets with the end: the same bags)
    if rep is None:
        rep = verify_bag_output(out, table.checks, indices.long(), offsets.long(), table.mode, extra=EXTRA_ROUNDINGS,
                                lam=lam, op=op, dtype="uint8", shape=shape)
    return out, rep
