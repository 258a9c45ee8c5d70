"""Group ``op_sweep``: every operator of the sweep on the device, judged against an fp64 golden.

For each case and dtype (bf16, fp16, fp32): inputs are drawn in fp32 on the CPU from the run seed
and rounded to the dtype; the golden is the same operator in fp64 on the CPU from those rounded
inputs (outside ``target.active()``); the device runs the operator on the rounded inputs inside it.

Bounds (all stated in the rows' ``threshold``, their derivation in the ``detail``):

* Reductions (sum, mean, cumsum, softmax, log_softmax, layer_norm, rms_norm, cross_entropy,
  embedding_bag): ``normwise_error`` = ||out - golden|| / ||golden|| must be at most ||b|| / ||golden||,
  where b is a componentwise bound derived in :mod:`.bounds` that holds for ANY summation order the
  device may use (sequential, blocked, tree, split over threads and blocks; partial sums kept in
  fp32, or, where a real kernel does so, rounded to the dtype at every combine as CUDA's scan
  does), plus the final rounding(s) to the dtype. fp32 accumulation uses Higham & Mary's
  probabilistic gamma~ (a healthy device fails a row with probability at most 1e-6 under their
  model) or the worst-case gamma where that is smaller.
* Other ops: ``normwise_error`` must be at most ``2 * max(ideal, reference) + 4 * u32 * sqrt(n)``
  (n: the op's reduction length, 1 for elementwise ops), where ``ideal`` is the error of the golden
  rounded once to the dtype (for outputs of fewer than 64 values at least the dtype's unit roundoff
  ``u``), and ``reference`` is the error of a plain reference implementation where the op's
  standard algorithm rounds more than once: GEMMs and convolutions accumulate sequentially in fp32
  (the worst common order), and attention rounds the score and probability matrices to the dtype
  before the next product (as flash-style kernels do).
* GEMMs (mm, bmm, addmm, linear, baddbmm, conv2d): ``componentwise_error`` =
  max_ij |C - C_ref|_ij / (|A||B|)_ij (plus |beta||M| for the added term) must be at most
  ``2 * (u_out + gamma_K(u32))``: the standard bound of an fp32-accumulating GEMM with one output
  rounding, doubled, which also admits a split-K GEMM whose partial sums are rounded to the output
  dtype once before the final reduction; a GEMM accumulating in bf16/fp16 exceeds it. Where the
  device type under test (``target.device_type``: the emulated one when emulating) is CUDA and its
  flags allow TF32 for fp32 GEMMs (``torch.backends.cuda.matmul.allow_tf32`` or a matmul precision
  other than ``highest``) or convolutions (``torch.backends.cudnn.allow_tf32``, on by default),
  the reference reads only the first 10 mantissa bits of its inputs (truncation: the worse of the
  legal TF32 conversions, as PyTorch's numerical-accuracy note describes the tensor cores) and the
  componentwise bound adds ``2 * u_tf32`` (a truncated input errs by less than ``2 u_tf32``); the
  row's detail says "tf32 allowed".
* Elementwise ops (exp, log, rsqrt, gelu erf/tanh, silu): ``max_ulp_error`` must be at most 1 ulp
  for bf16/fp16 (twice the 0.5 ulp of a correctly rounded result; an fp32 evaluation rounded once
  stays within it) and at most the per-op fp32 bound of ``FP32_ULP_BOUNDS``. bf16/fp16 inputs are
  exhaustive: every finite number of the dtype in the op's domain. gelu's error is measured in ulps
  of max(|y|, |x|) because the erf/tanh formulation cancels for negative x (the gate's absolute
  error, scaled by x). Results below the dtype's normal range are left to the ``subnormals`` check.
* SDPA backends: a backend that has no kernel for the inputs (asked first: on CUDA through
  ``torch.backends.cuda.can_use_*``; under an emulated CUDA through
  :func:`mystique.emulation.attention.refusal`; elsewhere recognised from SDPA's own "no kernel"
  refusal) gives a ``skip`` row with torch's reason; any other exception is an ``error``.
"""


from __future__ import annotations

import contextlib
import math
import warnings
import zlib

import torch
from torch.nn.attention import sdpa_kernel

from mystique.dtypes import name as dtype_name
from mystique.emulation import attention
from mystique.emulation.tf32 import conv_tf32_allowed, matmul_tf32_allowed
from mystique.errors import UsageError
from mystique.progress import Progress

