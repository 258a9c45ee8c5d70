"""The quick qualification's performance item (group ``mode``): the injected mode's cost, in seconds.

Qualification (``mystique qualify``, the pytest plugin) runs this group at both levels
(:func:`mystique.validators.performance.qualification_groups`); ``mystique validate performance``
runs it with ``--group mode``. One reference workload (``dlrm``: its step is the shortest, so the
budget holds the most rounds) is built once and its step replayed by the executor:

* with a mode injected on the target (``throttle``, ``straggler``, a custom backend): the paired
  rows of :mod:`.paired` (``mode_slowdown``: the median paired ratio, a device slower on every step;
  ``mode_mean_slowdown``: the summed times' ratio, a device with occasional stalls) for
  ``mode_budget_s`` seconds of ABBA rounds against the same device without the mode; a throttled or
  straggling device fails quick qualification here, on a CPU and on a GPU alike;
* without one there is nothing to pair: ``mode_slowdown`` is a ``skip`` ("nothing injected") and the
  device's step time (median with its distribution-free 95% interval over ``mode_budget_s / 4``
  seconds of steps) is a measurement (``mode_step_time``, ``info``). A healthy device's item is
  therefore skipped ("only measurements"), never failed: its speed is judged against peers by the
  ``fleet`` group and over time by ``sustained``, which the quick item has no time for.

The budget (``mode_budget_s``, 6 s) caps the paired rounds (after at most 1.5 s of warm-up); the
rounds stop earlier when both rows are decided (the adaptive stop of :mod:`.paired`: looks at a
quarter, half and all of the budget). This item is the self-test's only performance check (the
slowness faults' runs are this item alone), meant to catch the built-in ``throttle`` and
``straggler`` (whose stall rate is set so that this budget sees about 15 stalls:
:class:`mystique.faults.slowness.StragglerMode`) on a CPU; the whole item adds about 3-8 s to a
qualification.
"""

from __future__ import annotations

from mystique.validators.correctness import benchmarks as bm

from mystique.replay import runtime as ex

from . import timed
from ._ctx import PerformanceContext
from .paired import run_paired
from .stats import quantile, quantile_interval

WORKLOAD = "dlrm"


def run_mode(ctx: PerformanceContext) -> None:
    """The paired rows with a mode injected; a skip and the step time without one."""
    s = ctx.settings
    budget = float(s["mode_budget_s"])
    with bm.cache_root(ctx.out_dir) as root:
        bench = bm.reference(WORKLOAD, s["config"], s["mode"], "float32", root, ctx.progress)
    executor = ex.Executor(bench.plan, ctx.target.device, seed=ctx.seed)
    with ctx.target.active():
        executor.probe()
    if ctx.target.mode_factory is not None:
        run_paired(ctx, bench.subject, executor, budget)
        return
    ctx.res.add("mode_slowdown", bench.subject, "paired_ratio", None, status="skip", dtype="float32",
                detail=f"nothing injected on {ctx.target.label}: no mode to pair against the device without it")
    _step_time_row(ctx, bench.subject, executor, budget / 4)


def _step_time_row(ctx: PerformanceContext, subject: str, executor: ex.Executor, seconds: float) -> None:
    """``mode_step_time`` (info): the median step time (ms) over ``seconds`` of steps (at least 6: the
    median's distribution-free interval needs 6 values) on the timed calls' clock."""
    ms: list[float] = []
    with ctx.target.active():
        executor.run_iteration()  # one warm-up step
        ctx.target.synchronize()
        start = timed.clock()
        while len(ms) < 6 or timed.clock() - start < seconds:
            t0 = timed.clock()
            executor.run_iteration()
            ctx.target.synchronize()
            ms.append((timed.clock() - t0) * 1e3)
    lo, hi = quantile_interval(ms, 0.5)
    ctx.res.add("mode_step_time", subject, "median_ms", quantile(ms, 0.5), status="info", unit="ms",
                dtype="float32", low=lo, high=hi,
                detail=f"median of {len(ms)} steps on {ctx.target.label}, distribution-free 95% interval "
                       f"[{lo:.4g}, {hi:.4g}] ms; a figure of the quick item, not a verdict (the fleet group "
                       "compares a device's speed with its peers')")
