"""What several soft-error check groups share: rate rows with their Wilson interval, the reference
workloads, and the key that ties a campaign checkpoint to the run's settings."""

from __future__ import annotations

import math
from typing import Any

from mystique import workloads
from mystique.results import Results

from ...groups import GroupContext
from ..campaign import Campaign
from ..stats import wilson


def rate_rows(res: Results, check: str, subject: str, dtype: str, metric: str, hits: int, n: int, *,
              target: float | None, higher_is_better: bool, detail: str) -> None:
    """Rows ``metric``, ``metric_ci_low``, ``metric_ci_high`` and ``trials`` for one rate.

    The rate is a check (pass/fail against ``target``) where it has a target, else a measurement
    (``info``); its interval bounds and the trial count are always measurements."""
    lo, hi = wilson(hits, n)
    rate = hits / n if n else math.nan
    if n == 0:
        status = "skip"
    elif target is None:
        status = "info"
    else:
        status = "pass" if (rate >= target if higher_is_better else rate <= target) else "fail"
    res.add(check, subject, metric, rate, status=status, threshold=target, dtype=dtype, detail=detail)
    res.add(check, subject, f"{metric}_ci_low", lo, status="info" if n else "skip", dtype=dtype,
            detail="Wilson 95% interval")
    res.add(check, subject, f"{metric}_ci_high", hi, status="info" if n else "skip", dtype=dtype,
            detail="Wilson 95% interval")
    res.add(check, subject, "trials", n, status="info", dtype=dtype)


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
