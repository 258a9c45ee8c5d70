"""Checked GEMM: ``checked_mm`` and the verdict ``verify_gemm`` of an :mod:`.encoding` against a product.

fp32 products are checked as computed; bf16/fp16 ones on their fp32 accumulator (the device's own
half GEMM with an fp32 output where it has one, see :mod:`..half`, else the fp32 GEMM of the upcast
operands), then rounded: checking the rounded output would need a threshold of the output's rounding,
2^16 times larger for bf16 (``check_rounded=True`` does that, for comparison). int8 products are the
device's exact int32 product, checked for equality with int64 checksums (:mod:`..exact`).

On the CPU with Numba (:mod:`.._kernels`) the exact threshold is evaluated in the passes that compute
the checksums, in one compiled call after the product whose arguments are all prepared before it.
Elsewhere the threshold is evaluated lazily: first with free lower bounds of the two norms (see
:meth:`.encoding.RowChecks.lower_bound`), then, only for rows that fail them, with the exact
``||a_i||`` and, if one still fails, the exact ``||r||``; ``max_ratio`` of a clean report is then an
upper bound of ``|diff| / thr``.

An alarm is located by the column checks, encoded from the kept operands after it. Where they stay
below their bound (it covers all M elements of a column: with TF32 operands M times their 2^-10
rounding, issue 33), the flagged rows are recomputed in fp64 and each element held to its own bound
(:func:`locate_elements`); likewise the flagged columns of a column-only check.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from mystique.dtypes import HALF_DTYPES
from mystique.emulation.tf32 import matmul_tf32_allowed
from mystique.errors import UsageError

from .._kernels import available, gemm_lower, raw
from ..exact import int8_mm
from ..half import accumulation_u, device_half_mm, missing, rounded_half_mm
from ..triton_abft.guard import gemm_wanted
from .cache import BoundedCache
from .device_check import cuda_like
from .encoding import (
    CHECK_VECTORS,
    GemmEncoding,
    RowChecks,
    check_2d,
    check_weights,
    col_checks,
    compiled_rows,
    encode_gemm,
    gemm_constants,
)
from .flags import U_TF32_PRODUCT, precise_fp32
from .report import CLEAR, FLOATS, GEMM_LAMBDA, UNIT_ROUNDOFF, CheckReport, dtype_name, host, np_view

#: half dtypes whose device GEMM (``torch.mm(a, b, out_dtype=torch.float32)``) errs in proportion to the
#: product's scale rather than each row's: on an H100 (torch 2.11, cuBLAS of CUDA 13.0, 2026-11-27) the fp16
#: kernel's error in rows of fp16-subnormal operands reached 1195 u sum_k |a_ik b_kj| of that row, while it
#: stayed within 0.34 u of the largest row's sum_k |a_ik b_kj| (the upcast fp32 product stayed within 1.9 u
#: of each row's own, and so did a GEMM whose rows were all subnormal, K = 16 to 256: the error follows the
#: largest row of the product). Every row is therefore held to the largest row's threshold (only once a row
#: would be flagged, so a clean check costs nothing more): a smaller row's flip then goes unseen only where
#: the same flip in the largest row would; the detection campaign (flips significant at 2^-7 rms(C)) counts
#: what that costs. bf16 (fp32's exponent range: no subnormal operands at these scales) was clean there in
#: the same campaign and keeps its per-row threshold.
SCALE_FLOOR_DTYPES = (torch.float16,)


def compiled_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a checked product of these operands can take the compiled CPU verdict with its arguments
    prepared before the product.

    Right after a large GEMM every Python-level operation is slow (cold caches and predictors), more
    than the checksums' own memory traffic; so the output buffer, its NumPy view, the constants and the
    report are made before the product (written with ``out=``) and only the one kernel call is left
    after it. Not with autograd (``out=`` does not take it).
    """
    return compiled_cpu(a, b) and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))


