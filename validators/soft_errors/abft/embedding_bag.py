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


#: why max pooling is refused (one line, the message of a :class:`UsageError`)
MAX_REFUSED = ("max pooling is not linear: no row checksum can verify a bag's maximum (checked EmbeddingBags "
               "take sum or mean pooling)")


def pooling_mode(fn: str, mode: str) -> None:
    """Refuse a pooling mode other than sum and mean with one clear line."""
    if mode == "max":
        raise UsageError(f"{fn}: {MAX_REFUSED}")
    if mode not in ("sum", "mean"):
        raise UsageError(f"{fn} supports sum and mean pooling, got {mode!r}")


def lookup_args(indices: torch.Tensor, offsets: torch.Tensor | None, psw: torch.Tensor | None, mode: str,
                rows: int, padding_idx: int | None, include_last_offset: bool, cut: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int | None]:
    """``(indices, offsets, per_sample_weights, padding_idx)`` of a lookup as torch reads them: 1-D indices and
    the offsets of their bags' starts (2-D indices: bags of equal length), the weights 1-D, the padding index
    in ``[0, rows)`` (a negative one counts from the end, as torch's). With ``include_last_offset`` the last
    offset is the end of the last bag (the indices past it are read by no bag, as torch's): with ``cut`` the
    indices are cut there and the offsets lose it (a host read of that offset); without, the offsets keep it
    (a kernel that reads it: the Triton one). Bad arguments raise :class:`UsageError`."""
    if include_last_offset:
        if offsets is None or indices.dim() != 1 or offsets.dim() != 1 or not offsets.numel():
            raise UsageError("include_last_offset needs 1-D indices and at least one offset (the end)")
        if not cut:
            if psw is not None and mode != "sum":
                raise UsageError(f"per-sample weights need sum pooling (as torch's EmbeddingBag), got {mode!r}")
            return indices, offsets, psw, None if padding_idx is None else _padding(padding_idx, rows)
        end = int(offsets[-1])
        if not 0 <= end <= indices.numel():
            raise UsageError(f"include_last_offset: the last offset {end} is outside the {indices.numel()} indices")
        indices, offsets = indices[:end], offsets[:-1]
        psw = psw if psw is None else psw[:end]
    idx, off = bags_args(indices, offsets)
    if psw is not None:
        if psw.dim() == 2:  # (weights of 2-D indices, as torch)
            psw = psw.reshape(-1)
        if mode != "sum":
            raise UsageError(f"per-sample weights need sum pooling (as torch's EmbeddingBag), got {mode!r}")
        if psw.shape != idx.shape:
            raise UsageError(f"per-sample weights of shape {tuple(psw.shape)} for {idx.numel()} indices")
    return idx, off, psw, None if padding_idx is None else _padding(padding_idx, rows)


def _padding(padding_idx: int, rows: int) -> int:
    if not -rows <= padding_idx < rows:
        raise UsageError(f"padding_idx {padding_idx} is outside the table's {rows} rows")
    return padding_idx % rows


def without_padding(idx: torch.Tensor, off: torch.Tensor, psw: torch.Tensor | None, padding_idx: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The bags with every index equal to ``padding_idx`` left out, as torch's lookup leaves them out (the
    others pooled in the same order, a mean divided by the indices left): ``(indices, offsets, weights)``.
    Each bag's checksum law is then the plain one, ``sum_d out_bd = sum_{i in b, idx_i != p} w_i c[idx_i]``."""
    keep = idx != padding_idx
    if bool(keep.all()):
        return idx, off, psw
    kept_before = torch.cat([keep.new_zeros(1, dtype=off.dtype), keep.to(off.dtype).cumsum(0)])
    return idx[keep], kept_before[off.clamp(0, idx.numel())], None if psw is None else psw[keep]


