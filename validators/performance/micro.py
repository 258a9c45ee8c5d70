"""Device micro-checks (group ``micro``): GEMM throughput per dtype, memory bandwidth (copy and
triad), host<->device transfers (pinned and pageable) on accelerators; and, per tensor dtype, GEMM
throughput across sizes and layouts and attention's forward and backward across sizes
(:mod:`.curve`: ``gemm_curve`` and ``attention_curve`` rows), which ``mystique predict`` reads as the
device profile's throughput curves; with ``shapes_from``, GEMM throughput at the given steps' own shapes
(:mod:`.shapes`: ``gemm_shape`` rows), which predict prices those GEMMs by.

Each figure is timed in repeated calls under ``target.active()`` (the device synchronised around
each call) for the level's time budget, and on until ``min_reps`` calls were undisturbed by the host
(:mod:`.timed`); the row's value is the median rate of the undisturbed calls with its 95% interval
by batch means (:func:`.stats.batch_interval`). A figure the host left too few undisturbed calls is
a ``<check>_disturbed`` row, which the fleet does not compare. Where :mod:`.nominal` knows the device, a
``fraction_of_nominal`` row divides the median by the datasheet peak. On an accelerator the clocks,
power and throttle reasons sampled while the calls ran (:class:`.clocks.ClockSampler`, NVML on NVIDIA
GPUs) are in the row's detail: a datasheet peak is quoted at a boost clock that a power-capped
device does not hold under a long run of large GEMMs, and the detail says which clock the figure was
made at. Measured figures are ``info``: the fleet group judges them against peers.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._ctx import Measured, PerformanceContext
from .clocks import ClockSampler, describe
from .curve import CURVE_DTYPES, run_attention_curve, run_gemm_curve
from .nominal import lookup
from .shapes import run_gemm_shapes
from .stats import batch_interval
from .timed import Calls, timed_calls


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _gemm_cases(device: torch.device) -> list[tuple[str, torch.dtype, bool]]:
    """(label, dtype, tf32) of each GEMM the device type runs (fp8 where the device has it)."""
    cases = [("float32", torch.float32, False)]
    if device.type == "cuda":
        cases.append(("tf32", torch.float32, True))
    cases += [("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False)]
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        cases.append(("float8", torch.float8_e4m3fn, False))
    return cases


def _gemm_fn(label: str, dtype: torch.dtype, n: int, device: torch.device, seed: int) -> Callable[[], Any]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    if label == "float8":
        a8, b8 = a.to(dtype), b.to(dtype).t().contiguous().t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a, b = a.to(dtype), b.to(dtype)
    return lambda: torch.mm(a, b)


def _sized_gemm(label: str, dtype: torch.dtype, n: int, device: torch.device, seed: int, per_call_s: float,
                target: Any) -> tuple[int, Callable[[], Any]]:
    """The GEMM of size ``n``, halved (down to 128) while one call takes longer than ``per_call_s``: a
    dtype without a fast kernel here (fp16 on many CPUs) is measured at a size that fits the budget.
    The size is in the row's subject, so peers compare like with like."""
    while True:
        fn = _gemm_fn(label, dtype, n, device, seed)
        fn()
        target.synchronize()
        t0 = time.perf_counter()
        fn()
        target.synchronize()
        if time.perf_counter() - t0 <= per_call_s or n <= 128:
            return n, fn
        n //= 2


