"""Checked operators (algorithm-based fault tolerance): GEMM and EmbeddingBag with checksums.

GEMM ``C = A @ B`` (A: M x K, B: K x N) is checked with two weighted row checksums, in O(n^2):

    got = C W        against        ref = A (B W),        W = [e | s]   (N x 2)

where ``e`` is all ones and ``s`` a fixed pseudo-random +-1 pattern (:func:`check_weights`). The
reference side costs one pass over B (``B W``) and one over A; the check one pass over C, so the
whole check is three memory passes (measured +3-7% of an n = 1024 fp32 GEMM on one core of this
shared host, depending on its load: the ``passes_floor`` rows of the overhead group). The second weight vector keeps an operand
flip from hiding: a flip of ``a_ik`` moves row ``i`` of the plain row sum by ``delta (B e)_k``,
which can cancel; it cannot cancel in ``B e`` and ``B s`` at once.
When a row check fires, the column checks ``e^T C`` against ``(e^T A) B`` (the same weighted pair on
the transposed problem) run as well, to locate the flipped element; ``checks="col"`` or ``"both"``
runs them always.

A clean run differs from the reference only by rounding. The threshold of row ``i`` is

    thr_i = lam * u * (sqrt(K) + log2(max(M, N)) + log2(K) + 2) * ||a_i||_2 * ||r||_2
            + u * (K + log2(max(M, N)) + 2) * |(A B e)_i|,          r = |B| e

``u`` the unit roundoff of the accumulation dtype. The first term is the probabilistic
rounding-error bound of a dot product (error of ``a.b`` at most ``lam sqrt(K) u sum|a_k b_k|`` with
overwhelming probability, Higham and Mary 2019) summed with absolute values over the columns
(``sum_j sum_k |a_ik b_kj| = |a_i| . r <= ||a_i|| ||r||``, Cauchy-Schwarz), so perfectly correlated
errors (identical rows, padding tokens) cannot add up past it; the ``log2`` terms cover the
rounding of the checksums themselves. The second term is the deterministic gamma bound for
same-sign data, whose errors add up like K: then ``sum_j sum_k |a_ik b_kj| = |(A B e)_i|``. The
weighted checksum obeys the same bound (``|s_j| = 1``). ``lam`` (1) was calibrated on clean data of
many shapes, scales and distributions and on the activations of the reference workloads.

On the CPU (Numba importable, :mod:`._kernels`) :func:`checked_mm` and :func:`checked_linear`
evaluate this exact threshold in the same passes as the checksums: the pass over B also sums
``|B|`` (so ``||r||``), the pass over A (the input x of a Linear) also its row norms, and the pass over
C computes the checksums and the verdict, in one compiled call after the product; everything that
call needs (output buffer, views, constants, report) is prepared before the product, because right
after a large GEMM every Python-level operation costs 10-60 us on this 2-core host. The checksums
sum the exact fp64 products in fp64 (rounding ~N 2^-53, far under the ``log2`` budget). A row whose compiled ratio is above ``1 - 2^-10`` goes to the
NumPy path below, which then decides with its own norms, so both paths always agree.

Elsewhere (and for :func:`verify_gemm` on an :func:`encode_gemm` encoding) the threshold is evaluated
lazily: first with free *lower bounds* of the two norms, ``||a_i|| >= |ref_iw| / ||B w||`` and
``||r|| >= ||B w||`` (``|B w| <= |B| |w| = r`` element-wise); a row whose difference is within that
smaller threshold is clean. Only rows that are not get their exact ``||a_i||`` (a gather of those
rows), and only if one still fails, the exact ``||r||`` (one pass over B). ``max_ratio`` of a clean
report is therefore an upper bound of ``|diff| / thr``. Those bounds are loose by about ``sqrt(K)``
(``|ref_iw|`` is a random-walk sum): at n >= 1024 a quarter to half of clean normal-data products
fail them and pay the exact path, which is why the CPU path computes the exact norms in its passes.

For a Linear layer the weight is static: :func:`encode_linear` computes ``W^T W_chk``, the bias term
and ``||r||`` once per weight version (cached), so a checked call costs one pass over the input
(``x (W^T W_chk)``, and on the CPU its row norms) and one over the output.

bf16/fp16 GEMMs are computed with fp32 accumulation and checked *on the fp32 accumulator*, then
rounded. The accumulator is the device's own half-precision GEMM with an fp32 output where the
backend has one (``torch.mm(out_dtype=torch.float32)``: CUDA), else the fp32 GEMM of the upcast
operands (the CPU has no such kernel; see :mod:`.half`). Checking the rounded output instead would
have to allow each output element its rounding error ``2^-8 |c_ij|`` (bf16): a threshold 2^16 times
larger, which lets every flip below about the eighth mantissa bit of the result through, and every
flip of the accumulator that rounding does not erase but that stays below that bound.
``check_rounded=True`` does exactly that, on the device's own half-precision GEMM with its rounded
output (every backend has that one), for comparison and where no fp32-output kernel exists.

int8 GEMMs are the int32 product of the device's int8 GEMM and are checked exactly (int64 row and
column checksums, equality), with only elementwise integer products and int64-accumulated sums, which
every backend has (CUDA has no integer GEMM/GEMV, MPS no fp64; see :mod:`.exact`).

EmbeddingBag (fp32 tables, and 8-bit row-wise quantized tables with per-row scale and bias in the
fbgemm layout; sum and mean pooling) is checked against per-row checksums ``W 1`` computed in fp64
when the table is built (:func:`checked_table`, :class:`QuantizedTable`): the bag's reference is the
same lookup pooled over the R x 1 row-sum table, compared with the sum of the bag's output. The
threshold is the classic gamma bound ``lam u (L_b + D + c) sum_{l in bag} sum_d |w_ld|``; its
magnitude term needs a second gather, so the verdict is first taken with a lower bound of it read
from the output itself, ``||out_b||_2 <= sum_d |out_bd|`` (triangle inequality), and the magnitudes
and bag lengths are gathered only for calls where a bag fails that (see :func:`verify_bag_output`).
On the CPU, without autograd, the lookup itself is a compiled kernel (:class:`_FusedCall`, ``bag_lookup``
of :mod:`._compiled`): it returns torch's output bitwise (checked against this torch build once per
process) and gathers the row sums, sums each bag's output and takes the verdict, with the output's
1-norm, in the same pass, the accumulators in registers. Its lookup alone is 2-8% faster than torch's
(fbgemm's) here; the reference costs the rest, measured with 2001 paired rounds on a 100000 x 64 fp32
table (2026-11-23): the fused lookup +17-21% over torch's, of which ~10% are the three instructions per
index that gather and add the row sum even when it is always in L1 (the loop's speed follows the
instructions it has in flight per index), ~4% the per-bag output sum and 1-norm, and ~8-10% the row-sum
table's footprint (a 1-byte-per-row table gains ~2%; fp64 row sums, 800 KB, lose 4-14%). Elsewhere, or with autograd, torch's
lookup runs and the gather, sums and verdict follow in one compiled pass (``bag_verdict``) or in a
few device operations. Two layouts that look cheaper were measured
slower or blind on this CPU: checksum columns appended to the fp32 rows (``[W | W1 | |W|1]``, one
gather) touch one more cache line per row when D is a multiple of 16 (+25% traffic at D = 64), and
checksum codes appended to an 8-bit row are dequantized with the row's own scale and bias, so a
flip of those moves the reference with the result and goes unseen.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mystique.errors import UsageError

from . import _kernels, exact, half

UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
#: Safety factor of the GEMM threshold (calibrated; see module docstring).
GEMM_LAMBDA = 1.0
#: Factor of the EmbeddingBag gamma bound (1 is the rigorous deterministic bound).
EMBEDDING_LAMBDA = 1.0
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_CHECK_SEED = 0x5EED
_MAX_CACHED = 512


@dataclass
class CheckReport:
    """Outcome of one checked operation.

    ``alarm`` is True when a checksum disagreed beyond its threshold; ``max_ratio`` is the largest
    ``|checksum difference| / threshold`` (below 1 on a clean run; an upper bound of it where the
    lower-bound threshold already decided); ``rows``/``cols`` list the flagged rows and columns
    (GEMM) or bags (EmbeddingBag, in ``rows``); ``location`` is the first flagged (row, col) of a
    GEMM when both checks flag; ``checked`` is False when the inputs were not finite (no verdict).
    """

    op: str
    dtype: str
    alarm: bool
    max_ratio: float
    checked: bool = True
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    location: tuple[int, int] | None = None
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else (f" rows {self.rows[:4]}" if self.rows else "")
        return (f"{self.op} {self.dtype} {tuple(self.shape)}: {'ALARM' if self.alarm else 'ok'} "
                f"max|diff|/thr={self.max_ratio:.3g}{where}")


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_WEIGHTS: dict[tuple[int, str, torch.dtype], torch.Tensor] = {}


#: rows of the checksum weights: ones and CHECK_VECTORS - 1 pseudo-random +-1 patterns. Two: with
#: four, MKL's product with four right-hand sides cost +8.4% of an n = 1024 GEMM instead of +4.5-5%
#: (the abft_floor row, side by side on this host), more than the rarer exact-norm fallback saves.
CHECK_VECTORS = 2


def check_weights(n: int, device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (CHECK_VECTORS x n) checksum weights ``[e | s]^T``: ones, and fixed pseudo-random +-1
    patterns (cached)."""
    key = (n, str(device), dtype)
    w = _WEIGHTS.get(key)
    if w is None:
        g = torch.Generator().manual_seed(_CHECK_SEED)
        signs = torch.randint(0, 2, (CHECK_VECTORS - 1, n), generator=g).mul_(2).sub_(1)
        w = torch.cat([torch.ones(1, n, dtype=torch.int64), signs]).to(device=device, dtype=dtype)
        if len(_WEIGHTS) >= _MAX_CACHED:
            _WEIGHTS.clear()
        _WEIGHTS[key] = w
    return w


