"""Check group ``abft_gemm``: the checked GEMM per dtype and checked Linear layers of a workload.

Per dtype (float32, bfloat16, float16, int8) a clean checked product must raise no alarm and stay
within its error bound of the CPU golden; one flip injected between product and check must be
detected and located. bf16/fp16 run the device's own half-precision GEMM (its fp32 output where the
backend has one, else its rounded output with the rounding in the threshold); int8 its int8 GEMM.
Then the Linear layers of the debug DLRM, protected, must catch a flip in one Linear's output.
"""

from __future__ import annotations

import math
import random

import torch

from mystique.faults.bits import flip_random, hash_seed

from ...groups import GroupContext
from ..abft import UNIT_ROUNDOFF, accumulate, checked_mm, encode_gemm, half_kind, verify_gemm
from ..half import HALF, SUBNORMAL_HALF_SPACING, U32, U_HALF, accumulation_u, rounded_half_mm
from ..half import describe as describe_half
from ..inject import flip_module_output, flip_tensor
from ..protect import protect
from .common import workload

SHAPE = (64, 80, 48)  # M, K, N of the checked products


def run_abft_gemm(ctx: GroupContext) -> None:
    for dt in ("float32", "bfloat16", "float16", "int8"):
        a, b = _operands(dt, ctx.seed, ctx.target.device)
        # bf16/fp16: the device's own half-precision GEMM, through its fp32 output where it has one, else
        # with its rounded output (the fp32 GEMM of upcast operands would not run the half-precision units)
        kind = ""
        if a.dtype in HALF:
            with ctx.target.active():
                kind = "fp32_out" if half_kind(a) == "fp32_out" else "rounded"
        how = f"; {describe_half(kind, a.dtype)}" if kind else ""
        _clean_row(ctx, dt, a, b, kind, how)
        _injected_row(ctx, dt, a, b, kind, how)
    _protected_dlrm(ctx)