def compiled_cpu(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the compiled CPU kernels can check these two float32 tensors (read through detached views).

    (Attribute tests only: right after a large product each Python-level operation costs microseconds.)"""
    return a.is_cpu and b.is_cpu and a.dtype is torch.float32 and b.dtype is torch.float32 and \
        CHECK_VECTORS == 2 and available()


def prime(enc: GemmEncoding, lam: float | None, u_out: float = 0.0) -> None:
    """Prepare the fast verdict of ``enc``'s row checks for ``verify_gemm(enc, c, lam=lam, u_out=u_out)``
    with an fp32 ``c`` (see :meth:`RowChecks.prime`), before the product."""
    rc = enc.rows
    if rc is not None and enc.cols is None and not enc.exact and enc.m and enc.n and not compiled_rows(rc):
        key = (lam, None, u_out, torch.float32, (enc.m, enc.n))
        rc.prime(key, *gemm_constants(rc.k, enc.m, enc.n, UNIT_ROUNDOFF[torch.float32],
                                       GEMM_LAMBDA if lam is None else lam, u_out, torch.float32))


def _verify_rows(rc: RowChecks, c: torch.Tensor, *, u: float, lam: float, u_out: float, exact_ratio: bool = False,
                 diff: np.ndarray | None = None, out_dtype: torch.dtype | None = None,
                 scale_floor: bool = False) -> tuple[list[int], float, bool]:
    """Flagged rows (first 16), the largest ratio and whether a verdict was possible.

    ``exact_ratio`` skips the lower-bound thresholds, so that the ratio is exact (for calibration);
    ``diff`` is ``max_w |(W^T C^T - ref)_wi|`` when the caller has it already (no second pass over C).
    ``scale_floor``: no row's threshold is below the largest row's (see :data:`SCALE_FLOOR_DTYPES`); the
    largest ``||a_i||`` costs a pass over A, made only when a row would otherwise be flagged.
    """
    m, n = c.shape
    if m == 0:
        return [], 0.0, True
    k = rc.k
    factor, det, tiny = gemm_constants(k, m, n, u, lam, u_out, c.dtype, out_dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if diff is None:
            got = host(check_weights(n, c.device, c.dtype) @ c.t(), f64=False)  # (P, M): one pass over C
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
        if scale_floor and not bool((d_c <= thr).all()):  # the product's scale, only before an alarm
            thr = np.maximum(thr, base_c + float(rc.row_norms(np.arange(m)).max()) * (factor * rc.r_norm()))
        valid = np.isfinite(rc.ref[:, cand]).all(0) & np.isfinite(thr)
        bad = ~(d_c <= thr) & valid
        ratio[cand] = np.where(valid, d_c / thr, 0.0)
    rows = cand[bad][:16].tolist()
    return rows, float(np.nan_to_num(ratio, nan=math.inf).max()), bool(valid.all())


@torch.no_grad()
def verify_gemm(enc: GemmEncoding, c: torch.Tensor, *, dtype: torch.dtype, lam: float | None = None,
                u: float | None = None, u_out: float = 0.0, op: str = "gemm", exact_ratio: bool = False,
                diff: np.ndarray | None = None, out_dtype: torch.dtype | None = None,
                scale_floor: bool = False) -> CheckReport:
    """Compare the computed product ``c`` (accumulator precision) with the encoding.

    ``u`` defaults to the unit roundoff of ``c.dtype``; ``u_out`` adds the rounding of an output
    that was rounded to a narrower dtype before the check; ``exact_ratio`` evaluates the exact
    threshold of every row (same verdict, exact ``max_ratio``, slower); ``diff`` is
    ``max_w |(W^T C^T - ref)_wi|`` per row when the caller computed it already. On the CPU the
    checksums of C and the lower-bound verdict are one compiled pass (:mod:`.._kernels`), which the
    exact verdict reuses, so both read the same checksums. ``out_dtype``: the half dtype the output was
    rounded to (its subnormal term, see :func:`.encoding.gemm_constants`). ``scale_floor``: every row is
    held to at least the largest row's threshold (a device half kernel whose error follows the product's
    scale, :data:`SCALE_FLOOR_DTYPES`). When only one of the row and column checks alarms, the alarm is
    located element by element in its flagged rows (columns), :func:`locate_elements`. Returns a
    :class:`CheckReport`.
    """
    rc = enc.rows
    fast = rc.fast if rc is not None else None
    lower_bound = not exact_ratio and not enc.exact and rc is not None and enc.cols is None
    if diff is None and rc is not None and not enc.exact and c.device.type == "cpu" and c.dtype == torch.float32 \
            and c.shape[0] and c.is_contiguous() and compiled_rows(rc):
        consts = gemm_constants(rc.k, c.shape[0], c.shape[1], UNIT_ROUNDOFF[c.dtype] if u is None else u,
                                 GEMM_LAMBDA if lam is None else lam, u_out, c.dtype, out_dtype)
        got = np.empty((2, c.shape[0]))
        worst = gemm_lower(np_view(c), np_view(check_weights(c.shape[1], c.device, c.dtype)), np_view(rc.src),
                           rc.vnorm, *consts, got)
        if lower_bound and worst <= 1.0:  # NaN (something not finite) falls through to the full check
            return CheckReport(op, dtype_name(dtype), False, worst, True, [], [], None, (enc.m, enc.k, enc.n))
        with np.errstate(invalid="ignore"):  # the full check reuses these checksums: no second pass over C
            diff = np.abs(got - rc.ref).max(0)
    elif diff is None and lower_bound and fast is not None and fast[0] == (lam, u, u_out, c.dtype, tuple(c.shape)):
        # primed (RowChecks.prime): W^T C^T - ref in the one pass over C, then the largest
        # |difference| / lower-bound threshold; 2^-15 below 1 covers the fp32 rounding of that bound,
        # of its reciprocal and of the difference
        d = torch.addmm(fast[1], fast[3], c.t())
        worst = float((d * fast[2]).abs_().max())  # (vector_norm(ord=inf) is 2-3x slower on the CPU)
        if worst <= 1.0 - 2.0**-15:  # NaN (something not finite) falls through to the full check
            return CheckReport(op, dtype_name(dtype), False, worst, True, [], [], None, (enc.m, enc.k, enc.n))
        with np.errstate(invalid="ignore"):  # the full check reuses the difference: no second pass over C
            diff = np.abs(host(d)).max(0)
    shape = (enc.m, enc.k, enc.n)
    rows: list[int] = []
    cols: list[int] = []
    if enc.exact:  # int64-accumulated sums of the int32 product: exact (|sum| <= 2^31 max(M, N) < 2^63)
        rows = torch.nonzero(c.sum(1, dtype=torch.int64) != enc.ref_row).flatten().tolist()
        cols = torch.nonzero(c.sum(0, dtype=torch.int64) != enc.ref_col).flatten().tolist()
        alarm = bool(rows or cols)
        loc = (rows[0], cols[0]) if rows and cols else None
        return CheckReport(op, dtype_name(dtype), alarm, math.inf if alarm else 0.0, True, rows[:16], cols[:16], loc, shape)
    lam = GEMM_LAMBDA if lam is None else lam
    u = UNIT_ROUNDOFF[c.dtype] if u is None else u
    ratios: list[float] = []
    checked = True
    if enc.rows is not None:
        rows, r, ok = _verify_rows(enc.rows, c, u=u, lam=lam, u_out=u_out, exact_ratio=exact_ratio, diff=diff,
                                   out_dtype=out_dtype, scale_floor=scale_floor)
        ratios.append(r)
        checked &= ok
    col_enc = enc.cols
    if col_enc is None and rows and enc.locate and enc.rows is not None:
        col_enc = col_checks(enc.rows.a, enc.rows.b, enc.bias)  # only after an alarm: locate it
    if col_enc is not None:
        cols, r, ok = _verify_rows(col_enc, c.t(), u=u, lam=lam, u_out=u_out, exact_ratio=exact_ratio,
                                   out_dtype=out_dtype, scale_floor=scale_floor)
        ratios.append(r)
        checked &= ok
    loc = (rows[0], cols[0]) if rows and cols else None
    if bool(rows) != bool(cols) and enc.locate:  # one check alarmed, the other's bound (over all M or N) did not
        rows, cols, loc = _locate_one_sided(enc, c, rows, cols, u=u, lam=lam, u_out=u_out, out_dtype=out_dtype,
                                            scale_floor=scale_floor)
    alarm = bool(rows or cols)
    return CheckReport(op, dtype_name(dtype), alarm, max(ratios) if ratios else 0.0, checked, rows, cols, loc, shape)


def _locate_one_sided(enc: GemmEncoding, c: torch.Tensor, rows: list[int], cols: list[int], **bounds: Any
                      ) -> tuple[list[int], list[int], tuple[int, int] | None]:
    """``(rows, cols, location)`` of an alarm of the row checks alone (or of the column checks alone): the
    other side from :func:`locate_elements` in the flagged rows (columns), the first located element."""
    pairs: list[tuple[int, int]] = []
    if rows and enc.rows is not None:
        pairs = locate_elements(enc.rows, c, rows, **bounds)
        cols = sorted({j for _, j in pairs})[:16]
    elif cols and enc.cols is not None:
        pairs = [(i, j) for j, i in locate_elements(enc.cols, c.t(), cols, **bounds)]
        rows = sorted({i for i, _ in pairs})[:16]
    return rows, cols, (pairs[0] if pairs else None)


#: fp64 elements of B per block of :func:`locate_elements`'s reference (32 MiB)
_LOCATE_BLOCK = 1 << 22


def locate_elements(rc: RowChecks, c: torch.Tensor, rows: list[int], *, u: float, lam: float, u_out: float,
                    out_dtype: torch.dtype | None = None, scale_floor: bool = False) -> list[tuple[int, int]]:
    """The ``(i, j)`` of the flagged ``rows`` of ``c = A B (+ e v^T + u e^T)`` (``rc``'s operands) whose
    element differs from its fp64 reference beyond that element's own bound, in row order.

    Used after the row check alarmed and the column check did not: a column checksum sums all M
    elements of a column, so its bound holds M elements' rounding (for TF32, M times the operands'
    2^-10) and an error that one row's bound (N elements) exceeds can stay below it. Each element of the
    flagged rows is recomputed in fp64 (a few rows: ``|rows| K N`` operations, only after an alarm) and
    held to the bound of :func:`.encoding.gemm_constants` for a 1 x 1 product (the row bound of one
    element, with ``s_ij = sum_k |a_ik b_kj|`` exact in place of its Cauchy-Schwarz bound):

        thr_ij = (factor + 2 K 2^-53) s_ij + det |y_ij| + tiny

    ``factor`` holds the accumulation (``lam u (sqrt(K) + log2(K) + 3)``) and every term of ``u_out`` (an
    output rounded to a half dtype, TF32 operands, cuBLAS's split-K reductions: each bounded by its
    multiple of ``s_ij`` per element as per row), ``det = u (K + 3)`` the same-sign sum, ``tiny``
    underflow and a half output's subnormal spacing; ``2 K 2^-53`` the fp64 rounding of ``y_ij`` and of
    ``s_ij`` (products of fp32 values exact in fp64). A clean element is within it as a clean row is
    within the row bound, so no clean element is located. ``scale_floor`` (:data:`SCALE_FLOOR_DTYPES`):
    no element's bound is below ``factor max_i ||a_i|| ||b_j||``, the largest row's ``s_ij`` bound.
    """
    k, n = rc.k, c.shape[1]
    factor, det, tiny = gemm_constants(k, 1, 1, u, lam, u_out, c.dtype, out_dtype)
    factor += 2 * k * 2.0**-53
    dev = rc.a.device if rc.a.device.type in ("cpu", "cuda") else torch.device("cpu")  # (fp64 there)
    idx = torch.tensor(rows, device=rc.a.device)
    a = rc.a.index_select(0, idx).to(dev, torch.float64)
    got = c.index_select(0, idx.to(c.device)).to(dev, torch.float64)
    ui = None if rc.u is None else rc.u.index_select(0, idx).to(dev, torch.float64)[:, None]
    floor = float(rc.row_norms(np.arange(rc.a.shape[0])).max()) * factor if scale_floor else 0.0
    found = []
    step = max(1, _LOCATE_BLOCK // max(k, 1))
    for j0 in range(0, n, step):
        b = rc.b[:, j0:j0 + step].to(dev, torch.float64)
        y, s = a @ b, a.abs() @ b.abs()
        if rc.v is not None:
            v = rc.v[j0:j0 + step].to(dev, torch.float64)
            y, s = y + v, s + v.abs()
        if ui is not None:
            y, s = y + ui, s + ui.abs()
        thr = factor * s + det * y.abs() + tiny
        if floor:
            bn = b.square().sum(0) + (0.0 if rc.v is None else v.square()) + (0.0 if ui is None else 1.0)
            thr = torch.maximum(thr, floor * bn.sqrt())
        bad = ~((got[:, j0:j0 + step] - y).abs() <= thr) & torch.isfinite(thr)
        found += [(rows[r], j0 + j) for r, j in torch.nonzero(bad).tolist()]
    return sorted(found, key=lambda p: (rows.index(p[0]), p[1]))


def accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product in the accumulation dtype on the device: int8 -> the exact int32 product of the device's
    int8 GEMM (:func:`..exact.int8_mm`); bf16/fp16 -> the fp32 accumulator of the device's own half-precision
    GEMM where it has one with an fp32 output (:func:`..half.device_half_mm`), else the fp32 GEMM of the
    upcast operands (exact products, fp32 sums); fp32 -> ``a @ b``."""
    if a.dtype == torch.int8:
        return int8_mm(a, b)
    if a.dtype in HALF_DTYPES:
        acc = device_half_mm(a, b)
        return acc if acc is not None else a.float() @ b.float()
    return a @ b


