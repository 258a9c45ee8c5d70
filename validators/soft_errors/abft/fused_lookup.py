"""The fused CPU EmbeddingBag: the lookup itself, bitwise torch's, checked in the same pass.

The compiled lookup (``bag_lookup`` of :mod:`.._compiled`) gathers the row sums with the same indices,
sums each bag's output and takes the verdict with the output's 1-norm, the accumulators in registers.
It replaces torch's lookup only where it was found to return the very same output
(:func:`fused_lookups_agree`, once per process) and where nothing must see torch's operator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .._kernels import available, kernel_table, raw
from .bag_verdict import Bags, EmbeddingChecks, bag_exact
from .fused_layout import FusedTable
from .quantized import QuantizedTable, quantized_embedding_bag
from .report import CLEAR, CheckReport

_INDEX_DTYPES = (torch.int64, torch.int32)


class FusedCall:
    """One EmbeddingBag call (the bags of a :class:`Bags`) by the fused compiled lookup (``bag_lookup`` of
    :mod:`.._compiled`): the lookup itself, bitwise torch's, with each bag's reference (the row sums
    gathered with the same indices) summed in the same pass and, with ``check``, the output's sums and
    the verdict.

    :meth:`of` returns None where torch's lookup must run instead: autograd recording, indices that are
    not a contiguous 1-D CPU int32/int64 tensor with offsets of the same dtype, per-sample weights with
    mean pooling (torch refuses them), not float32 or strided (torch then pools with another kernel), a
    TorchDispatchMode or TorchFunctionMode active (a fault simulated on torch's operators, or a default
    device, must reach the lookup), or where this torch build's kernels were found to round differently
    (:func:`fused_lookups_agree`). Every operation here is on the hot path of a lookup. A verdict
    within ``2^-10`` of its threshold is left to the exact path (:func:`bag_exact`), so both agree.
    """

    __slots__ = ("ft", "bag", "consts", "buf")

    @classmethod
    def of(cls, ft: FusedTable | None, bag: Bags) -> FusedCall | None:
        idx, off, psw = bag.idx, bag.off, bag.psw
        if ft is None or bag.checks is not ft.checks or bag.d != ft.d or bag.u_out or off is None or \
                torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled() or \
                idx.dtype not in _INDEX_DTYPES or \
                off.dtype != idx.dtype or idx.dim() != 1 or off.dim() != 1 or not idx.is_cpu or not off.is_cpu or \
                not bag.nb or bag.mode not in ("sum", "mean") or not idx.is_contiguous() or \
                not off.is_contiguous() or not available():
            return None
        if psw is not None and (bag.mode != "sum" or psw.dtype != torch.float32 or psw.shape != idx.shape or
                                not psw.is_cpu or not psw.is_contiguous()):
            return None  # (torch pools strided weights with another kernel, which rounds otherwise)
        if torch.is_grad_enabled() and (ft.tensor.requires_grad or (psw is not None and psw.requires_grad)):
            return None
        if not fused_lookups_agree(ft.quantized, psw is not None):
            return None
        call = cls()
        call.ft, call.bag = ft, bag
        return call

    def run(self, lookup: Callable[[], torch.Tensor], check: bool = True) -> tuple[torch.Tensor, CheckReport | None]:
        """``(out, report)``; without ``check`` the report is None and :meth:`verdict` checks ``out`` later
        (as it is then). Where an index or offset is out of range the kernel stops and ``lookup()`` (torch's,
        which raises or pools as torch does) runs instead, with the exact verdict (at once, also without
        ``check``)."""
        ft, bag = self.ft, self.bag
        _, tiny, c_lb = bag.constants
        self.buf = buf = np.empty((2, bag.nb))  # per-bag reference and output sums
        self.consts = (c_lb, tiny)
        out = torch.empty((bag.nb, ft.d), dtype=torch.float32, device="cpu")
        worst = raw("bag_lookup")(0, bag.nb, ft.view, bag.idx.numpy(), bag.off.numpy(), out.numpy(),
                                  ft.rowsum, None if bag.psw is None else bag.psw.detach().numpy(),
                                  bag.mode == "mean", check, c_lb, tiny, buf[0], buf[1])
        if worst == -1.0:
            out = lookup()
            return out, bag_exact(bag, out.reshape(-1, ft.d).float(), False)
        return out, self._decide(float(worst), out) if check else None

    def verdict(self, out2: torch.Tensor) -> CheckReport:
        """Verdict on the (bags x D) float32 output of :meth:`run` without ``check``, as it is now (a flip
        since the lookup is seen), against the references the kernel wrote."""
        worst = raw("bag_out_verdict")(0, self.bag.nb, out2.detach().numpy(), self.buf[0], *self.consts,
                                       self.buf[1])
        return self._decide(float(worst), out2)

    def _decide(self, worst: float, out2: torch.Tensor) -> CheckReport:
        bag = self.bag
        if worst <= CLEAR:  # NaN (something not finite) falls through; near 1 the exact path decides
            return CheckReport(bag.op, bag.dtype, False, worst, True, [], [], None, bag.shape)
        return bag_exact(bag, out2, False, (self.buf[0], self.buf[1]))


_AGREE: dict[tuple[bool, bool], bool] = {}


def fused_lookups_agree(quantized: bool, weighted: bool) -> bool:
    """Whether the fused kernel (8-bit or fp32 table, with or without per-sample weights) pools bitwise as
    this torch build's CPU EmbeddingBag does (sum and mean, ragged and empty bags, chunks of 128, 64, 16
    and single columns), checked once per process: the fused path replaces torch's lookup only where it
    returns the very same output."""
    hit = _AGREE.get((quantized, weighted))
    if hit is not None:
        return hit
    g = torch.Generator().manual_seed(0x5EED)
    ok = True
    kernel = kernel_table()["bag_lookup"]  # (not raw(): this once-per-process check is no hot path)
    with torch.no_grad():
        for d in (211, 7):
            rows, lengths = 50, torch.tensor([3, 0, 17, 1, 9], device="cpu")
            off = torch.cat([torch.zeros(1, dtype=torch.int64, device="cpu"), lengths.cumsum(0)[:-1]])
            idx = torch.randint(0, rows, (int(lengths.sum()),), generator=g, device="cpu")
            w = torch.randn(rows, d, generator=g, device="cpu") * torch.logspace(-3, 3, rows, device="cpu")[:, None]
            psw = torch.randn(idx.shape[0], generator=g, device="cpu") if weighted else None
            for mode in ("sum",) if psw is not None else ("sum", "mean"):
                if quantized:
                    table = QuantizedTable.from_float(w)
                    want = quantized_embedding_bag(table, idx, off, mode) if psw is None else \
                        torch.ops.quantized.embedding_bag_byte_rowwise_offsets(table.packed, idx, off, False, 0, False,
                                                                               psw, None, False)
                    t, checks = table.packed, table.checks
                else:
                    t, checks = w, EmbeddingChecks.of(w)
                    want = F.embedding_bag(idx, w, off, mode=mode, per_sample_weights=psw)
                out, buf = np.empty((5, d), np.float32), np.empty((2, 5))
                flag = kernel(0, 5, t.numpy(), idx.numpy(), off.numpy(), out, checks.rowsum_view(),
                              None if psw is None else psw.numpy(), mode == "mean", False, 1.0, 1.0, buf[0], buf[1])
                ok &= torch.equal(torch.from_numpy(out), want) and flag != -1.0
    _AGREE[(quantized, weighted)] = ok
    return ok
