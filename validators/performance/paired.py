"""The injected mode's cost, paired (rows ``mode_slowdown`` and ``mode_mean_slowdown``).

With a mode injected on the target (``--inject``: a fault simulation, a custom backend), the same
executor's step alternates in ABBA rounds (:func:`mystique.timing.paired_rounds`) between the
device under test (``target.active()``) and the reference: the same device without the injected
mode (an emulation stays) under :class:`mystique.faults.PassThroughMode`, a mode that only calls
each operator, so that both sides pay the same Python dispatch cost and the ratio is what the
injected mode does beyond dispatching.

* ``mode_slowdown``: the median paired ratio with its distribution-free interval: a device
  that is slower on every step (throttled clocks).
* ``mode_mean_slowdown``: the ratio of the summed step times with a bootstrap interval over
  rounds (2000 resamples, seeded): a device with occasional long stalls, which move the mean but
  not the median.

Both are decided by an adaptive stop (:mod:`mystique.stopping`): the rounds are looked at only at
three pre-declared times, a quarter, half and all of the budget (times, not round counts: a step's
pace is known only roughly from the warm-up), each look with the intervals at 98.33% (Bonferroni
over the 3 looks: 95% overall, a false failure at most 2.5% as with one fixed 95% interval); they
stop at the first look where both rows are decided. A row fails when its interval lies wholly above
``1 + mode_margin``, passes when it lies at or below it, and stays inconclusive (undecided) when it
still straddles it at the last look. ``mode_mean_slowdown`` passes only at the last look (a stall not
yet seen could still come), so a mode that costs nothing runs the whole budget; a throttled or
straggling device stops as soon as both rows are decided, a marginal one runs the whole budget.

A straggler's stalls move the mean only as they are seen: the bootstrap interval of rounds that
hold no stall cannot know of one, so the first look must hold several stalls for the
``mode_mean_slowdown`` row to be sound; the built-in ``straggler``'s rate is set for it
(:mod:`mystique.faults.slowness`). Without an injected mode there is nothing to pair: no rows.
"""

from __future__ import annotations

from typing import Any

from mystique.faults import PassThroughMode
from mystique.hostinfo import torch_threads
from mystique.stopping import Looks, Stopper
from mystique.timing import Paired, median_interval, paired_rounds

from ._ctx import PerformanceContext
from .stats import BOOTSTRAP, bootstrap_sum_ratio

#: a half-width no interval reaches: the paired rounds stop by the adaptive stop (or their time cap) only
RUN_WHOLE_BUDGET = 1e-12
#: the fewest rounds the bootstrap of the summed times decides with: on a host so busy that 6 s hold 9
#: rounds, a 9-round bootstrap passed a throttled device (0.87 [0.70, 0.98]); fewer rounds leave that row
#: undecided. The median's interval is distribution-free (order statistics of the paired ratios) and
#: decides from 7 rounds at 98.33% (0.5^7 <= 0.0083): a 3x throttled step whose 1 s budget holds 8 rounds,
#: every ratio near 3, fails on the median (it was undecided when 24 rounds were asked of both rows)
MIN_FIRST = 24
#: looks of the mode item: at a quarter, half and all of the budget (98.33% intervals)
MODE_LOOKS = 3


def mode_stopper(p: Paired, seconds: float, limit: float, seed: int) -> Stopper:
    """The adaptive stop of both rows over the growing rounds ``p``."""
    looks = Looks(first=MIN_FIRST, time_cap_s=seconds, looks=MODE_LOOKS, by_time=True)
    return Stopper(looks, {
        "mode_slowdown": (lambda level: median_interval(p.ratios, level), limit),
        "mode_mean_slowdown": (lambda level: bootstrap_sum_ratio(p.a_ms, p.b_ms, seed, level), limit),
    }, late_pass=frozenset({"mode_mean_slowdown"}), min_rounds={"mode_mean_slowdown": MIN_FIRST})


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

    ctx.progress.note(f"paired: {subject} with {target.inject or 'the mode'} vs without, at most {seconds:.0f} s")
    limit = 1.0 + margin
    held: list[Stopper] = []

    def decide(p: Paired, elapsed: float) -> str | None:
        if not held:
            held.append(mode_stopper(p, seconds, limit, ctx.seed))
        return held[0].after_round(p.rounds, elapsed)

    # one intra-op thread on the CPU: two threads on a busy 2-core host wait at every parallel region's
    # barrier for a descheduled partner, which made steps 15x slower and their ratios noise
    with torch_threads(1, target.device):
        p = paired_rounds(dut, reference, device=target.device, sync=target.synchronize,
                          half_width=RUN_WHOLE_BUDGET, time_cap_s=max(seconds, 1.0), min_rounds=MIN_FIRST,
                          warmup_cap_s=max(1.0, seconds / 4), decide=decide)
    if not held:
        held.append(mode_stopper(p, seconds, limit, ctx.seed))
    stopper = held[0]
    if not stopper.stop:  # the rounds ended by their own cap: the last look is there
        stopper.look(p.rounds, p.seconds - p.warmup_s)
        stopper.stop = p.stop or "time cap"
    final = stopper.final
    pct = f"{stopper.plan.look_level:.2%}"
    how = (f"{p.rounds} ABBA rounds of the step on {target.label} vs {ref.label} under a pass-through mode; "
           f"warm-up {p.warmup_rounds} rounds" + ("" if p.warmup_settled else " (not settled)")
           + f"; {stopper.describe()}")
    lo, hi = final.intervals["mode_slowdown"]
    how += "; 1 intra-op thread" if str(target.device).startswith("cpu") else ""
    ctx.res.add("mode_slowdown", subject, "paired_ratio", p.ratio, threshold=limit, low=lo, high=hi,
                status=final.verdicts["mode_slowdown"], dtype="float32",
                detail=f"median paired ratio {p.ratio:.4f}, {pct} interval [{lo:.4f}, {hi:.4f}]; {how}; fails above "
                       f"1+{margin:g} with confidence")
    total = sum(p.a_ms) / sum(p.b_ms) if p.b_ms and sum(p.b_ms) > 0 else float("nan")
    blo, bhi = final.intervals["mode_mean_slowdown"]
    ctx.res.add("mode_mean_slowdown", subject, "time_ratio", total, threshold=limit, low=blo, high=bhi,
                status=final.verdicts["mode_mean_slowdown"], dtype="float32",
                detail=f"summed step time ratio {total:.4f}, {pct} bootstrap interval [{blo:.4f}, {bhi:.4f}] "
                       f"({BOOTSTRAP} resamples of rounds, seed {ctx.seed}); {how}; fails above 1+{margin:g} with "
                       "confidence (occasional stalls move the mean, not the median)")
