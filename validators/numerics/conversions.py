"""Groups ``conversions`` and ``special_values``.

``conversions``: fp32 -> bf16/fp16 on the device must round to nearest, ties to even. Checked
exhaustively in one vectorised conversion per dtype: every one of the 65536 bit patterns (as
fp32 inputs, which must convert exactly), every halfway point between consecutive numbers (the
fp32 midpoint must round to the neighbour with an even significand; the midpoint above the
largest finite number rounds to inf), and the fp32 neighbours just above and below each midpoint.
The expected bit patterns are computed with integer arithmetic and numpy's IEEE decoding, never
with torch's conversion. Widening back to fp32 must be exact for every pattern.

``special_values``: subnormals kept (required: IEEE 754 requires gradual underflow for binary16
and bfloat16 follows binary32, which has it), overflow to inf, NaN propagation through common
operators, and signed zero. A case the device has no kernel for (torch's "not implemented",
:mod:`mystique.validators.unsupported`) is left out and named; a case that raises anything else
makes its check an ``error`` row.
"""

from __future__ import annotations

import numpy as np
import torch

from mystique.dtypes import HALF_DTYPES
from mystique.dtypes import name as dtype_name

from ..unsupported import unsupported
from ._ctx import Ctx
from ._fp import FORMATS, hexbits

_MAX_PATTERN = {torch.bfloat16: 0x7F7F, torch.float16: 0x7BFF}
_INF_PATTERN = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}


def _decode(dtype: torch.dtype, patterns: np.ndarray) -> np.ndarray:
    """fp32 values of 16-bit patterns of ``dtype`` (numpy decoding, exact)."""
    p = patterns.astype(np.uint32)
    if dtype == torch.bfloat16:
        return (p << 16).view(np.float32)
    return p.astype(np.uint16).view(np.float16).astype(np.float32)


