"""The injected mode's cost, paired (rows ``mode_slowdown`` and ``mode_mean_slowdown``).

With a mode injected on the target (``--inject``: a fault simulation, a custom backend), the same
executor's step alternates in ABBA rounds (:func:`mystique.timing.paired_rounds`) between the
device under test (``target.active()``) and the reference: the same device without the injected
mode (an emulation stays) under :class:`mystique.faults.PassThroughMode`, a mode that only calls
each operator, so that both sides pay the same Python dispatch cost and the ratio is what the
injected mode does beyond dispatching.

* ``mode_slowdown``: the median paired ratio with its distribution-free 95% interval: a device
  that is slower on every step (throttled clocks).
* ``mode_mean_slowdown``: the ratio of the summed step times with a 95% bootstrap interval over
  rounds (2000 resamples, seeded): a device with occasional long stalls, which move the mean but
  not the median.

Both fail when the interval lies wholly above ``1 + mode_margin`` and pass when it lies at or
below it (inconclusive across). The margin (5%) is twice the half-width (2.5%) the paired
method is run to, so an interval that reached its target can lie entirely on one side of it.
Without an injected mode there is nothing to pair: no rows.
"""

from __future__ import annotations

from typing import Any

from mystique.faults import PassThroughMode
from mystique.timing import paired_rounds

from ._ctx import PerformanceContext
from .stats import BOOTSTRAP, bootstrap_sum_ratio, slowdown_verdict

#: a half-width no interval reaches: the paired rounds stop at their time cap only
RUN_WHOLE_BUDGET = 1e-12


def run_paired(ctx: PerformanceContext, subject: str, executor: Any, seconds: float) -> None:
    target = ctx.target
    ref = target.without_mode()
    margin = float(ctx.settings["mode_margin"])

    def dut() -> None:
        with target.active():
            executor.run_iteration()

    def reference() -> None:
        with ref.active(), PassThroughMode():
            executor.run_iteration()

    ctx.progress.note(f"paired: {subject} with {target.inject or 'the mode'} vs without, {seconds:.0f} s")
    # the rounds run the whole budget: occasional stalls move the mean, whose interval narrows only as
    # stalls accumulate, so a median interval that is narrow early is no reason to stop (RUN_WHOLE_BUDGET)
    p = paired_rounds(dut, reference, device=target.device, sync=target.synchronize, half_width=RUN_WHOLE_BUDGET,
                      time_cap_s=max(seconds, 1.0), min_rounds=12, warmup_cap_s=max(1.0, seconds / 4))
    lo, hi = p.interval
    how = (f"{p.rounds} ABBA rounds ({p.stop}) of the step on {target.label} vs {ref.label} under a pass-through "
           f"mode; warm-up {p.warmup_rounds} rounds" + ("" if p.warmup_settled else " (not settled)"))
    ctx.res.add("mode_slowdown", subject, "paired_ratio", p.ratio, threshold=1.0 + margin, low=lo, high=hi,
                status=slowdown_verdict(lo, hi, 1.0 + margin), dtype="float32",
                detail=f"median paired ratio {p.ratio:.4f}, 95% interval [{lo:.4f}, {hi:.4f}]; {how}; fails above "
                       f"1+{margin:g} with confidence")
    total = sum(p.a_ms) / sum(p.b_ms) if p.b_ms and sum(p.b_ms) > 0 else float("nan")
    blo, bhi = bootstrap_sum_ratio(p.a_ms, p.b_ms, ctx.seed)
    ctx.res.add("mode_mean_slowdown", subject, "time_ratio", total, threshold=1.0 + margin, low=blo, high=bhi,
                status=slowdown_verdict(blo, bhi, 1.0 + margin), dtype="float32",
                detail=f"summed step time ratio {total:.4f}, 95% bootstrap interval [{blo:.4f}, {bhi:.4f}] "
                       f"({BOOTSTRAP} resamples of rounds, seed {ctx.seed}); {how}; fails above 1+{margin:g} with "
                       "confidence (occasional stalls move the mean, not the median)")