def half_kind(a: torch.Tensor) -> str:
    """How :func:`checked_mm` computes and checks a bf16/fp16 product of ``a`` now: ``fp32_out`` (the device's
    half GEMM with fp32 output) or ``upcast`` (fp32 GEMM of the upcast operands; this backend has no half
    GEMM with fp32 output). Probes the device once (a tiny product) where it is not known yet."""
    if missing(a.device):
        return "upcast"
    probe = torch.zeros((1, 1), dtype=a.dtype, device=a.device)
    return "fp32_out" if device_half_mm(probe, probe) is not None else "upcast"


_MM_PLANS = BoundedCache()


def _mm_plan(m: int, k: int, n: int, lam: float | None) -> tuple[Any, ...]:
    """What a compiled checked ``(m x k) @ (k x n)`` needs besides its operands: the check weights'
    NumPy view, the threshold's constants and the kernels (cached per shape: every Python-level
    operation around a large GEMM is costly)."""
    return _MM_PLANS.lookup((m, k, n, lam), _make_mm_plan, m, k, n, lam)


def _make_mm_plan(m: int, k: int, n: int, lam: float | None) -> tuple[Any, ...]:
    consts = gemm_constants(k, m, n, UNIT_ROUNDOFF[torch.float32], GEMM_LAMBDA if lam is None else lam, 0.0,
                            torch.float32)
    return (np_view(check_weights(n, torch.device("cpu"), torch.float32)), consts,
            raw("b_pass"), raw("a_pass"), raw("mm_exact"))


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
    if worst <= CLEAR:  # NaN (something not finite) falls through to the full check
        return out, CheckReport("gemm", dtype_name(dtype), False, float(worst), True, [], [], None, (m, k, n))
    vnorm = np.sqrt(np.square(vt.astype(np.float64)).sum(1))
    enc = GemmEncoding(m, k, n, RowChecks(ref, vnorm, a32, b32, rnorm=rnorm))
    with np.errstate(invalid="ignore"):  # the full check reuses the kernel's checksums
        diff = np.abs(got - ref).max(0)
    return out, verify_gemm(enc, acc, dtype=dtype, lam=lam, diff=diff)


