"""The fused checked GEMM / Linear: one Triton GEMM whose launch also computes both checksums, one tiny verdict.

``y = x W^T + b`` (:func:`fused_linear`) or ``c = a b`` (:func:`fused_mm`) in two launches
(:mod:`.kernels`):

1. the GEMM, tiles ``BM x BN x BK``, fp32 accumulation; its grid holds one more column block of programs,
   which multiply the same row blocks of x by ``V`` (K x 16), the weight's checksum columns cached per
   weight version (``W_chk^T W`` as fp32 columns, or for bf16 as three bf16 parts, :func:`..abft.
   device_linear.split_bf16`): the reference checksums ``x (W_chk^T W)^T`` ride in the same kernel as
   extra output columns. Each output tile's epilogue adds the bias and writes the tile's weighted row
   sums (and column sums, read only to locate an alarm) of the fp32 accumulator, then rounds it to y.
2. the verdict: per row, the NT tiles' partial sums added, the reference's parts and the bias's checksum
   added, ``max_w |got_w - ref_w| / lower-bound threshold`` max-reduced on the device into one scalar
   (:class:`..abft.device_check.DeviceCheck`, read back later, many at once). Only a call above 1 takes
   the exact threshold (:func:`..abft.gemm._verify_rows`, with the input's row norms) and then the column
   checks, to locate it.

The bound (the project's, :func:`..abft.encoding.gemm_constants`, threshold of row i ``factor ||x_i||
||r|| + det |ref_0i| + tiny``), with this kernel's own order accounted for:

* accumulation: each element is a sum of K products (K + 1 terms with the bias) added in K-blocks of BK,
  each block a ``tl.dot`` into the fp32 accumulator. Whatever the order inside a block and across blocks,
  each product meets at most K roundings, so the probabilistic ``lam u sqrt(K)`` and the deterministic
  ``u (K + ...)`` terms hold as derived, with ``u`` the accumulation's unit roundoff: ``2^-24`` for an
  fp32 ``ieee`` dot (fused multiply-adds, round to nearest); ``2^-23`` (:data:`U_TENSOR_CORE`) for the
  tensor-core dots (bf16/fp16, TF32), whose MMA aligns the products' significands by truncation and
  normalises toward zero (Fasi, Higham, Mikaitis, Pranesh 2021: relative error per addition below 2^-23
  rather than 2^-24). Products of bf16/fp16 operands are exact in fp32.
* operands: TF32 reads each fp32 operand to 10 bits (:data:`..abft.flags.U_TF32_PRODUCT` per product,
  ``u_in ||x_i|| ||r||`` over the row); the reference columns are a TF32 dot too, so twice that.
  bf16: the reference reads the three-part split of ``W_chk^T W`` (:data:`..abft.device_linear.U_SPLIT`).
  fp16: the reference upcasts the x tile to fp32 and takes an ``ieee`` dot against the fp32 columns.
* the checksums of the output: each tile's row sum (``tl.sum`` over BN columns, any order: at most BN - 1
  roundings per term) and the sum of the NT tiles' partials (at most NT - 1): a term meets at most
  ``BN + NT`` roundings, ``lam u sqrt(BN + NT)`` of ``sum_j |y_ij| <= ||x_i|| ||r||`` (probabilistic, as
  the accumulation's; likewise ``BM + MT`` for the column sums). Added to the factor (:func:`epilogue_u`).
* the output is checked on the fp32 accumulator (plus bias, in fp32) before it is rounded to y's dtype:
  no output rounding in the bound (as the ``fp32_out`` path of :mod:`..abft.device_linear`).

The lower bound that clears a clean call on the device, ``factor max_w(|ref_wi| cw_w) + det |ref_0i| +
tiny`` (``cw`` from :func:`..abft.device_linear.encode_device_linear`), is the one of
:meth:`..abft.encoding.RowChecks._lower_bound`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mystique.emulation.tf32 import matmul_tf32_allowed
from mystique.errors import UsageError

from ..abft.device_check import DeviceCheck
from ..abft.device_linear import U_SPLIT, DeviceLinearEncoding, GemmPath, split_bf16
from ..abft.encoding import (
    CHECK_VECTORS,
    RowChecks,
    check_weights,
    checksum_norms,
    col_checks,
    gemm_constants,
)
from ..abft.flags import U_TF32_PRODUCT, precise_fp32
from ..abft.gemm import _verify_rows
from ..abft.report import FLOATS, GEMM_LAMBDA, CheckReport, dtype_name, host
from . import interpreting
from .kernels import gemm_kernels

#: unit roundoff of a tensor-core dot's fp32 accumulation (truncating alignment, see the module docstring)
U_TENSOR_CORE = 2.0**-23
U_FP32 = 2.0**-24
#: columns of the reference block (``tl.dot`` needs 16): 2 checksums, or 6 (bf16: three parts of each)
REF_COLS = 16
#: row blocks per group of the kernel's tile order (tiles that run together share operands in L2)
GROUP_M = 8


@dataclass(frozen=True)
class Tiles:
    """The kernel's tile (``bm x bn x bk``) and launch shape (``warps``, ``stages``)."""

    bm: int
    bn: int
    bk: int
    warps: int = 8
    stages: int = 3