def _host(t: torch.Tensor, f64: bool = True) -> np.ndarray:
    """A small tensor as a NumPy array (the O(M) threshold arithmetic runs on the host), float64 by default."""
    a = t.detach().cpu().numpy()
    return a.astype(np.float64) if f64 else a


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
            self._ref = self.src.astype(np.float64) if isinstance(self.src, np.ndarray) else _host(self.src)
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
        """Prepare the post-product verdict of :func:`verify_gemm` as two device operations.

        Done before the product: right after a large GEMM the caches are cold and every small
        operation costs several times more (10-30 us each on a 2-core x86 host), so the work left
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
        sq = _host(torch.linalg.vector_norm(sel, dim=1)) ** 2 if sel.shape[1] else np.zeros(len(rows))
        if self.v is not None:
            sq += 1.0
        if self.u is not None:
            sq += _host(self.u.index_select(0, idx)) ** 2
        return np.sqrt(sq)

    def r_norm(self) -> float:
        """``||r||`` (one pass over B), cached."""
        if self.rnorm is None:
            r = _host(self.b.abs().sum(1))  # (vector_norm with ord=1 along a dim is ~10x slower on the CPU)
            sq = float(np.square(r).sum())
            if self.v is not None:
                sq += float(np.abs(_host(self.v)).sum()) ** 2
            if self.u is not None:
                sq += float(self.b.shape[1]) ** 2
            self.rnorm = math.sqrt(sq)
        return self.rnorm


def _vnorm(vt: torch.Tensor, *extra: torch.Tensor) -> np.ndarray:
    sq = np.square(_host(vt)).sum(1)
    for e in extra:
        sq += np.square(_host(e))
    return np.sqrt(sq)


def _encode_rows(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor | None = None,
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
    return RowChecks(ref, _vnorm(vt, *extra), a, b, v, u)


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


def _check_2d(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise UsageError(f"checked GEMM needs (M,K) @ (K,N) matrices, got {tuple(a.shape)} @ {tuple(b.shape)}")


def _col_checks(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> RowChecks:
    """Column checks of ``A B + e bias^T``: the row checks of ``B^T A^T + bias e^T``."""
    return _encode_rows(b.t(), a.t(), u=bias)


@torch.no_grad()
def encode_gemm(a: torch.Tensor, b: torch.Tensor, checks: str = "row",
                bias: torch.Tensor | None = None) -> GemmEncoding:
    """Reference checksums of ``a @ b (+ bias)`` from the operands (float: in a's dtype; int8: int64).

    ``checks``: ``row`` (the weighted row pair, the default; columns only to locate an alarm),
    ``col`` or ``both``. ``bias`` (N,) is added to every row of the product.
    """
    _check_2d(a, b)
    if checks not in ("row", "col", "both"):
        raise UsageError(f"checks must be row, col or both, got {checks!r}")
    m, k = a.shape
    n = b.shape[1]
    if a.dtype in (torch.int8, torch.uint8):
        # exact int64 checksums from elementwise products and int64 sums (no integer GEMV: CUDA has none)
        ref_row, ref_col = exact.int8_checksums(a, b)
        if bias is not None:
            ref_row = ref_row + bias.to(torch.int64).sum()
            ref_col = ref_col + m * bias.to(torch.int64)
        return GemmEncoding(m, k, n, exact=True, ref_row=ref_row, ref_col=ref_col)
    rows = _encode_rows(a, b, v=bias) if checks in ("row", "both") else None
    cols = _col_checks(a, b, bias) if checks in ("col", "both") else None
    return GemmEncoding(m, k, n, rows, cols, bias=bias)


def gemm_factor(k: int, m: int, n: int, u: float, lam: float) -> float:
    """The scalar in front of the norm products of the GEMM threshold (see module docstring)."""
    return lam * u * (math.sqrt(k) + math.log2(max(m, n, 2)) + math.log2(max(k, 2)) + 2.0)


_CONSTANTS: dict[tuple[Any, ...], tuple[float, float, float]] = {}
_OUT_SUBNORMAL = {half.U_HALF[dt]: half.SUBNORMAL_HALF_SPACING[dt] for dt in half.HALF}


def _gemm_constants(k: int, m: int, n: int, u: float, lam: float, u_out: float, dtype: torch.dtype
                    ) -> tuple[float, float, float]:
    """``(factor, det, tiny)`` of the GEMM threshold for one shape (cached: a few microseconds per call)."""
    key = (k, m, n, u, lam, u_out, dtype)
    hit = _CONSTANTS.get(key)
    if hit is None:
        if len(_CONSTANTS) >= 4 * _MAX_CACHED:
            _CONSTANTS.clear()
        # an output rounded to a half dtype (u_out) errs by up to half a subnormal spacing below the normal
        # range, where u_out |c| does not bound it: max(M, N) such terms in a row or column checksum
        tiny_out = max(m, n) * _OUT_SUBNORMAL.get(u_out, 0.0)
        hit = _CONSTANTS[key] = (gemm_factor(k, m, n, u, lam) + u_out, u * (k + math.log2(max(m, n, 2)) + 2.0),
                                 float(torch.finfo(dtype).tiny) * (k + m + n) + tiny_out)
    return hit


def _compiled_rows(rc: RowChecks) -> bool:
    """Whether the row checks of ``rc`` are computed by the compiled CPU kernels (:mod:`._kernels`)."""
    src = rc.src
    return CHECK_VECTORS == 2 and rc.a.device.type == "cpu" and \
        (isinstance(src, np.ndarray) or (src.device.type == "cpu" and src.dtype == torch.float32)) and \
        _kernels.available()


def _compiled_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a checked product of these operands can take the compiled CPU verdict with its arguments
    prepared before the product.

    Right after a large GEMM every Python-level operation costs 10-60 us on a 2-core x86 host (cold
    caches and predictors), more than the checksums' own memory traffic at n = 1024; so the output
    buffer, its NumPy view, the constants and the report are made before the product (written with
    ``out=``) and only the one kernel call is left after it. Not with autograd (``out=`` does not take it).
    """
    return _compiled_cpu(a, b) and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))