from ..unsupported import unsupported
from ._ctx import Ctx, shapes_of
from ._fp import FORMATS, U32, U_TF32, componentwise_error, gamma, normwise_error, ulp_error
from .benchmark_shapes import benchmark_gemm_shapes
from .bounds import threshold
from .op_cases import Case, Inputs, elementwise_cases, gemm_cases, other_cases, sdpa_backends, workload_dims

SLACK_U32 = 4.0
SMALL_OUTPUT = 64
# fp32 max-ulp bounds: about twice the worst error a healthy x86 CPU (SLEEF/ATen vectorised kernels)
# shows over 32M sampled inputs (exp 0.57, log 0.54, rsqrt 1.49, gelu 5.4, gelu_tanh 1.55, silu 2.4),
# and never below the 2 ulp that CUDA's libdevice documents for expf/rsqrtf.
FP32_ULP_BOUNDS = {"exp": 2.0, "log": 2.0, "rsqrt": 3.0, "silu": 5.0, "gelu": 12.0, "gelu_tanh": 4.0}

def cases_for(ctx: Ctx) -> list[Case]:
    """The cases of this run (level, benchmark shapes, ``ops`` filter)."""
    extra = benchmark_gemm_shapes(ctx.options["benchmark"], ctx.full) if ctx.options.get("benchmark") else []
    dims = workload_dims()
    cases = (gemm_cases(dims, ctx.full, extra) + elementwise_cases()
             + other_cases(dims, ctx.full, sdpa_backends(ctx.device)))
    wanted = ctx.options.get("ops")
    if wanted:
        known = {c.op for c in cases}
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise UsageError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cases = [c for c in cases if c.op in set(wanted)]
    return cases


# ---------------------------------------------------------------- running

def _tf32(ctx: Ctx, case: Case, dtype: torch.dtype) -> bool:
    """Whether the device under test may compute this fp32 GEMM/convolution with TF32 inputs.

    Follows the device type the code behaves as (``target.device_type``: the emulated one when
    emulating) and CUDA's flags, read by the same functions the TF32 emulation obeys.
    """
    if dtype != torch.float32 or ctx.target.device_type != "cuda":
        return False
    if case.tf32_flag == "matmul":
        return matmul_tf32_allowed()
    if case.tf32_flag == "conv":
        return conv_tf32_allowed()
    return False


def run_op_sweep(ctx: Ctx) -> None:
    """Rows ``normwise_error``, ``componentwise_error`` (GEMMs) and ``max_ulp_error`` (elementwise)."""
    cases = cases_for(ctx)
    total = sum(len([d for d in c.dtypes if d in ctx.dtypes]) for c in cases)
    progress = Progress("numerics op_sweep", total=total)
    for case in cases:
        for dtype in [d for d in case.dtypes if d in ctx.dtypes]:
            progress.step(f"{case.subject} {dtype_name(dtype)}")
            _run_case(ctx, case, dtype)


def _device_result(ctx: Ctx, case: Case, dtype: torch.dtype, dev: Inputs, repro: str) -> torch.Tensor | None:
    """The device's output on the CPU, or None after a ``skip``/``error`` row.

    An SDPA backend is first asked whether it has a kernel for these inputs
    (:func:`mystique.emulation.attention.refusal`); a backend that says no, or whose call ends in
    SDPA's own "no kernel" refusal, is a ``skip`` carrying torch's reason. Any other exception of
    an SDPA case is an ``error``; other cases skip only where torch says the device has no kernel for
    the op or dtype (:func:`mystique.validators.unsupported.unsupported`), and are an ``error`` otherwise.
    """
    if case.backend is not None:
        reason = attention.refusal(case.backend, dev["q"], dev["k"], dev["v"], bool(case.extra.get("causal")),
                                   ctx.target.device_type)
        if reason:
            ctx.skip("normwise_error", case.subject, f"{case.backend.name} has no kernel on {ctx.target.label} "
                     f"for these inputs: {reason}", dtype=dtype, metric="rel_error")
            return None

    def device_call() -> torch.Tensor:
        if case.backend is None:
            return case.fn(**dev)
        with sdpa_kernel(case.backend):
            return case.fn(**dev)

    with contextlib.ExitStack() as stack:
        caught: list = []
        if case.backend is not None:  # torch states why a backend refused in UserWarnings
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
        try:
            return ctx.on_device(device_call).detach().cpu()
        except RuntimeError as exc:
            if case.backend is not None and attention.is_refusal(exc):
                reason = attention.reason_from_warnings(caught, case.backend) or str(exc).splitlines()[0][:160]
                ctx.skip("normwise_error", case.subject, f"{case.backend.name} has no kernel on {ctx.target.label} "
                         f"for these inputs: {reason}", dtype=dtype, metric="rel_error")
            elif case.backend is None and unsupported(exc):
                ctx.skip("normwise_error", case.subject, f"not implemented on {ctx.target.device}: "
                         f"{unsupported(exc)[:160]}", dtype=dtype, metric="rel_error")
            else:
                ctx.error("normwise_error", case.subject, exc, dtype=dtype, repro=repro)
            return None


