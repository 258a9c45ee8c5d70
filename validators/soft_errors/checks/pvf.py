"""Check group ``pvf``: the Parameter Vulnerability Factor per parameter group of DLRM, BERT and Llama
(one random bit flip per trial; measurements, ranked), after a control: the unflipped model on the
device under test must reproduce the golden output (else a trial's change would be the device's)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from ...groups import GroupContext
from ..pvf import output_changed, parameter_groups, pvf_trial_fn
from ..stats import wilson
from .common import rate_rows, run_campaign, workload


def run_pvf(ctx: GroupContext) -> None:
    for name in ctx.options["workloads"]:
        _workload_pvf(ctx, name, ctx.options["pvf_config"])


def _workload_pvf(ctx: GroupContext, name: str, config: str) -> None:
    res, target, seed = ctx.res, ctx.target, ctx.seed
    wl = workload(name, config)
    if wl is None:
        res.add("pvf", name, "pvf", math.nan, status="skip", detail=f"workload {name} {config} not available")
        return
    mod, cfg = wl
    dev = torch.device(target.device)
    model = mod.build_model(cfg, device=dev, dtype=torch.float32, seed=seed).eval()
    batch = mod.make_batch(cfg, device=dev, seed=seed)
    with torch.no_grad():
        golden = mod.forward(model, batch).detach().clone()  # outside the device-under-test mode
    with torch.no_grad(), target.active():  # the control: no flip, on the device under test
        control = mod.forward(model, batch).detach()
    off = output_changed(name, golden, control, batch)
    res.add("pvf_control", name, "output_changed", float(off), threshold=0, status="fail" if off else "pass",
            dtype="float32",
            detail=f"{name} {config}: the unflipped model on the device under test "
                   + ("does NOT reproduce" if off else "reproduces")
                   + " the golden output by the PVF's own change test (else a trial's 'changed' would be the "
                     f"device's own difference, not the flip's); seed={seed}")
    groups = parameter_groups(model)
    n = int(ctx.options["pvf_trials"]) * len(groups)
    fn = pvf_trial_fn(name, model, batch, golden, mod.forward, groups, seed, target.active)
    outcomes, _ = run_campaign(ctx, f"pvf_{name}", n, fn, max(200, n // 5), n=n, config=config, groups=list(groups))
    _pvf_rows(ctx, name, outcomes, config)


def _pvf_rows(ctx: GroupContext, name: str, outcomes: list[dict[str, Any]], config: str) -> None:
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        per[o["group"]].append(o)
    stats = []
    for gname, outs in per.items():
        k = sum(o["changed"] for o in outs)
        stats.append((gname, k, len(outs), wilson(k, len(outs))[0]))
    stats.sort(key=lambda s: (-(s[1] / s[2]), -s[3], s[0]))
    for rank, (gname, k, n, _) in enumerate(stats, 1):
        subj = f"{name}/{gname}"
        first = next((o for o in per[gname] if o["changed"]), None)
        detail = f"{name} {config}, one random bit flip per trial, seed={ctx.seed}"
        if first:
            detail += (f"; e.g. {first['param']}[{first['index']}] bits {first['bits']} "
                       f"{first['original']:.3g}->{first['corrupted']:.3g}")
        rate_rows(ctx.res, "pvf", subj, "float32", "pvf", k, n, target=None, higher_is_better=False, detail=detail)
        ctx.res.add("pvf", subj, "pvf_rank", rank, status="info", dtype="float32",
                    detail=f"rank among {len(stats)} parameter groups of {name} (1 = most vulnerable)")
