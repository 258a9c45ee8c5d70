"""Check group ``detection_campaign``: flips injected per checked op, site, bit class and pattern; the
detection rate of significant flips (Wilson interval, trials) per combination, op, bit class and in
all, benign flips counted apart. Contrast ops (bf16 checked after rounding) are measured, not judged."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from ...groups import GroupContext
from ..abft import half_kind
from ..campaign import CONTRAST_OPS, EMB_OPS, GEMM_OPS, detection_combos, detection_trial_fn
from ..half import HALF
from ..half import describe as describe_half
from .common import rate_rows, run_campaign

DETECTION_TARGET = 0.999
SIGNIFICANT = "significant = moves an output by more than 2^-7 x rms(output) (int8: any change)"


def run_detection_campaign(ctx: GroupContext) -> None:
    res, target, seed = ctx.res, ctx.target, ctx.seed
    ops = tuple(ctx.options.get("ops") or (*GEMM_OPS, *EMB_OPS, *CONTRAST_OPS))
    n = int(ctx.options["trials"])
    fn = detection_trial_fn(detection_combos(ops), seed, target.device, target.active)
    outcomes, resumed = run_campaign(ctx, "detection", n, fn, max(500, n // 10), n=n, ops=list(ops))
    keyed: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    per_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    per_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        keyed[(o["op"], o["site"], o["bit_class"])].append(o)
        per_op[o["op"]].append(o)
        per_class[o["bit_class"]].append(o)
    for (op, site, cls), outs in sorted(keyed.items()):
        _combination_rows(ctx, f"{op}/{site}/{cls}", op, outs)
    for op, outs in sorted(per_op.items()):
        sig = [o for o in outs if o["significant"]]
        rate_rows(res, "detection_campaign", op, "", "detection_rate", sum(o["detected"] for o in sig), len(sig),
                  target=None if op in CONTRAST_OPS else DETECTION_TARGET, higher_is_better=True,
                  detail=f"all sites and bit classes; {SIGNIFICANT}" + (
                      "; contrast: bf16 checked after rounding (not the product's method)"
                      if op in CONTRAST_OPS else "") + _accumulator(op, target))
    real = [o for o in outcomes if o["op"] not in CONTRAST_OPS]
    for cls, outs in sorted(per_class.items()):
        sig = [o for o in outs if o["significant"] and o["op"] not in CONTRAST_OPS]
        rate_rows(res, "detection_campaign", f"bit_class/{cls}", "", "detection_rate",
                  sum(o["detected"] for o in sig), len(sig), target=DETECTION_TARGET, higher_is_better=True,
                  detail=f"all checked ops; {SIGNIFICANT}")
    sig = [o for o in real if o["significant"]]
    rate_rows(res, "detection_campaign", "all", "", "detection_rate", sum(o["detected"] for o in sig), len(sig),
              target=DETECTION_TARGET, higher_is_better=True,
              detail=f"{len(real)} injected flips, {len(sig)} significant; {SIGNIFICANT}; {resumed} trials resumed")
    res.add("detection_campaign", "all", "significant_fraction", len(sig) / len(real) if real else math.nan,
            status="info", detail="share of injected flips that are significant")


def _combination_rows(ctx: GroupContext, subject: str, op: str, outs: list[dict[str, Any]]) -> None:
    """The detection rate of one op, site and bit class, with its first miss."""
    sig = [o for o in outs if o["significant"]]
    missed = [o for o in sig if not o["detected"]]
    benign = len(outs) - len(sig)
    detail = (f"{SIGNIFICANT}; {len(sig)} significant, {benign} benign "
              f"({sum(o['detected'] for o in outs if not o['significant'])} of them flagged); seed={ctx.seed}")
    if missed:
        m = missed[0]
        detail += f"; first miss: seed={m['seed']} shape={m['shape']} bits={m['bits']} delta={m['delta']:.3g}"
    rate_rows(ctx.res, "detection_campaign", subject, "", "detection_rate", sum(o["detected"] for o in sig),
              len(sig), target=None if op in CONTRAST_OPS else DETECTION_TARGET, higher_is_better=True, detail=detail)


def _accumulator(op: str, target: Any) -> str:
    """Which product a detection campaign's half-precision GEMM trials flipped and checked (for the detail)."""
    kind = op.removeprefix("gemm_").removesuffix("_rounded_check")
    dt = getattr(torch, kind, None) if op.startswith("gemm_") else None
    if dt not in HALF:
        return ""
    with target.active():
        how = half_kind(torch.zeros(1, 1, dtype=dt, device=target.device))
    return f"; accumulator: {describe_half(how, dt)}"