def conversion_cases(dtype: torch.dtype) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Inputs (fp32) and expected 16-bit patterns (-1: any NaN) of each conversion case.

    Returns ``{"exact": ..., "tie": ..., "near_tie": ...}``, each ``(inputs_f32, expected_i32)``.
    """
    all_p = np.arange(65536, dtype=np.uint32)
    exact_in = _decode(dtype, all_p)
    exact_exp = np.where(np.isnan(exact_in), -1, all_p.astype(np.int64))

    fmt = FORMATS[dtype]
    p = np.arange(_MAX_PATTERN[dtype] + 1, dtype=np.uint32)
    lo = _decode(dtype, p).astype(np.float64)
    hi = np.empty_like(lo)
    hi[:-1] = lo[1:]
    hi[-1] = 2.0 ** (fmt.emax + 1)  # the number the next pattern would have without overflow
    mid64 = (lo + hi) / 2
    mid = mid64.astype(np.float32)
    if not np.array_equal(mid.astype(np.float64), mid64):  # cannot happen for these formats
        raise AssertionError("midpoints not representable in fp32")
    even = np.where(p % 2 == 0, p, p + 1).astype(np.int64)
    above = np.nextafter(mid, np.float32(np.inf))
    below = np.nextafter(mid, np.float32(0))
    sign = np.int64(0x8000)

    def both_signs(x: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate([x, -x]), np.concatenate([e, e | sign])

    tie = both_signs(mid, even)
    near = both_signs(np.concatenate([above, below]), np.concatenate([p + 1, p]).astype(np.int64))
    return {"exact": (exact_in, exact_exp), "tie": tie, "near_tie": near}


def run_conversions(ctx: Ctx) -> None:
    """Rows ``conversion_exact``, ``conversion_round_nearest_even``, ``conversion_near_tie``, ``conversion_widening_exact``."""
    checks = {"exact": "conversion_exact", "tie": "conversion_round_nearest_even", "near_tie": "conversion_near_tie"}
    for dtype in [d for d in ctx.dtypes if d in HALF_DTYPES]:
        name = dtype_name(dtype)
        cases = conversion_cases(dtype)
        keys = list(cases)
        x = np.concatenate([cases[k][0] for k in keys])
        expected = torch.from_numpy(np.concatenate([cases[k][1] for k in keys]))
        bounds = np.cumsum([0] + [len(cases[k][0]) for k in keys])
        xd = ctx.to_device(torch.from_numpy(x))
        try:
            out = ctx.on_device(lambda xd=xd, dtype=dtype: xd.to(dtype)).cpu()
        except RuntimeError as exc:
            ctx.error("conversion_exact", f"float32_to_{name}", exc, dtype=dtype, repro=ctx.repro(n=len(x)))
            continue
        got = out.view(torch.int16).to(torch.int64) & 0xFFFF
        ok = torch.where(expected < 0, torch.isnan(out), got == expected)
        for i, key in enumerate(keys):
            sl = slice(int(bounds[i]), int(bounds[i + 1]))
            bad = (~ok[sl]).nonzero().reshape(-1)
            examples = ""
            if len(bad):
                ins = torch.from_numpy(x[sl][bad[:3].numpy()])
                examples = "first mismatches (fp32 in -> got, expected): " + ", ".join(
                    f"{h} -> 0x{int(g):04x}, {'NaN' if int(e) < 0 else f'0x{int(e):04x}'}"
                    for h, g, e in zip(hexbits(ins), got[sl][bad[:3]].tolist(), expected[sl][bad[:3]].tolist()))
            ctx.bound(checks[key], f"float32_to_{name}", "mismatches", float(len(bad)), 0.0, dtype=dtype,
                      unit="values", detail=f"{sl.stop - sl.start} inputs" + (f"; {examples}" if examples else ""),
                      repro=ctx.repro(case=key, inputs="all"))
        # widening: every pattern back to fp32 exactly
        pats = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)
        ref = torch.from_numpy(cases["exact"][0])
        pd = ctx.to_device(pats)
        try:
            wide = ctx.on_device(lambda pd=pd: pd.float()).cpu()
        except RuntimeError as exc:
            ctx.error("conversion_widening_exact", f"{name}_to_float32", exc, dtype=dtype, repro=ctx.repro())
            continue
        okw = torch.where(torch.isnan(ref), torch.isnan(wide), wide.view(torch.int32) == ref.view(torch.int32))
        badw = (~okw).nonzero().reshape(-1)
        ctx.bound("conversion_widening_exact", f"{name}_to_float32", "mismatches", float(len(badw)), 0.0,
                  dtype=dtype, unit="values", detail="65536 inputs" + (
                      f"; first mismatching patterns: {', '.join(hexbits(pats[badw[:3]]))}" if len(badw) else ""),
                  repro=ctx.repro(inputs="all"))


def _special_dtypes(ctx: Ctx) -> list[torch.dtype]:
    return [d for d in ctx.dtypes if d in FORMATS]


def run_special_values(ctx: Ctx) -> None:
    """Rows ``subnormals``, ``overflow_to_inf``, ``nan_propagation``, ``signed_zero`` per dtype."""
    for dtype in _special_dtypes(ctx):
        fmt = FORMATS[dtype]
        wide = torch.float64 if dtype == torch.float32 else torch.float32
        for check, suffix, fn in _SPECIAL:
            try:
                fn(ctx, dtype, fmt, wide)
            except CaseError as exc:  # the device raised: an error, never a skip or a pass
                ctx.error(check, f"{dtype_name(dtype)}_{suffix}", exc.exc, dtype=dtype, repro=ctx.repro(case=exc.name))


def _run_cases(ctx: Ctx, cases: list[tuple[str, callable]], dtype: torch.dtype) -> tuple[list[str], list[str]]:
    """Run named device computations returning (ok: bool); collect failed and unsupported names.

    A case that raises is unsupported only where torch says the device has no kernel for it
    (:func:`mystique.validators.unsupported.unsupported`); any other exception propagates (the
    :func:`run_special_values` makes it the check's ``error`` row)."""
    failed, unsupported_ = [], []
    for name, fn in cases:
        try:
            if not ctx.on_device(fn):
                failed.append(name)
        except RuntimeError as exc:
            if not unsupported(exc):
                raise CaseError(name, exc) from exc
            unsupported_.append(name)
    return failed, unsupported_


class CaseError(Exception):
    """A case of a special-value check raised something other than torch's "not implemented"."""

    def __init__(self, name: str, exc: BaseException):
        super().__init__(f"case {name}: {type(exc).__name__}")
        self.name, self.exc = name, exc


def _same(out: torch.Tensor, expected: torch.Tensor) -> bool:
    o = out.detach().cpu().double()
    return bool(torch.equal(o, expected.double()) and torch.equal(torch.signbit(o), torch.signbit(expected.double())))


def _subnormals(ctx: Ctx, dtype: torch.dtype, fmt, wide: torch.dtype) -> None:
    s = fmt.min_subnormal
    sub = torch.tensor([s, 3 * s, fmt.tiny - s, -s, -(fmt.tiny - s)], dtype=torch.float64)
    d = ctx.to_device(sub.to(dtype))
    dw = ctx.to_device(sub.to(wide))
    tiny = ctx.to_device(torch.tensor([fmt.tiny, -fmt.tiny, 3 * fmt.tiny], dtype=dtype))
    a = ctx.to_device(torch.tensor([fmt.tiny * 1.5], dtype=dtype))
    b = ctx.to_device(torch.tensor([fmt.tiny], dtype=dtype))
    cases = [
        (f"convert_{dtype_name(wide)}", lambda: _same(dw.to(dtype), sub)),
        ("mul_one", lambda: _same(d * 1, sub)),
        ("add_zero", lambda: _same(d + torch.zeros_like(d), sub)),
        ("abs", lambda: _same(torch.abs(d), sub.abs())),
        ("halve_normal", lambda: _same(tiny * 0.5, torch.tensor([fmt.tiny, -fmt.tiny, 3 * fmt.tiny]) * 0.5)),
        ("subtract_to_subnormal", lambda: _same(a - b, torch.tensor([fmt.tiny * 0.5]))),
    ]
    failed, unsupported = _run_cases(ctx, cases, dtype)
    kept = 0.0 if failed else 1.0
    detail = (f"flushed in: {', '.join(failed)}" if failed else "gradual underflow in all of: "
              + ", ".join(n for n, _ in cases if n not in unsupported))
    if unsupported:
        detail += f"; unsupported on device: {', '.join(unsupported)}"
    ctx.fact("subnormals", f"{dtype_name(dtype)}_subnormals", "subnormals_preserved", kept, ok=not failed,
             dtype=dtype, threshold=1.0, detail=detail + ("; IEEE 754 requires subnormals" if failed else ""),
             repro=ctx.repro(values=f"min_subnormal={s:.3g}"))


def _overflow(ctx: Ctx, dtype: torch.dtype, fmt, wide: torch.dtype) -> None:
    mx = fmt.max
    half_ulp = 2.0 ** (fmt.emax - fmt.p)  # half the ulp at the top binade
    # just below the rounding threshold (max + half ulp) must give max; at or above it, inf
    src = torch.tensor([2 * mx, -2 * mx, mx + half_ulp, mx + half_ulp * 0.75, -(mx + half_ulp * 0.75)],
                       dtype=torch.float64)
    exp_conv = torch.tensor([float("inf"), float("-inf"), float("inf"), mx, -mx], dtype=torch.float64)
    sw = ctx.to_device(src.to(wide))
    top = ctx.to_device(torch.tensor([mx, -mx], dtype=dtype))
    big_log = torch.tensor([1.01 * float(np.log(mx))]).to(dtype)
    bl = ctx.to_device(big_log)
    cases = [
        (f"convert_{dtype_name(wide)}", lambda: _same(sw.to(dtype), exp_conv)),
        ("mul_two", lambda: _same(top * 2, torch.tensor([float("inf"), float("-inf")]))),
        ("add_self", lambda: _same(top + top, torch.tensor([float("inf"), float("-inf")]))),
        ("exp", lambda: _same(torch.exp(bl), torch.tensor([float("inf")]))),
    ]
    failed, unsupported = _run_cases(ctx, cases, dtype)
    detail = f"wrong in: {', '.join(failed)}" if failed else "overflow gives inf, values below the threshold give max"
    if unsupported:
        detail += f"; unsupported on device: {', '.join(unsupported)}"
    ctx.bound("overflow_to_inf", f"{dtype_name(dtype)}_overflow", "failing_cases", float(len(failed)), 0.0,
              dtype=dtype, detail=detail, repro=ctx.repro(max=f"{mx:.6g}"))


def _nan(ctx: Ctx, dtype: torch.dtype) -> None:
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 2.0, -3.0], [0.5, 1.0, -1.0, 2.0]], dtype=dtype)
    xd = ctx.to_device(x)
    eye = ctx.to_device(torch.ones(4, 3, dtype=dtype))
    nan_row = torch.tensor([True, False])

    def row_nan(t: torch.Tensor) -> bool:
        t = t.detach().cpu()
        return bool(torch.isnan(t[0]).all() and not torch.isnan(t[1]).any())

    cases = [
        ("add", lambda: bool(torch.isnan((xd + 1).cpu()).sum() == 1)),
        ("mul", lambda: bool(torch.isnan((xd * 2).cpu()).sum() == 1)),
        ("exp", lambda: bool(torch.isnan(torch.exp(xd).cpu()).sum() == 1)),
        ("relu", lambda: bool(torch.isnan(torch.relu(xd).cpu()).sum() == 1)),
        ("maximum", lambda: bool(torch.isnan(torch.maximum(xd, torch.zeros_like(xd)).cpu()).sum() == 1)),
        ("sum", lambda: torch.equal(torch.isnan(xd.sum(1).cpu()), nan_row)),
        ("amax", lambda: torch.equal(torch.isnan(xd.amax(1).cpu()), nan_row)),
        ("mm", lambda: row_nan(xd @ eye)),
        ("softmax", lambda: row_nan(torch.softmax(xd, 1))),
    ]
    if dtype in HALF_DTYPES:
        xw = ctx.to_device(torch.tensor([nan, -nan, 1.0]))
        cases.append(("convert_float32", lambda: bool(torch.isnan(xw.to(dtype).cpu()).sum() == 2)))
    failed, unsupported = _run_cases(ctx, cases, dtype)
    detail = f"NaN lost in: {', '.join(failed)}" if failed else f"NaN propagated by {len(cases) - len(unsupported)} ops"
    if unsupported:
        detail += f"; unsupported on device: {', '.join(unsupported)}"
    ctx.bound("nan_propagation", f"{dtype_name(dtype)}_nan", "ops_losing_nan", float(len(failed)), 0.0,
              dtype=dtype, detail=detail, repro=ctx.repro())