def _compiled_cpu(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the compiled CPU kernels can check these two float32 tensors (read through detached views).

    (Attribute tests only: right after a large product each Python-level operation costs microseconds,
    a generator over ``t.device.type`` some 10-30 us.)"""
    return a.is_cpu and b.is_cpu and a.dtype is torch.float32 and b.dtype is torch.float32 and \
        CHECK_VECTORS == 2 and _kernels.available()


def _np(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A CPU tensor's NumPy view (no copy) for the compiled kernels."""
    return t if isinstance(t, np.ndarray) else t.detach().numpy()


def _prime(enc: GemmEncoding, lam: float | None, u_out: float = 0.0) -> None:
    """Prepare the fast verdict of ``enc``'s row checks for ``verify_gemm(enc, c, lam=lam, u_out=u_out)``
    with an fp32 ``c`` (see :meth:`RowChecks.prime`), before the product."""
    rc = enc.rows
    if rc is not None and enc.cols is None and not enc.exact and enc.m and enc.n and not _compiled_rows(rc):
        key = (lam, None, u_out, torch.float32, (enc.m, enc.n))
        rc.prime(key, *_gemm_constants(rc.k, enc.m, enc.n, UNIT_ROUNDOFF[torch.float32],
                                       GEMM_LAMBDA if lam is None else lam, u_out, torch.float32))


def _verify_rows(rc: RowChecks, c: torch.Tensor, *, u: float, lam: float, u_out: float, exact_ratio: bool = False,
                 diff: np.ndarray | None = None) -> tuple[list[int], float, bool]:
    """Flagged rows (first 16), the largest ratio and whether a verdict was possible.

    ``exact_ratio`` skips the lower-bound thresholds, so that the ratio is exact (for calibration);
    ``diff`` is ``max_w |(W^T C^T - ref)_wi|`` when the caller has it already (no second pass over C).
    """
    m, n = c.shape
    if m == 0:
        return [], 0.0, True
    k = rc.k
    factor, det, tiny = _gemm_constants(k, m, n, u, lam, u_out, c.dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if diff is None:
            got = _host(check_weights(n, c.device, c.dtype) @ c.t(), f64=False)  # (P, M): one pass over C
            diff = np.abs(got - rc.ref).max(0)
        if exact_ratio:
            cand = np.arange(m)
            ratio = np.full(m, np.nan)
        else:
            ratio = diff / rc.lower_bound(factor, det, tiny)
            worst = float(ratio.max())  # NaN when anything is not finite
            if worst <= 1.0:
                return [], worst, True
            cand = np.flatnonzero(~(ratio <= 1.0))
        vmax = float(np.maximum(rc.vnorm, tiny).max())
        base = np.abs(rc.ref[0]) * det + tiny  # the same-sign term, exact
        d_c, base_c = diff[cand], base[cand]
        na = rc.row_norms(cand)
        thr = base_c + na * (factor * vmax)
        if exact_ratio or not bool((d_c <= thr).all()):  # exact ||r|| only when the exact ||a_i|| was not enough
            thr = base_c + na * (factor * rc.r_norm())
        valid = np.isfinite(rc.ref[:, cand]).all(0) & np.isfinite(thr)
        bad = ~(d_c <= thr) & valid
        ratio[cand] = np.where(valid, d_c / thr, 0.0)
    rows = cand[bad][:16].tolist()
    return rows, float(np.nan_to_num(ratio, nan=math.inf).max()), bool(valid.all())


@torch.no_grad()
def verify_gemm(enc: GemmEncoding, c: torch.Tensor, *, dtype: torch.dtype, lam: float | None = None,
                u: float | None = None, u_out: float = 0.0, op: str = "gemm", exact_ratio: bool = False,
                diff: np.ndarray | None = None) -> CheckReport:
    """Compare the computed product ``c`` (accumulator precision) with the encoding.

    ``u`` defaults to the unit roundoff of ``c.dtype``; ``u_out`` adds the rounding of an output
    that was rounded to a narrower dtype before the check; ``exact_ratio`` evaluates the exact
    threshold of every row (same verdict, exact ``max_ratio``, slower); ``diff`` is
    ``max_w |(W^T C^T - ref)_wi|`` per row when the caller computed it already. On the CPU the
    checksums of C and the lower-bound verdict are one compiled pass (:mod:`._kernels`), which the
    exact verdict reuses, so both read the same checksums. Returns a :class:`CheckReport`.
    """
    rc = enc.rows
    fast = rc.fast if rc is not None else None
    lower_bound = not exact_ratio and not enc.exact and rc is not None and enc.cols is None
    if diff is None and rc is not None and not enc.exact and c.device.type == "cpu" and c.dtype == torch.float32 \
            and c.shape[0] and c.is_contiguous() and _compiled_rows(rc):
        consts = _gemm_constants(rc.k, c.shape[0], c.shape[1], UNIT_ROUNDOFF[c.dtype] if u is None else u,
                                 GEMM_LAMBDA if lam is None else lam, u_out, c.dtype)
        got = np.empty((2, c.shape[0]))
        worst = _kernels.gemm_lower(_np(c), _np(check_weights(c.shape[1], c.device, c.dtype)), _np(rc.src),
                                    rc.vnorm, *consts, got)
        if lower_bound and worst <= 1.0:  # NaN (something not finite) falls through to the full check
            return CheckReport(op, _dt(dtype), False, worst, True, [], [], None, (enc.m, enc.k, enc.n))
        with np.errstate(invalid="ignore"):  # the full check reuses these checksums: no second pass over C
            diff = np.abs(got - rc.ref).max(0)
    elif diff is None and lower_bound and fast is not None and fast[0] == (lam, u, u_out, c.dtype, tuple(c.shape)):
        # primed (RowChecks.prime): W^T C^T - ref in the one pass over C, then the largest
        # |difference| / lower-bound threshold; 2^-15 below 1 covers the fp32 rounding of that bound,
        # of its reciprocal and of the difference
        d = torch.addmm(fast[1], fast[3], c.t())
        worst = float((d * fast[2]).abs_().max())  # (vector_norm(ord=inf) is 2-3x slower on the CPU)
        if worst <= 1.0 - 2.0**-15:  # NaN (something not finite) falls through to the full check
            return CheckReport(op, _dt(dtype), False, worst, True, [], [], None, (enc.m, enc.k, enc.n))
        with np.errstate(invalid="ignore"):  # the full check reuses the difference: no second pass over C
            diff = np.abs(_host(d)).max(0)
    shape = (enc.m, enc.k, enc.n)
    rows: list[int] = []
    cols: list[int] = []
    if enc.exact:  # int64-accumulated sums of the int32 product: exact (|sum| <= 2^31 max(M, N) < 2^63)
        rows = torch.nonzero(c.sum(1, dtype=torch.int64) != enc.ref_row).flatten().tolist()
        cols = torch.nonzero(c.sum(0, dtype=torch.int64) != enc.ref_col).flatten().tolist()
        alarm = bool(rows or cols)
        loc = (rows[0], cols[0]) if rows and cols else None
        return CheckReport(op, _dt(dtype), alarm, math.inf if alarm else 0.0, True, rows[:16], cols[:16], loc, shape)
    lam = GEMM_LAMBDA if lam is None else lam
    u = UNIT_ROUNDOFF[c.dtype] if u is None else u
    ratios: list[float] = []
    checked = True
    if enc.rows is not None:
        rows, r, ok = _verify_rows(enc.rows, c, u=u, lam=lam, u_out=u_out, exact_ratio=exact_ratio, diff=diff)
        ratios.append(r)
        checked &= ok
    col_enc = enc.cols
    if col_enc is None and rows and enc.locate and enc.rows is not None:
        col_enc = _col_checks(enc.rows.a, enc.rows.b, enc.bias)  # only after an alarm: locate it
    if col_enc is not None:
        cols, r, ok = _verify_rows(col_enc, c.t(), u=u, lam=lam, u_out=u_out, exact_ratio=exact_ratio)
        ratios.append(r)
        checked &= ok
    alarm = bool(rows or cols)
    loc = (rows[0], cols[0]) if rows and cols else None
    return CheckReport(op, _dt(dtype), alarm, max(ratios) if ratios else 0.0, checked, rows, cols, loc, shape)


def _accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product in the accumulation dtype on the device: int8 -> the exact int32 product of the device's
    int8 GEMM (:func:`.exact.int8_mm`); bf16/fp16 -> the fp32 accumulator of the device's own half-precision
    GEMM where it has one with an fp32 output (:func:`.half.device_half_mm`), else the fp32 GEMM of the
    upcast operands (exact products, fp32 sums); fp32 -> ``a @ b``."""
    if a.dtype == torch.int8:
        return exact.int8_mm(a, b)
    if a.dtype in half.HALF:
        acc = half.device_half_mm(a, b)
        return acc if acc is not None else a.float() @ b.float()
    return a @ b


def half_kind(a: torch.Tensor) -> str:
    """How :func:`checked_mm` computes and checks a bf16/fp16 product of ``a`` now: ``fp32_out`` (the device's
    half GEMM with fp32 output) or ``upcast`` (fp32 GEMM of the upcast operands; this backend has no half
    GEMM with fp32 output). Probes the device once (a tiny product) where it is not known yet."""
    if half.missing(a.device):
        return "upcast"
    probe = torch.zeros((1, 1), dtype=a.dtype, device=a.device)
    return "fp32_out" if half.device_half_mm(probe, probe) is not None else "upcast"


#: A compiled exact verdict (fp64-accumulated norms) is taken as clean only below this ratio; above it
#: the NumPy/torch exact path decides, with its own norms, so that both always reach one verdict.
_CLEAR = 1.0 - 2.0**-10


_MM_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _mm_plan(m: int, k: int, n: int, lam: float | None) -> tuple[Any, ...]:
    """What a compiled checked ``(m x k) @ (k x n)`` needs besides its operands: the check weights'
    NumPy view, the threshold's constants and the kernels (cached per shape: every Python-level
    operation around a large GEMM costs 10-60 us on this host)."""
    key = (m, k, n, lam)
    plan = _MM_PLANS.get(key)
    if plan is None:
        if len(_MM_PLANS) >= _MAX_CACHED:
            _MM_PLANS.clear()
        consts = _gemm_constants(k, m, n, UNIT_ROUNDOFF[torch.float32], GEMM_LAMBDA if lam is None else lam, 0.0,
                                 torch.float32)
        plan = _MM_PLANS[key] = (_np(check_weights(n, torch.device("cpu"), torch.float32)), consts,
                                 _kernels.raw("b_pass"), _kernels.raw("a_pass"), _kernels.raw("mm_exact"))
    return plan


def _compiled_mm(a32: torch.Tensor, b32: torch.Tensor, dtype: torch.dtype, lam: float | None
                 ) -> tuple[torch.Tensor, CheckReport]:
    """:func:`checked_mm` with the compiled CPU kernels: before the product, one pass over B (``B W`` and
    ``|B| e``) and one over A (the reference and the exact row norms); after it, one pass over C and the
    verdict against the exact threshold, in one call, with everything it needs prepared before."""
    (m, k), n = a32.shape, b32.shape[1]
    wt, consts, b_pass, a_pass, mm_exact = _mm_plan(m, k, n, lam)
    vt, buf = np.empty((2, k), np.float32), np.empty((6, max(m, k)))
    ref, got, na, r = buf[0:2, :m], buf[2:4, :m], buf[4, :m], buf[5, :k]
    rnorm = math.sqrt(b_pass(0, k, b32.detach().numpy(), wt, vt, r))
    a_pass(0, m, a32.detach().numpy(), vt, ref, na)
    acc = torch.empty((m, n), dtype=torch.float32, device="cpu")
    torch.mm(a32, b32, out=acc)
    worst = mm_exact(0, m, acc.numpy(), wt, ref, na, rnorm, *consts, got)
    out = acc if dtype == torch.float32 else acc.to(dtype)
    if worst <= _CLEAR:  # NaN (something not finite) falls through to the full check
        return out, CheckReport("gemm", _dt(dtype), False, float(worst), True, [], [], None, (m, k, n))
    vnorm = np.sqrt(np.square(vt.astype(np.float64)).sum(1))
    enc = GemmEncoding(m, k, n, RowChecks(ref, vnorm, a32, b32, rnorm=rnorm))
    with np.errstate(invalid="ignore"):  # the full check reuses the kernel's checksums
        diff = np.abs(got - ref).max(0)
    return out, verify_gemm(enc, acc, dtype=dtype, lam=lam, diff=diff)


def checked_mm(a: torch.Tensor, b: torch.Tensor, *, checks: str = "row", lam: float | None = None,
               check_rounded: bool = False, exact_ratio: bool = False) -> tuple[torch.Tensor, CheckReport]:
    """``a @ b`` with weighted row checksums (``checks``: ``row``, ``col`` or ``both``); returns ``(c, report)``.

    fp32: checked as computed. bf16/fp16: accumulated and checked in fp32, then rounded to the input
    dtype; the accumulator is the device's own half-precision GEMM with fp32 output where the backend
    has one (:func:`.half.device_half_mm`: CUDA), else the fp32 GEMM of the upcast operands (the CPU).
    ``check_rounded=True`` runs the device's half-precision GEMM with its rounded output
    (:func:`.half.rounded_half_mm`, every backend) and checks that output, its rounding in the
    threshold (weaker: a flip below the rounding bound of its row goes unseen; an output that
    overflows the half dtype differs from the product and reads as an alarm).
    int8: the int32 product of the device's int8 GEMM, exact row and column checks.
    """
    if checks == "row" and not exact_ratio and not check_rounded and a.dim() == 2 and b.dim() == 2 and \
            a.shape[1] == b.shape[0] and a.shape[0] and _compiled_ok(a, b):  # (fp32 on the CPU: the hot path first)
        return _compiled_mm(a, b, a.dtype, lam)
    _check_2d(a, b)
    if a.dtype != b.dtype:
        raise UsageError(f"checked_mm needs one dtype, got {a.dtype} and {b.dtype}")
    if checks not in ("row", "col", "both"):
        raise UsageError(f"checks must be row, col or both, got {checks!r}")
    if a.dtype not in (*_FLOATS, torch.int8):
        raise UsageError(f"checked_mm supports float32, bfloat16, float16 and int8, got {a.dtype}")
    if a.dtype == torch.int8:
        enc = encode_gemm(a, b, checks)
        c = _accumulate(a, b)
        return c, verify_gemm(enc, c, dtype=a.dtype, op="gemm")
    is_half = a.dtype in half.HALF
    a32, b32 = (a, b) if a.dtype == torch.float32 else (a.float(), b.float())
    if is_half and check_rounded:
        enc = encode_gemm(a32, b32, checks)
        out = half.rounded_half_mm(a, b)
        return out, verify_gemm(enc, out.float(), dtype=a.dtype, lam=lam, u=half.accumulation_u(a),
                                u_out=UNIT_ROUNDOFF[a.dtype], op="gemm_rounded", exact_ratio=exact_ratio)
    if checks == "row" and not exact_ratio and a32.shape[0] and (not is_half or half.missing(a.device)) and \
            _compiled_ok(a32, b32):
        return _compiled_mm(a32, b32, a.dtype, lam)
    enc = encode_gemm(a32, b32, checks)
    if not exact_ratio:
        _prime(enc, lam)
    acc = half.device_half_mm(a, b) if is_half else None
    u = None  # (the unit roundoff of c's dtype, fp32, unless the device's half GEMM accumulates otherwise)
    if acc is None:
        acc = a32 @ b32
    elif half.accumulation_u(a) != UNIT_ROUNDOFF[torch.float32]:
        u = half.accumulation_u(a)
    if a.dtype == torch.float32:
        return acc, verify_gemm(enc, acc, dtype=a.dtype, lam=lam, exact_ratio=exact_ratio)
    return acc.to(a.dtype), verify_gemm(enc, acc, dtype=a.dtype, lam=lam, u=u, exact_ratio=exact_ratio)


# ----------------------------------------------------------------------------- Linear

@dataclass
class LinearEncoding:
    """The weight side of a checked ``F.linear(x, W, b)``, computed once per weight version.

    ``w``/``bias`` are the weight and bias in the accumulation dtype (the originals when fp32);
    ``vt`` (P x K) is ``W_chk^T W``, ``vw`` (P,) ``W_chk^T b``, ``vnorm`` the row norms of
    ``[vt | vw]`` and ``rnorm`` the norm of ``[|W|^T e; sum|b|]``.
    """

    w: torch.Tensor
    bias: torch.Tensor | None
    vt: torch.Tensor
    vw: torch.Tensor | None
    vnorm: np.ndarray
    rnorm: float

    @functools.cached_property
    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(vt, vw, W_chk^T)`` as NumPy views for the compiled CPU check (``vw`` empty without a bias)."""
        wt = check_weights(self.w.shape[0], self.w.device, torch.float32)
        return (_np(self.vt), _np(self.vw) if self.vw is not None else np.zeros(0, np.float32), _np(wt))

    def plan(self, m: int, lam: float | None, u: float | None, u_out: float) -> tuple[Any, ...]:
        """``(*views, threshold constants)`` of a compiled check of ``m`` input rows (cached: the call is on
        the hot path of every checked Linear)."""
        plans = self.__dict__.setdefault("_plans", {})
        key = (m, lam, u, u_out)
        hit = plans.get(key)
        if hit is None:
            k, n = self.w.shape[1], self.w.shape[0]
            if len(plans) >= _MAX_CACHED:
                plans.clear()
            hit = plans[key] = (*self.views, _gemm_constants(k + (self.bias is not None), m, n,
                                                             UNIT_ROUNDOFF[torch.float32] if u is None else u,
                                                             GEMM_LAMBDA if lam is None else lam, u_out, torch.float32))
        return hit


def encode_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearEncoding:
    """Encode a Linear layer's weight (N x K) and bias (N,) for :func:`verify_linear`."""
    if weight.dim() != 2 or (bias is not None and bias.shape != (weight.shape[0],)):
        raise UsageError(f"encode_linear needs an (N, K) weight and an (N,) bias, got {tuple(weight.shape)}"
                         f"{'' if bias is None else ' and ' + str(tuple(bias.shape))}")
    if weight.dtype not in _FLOATS:
        raise UsageError(f"checked Linear supports float32, bfloat16 and float16 weights, got {weight.dtype}")
    with torch.no_grad():
        w = weight.detach().float()
        b = bias.detach().float() if bias is not None else None
        wt = check_weights(w.shape[0], w.device, w.dtype)
        vt = wt @ w
        vw = wt @ b if b is not None else None
        vnorm = _vnorm(vt, vw) if vw is not None else _vnorm(vt)
        rnorm = RowChecks(np.zeros((CHECK_VECTORS, 0)), vnorm, w[:0], w.t(), b).r_norm()
        return LinearEncoding(w, b, vt, vw, vnorm, rnorm)


def verify_linear(enc: LinearEncoding, x2: torch.Tensor, y2: torch.Tensor, *, dtype: torch.dtype,
                  lam: float | None = None, u: float | None = None, u_out: float = 0.0,
                  op: str = "linear", exact_ratio: bool = False) -> CheckReport:
    """Check ``y2 = x2 W^T + b`` (2-D, accumulation dtype) against the layer's encoding; returns a report.

    Costs one pass over ``x2`` (the reference checksums) and one over ``y2``; on the CPU both, the
    input's row norms and the verdict against the exact threshold are one compiled pass (:mod:`._kernels`).
    """
    n, k = enc.w.shape
    if x2.dim() != 2 or y2.dim() != 2 or x2.shape[1] != k or y2.shape != (x2.shape[0], n):
        raise UsageError(f"verify_linear needs x (M, {k}) and y (M, {n}), got {tuple(x2.shape)} and {tuple(y2.shape)}")
    with torch.no_grad():
        if x2.shape[0] and _compiled_cpu(x2, y2):  # (no out=: autograd is no obstacle here)
            return _CompiledLinear(enc, x2, y2, dtype=dtype, lam=lam, u=u, u_out=u_out, op=op).verdict(exact_ratio)
        ref = torch.addmm(enc.vw[:, None], enc.vt, x2.t()) if enc.vw is not None else enc.vt @ x2.t()
        rc = RowChecks(ref, enc.vnorm, x2, enc.w.t(), enc.bias, None, enc.rnorm)
        ge = GemmEncoding(x2.shape[0], x2.shape[1], enc.w.shape[0], rows=rc, bias=enc.bias)
        return verify_gemm(ge, y2, dtype=dtype, lam=lam, u=u, u_out=u_out, op=op, exact_ratio=exact_ratio)


class _CompiledLinear:
    """The compiled CPU verdict of one Linear call ``y2 = x2 W^T + b``, prepared (NumPy views, constants,
    buffers, report) before the product writes ``y2``; :meth:`verdict` is then one kernel call (see
    _compiled_ok: each Python-level operation here is on the hot path)."""

    def __init__(self, enc: LinearEncoding, x2: torch.Tensor, y2: torch.Tensor | None, *, dtype: torch.dtype,
                 lam: float | None, u: float | None, u_out: float, op: str) -> None:
        self.enc, self.x2, self.y2 = enc, x2, y2
        self.opts = (dtype, lam, u, u_out, op)
        self.buf = np.empty((5, x2.shape[0]))  # ref (2 rows), got (2), the input's row norms (1)
        self.vt, self.vw, self.wt, self.consts = enc.plan(x2.shape[0], lam, u, u_out)
        self.x_np = x2.detach().numpy()
        self.y_np = None if y2 is None else y2.detach().numpy()

    def bind(self, y2: torch.Tensor) -> None:
        """Set the output ``y2`` of a check made with ``y2=None`` (whose :meth:`reference` ran before the
        product)."""
        self.y2, self.y_np = y2, y2.detach().numpy()

    def reference(self) -> None:
        """The pass over x alone (the reference and the input's row norms), before the product: measured
        side by side (n = 1024, this CPU) 0.9% of the Linear cheaper than reading x after it."""
        buf = self.buf
        _kernels.raw("x_pass")(0, buf.shape[1], self.x_np, self.vt, self.vw, buf[0:2], buf[4])

    def verdict(self, exact_ratio: bool = False, *, referenced: bool = False) -> CheckReport:
        """The verdict on y (after :meth:`reference`: the pass over y alone, else over x and y)."""
        buf, m = self.buf, self.buf.shape[1]
        if referenced:
            worst = _kernels.raw("mm_exact")(0, m, self.y_np, self.wt, buf[0:2], buf[4], self.enc.rnorm, *self.consts,
                                             buf[2:4])
        else:
            worst = _kernels.raw("linear_exact")(0, m, self.x_np, self.vt, self.vw, self.y_np, self.wt, self.enc.rnorm,
                                                 *self.consts, buf[0:2], buf[2:4], buf[4])
        enc, x2 = self.enc, self.x2
        dtype, lam, u, u_out, op = self.opts
        if not exact_ratio and worst <= _CLEAR:  # NaN (something not finite) falls through to the full check
            return CheckReport(op, _dt(dtype), False, float(worst), True, [], [], None,
                               (x2.shape[0], x2.shape[1], enc.w.shape[0]))
        ref = self.buf[0:2]
        with np.errstate(invalid="ignore"):  # the full check reuses the kernel's checksums
            diff = np.abs(self.buf[2:4] - ref).max(0)
        rc = RowChecks(ref, enc.vnorm, x2, enc.w.t(), enc.bias, None, enc.rnorm)
        ge = GemmEncoding(x2.shape[0], x2.shape[1], enc.w.shape[0], rows=rc, bias=enc.bias)
        return verify_gemm(ge, self.y2, exact_ratio=exact_ratio, diff=diff, dtype=dtype, lam=lam, u=u, u_out=u_out,
                           op=op)


class _LinearCache:
    """Encodings of the weights :func:`checked_linear` saw, keyed by identity and version (weakly held)."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[Any, Any, tuple[Any, ...], LinearEncoding]] = {}

    def get(self, weight: torch.Tensor, bias: torch.Tensor | None) -> LinearEncoding:
        # (a new dtype, device or shape comes with new storage: the data pointers cover them)
        key = (weight._version, weight.data_ptr(), weight.shape,
               None if bias is None else (bias._version, bias.data_ptr()))
        hit = self.entries.get(id(weight))
        if hit is not None and hit[0]() is weight and (hit[1]() if hit[1] is not None else None) is bias \
                and hit[2] == key:
            return hit[3]
        enc = encode_linear(weight, bias)
        if len(self.entries) >= _MAX_CACHED:
            self.entries.clear()
        if hit is None:  # the encoding (which shares the weight's storage) goes when the weight goes
            weakref.finalize(weight, self.entries.pop, id(weight), None)
        self.entries[id(weight)] = (weakref.ref(weight), weakref.ref(bias) if bias is not None else None, key, enc)
        return enc


_LINEARS = _LinearCache()


def checked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   lam: float | None = None, encoding: LinearEncoding | None = None, exact_ratio: bool = False
                   ) -> tuple[torch.Tensor, CheckReport]:
    """``F.linear(x, weight, bias)`` checked like a GEMM (x flattened to 2-D); returns ``(y, report)``.

    The weight side is encoded once per weight version (``encoding``, or a cache keyed by the
    weight tensor itself), so a call costs the product, one pass over ``x`` and one over ``y``.
    """
    enc = encoding if encoding is not None else _LINEARS.get(weight, bias)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if x2.dtype != enc.w.dtype:
        x2 = x2.to(enc.w.dtype)
    if not exact_ratio and x2.shape[0] and x2.shape[1] == enc.w.shape[1] and _compiled_ok(x2, enc.w):
        # the compiled CPU verdict prepared before the product, which writes into its buffer
        acc = torch.empty((x2.shape[0], enc.w.shape[0]), dtype=torch.float32, device="cpu")
        run = _CompiledLinear(enc, x2, acc, dtype=x.dtype, lam=lam, u=None, u_out=0.0, op="linear")
        run.reference()
        if enc.bias is not None:
            torch.addmm(enc.bias, x2, enc.w.t(), out=acc)  # what F.linear computes for 2-D input
        else:
            torch.mm(x2, enc.w.t(), out=acc)
        rep = run.verdict(referenced=True)
    else:
        acc = F.linear(x2, enc.w, enc.bias)
        # the pass over x after the product, not before it as for checked_mm: measured side by side
        # (n = 1024, this CPU) the Linear costs ~4% more when x is read ahead of F.linear
        rep = verify_linear(enc, x2, acc, dtype=x.dtype, lam=lam, exact_ratio=exact_ratio)
    y = acc if acc.dtype == x.dtype else acc.to(x.dtype)
    return (y if x.dim() == 2 else y.reshape(*x.shape[:-1], enc.w.shape[0])), rep


# ----------------------------------------------------------------------------- EmbeddingBag

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
        w64 = weight.detach().double()
        return cls.from_rows(w64.sum(1), w64.abs().sum(1))


@dataclass
class CheckedTable:
    """An fp32 embedding table with its :class:`EmbeddingChecks` (built once by :func:`checked_table`)."""

    weight: torch.Tensor
    checks: EmbeddingChecks

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    def fused(self) -> _FusedTable | None:
        """The table as the fused compiled lookup reads it (cached while ``weight`` is this tensor)."""
        return _cached_fused(self, self.weight, self.checks, self.dim)


def checked_table(weight: torch.Tensor) -> CheckedTable:
    """Wrap an fp32 (R x D) table for :func:`checked_embedding_bag` (checksums computed in fp64)."""
    if weight.dim() != 2 or weight.dtype != torch.float32:
        raise UsageError(f"checked_table needs a 2-D float32 table, got {tuple(weight.shape)} {weight.dtype}")
    return CheckedTable(weight.detach(), EmbeddingChecks.of(weight))


def _bag_lengths(indices: torch.Tensor, offsets: torch.Tensor, n_bags: int) -> torch.Tensor:
    return torch.diff(offsets[:n_bags], append=offsets.new_full((1,), indices.numel())) if n_bags else offsets[:0]


_TINY32 = float(torch.finfo(torch.float32).tiny)


def _pooled(col: torch.Tensor, idx: torch.Tensor, off: torch.Tensor | None, mode: str, n_bags: int,
            psw: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """Per-bag pooling of a per-row column ``col`` (R x 1) over the lookup (a (bags,) tensor on the
    column's device) and whether it was summed in fp64 (True) or in fp32 (False).

    On the CPU the column is gathered with ``index_select`` (4 bytes per index, about half the cost
    of a second EmbeddingBag call) and the bags summed by a reshape in fp32 when they are uniform,
    else in fp64 by ``np.add.reduceat``; elsewhere an EmbeddingBag over the column does both.
    """
    if mode == "none":
        return col[:, 0].index_select(0, idx.reshape(-1)), True
    if col.device.type != "cpu":
        return F.embedding_bag(idx, col, off, mode=mode, per_sample_weights=psw)[:, 0], False
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
    :mod:`._kernels`; the exact path then reuses its sums) and in a few device operations elsewhere.
    Only when a bag fails it are ``a_b`` and ``L_b`` gathered for the exact threshold, so
    ``max_ratio`` of a clean report is an upper bound of the exact ``|diff| / thr``.
    """
    d = out.shape[-1]
    dt = dtype or _dt(out.dtype)
    shape = shape or tuple(out.shape)
    if mode not in ("sum", "mean", "none"):  # max pooling is not linear: no checksum
        return CheckReport(op, dt, False, 0.0, False, shape=shape)
    out2 = out.reshape(-1, d)
    if out2.dtype != torch.float32:
        out2 = out2.float()
    nb = out2.shape[0]
    if not nb:
        return CheckReport(op, dt, False, 0.0, True, shape=shape)
    if mode == "none":
        idx, off, psw = indices.reshape(-1), None, None
    else:
        (idx, off), psw = _bags_args(indices, offsets), per_sample_weights
        if psw is not None and psw.dim() == 2:
            psw = psw.reshape(-1)
    bag = _Bags(checks, idx, off, mode, psw, nb, d, extra, u_out, lam, op, dt, shape)
    if mode != "none" and _compiled_bags_ok(out2, checks):
        return _CompiledBags(bag).verdict(out2, exact_ratio)
    return _bag_exact(bag, out2, exact_ratio)


@dataclass
class _Bags:
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

    @property
    def constants(self) -> tuple[float, float, float]:
        """``(k, tiny, c_lb)``: ``lam u``, the underflow term and the factor of the lower bound
        ``lb_b = c_lb ||out_b||_2 + tiny`` of a bag's exact threshold (see :func:`verify_bag_output`)."""
        return _bag_constants(self.idx.numel(), self.d, self.extra, self.u_out, self.lam)


_BAG_CONSTANTS: dict[tuple[Any, ...], tuple[float, float, float]] = {}


def _bag_constants(n: int, d: int, extra: float, u_out: float, lam: float | None) -> tuple[float, float, float]:
    """:attr:`_Bags.constants` for ``n`` indices (cached: the call is on the hot path of every lookup)."""
    key = (n, d, extra, u_out, lam)
    hit = _BAG_CONSTANTS.get(key)
    if hit is None:
        u = UNIT_ROUNDOFF[torch.float32]
        k = (EMBEDDING_LAMBDA if lam is None else lam) * u
        c_lb = (k * (d + extra) + u_out) * max(0.0, 1.0 - (max(n, 1) + d + 2) * u - u_out) * (1.0 - 2.0**-16)
        if len(_BAG_CONSTANTS) >= 4 * _MAX_CACHED:
            _BAG_CONSTANTS.clear()
        hit = _BAG_CONSTANTS[key] = (k, _TINY32 * (d + 2), c_lb)
    return hit


def _compiled_bags_ok(out2: torch.Tensor, checks: EmbeddingChecks) -> bool:
    return out2.device.type == "cpu" and checks.rowsum.device.type == "cpu" and _kernels.available()


class _CompiledBags:
    """The compiled CPU verdict of one EmbeddingBag call, prepared before the lookup (NumPy views,
    constants, report) so that only one kernel call follows it (see :func:`_compiled_ok`)."""

    def __init__(self, bag: _Bags) -> None:
        # (every operation here is on the hot path of a lookup of ~1 ms: NumPy views of the index
        # tensors as they are, strided or not, and cached constants)
        self.bag = bag
        _, tiny, c_lb = bag.constants
        self.buf = np.empty((2, bag.nb))  # per-bag reference and output sums
        self.psw = _kernels.NO_WEIGHTS if bag.psw is None else bag.psw.detach().numpy()
        self.idx, self.off, self.rowsum = bag.idx.numpy(), bag.off.numpy(), bag.checks.rowsum_view()
        self.consts = (c_lb, tiny, self.buf[0], self.buf[1])
        self.report = CheckReport(bag.op, bag.dtype, False, 0.0, True, [], [], None, bag.shape)

    def verdict(self, out2: torch.Tensor, exact_ratio: bool = False) -> CheckReport:
        """Verdict on the (bags x D) float32 CPU output of the lookup."""
        worst = float(_kernels.raw("bag_verdict")(0, self.bag.nb, out2.detach().numpy(), self.idx, self.off,
                                                  self.rowsum, self.psw, self.bag.mode == "mean", *self.consts))
        return self._decide(worst, out2, exact_ratio)

    def _decide(self, worst: float, out2: torch.Tensor, exact_ratio: bool) -> CheckReport:
        if worst == -1.0:  # an index or offset out of range: the torch path reports it
            return _bag_exact(self.bag, out2, exact_ratio)
        if not exact_ratio and worst <= _CLEAR:  # NaN (something not finite) falls through; near 1: exact path
            self.report.max_ratio = worst
            return self.report
        return _bag_exact(self.bag, out2, exact_ratio, (self.buf[0], self.buf[1]))


@dataclass(frozen=True)
class _FusedTable:
    """What the fused compiled lookup needs of a table, checked once per table (see :func:`fused_table`)."""

    tensor: torch.Tensor
    view: np.ndarray
    rowsum: np.ndarray
    checks: EmbeddingChecks
    d: int
    quantized: bool


def fused_table(table: torch.Tensor, checks: EmbeddingChecks, d: int) -> _FusedTable | None:
    """The :class:`_FusedTable` of a float32 (R x D) or 8-bit row-wise uint8 (R x (D + 8)) CPU table, or
    None where the fused lookup cannot read it (another device or dtype, not contiguous)."""
    quantized = table.dtype == torch.uint8
    if table.device.type != "cpu" or table.dim() != 2 or not table.is_contiguous() or \
            table.shape[1] != d + (8 if quantized else 0) or table.dtype not in (torch.float32, torch.uint8) or \
            checks.rowsum.device.type != "cpu" or checks.rowsum.shape[0] != table.shape[0]:
        return None
    return _FusedTable(table, table.detach().numpy(), checks.rowsum_view(), checks, d, quantized)


def _cached_fused(owner: Any, table: torch.Tensor, checks: EmbeddingChecks, d: int) -> _FusedTable | None:
    hit = owner.__dict__.get("_fused")
    if hit is None or hit[0] is not table or hit[1] is not checks:
        hit = owner.__dict__["_fused"] = (table, checks, fused_table(table, checks, d))
    return hit[2]


_INDEX_DTYPES = (torch.int64, torch.int32)


class _FusedCall:
    """One EmbeddingBag call (the bags of a :class:`_Bags`) by the fused compiled lookup (``bag_lookup`` of
    :mod:`._compiled`): the lookup itself, bitwise torch's, with each bag's reference (the row sums
    gathered with the same indices) summed in the same pass and, with ``check``, the output's sums and
    the verdict.

    :meth:`of` returns None where torch's lookup must run instead: autograd recording, indices that are
    not a contiguous 1-D CPU int32/int64 tensor with offsets of the same dtype, per-sample weights with
    mean pooling (torch refuses them), not float32 or strided (torch then pools with another kernel), a
    TorchDispatchMode or TorchFunctionMode active (a fault simulated on torch's operators, or a default
    device, must reach the lookup), or where this torch build's kernels were found to round differently
    (:func:`_fused_lookups_agree`). Every operation here is on the hot path of a ~1 ms lookup. A verdict
    within ``2^-10`` of its threshold is left to the exact path (:func:`_bag_exact`), so both agree.
    """

    __slots__ = ("ft", "bag", "consts", "buf")

    @classmethod
    def of(cls, ft: _FusedTable | None, bag: _Bags) -> _FusedCall | None:
        idx, off, psw = bag.idx, bag.off, bag.psw
        if ft is None or bag.checks is not ft.checks or bag.d != ft.d or bag.u_out or off is None or \
                torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled() or \
                idx.dtype not in _INDEX_DTYPES or \
                off.dtype != idx.dtype or idx.dim() != 1 or off.dim() != 1 or not idx.is_cpu or not off.is_cpu or \
                not bag.nb or bag.mode not in ("sum", "mean") or not idx.is_contiguous() or \
                not off.is_contiguous() or not _kernels.available():
            return None
        if psw is not None and (bag.mode != "sum" or psw.dtype != torch.float32 or psw.shape != idx.shape or
                                not psw.is_cpu or not psw.is_contiguous()):
            return None  # (torch pools strided weights with another kernel, which rounds otherwise)
        if torch.is_grad_enabled() and (ft.tensor.requires_grad or (psw is not None and psw.requires_grad)):
            return None
        if not _fused_lookups_agree(ft.quantized, psw is not None):
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
        worst = _kernels.raw("bag_lookup")(0, bag.nb, ft.view, bag.idx.numpy(), bag.off.numpy(), out.numpy(),
                                           ft.rowsum, None if bag.psw is None else bag.psw.detach().numpy(),
                                           bag.mode == "mean", check, c_lb, tiny, buf[0], buf[1])
        if worst == -1.0:
            out = lookup()
            return out, _bag_exact(bag, out.reshape(-1, ft.d).float(), False)
        return out, self._decide(float(worst), out) if check else None

    def verdict(self, out2: torch.Tensor) -> CheckReport:
        """Verdict on the (bags x D) float32 output of :meth:`run` without ``check``, as it is now (a flip
        since the lookup is seen), against the references the kernel wrote."""
        worst = _kernels.raw("bag_out_verdict")(0, self.bag.nb, out2.detach().numpy(), self.buf[0], *self.consts,
                                                self.buf[1])
        return self._decide(float(worst), out2)

    def _decide(self, worst: float, out2: torch.Tensor) -> CheckReport:
        bag = self.bag
        if worst <= _CLEAR:  # NaN (something not finite) falls through; near 1 the exact path decides
            return CheckReport(bag.op, bag.dtype, False, worst, True, [], [], None, bag.shape)
        return _bag_exact(bag, out2, False, (self.buf[0], self.buf[1]))


_AGREE: dict[tuple[bool, bool], bool] = {}


def _fused_lookups_agree(quantized: bool, weighted: bool) -> bool:
    """Whether the fused kernel (8-bit or fp32 table, with or without per-sample weights) pools bitwise as
    this torch build's CPU EmbeddingBag does (sum and mean, ragged and empty bags, chunks of 128, 64, 16
    and single columns), checked once per process: the fused path replaces torch's lookup only where it
    returns the very same output."""
    hit = _AGREE.get((quantized, weighted))
    if hit is not None:
        return hit
    g = torch.Generator().manual_seed(0x5EED)
    ok = True
    kernel = _kernels._kernels()["bag_lookup"]  # (not raw(): this once-per-process check is no hot path)
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


def _bag_exact(bag: _Bags, out2: torch.Tensor, exact_ratio: bool,
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
        ref, got_h = _host(ref_t), _host(got)
    else:
        (ref, got_h), ref64 = compiled, True
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff_h = np.abs(got_h - ref)
        psw_abs = psw.abs() if psw is not None else None
        ab = _host(_pooled(bag.checks.absum, idx, off, mode, nb, psw_abs)[0])
        lens = np.ones(nb) if mode == "none" else _host(_bag_lengths(idx, off, nb))
        thr = (k * (lens * (1.0 if ref64 else 2.0) + (d + bag.extra)) + bag.u_out) * ab + tiny
        valid = np.isfinite(ref) & np.isfinite(thr)
        bad = ~(diff_h <= thr) & valid
        ratio = np.where(valid, diff_h / thr, 0.0)
    rows = np.flatnonzero(bad)[:16].tolist()
    return CheckReport(bag.op, bag.dtype, bool(rows), float(np.nan_to_num(ratio, nan=math.inf).max()),
                       bool(valid.all()), rows, [], None, bag.shape)


def _bags_args(indices: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if indices.dim() == 2:
        if offsets is not None:
            raise UsageError("2-D indices are bags of equal length: they take no offsets")
        b, L = indices.shape
        return indices.reshape(-1), torch.arange(0, b * L, L, device=indices.device)
    if offsets is None:
        raise UsageError("1-D indices need offsets")
    return indices, offsets


def checked_embedding_bag(table: CheckedTable, indices: torch.Tensor, offsets: torch.Tensor | None = None,
                          mode: str = "sum", *, per_sample_weights: torch.Tensor | None = None,
                          lam: float | None = None, exact_ratio: bool = False) -> tuple[torch.Tensor, CheckReport]:
    """EmbeddingBag (sum or mean) over a :func:`checked_table`; returns ``(out, report)``.

    Costs, beside the lookup, a gather of the R x 1 row sums with the same indices and one pass over
    the (bags x D) output (see :func:`verify_bag_output`). On the CPU, without autograd, the lookup
    itself is a compiled kernel that returns torch's output bitwise and gathers the row sums and checks
    the bags in the same pass (:class:`_FusedCall`); otherwise torch's lookup runs, followed on the CPU
    by one compiled call prepared before it.
    """
    if mode not in ("sum", "mean"):
        raise UsageError(f"checked_embedding_bag supports sum and mean pooling, got {mode!r}")
    idx, off = _bags_args(indices, offsets)
    if per_sample_weights is not None and per_sample_weights.dim() == 2:  # (weights of 2-D indices, as torch)
        per_sample_weights = per_sample_weights.reshape(-1)
    bag = _Bags(table.checks, idx, off, mode, per_sample_weights, off.shape[0], table.dim, 4.0, 0.0, lam,
                f"embedding_bag_{mode}", "float32", (table.weight.shape[0], table.dim, off.shape[0]))

    def lookup() -> torch.Tensor:
        return F.embedding_bag(idx, table.weight, off, mode=mode, per_sample_weights=per_sample_weights)

    call = None if exact_ratio else _FusedCall.of(table.fused(), bag)
    return call.run(lookup) if call is not None else _checked_lookup(bag, exact_ratio, lookup)


def _checked_lookup(bag: _Bags, exact_ratio: bool, lookup: Callable[[], torch.Tensor]
                    ) -> tuple[torch.Tensor, CheckReport]:
    """``lookup()`` (sum or mean pooling, the bags of ``bag``) and its report: on the CPU the compiled
    verdict, prepared before the lookup; elsewhere, or for an exact ratio, :func:`verify_bag_output`."""
    run = _CompiledBags(bag) if not exact_ratio and bag.nb and _compiled_bags_ok(bag.checks.rowsum, bag.checks) \
        else None
    out = lookup()
    if run is not None:
        return out, run.verdict(out)
    return out, verify_bag_output(out, bag.checks, bag.idx, bag.off, bag.mode, bag.psw, extra=bag.extra, lam=bag.lam,
                                  op=bag.op, dtype=bag.dtype, shape=bag.shape, exact_ratio=exact_ratio)


@dataclass
class QuantizedTable:
    """An 8-bit row-wise quantized table (fbgemm layout: D uint8 codes, fp32 scale, fp32 bias per row).

    ``checks`` holds, per row, the checksum ``sum_d (s q_d + b)`` and the magnitude
    ``sum_d (|s q_d| + |b|)``, computed in fp64 from the packed bytes.
    """

    packed: torch.Tensor
    checks: EmbeddingChecks
    dim: int

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> QuantizedTable:
        try:
            packed = torch.ops.quantized.embedding_bag_byte_prepack(weight.detach().float().cpu().contiguous())
        except (RuntimeError, AttributeError) as exc:
            from mystique.errors import EnvironmentUnsupported

            raise EnvironmentUnsupported(f"this torch build lacks 8-bit embedding ops: {exc}") from exc
        packed = packed.to(weight.device)
        return cls(packed, cls.compute_checks(packed), weight.shape[1])

    @staticmethod
    def compute_checks(packed: torch.Tensor) -> EmbeddingChecks:
        d = packed.shape[1] - 8
        q = packed[:, :d].to(torch.float64)
        sb = packed[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32).to(torch.float64)
        scale, bias = sb[:, 0:1], sb[:, 1:2]
        return EmbeddingChecks.from_rows((q * scale + bias).sum(1), (q * scale.abs() + bias.abs()).sum(1))

    def fused(self) -> _FusedTable | None:
        """The packed table as the fused compiled lookup reads it (cached while ``packed`` is this tensor)."""
        return _cached_fused(self, self.packed, self.checks, self.dim)

    def dequantize(self) -> torch.Tensor:
        d = self.dim
        q = self.packed[:, :d].to(torch.float32)
        sb = self.packed[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32)
        return q * sb[:, 0:1] + sb[:, 1:2]


def quantized_embedding_bag(table: QuantizedTable, indices: torch.Tensor, offsets: torch.Tensor,
                            mode: str = "sum") -> torch.Tensor:
    """The fused 8-bit row-wise EmbeddingBag (unchecked), on the device of the table.

    The fused kernel is called in sum mode and mean pooling divides by the bag length afterwards:
    on torch 2.13 CPU ``embedding_bag_byte_rowwise_offsets`` silently returns sums when asked for
    mode=1 (mean), which the clean campaign of this checker flagged.
    """
    out = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
        table.packed, indices, offsets, False, 0, False, None, None, False)
    if mode == "mean":
        lengths = _bag_lengths(indices, offsets, out.shape[0]).clamp(min=1).to(out.dtype)
        out = out / lengths[:, None]
    elif mode != "sum":
        raise UsageError(f"8-bit EmbeddingBag supports sum and mean pooling, got {mode!r}")
    return out


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
    idx, off = _bags_args(indices, offsets)
    bag = _Bags(table.checks, idx, off, mode, None, off.shape[0], table.dim, 6.0, 0.0, lam, f"embedding_bag_8bit_{mode}",
                "uint8", (table.packed.shape[0], table.dim, off.shape[0]))

    def lookup() -> torch.Tensor:
        return quantized_embedding_bag(table, idx, off, mode)

    call = None if exact_ratio else _FusedCall.of(table.fused(), bag)
    return call.run(lookup) if call is not None else _checked_lookup(bag, exact_ratio, lookup)


def describe_thresholds() -> dict[str, Any]:
    """The constants the checks use (for results details and documentation)."""
    return {"gemm_lambda": GEMM_LAMBDA, "embedding_lambda": EMBEDDING_LAMBDA,
            "u": {_dt(k): v for k, v in UNIT_ROUNDOFF.items()}}
