"""Workload throughput under sustained load (group ``sustained``).

Each reference workload (:mod:`mystique.validators.correctness.benchmarks`: captured on the CPU,
generated into a plan) is replayed by the executor on the device under test, inside
``target.active()``, step after step for its share of ``duration`` seconds, while
:class:`.clocks.ClockSampler` samples clocks. Rows per workload:

* ``host_contention`` (check): how many steps the host left undisturbed (:mod:`.timed`: this
  process's threads waited for a CPU at most 0.5% of the step); pass with at least 30, else
  inconclusive: the host was too busy for the figures to be the device's.
* ``step_time`` (info): median, p05, p95, p99 and mean step time (ms) over the undisturbed steps,
  each with its 95% interval by batch means (:func:`.stats.batch_interval`, the mean's by
  :func:`.stats.batch_mean_interval`: consecutive steps are not independent, so an iid interval
  would let a neighbour's busy phase carry the figure); ``step_cv`` and ``stalls`` (info): steps
  longer than 3x the median. With too few undisturbed steps the same figures over all
  steps are ``step_time_disturbed`` rows, which the fleet does not compare.
* ``throughput_drift`` (check): the p10 step time of the last third of the (undisturbed) steps over
  that of the first third, with a conservative 95% interval (:func:`.stats.ratio_interval` of the
  thirds' order-statistics intervals). A device that slows under load (clocks held lower) slows
  every step, its fastest too; a neighbour's passing memory-bandwidth or cache phase, which no
  run-queue count sees, slows some steps and leaves the fastest tenth where it was. It fails when
  the whole interval lies above ``1 + drift_tolerance`` (the device slowed down under load by more
  than the tolerance, with confidence), passes when it lies at or below, else is inconclusive.
  A workload run for less than 15 s (the self-test's short step, a campaign's runs) cannot show
  thermal decay, so there the row is a measurement; so is a run with fewer than 36 steps per third
  (:func:`.stats.quantile_interval_size`: below it the p10's distribution-free interval is the third's
  extremes, without its 95% coverage: the quick level's 20 s of a slow CPU step, about 34 steps, decide
  nothing and would be inconclusive every time). So is a step the device was idle for part of:
  where NVML reports the GPU busy (a kernel running) less than ``1 / (1 + tolerance)`` of the time
  (91%), the step waits on its host, and the device can slow down by the whole tolerance without the
  step slowing at all; what moves such a step is the host's speed (a small step on a fast GPU is
  bound by the Python and launch work of one CPU core). ``clock_drop`` keeps the device's verdict there.
  The tolerance (10%) is the size of the clock steps of thermal and power capping
  (one P-state step of a GPU's boost table or a CPU's turbo bins is about 5-15% of the clock); a
  decay smaller than that is within what a healthy device's clock governor does.
* ``clock_drop`` (check, where clocks are readable): the median clock of the last third of the
  samples over the first third's; fails when it dropped by more than the same tolerance; NVML's
  throttle-reason bits seen (power cap, thermal, power brake) are named in the detail, and every
  sample is a ``clock_trace`` row (value per metric; ``t=`` seconds in the detail) for the chart.
  A clock the host cannot show moving (no source; /proc/cpuinfo without cpufreq, a constant on
  most VMs) is a ``skip`` saying so; a failed reading (NaN, a sampler stopped by an exception) an
  ``error``.
* with a mode injected on the target: ``mode_slowdown`` and ``mode_stalls`` (:mod:`.paired`).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Iterator
from typing import Any

from mystique.validators.correctness import benchmarks as bm

from mystique.replay import runtime as ex
from mystique.timing import loadavg

from ._ctx import Measured, PerformanceContext
from .clocks import ClockSampler, median_of, throttle_names
from .paired import run_paired
from .stats import (
    batch_interval,
    batch_mean_interval,
    cv,
    quantile,
    quantile_interval,
    quantile_interval_size,
    ratio_interval,
    slowdown_verdict,
)
from .timed import CAP, MIN_UNDISTURBED, Calls, timed_calls

STALL_FACTOR = 3.0
MAX_TRACE_POINTS = 60
DRIFT_Q = 0.10  # the quantile the drift compares: the fastest tenth of each third
#: the shortest load that can show a device's thermal decay (the drift is a measurement below it): a GPU
#: or CPU heat sink's time constant is tens of seconds; quick runs each workload about 20 s
MIN_DRIFT_S = 15.0


def run_sustained(ctx: PerformanceContext) -> None:
    """Every reference workload for its share of the duration: distribution, drift, clocks."""
    s = ctx.settings
    names = s["workloads"]
    share = float(s["duration"]) / max(len(names), 1)
    with steady_allocator(ctx.target) as allocator, bm.cache_root(ctx.out_dir) as root:
        for name in names:
            bench = bm.reference(name, s["config"], s["mode"], "float32", root, ctx.progress)
            ctx.progress.note(f"sustained {bench.subject} on {ctx.target.label} for {share:.0f} s")
            executor = ex.Executor(bench.plan, ctx.target.device, seed=ctx.seed)
            sampler = ClockSampler(ctx.target.device).start()
            load = loadavg()
            try:
                with ctx.target.active():
                    executor.probe()
                calls = timed_calls(executor.run_iteration, ctx.target, seconds=share,
                                    min_undisturbed=MIN_UNDISTURBED, warmup=s["warmup_steps"])
            finally:
                samples = sampler.stop()
            ctx.step_times[bench.subject] = calls
            contention_row(ctx, bench.subject, calls)
            util = median_of(samples, "gpu_util_pct")
            busy = None if util is None else util / 100.0
            distribution_rows(ctx, bench.subject, calls,
                               f"host load average {load} -> {loadavg()} (1, 5, 15 min); host allocator: {allocator}"
                               + _busy_words(busy, float(s["drift_tolerance"])))
            _drift_row(ctx, bench.subject, calls.chosen, calls.elapsed, busy)
            _clock_rows(ctx, bench.subject, sampler, samples)
            if ctx.target.mode_factory is not None and s["paired"]:
                run_paired(ctx, bench.subject, executor, share * s["paired_share"])


@contextlib.contextmanager
def steady_allocator(target: Any) -> Iterator[str]:
    """For the block, on the CPU, large blocks from a heap never trimmed (as replay does): otherwise how many
    page faults a step pays depends on the allocations before it, a run-to-run difference that is not the
    device's. Yields the allocator the steps run with, in words; the process's settings come back after."""
    cpu = target.torch_device.type == "cpu"
    with ex.steady_host_allocator() if cpu else contextlib.nullcontext() as said:
        yield said or "the C library's default"


def contention_row(ctx: PerformanceContext, subject: str, calls: Calls) -> None:
    """``host_contention``: pass with enough undisturbed steps to compare, inconclusive without."""
    k = len(calls.undisturbed)
    ctx.res.add("host_contention", subject, "undisturbed_steps", k, threshold=calls.min_undisturbed,
                status="pass" if calls.enough else "inconclusive", dtype="float32",
                detail=f"{calls.describe()}; {MIN_UNDISTURBED} undisturbed steps are needed for the figures' "
                       f"intervals (the budget was extended up to {CAP:g}x to collect them)")


def distribution_rows(ctx: PerformanceContext, subject: str, calls: Calls, host: str) -> None:
    ms = [t * 1e3 for t in calls.chosen]
    how = f"{len(ms)} of {len(calls.seconds)} steps run back to back on {ctx.target.label}: {calls.describe()}; {host}"
    check = "step_time" if calls.enough else "step_time_disturbed"  # a disturbed figure is not compared
    record = ctx.record if calls.enough else ctx.record_only
    for q, metric in ((0.5, "median_ms"), (0.05, "p05_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
        lo, hi = batch_interval(ms, lambda xs, q=q: quantile(xs, q))
        record(check, subject, "float32", metric, Measured(quantile(ms, q), lo, hi, False, "ms"),
               f"{how}; intervals by batch means (the figure of each of up to 10 consecutive batches of steps, "
               "the order-statistics interval of their median: steps in a row are not independent)")
    lo, hi = batch_mean_interval(ms)
    record(check, subject, "float32", "mean_ms", Measured(statistics.fmean(ms), lo, hi, False, "ms"),
           f"{how}; occasional stalls move the mean, not the median; its interval is the mean's by batch means "
           "(Student t over the means of up to 10 consecutive batches: steps in a row are not independent)")
    ctx.res.add("step_cv", subject, "cv", cv(ms), status="info", dtype="float32",
                detail=f"standard deviation over mean of {len(ms)} step times")
    med = statistics.median(ms)
    stalls = [x for x in ms if x > STALL_FACTOR * med]
    ctx.res.add("stalls", subject, "steps", len(stalls), status="info", dtype="float32",
                detail=f"of {len(ms)} steps, those longer than {STALL_FACTOR:g}x the median ({med:.4g} ms)"
                       + (f": longest {max(stalls):.4g} ms" if stalls else "")
                       + ("" if calls.enough else "; the host disturbed these steps: stalls may be its"))


def host_bound(busy: float | None, tol: float) -> bool:
    """Whether a device busy ``busy`` of each step could slow by ``1 + tol`` without the step slowing: its
    idle share absorbs it below ``1 / (1 + tol)`` busy (None: not known, as on a CPU, which is its own host)."""
    return busy is not None and busy < 1.0 / (1.0 + tol)


def _busy_words(busy: float | None, tol: float) -> str:
    if busy is None:
        return ""
    return (f"; the device ran kernels {busy:.0%} of the time (NVML utilisation, median)"
            + (": the step waited on its host, so these times are mostly the host's" if host_bound(busy, tol) else ""))


def _thirds(xs: list[float]) -> tuple[list[float], list[float]]:
    k = len(xs) // 3
    return xs[:k], xs[len(xs) - k:]


def _drift_row(ctx: PerformanceContext, subject: str, times: list[float], seconds: float,
               busy: float | None = None) -> None:
    """``throughput_drift`` of ``times`` (step seconds in order) from a run of ``seconds`` under load, on a
    device that ran kernels ``busy`` of the time (None: unknown, as on a CPU, where the host is the device)."""
    tol = float(ctx.settings["drift_tolerance"])
    first, last = _thirds([t * 1e3 for t in times])
    if len(first) < 6:
        ctx.res.add("throughput_drift", subject, "last_over_first", None, status="skip", dtype="float32",
                    detail=f"{len(times)} steps: too few for an interval of each third (need 18)")
        return
    r = quantile(last, DRIFT_Q) / quantile(first, DRIFT_Q)
    lo, hi = ratio_interval(quantile_interval(last, DRIFT_Q), quantile_interval(first, DRIFT_Q))
    status = slowdown_verdict(lo, hi, 1.0 + tol)
    short = seconds < MIN_DRIFT_S  # too short for a device to heat up: what moved is the host
    # a device idle part of each step can slow by up to 1/busy - 1 unseen: below 1/(1+tol) the step is the host's
    waited = host_bound(busy, tol)
    need = quantile_interval_size(DRIFT_Q)  # fewer steps per third: each third's interval is its extremes
    few = len(first) < need
    if short or waited or few:
        status = "info"
    ctx.res.add("throughput_drift", subject, "last_over_first", r, threshold=1.0 + tol, status=status,
                dtype="float32", low=lo, high=hi,
                detail=f"p{DRIFT_Q * 100:02.0f} step time of the last {len(last)} steps over the first {len(first)}: "
                       f"{r:.4f}, conservative 95% interval [{lo:.4f}, {hi:.4f}]; a decay of the device moves its fastest "
                       f"steps too, a neighbour's passing phase does not; fails above 1+{tol:g} (a clock step of "
                       f"thermal/power capping) with confidence"
                       + (f"; a measurement: {seconds:.1f} s under load is shorter than the {MIN_DRIFT_S:g} s a "
                          "device takes to heat up (a heat sink's time constant is tens of seconds), so a shift "
                          "this short is the host's" if short else "")
                       + (f"; a measurement: {len(first)} steps per third are fewer than the {need} the p"
                          f"{DRIFT_Q * 100:02.0f}'s distribution-free 95% interval needs ((1-{DRIFT_Q:g})^n <= 2.5%), "
                          "so the interval is the thirds' extremes and decides nothing: too few steps to judge a "
                          "drift" if few and not short else "")
                       + (f"; a measurement: the device ran kernels {busy:.0%} of the time (NVML utilisation, "
                          f"median), under the {1.0 / (1.0 + tol):.0%} at which a slowdown of 1+{tol:g} must show "
                          "in the step: the step waited on its host, whose speed is what moved it; clock_drop "
                          "holds the device's verdict" if waited else "")
                       + (f"; device busy {busy:.0%} of the time (NVML)" if busy is not None and not waited
                          else ""))


def _clock_rows(ctx: PerformanceContext, subject: str, sampler: ClockSampler,
                samples: list[tuple[float, dict[str, float]]]) -> None:
    """``clock_drop`` and the ``clock_trace`` measurements. A clock the host cannot show moving (no
    source, or a static one such as /proc/cpuinfo without cpufreq) is a ``skip`` saying why; a reading
    that failed (NaN, sampling stopped by an exception) is an ``error``: neither can pass."""
    if sampler.static or (not sampler.available and not samples):
        ctx.res.add("clock_drop", subject, "last_over_first", None, status="skip",
                    detail=f"no clock verdict on this host: {sampler.static or sampler.source}")
        return
    metric = "sm_clock_mhz" if samples and "sm_clock_mhz" in samples[0][1] else "cpu_mhz"
    every = max(1, len(samples) // MAX_TRACE_POINTS)
    for t, vals in samples[::every]:
        for m, v in vals.items():
            if m != "throttle_reasons":
                ctx.res.add("clock_trace", subject, m, v, status="info", unit=m.rsplit("_", 1)[-1],
                            detail=f"t={t:.2f} s; {sampler.source}")
    clocks = [v.get(metric, math.nan) for _, v in samples]
    failed = sum(not (math.isfinite(c) and c > 0) for c in clocks)
    if sampler.failure or failed or len(clocks) < 6:
        why = (sampler.failure if sampler.failure else
               f"{failed} of {len(clocks)} {metric} readings failed (NaN or not positive)" if failed else
               f"only {len(clocks)} clock samples while the workload ran (6 are needed for thirds)")
        status = "error" if sampler.failure or failed else "skip"
        ctx.res.add("clock_drop", subject, "last_over_first", None, status=status,
                    detail=f"{why}; source {sampler.source}")
        return
    first, last = _thirds(clocks)
    r = statistics.median(last) / statistics.median(first)
    tol = float(ctx.settings["drift_tolerance"])
    named = throttle_names(samples)
    flat = len(set(clocks)) == 1
    status = "fail" if r < 1.0 - tol else "pass"
    ctx.res.add("clock_drop", subject, "last_over_first", r, threshold=1.0 - tol, status=status,
                detail=f"median {metric} of the last {len(last)} samples over the first {len(first)}: {r:.4f}; "
                       f"fails below 1-{tol:g}; source {sampler.source}"
                       + (f"; throttle reasons seen: {', '.join(named)}" if named else "")
                       + ("; the reading never changed" if flat else ""))