def _checked_tf32_mm(a: torch.Tensor, b: torch.Tensor, checks: str, lam: float | None, exact_ratio: bool
                     ) -> tuple[torch.Tensor, CheckReport]:
    """An fp32 product on a CUDA device whose flags allow TF32: the product as the device computes it (TF32
    tensor cores), the checksums in full fp32 (:func:`.flags.precise_fp32`), and the operands' 10-bit
    reading in the bound (``u_out`` += :data:`.flags.U_TF32_PRODUCT`: each product errs by at most that,
    relative, and ``sum_j sum_k |a_ik b_kj| <= ||a_i|| ||r||``)."""
    with precise_fp32():
        enc = encode_gemm(a, b, checks)
    c = a @ b
    with precise_fp32():
        return c, verify_gemm(enc, c, dtype=a.dtype, lam=lam, u_out=U_TF32_PRODUCT, op="gemm_tf32",
                              exact_ratio=exact_ratio)


def checked_mm(a: torch.Tensor, b: torch.Tensor, *, checks: str = "row", lam: float | None = None,
               check_rounded: bool = False, exact_ratio: bool = False) -> tuple[torch.Tensor, CheckReport]:
    """``a @ b`` with weighted row checksums (``checks``: ``row``, ``col`` or ``both``); returns ``(c, report)``.

    fp32: checked as computed. bf16/fp16: accumulated and checked in fp32, then rounded to the input
    dtype; the accumulator is the device's own half-precision GEMM with fp32 output where the backend
    has one (:func:`..half.device_half_mm`: CUDA), else the fp32 GEMM of the upcast operands (the CPU).
    ``check_rounded=True`` runs the device's half-precision GEMM with its rounded output
    (:func:`..half.rounded_half_mm`, every backend) and checks that output, its rounding in the
    threshold (weaker: a flip below the rounding bound of its row goes unseen; an output that
    overflows the half dtype differs from the product and reads as an alarm).
    int8: the int32 product of the device's int8 GEMM, exact row and column checks.
    On CUDA with Triton (bf16/fp16, fp32 with TF32; row checks): the fused checked kernel, issue 32.
    """
    if a.is_cuda and checks == "row" and not exact_ratio and not check_rounded and a.dim() == 2 and b.dim() == 2 \
            and a.shape[1] == b.shape[0] and gemm_wanted(a, b):
        from ..triton_abft.linear import fused_mm

        c, chk = fused_mm(a, b, lam=lam)
        return c, chk.report()
    if cuda_like(a) and a.dtype == torch.float32 and matmul_tf32_allowed():
        return _checked_tf32_mm(a, b, checks, lam, exact_ratio)
    if checks == "row" and not exact_ratio and not check_rounded and a.dim() == 2 and b.dim() == 2 and \
            a.shape[1] == b.shape[0] and a.shape[0] and compiled_ok(a, b):  # (fp32 on the CPU: the hot path first)
        return _compiled_mm(a, b, a.dtype, lam)
    check_2d(a, b)
    if a.dtype != b.dtype:
        raise UsageError(f"checked_mm needs one dtype, got {a.dtype} and {b.dtype}")
    if checks not in ("row", "col", "both"):
        raise UsageError(f"checks must be row, col or both, got {checks!r}")
    if a.dtype not in (*FLOATS, torch.int8):
        raise UsageError(f"checked_mm supports float32, bfloat16, float16 and int8, got {a.dtype}")
    if a.dtype == torch.int8:
        enc = encode_gemm(a, b, checks)
        c = accumulate(a, b)
        return c, verify_gemm(enc, c, dtype=a.dtype, op="gemm")
    is_half = a.dtype in HALF_DTYPES
    a32, b32 = (a, b) if a.dtype == torch.float32 else (a.float(), b.float())
    if is_half and check_rounded:
        enc = encode_gemm(a32, b32, checks)
        out = rounded_half_mm(a, b)
        return out, verify_gemm(enc, out.float(), dtype=a.dtype, lam=lam, u=accumulation_u(a),
                                u_out=UNIT_ROUNDOFF[a.dtype], op="gemm_rounded", exact_ratio=exact_ratio)
    if checks == "row" and not exact_ratio and a32.shape[0] and (not is_half or missing(a.device)) and \
            compiled_ok(a32, b32):
        return _compiled_mm(a32, b32, a.dtype, lam)
    enc = encode_gemm(a32, b32, checks)
    if not exact_ratio:
        prime(enc, lam)
    acc = device_half_mm(a, b) if is_half else None
    u = None  # (the unit roundoff of c's dtype, fp32, unless the device's half GEMM accumulates otherwise)
    floor = acc is not None and a.dtype in SCALE_FLOOR_DTYPES
    if acc is None:
        acc = a32 @ b32
    elif accumulation_u(a) != UNIT_ROUNDOFF[torch.float32]:
        u = accumulation_u(a)
    if a.dtype == torch.float32:
        return acc, verify_gemm(enc, acc, dtype=a.dtype, lam=lam, exact_ratio=exact_ratio)
    return acc.to(a.dtype), verify_gemm(enc, acc, dtype=a.dtype, lam=lam, u=u, exact_ratio=exact_ratio,
                                        scale_floor=floor)