def tiles(dtype: torch.dtype, prec: str) -> Tiles:
    """The tile for a dtype and dot precision (fixed, untuned: H100-typical shapes; 64 x 64 x 32 under the
    interpreter, which runs each program as NumPy operations: fewer, larger programs are faster)."""
    if interpreting():
        return Tiles(64, 64, 32, 4, 1)
    if dtype in (torch.bfloat16, torch.float16):
        return Tiles(128, 128, 64, 8, 3)
    if prec == "tf32":
        return Tiles(128, 128, 32, 8, 3)
    return Tiles(64, 64, 32, 4, 3)


def epilogue_u(t: Tiles, m: int, n: int, u: float, lam: float) -> float:
    """The factor's term of the output's checksums as the kernel sums them (module docstring)."""
    nt, mt = math.ceil(n / t.bn), math.ceil(m / t.bm)
    return lam * u * math.sqrt(max(t.bn + nt, t.bm + mt))


@dataclass(frozen=True)
class FusedPath(GemmPath):
    """:class:`..abft.device_linear.GemmPath` of the fused kernel: ``prec`` the ``tl.dot`` precision
    (``ieee``, ``tf32``, or the dtype's tensor-core dot, ``half``)."""

    prec: str = "ieee"

    def describe(self) -> str:
        name = dtype_name(self.dtype)
        how = {"ieee": "fp32 FMA dots (ieee), u = 2^-24",
               "tf32": f"TF32 tensor-core dots, u = 2^-23 plus u_in = 2 x {U_TF32_PRODUCT:.4g} (10-bit operands, "
                       "product and reference)",
               "half": f"{name} tensor-core dots with fp32 accumulation, u = 2^-23 (truncating alignment)"}[self.prec]
        return (f"the fused Triton {name} GEMM checked on its fp32 accumulator, checksums in its epilogue and the "
                f"reference as extra columns of the same launch: {how}, plus the epilogue's summation order")


def fused_path(dtype: torch.dtype, cuda: bool) -> FusedPath:
    """The fused kernel's product and bound for ``dtype`` (``cuda``: TF32 as the user's flags allow it)."""
    if dtype == torch.float32:
        if cuda and matmul_tf32_allowed():
            return FusedPath("tf32", dtype, U_TENSOR_CORE, u_in=2 * U_TF32_PRODUCT, prec="tf32")
        return FusedPath("fp32", dtype, U_FP32, prec="ieee")
    return FusedPath("fp32_out", dtype, U_TENSOR_CORE, u_in=U_SPLIT if dtype == torch.bfloat16 else 0.0, prec="half")


@dataclass
class FusedWeights:
    """The weight side the kernel reads, per weight version: ``v`` (K x 16) the reference columns, ``signs``
    (N,) the second check vector over the output's columns, ``vw`` (2,) the bias's checksums or None."""

    v: torch.Tensor
    signs: torch.Tensor
    vw: torch.Tensor | None
    r: int


def fused_weights(enc: DeviceLinearEncoding) -> FusedWeights:
    """The kernel's weight side of ``enc`` (cached on it: an encoding is one weight version)."""
    fw = enc.__dict__.get("_fused")
    if fw is None:
        k = enc.w.shape[1]
        split = enc.w.dtype == torch.bfloat16
        cols = enc.vsplit if split else enc.vt.t()
        v = torch.zeros((k, REF_COLS), dtype=cols.dtype, device=enc.w.device)
        v[:, :cols.shape[1]] = cols
        signs = check_weights(enc.w.shape[0], enc.w.device, torch.float32)[1].contiguous()
        vw = enc.vw.float().contiguous() if enc.vw is not None else None
        fw = enc.__dict__["_fused"] = FusedWeights(v, signs, vw, cols.shape[1])
    return fw