def _signed_zero(ctx: Ctx, dtype: torch.dtype, fmt, wide: torch.dtype) -> None:
    nz = torch.tensor([-0.0], dtype=torch.float64)
    zd = ctx.to_device(torch.tensor([-0.0, 0.0], dtype=dtype))
    zw = ctx.to_device(torch.tensor([-0.0, 0.0, -fmt.min_subnormal / 4], dtype=wide))
    t = ctx.to_device(torch.tensor([-fmt.tiny], dtype=dtype))
    pz = ctx.to_device(torch.tensor([0.0], dtype=dtype))
    cases = [
        (f"convert_{dtype_name(wide)}", lambda: _same(zw.to(dtype), torch.tensor([-0.0, 0.0, -0.0]))),
        ("neg", lambda: _same(-pz, nz)),
        ("mul_one", lambda: _same(zd * 1, torch.tensor([-0.0, 0.0]))),
        ("add_neg_zeros", lambda: _same(zd[:1] + zd[:1], nz)),
        ("underflow_product", lambda: _same(t * t.abs(), nz)),
    ]
    failed, unsupported = _run_cases(ctx, cases, dtype)
    detail = f"sign of zero lost in: {', '.join(failed)}" if failed else "-0.0 kept"
    if unsupported:
        detail += f"; unsupported on device: {', '.join(unsupported)}"
    ctx.bound("signed_zero", f"{dtype_name(dtype)}_signed_zero", "failing_cases", float(len(failed)), 0.0,
              dtype=dtype, detail=detail, repro=ctx.repro())


#: the special-value checks: (check, subject suffix, function of (ctx, dtype, format, wider dtype))
_SPECIAL = (("subnormals", "subnormals", _subnormals), ("overflow_to_inf", "overflow", _overflow),
            ("nan_propagation", "nan", lambda ctx, dtype, fmt, wide: _nan(ctx, dtype)),
            ("signed_zero", "signed_zero", _signed_zero))
