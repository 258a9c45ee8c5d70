"""Workload throughput under sustained load (group ``sustained``).

Each reference workload (:mod:`mystique.validators.correctness.benchmarks`: captured on the CPU,
generated into a plan) is replayed by the executor on the device under test, inside
``target.active()``, step after step for its share of ``duration`` seconds, while
:class:`.clocks.ClockSampler` samples clocks. Rows per workload:

* ``step_time`` (info): median, p05, p95, p99 and mean step time (ms), each median-like figure with
  its 95% interval; ``step_cv`` and ``steps`` (info); ``stalls`` (info): steps longer than 3x the median.
* ``throughput_drift`` (check): the median step time of the last third of the steps over that of
  the first third, with a conservative 95% interval (:func:`.stats.ratio_interval`). It fails when
  the whole interval lies above ``1 + drift_tolerance`` (the device slowed down under load by more
  than the tolerance, with confidence), passes when it lies at or below, else is inconclusive.
  The tolerance (10%) is the size of the clock steps of thermal and power capping
  (one P-state step of a GPU's boost table or a CPU's turbo bins is about 5-15% of the clock); a
  decay smaller than that is within what a healthy device's clock governor does.
* ``clock_drop`` (check, where clocks are readable): the median clock of the last third of the
  samples over the first third's; fails when it dropped by more than the same tolerance; NVML's
  throttle-reason bits seen (power cap, thermal, power brake) are named in the detail, and every
  sample is a ``clock_trace`` row (value per metric; ``t=`` seconds in the detail) for the chart.
* with a mode injected on the target: ``mode_slowdown`` and ``mode_stalls`` (:mod:`.paired`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from mystique.validators.correctness import benchmarks as bm

from mystique.replay import runtime as ex
from mystique.timing import loadavg

from ._ctx import Measured, PerformanceContext
from .clocks import THROTTLE_BITS, ClockSampler
from .paired import run_paired
from .stats import cv, quantile, quantile_interval, ratio_interval, slowdown_verdict

STALL_FACTOR = 3.0
MAX_TRACE_POINTS = 60


def _steps(executor: Any, target: Any, seconds: float, warmup: int) -> tuple[list[float], list[float]]:
    """(step seconds, step start times) of steps run back to back for ``seconds`` after ``warmup``."""
    times: list[float] = []
    starts: list[float] = []
    with target.active():
        executor.probe()
        for _ in range(warmup):
            executor.run_iteration()
        target.synchronize()
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < seconds or len(times) < 6:
            t0 = time.perf_counter()
            executor.run_iteration()
            target.synchronize()
            times.append(time.perf_counter() - t0)
            starts.append(t0 - t_start)
    return times, starts


def run_sustained(ctx: PerformanceContext) -> None:
    """Every reference workload for its share of the duration: distribution, drift, clocks."""
    s = ctx.settings
    names = s["workloads"]
    share = float(s["duration"]) / max(len(names), 1)
    with bm.cache_root(ctx.out_dir) as root:
        for name in names:
            bench = bm.reference(name, s["config"], s["mode"], "float32", root, ctx.progress)
            ctx.progress.note(f"sustained {bench.subject} on {ctx.target.label} for {share:.0f} s")
            executor = ex.Executor(bench.plan, ctx.target.device, seed=ctx.seed)
            sampler = ClockSampler(ctx.target.device).start()
            load = loadavg()
            try:
                times, _starts = _steps(executor, ctx.target, share, s["warmup_steps"])
            finally:
                samples = sampler.stop()
            ctx.step_times[bench.subject] = times
            _distribution_rows(ctx, bench.subject, times, f"host load average {load} -> {loadavg()}")
            _drift_row(ctx, bench.subject, times)
            _clock_rows(ctx, bench.subject, sampler, samples)
            if ctx.target.mode_factory is not None and s["paired"]:
                run_paired(ctx, bench.subject, executor, share * s["paired_share"])


def _distribution_rows(ctx: PerformanceContext, subject: str, times: list[float], load: str) -> None:
    ms = [t * 1e3 for t in times]
    how = f"{len(ms)} steps run back to back on {ctx.target.label}; {load} (1, 5, 15 min)"
    for q, metric in ((0.5, "median_ms"), (0.05, "p05_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
        lo, hi = quantile_interval(ms, q)
        ctx.record("step_time", subject, "float32", metric, Measured(quantile(ms, q), lo, hi, False, "ms"), how)
    mean = statistics.fmean(ms)
    ctx.res.add("step_time", subject, "mean_ms", mean, unit="ms", status="info", dtype="float32", detail=how)
    ctx.res.add("step_cv", subject, "cv", cv(ms), status="info", dtype="float32",
                detail=f"standard deviation over mean of {len(ms)} step times")
    med = statistics.median(ms)
    stalls = [x for x in ms if x > STALL_FACTOR * med]
    ctx.res.add("stalls", subject, "steps", len(stalls), status="info", dtype="float32",
                detail=f"steps longer than {STALL_FACTOR:g}x the median ({med:.4g} ms)"
                       + (f": longest {max(stalls):.4g} ms" if stalls else ""))


def _thirds(xs: list[float]) -> tuple[list[float], list[float]]:
    k = len(xs) // 3
    return xs[:k], xs[len(xs) - k:]


def _drift_row(ctx: PerformanceContext, subject: str, times: list[float]) -> None:
    tol = float(ctx.settings["drift_tolerance"])
    first, last = _thirds([t * 1e3 for t in times])
    if len(first) < 6:
        ctx.res.add("throughput_drift", subject, "last_over_first", None, status="skip", dtype="float32",
                    detail=f"{len(times)} steps: too few for an interval of each third (need 18)")
        return
    r = statistics.median(last) / statistics.median(first)
    lo, hi = ratio_interval(quantile_interval(last), quantile_interval(first))
    status = slowdown_verdict(lo, hi, 1.0 + tol)
    ctx.res.add("throughput_drift", subject, "last_over_first", r, threshold=1.0 + tol, status=status,
                dtype="float32",
                detail=f"median step time of the last {len(last)} steps over the first {len(first)}: {r:.4f}, "
                       f"conservative 95% interval [{lo:.4f}, {hi:.4f}]; fails above 1+{tol:g} (a clock step of "
                       f"thermal/power capping) with confidence")


def _clock_rows(ctx: PerformanceContext, subject: str, sampler: ClockSampler,
                samples: list[tuple[float, dict[str, float]]]) -> None:
    if len(samples) < 6:
        ctx.res.add("clock_drop", subject, "last_over_first", None, status="skip",
                    detail=f"{len(samples)} clock samples: {sampler.source}")
        return
    metric = "sm_clock_mhz" if "sm_clock_mhz" in samples[0][1] else "cpu_mhz"
    every = max(1, len(samples) // MAX_TRACE_POINTS)
    for t, vals in samples[::every]:
        for m, v in vals.items():
            if m != "throttle_reasons":
                ctx.res.add("clock_trace", subject, m, v, status="info", unit=m.rsplit("_", 1)[-1],
                            detail=f"t={t:.2f} s; {sampler.source}")
    clocks = [v[metric] for _, v in samples if metric in v]
    first, last = _thirds(clocks)
    r = statistics.median(last) / statistics.median(first) if statistics.median(first) else float("nan")
    tol = float(ctx.settings["drift_tolerance"])
    bits = 0
    for _, v in samples:
        bits |= int(v.get("throttle_reasons", 0))
    named = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
    flat = len(set(clocks)) == 1
    status = "fail" if r < 1.0 - tol else "pass"
    ctx.res.add("clock_drop", subject, "last_over_first", r, threshold=1.0 - tol, status=status,
                detail=f"median {metric} of the last {len(last)} samples over the first {len(first)}: {r:.4f}; "
                       f"fails below 1-{tol:g}; source {sampler.source}"
                       + (f"; throttle reasons seen: {', '.join(named)}" if named else "")
                       + ("; the reading never changed (it may be a nominal figure)" if flat else ""))