def fused_linear(x: torch.Tensor, enc: DeviceLinearEncoding, *, lam: float | None = None,
                 flip: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, DeviceCheck]:
    """``F.linear(x, W, b)`` (``enc``: :func:`..abft.device_linear.encode_device_linear`) by the fused kernel,
    checked on the device; returns ``(y, check)`` in x's dtype. No autograd. ``flip``: ``(row, col, bits)``
    xored into that fp32 accumulator element inside the kernel (fault injection)."""
    if x.dtype != enc.w.dtype or x.shape[-1] != enc.w.shape[1] or x.device != enc.w.device:
        raise UsageError(f"a fused checked Linear needs x (..., {enc.w.shape[1]}) {enc.w.dtype} on {enc.w.device}, "
                         f"got {tuple(x.shape)} {x.dtype} on {x.device}")
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    y2, chk = _run(x2, enc, lam, flip, "linear")
    return (y2 if x.dim() == 2 else y2.reshape(*x.shape[:-1], enc.w.shape[0])), chk


def fused_mm(a: torch.Tensor, b: torch.Tensor, *, lam: float | None = None,
             flip: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, DeviceCheck]:
    """``a @ b`` (2-D, one float dtype) by the fused kernel, checked on the device; the checksums of ``b``
    encoded for this call (one pass over b)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype or a.dtype not in FLOATS:
        raise UsageError(f"a fused checked GEMM needs (M, K) @ (K, N) of one float dtype, got {tuple(a.shape)} "
                         f"{a.dtype} @ {tuple(b.shape)} {b.dtype}")
    return _run(a, encode_operand(b), lam, flip, "gemm")


@torch.no_grad()
def encode_operand(b: torch.Tensor) -> DeviceLinearEncoding:
    """The checksums of a GEMM's right operand ``b`` (K x N) for one call, with device operations only (no
    host read: :func:`..abft.device_linear.encode_device_linear` reads the norms back, which a per-call
    encoding cannot afford): ``vt = W_chk^T b^T``, and the lower bound's weights ``cw`` from the norms of
    ``vt``'s rows in fp64 (their rounding far below the 2^-16 that ``cw`` allows). The host norms that only
    the exact verdict reads (``vnorm``, ``rnorm``) are left to it (:func:`_exact`)."""
    w = b.t()
    with precise_fp32():
        vt = check_weights(w.shape[0], w.device, torch.float32) @ w.float()
    vn = torch.linalg.vector_norm(vt.double(), dim=1).clamp_min(float(torch.finfo(torch.float32).tiny))
    cw = (vn.max() * (1.0 - 2.0**-16) / vn).float()
    vsplit = split_bf16(vt) if w.dtype == torch.bfloat16 else None
    return DeviceLinearEncoding(w, None, vt, None, None, cw, None, vsplit)


@dataclass
class _Plan:
    """What a call of one shape needs besides its operands (cached per encoding: each Python operation before
    the GEMM's launch is time the device waits, on a GPU idle between calls)."""

    path: FusedPath
    nt: int
    mt: int
    sizes: list[int]
    signs_m: torch.Tensor
    wt: torch.Tensor
    grid: tuple[int]
    kw: dict
    vgrid: tuple[int]
    vkw: dict
    consts: tuple[float, float, float]
    extra: float


def _plan(enc: DeviceLinearEncoding, fw: FusedWeights, m: int, dtype: torch.dtype, cuda: bool, lam: float,
          interp: bool, tf32: bool) -> _Plan:
    plans = enc.__dict__.setdefault("_plans", {})
    key = (m, dtype, cuda, lam, interp, tf32)
    plan = plans.get(key)
    if plan is None:
        if len(plans) > 64:
            plans.clear()
        n = enc.w.shape[0]
        path = fused_path(dtype, cuda)
        t = tiles(dtype, path.prec)
        nt, mt = math.ceil(n / t.bn), math.ceil(m / t.bm)
        half = dtype in (torch.bfloat16, torch.float16)
        prec = "tf32" if path.prec == "tf32" else "ieee"
        kw = dict(BM=t.bm, BN=t.bn, BK=t.bk, RP=REF_COLS, R=fw.r, HAS_BIAS=enc.bias is not None, PREC=prec,
                  REF_PREC=prec,
                  # (the interpreter's bf16 tl.dot is wrong: it takes the exact fp32 upcasts there, the same sums)
                  UPCAST=interp and dtype == torch.bfloat16, REF_UPCAST=dtype == torch.float16 or (interp and half),
                  GROUP_M=GROUP_M, num_warps=t.warps, num_stages=t.stages)
        extra = path.extra(enc.k, lam) + epilogue_u(t, m, n, path.u, lam)
        bmv = 128
        vkw = dict(NTP=max(2, 1 << (nt - 1).bit_length()), BMV=bmv, SPLIT=fw.r == 6, HAS_VW=fw.vw is not None,
                   num_warps=4)
        plan = plans[key] = _Plan(
            path, nt, mt, [2 * nt * m, 2 * mt * n, fw.r * m, 2 * m, 2 * m, 1],
            check_weights(m, enc.w.device, torch.float32)[1], enc.w.t(), (mt * nt + mt,), kw,
            (math.ceil(m / bmv),), vkw, gemm_constants(enc.k, m, n, path.u, lam, extra, torch.float32), extra)
    return plan


def _run(x2: torch.Tensor, enc: DeviceLinearEncoding, lam: float | None, flip: tuple[int, int, int] | None,
         op: str) -> tuple[torch.Tensor, DeviceCheck]:
    assert CHECK_VECTORS == 2  # (the kernels hold two check vectors)
    mm_kernel, verdict_kernel = gemm_kernels()
    (m, k), n = x2.shape, enc.w.shape[0]
    dev, dtype, cuda = x2.device, x2.dtype, x2.is_cuda
    fw = fused_weights(enc)
    plan = _plan(enc, fw, m, dtype, cuda, GEMM_LAMBDA if lam is None else lam, interpreting(),
                 dtype == torch.float32 and cuda and matmul_tf32_allowed())
    y = torch.empty((m, n), dtype=dtype, device=dev)
    # one allocation for the kernels' fp32 buffers (each call its own: the verdicts are read later)
    bufs = torch.empty(sum(plan.sizes), dtype=torch.float32, device=dev).split_with_sizes(plan.sizes)
    rpart, cpart, ref_parts, got, ref, worst = bufs
    # (no fault: any int32-sized buffer stands for the unread flip argument, no host-to-device copy)
    flips = torch.tensor(flip, dtype=torch.int32, device=dev) if flip is not None else worst
    wt = plan.wt
    if m:
        mm_kernel[plan.grid](
            x2, wt, fw.v, enc.bias if enc.bias is not None else fw.v, plan.signs_m, fw.signs, y, rpart, cpart,
            ref_parts, worst, flips, m, n, k, x2.stride(0), x2.stride(1), wt.stride(0), wt.stride(1), y.stride(0),
            y.stride(1), plan.nt, plan.mt, FAULT=flip is not None, **plan.kw)
        verdict_kernel[plan.vgrid](rpart, ref_parts, fw.vw if fw.vw is not None else enc.cw, enc.cw, got, ref, worst,
                                   m, plan.nt, *plan.consts, **plan.vkw)
    else:
        worst.zero_()
    path, lam_, extra = plan.path, GEMM_LAMBDA if lam is None else lam, plan.extra

    def exact(exact_ratio: bool) -> CheckReport:
        return _exact(enc, x2, got.view(2, m), ref.view(2, m), cpart.view(2, plan.mt, n), path, lam_, extra, op,
                      exact_ratio)

    return y, DeviceCheck(worst, dtype_name(dtype), (m, k, n), exact, op, path)


def _exact(enc: DeviceLinearEncoding, x2: torch.Tensor, got: torch.Tensor, ref: torch.Tensor, cpart: torch.Tensor,
           path: FusedPath, lam: float, extra: float, op: str, exact_ratio: bool) -> CheckReport:
    """The exact verdict of a fused call (after its lower bound exceeded 1): the rows against the exact
    threshold with the kernel's own checksums, then the columns (the kernel's column sums against the
    column checks encoded from the operands) to locate the alarm."""
    (m, k), n = x2.shape, enc.w.shape[0]
    shape = (m, k, n)
    with torch.no_grad(), precise_fp32(), np.errstate(invalid="ignore"):
        x32, w32 = x2.detach().float(), enc.w.t().float()
        b32 = None if enc.bias is None else enc.bias.float()
        if enc.vnorm is None:  # (an operand encoded per call, :func:`encode_operand`: its host norms now)
            enc.vnorm = checksum_norms(enc.vt)
            enc.rnorm = float(w32.double().abs().sum(1).square().sum().sqrt())
        rc = RowChecks(ref, enc.vnorm, x32, w32, b32, None, enc.rnorm)
        meta = torch.empty((m, n), device="meta")
        diff = np.abs(host(got) - host(ref)).max(0)
        rows, ratio, ok = _verify_rows(rc, meta, u=path.u, lam=lam, u_out=extra, exact_ratio=exact_ratio, diff=diff)
        cols: list[int] = []
        if rows:
            cc = col_checks(x32, w32, b32)
            cdiff = np.abs(host(cpart.sum(1)) - cc.ref).max(0)
            cols, cratio, cok = _verify_rows(cc, meta.t(), u=path.u, lam=lam, u_out=extra, diff=cdiff)
            ratio, ok = max(ratio, cratio), ok and cok
    loc = (rows[0], cols[0]) if rows and cols else None
    return CheckReport(op, dtype_name(path.dtype), bool(rows or cols), ratio, ok, rows, cols, loc, shape)
