"""Group ``accumulation``: the accumulator precision of bf16/fp16 ``mm``, ``bmm`` and ``sum``.

Probe: row j holds ``[B, s, s, ... (16 times), 0, ..., 0, -B]`` with ``s = B * 2^-j`` (``B`` = 1 for
bf16, 2^10 for fp16, so every input and the exact result ``16 s`` are numbers of the
dtype). In exact arithmetic each row sums to ``16 s``. An accumulator with p significand bits
loses ``B + s`` once ``j >= p`` when it adds the s terms to B one at a time, so the result
collapses to 0; with any summation order a p >= j + 1 bit accumulator is exact (every partial sum
needs at most j + 1 bits). The reported ``accumulator_mantissa_bits`` is 1 + the largest j up to
which every row is exact (a lower bound when a tree order hides rounding; 30 means "at least").
A GEMM or sum of bf16/fp16 inputs that accumulates in fewer than 24 bits (fp32) fails.

Order dependence: random inputs with the reduction dimension permuted (exactly the same sum in
exact arithmetic). Outputs may differ (summation order is the device's choice), but each order's
result lies within the bound ``b`` of :mod:`.bounds` for fp32 accumulation in any order
(``sum_bound``, ``matmul_bound``: ``u|y| + (1+u) gamma sum|x|``) of the exact result, so two orders
differ by at most ``2b``: ``order_dependence`` reports the largest ``|r1 - r2| / 2b`` and fails
above 1 (an order-dependent reduction beyond what fp32 accumulation allows: low-precision partial
sums, a lost or doubled term).
"""

from __future__ import annotations

import math

import torch

from mystique.dtypes import HALF_DTYPES
from mystique.dtypes import name as dtype_name

from ._ctx import Ctx
from .bounds import matmul_bound, sum_bound

J_MAX = 29
N_SMALL = 16
K_PROBE = 64
REQUIRED_BITS = 24