@torch.no_grad()
def sure_row_alarms(a: torch.Tensor, b: torch.Tensor, change: torch.Tensor, a_after: torch.Tensor | None = None, *,
                    u: float | None = None, lam: float | None = None) -> np.ndarray:
    """Which rows (a bool per row) of a float ``a @ b`` checked by :func:`verify_gemm` (row checks encoded
    from ``a``, ``b``; no bias) a change of the product is sure to raise the alarm in: ``change`` (M x N)
    is the exact change of the product (an operand flip: ``(a_after - a) @ b`` in fp64; an output flip:
    the changed elements), ``a_after`` the operand the product was computed from (default ``a``).

    Derivation: the check alarms where ``max_w |(C W)_iw - ref_wi| > thr_i`` (the exact threshold of
    :func:`.encoding.gemm_constants` over ``a``'s row norms, ``u`` the accumulator's unit roundoff; the
    lower-bound path clears a row only below a lower bound of ``thr_i``). ``(C W)_iw - ref_wi`` is the
    exact change of row i's checksum, ``(change W)_iw``, plus the rounding of the product and of its
    checksum (within ``thr_i`` over the operand the product read, ``a_after``) and of the reference
    (within ``thr_i`` over ``a``). So a row with ``max_w |(change W)_iw| > thr_i(a) + thr_i(a_after)``
    alarms, and so does one whose change is not finite. A change of at most ``thr_i(a)`` is one the
    rounding of a clean product may make to that checksum: the check cannot tell it from rounding. The
    checksums here are in fp64 (2^-53 relative, far below ``u``).
    """
    m, k = a.shape
    n = b.shape[1]
    u = UNIT_ROUNDOFF[torch.float32] if u is None else u
    factor, det, tiny = gemm_constants(k, m, n, u, GEMM_LAMBDA if lam is None else lam, 0.0, torch.float32)
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    w = check_weights(n, "cpu", torch.float64)
    r = float(torch.linalg.vector_norm(b64.abs().sum(1)))

    def thr(x: torch.Tensor) -> np.ndarray:
        return (factor * torch.linalg.vector_norm(x, dim=1) * r + det * (x @ b64).sum(1).abs() + tiny).numpy()

    after = a64 if a_after is None else a_after.detach().cpu().double()
    with np.errstate(invalid="ignore", over="ignore"):
        moved = (change.detach().cpu().double() @ w.t()).abs().amax(1).numpy()
        return ~np.isfinite(moved) | (moved > thr(a64) + thr(after))
