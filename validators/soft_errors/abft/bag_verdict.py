"""The EmbeddingBag check: a bag's output sum against the same bag pooled over per-row checksums.

A table carries per-row checksums ``W 1`` and ``|W| 1`` computed in fp64 (:class:`EmbeddingChecks`);
the reference of a bag is the same lookup pooled over the R x 1 row-sum table, compared with the sum
of the bag's output, within the classic gamma bound of the lookup's summation (derived in
:func:`verify_bag_output`). The checksums sit in tables of their own, not in the rows: a checksum
carried in an 8-bit row would be dequantized with the row's own scale and bias, so a flip of those
would move the reference with the result and go unseen.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mystique.errors import UsageError

from .._kernels import NO_WEIGHTS, available, raw
from .cache import MAX_CACHED, BoundedCache
from .device_check import DeviceCheck
from .report import CLEAR, EMBEDDING_LAMBDA, UNIT_ROUNDOFF, CheckReport, dtype_name, host


@dataclass
class EmbeddingChecks:
    """Per-row checksums of an embedding table, computed in fp64 and stored as fp32 (R x 1 each).

    ``rowsum`` is ``W 1`` (gathered with the lookup's indices for the reference of every bag),
    ``absum`` ``|W| 1`` (gathered only when a bag fails the cheap threshold, for the exact one).
    Two separate contiguous tables, so that the reference gather reads 4 bytes per index.
    """

    rowsum: torch.Tensor
    absum: torch.Tensor

    def rowsum_view(self) -> np.ndarray:
        """The row sums of a CPU table as a (R,) NumPy view (cached; shares the tensor's memory)."""
        view = self.__dict__.get("_view")
        if view is None or view[0] is not self.rowsum:
            view = self.__dict__["_view"] = (self.rowsum, self.rowsum[:, 0].numpy())
        return view[1]

    @classmethod
    def from_rows(cls, rowsum: torch.Tensor, absum: torch.Tensor) -> EmbeddingChecks:
        return cls(rowsum.to(torch.float32).reshape(-1, 1).contiguous(),
                   absum.to(torch.float32).reshape(-1, 1).contiguous())

    @classmethod
    def of(cls, weight: torch.Tensor) -> EmbeddingChecks:
        """Checksums of a floating-point (R x D) table."""
        if weight.dim() != 2 or not weight.is_floating_point():
            raise UsageError(f"embedding checksums need a 2-D floating-point table, got {tuple(weight.shape)} "
                             f"{weight.dtype}")
        return cls.from_rows(*row_sums64(weight))


def row_sums64(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W 1, |W| 1)`` of a floating-point (R x D) table in fp64, as :class:`EmbeddingChecks` stores them
    (there rounded to fp32)."""
    w64 = weight.detach().double()
    return w64.sum(1), w64.abs().sum(1)


def bag_lengths(indices: torch.Tensor, offsets: torch.Tensor, n_bags: int) -> torch.Tensor:
    return torch.diff(offsets[:n_bags], append=offsets.new_full((1,), indices.numel())) if n_bags else offsets[:0]


_TINY32 = float(torch.finfo(torch.float32).tiny)


def _pooled(col: torch.Tensor, idx: torch.Tensor, off: torch.Tensor | None, mode: str, n_bags: int,
            psw: torch.Tensor | None, pad: int | None = None) -> tuple[torch.Tensor, bool]:
    """Per-bag pooling of a per-row column ``col`` (R x 1) over the lookup (a (bags,) tensor on the
    column's device) and whether it was summed in fp64 (True) or in fp32 (False).

    On the CPU the column is gathered with ``index_select`` (4 bytes per index, about half the cost
    of a second EmbeddingBag call) and the bags summed by a reshape in fp32 when they are uniform,
    else in fp64 by ``np.add.reduceat``; elsewhere an EmbeddingBag over the column does both (``pad``: its
    padding index, the entries equal to it left out as the lookup's own leaves them out).
    """
    if mode == "none":
        return col[:, 0].index_select(0, idx.reshape(-1)), True
    if col.device.type != "cpu" or pad is not None:
        return F.embedding_bag(idx, col, off, mode=mode, per_sample_weights=psw, padding_idx=pad)[:, 0], False
    n = idx.numel()
    vals = col[:, 0].index_select(0, idx)
    if psw is not None:
        vals = vals * psw.to(vals.dtype)
    step = n // n_bags if n_bags else 0
    if step and n == n_bags * step and torch.equal(off[:n_bags], torch.arange(0, n, step, dtype=off.dtype)):
        sums = vals.view(n_bags, step).sum(1)  # uniform bags
        return (sums.div_(step) if mode == "mean" else sums), False
    starts = off.numpy()[:n_bags]
    lens = np.diff(starts, append=n)
    sums = np.zeros(n_bags)
    if n_bags:
        live = int(np.searchsorted(starts, n, side="left"))  # bags starting before the end (the rest are empty)
        if live:  # reduceat sums [start_i, start_i+1) and the last live bag to the end of the indices
            sums[:live] = np.add.reduceat(vals.numpy(), starts[:live], dtype=np.float64)
        sums[lens <= 0] = 0.0  # reduceat gives v[start] for an empty bag
    if mode == "mean":
        sums = sums / np.maximum(lens, 1)
    return torch.from_numpy(sums), True


def verify_bag_output(out: torch.Tensor, checks: EmbeddingChecks, indices: torch.Tensor,
                      offsets: torch.Tensor | None, mode: str, per_sample_weights: torch.Tensor | None = None, *,
                      extra: float = 4.0, u_out: float = 0.0, lam: float | None = None, op: str = "embedding_bag",
                      dtype: str | None = None, shape: tuple[int, ...] = (), exact_ratio: bool = False) -> CheckReport:
    """Check the (bags x D) output of an EmbeddingBag (``mode`` sum or mean; ``none``: an Embedding lookup).

    ``got_b = sum_d out_bd`` against ``ref_b``, the same bag pooled over ``checks.rowsum`` (a gather
    of 4 bytes per index, see :func:`_pooled`). A clean bag
    satisfies ``|got_b - ref_b| <= lam u (L_b (1 + r) + D + extra) a_b + u_out a_b``, ``a_b`` the
    bag pooled over ``checks.absum`` (``sum_{l in bag} sum_d |w_ld|``, the classic gamma bound of the
    lookup's summation and of the sum over the output, ``r`` = 1 where the reference was summed in
    fp32; ``u_out`` the rounding of an output narrower than fp32). The verdict is first taken with
    a lower bound of that threshold that costs no gather: ``L_b >= 0`` and
    ``a_b >= ||out_b||_2 / (1 + (n + D + 2) u + u_out)`` (triangle inequality, and
    ``sum_d |x_d| >= ||x||_2``; the denominator covers the rounding of ``out`` and of the norm, n the
    number of indices), in one compiled pass on the CPU (gather, sums and verdict, see
    :mod:`.._kernels`; the exact path then reuses its sums) and in a few device operations elsewhere.
    Only when a bag fails it are ``a_b`` and ``L_b`` gathered for the exact threshold, so
    ``max_ratio`` of a clean report is an upper bound of the exact ``|diff| / thr``.
    """
    bag, out2, done = _bag_of(out, checks, indices, offsets, mode, per_sample_weights, extra, u_out, lam, op, dtype,
                              shape)
    if done is not None:
        return done
    if mode != "none" and compiled_bags_ok(out2, checks):
        return CompiledBags(bag).verdict(out2, exact_ratio)
    return bag_exact(bag, out2, exact_ratio)


def device_bag_output(out: torch.Tensor, checks: EmbeddingChecks, indices: torch.Tensor,
                      offsets: torch.Tensor | None, mode: str, per_sample_weights: torch.Tensor | None = None, *,
                      extra: float = 4.0, u_out: float = 0.0, lam: float | None = None, op: str = "embedding_bag",
                      dtype: str | None = None, shape: tuple[int, ...] = (),
                      padding_idx: int | None = None) -> DeviceCheck | CheckReport:
    """:func:`verify_bag_output` with its verdict left on the device (:func:`device_bag_check`), or the
    report where none is needed (max pooling, no bags). ``padding_idx`` (sum or mean): the indices equal to
    it are left out of their bags as torch's lookup leaves them out, by the reference's own lookup over the
    row sums (no host read; :func:`.embedding_bag.without_padding` would make two), the bags' lengths and
    indices counted with them in the lower bound (a larger ``n`` only lowers it: the exact verdict, taken
    after an alarm, leaves them out)."""
    bag, out2, done = _bag_of(out, checks, indices, offsets, mode, per_sample_weights, extra, u_out, lam, op, dtype,
                              shape)
    if done is not None:
        return done
    if padding_idx is not None and mode in ("sum", "mean"):
        bag.pad = padding_idx
    return device_bag_check(bag, out2)


def _bag_of(out: torch.Tensor, checks: EmbeddingChecks, indices: torch.Tensor, offsets: torch.Tensor | None,
            mode: str, psw: torch.Tensor | None, extra: float, u_out: float, lam: float | None, op: str,
            dtype: str | None, shape: tuple[int, ...]) -> tuple[Any, torch.Tensor, CheckReport | None]:
    """``(Bags, the fp32 (bags x D) output, None)`` of one verification, or ``(None, out, report)`` where
    the report needs no check (max pooling is not linear: no checksum; no bags)."""
    d = out.shape[-1]
    dt = dtype or dtype_name(out.dtype)
    shape = shape or tuple(out.shape)
    if mode not in ("sum", "mean", "none"):
        return None, out, CheckReport(op, dt, False, 0.0, False, shape=shape)
    out2 = out.reshape(-1, d)
    if out2.dtype != torch.float32:
        out2 = out2.float()
    nb = out2.shape[0]
    if not nb:
        return None, out2, CheckReport(op, dt, False, 0.0, True, shape=shape)
    if mode == "none":
        idx, off, psw = indices.reshape(-1), None, None
    else:
        idx, off = bags_args(indices, offsets)
        if psw is not None and psw.dim() == 2:
            psw = psw.reshape(-1)
    return Bags(checks, idx, off, mode, psw, nb, d, extra, u_out, lam, op, dt, shape), out2, None


@dataclass
class Bags:
    """The arguments of one EmbeddingBag verification (see :func:`verify_bag_output`)."""

    checks: EmbeddingChecks
    idx: torch.Tensor
    off: torch.Tensor | None
    mode: str
    psw: torch.Tensor | None
    nb: int
    d: int
    extra: float
    u_out: float
    lam: float | None
    op: str
    dtype: str
    shape: tuple[int, ...]
    #: an index left out of its bag, as torch's lookup with this ``padding_idx`` leaves it (the device verdict
    #: only: :func:`device_bag_output`; :meth:`unpadded` gives the bags without it)
    pad: int | None = None

    def unpadded(self) -> Bags:
        """These bags with every index equal to :attr:`pad` left out (host reads: after an alarm only)."""
        if self.pad is None:
            return self
        from .embedding_bag import without_padding

        idx, off, psw = without_padding(self.idx, self.off, self.psw, self.pad)
        return replace(self, idx=idx, off=off, psw=psw, pad=None)

    @property
    def constants(self) -> tuple[float, float, float]:
        """``(k, tiny, c_lb)``: ``lam u``, the underflow term and the factor of the lower bound
        ``lb_b = c_lb ||out_b||_2 + tiny`` of a bag's exact threshold (see :func:`verify_bag_output`)."""
        return bag_constants(self.idx.numel(), self.d, self.extra, self.u_out, self.lam)


_BAG_CONSTANTS = BoundedCache(4 * MAX_CACHED)


def bag_constants(n: int, d: int, extra: float, u_out: float, lam: float | None) -> tuple[float, float, float]:
    """:attr:`Bags.constants` for ``n`` indices (cached: the call is on the hot path of every lookup)."""
    return _BAG_CONSTANTS.lookup((n, d, extra, u_out, lam), _make_bag_constants, n, d, extra, u_out, lam)


def _make_bag_constants(n: int, d: int, extra: float, u_out: float, lam: float | None
                        ) -> tuple[float, float, float]:
    u = UNIT_ROUNDOFF[torch.float32]
    k = (EMBEDDING_LAMBDA if lam is None else lam) * u
    c_lb = (k * (d + extra) + u_out) * max(0.0, 1.0 - (max(n, 1) + d + 2) * u - u_out) * (1.0 - 2.0**-16)
    return (k, _TINY32 * (d + 2), c_lb)


def compiled_bags_ok(out2: torch.Tensor, checks: EmbeddingChecks) -> bool:
    return out2.device.type == "cpu" and checks.rowsum.device.type == "cpu" and available()


class CompiledBags:
    """The compiled CPU verdict of one EmbeddingBag call, prepared before the lookup (NumPy views,
    constants, report) so that only one kernel call follows it (see :func:`.gemm.compiled_ok`)."""

    def __init__(self, bag: Bags) -> None:
        # (every operation here is on the hot path of a lookup: NumPy views of the index
        # tensors as they are, strided or not, and cached constants)
        self.bag = bag
        _, tiny, c_lb = bag.constants
        self.buf = np.empty((2, bag.nb))  # per-bag reference and output sums
        self.psw = NO_WEIGHTS if bag.psw is None else bag.psw.detach().numpy()
        self.idx, self.off, self.rowsum = bag.idx.numpy(), bag.off.numpy(), bag.checks.rowsum_view()
        self.consts = (c_lb, tiny, self.buf[0], self.buf[1])
        self.report = CheckReport(bag.op, bag.dtype, False, 0.0, True, [], [], None, bag.shape)

    def verdict(self, out2: torch.Tensor, exact_ratio: bool = False) -> CheckReport:
        """Verdict on the (bags x D) float32 CPU output of the lookup."""
        worst = float(raw("bag_verdict")(0, self.bag.nb, out2.detach().numpy(), self.idx, self.off,
                                         self.rowsum, self.psw, self.bag.mode == "mean", *self.consts))
        return self._decide(worst, out2, exact_ratio)

    def _decide(self, worst: float, out2: torch.Tensor, exact_ratio: bool) -> CheckReport:
        if worst == -1.0:  # an index or offset out of range: the torch path reports it
            return bag_exact(self.bag, out2, exact_ratio)
        if not exact_ratio and worst <= CLEAR:  # NaN (something not finite) falls through; near 1: exact path
            self.report.max_ratio = worst
            return self.report
        return bag_exact(self.bag, out2, exact_ratio, (self.buf[0], self.buf[1]))


def compiled_bag_check(out2: torch.Tensor, checks: EmbeddingChecks, idx: torch.Tensor, off: torch.Tensor, mode: str,
                       extra: float, lam: float | None, meta: tuple[str, str, tuple[int, ...]],
                       make: Callable[[], Bags]) -> CheckReport | None:
    """``CompiledBags(make()).verdict(out2)`` of an unweighted lookup's (bags x D) float32 CPU output with
    fewer Python operations (each runs with cold caches right after the lookup): the :class:`Bags` made
    only where the verdict is not clear at once. ``meta``: (op, dtype, shape) of the report. None where
    the compiled verdict does not apply (then :func:`verify_bag_output`)."""
    nb = out2.shape[0]
    if not nb or out2.dtype is not torch.float32 or out2.dim() != 2 or not out2.is_cpu or not idx.is_cpu or \
            not off.is_cpu or not checks.rowsum.is_cpu or not available():
        return None
    _, tiny, c_lb = bag_constants(idx.numel(), out2.shape[1], extra, 0.0, lam)
    buf = np.empty((2, nb))  # per-bag reference and output sums
    worst = float(raw("bag_verdict")(0, nb, out2.detach().numpy(), idx.numpy(), off.numpy(), checks.rowsum_view(),
                                     NO_WEIGHTS, mode == "mean", c_lb, tiny, buf[0], buf[1]))
    if 0.0 <= worst <= CLEAR:  # (-1: an index or offset out of range; NaN: something not finite)
        return CheckReport(meta[0], meta[1], False, worst, True, [], [], None, meta[2])
    return bag_exact(make(), out2, False, None if worst == -1.0 else (buf[0], buf[1]))


def bag_exact(bag: Bags, out2: torch.Tensor, exact_ratio: bool,
               compiled: tuple[np.ndarray, np.ndarray] | None = None) -> CheckReport:
    """The verdict of :func:`verify_bag_output` with torch operations: the lower bound (unless
    ``exact_ratio``), then the exact thresholds; ``compiled`` the per-bag reference and output sums
    of the compiled kernel (fp64), which are then used instead of summing again."""
    k, tiny, c_lb = bag.constants
    idx, off, mode, nb, d, psw = bag.idx, bag.off, bag.mode, bag.nb, bag.d, bag.psw
    if compiled is None:
        ref_t, ref64 = _pooled(bag.checks.rowsum, idx, off, mode, nb, psw)
        got = out2.sum(1, dtype=torch.float64)  # (fp64, as the compiled verdicts: both orders agree)
        if not exact_ratio:
            # an overflowing norm (inf) turns its row into NaN (0 * inf), no verdict
            lb = torch.linalg.vector_norm(out2, 2, dim=1).mul_(c_lb).add_(tiny)
            diff = (got - ref_t).abs_().add_(lb, alpha=0.0)
            worst = float(diff.div_(lb).max())
            if worst <= 1.0:  # NaN (something not finite) falls through
                return CheckReport(bag.op, bag.dtype, False, worst, True, [], [], None, bag.shape)
        ref, got_h = host(ref_t), host(got)
    else:
        (ref, got_h), ref64 = compiled, True
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff_h = np.abs(got_h - ref)
        psw_abs = psw.abs() if psw is not None else None
        ab = host(_pooled(bag.checks.absum, idx, off, mode, nb, psw_abs)[0])
        lens = np.ones(nb) if mode == "none" else host(bag_lengths(idx, off, nb))
        thr = _threshold(k, tiny, lens, ref64, d + bag.extra, bag.u_out, ab)
        valid = np.isfinite(ref) & np.isfinite(thr)
        bad = ~(diff_h <= thr) & valid
        ratio = np.where(valid, diff_h / thr, 0.0)
    rows = np.flatnonzero(bad)[:16].tolist()
    return CheckReport(bag.op, bag.dtype, bool(rows), float(np.nan_to_num(ratio, nan=math.inf).max()),
                       bool(valid.all()), rows, [], None, bag.shape)


def _threshold(k: float, tiny: float, lens: np.ndarray, ref64: bool, d_extra: float, u_out: float,
               ab: np.ndarray) -> np.ndarray:
    """The exact threshold of :func:`verify_bag_output`, ``lam u (L_b (1 + r) + D + extra) a_b + u_out a_b``
    (``k`` = lam u, ``r`` = 0 where the reference was summed in fp64) plus the underflow term ``tiny``."""
    return (k * (lens * (1.0 if ref64 else 2.0) + d_extra) + u_out) * ab + tiny


def sure_alarms(before: tuple[torch.Tensor, torch.Tensor], after: tuple[torch.Tensor, torch.Tensor],
                indices: torch.Tensor, offsets: torch.Tensor | None, mode: str, d: int, extra: float,
                lam: float | None = None, per_sample_weights: torch.Tensor | None = None) -> np.ndarray:
    """Which bags (a bool per bag) a change of the table is sure to raise the alarm in, on every path of
    :func:`verify_bag_output` (and of the fused lookup, which decides as it does), for checksums of the
    table ``before``: ``before``/``after`` are the per-row ``(sum_d w_d, sum_d |w_d|)`` in fp64 of the
    table before and after the change (:func:`row_sums64`; 8-bit rows: ``QuantizedTable.row_sums64``).

    Derivation: the exact verdict alarms where ``|got_b - ref_b| > thr(a_b)`` (``thr`` the exact threshold
    with ``r`` = 1, the larger; ``a_b`` the bag pooled over the magnitudes before). The rounding errors it
    bounds are the lookup's and the output sum's (each within its terms of ``thr`` over the magnitudes the
    lookup read, ``a'_b``) and the reference's (within its terms over ``a_b``), so with ``S_b``, ``S'_b``
    the exact checksums of the bag before and after, ``|got_b - ref_b| >= |S'_b - S_b| - thr(max(a_b,
    a'_b))``. The lower bound that may clear a bag first, ``c_lb ||out_b|| + tiny``, is at most
    ``lam u (D + extra) (1 + (L_b + 1) u) a'_b + tiny <= thr(a'_b)`` (the output's norm, over the changed
    magnitudes). So a bag with ``|S'_b - S_b| > 2 thr(max(a_b, a'_b))`` alarms on every path, and so does
    one whose change is not finite (its output is not). A change of at most ``thr(a_b)`` is one that the
    rounding of a clean lookup may make to that checksum: the check cannot tell it from rounding (between
    the two bounds it may alarm or not). The pooling here is in fp64 (its rounding, 2^-53 relative, is far
    below ``u``). With ``per_sample_weights`` (sum pooling) the checksums are pooled with the weights and the
    magnitudes with their magnitudes (``a_b = sum_i |w_i| a_i``, the magnitude of the weighted terms); the
    roundings of the weights' products belong in ``extra``.
    """
    idx, off = bags_args(indices, offsets)
    idx, off = idx.long(), off.long()
    nb = off.shape[0]
    psw = None if per_sample_weights is None else per_sample_weights.reshape(-1).double()

    def pooled(col: torch.Tensor, w: torch.Tensor | None = psw) -> np.ndarray:
        return F.embedding_bag(idx, col.double().reshape(-1, 1), off, mode=mode, per_sample_weights=w)[:, 0].numpy()

    k, tiny, _ = bag_constants(1, d, extra, 0.0, lam)
    lens = bag_lengths(idx, off, nb).double().numpy()
    mags = None if psw is None else psw.abs()
    a, a2 = pooled(before[1], mags), pooled(after[1], mags)
    with np.errstate(invalid="ignore", over="ignore"):
        change = pooled(after[0]) - pooled(before[0])
        bound = 2.0 * _threshold(k, tiny, lens, False, d + extra, 0.0, np.maximum(a, a2))
        return ~np.isfinite(change) | (np.abs(change) > bound)


def device_bag_check(bag: Bags, out2: torch.Tensor) -> DeviceCheck:
    """The lower-bound verdict of :func:`bag_exact` left on the device (no host read: a GPU's checked
    lookup does not wait for it); the exact verdict (:func:`bag_exact`) only where it exceeds 1."""
    _, tiny, c_lb = bag.constants
    ref_t, _ = _pooled(bag.checks.rowsum, bag.idx, bag.off, bag.mode, bag.nb, bag.psw, bag.pad)
    got = out2.sum(1, dtype=torch.float64)
    lb = torch.linalg.vector_norm(out2, 2, dim=1).mul_(c_lb).add_(tiny)
    worst = (got - ref_t).abs_().add_(lb, alpha=0.0).div_(lb).max().float()
    return DeviceCheck(worst, bag.dtype, bag.shape, lambda exact_ratio: bag_exact(bag.unpadded(), out2, exact_ratio),
                       bag.op)


def bags_args(indices: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if indices.dim() == 2:
        if offsets is not None:
            raise UsageError("2-D indices are bags of equal length: they take no offsets")
        b, L = indices.shape
        return indices.reshape(-1), torch.arange(0, b * L, L, device=indices.device)
    if offsets is None:
        raise UsageError("1-D indices need offsets")
    return indices, offsets