def _operands(dt: str, seed: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dt == "int8":
        a = torch.randint(-128, 128, SHAPE[:2], generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, SHAPE[1:], generator=g, dtype=torch.int8)
    else:
        a = torch.randn(SHAPE[:2], generator=g).to(getattr(torch, dt))
        b = torch.randn(SHAPE[1:], generator=g).to(getattr(torch, dt))
    return a.to(dev), b.to(dev)


def _clean_row(ctx: GroupContext, dt: str, a: torch.Tensor, b: torch.Tensor, kind: str, how: str) -> None:
    golden = accumulate(a.cpu(), b.cpu())
    with ctx.target.active():
        c, rep = checked_mm(a, b, check_rounded=kind == "rounded")
    expect = golden if dt in ("float32", "int8") else golden.to(a.dtype)
    ratio, at, bound = golden_deviation(c, expect, a, b, dt, kind)
    wrong = not ratio <= 1.0  # (NaN: wrong)
    ctx.res.add("abft_gemm", "checked_mm", "clean_alarm", float(rep.alarm), dtype=dt, threshold=0,
                status="fail" if rep.alarm or wrong else "pass",
                detail=f"{rep.describe()} seed={ctx.seed}; max |c - golden| / bound = {ratio:.3g}"
                       + (f" at {at}" if at is not None else "") + f" against the CPU golden, {bound}"
                       + ("; the product differs from the CPU golden beyond its bound" if wrong else "") + how)


def _injected_row(ctx: GroupContext, dt: str, a: torch.Tensor, b: torch.Tensor, kind: str, how: str) -> None:
    """One flip in the accumulator (the rounded output where that is what the device gives), between
    product and check."""
    seed = ctx.seed
    bit_class = "high" if dt == "int8" else "exponent"
    with ctx.target.active():
        enc = encode_gemm(a, b) if dt == "int8" else encode_gemm(a.float(), b.float())
        if kind == "rounded":
            out = rounded_half_mm(a, b)
            # its largest element: an exponent flip moves it by >= |c_ij| / 2, well above the rounding
            # bound of its row (u_out sum_j |c_ij|), which a smaller element's flip may stay under
            rec = flip_random(out, random.Random(hash_seed(seed, "abft_gemm", dt)), bit_class=bit_class,
                              site="gemm_output", target=f"gemm_{dt}", seed=seed,
                              index=int(out.float().abs().argmax()))
            rep = verify_gemm(enc, out.float(), dtype=a.dtype, u=accumulation_u(a),
                              u_out=UNIT_ROUNDOFF[a.dtype], op="gemm_rounded")
        else:
            acc = accumulate(a, b)
            rec = flip_tensor(acc, seed=seed, site="gemm_output", name=f"gemm_{dt}", bit_class=bit_class)
            rep = verify_gemm(enc, acc, dtype=a.dtype)
    i, j = divmod(rec.index, SHAPE[2])
    located = rep.location == (i, j)
    ctx.res.add("abft_gemm", "checked_mm", "injected_detected", float(rep.alarm and located), dtype=dt,
                threshold=1, status="pass" if rep.alarm and located else "fail",
                detail=f"{rec.describe()}; {rep.describe()} (expected location {(i, j)}){how}")


def _protected_dlrm(ctx: GroupContext) -> None:
    """Checked Linear layers of a real workload (DLRM debug), with a flip in one Linear output."""
    res, target, seed, dev = ctx.res, ctx.target, ctx.seed, ctx.target.device
    wl = workload("dlrm")
    if wl is None:
        res.add("abft_gemm", "protect_dlrm", "injected_detected", math.nan, status="skip",
                detail="mystique.workloads.dlrm is not available")
        return
    mod, cfg = wl
    model = mod.build_model(cfg, device=torch.device(dev), dtype=torch.float32, seed=seed).eval()
    batch = mod.make_batch(cfg, device=torch.device(dev), seed=seed)
    linear_name = next(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad(), protect(model) as guard:
        with target.active():
            mod.forward(model, batch)
        clean_alarms = len(guard.alarms)
        with flip_module_output(model.get_submodule(linear_name), seed=seed, bit_class="exponent",
                                name=linear_name) as recs, target.active():
            mod.forward(model, batch)
    hit = [a for a in guard.alarms[clean_alarms:] if a.module == linear_name]
    res.add("abft_gemm", "protect_dlrm", "injected_detected", float(bool(hit)), threshold=1, dtype="float32",
            status="pass" if hit and clean_alarms == 0 else "fail",
            detail=f"{recs[0].describe() if recs else 'no flip'}; clean alarms {clean_alarms}; "
                   f"{hit[0].describe() if hit else 'not detected'}")


def golden_deviation(c: torch.Tensor, expect: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt: str, kind: str
                     ) -> tuple[float, tuple[int, int] | None, str]:
    """``(max_ij |c - golden|_ij / bound_ij, its (i, j) or None, the bound in words)`` of a clean checked product.

    int8: the int32 product is exact, bound 0 (any difference: inf). Floats: the device's product and the
    CPU golden (the fp32 GEMM of the same operands) each lie within ``gamma_k(u) (|A||B|)_ij`` of the exact
    product (``gamma_k(u) = k u / (1 - k u)``, ``u`` of each accumulation: the ABFT threshold's GEMM error
    bound), and a bf16/fp16 output is rounded once more on each side (``u_out (1 + gamma) (|A||B|)_ij``,
    plus half the subnormal spacing), so ``|c - golden|_ij <= (gamma_dev + gamma_cpu + 2 u_out (1 + gamma))
    (|A||B|)_ij + 2 s``.
    """
    got, ref = c.detach().cpu(), expect.detach().cpu()
    if dt == "int8":
        diff = torch.nonzero(got.to(torch.int64) != ref.to(torch.int64))
        at = tuple(int(v) for v in diff[0]) if len(diff) else None
        return (math.inf if at is not None else 0.0), at, "bound 0 (exact int32 product)"  # type: ignore[return-value]
    k = a.shape[1]
    low = a.dtype in HALF
    u_dev = accumulation_u(a) if low else U32
    u_cpu = U32

    def gamma(u: float) -> float:
        return k * u / (1 - k * u) if k * u < 1 else math.inf

    u_out = U_HALF[a.dtype] if low else 0.0
    floor = 2 * SUBNORMAL_HALF_SPACING[a.dtype] if low else 0.0
    coef = gamma(u_dev) + gamma(u_cpu) + 2 * u_out * (1 + max(gamma(u_dev), gamma(u_cpu)))
    bound = coef * (a.detach().cpu().double().abs() @ b.detach().cpu().double().abs()) + floor
    err = (got.double() - ref.double()).abs()
    with torch.no_grad():
        r = torch.where(err == 0, torch.zeros_like(err), err / bound)
        r = torch.where(torch.isfinite(got.double()), r, torch.full_like(r, math.inf))
    flat = int(r.argmax()) if r.numel() else 0
    ratio = float(r.reshape(-1)[flat]) if r.numel() else 0.0
    at = divmod(flat, r.shape[1]) if ratio > 0 else None

    def p2(u: float) -> str:
        return f"2^{int(math.log2(u))}"

    text = (f"bound (gamma_{k}(u={p2(u_dev)}) [device] + gamma_{k}(u={p2(u_cpu)}) [CPU golden]"
            + (f" + 2 u_out (1 + gamma) with u_out = {p2(u_out)}) (|A||B|)_ij + 2 x {floor / 2:.3g} (subnormal "
               "rounding)" if low else ") (|A||B|)_ij")
            + f", gamma_k(u) = k u / (1 - k u) (the GEMM error bound of the ABFT threshold, {coef:.3g} x (|A||B|)_ij)")
    return ratio, at, text

