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
exact arithmetic); the number of differing outputs is reported as a fact (pass).
"""

from __future__ import annotations

import torch

from mystique.dtypes import HALF_DTYPES
from mystique.dtypes import name as dtype_name

from ._ctx import Ctx

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
    """Rows ``accumulator_precision`` (fails below fp32) and ``order_dependence`` (facts)."""
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
    pairs = {
        "mm": (lambda: ad @ bd, lambda: apd @ bpd),
        "sum": (lambda: xd.sum(-1), lambda: xpd.sum(-1)),
    }
    for op, (f1, f2) in pairs.items():
        try:
            r1 = ctx.on_device(f1).cpu()
            r2 = ctx.on_device(f2).cpu()
        except RuntimeError as exc:
            ctx.error("order_dependence", op, exc, dtype=dtype, repro=ctx.repro(op=op))
            continue
        diff = int((r1.view(torch.int16) != r2.view(torch.int16)).sum())
        ctx.fact("order_dependence", op, "differing_outputs", diff, dtype=dtype, unit="values",
                 detail=(f"{diff} of {r1.numel()} outputs change when the reduction dimension "
                         f"({r1.numel() and (k if op == 'mm' else 4 * k)}) is permuted: summation order matters"
                         if diff else f"order-independent results at reduction length "
                                      f"{k if op == 'mm' else 4 * k}")
                 + f"; {ctx.repro(op=op)}")