def probe_rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe matrix (J_MAX x K_PROBE, in ``dtype``) and the exact row sums (fp64)."""
    big = 1.0 if dtype == torch.bfloat16 else 2.0 ** 10
    rows, exact = [], []
    for j in range(1, J_MAX + 1):
        s = big * 2.0 ** -j
        r = torch.zeros(K_PROBE, dtype=torch.float64)
        r[0] = big
        r[1:1 + N_SMALL] = s
        r[-1] = -big
        rows.append(r)
        exact.append(N_SMALL * s)
    m = torch.stack(rows)
    if not torch.equal(m.to(dtype).double(), m):
        raise AssertionError("probe not representable")
    return m.to(dtype), torch.tensor(exact, dtype=torch.float64)


def mantissa_bits(result: torch.Tensor, exact: torch.Tensor) -> int:
    """1 + the largest j such that rows 1..j are exact (J_MAX + 1 when all are)."""
    ok = (result.double().reshape(-1) == exact).tolist()
    j = 0
    while j < len(ok) and ok[j]:
        j += 1
    return j + 1


def run_accumulation(ctx: Ctx) -> None:
    """Rows ``accumulator_precision`` (fails below fp32) and ``order_dependence`` (fails beyond 2b)."""
    for dtype in [d for d in ctx.dtypes if d in HALF_DTYPES]:
        rows, exact = probe_rows(dtype)
        ones = torch.ones(K_PROBE, 4, dtype=dtype)
        rd, od = ctx.to_device(rows), ctx.to_device(ones)
        probes = {
            "mm": lambda rd=rd, od=od: (rd @ od)[:, 0],
            "bmm": lambda rd=rd, od=od: torch.bmm(rd.unsqueeze(0).expand(2, -1, -1).contiguous(),
                                                  od.unsqueeze(0).expand(2, -1, -1).contiguous())[1, :, 0],
            "sum": lambda rd=rd: rd.sum(-1),
        }
        for op, fn in probes.items():
            repro = ctx.repro(op=op, dtype=dtype_name(dtype), probe=f"{J_MAX}x{K_PROBE}")
            out = ctx.attempt("accumulator_precision", op, lambda fn=fn: ctx.on_device(fn).detach().cpu(), dtype=dtype,
                              repro=repro)
            if out is None:
                continue
            bits = mantissa_bits(out, exact)
            note = "at least " if bits > J_MAX else ""
            ctx.fact("accumulator_precision", op, "accumulator_mantissa_bits", bits, ok=bits >= REQUIRED_BITS,
                     dtype=dtype, unit="bits", threshold=REQUIRED_BITS,
                     detail=f"{note}{bits} significand bits (fp32 has 24)" + (
                         "" if bits >= REQUIRED_BITS else f"; accumulates in less than fp32, row j={bits} of the probe "
                         f"returned {float(out[bits - 1]):.6g} instead of {float(exact[bits - 1]):.6g}"),
                     repro=repro)
        _order(ctx, dtype)


def _order(ctx: Ctx, dtype: torch.dtype) -> None:
    g = ctx.generator(7919 + (dtype == torch.float16))
    k = 2048 if ctx.full else 512
    a = torch.randn(64, k, generator=g).to(dtype)
    b = (torch.randn(k, 64, generator=g) / k ** 0.5).to(dtype)
    perm = torch.randperm(k, generator=g)
    x = torch.randn(16, 4 * k, generator=g).to(dtype)
    xperm = torch.randperm(4 * k, generator=g)
    ad, bd = ctx.to_device(a), ctx.to_device(b)
    apd, bpd = ctx.to_device(a[:, perm].contiguous()), ctx.to_device(b[perm].contiguous())
    xd, xpd = ctx.to_device(x), ctx.to_device(x[:, xperm].contiguous())
    a64, b64, x64 = a.double(), b.double(), x.double()
    pairs = {
        "mm": (lambda: ad @ bd, lambda: apd @ bpd, k, lambda: matmul_bound(a64, b64, a64 @ b64, dtype)),
        "sum": (lambda: xd.sum(-1), lambda: xpd.sum(-1), 4 * k, lambda: sum_bound(x64, x64.sum(-1), dtype)),
    }
    for op, (f1, f2, n, bound) in pairs.items():
        repro = ctx.repro(op=op, dtype=dtype_name(dtype), reduction=n)
        try:
            r1 = ctx.on_device(f1).cpu()
            r2 = ctx.on_device(f2).cpu()
        except RuntimeError as exc:
            ctx.error("order_dependence", op, exc, dtype=dtype, repro=repro)
            continue
        _order_row(ctx, op, dtype, n, r1, r2, *bound(), repro)


def _order_row(ctx: Ctx, op: str, dtype: torch.dtype, n: int, r1: torch.Tensor, r2: torch.Tensor, b: torch.Tensor,
               how: str, repro: str) -> None:
    """``order_dependence``: the largest change of an output between the two orders over its bound ``2 b``."""
    if r1.shape != r2.shape or r1.shape != b.shape or r1.dtype != dtype or r2.dtype != dtype:
        ctx.bound("order_dependence", op, "spread_over_bound", math.nan, 1.0, dtype=dtype, repro=repro,
                  detail=f"device returned {r1.dtype} {tuple(r1.shape)} and {r2.dtype} {tuple(r2.shape)}, expected "
                         f"{dtype} {tuple(b.shape)}")
        return
    diff = int((r1.view(torch.int16) != r2.view(torch.int16)).sum())
    spread = (r1.double() - r2.double()).abs()
    ratio = float((spread / (2 * b)).max())
    ctx.bound("order_dependence", op, "spread_over_bound", ratio, 1.0, dtype=dtype, repro=repro,
              detail=f"{diff} of {r1.numel()} outputs change when the reduction dimension ({n}) is permuted; the "
                     f"largest change is {ratio:.3g} of its bound 2b: each order lies within b of the exact "
                     f"result ({how}), so two orders differ by at most 2b")