def checked_embedding_bag(table: CheckedTable, indices: torch.Tensor, offsets: torch.Tensor | None = None,
                          mode: str = "sum", *, per_sample_weights: torch.Tensor | None = None,
                          padding_idx: int | None = None, include_last_offset: bool = False,
                          lam: float | None = None, exact_ratio: bool = False) -> tuple[torch.Tensor, CheckReport]:
    """EmbeddingBag (sum or mean; per-sample weights with sum, a padding index, offsets that include the
    last bag's end, as torch's) over a :func:`checked_table`; returns ``(out, report)``. Max pooling is
    refused (:data:`MAX_REFUSED`).

    Costs, beside the lookup, a gather of the R x 1 row sums with the same indices and one pass over
    the (bags x D) output (see :func:`verify_bag_output`). On the CPU, without autograd, the lookup
    itself is a compiled kernel that returns torch's output bitwise and checks each bag as it pools it,
    the row sums gathered into the bags' references just before (:class:`FusedCall`); otherwise torch's
    lookup runs, followed on the CPU by one compiled call prepared before it. With a padding index torch's lookup runs and the bags are checked
    with it left out (:func:`without_padding`; the Triton kernel skips it in its pass).
    """
    pooling_mode("checked_embedding_bag", mode)
    rows = table.weight.shape[0]
    if table.weight.is_cuda and not exact_ratio and \
            cuda_wanted(table.weight, indices, *(() if offsets is None else (offsets,))):
        from ..triton_abft.bag import fused_embedding_bag  # (the fused Triton kernel, issue 32)

        idx, off, psw, pad = lookup_args(indices, offsets, per_sample_weights, mode, rows, padding_idx,
                                         include_last_offset, cut=False)
        out, chk = fused_embedding_bag(table.weight, table.checks, idx, off, mode, lam=lam, per_sample_weights=psw,
                                       padding_idx=pad, include_last_offset=include_last_offset)
        return out, chk.report()
    idx, off, psw, pad = lookup_args(indices, offsets, per_sample_weights, mode, rows, padding_idx,
                                     include_last_offset)
    op, shape = f"embedding_bag_{mode}", (rows, table.dim, off.shape[0])
    if pad is not None:  # torch's own lookup (with weights it rounds otherwise than without a padding index)
        def padded() -> torch.Tensor:
            return F.embedding_bag(idx, table.weight, off, mode=mode, per_sample_weights=psw, padding_idx=pad)

        fidx, foff, fpsw = without_padding(idx, off, psw, pad)
        return _checked_lookup(None, Bags(table.checks, fidx, foff, mode, fpsw, off.shape[0], table.dim, 4.0, 0.0, lam,
                                          op, "float32", shape), exact_ratio, padded)
    per_sample_weights = psw

    def bags() -> Bags:
        return Bags(table.checks, idx, off, mode, per_sample_weights, off.shape[0], table.dim, 4.0, 0.0, lam, op,
                    "float32", shape)

    def lookup() -> torch.Tensor:
        return F.embedding_bag(idx, table.weight, off, mode=mode, per_sample_weights=per_sample_weights)

    done = None if exact_ratio or per_sample_weights is not None else \
        fused_checked(table.fused(), idx, off, mode, 4.0, lam, (op, "float32", shape), bags, lookup, keep=False)
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


#: the report's op of a checked 8-bit lookup by pooling mode
_OPS_8BIT = {"sum": "embedding_bag_8bit_sum", "mean": "embedding_bag_8bit_mean"}


def checked_quantized_embedding_bag(table: QuantizedTable, indices: torch.Tensor,
                                    offsets: torch.Tensor | None = None, mode: str = "sum", *,
                                    lam: float | None = None, exact_ratio: bool = False
                                    ) -> tuple[torch.Tensor, CheckReport]:
    """8-bit row-wise EmbeddingBag (sum or mean) checked against the precomputed row checksums.

    The checksums are fp32 values computed from the packed bytes in fp64, not codes of the packed row: a
    checksum code would be dequantized with the row's own scale and bias, so a flip of those would move
    the reference with the result and go unseen. The fused CPU lookup reads the table in a layout of its
    own with each row's fp32 checksum beside the row (:func:`.fused_layout.row_layout`: a copy, 1.11x the
    packed table at D = 64, made again after an in-place write to ``table.packed``).
    """
    if mode != "sum" and mode != "mean":  # (each operation here is on the hot path of a lookup: fused_checked)
        pooling_mode("checked_quantized_embedding_bag", mode)
    idx, off = (indices, offsets) if offsets is not None and indices.dim() == 1 else bags_args(indices, offsets)
    packed = table.packed
    op, shape = _OPS_8BIT[mode], (packed.shape[0], table.dim, off.shape[0])

    if packed.is_cuda and not exact_ratio and cuda_wanted(packed, idx, off):
        from ..triton_abft.bag import fused_quantized_bag  # (the fused Triton kernel, issue 32)

        out, chk = fused_quantized_bag(table, idx, off, mode, lam=lam)
        return out, chk.report()

    def bags() -> Bags:
        return Bags(table.checks, idx, off, mode, None, off.shape[0], table.dim, 6.0, 0.0, lam, op, "uint8", shape)

    def lookup() -> torch.Tensor:
        return quantized_embedding_bag(table, idx, off, mode)

    done = None if exact_ratio else fused_checked(table.fused(), idx, off, mode, 6.0, lam, (op, "uint8", shape), bags,
                                                   lookup, keep=False)
    return done[:2] if done is not None else _checked_lookup(table.fused(), bags(), exact_ratio, lookup)