def _run_case(ctx: Ctx, case: Case, dtype: torch.dtype) -> None:
    salt = zlib.crc32(f"{case.subject}/{dtype_name(dtype)}".encode())
    raw = case.make(ctx.generator(salt), dtype)
    low = {k: v.to(dtype) if v.is_floating_point() else v for k, v in raw.items()}
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in low.items()}
    shapes = shapes_of(low.values())
    repro = ctx.repro(op=case.op, variant=case.variant, dtype=dtype_name(dtype), shapes=shapes)
    golden = case.fn(**x64)
    dev = {k: ctx.to_device(v) for k, v in low.items()}
    out = _device_result(ctx, case, dtype, dev, repro)
    if out is None:
        return
    if out.dtype != dtype or out.shape != golden.shape:
        ctx.fact("normwise_error", case.subject, "rel_error", math.inf, ok=False, dtype=dtype,
                 detail=f"device returned {out.dtype} {tuple(out.shape)}, expected {dtype} {tuple(golden.shape)}",
                 repro=repro)
        return
    fmt = FORMATS[dtype]
    tf32 = _tf32(ctx, case, dtype)
    err = normwise_error(out, golden)
    ideal = normwise_error(golden.to(dtype), golden)
    if case.bound is not None:
        b, derivation = case.bound(x64, golden, dtype)
        thr = threshold(b, golden)
        how = f"bound ||b||/||y||, {derivation}; ideal (one rounding) {ideal:.3g}"
    else:
        if golden.numel() < SMALL_OUTPUT:
            ideal = max(ideal, fmt.u)
        ref_err = normwise_error(case.ref(low, dtype, tf32), golden) if case.ref is not None else 0.0
        n_red = max(case.k, 1)
        thr = 2.0 * max(ideal, ref_err) + SLACK_U32 * U32 * math.sqrt(n_red)
        how = f"bound 2*max(ideal {ideal:.3g}, reference {ref_err:.3g}) + {SLACK_U32:g}*u32*sqrt({n_red})"
    ctx.bound("normwise_error", case.subject, "rel_error", err, thr, dtype=dtype,
              detail=f"{shapes}; {how}" + ("; tf32 allowed" if tf32 else ""), repro=repro)
    if case.kind == "gemm":
        scale = case.scale(**x64)
        cw, idx = componentwise_error(out, golden, scale)
        u_acc_term = gamma(case.k, U32) + (2 * U_TF32 if tf32 else 0.0)
        thr_cw = 2.0 * (fmt.u + u_acc_term)
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), golden.shape)) if golden.numel() else ()
        ctx.bound("componentwise_error", case.subject, "max_err_over_abs_a_abs_b", cw, thr_cw, dtype=dtype,
                  detail=f"{shapes}; K={case.k}; bound 2*(u + gamma_K(u32)"
                  + (" + 2 u_tf32); tf32 allowed" if tf32 else ")"),
                  repro=f"{repro} worst_index={where}")
    elif case.kind == "elementwise":
        scale = case.ulp_scale(x64, golden) if case.ulp_scale is not None else None
        ulps = ulp_error(out, golden, dtype, scale)
        # results below the normal range are judged by the subnormals check, not in ulps here
        normal = (golden.abs() >= fmt.tiny) | (golden == 0) | ~torch.isfinite(golden)
        ulps = torch.where(normal, ulps, torch.zeros_like(ulps))
        worst = int(torch.argmax(torch.nan_to_num(ulps, nan=math.inf)))
        bound = FP32_ULP_BOUNDS.get(case.op, 2.0) if dtype == torch.float32 else 1.0
        x_worst = float(x64["x"].reshape(-1)[worst])
        ctx.bound("max_ulp_error", case.subject, "ulp", float(ulps.max()), bound, dtype=dtype, unit="ulp",
                  detail=f"{golden.numel()} inputs" + (" (every finite value in the domain)" if dtype != torch.float32
                                                        else "") + f"; {int((~normal).sum())} subnormal results "
                         "left to the subnormals check",
                  repro=f"{repro} worst_input={x_worst!r} got={float(out.reshape(-1)[worst])!r} "
                        f"golden={float(golden.reshape(-1)[worst])!r}")