def run_gemm(ctx: PerformanceContext) -> None:
    s, target = ctx.settings, ctx.target
    device = target.torch_device
    n = s["gemm_n_cuda"] if device.type != "cpu" else s["gemm_n_cpu"]
    nominal = lookup(ctx.device_name)
    for label, dtype, tf32 in _gemm_cases(device):
        try:
            with _tf32(tf32):
                k, fn = _sized_gemm(label, dtype, n, device, ctx.seed, s["micro_budget_s"] / s["min_reps"], target)
                ctx.progress.note(f"GEMM {label} {k}x{k}x{k} on {target.label}")
                calls, clocks = _calls(fn, target, s)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            ctx.res.add("gemm_throughput", f"gemm_{n}", "tflops", None, status="skip", dtype=label,
                        detail=f"{label} GEMM does not run on {target.label}: {str(exc).splitlines()[0][:200]}")
            continue
        _record_rate(ctx, "gemm_throughput", f"gemm_{k}", label, "tflops", "TFLOP/s", calls, 2.0 * k**3 / 1e12,
                     f"{len(calls.seconds)} timed {k}x{k}x{k} GEMMs (2n^3 flop each)"
                     + ("; TF32 allowed" if tf32 else ""),
                     nominal.tflops.get(label) if nominal else None, nominal.source if nominal else "", clocks)
        if label in CURVE_DTYPES and not tf32:
            run_gemm_curve(ctx, label, dtype, n, k)
    curves = [(label, dtype) for label, dtype, tf32 in _gemm_cases(device) if label in CURVE_DTYPES and not tf32]
    for label, dtype in curves:
        run_attention_curve(ctx, label, dtype)
    run_gemm_shapes(ctx, curves)


def _calls(fn: Callable[[], Any], target: Any, s: dict[str, Any], clocks: bool = True) -> tuple[Calls, str]:
    """The timed calls of ``fn`` for the level's budget, and on until ``min_reps`` were undisturbed; and, with
    ``clocks`` on an accelerator, the clock evidence sampled meanwhile (:func:`.clocks.describe`; empty on the
    CPU, whose sampling thread would compete with the calls for its cores)."""
    sampler = ClockSampler(target.device) if clocks and target.torch_device.type != "cpu" else None
    if sampler is not None:
        sampler.start()
    try:
        calls = timed_calls(fn, target, seconds=s["micro_budget_s"], min_undisturbed=s["min_reps"],
                            min_calls=s["min_reps"])
    finally:
        samples = sampler.stop() if sampler is not None else []
    return calls, (describe(samples, sampler.source) if sampler is not None else "")


def _record_rate(ctx: PerformanceContext, check: str, subject: str, dtype: str, metric: str, unit: str,
                 calls: Calls, work: float, how: str, peak: float | None, source: str, clocks: str = "",
                 record: bool = True) -> None:
    """The median rate (``work`` per second) of the undisturbed calls (all calls, as
    ``<check>_disturbed``, when too few were); ``clocks`` the clock evidence of the calls, if any;
    ``record`` False: a figure the fleet does not compare."""
    rates = [work / t if t > 0 else float("nan") for t in calls.chosen]
    med = statistics.median(rates)
    lo, hi = batch_interval(rates, statistics.median)
    m = Measured(med, lo, hi, True, unit)
    detail = f"{how}; median of the rates; {calls.describe()}" + (f"; {clocks}" if clocks else "")
    if calls.enough and record:
        ctx.record(check, subject, dtype, metric, m, detail)
    elif calls.enough:
        ctx.record_only(check, subject, dtype, metric, m, detail)
    else:  # the host was too busy: a figure, not compared with the fleet
        ctx.record_only(f"{check}_disturbed", subject, dtype, metric, m, detail)
    if peak:
        ctx.res.add("fraction_of_nominal", f"{check}/{subject}", "fraction", med / peak, status="info",
                    dtype=dtype, threshold=None,
                    detail=f"median {med:.4g} {unit} of nominal {peak:g} {unit} ({source})"
                           + (f"; {clocks}" if clocks else ""))


