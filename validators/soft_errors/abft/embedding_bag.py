"""Checked EmbeddingBag over fp32 tables (:func:`checked_table`) and 8-bit row-wise tables.

On the CPU, without autograd, the lookup is the fused compiled kernel (:mod:`.fused_lookup`); on CUDA with
Triton the fused Triton kernel (:mod:`..triton_abft.bag`, issue 32); elsewhere torch's lookup runs and
:mod:`.bag_verdict` checks its output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mystique.errors import UsageError

from ..triton_abft import cuda_wanted
from .bag_verdict import (
    Bags,
    CompiledBags,
    EmbeddingChecks,
    bags_args,
    compiled_bags_ok,
    verify_bag_output,
)
from .fused_layout import FusedTable, cached_fused
from .fused_lookup import FusedCall, fused_checked
from .quantized import QuantizedTable, quantized_embedding_bag
from .report import CheckReport


@dataclass
class CheckedTable:
    """An fp32 embedding table with its :class:`EmbeddingChecks` (built once by :func:`checked_table`)."""

    weight: torch.Tensor
    checks: EmbeddingChecks

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    def fused(self) -> FusedTable | None:
        """The table as the fused compiled lookup reads it (cached while ``weight`` is this tensor)."""
        return cached_fused(self, self.weight, self.checks, self.dim)


def checked_table(weight: torch.Tensor) -> CheckedTable:
    """Wrap an fp32 (R x D) table for :func:`checked_embedding_bag` (checksums computed in fp64)."""
    if weight.dim() != 2 or weight.dtype != torch.float32:
        raise UsageError(f"checked_table needs a 2-D float32 table, got {tuple(weight.shape)} {weight.dtype}")
    return CheckedTable(weight.detach(), EmbeddingChecks.of(weight))


def checked_embedding_bag(table: CheckedTable, indices: torch.Tensor, offsets: torch.Tensor | None = None,
                          mode: str = "sum", *, per_sample_weights: torch.Tensor | None = None,
                          lam: float | None = None, exact_ratio: bool = False) -> tuple[torch.Tensor, CheckReport]:
    """EmbeddingBag (sum or mean) over a :func:`checked_table`; returns ``(out, report)``.

    Costs, beside the lookup, a gather of the R x 1 row sums with the same indices and one pass over
    the (bags x D) output (see :func:`verify_bag_output`). On the CPU, without autograd, the lookup
    itself is a compiled kernel that returns torch's output bitwise and gathers the row sums and checks
    the bags in the same pass (:class:`FusedCall`); otherwise torch's lookup runs, followed on the CPU
    by one compiled call prepared before it.
    """
    if mode not in ("sum", "mean"):
        raise UsageError(f"checked_embedding_bag supports sum and mean pooling, got {mode!r}")
    idx, off = bags_args(indices, offsets)
    if per_sample_weights is not None and per_sample_weights.dim() == 2:  # (weights of 2-D indices, as torch)
        per_sample_weights = per_sample_weights.reshape(-1)
    op, shape = f"embedding_bag_{mode}", (table.weight.shape[0], table.dim, off.shape[0])

    if table.weight.is_cuda and not exact_ratio and per_sample_weights is None and cuda_wanted(table.weight, idx, off):
        from ..triton_abft.bag import fused_embedding_bag  # (the fused Triton kernel, issue 32)

        out, chk = fused_embedding_bag(table.weight, table.checks, idx, off, mode, lam=lam, op=op)
        return out, chk.report()

    def bags() -> Bags:
        return Bags(table.checks, idx, off, mode, per_sample_weights, off.shape[0], table.dim, 4.0, 0.0, lam, op,
                    "float32", shape)

    def lookup() -> torch.Tensor:
        return F.embedding_bag(idx, table.weight, off, mode=mode, per_sample_weights=per_sample_weights)

    done = None if exact_ratio or per_sample_weights is not None else \
        fused_checked(table.fused(), idx, off, mode, 4.0, lam, (op, "float32", shape), bags, lookup)
    return done[:2] if done is not None else _checked_lookup(table.fused(), bags(), exact_ratio, lookup)


def _checked_lookup(ft: FusedTable | None, bag: Bags, exact_ratio: bool, lookup: Callable[[], torch.Tensor]
                    ) -> tuple[torch.Tensor, CheckReport]:
    """The bags of ``bag`` pooled and checked: by the fused lookup over ``ft`` where it applies, else
    ``lookup()`` (torch's) and its report: on the CPU the compiled verdict, prepared before the lookup;
    elsewhere, or for an exact ratio, :func:`verify_bag_output`."""
    call = None if exact_ratio else FusedCall.of(ft, bag)
    if call is not None:
        return call.run(lookup)
    run = CompiledBags(bag) if not exact_ratio and bag.nb and compiled_bags_ok(bag.checks.rowsum, bag.checks) \
        else None
    out = lookup()
    if run is not None:
        return out, run.verdict(out)
    return out, verify_bag_output(out, bag.checks, bag.idx, bag.off, bag.mode, bag.psw, extra=bag.extra, lam=bag.lam,
                                  op=bag.op, dtype=bag.dtype, shape=bag.shape, exact_ratio=exact_ratio)


def checked_quantized_embedding_bag(table: QuantizedTable, indices: torch.Tensor,
                                    offsets: torch.Tensor | None = None, mode: str = "sum", *,
                                    lam: float | None = None, exact_ratio: bool = False
                                    ) -> tuple[torch.Tensor, CheckReport]:
    """8-bit row-wise EmbeddingBag (sum or mean) checked against the precomputed row checksums.

    The checksums sit in separate fp32 tables (not in the packed row): a checksum carried in the row
    would be dequantized with the row's own scale and bias, so a flip of those would move the
    reference with the result and go unseen.
    """
    if mode not in ("sum", "mean"):
        raise UsageError(f"checked_quantized_embedding_bag supports sum and mean pooling, got {mode!r}")
    idx, off = bags_args(indices, offsets)
    op, shape = f"embedding_bag_8bit_{mode}", (table.packed.shape[0], table.dim, off.shape[0])

    if table.packed.is_cuda and not exact_ratio and cuda_wanted(table.packed, idx, off):
        from ..triton_abft.bag import fused_quantized_bag  # (the fused Triton kernel, issue 32)

        out, chk = fused_quantized_bag(table, idx, off, mode, lam=lam)
        return out, chk.report()

    def bags() -> Bags:
        return Bags(table.checks, idx, off, mode, None, off.shape[0], table.dim, 6.0, 0.0, lam, op, "uint8", shape)

    def lookup() -> torch.Tensor:
        return quantized_embedding_bag(table, idx, off, mode)

    done = None if exact_ratio else fused_checked(table.fused(), idx, off, mode, 6.0, lam, (op, "uint8", shape), bags,
                                                   lookup)
    return done[:2] if done is not None else _checked_lookup(table.fused(), bags(), exact_ratio, lookup)
