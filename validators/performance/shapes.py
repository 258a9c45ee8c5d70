"""GEMM throughput at a step's own shapes (part of group ``micro``, with ``--shapes-from``): ``gemm_shape``
rows, which ``mystique predict`` prices a GEMM of that shape, layout and dtype by
(:meth:`mystique.predict.whatif.Profile.gemm_rate`), before the curves' interpolation in FLOPs.

Why: a GEMM's throughput is a function of its ``M``, ``N``, ``K`` and layout, not of its FLOPs alone (a BLAS
blocks the three dimensions apart; where a dtype has no native kernel, its conversion of each operand scales
with that operand). On a CPU without AVX512-BF16, at one thread, bert's ``(1024x256)(256x8192)`` ``nt`` ran
fp32 at 39 GFLOP/s against the 86 of the cube curve at its FLOPs, and bf16 6.9x slower against the curves'
13.5x: the bf16 step was predicted 63% too slow. Vendors' performance models price a kernel from a table
measured at the workload's shapes (cuBLAS's heuristics, Lumos's and Daydream's kernel tables); this is that
table for the given steps.

For each ``CAPTURE_OR_BENCHMARK`` (a capture folder, an execution trace or a benchmark), the distinct GEMM
products of its plan (:func:`mystique.predict.opmodel.gemm_dims`: ``mm``, ``addmm``, ``bmm``, ``baddbmm``,
``linear``, ``matmul``; ``(batch, M, N, K)`` and the layout its operands' strides give) are timed as
``torch.mm``/``torch.bmm`` of random operands of that shape and layout, in each curve dtype the device runs
(:data:`.curve.CURVE_DTYPES`), for ``micro_budget_s / 4`` and on until ``min_reps`` calls: subject
``gemm_[bB]mMnNkK_LAYOUT``, the median rate with its 95% interval (:func:`.micro._record_rate`; ``info``, not
compared by the fleet). Nothing but that product runs.

The shapes are data from a trace, untrusted. A dimension of ``2^31`` or more (no BLAS call takes one: their
dimensions are 32-bit) or an operand of ``2^40`` elements or more (more than any device holds) is refused in
one line naming the file and the operator (UsageError, exit 2) before anything is measured. At most
``shape_max`` distinct shapes are measured, those with the most FLOPs over the given steps first (one
``skip`` row counts the rest); a shape whose operands at 4 bytes an element exceed ``shape_max_bytes_cpu`` /
``_cuda`` is a ``skip`` row; and all of it takes at most ``shape_budget_s``: a shape whose calls are foreseen
(its first call's time, or its FLOPs at the slowest rate measured so far in that dtype) to overrun what is left
is a ``skip`` row unrun. Progress lines name each shape and the seconds spent of the budget.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mystique.errors import UsageError
from mystique.io import show

from . import timed as _timed
from ._ctx import PerformanceContext
from .timed import timed_calls

#: a dimension no BLAS call takes (32-bit dimensions) and an operand no device holds: refused as absurd
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**40


@dataclass(frozen=True)
class GemmShape:
    """One distinct GEMM product of the steps: its layout, ``(batch, M, N, K)``, how many times the steps run
    it and their FLOPs in all (the order of measurement), and where it was first seen."""

    layout: str
    dims: tuple[int, int, int, int]
    count: int
    step_flops: float
    seen_in: str

    @property
    def subject(self) -> str:
        b, m, n, k = self.dims
        return f"gemm_{f'b{b}' if b != 1 else ''}m{m}n{n}k{k}_{self.layout}"

    @property
    def flops(self) -> float:
        b, m, n, k = self.dims
        return 2.0 * b * m * n * k

    def operand_elements(self) -> tuple[int, int, int]:
        b, m, n, k = self.dims
        return b * m * k, b * k * n, b * m * n


def read_shapes(paths: Sequence[str | os.PathLike]) -> list[GemmShape]:
    """The distinct GEMM products of the steps at ``paths``, the most FLOPs first (module docstring);
    UsageError, in one line, for a path that is no capture or benchmark and for an absurd shape."""
    from mystique.predict.opmodel import op_class, op_work
    from mystique.replay.plan import plan_from_path

    found: dict[tuple[str, tuple[int, int, int, int]], list[Any]] = {}
    for path in paths:
        try:
            plan, _ = plan_from_path(path)
        except UsageError as exc:
            raise UsageError(f"--shapes-from {show(path)}: {str(exc).splitlines()[0]}") from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--shapes-from {show(path)}: not a readable capture or benchmark "
                             f"({type(exc).__name__})") from exc
        tensors = {t["id"]: t for t in plan.tensors}
        for op in plan.ops:
            name = str(op.get("name", ""))
            if op_class(name) != "gemm":
                continue
            w = op_work(op, tensors)
            if w.dims is None or w.dtype == "":
                continue
            shape = GemmShape(w.layout, w.dims, 1, w.flops, show(path))
            too_big = max(w.dims) > MAX_DIM or max(shape.operand_elements()) >= MAX_ELEMENTS
            if too_big:
                raise UsageError(f"--shapes-from {show(path)}: {name} (op {op.get('index')}) has an absurd GEMM "
                                 f"shape (batch, M, N, K) = {w.dims}: a dimension of 2^31 or more or an operand of "
                                 "2^40 elements or more, which no device runs")
            entry = found.setdefault((w.layout, w.dims), [0, 0.0, show(path)])
            entry[0] += 1
            entry[1] += w.flops
    shapes = [GemmShape(lay, dims, c, f, seen) for (lay, dims), (c, f, seen) in found.items()]
    return sorted(shapes, key=lambda s: (-s.step_flops, s.subject))


def layout_gemm(dtype: torch.dtype, layout: str, dims: tuple[int, int, int, int], device: torch.device,
                seed: int) -> Callable[[], Any]:
    """``A @ B`` of ``dims`` ``(batch, M, N, K)``, each operand row-major (``n``) or a transposed view (``t``) as
    ``layout`` names it (:func:`mystique.predict.opmodel.gemm_layout`); ``torch.bmm`` for a batch of products.
    (The curves' square GEMMs too, :func:`.curve.run_gemm_curve`.)"""
    b, m, n, k = dims
    g = torch.Generator().manual_seed(seed)

    def operand(rows: int, cols: int, transposed: bool) -> torch.Tensor:
        shape = (cols, rows) if transposed else (rows, cols)
        x = torch.randn((b, *shape) if b != 1 else shape, generator=g).to(device=device, dtype=dtype)
        return x.transpose(-1, -2) if transposed else x

    a, bb = operand(m, k, layout[0] == "t"), operand(k, n, layout[1] == "t")
    mm = torch.bmm if b != 1 else torch.mm
    return lambda: mm(a, bb)


def run_gemm_shapes(ctx: PerformanceContext, cases: Sequence[tuple[str, torch.dtype]]) -> None:
    """``gemm_shape`` rows of ``ctx.settings["gemm_shapes"]`` (:func:`read_shapes`) in each ``(label, dtype)``
    of ``cases`` (module docstring)."""
    from .micro import _record_rate  # (micro imports this module)

    s, target = ctx.settings, ctx.target
    shapes: list[GemmShape] = s.get("gemm_shapes") or []
    if not shapes:
        return
    device = target.torch_device
    cap_bytes = s["shape_max_bytes_cuda"] if device.type != "cpu" else s["shape_max_bytes_cpu"]
    budget, per_point, reps = s["shape_budget_s"], s["micro_budget_s"] / 4, s["min_reps"]
    if len(shapes) > s["shape_max"]:
        left = shapes[s["shape_max"]:]
        ctx.res.add("gemm_shape", f"{len(left)} shapes", "tflops", None, status="skip",
                    detail=f"{len(shapes)} distinct GEMM shapes in --shapes-from, over the {s['shape_max']} measured "
                           f"(those of the most FLOPs in the steps); the {len(left)} others ({sum(x.step_flops for x in left):.3g} "
                           "FLOP in the steps) are priced by the curves")
        shapes = shapes[:s["shape_max"]]
    start = _timed.clock()
    slowest: dict[str, float] = {}  # label -> the lowest FLOP/s measured so far
    for i, shape in enumerate(shapes, 1):
        why = ""
        if sum(shape.operand_elements()) * 4 > cap_bytes:
            why = (f"its operands take {sum(shape.operand_elements()) * 4 / 2**30:.3g} GiB at 4 bytes an element, over "
                   f"the {cap_bytes / 2**30:g} GiB the shape sweep allocates")
        for label, dtype in cases:
            left = budget - (_timed.clock() - start)
            foreseen = (reps + 1) * shape.flops / slowest[label] if label in slowest else 0.0
            if not why and foreseen > left:
                reason = (f"{reps + 1} calls foreseen at {foreseen:.3g} s (its FLOPs at the slowest {label} rate "
                          f"measured so far), over the {left:.3g} s left of the shape budget ({budget:g} s)")
            else:
                reason = why
            if not reason:
                one = 0.0
                try:
                    fn = layout_gemm(dtype, shape.layout, shape.dims, device, ctx.seed)
                    with target.active():
                        t0 = _timed.clock()
                        fn()
                        target.synchronize()
                        one = _timed.clock() - t0
                except (RuntimeError, TypeError, NotImplementedError) as exc:
                    reason = f"{label} GEMM does not run on {target.label}: {str(exc).splitlines()[0][:200]}"
                left = budget - (_timed.clock() - start)
                if not reason and reps * one > left:
                    reason = (f"its first call took {one:.3g} s: {reps} more would overrun the {left:.3g} s left of "
                              f"the shape budget ({budget:g} s)")
            if reason:
                ctx.res.add("gemm_shape", shape.subject, "tflops", None, status="skip", dtype=label,
                            detail=f"not measured: {reason}; predict prices it by the curves")
                continue
            ctx.progress.note(f"gemm shape {i}/{len(shapes)} {label} {shape.subject} on {target.label} "
                              f"({_timed.clock() - start:.0f} of {budget:g} s)")
            calls = timed_calls(fn, target, seconds=per_point, min_undisturbed=reps, min_calls=reps, warmup=0)
            rate = shape.flops / max(calls.chosen)
            slowest[label] = min(slowest.get(label, math.inf), rate)
            b, m, n, k = shape.dims
            _record_rate(ctx, "gemm_shape", shape.subject, label, "tflops", "TFLOP/s", calls, shape.flops / 1e12,
                         f"{len(calls.seconds)} timed {'torch.bmm' if b != 1 else 'torch.mm'} of {f'{b} x ' if b != 1 else ''}"
                         f"({m}x{k})({k}x{n}) {label}, layout {shape.layout} ({shape.flops:.4g} flop); {shape.count} in the "
                         f"--shapes-from steps (first in {shape.seen_in}); the rate predict prices a GEMM of this shape by",
                         None, "", record=False)


__all__ = ["GemmShape", "MAX_DIM", "MAX_ELEMENTS", "layout_gemm", "read_shapes", "run_gemm_shapes"]
