"""The fused checked EmbeddingBag: lookup, checksum gather and each bag's verdict in one Triton pass.

One program per bag (:func:`.kernels.bag_kernel`): for each index of the bag it reads the row (fp32,
bf16/fp16, or fbgemm's 8-bit row-wise layout: D codes then the fp32 scale and bias, dequantized as
``q * scale + bias`` in fp32), adds it to the fp32 accumulator, and adds the row's checksum ``W 1`` and
magnitude ``|W| 1`` (:class:`..abft.bag_verdict.EmbeddingChecks`, computed in fp64 from the table and
stored apart from it, so that a flip of an 8-bit row's scale or bias moves the output and not its
reference). Sum or mean (the accumulator, the checksum and the magnitude divided by the bag's length;
an empty bag gives zeros), ragged bags by their offsets. Per-sample weights (sum pooling) multiply each row,
its checksum and (by their magnitude) its magnitude; an index equal to the padding index is left out of its
bag (its row, checksum and magnitude, and the count a mean divides by), as torch's lookup leaves it out;
offsets may include the last bag's end (``include_last_offset``: the indices past it are read by no bag).

The verdict is the exact threshold of :func:`..abft.bag_verdict.verify_bag_output`, ``lam u (L (1 + 1)
+ D + extra) a + tiny`` (``L`` the bag's length, ``a`` its pooled magnitude, the reference summed in fp32,
``extra`` 4 for float tables and 6 for 8-bit ones, which covers the dequantisation's two roundings and a
mean's division), held in the kernel itself: the lookup's and the reference's sums are L - 1 additions
each (blocks of :data:`BAG_ROWS` rows summed as a tree, the blocks in order: at most L - 1 roundings per
term whatever the order) and the output's sum over D (``tl.sum``) at most D - 1, within the gamma bound. A half table's output is checked on the fp32 accumulator, then rounded once to the
table's dtype (torch's own lookup of such a table also accumulates in fp32). Each bag's ratio is kept on
the device (the exact report after an alarm) and the largest one is the call's :class:`..abft.device_check.
DeviceCheck` scalar, read back later. The only other launch is the zeroing of that scalar.

Not covered: max pooling (refused: not linear), autograd (the torch paths run).
"""

from __future__ import annotations

import torch

from mystique.errors import UsageError

from ..abft.bag_verdict import EmbeddingChecks, bag_constants
from ..abft.device_check import DeviceCheck
from ..abft.quantized import QuantizedTable
from ..abft.report import CheckReport, host
from .kernels import bag_kernel

#: the kernel's threshold times this: far above the few fp32 roundings of its own evaluation
MARGIN = 1.0 + 2.0**-10
#: the roundings weights add to the threshold's ``D + extra`` term: each product ``psw_i x_id`` of the lookup
#: and ``psw_i c_i`` of the reference rounds once in fp32, ``u |psw_i| a_i`` per term summed over the bag's
#: columns and terms: ``u a_b`` each
WEIGHT_ROUNDINGS = 2.0
#: rows of a bag gathered at once (their loads in flight together)
BAG_ROWS = 16


def fused_embedding_bag(weight: torch.Tensor, checks: EmbeddingChecks, indices: torch.Tensor,
                        offsets: torch.Tensor | None = None, mode: str = "sum", *, lam: float | None = None,
                        op: str | None = None, per_sample_weights: torch.Tensor | None = None,
                        padding_idx: int | None = None, include_last_offset: bool = False
                        ) -> tuple[torch.Tensor, DeviceCheck]:
    """EmbeddingBag over a float (R x D) table (fp32, bf16 or fp16), checked in the lookup's pass; returns
    ``(out, check)``, ``out`` in the table's dtype. ``per_sample_weights`` (sum pooling), ``padding_idx`` and
    ``include_last_offset`` as torch's."""
    if weight.dim() != 2 or not weight.is_floating_point() or weight.dtype == torch.float64:
        raise UsageError(f"a fused checked EmbeddingBag needs a 2-D fp32/bf16/fp16 table, got {tuple(weight.shape)} "
                         f"{weight.dtype}")
    return _run(weight, weight.shape[1], weight.dtype, checks, indices, offsets, mode, lam, 4.0, False,
                op or f"embedding_bag_{mode}", str(weight.dtype).removeprefix("torch."),
                (per_sample_weights, padding_idx, include_last_offset))


def fused_quantized_bag(table: QuantizedTable, indices: torch.Tensor, offsets: torch.Tensor | None = None,
                        mode: str = "sum", *, lam: float | None = None) -> tuple[torch.Tensor, DeviceCheck]:
    """EmbeddingBag over an 8-bit row-wise table (fbgemm layout), checked in the lookup's pass; fp32 output."""
    return _run(table.packed, table.dim, torch.float32, table.checks, indices, offsets, mode, lam, 6.0, True,
                f"embedding_bag_8bit_{mode}", "uint8")


def _run(w: torch.Tensor, d: int, out_dtype: torch.dtype, checks: EmbeddingChecks, indices: torch.Tensor,
         offsets: torch.Tensor | None, mode: str, lam: float | None, extra: float, quant: bool, op: str,
         dtype: str, how: tuple[torch.Tensor | None, int | None, bool] = (None, None, False)
         ) -> tuple[torch.Tensor, DeviceCheck]:
    from ..abft.embedding_bag import lookup_args, pooling_mode

    pooling_mode("a fused checked EmbeddingBag", mode)
    psw, pad, last = how
    idx, off, psw, pad = lookup_args(indices, offsets, psw, mode, w.shape[0], pad, last, cut=False)
    idx, off = idx.contiguous(), off.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    nb, n = off.shape[0] - last, idx.numel()
    out = torch.empty((nb, d), dtype=out_dtype, device=w.device)
    ratio = torch.empty((nb,), dtype=torch.float32, device=w.device)
    worst = torch.zeros((), dtype=torch.float32, device=w.device)
    k_lam, tiny, _ = bag_constants(n, d, extra, 0.0, lam)
    weights = None if psw is None else psw.to(torch.float32).contiguous()
    d_extra = float(d) + extra + (0.0 if weights is None else WEIGHT_ROUNDINGS)
    if nb:
        bag_kernel()[(nb,)](w, idx, off, checks.rowsum, checks.absum, out, worst, ratio, n, nb, w.shape[0], d,
                            w.stride(0), k_lam, d_extra, tiny, ratio if weights is None else weights,
                            -1 if pad is None else pad, BD=max(16, 1 << (d - 1).bit_length()), BL=BAG_ROWS,
                            QUANT=quant, MEAN=mode == "mean", WEIGHTED=weights is not None, LAST=last,
                            MARGIN=MARGIN, num_warps=2 if d > 128 else 1)
    shape = (w.shape[0], d, nb)

    def exact(exact_ratio: bool) -> CheckReport:
        r = host(ratio)
        rows = [int(i) for i in (~(r <= 1.0)).nonzero()[0][:16]]
        return CheckReport(op, dtype, bool(rows), float(r.max()) if nb else 0.0, True, rows, [], None, shape)

    return out, DeviceCheck(worst, dtype, shape, exact, op)
