"""Check groups ``abft_fbgemm`` and ``overhead_fbgemm``: FBGEMM's quantized row-wise lookups (8-bit and
4-bit rows, the inference TBE of :mod:`..abft.fbgemm`) checked by the EmbeddingBag check.

``abft_fbgemm``: a clean lookup raises no alarm, one flipped code bit in a row of bag 0 is detected
in bag 0, for sum and mean pooling; the same for FBGEMM's table-batched modules (training TBE with fp32 rows,
inference TBE with 8-bit rows, two tables) under :class:`..abft.tbe.CheckedTBE`; FBGEMM's mean against the fp64 mean of the same dequantized rows,
and beside it the error of torch's CPU 8-bit kernel asked for a mean (torch 2.13 returns sums: a
measured figure, ``info``). ``overhead_fbgemm``: checked / unchecked - 1 against FBGEMM's own
unchecked lookup (8-bit and 4-bit rows, sum and mean pooling), timed like the ``overhead`` group
(paired interleaved rounds, 95% interval, the product's EmbeddingBag target). Without FBGEMM both
groups add one ``skip`` row saying so."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...groups import GroupContext
from ..abft.fbgemm import BITS, FbgemmTable, checked_fbgemm_embedding_bag, fbgemm_available
from ..overhead import FRESH_INDICES, TABLE_ROUNDS, cpu_threads, embedding_bag_target
from .overhead import _timed_rows

_SKIP = "FBGEMM is not installed (pip install -e '.[fbgemm]', fbgemm-gpu-cpu paired with torch)"


def _skipped(ctx: GroupContext, group: str) -> bool:
    if fbgemm_available():
        return False
    ctx.res.add(group, "fbgemm", "fbgemm_available", None, status="skip", detail=_SKIP)
    return True


def run_abft_fbgemm(ctx: GroupContext) -> None:
    if _skipped(ctx, "abft_fbgemm"):
        return
    res, dev, seed = ctx.res, ctx.target.device, ctx.seed
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(500, 32, generator=g)
    idx = torch.randint(0, 500, (160,), generator=g)
    off = torch.arange(0, 160, 10)
    row = int(idx[7])  # a row of bag 0
    for bits in BITS:
        for mode in ("sum", "mean"):
            name = f"fbgemm_{bits}bit_{mode}"
            table = FbgemmTable.from_float(w.to(dev), bits, mode)
            with ctx.target.active():
                out, rep = checked_fbgemm_embedding_bag(table, idx.to(dev), off.to(dev))
            ref = F.embedding_bag(idx, table.dequantize().double(), off, mode=mode)
            err = float((out.cpu().double() - ref).abs().max())
            res.add("abft_fbgemm", name, "clean_alarm", float(rep.alarm), threshold=0, dtype="uint8",
                    status="fail" if rep.alarm else "pass", detail=f"{rep.describe()} max|out-fp64|={err:.3g} seed={seed}")
            packed, _sb = table.tbe.split_embedding_weights(split_scale_shifts=True)[0]
            packed[row, 1] ^= 0x80  # the top bit of code byte 1 (8-bit: element 1; 4-bit: element 3)
            with ctx.target.active():
                _out, rep2 = checked_fbgemm_embedding_bag(table, idx.to(dev), off.to(dev))
            res.add("abft_fbgemm", name, "injected_detected", float(rep2.alarm), threshold=1, dtype="uint8",
                    status="pass" if rep2.alarm and 0 in rep2.rows else "fail",
                    detail=f"table flip row {row} code byte 1 bit 7 (bag 0): {rep2.describe()}")
            if bits == 8 and mode == "mean":
                _torch_mean_row(ctx, w, idx, off, ref, err)
    _tbe_rows(ctx)


def _tbe_rows(ctx: GroupContext) -> None:
    """FBGEMM's table-batched modules under :class:`..abft.tbe.CheckedTBE` (two tables of different widths, 8
    ragged bags per feature): a clean forward raises no alarm; one flipped bit (an fp32 row's exponent, an
    8-bit row's fp16 scale's) of a row read by feature 1's bag 0 alarms in that bag, of the second table only."""
    from ..abft.tbe import CheckedTBE, example_tbe

    res, dev, seed = ctx.res, ctx.target.device, ctx.seed
    g = torch.Generator().manual_seed(seed)
    tables, b = ((500, 32), (300, 64)), 8
    lengths = torch.randint(0, 12, (2 * b,), generator=g)
    lengths[b] = 5  # feature 1's bag 0 reads a row
    idx = torch.cat([torch.randint(0, r, (int(lengths[f * b:(f + 1) * b].sum()),), generator=g)
                     for f, (r, _) in enumerate(tables)])
    off = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    row = int(idx[int(off[b])])
    for kind in ("fp32", "int8"):
        name = f"tbe_{kind}_sum"
        with ctx.target.active():
            tbe = example_tbe(kind, tables, "sum", dev, seed)
            checked = CheckedTBE(tbe)
            _out, rep = checked(idx.to(dev), off.to(dev))
        res.add("abft_fbgemm", name, "clean_alarm", float(rep.alarm), threshold=0, dtype=rep.dtype,
                status="fail" if rep.alarm else "pass", detail=f"CheckedTBE over FBGEMM's {type(tbe).__name__} "
                f"(tables {tables}, {b} bags per feature): {rep.describe()} seed={seed}")
        if kind == "fp32":
            tbe.split_embedding_weights()[1].data.view(torch.int32)[row, 0] ^= 1 << 29
            what = f"table 1 row {row} element 0 exponent bit 29"
        else:
            tbe.split_embedding_weights(split_scale_shifts=True)[1][1].data[row, 1] ^= 1 << 6
            what = f"table 1 row {row} fp16 scale exponent bit 14"
        with ctx.target.active():
            _out, rep2 = checked(idx.to(dev), off.to(dev))
        res.add("abft_fbgemm", name, "injected_detected", float(rep2.alarm), threshold=1, dtype=rep.dtype,
                status="pass" if rep2.alarm and b in rep2.rows and all(r >= b for r in rep2.rows) else "fail",
                detail=f"{what} (read by feature 1's bag 0, TBE bag {b}): {rep2.describe()}")


