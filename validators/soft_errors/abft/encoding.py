"""Checksum encodings of a GEMM ``C = A B (+ bias)`` and the bounds of their rounding error.

The row checks compare ``C W`` with ``A (B W)``, ``W = [e | s]`` (N x 2): ``e`` all ones and ``s`` a
fixed pseudo-random +-1 pattern (:func:`check_weights`). The second vector keeps an operand flip from
hiding: a flip of ``a_ik`` moves row ``i`` of the plain row sum by ``delta (B e)_k``, which can cancel;
it cannot cancel in ``B e`` and ``B s`` at once. The column checks are the row checks of the
transposed problem (:func:`col_checks`). int8 products get exact int64 checksums (:mod:`..exact`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mystique.dtypes import HALF_DTYPES
from mystique.errors import UsageError

from .._kernels import available
from ..exact import int8_checksums
from ..half import SUBNORMAL_HALF_SPACING
from .cache import MAX_CACHED, BoundedCache
from .report import UNIT_ROUNDOFF, host

_CHECK_SEED = 0x5EED
_WEIGHTS = BoundedCache()


#: rows of the checksum weights: ones and CHECK_VECTORS - 1 pseudo-random +-1 patterns. Two: more
#: right-hand sides make the pass over B costlier than the rarer exact-norm fallback saves (the
#: abft_floor rows of the overhead group measure it).
CHECK_VECTORS = 2


def check_weights(n: int, device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (CHECK_VECTORS x n) checksum weights ``[e | s]^T``: ones, and fixed pseudo-random +-1
    patterns (cached)."""
    return _WEIGHTS.lookup((n, str(device), dtype), _make_weights, n, device, dtype)


