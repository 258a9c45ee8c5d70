"""The fused CPU EmbeddingBag: the lookup itself, bitwise torch's, checked in the same pass.

The compiled lookup (``bag_lookup`` of :mod:`.._compiled`) gathers the row sums with the same indices (for
float32 rows in a pass of their own before the lookup, for 8-bit rows in its pass), sums each bag's output and
takes the verdict with the output's 1-norm, the accumulators in registers.
It replaces torch's lookup only where it was found to return the very same output
(:func:`fused_lookups_agree`, once per process) and where nothing must see torch's operator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .._kernels import available, kernel_table, raw
from .bag_verdict import Bags, EmbeddingChecks, bag_constants, bag_exact
from .cache import MAX_CACHED
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

    __slots__ = ("ft", "idx", "off", "psw", "nb", "mean", "consts", "meta", "buf", "_bag", "make")

    @classmethod
    def of(cls, ft: FusedTable | None, bag: Bags) -> FusedCall | None:
        idx, off, psw = bag.idx, bag.off, bag.psw
        if not _fusable(ft, idx, off, bag.mode) or bag.checks is not ft.checks or bag.d != ft.d or bag.u_out or \
                not bag.nb:
            return None
        if psw is not None and (bag.mode != "sum" or psw.dtype != torch.float32 or psw.shape != idx.shape or
                                not psw.is_cpu or not psw.is_contiguous()):
            return None  # (torch pools strided weights with another kernel, which rounds otherwise)
        if torch.is_grad_enabled() and (ft.tensor.requires_grad or (psw is not None and psw.requires_grad)):
            return None
        if not fused_lookups_agree(ft.quantized, psw is not None):
            return None
        _, tiny, c_lb = bag.constants
        return cls._made(ft, idx, off, psw, bag.nb, bag.mode, (c_lb, tiny), (bag.op, bag.dtype, bag.shape), bag, None)

    @classmethod
    def _made(cls, ft: FusedTable, idx: torch.Tensor, off: torch.Tensor, psw: torch.Tensor | None, nb: int,
              mode: str, consts: tuple[float, float], meta: tuple, bag: Bags | None, make: Callable[[], Bags] | None
              ) -> FusedCall:
        call = cls()
        call.ft, call.idx, call.off, call.psw, call.nb, call.mean = ft, idx, off, psw, nb, mode == "mean"
        call.consts, call.meta, call._bag, call.make, call.buf = consts, meta, bag, make, None
        return call

    @property
    def bag(self) -> Bags:
        """The call's :class:`Bags` (made on first use where :func:`fused_checked` made the call)."""
        if self._bag is None:
            self._bag = self.make()
        return self._bag

    def run(self, lookup: Callable[[], torch.Tensor], check: bool = True) -> tuple[torch.Tensor, CheckReport | None]:
        """``(out, report)``; without ``check`` the report is None and :meth:`verdict` checks ``out`` later
        (as it is then). Where an index or offset is out of range the kernel stops and ``lookup()`` (torch's,
        which raises or pools as torch does) runs instead, with the exact verdict (at once, also without
        ``check``)."""
        ft, nb = self.ft, self.nb
        c_lb, tiny = self.consts
        buf = np.empty((2, nb))  # per-bag reference and output sums
        out = torch.empty((nb, ft.d), dtype=torch.float32, device="cpu")
        worst = raw("bag_lookup")(0, nb, ft.view, self.idx.numpy(), self.off.numpy(), out.numpy(), ft.rowsum,
                                  None if self.psw is None else self.psw.detach().numpy(), self.mean, check, c_lb,
                                  tiny, buf[0], buf[1])
        if worst == -1.0:  # (no references: see referenced)
            out = lookup()
            return out, bag_exact(self.bag, out.reshape(-1, ft.d).float(), False)
        self.buf = buf
        return out, self._decide(float(worst), out) if check else None

    @property
    def referenced(self) -> bool:
        """Whether :meth:`run` wrote every bag's reference (False before it, or where it fell back to
        ``lookup()``): :meth:`verdict` needs them."""
        return self.buf is not None

    def verdict(self, out2: torch.Tensor) -> CheckReport:
        """Verdict on the (bags x D) float32 output of :meth:`run` without ``check``, as it is now (a flip
        since the lookup is seen), against the references the kernel wrote."""
        worst = raw("bag_out_verdict")(0, self.nb, out2.detach().numpy(), self.buf[0], *self.consts, self.buf[1])
        return self._decide(float(worst), out2)

    def _decide(self, worst: float, out2: torch.Tensor) -> CheckReport:
        if worst <= CLEAR:  # NaN (something not finite) falls through; near 1 the exact path decides
            op, dtype, shape = self.meta
            return CheckReport(op, dtype, False, worst, True, [], [], None, shape)
        return bag_exact(self.bag, out2, False, (self.buf[0], self.buf[1]))