def _torch_mean_row(ctx: GroupContext, w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor,
                    fbgemm_ref: torch.Tensor, fbgemm_err: float) -> None:
    """The error of torch's CPU 8-bit kernel asked for mean pooling (mode=1), beside FBGEMM's."""
    try:
        packed = torch.ops.quantized.embedding_bag_byte_prepack(w.float().contiguous())
        got = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(packed, idx, off, False, 1, False, None, None,
                                                                     False)
    except (RuntimeError, AttributeError) as exc:
        ctx.res.add("abft_fbgemm", "torch_8bit_mean", "max_abs_error", None, status="skip", detail=str(exc)[:200])
        return
    d = w.shape[1]
    sb = packed[:, d:].contiguous().view(torch.float32).double()
    deq = packed[:, :d].double() * sb[:, :1] + sb[:, 1:]
    ref = F.embedding_bag(idx, deq, off, mode="mean")
    err = float((got.double() - ref).abs().max())
    as_sums = float((got.double() - F.embedding_bag(idx, deq, off, mode="sum")).abs().max())
    ctx.res.add("abft_fbgemm", "torch_8bit_mean", "max_abs_error", err, unit="", dtype="uint8", status="info",
                detail=f"torch {torch.__version__} CPU quantized::embedding_bag_byte_rowwise_offsets mode=1 vs the fp64 "
                       f"mean of its dequantized rows: max error {err:.3g} (vs the bag sums: {as_sums:.3g}); FBGEMM's "
                       f"MEAN lookup on the same table: {fbgemm_err:.3g} (row fbgemm_8bit_mean)")


def run_overhead_fbgemm(ctx: GroupContext) -> None:
    """``abft_overhead`` rows of the checked FBGEMM lookups vs FBGEMM's unchecked lookup."""
    if _skipped(ctx, "overhead_fbgemm"):
        return
    dev, reps = ctx.target.device, int(ctx.options["overhead_reps"])
    with cpu_threads(dev, int(ctx.options["overhead_threads"])) as threads:
        for rows, d, bags, length in ctx.options["overhead_tables"]:
            for bits in BITS:
                for mode in ("sum", "mean"):
                    _table_rows(ctx, threads, reps, int(rows), int(d), int(bags), int(length), bits, mode)


def _table_rows(ctx: GroupContext, threads: int, reps: int, rows: int, d: int, bags: int, length: int,
                bits: int, mode: str) -> None:
    """One table's rows (``mode`` pooling): the sum rows are named ``fbgemm_{bits}bit_{shape}``, the mean
    rows ``fbgemm_{bits}bit_mean_{shape}``."""
    dev = ctx.target.device
    g = torch.Generator().manual_seed(ctx.seed)
    table = FbgemmTable.from_float(torch.randn(rows, d, generator=g).to(dev), bits, mode)
    off = torch.arange(0, bags * length, length, device=dev)
    batch: dict[str, torch.Tensor] = {}

    def fresh(_name: str) -> None:  # fresh indices for every call (see FRESH_INDICES)
        batch["idx"] = torch.randint(0, rows, (bags * length,), generator=g).to(dev)

    def unchecked() -> torch.Tensor:
        return table.lookup(batch["idx"], off)

    def checked() -> torch.Tensor:
        out, rep = checked_fbgemm_embedding_bag(table, batch["idx"], off)
        if rep.alarm:
            raise RuntimeError(f"clean checked FBGEMM lookup raised an alarm: {rep.describe()}")
        return out

    fns = {"fbgemm": unchecked, "fbgemm_again": unchecked, "fbgemm_checked": checked}
    what = (f"FBGEMM {bits}-bit row-wise {mode} lookup checked against its row checksums (the lookup, then one "
            f"compiled pass: the gather of the R x 1 row sums and the bag verdict) vs FBGEMM's unchecked lookup")
    tag = f"{bits}bit" if mode == "sum" else f"{bits}bit_mean"
    _timed_rows(ctx, f"{tag}_{rows}x{d}_b{bags}_l{length}", threads, fns, TABLE_ROUNDS * reps,
                pair=("fbgemm_again", "fbgemm"), rounds_note=FRESH_INDICES, before_each=fresh,
                aa_what="the same FBGEMM lookup timed twice",
                shape=f"FBGEMM {bits}-bit table {rows} x {d}, {bags} bags of {length}, {mode} pooling",
                rows=((("fbgemm", "fbgemm_checked", "fbgemm", "uint8", what),), ()), limit=embedding_bag_target(ctx.target.device))