def _make_weights(n: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(_CHECK_SEED)
    signs = torch.randint(0, 2, (CHECK_VECTORS - 1, n), generator=g).mul_(2).sub_(1)
    return torch.cat([torch.ones(1, n, dtype=torch.int64), signs]).to(device=device, dtype=dtype)


@dataclass
class RowChecks:
    """Reference side of the weighted row checks of ``C = A B + e v^T + u e^T`` (C: M x N).

    ``v`` (N,) is a bias added to every row (a Linear bias), ``u`` (M,) one added to every column
    (the transposed problem of a Linear with bias). ``src`` (P x M, a tensor on the device or a host
    array) is ``W^T (A B + e v^T + u e^T)^T`` computed from the operands (``ref``: its host fp64
    copy, made on first need); ``vnorm`` (P,) the norms of the rows of ``[W^T B^T | W^T v | W^T e]``;
    ``rnorm`` the norm of ``r = [|B| e; sum|v|; N]``, computed on first need.
    """

    src: torch.Tensor | np.ndarray
    vnorm: np.ndarray
    a: torch.Tensor
    b: torch.Tensor
    v: torch.Tensor | None = None
    u: torch.Tensor | None = None
    rnorm: float | None = None
    _ref: np.ndarray | None = field(default=None, repr=False)
    #: ``(key, -ref, 1 / lower-bound threshold, W)`` with tensors on the device, made by :meth:`prime`
    fast: tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def ref(self) -> np.ndarray:
        if self._ref is None:
            self._ref = self.src.astype(np.float64) if isinstance(self.src, np.ndarray) else host(self.src)
        return self._ref

    def _lower_bound(self, ref: torch.Tensor, factor: float, det: float, tiny: float) -> torch.Tensor:
        """Lower bound of every row's threshold that needs no ``||a_i||``, from ``ref`` (this encoding's
        reference, as a host fp64 or a device tensor).

        ``||a_i|| ||r|| >= |ref_wi| vmax / vn_w`` (Cauchy-Schwarz, ``|B w| <= r``), so
        ``det |ref_0i| + tiny + factor max_w(|ref_wi| vmax / vn_w)`` is one; (1 - 2^-16) keeps it one
        despite its own rounding.
        """
        vn = np.maximum(self.vnorm, tiny)
        cw = (float(vn.max()) * factor * (1.0 - 2.0**-16)) / vn
        ra = ref.abs()
        return ra.mul(torch.from_numpy(cw).to(ra)[:, None]).amax(0).add_(ra[0], alpha=det).add_(tiny)

    def lower_bound(self, factor: float, det: float, tiny: float) -> np.ndarray:
        """:meth:`_lower_bound` on the host in fp64."""
        return self._lower_bound(torch.from_numpy(self.ref), factor, det, tiny).numpy()

    def prime(self, key: Any, factor: float, det: float, tiny: float) -> None:
        """Prepare the post-product verdict of :func:`.gemm.verify_gemm` as two device operations.

        Done before the product: right after a large GEMM the caches are cold and every small
        operation costs several times more, so the work left
        for after it is the pass over the product fused with the difference (``W^T C^T - ref``,
        one addmm) and ``max |.| / lower bound`` (a scaled max). ``key`` names the
        arguments of the verification this is valid for.
        """
        r = self.src if isinstance(self.src, torch.Tensor) else torch.from_numpy(self.src)
        lbt = self._lower_bound(r, factor, det, tiny)
        self.fast = (key, r.neg(), lbt.reciprocal_(), check_weights(self.b.shape[1], r.device, r.dtype))

    @property
    def k(self) -> int:
        return self.a.shape[1] + (self.v is not None or self.u is not None)

    def row_norms(self, rows: np.ndarray) -> np.ndarray:
        """``||a_i||`` of the given rows, the bias column included."""
        idx = torch.from_numpy(rows).to(self.a.device)
        sel = self.a.index_select(0, idx)
        sq = host(torch.linalg.vector_norm(sel, dim=1)) ** 2 if sel.shape[1] else np.zeros(len(rows))
        if self.v is not None:
            sq += 1.0
        if self.u is not None:
            sq += host(self.u.index_select(0, idx)) ** 2
        return np.sqrt(sq)

    def r_norm(self) -> float:
        """``||r||`` (one pass over B), cached."""
        if self.rnorm is None:
            r = host(self.b.abs().sum(1))  # (vector_norm with ord=1 along a dim is ~10x slower on the CPU)
            sq = float(np.square(r).sum())
            if self.v is not None:
                sq += float(np.abs(host(self.v)).sum()) ** 2
            if self.u is not None:
                sq += float(self.b.shape[1]) ** 2
            self.rnorm = math.sqrt(sq)
        return self.rnorm


def checksum_norms(vt: torch.Tensor, *extra: torch.Tensor) -> np.ndarray:
    sq = np.square(host(vt)).sum(1)
    for e in extra:
        sq += np.square(host(e))
    return np.sqrt(sq)


def encode_rows(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor | None = None,
                 u: torch.Tensor | None = None) -> RowChecks:
    wt = check_weights(b.shape[1], b.device, b.dtype)
    vt = wt @ b.t()  # (P, K): one pass over B
    ref = vt @ a.t()  # (P, M): one pass over A
    extra = []
    if v is not None:
        vw = wt @ v.to(vt.dtype)
        ref += vw[:, None]
        extra.append(vw)
    if u is not None:
        ew = wt.sum(1)
        ref.addr_(ew, u.to(ref.dtype))
        extra.append(ew)
    return RowChecks(ref, checksum_norms(vt, *extra), a, b, v, u)


@dataclass
class GemmEncoding:
    """The reference side of a checked ``A @ B (+ bias)``, computed from the operands before the product.

    Floats: ``rows`` (weighted row checks) and/or ``cols`` (weighted column checks, i.e. the row
    checks of the transposed problem); when only ``rows`` is encoded, the columns are encoded from
    the kept operands after an alarm, to locate it. int8: exact int64 ``ref_row``/``ref_col``.
    The operands are kept by reference: do not modify them between encoding and verification.
    """

    m: int
    k: int
    n: int
    rows: RowChecks | None = None
    cols: RowChecks | None = None
    locate: bool = True
    exact: bool = False
    ref_row: torch.Tensor | None = None
    ref_col: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def check_2d(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise UsageError(f"checked GEMM needs (M,K) @ (K,N) matrices, got {tuple(a.shape)} @ {tuple(b.shape)}")


def col_checks(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> RowChecks:
    """Column checks of ``A B + e bias^T``: the row checks of ``B^T A^T + bias e^T``."""
    return encode_rows(b.t(), a.t(), u=bias)


@torch.no_grad()
def encode_gemm(a: torch.Tensor, b: torch.Tensor, checks: str = "row",
                bias: torch.Tensor | None = None) -> GemmEncoding:
    """Reference checksums of ``a @ b (+ bias)`` from the operands (float: in a's dtype; int8: int64).

    ``checks``: ``row`` (the weighted row pair, the default; columns only to locate an alarm),
    ``col`` or ``both``. ``bias`` (N,) is added to every row of the product.
    """
    check_2d(a, b)
    if checks not in ("row", "col", "both"):
        raise UsageError(f"checks must be row, col or both, got {checks!r}")
    m, k = a.shape
    n = b.shape[1]
    if a.dtype in (torch.int8, torch.uint8):
        # exact int64 checksums from elementwise products and int64 sums (no integer GEMV: CUDA has none)
        ref_row, ref_col = int8_checksums(a, b)
        if bias is not None:
            ref_row = ref_row + bias.to(torch.int64).sum()
            ref_col = ref_col + m * bias.to(torch.int64)
        return GemmEncoding(m, k, n, exact=True, ref_row=ref_row, ref_col=ref_col)
    rows = encode_rows(a, b, v=bias) if checks in ("row", "both") else None
    cols = col_checks(a, b, bias) if checks in ("col", "both") else None
    return GemmEncoding(m, k, n, rows, cols, bias=bias)


def gemm_factor(k: int, m: int, n: int, u: float, lam: float) -> float:
    """The scalar in front of the norm products of the GEMM threshold (see :func:`gemm_constants`)."""
    return lam * u * (math.sqrt(k) + math.log2(max(m, n, 2)) + math.log2(max(k, 2)) + 2.0)


_CONSTANTS = BoundedCache(4 * MAX_CACHED)
_OUT_SUBNORMAL = {UNIT_ROUNDOFF[dt]: SUBNORMAL_HALF_SPACING[dt] for dt in HALF_DTYPES}


def gemm_constants(k: int, m: int, n: int, u: float, lam: float, u_out: float, dtype: torch.dtype,
                   out_dtype: torch.dtype | None = None) -> tuple[float, float, float]:
    """``(factor, det, tiny)`` of the GEMM threshold for one shape (cached: a few microseconds per call).

    A clean run differs from the reference only by rounding. The threshold of row ``i`` is

        thr_i = factor * ||a_i||_2 * ||r||_2 + det * |(A B e)_i| + tiny,        r = |B| e

    ``factor = lam u (sqrt(K) + log2(max(M, N)) + log2(K) + 2) + u_out``, ``u`` the unit roundoff of
    the accumulation. The first term is the probabilistic rounding-error bound of a dot product (error
    of ``a.b`` at most ``lam sqrt(K) u sum|a_k b_k|`` with overwhelming probability, Higham and Mary
    2019) summed with absolute values over the columns (``sum_j sum_k |a_ik b_kj| = |a_i| . r <=
    ||a_i|| ||r||``, Cauchy-Schwarz), so perfectly correlated errors cannot add up past it; the ``log2``
    terms cover the rounding of the checksums themselves. ``det = u (K + log2(max(M, N)) + 2)`` is the
    deterministic gamma bound for same-sign data, whose errors add up like K: then ``sum_j sum_k
    |a_ik b_kj| = |(A B e)_i|``. The weighted checksum obeys the same bound (``|s_j| = 1``). ``u_out``
    adds the rounding of an output rounded to a narrower dtype before the check; ``tiny`` covers
    underflow (and, for such an output, half a subnormal spacing per term below the normal range).
    ``out_dtype`` names the half dtype the output was rounded to where ``u_out`` holds more terms than
    its rounding (the device paths of :mod:`.device_linear`); otherwise it is read from ``u_out``.
    """
    return _CONSTANTS.lookup((k, m, n, u, lam, u_out, dtype, out_dtype), _make_constants, k, m, n, u, lam, u_out,
                             dtype, out_dtype)


def _make_constants(k: int, m: int, n: int, u: float, lam: float, u_out: float, dtype: torch.dtype,
                    out_dtype: torch.dtype | None) -> tuple[float, float, float]:
    # an output rounded to a half dtype (u_out) errs by up to half a subnormal spacing below the normal
    # range, where u_out |c| does not bound it: max(M, N) such terms in a row or column checksum
    spacing = SUBNORMAL_HALF_SPACING.get(out_dtype, 0.0) if out_dtype is not None else _OUT_SUBNORMAL.get(u_out, 0.0)
    tiny_out = max(m, n) * spacing
    return (gemm_factor(k, m, n, u, lam) + u_out, u * (k + math.log2(max(m, n, 2)) + 2.0),
            float(torch.finfo(dtype).tiny) * (k + m + n) + tiny_out)


def compiled_rows(rc: RowChecks) -> bool:
    """Whether the row checks of ``rc`` are computed by the compiled CPU kernels (:mod:`.._kernels`)."""
    src = rc.src
    return CHECK_VECTORS == 2 and rc.a.device.type == "cpu" and \
        (isinstance(src, np.ndarray) or (src.device.type == "cpu" and src.dtype == torch.float32)) and \
        available()