def run_memory(ctx: PerformanceContext) -> None:
    s, target = ctx.settings, ctx.target
    device = target.torch_device
    nbytes = s["mem_bytes_cuda"] if device.type != "cpu" else s["mem_bytes_cpu"]
    n = nbytes // 4
    a = torch.empty(n, device=device)
    b = torch.rand(n, device=device)
    c = torch.rand(n, device=device)
    nominal = lookup(ctx.device_name)
    cases = {"copy": (lambda: a.copy_(b), 2 * nbytes),
             "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3 * nbytes)}
    for name, (fn, moved) in cases.items():
        ctx.progress.note(f"memory {name} of {nbytes / 2**20:.0f} MiB arrays on {target.label}")
        calls, clocks = _calls(fn, target, s)
        _record_rate(ctx, "memory_bandwidth", name, "float32", "gbps", "GB/s", calls, moved / 1e9,
                     f"{len(calls.seconds)} timed {name}s of {nbytes} B float32 arrays ({moved} B read+written each)",
                     nominal.memory_gbps if nominal else None, nominal.source if nominal else "", clocks)
    run_memory_dtypes(ctx, n)


def run_memory_dtypes(ctx: PerformanceContext, n: int) -> None:
    """The triad's bandwidth in bf16 and fp16 (``memory_bandwidth`` rows of those dtypes, not compared by the
    fleet): on a device without native arithmetic in a dtype its elementwise ops convert each element, so
    halving the bytes need not halve the time, and predict's memory-bound model reads the bandwidth of the
    operator's dtype (:func:`mystique.predict.whatif.op_time`). ``n`` elements as the fp32 triad, timed for a
    quarter of the budget."""
    s, target = ctx.settings, ctx.target
    device = target.torch_device
    for label, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        try:
            a = torch.empty(n, device=device, dtype=dtype)
            b, c = torch.rand(n, device=device).to(dtype), torch.rand(n, device=device).to(dtype)
            def fn(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> torch.Tensor:
                return torch.add(b, c, alpha=3.0, out=a)

            fn()
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            ctx.res.add("memory_bandwidth", "triad", "gbps", None, status="skip", dtype=label,
                        detail=f"{label} triad does not run on {target.label}: {str(exc).splitlines()[0][:200]}")
            continue
        moved = 3 * n * a.element_size()
        ctx.progress.note(f"memory triad of {label} arrays on {target.label}")
        calls = timed_calls(fn, target, seconds=s["micro_budget_s"] / 4, min_undisturbed=s["min_reps"],
                            min_calls=s["min_reps"])
        _record_rate(ctx, "memory_bandwidth", "triad", label, "gbps", "GB/s", calls, moved / 1e9,
                     f"{len(calls.seconds)} timed triads of {n} {label} elements ({moved} B read+written each); the "
                     "bandwidth predict's memory-bound model reads for this dtype", None, "", record=False)


def run_transfer(ctx: PerformanceContext) -> None:
    s, target = ctx.settings, ctx.target
    device = target.torch_device
    if device.type == "cpu":
        ctx.res.add("transfer_bandwidth", "host_device", "gbps", None, status="skip",
                    detail="the device under test is the host: no host<->device transfer")
        return
    nbytes = s["transfer_bytes"]
    dev = torch.empty(nbytes // 4, device=device)
    for pinned in (True, False):
        host = torch.empty(nbytes // 4, pin_memory=pinned)
        kind = "pinned" if pinned else "pageable"
        for direction, fn in (("h2d", lambda h=host: dev.copy_(h)), ("d2h", lambda h=host: h.copy_(dev))):
            ctx.progress.note(f"{direction} {kind} {nbytes / 2**20:.0f} MiB on {target.label}")
            calls, _ = _calls(fn, target, s, clocks=False)  # (no nominal figure to explain)
            _record_rate(ctx, "transfer_bandwidth", f"{direction}_{kind}", "float32", "gbps", "GB/s", calls,
                         nbytes / 1e9,
                         f"{len(calls.seconds)} timed {direction} copies of {nbytes} B ({kind} host memory)", None, "")


def run_micro(ctx: PerformanceContext) -> None:
    """GEMM throughput per dtype, memory bandwidth, host<->device transfers."""
    run_gemm(ctx)
    run_memory(ctx)
    run_transfer(ctx)
