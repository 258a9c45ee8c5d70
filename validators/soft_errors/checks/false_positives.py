"""Check group ``false_positives``: clean checked operations (random shapes, scales, distributions,
dtypes) and protected forwards of the reference workloads must raise no alarm (any alarm fails); the
rate is a measurement with its Wilson interval (a design rate of 0 is not a rate any campaign can show)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from ...groups import GroupContext
from ..campaign import clean_trial_fn
from ..protect import protect
from .common import rate_rows, run_campaign, workload


def run_false_positives(ctx: GroupContext) -> None:
    res, target, seed = ctx.res, ctx.target, ctx.seed
    n = int(ctx.options["fp_trials"])
    outcomes, resumed = run_campaign(ctx, "false_positives", n, clean_trial_fn(seed, target.device, target.active),
                                     max(1000, n // 10), n=n)
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        by_op[o["op"]].append(o)
    alarms = [o for o in outcomes if o["alarm"]]
    first = f"; first alarm: {alarms[0]['op']} seed={alarms[0]['seed']} shape={alarms[0]['shape']}" if alarms else ""
    worst = max((o["ratio"] for o in outcomes if not o["alarm"]), default=0.0)
    # the checker's thresholds are bounds of the rounding error, so its design rate is 0, which no finite
    # campaign shows as a rate: the rate is a measurement (its interval says how small these trials show
    # it), and the check is that no clean op raised an alarm (rate_rows' screen, and per op below)
    rate_rows(res, "false_positives", "checked_ops", "", "false_positive_rate", len(alarms), n, target=0.0,
              higher_is_better=False, screen=True, bad="alarms",
              detail=f"{len(alarms)} alarms in {n} clean checked ops (campaign seed={seed}, {resumed} resumed); "
                     f"largest clean |diff|/threshold {worst:.3g}{first}")
    disagree = [o for o in outcomes if not o.get("paths_agree", True)]
    res.add("false_positives", "checked_ops", "path_disagreements", len(disagree), threshold=0,
            status="fail" if disagree else "pass",
            detail="clean ops where the lower-bound fast path and the exact thresholds reached different verdicts"
                   + (f"; first: {disagree[0]['op']} seed={disagree[0]['seed']} shape={disagree[0]['shape']}"
                      if disagree else ""))
    for op, outs in sorted(by_op.items()):
        k = sum(o["alarm"] for o in outs)
        res.add("false_positives", op, "alarms", k, threshold=0, status="fail" if k else "pass",
                detail=f"{len(outs)} clean ops; largest ratio {max(o['ratio'] for o in outs):.3g}")
    for name in ctx.options["workloads"]:
        _protected_workload(ctx, name)


def _protected_workload(ctx: GroupContext, name: str) -> None:
    """Protected forwards of a reference workload: its real activations must raise no alarm."""
    res, target, seed, opts = ctx.res, ctx.target, ctx.seed, ctx.options
    wl = workload(name)
    if wl is None:
        res.add("false_positives", f"protect_{name}", "alarms", math.nan, status="skip",
                detail=f"workload {name} not available")
        return
    mod, cfg = wl
    checks = alarms_n = 0
    worst = 0.0
    for s in range(int(opts.get("workload_seeds", 3))):
        model = mod.build_model(cfg, device=torch.device(target.device), dtype=torch.float32, seed=seed + s).eval()
        batch = mod.make_batch(cfg, device=torch.device(target.device), seed=seed + s)
        with torch.no_grad(), protect(model, exact_ratios=True) as guard, target.active():
            mod.forward(model, batch)
        checks += guard.checks
        alarms_n += len(guard.alarms)
        worst = max(worst, guard.max_ratio)
        first_alarm = guard.alarms[0].describe() if guard.alarms else ""
    res.add("false_positives", f"protect_{name}", "alarms", alarms_n, threshold=0,
            status="fail" if alarms_n else "pass", dtype="float32",
            detail=f"{checks} checked Linear/Embedding calls over {opts.get('workload_seeds', 3)} seeds; "
                   f"largest clean ratio {worst:.3g} {first_alarm}")