def fused_checked(ft: FusedTable | None, idx: torch.Tensor, off: torch.Tensor, mode: str, extra: float,
                  lam: float | None, meta: tuple[str, str, tuple[int, ...]], make: Callable[[], Bags],
                  lookup: Callable[[], torch.Tensor], keep: bool = True
                  ) -> tuple[torch.Tensor, CheckReport, FusedCall | None] | None:
    """:meth:`FusedCall.of` and :meth:`FusedCall.run` (with ``check``) of an unweighted call over ``ft``'s
    checksums, with fewer Python operations (no :class:`Bags` unless needed; without ``keep`` no
    :class:`FusedCall` either, unless the exact path needs one): every Python operation of a lookup runs with
    cold caches right after the previous lookup, at several times its cost in a loop (the checked 8-bit
    lookup, 100000 x 64, 2048 bags of 40: this function and its caller's preamble, written as layers of
    calls, cost +5% of the lookup against the kernel called bare). ``meta``: (op, dtype, shape) of the
    report; ``make()``: the :class:`Bags`, made only where the exact path needs them. Returns ``(out,
    report, call)`` (``call`` None without ``keep`` or where the kernel fell back to ``lookup()``: no
    references), or None where :meth:`FusedCall.of` would refuse the call."""
    # (_fusable's conditions, those on the indices and offsets read off their NumPy views, which the kernel takes
    # anyway: a torch getter costs microseconds with cold caches, several times NumPy's)
    if ft is None or off is None or (mode != "sum" and mode != "mean") or torch._C._len_torch_dispatch_stack() or \
            torch._C._is_torch_function_mode_enabled() or not available():
        return None
    views = _index_views(idx, off)
    if views is None or not views[1].shape[0] or (ft.tensor.requires_grad and torch.is_grad_enabled()) or \
            not fused_lookups_agree(ft.quantized, False):
        return None
    nb, d = views[1].shape[0], ft.d
    consts = _CONSTANTS.get((views[0].shape[0], d, extra, lam))
    if consts is None:
        if len(_CONSTANTS) >= MAX_CACHED:
            _CONSTANTS.clear()
        consts = _CONSTANTS[(views[0].shape[0], d, extra, lam)] = bag_constants(views[0].shape[0], d, extra, 0.0,
                                                                                 lam)[1:]
    tiny, c_lb = consts
    # (on the CPU: a default device is a TorchFunctionMode, refused above; sizes as arguments, not a tuple, and no
    # device: half the time of the argument parsing)
    out = torch.empty(nb, d, dtype=torch.float32)
    buf = np.empty((2, nb))  # per-bag reference and output sums
    worst = raw("bag_lookup")(0, nb, ft.view, views[0], views[1], out.numpy(), ft.rowsum, None, mode == "mean",
                              True, c_lb, tiny, buf[0], buf[1])
    if 0.0 <= worst <= CLEAR and not keep:  # (the commonest call: clean, nothing kept; NaN and -1 go below)
        return out, CheckReport(meta[0], meta[1], False, worst, True, [], [], None, meta[2]), None
    call = FusedCall._made(ft, idx, off, None, nb, mode, (c_lb, tiny), meta, None, make)
    if worst == -1.0:  # (no references: see FusedCall.referenced)
        out = lookup()
        return out, bag_exact(call.bag, out.reshape(-1, d).float(), False), None
    call.buf = buf
    return out, call._decide(worst, out), call


#: (tiny, c_lb) of :func:`bag_constants` by (indices, D, extra, lam), for :func:`fused_checked`
_CONSTANTS: dict[tuple, tuple[float, float]] = {}
_NP_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


def _index_views(idx: torch.Tensor, off: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """The NumPy views of indices and offsets that the fused kernel takes as they are (:func:`_fusable`'s
    conditions on them: 1-D, contiguous, CPU, int32 or int64, one dtype), else None."""
    try:
        ia, oa = idx.numpy(), off.numpy()
    except (TypeError, RuntimeError, NotImplementedError, AttributeError):  # (not a CPU tensor, or needs grad)
        return None
    if ia.ndim != 1 or oa.ndim != 1 or ia.dtype != oa.dtype or ia.dtype not in _NP_INDEX_DTYPES or \
            not ia.flags.c_contiguous or not oa.flags.c_contiguous:
        return None
    return ia, oa


def _fusable(ft: FusedTable | None, idx: torch.Tensor, off: torch.Tensor | None, mode: str) -> bool:
    """The conditions of the fused kernel on the table, the indices and offsets and the pooling that every call
    shares (see :class:`FusedCall`); a type check of ``ft`` for the callers too."""
    return not (ft is None or off is None or torch._C._len_torch_dispatch_stack() or
                torch._C._is_torch_function_mode_enabled() or idx.dtype not in _INDEX_DTYPES or
                off.dtype is not idx.dtype or idx.dim() != 1 or off.dim() != 1 or not idx.is_cpu or not off.is_cpu or
                mode not in ("sum", "mean") or not idx.is_contiguous() or not off.is_contiguous() or not available())


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
                    ft = table.fused()
                    if ft is None:
                        return False
                    t, checks = ft.view, table.checks
                else:
                    t, checks = w, EmbeddingChecks.of(w)
                    want = F.embedding_bag(idx, w, off, mode=mode, per_sample_weights=psw)
                out, buf = np.empty((5, d), np.float32), np.empty((2, 5))
                flag = kernel(0, 5, t if quantized else t.numpy(), idx.numpy(), off.numpy(), out, checks.rowsum_view(),
                              None if psw is None else psw.numpy(), mode == "mean", False, 1.0, 1.0, buf[0], buf[1])
                ok &= torch.equal(torch.from_numpy(out), want) and flag != -1.0
    _AGREE[(quantized, weighted)] = ok
    return ok
