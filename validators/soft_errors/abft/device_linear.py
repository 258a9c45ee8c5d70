"""Checked Linear as a GPU runs it: the device's own kernel, that kernel's bound, the verdict on the device.

The CPU path of :mod:`.linear` reads its checksums back to the host after every call; on a GPU that is
a synchronisation per layer. Here every step of a check is a device operation and the verdict is one
device scalar (``DeviceCheck.worst``), read back later, many at once (:func:`resolve`); only a call
whose lower-bound verdict is above 1 (a flip, or rarely a clean call close to its bound) takes the
exact threshold of :func:`.gemm.verify_gemm`, with the input's row norms.

Per call, the weight side cached per weight version (``_version`` and ``data_ptr``, :class:`.linear._LinearCache`):
one GEMV over the activations (``ref = W_chk^T W x^T + W_chk^T b``, P = 2 checksum rows; bf16 activations
read as they are by the half GEMM with fp32 output against a three-part bf16 split of ``W_chk^T W``,
:func:`split_bf16`) and one reduction of the output (``got = W_chk^T y^T``, a half output likewise); the verdict is ``max |got - ref| / lower-bound threshold``
(:meth:`.encoding.RowChecks._lower_bound`: no norm of x needed). The checksum GEMMs run in full fp32
(TF32 off, :func:`precise_fp32`), whatever the user's flags.

Which product is checked, and the bound of each (:func:`gemm_path`; ``u`` the unit roundoff of the
accumulation, the extra terms multiply ``||x_i|| ||r||`` like the GEMM factor of
:func:`.encoding.gemm_constants`):

* ``fp32``: fp32 ``F.linear``, ``u = 2^-24``.
* ``tf32``: fp32 on a CUDA device with TF32 allowed (``torch.backends.cuda.matmul.allow_tf32``, i.e.
  ``torch.get_float32_matmul_precision() != "highest"``): the tensor cores read the first 10 mantissa
  bits of each operand (truncation at worst, relative error below 2^-10 each), so each product
  ``x_ik w_jk`` errs by at most ``u_in = 2 * 2^-10 + 2^-20`` relative; summed with absolute values over
  the row checksum that is ``u_in sum_j sum_k |x_ik w_jk| <= u_in ||x_i|| ||r||``, added to the factor.
* ``fp32_out``: bf16/fp16 where the backend has ``torch.mm(x, W^T, out_dtype=torch.float32)``
  (``aten::mm.dtype``, CUDA) and no autograd is needed: the device's own half GEMM writing its fp32
  accumulator (cuBLAS compute type 32F, reductions in the fp32 output type), the bias added in fp32,
  checked there (``u = 2^-24``), then rounded to the input dtype.
* ``rounded``: bf16/fp16 otherwise (autograd, or no ``mm.dtype``): ``F.linear``'s half output, with
  its rounding ``u_out = 2^-8`` (bf16) / ``2^-11`` (fp16) added (``|fl(c) - c| <= u_out |c|``).
* ``rounded_reduced``: the same on CUDA where ``allow_bf16_reduced_precision_reduction`` /
  ``allow_fp16_reduced_precision_reduction`` is on (both are by default): cuBLAS may round split-K
  partial sums to the half dtype and add them there. With s partials each rounded once and summed
  in the half dtype, the added error is at most ``gamma_s(u_half) sum_k |x_ik w_jk|``; s is cuBLAS's
  choice (at most K), so the probabilistic bound of that sum (Higham and Mary 2019, as for the fp32
  accumulation) over K terms is used: ``lam sqrt(K) u_half`` more in the factor. It is weaker (a flip
  must exceed it to be seen), and says so in the row.

fp16 with ``allow_fp16_accumulation`` (compute type 16F) accumulates in fp16: ``u = 2^-11``
(:func:`..half.accumulation_u`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mystique.emulation.tf32 import matmul_tf32_allowed
from mystique.errors import UsageError

from ..half import U_HALF, device_half_mm
from ..triton_abft.guard import gemm_wanted
from .device_check import DeviceCheck, cuda_like
from .encoding import GemmEncoding, RowChecks, check_weights, checksum_norms, gemm_constants
from .flags import REDUCED_FLAG, U_TF32_PRODUCT, precise_fp32, reduced_reduction_allowed
from .gemm import verify_gemm
from .report import FLOATS, GEMM_LAMBDA, UNIT_ROUNDOFF, CheckReport, dtype_name, host


@dataclass(frozen=True)
class GemmPath:
    """How a checked Linear computes its product and the bound it is checked with (module docstring)."""

    kind: str
    dtype: torch.dtype
    u: float
    u_in: float = 0.0
    u_out: float = 0.0
    u_reduce: float = 0.0

    def extra(self, k: int, lam: float) -> float:
        """The terms added to the GEMM factor for a reduction length ``k`` (input and output rounding, reductions)."""
        return self.u_in + self.u_out + lam * math.sqrt(max(k, 1)) * self.u_reduce

    def describe(self) -> str:
        name = dtype_name(self.dtype)
        words = {
            "fp32": "the device's fp32 GEMM, threshold with u = 2^-24",
            "tf32": f"the device's fp32 GEMM on TF32 tensor cores (TF32 allowed): threshold with u = 2^-24 plus "
                    f"u_in = {U_TF32_PRODUCT:.4g} (10-bit operands, each product) x ||x_i|| ||r||",
            "fp32_out": f"the device's {name} GEMM with fp32 output (torch.mm(out_dtype=float32), aten::mm.dtype), "
                        f"checked on that fp32 accumulator: threshold with u = {self.u:.3g}",
            "rounded": f"the device's {name} GEMM with its rounded {name} output: threshold with u = {self.u:.3g} "
                       f"plus u_out = {self.u_out:.3g} x ||x_i|| ||r||",
            "rounded_reduced": f"the device's {name} GEMM with its rounded {name} output and cuBLAS reduced-precision "
                               f"split-K reductions allowed ({REDUCED_FLAG.get(self.dtype)}): threshold with "
                               f"u = {self.u:.3g} plus u_out = {self.u_out:.3g} plus lam sqrt(K) u_half = "
                               f"{self.u_reduce:.3g} sqrt(K) (split partials rounded to and summed in {name}, "
                               "probabilistic bound over K terms) x ||x_i|| ||r||",
        }
        return words[self.kind]


def gemm_path(dtype: torch.dtype, cuda: bool, *, fp32_out: bool) -> GemmPath:
    """The product a checked Linear of ``dtype`` runs and its bound: ``cuda`` whether the device is
    CUDA(-like), ``fp32_out`` whether the half GEMM with fp32 output is taken (no autograd, kernel present)."""
    if dtype == torch.float32:
        if cuda and matmul_tf32_allowed():
            return GemmPath("tf32", dtype, UNIT_ROUNDOFF[torch.float32], u_in=U_TF32_PRODUCT)
        return GemmPath("fp32", dtype, UNIT_ROUNDOFF[torch.float32])
    fp16_acc = dtype == torch.float16 and bool(getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", False))
    u = U_HALF[torch.float16] if cuda and fp16_acc else UNIT_ROUNDOFF[torch.float32]
    if fp32_out:
        return GemmPath("fp32_out", dtype, u)
    if cuda and reduced_reduction_allowed(dtype):
        return GemmPath("rounded_reduced", dtype, u, u_out=U_HALF[dtype], u_reduce=U_HALF[dtype])
    return GemmPath("rounded", dtype, u, u_out=U_HALF[dtype])


@dataclass
class DeviceLinearEncoding:
    """The weight side of a device-checked Linear, per weight version: ``w``/``bias`` as given (the product's
    operands), ``vt = W_chk^T W`` (P x K, fp32), ``vw = W_chk^T b``, ``vnorm`` the row norms of
    ``[vt | vw]`` (host), ``cw`` (P,) the per-row weights of the lower-bound threshold on the device and
    ``rnorm`` the norm of ``[|W|^T e; sum|b|]`` (host)."""

    w: torch.Tensor
    bias: torch.Tensor | None
    vt: torch.Tensor
    vw: torch.Tensor | None
    vnorm: np.ndarray
    cw: torch.Tensor
    rnorm: float
    #: (K, 3P) bf16: ``vt^T`` as the sum of three bf16 parts (bf16 weights only), see :func:`_reference`
    vsplit: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return self.w.shape[1] + (self.bias is not None)


def split_bf16(v: torch.Tensor) -> torch.Tensor:
    """``v`` (fp32, P x K) as three bf16 parts ``h1 + h2 + h3`` stacked as (K, 3P) columns: ``h1 = bf16(v)``,
    ``h2 = bf16(v - h1)``, ``h3 = bf16(v - h1 - h2)`` (each difference exact in fp32, each part's rounding
    relative 2^-8 of what is left), so ``|v - h1 - h2 - h3| <= 2^-24 |v|`` elementwise (bf16 has fp32's
    exponent range: nothing underflows before fp32 would)."""
    h1 = v.to(torch.bfloat16)
    r1 = v - h1.float()
    h2 = r1.to(torch.bfloat16)
    h3 = (r1 - h2.float()).to(torch.bfloat16)
    return torch.cat([h1, h2, h3]).t().contiguous()


@torch.no_grad()
def encode_device_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> DeviceLinearEncoding:
    """Encode a Linear's weight (N x K) and bias for :func:`check_device_linear` (one host read per version)."""
    if weight.dim() != 2 or weight.dtype not in FLOATS or (bias is not None and bias.shape != (weight.shape[0],)):
        raise UsageError(f"a checked Linear needs an (N, K) float32/bfloat16/float16 weight and an (N,) bias, got "
                         f"{tuple(weight.shape)} {weight.dtype}{'' if bias is None else ' and ' + str(tuple(bias.shape))}")
    w, b = weight.detach(), None if bias is None else bias.detach()
    with precise_fp32():
        w32 = w.float()
        wt = check_weights(w.shape[0], w.device, torch.float32)
        vt = wt @ w32
        vw = wt @ b.float() if b is not None else None
        r = w32.abs().sum(0)
        sq = r.square().sum() + (b.float().abs().sum().square() if b is not None else 0.0)
    vnorm = checksum_norms(vt, vw) if vw is not None else checksum_norms(vt)
    rnorm = math.sqrt(float(sq))
    tiny = float(torch.finfo(torch.float32).tiny)
    vn = np.maximum(vnorm, tiny)
    cw = torch.from_numpy(float(vn.max()) * (1.0 - 2.0**-16) / vn).to(device=w.device, dtype=torch.float32)
    vsplit = split_bf16(vt) if w.dtype == torch.bfloat16 else None
    return DeviceLinearEncoding(w, b, vt, vw, vnorm, cw, rnorm, vsplit)


