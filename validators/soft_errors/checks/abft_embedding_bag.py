"""Check group ``abft_embedding_bag``: the checked EmbeddingBag, fp32 and 8-bit row-wise tables, sum and
mean pooling. A clean lookup must raise no alarm; one flipped table bit in a row of bag 0 must be
detected in bag 0."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mystique.faults.bits import flip_bits_

from ...groups import GroupContext
from ..abft import (
    CheckedTable,
    QuantizedTable,
    checked_embedding_bag,
    checked_quantized_embedding_bag,
    checked_table,
)


def run_abft_embedding_bag(ctx: GroupContext) -> None:
    res, target, seed = ctx.res, ctx.target, ctx.seed
    dev = target.device
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(500, 32, generator=g)
    idx = torch.randint(0, 500, (160,), generator=g)
    off = torch.arange(0, 160, 10)
    for quant in (False, True):
        for mode in ("sum", "mean"):
            name = f"embedding_bag_{'8bit_' if quant else ''}{mode}"
            ref = F.embedding_bag(idx, (QuantizedTable.from_float(w).dequantize() if quant else w).double(),
                                  off, mode=mode)
            lookup = _quantized if quant else _float
            out, rep, rep2, what = lookup(ctx, w.to(dev), idx.to(dev), off.to(dev), mode, int(idx[7]))
            err = float((out.cpu().double() - ref).abs().max())
            res.add("abft_embedding_bag", name, "clean_alarm", float(rep.alarm), threshold=0,
                    dtype="uint8" if quant else "float32", status="fail" if rep.alarm else "pass",
                    detail=f"{rep.describe()} max|out-fp64|={err:.3g} seed={seed}")
            res.add("abft_embedding_bag", name, "injected_detected", float(rep2.alarm), threshold=1,
                    dtype="uint8" if quant else "float32", status="pass" if rep2.alarm and 0 in rep2.rows else "fail",
                    detail=f"table flip {what} (bag 0): {rep2.describe()}")


def _quantized(ctx: GroupContext, w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor, mode: str, row: int):
    """``(clean output, clean report, report with code byte 3 bit 7 of ``row`` flipped, what was flipped)``."""
    table = QuantizedTable.from_float(w)
    with ctx.target.active():
        out, rep = checked_quantized_embedding_bag(table, idx, off, mode)
    corrupt = table.packed.clone()
    flip_bits_(corrupt, row * corrupt.shape[1] + 3, [7])
    with ctx.target.active():
        _, rep2 = checked_quantized_embedding_bag(QuantizedTable(corrupt, table.checks, table.dim), idx, off, mode)
    return out, rep, rep2, f"row {row} code byte 3 bit 7"


def _float(ctx: GroupContext, w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor, mode: str, row: int):
    """``(clean output, clean report, report with column 5 bit 27 of ``row`` flipped, what was flipped)``."""
    table = checked_table(w)
    with ctx.target.active():
        out, rep = checked_embedding_bag(table, idx, off, mode)
    corrupt = table.weight.clone()
    flip_bits_(corrupt, row * corrupt.shape[1] + 5, [27])
    with ctx.target.active():
        _, rep2 = checked_embedding_bag(CheckedTable(corrupt, table.checks), idx, off, mode)
    return out, rep, rep2, f"row {row} col 5 bit 27"
