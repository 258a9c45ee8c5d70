"""What several soft-error check groups share: rate rows with their Wilson interval, the reference
workloads, and the key that ties a campaign checkpoint to the run's settings."""

from __future__ import annotations

import math
from typing import Any

from mystique import workloads
from mystique.results import Results

from ...groups import GroupContext
from ..campaign import Campaign
from ..stats import rate_verdict, trials_to_pass, wilson


def rate_rows(res: Results, check: str, subject: str, dtype: str, metric: str, hits: int, n: int, *,
              target: float | None, higher_is_better: bool, detail: str, screen: bool = False,
              bad: str = "misses", trials_metric: str = "trials") -> None:
    """Rows ``metric`` (its Wilson 95% interval in ``low`` and ``high``), ``metric_ci_low``,
    ``metric_ci_high`` and ``trials_metric`` (``trials``; a second rate of one subject names its own,
    ``PREFIX_trials`` for a metric ``PREFIX_detection_rate``) for one rate of ``hits`` in ``n`` trials.

    A rate without a target is a measurement (``info``). One with a target is judged from its
    interval (:func:`mystique.binomial.rate_verdict`): ``pass``, ``fail``, or ``inconclusive`` with
    the trials that would decide it in the detail. ``screen`` (a campaign sized to catch faults, not
    to show a rate: the quick level) makes an undecided rate a measurement instead, and adds the
    check such a campaign can decide: ``bad``, the count of bad outcomes (misses where higher is
    better, alarms where lower is), threshold 0, failing on any. Interval bounds and trial counts
    are always measurements."""
    lo, hi = wilson(hits, n)
    rate = hits / n if n else math.nan
    status, threshold, why = "info", None, ""
    if n == 0:
        status = "skip"
    elif target is not None:
        status, threshold = rate_verdict(hits, n, target, higher_is_better), target
        why = _verdict_detail(status, hits, n, target, higher_is_better, lo, hi, screen, bad)
        if status == "inconclusive" and screen:
            status, threshold = "info", None
    res.add(check, subject, metric, rate, status=status, threshold=threshold, dtype=dtype, low=lo, high=hi,
            detail="; ".join(x for x in (why, detail) if x))
    res.add(check, subject, f"{metric}_ci_low", lo, status="info" if n else "skip", dtype=dtype,
            detail="Wilson 95% interval")
    res.add(check, subject, f"{metric}_ci_high", hi, status="info" if n else "skip", dtype=dtype,
            detail="Wilson 95% interval")
    res.add(check, subject, trials_metric, n, status="info", dtype=dtype)
    if screen and n and target is not None:
        k = n - hits if higher_is_better else hits
        res.add(check, subject, bad, k, threshold=0, status="fail" if k else "pass", dtype=dtype,
                detail=f"{k} {bad} in this seeded set of {n} trials; any fails; {metric} "
                       + _needed(hits, n, target, higher_is_better))


def _needed(hits: int, n: int, target: float, higher_is_better: bool) -> str:
    """What showing the rate's target at 95% would take, for a detail."""
    side = ">=" if higher_is_better else "<="
    need = trials_to_pass(hits, n, target, higher_is_better)
    if need is None:
        return f"{side} {target:g} cannot be shown by any finite number of trials"
    return f"{side} {target:g} is shown at 95% by {need} trials in all with no further bad outcome"


def _verdict_detail(status: str, hits: int, n: int, target: float, higher_is_better: bool, lo: float, hi: float,
                    screen: bool, bad: str) -> str:
    """Why a judged rate got ``status``, read from its interval (the row's ``low`` and ``high``)."""
    side = ">=" if higher_is_better else "<="
    where = f"95% interval [{lo:.6g}, {hi:.6g}] over {n} trials"
    if status == "pass":
        return f"{where}: its {'lower' if higher_is_better else 'upper'} bound is {side} {target:g}"
    if status == "fail":
        return f"{where}: its {'upper' if higher_is_better else 'lower'} bound is {'<' if higher_is_better else '>'} "\
               f"{target:g}"
    need = _needed(hits, n, target, higher_is_better)
    if screen:
        return f"a measurement: {where} straddles {target:g} ({need}); the check is '{bad}'"
    return f"inconclusive: {where} straddles {target:g} ({need})"


def workload(name: str, config: str = "debug") -> tuple[Any, Any] | None:
    """``(module, config)`` of reference workload ``name``, or None where it or its config is not available."""
    try:
        mod = workloads.get(name)
    except (ValueError, ImportError):
        return None
    if config not in mod.CONFIGS:
        return None
    return mod, mod.CONFIGS[config]


def campaign_key(ctx: GroupContext, **params: Any) -> dict[str, Any]:
    """Everything besides the campaign's own ``params`` that changes a campaign's outcomes: the device
    (as results rows label it: injected fault and emulation included), its model name, the seed and
    the level with its sizes (the campaign adds the torch and mystique versions)."""
    target = ctx.target
    return {"device": target.device, "label": target.label, "device_name": target.info().name,
            "inject": target.inject or "", "emulate": target.emulate or "", "seed": int(ctx.seed),
            "level": ctx.level, **params}


def run_campaign(ctx: GroupContext, name: str, n_trials: int, trial_fn: Any, every: int,
                 **params: Any) -> tuple[list[dict[str, Any]], int]:
    """``(outcomes, trials resumed)`` of the checkpointed campaign ``name`` of ``n_trials`` trials (a
    progress line every ``every`` trials), keyed on the run's settings and ``params``."""
    camp = Campaign(name, campaign_key(ctx, **params), n_trials, trial_fn, ctx.options.get("checkpoint"),
                    progress_every=every)
    return camp.run(), camp.resumed