#: added to the GEMM factor where the reference is the bf16 split product (:func:`_reference`): the split's
#: residual (2^-24 |vt_k|) and the two fp32 additions of the three parts (2 x 2^-24 of their sum), each
#: bounded by 2^-24 sum_k |vt_k x_ik| <= 2^-24 ||x_i|| ||r|| (|vt_k| <= r_k)
U_SPLIT = 3 * 2.0**-24


def _reference(enc: DeviceLinearEncoding, x2: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``W_chk^T (W x^T + b)`` (P x M, fp32) and what its computation adds to the factor: for bf16 x on a
    device with the half GEMM with fp32 output, one bf16 GEMV over x as it is (no fp32 copy of the
    activations: exact products, fp32 sums) against the three-part split of ``vt``; else the fp32 GEMV
    over the upcast x."""
    p = enc.vt.shape[0]
    if enc.vsplit is not None and x2.dtype == torch.bfloat16:
        parts = device_half_mm(x2, enc.vsplit)  # (M, 3P)
        if parts is not None:
            ref = (parts[:, :p] + parts[:, p:2 * p] + parts[:, 2 * p:]).t()
            return (ref + enc.vw[:, None] if enc.vw is not None else ref), U_SPLIT
    xs = x2 if x2.dtype == torch.float32 else x2.float()
    return (torch.addmm(enc.vw[:, None], enc.vt, xs.t()) if enc.vw is not None else enc.vt @ xs.t()), 0.0


def _output_sums(y2: torch.Tensor) -> torch.Tensor:
    """``W_chk^T y^T`` (P x M, fp32): a half ``y`` read as it is where the device has the half GEMM with
    fp32 output (the +-1 weights are exact in the half dtype, the products exact, the sums fp32)."""
    n = y2.shape[1]
    if y2.dtype != torch.float32:
        got = device_half_mm(y2, check_weights(n, y2.device, y2.dtype).t())
        if got is not None:
            return got.t()
        y2 = y2.float()
    return check_weights(n, y2.device, torch.float32) @ y2.t()


def check_device_linear(enc: DeviceLinearEncoding, x2: torch.Tensor, y2: torch.Tensor, path: GemmPath, *,
                        lam: float | None = None, op: str = "linear") -> DeviceCheck:
    """Check ``y2 = x2 W^T + b`` (2-D; ``y2`` the fp32 accumulator or the rounded half output, read as it
    is) with device operations only; the verdict stays on the device (:class:`DeviceCheck`)."""
    lam = GEMM_LAMBDA if lam is None else lam
    (m, k), n = x2.shape, enc.w.shape[0]
    out_dtype = path.dtype if path.u_out else None  # (a rounded half output: its subnormal range in the bound)
    with torch.no_grad(), precise_fp32():
        ref, u_ref = _reference(enc, x2.detach())
        got = _output_sums(y2.detach())
        extra = path.extra(enc.k, lam) + u_ref
        factor, det, tiny = gemm_constants(enc.k, m, n, path.u, lam, extra, torch.float32, out_dtype)
        ra = ref.abs()
        lb = (ra * enc.cw[:, None]).amax(0).mul_(factor).add_(ra[0], alpha=det).add_(tiny)
        worst = ((got - ref).abs_().amax(0) / lb).max() if m else torch.zeros((), device=y2.device)

    def exact(exact_ratio: bool) -> CheckReport:
        with torch.no_grad(), precise_fp32():
            rc = RowChecks(ref, enc.vnorm, x2.detach().float(), enc.w.t().float(),
                           None if enc.bias is None else enc.bias.float(), None, enc.rnorm)
            diff = host((got - ref).abs().amax(0))
            return verify_gemm(GemmEncoding(m, k, n, rows=rc, bias=rc.v), y2.detach().float(), dtype=path.dtype,
                               lam=lam, u=path.u, u_out=extra, op=op, diff=diff, exact_ratio=exact_ratio,
                               out_dtype=out_dtype)

    return DeviceCheck(worst, dtype_name(path.dtype), (m, k, n), exact, op, path)


def device_linear(x: torch.Tensor, enc: DeviceLinearEncoding, *, lam: float | None = None
                  ) -> tuple[torch.Tensor, DeviceCheck]:
    """``F.linear(x, W, b)`` on the device's own kernel, checked on the device (module docstring); returns
    ``(y, check)`` with ``y`` in x's dtype, autograd intact (the ``rounded`` paths where it is needed).
    On CUDA with Triton, bf16/fp16 (and fp32 with TF32) without autograd: the fused checked kernel instead
    (:func:`..triton_abft.linear.fused_linear`, issue 32)."""
    if x.is_cuda and gemm_wanted(x, enc.w, enc.bias):
        from ..triton_abft.linear import fused_linear

        return fused_linear(x, enc, lam=lam)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    half = x.dtype != torch.float32
    grad = torch.is_grad_enabled() and (x.requires_grad or enc.w.requires_grad or
                                        (enc.bias is not None and enc.bias.requires_grad))
    acc = None
    if half and not grad:
        with torch.no_grad():
            acc = device_half_mm(x2, enc.w.t())
    path = gemm_path(x.dtype, cuda_like(x), fp32_out=acc is not None)
    if acc is not None:
        if enc.bias is not None:
            acc.add_(enc.bias.float())
        y2, chk = acc.to(x.dtype), check_device_linear(enc, x2, acc, path, lam=lam)
    else:
        y2 = F.linear(x2, enc.w, enc.bias)
        chk = check_device_linear(enc, x2, y2, path, lam=lam)
    return (y2 if x.dim() == 2 else y2.reshape(*x.shape[:-1], enc.w.shape[0])), chk
