"""Throughput curves (part of group ``micro``): what ``mystique predict`` reads a GEMM's and an attention
operator's throughput from (:meth:`mystique.predict.whatif.Profile.tflops_at`).

One figure per dtype does not predict a step's operators: small GEMMs are bound by the call's fixed cost
and large ones by the cores, and where a dtype has no native kernel (bf16 on a CPU without AVX512-BF16)
the layouts run up to 15x apart and attention's backward 4-8x slower than its forward, relative to fp32.
So, per tensor dtype (:data:`CURVE_DTYPES`):

* ``gemm_curve`` rows ``gemm_N_LAYOUT``: ``N x N x N`` GEMMs (``2N^3`` FLOPs) in the layouts
  :data:`CURVE_LAYOUTS`, at the level's sizes (``gemm_sizes_cpu`` / ``gemm_sizes_cuda``) up to its GEMM
  size; ``nn`` at the ``gemm_throughput`` row's size is that row;
* ``attention_curve`` rows ``sdpa_fwd_bBhHlLdD`` and ``sdpa_bwd_...``: scaled dot-product attention,
  its forward (``4 B H L^2 D`` FLOPs) and its backward alone (``8 B H L^2 D``; the gradients of one
  recorded forward), at the level's sequence lengths.

Each point is timed for ``micro_budget_s / 4`` and on until ``min_reps`` calls were undisturbed
(:mod:`.timed`); a size one call of which would exceed that budget over ``min_reps`` (its time foreseen
from the size below at that size's throughput, else the fastest of up to 3 calls) is a ``skip`` row and the larger sizes
are not tried: predict clamps at the largest size sampled. These figures are ``info`` and the fleet does
not compare them (the ``gemm_throughput`` row is the device's figure).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from . import timed as _timed
from ._ctx import PerformanceContext
from .shapes import layout_gemm
from .timed import timed_calls

#: the dtypes of the curves: those a tensor can have (TF32 is a mode of fp32; fp8 GEMMs are scaled
#: products with a layout of their own)
CURVE_DTYPES = ("float32", "bfloat16", "float16")
#: the layouts sampled: ``x @ W.T`` (``nt``, linear's forward), ``dY @ W`` (``nn``, its input gradient) and
#: ``dY.T @ x`` (``tn``, its weight gradient); predict reads ``tt`` as ``nn``
CURVE_LAYOUTS = ("nn", "nt", "tn")
#: the attention shape's batch, heads and head dimension (the sequence length is swept)
SDPA_BHD = (1, 8, 64)


def _sdpa(dtype: torch.dtype, n: int, backward: bool, device: torch.device, seed: int) -> Callable[[], Any]:
    """Scaled dot-product attention over ``SDPA_BHD`` at sequence length ``n``: its forward, or the backward
    of one recorded forward (the graph retained, so each call runs the backward alone)."""
    b, h, d = SDPA_BHD
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(device=device, dtype=dtype).requires_grad_(backward)
               for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not backward:
        def fwd() -> Any:
            with torch.no_grad():
                return sdpa(q, k, v)
        return fwd
    out = sdpa(q, k, v)
    grad = torch.randn(b, h, n, d, generator=g).to(device=device, dtype=dtype)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def _sweep(ctx: PerformanceContext, check: str, label: str, points: list[tuple[str, float, Callable[[], Callable[[], Any]], str]]) -> None:
    """Time each ``(subject, flops, make, what)`` point in order of size (module docstring); ``make`` builds
    the call; the previous point's time per FLOP foresees the next call's."""
    from .micro import _record_rate  # (micro imports this module)

    s, target = ctx.settings, ctx.target
    budget = s["micro_budget_s"] / 4
    per_call = budget / s["min_reps"]
    prev: tuple[float, float] | None = None  # (flops, seconds of one call)
    for subject, flops, make, what in points:
        one = prev[1] * flops / prev[0] if prev is not None else 0.0
        if one <= per_call:  # the fastest of up to 3 calls: one the host preempted does not skip the size
            fn = make()
            fn()
            target.synchronize()
            one = float("inf")
            for _ in range(3):
                t0 = _timed.clock()
                fn()
                target.synchronize()
                one = min(one, _timed.clock() - t0)
                if one <= per_call:
                    break
        if one > per_call:
            ctx.res.add(check, subject, "tflops", None, status="skip", dtype=label,
                        detail=f"one {what} takes about {one:.3g} s, over the sweep's {per_call:.3g} s per call "
                               f"({budget:g} s for {s['min_reps']} calls); predict clamps at the largest size sampled")
            return
        ctx.progress.note(f"{check.replace('_', ' ')} {label} {subject} on {target.label}")
        calls = timed_calls(fn, target, seconds=budget, min_undisturbed=s["min_reps"], min_calls=s["min_reps"])
        prev = (flops, statistics.median(calls.chosen))
        _record_rate(ctx, check, subject, label, "tflops", "TFLOP/s", calls, flops / 1e12,
                     f"{len(calls.seconds)} timed {what}; a point of the throughput curve predict interpolates",
                     None, "", record=False)


def run_gemm_curve(ctx: PerformanceContext, label: str, dtype: torch.dtype, n_level: int, n_main: int) -> None:
    """``gemm_curve`` rows of ``label`` (module docstring): sizes up to the level's ``n_level``, ``nn`` but at
    ``n_main``, the size the ``gemm_throughput`` row measured."""
    device = ctx.target.torch_device
    sizes = ctx.settings["gemm_sizes_cuda"] if device.type != "cpu" else ctx.settings["gemm_sizes_cpu"]
    for layout in CURVE_LAYOUTS:
        ns = sorted(k for k in sizes if k <= n_level and (layout != "nn" or k != n_main))
        _sweep(ctx, "gemm_curve", label, [
            (f"gemm_{n}_{layout}", 2.0 * n**3,
             lambda n=n, layout=layout: layout_gemm(dtype, layout, (1, n, n, n), device, ctx.seed),
             f"{n}x{n}x{n} {label} GEMM, layout {layout} (A@B, A {'transposed' if layout[0] == 't' else 'row-major'}, "
             f"B {'transposed' if layout[1] == 't' else 'row-major'}; 2n^3 flop)") for n in ns])


def run_attention_curve(ctx: PerformanceContext, label: str, dtype: torch.dtype) -> None:
    """``attention_curve`` rows of ``label`` (module docstring): forward and backward at each sequence length."""
    device = ctx.target.torch_device
    lengths = sorted(ctx.settings["sdpa_lengths_cuda"] if device.type != "cpu" else ctx.settings["sdpa_lengths_cpu"])
    b, h, d = SDPA_BHD
    for bwd in (False, True):
        name, k = ("bwd", 8.0) if bwd else ("fwd", 4.0)
        try:
            _sweep(ctx, "attention_curve", label, [
                (f"sdpa_{name}_b{b}h{h}l{n}d{d}", k * b * h * n * n * d,
                 lambda n=n, bwd=bwd: _sdpa(dtype, n, bwd, device, ctx.seed),
                 f"{label} scaled dot-product attention {'backward' if bwd else 'forward'} of (B, H, L, D) = "
                 f"({b}, {h}, {n}, {d}) ({k:g} B H L^2 D flop)") for n in lengths])
        except (RuntimeError, NotImplementedError) as exc:
            ctx.res.add("attention_curve", f"sdpa_{name}", "tflops", None, status="skip", dtype=label,
                        detail=f"{label} attention does not run on {ctx.target.label}: {str(exc).splitlines()[0][:200]}")
