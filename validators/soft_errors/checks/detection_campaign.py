"""Check group ``detection_campaign``: flips injected per checked op, site, bit class and pattern; the
detection rate (Wilson interval, trials) per combination, op, bit class and in all. Contrast ops (bf16
checked after rounding) are measured, not judged.

Which flips a rate is judged on (:func:`judged`):

* the check's rule, where its bound applies (float GEMM operand and output flips, flips of a looked-up
  EmbeddingBag row): the flips it is *sure* to see by its own derivation
  (:func:`..abft.gemm.sure_row_alarms`, :func:`..abft.bag_verdict.sure_alarms`: a change of a checksum
  beyond the rounding a clean operation and its reference may make together). A smaller change cannot be
  told from rounding; such a flip can still be "significant" (below), e.g. where it tips one bf16 rounding
  of an output element by an ulp, already more than 2^-7 rms. These rows also give the output rule's rate
  as a measurement (``significant_detection_rate``, interval, ``significant_trials``) and the share of
  significant flips below the check's resolution (``below_resolution_fraction``).
* the output rule elsewhere (int8 GEMM, checked exactly: every change is significant; flips of a bag's
  output, where no bound of the table's checksums applies; outcomes recorded without ``sure``): the
  significant flips, those that move the op's output in its dtype by more than 2^-7 rms(output).

A rate is judged from its 95% Wilson interval against :data:`DETECTION_TARGET`, never from its
point estimate. With no miss that takes 3838 significant flips per row
(:func:`mystique.binomial.trials_to_pass`), more than a quick run affords, so the two levels differ:

* ``full`` decides every rate: after the campaign, top-up rounds (:func:`topup_plan`) add trials to
  each (op, site, bit class) still undecided, as many as would decide it if none were missed, scaled
  by its share of significant flips so far; a row still undecided after :data:`TOPUP_ROUNDS` rounds or
  :data:`TOPUP_LIMIT` trials is ``inconclusive`` with the trials it needs.
* ``quick`` is a screen: a rate its trials cannot decide is a measurement (``info``, with its
  interval), and the check it can decide is ``misses``: every judged flip of its fixed seeded set
  caught (any miss fails).
"""

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
from ..stats import rate_verdict, trials_to_pass
from .common import rate_rows, run_campaign

DETECTION_TARGET = 0.999
SIGNIFICANT = "significant = moves an output by more than 2^-7 x rms(output) (int8: any change)"
SURE_RULE = ("judged on the flips sure to alarm by the check's own bound (a checksum change beyond "
             "thr(before) + thr(after), the rounding a clean operation and its reference may make together)")
OUTPUT_RULE = "judged on the significant flips (the output rule)"
#: why a row keeps the output rule, by (op prefix, site)
OLD_RULE_WHY = {"gemm_int8": "int8 GEMM checked exactly: any change of the product moves its checksums",
                "bag_output": "a flip of the lookup's output: no bound of the table's checksums applies"}
#: a campaign setting recorded with every detection checkpoint: one written before outcomes carried ``sure``
#: (the rule they were judged by) is refused, never judged by a rule its outcomes do not record
RECORDS = {"sure_flips": "recorded"}
TOPUP_ROUNDS = 4  # rounds of top-up trials at the full level
TOPUP_LIMIT = 2_000_000  # top-up trials at most, all rounds together
_MARGIN = 1.15  # top-up trials per needed judged flip, over 1 / the share of judged flips
_SHARE_FLOOR = 0.02  # a row that has shown (almost) no judged flip yet is planned at this share

Row = tuple[str, str, str]  # (op, site, bit class)


def judged(o: dict[str, Any]) -> bool:
    """Whether outcome ``o`` counts in its judged rate: a flip sure to alarm (``o["sure"]``) where the
    check's bound applies, else (``sure`` None or absent) a significant one."""
    sure = o.get("sure")
    return bool(o["significant"]) if sure is None else bool(sure)


def run_detection_campaign(ctx: GroupContext) -> None:
    res, target, seed = ctx.res, ctx.target, ctx.seed
    ops = tuple(ctx.options.get("ops") or (*GEMM_OPS, *EMB_OPS, *CONTRAST_OPS))
    n = int(ctx.options["trials"])
    combos = detection_combos(ops)
    fn = detection_trial_fn(combos, seed, target.device, target.active)
    outcomes, resumed = run_campaign(ctx, "detection", n, fn, max(500, n // 10), n=n, ops=list(ops), **RECORDS)
    added = _top_up(ctx, combos, outcomes, ops) if ctx.full else []
    outcomes = outcomes + added
    screen = not ctx.full
    keyed: dict[Row, list[dict[str, Any]]] = defaultdict(list)
    per_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    per_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        keyed[(o["op"], o["site"], o["bit_class"])].append(o)
        per_op[o["op"]].append(o)
        per_class[o["bit_class"]].append(o)
    for (op, site, cls), outs in sorted(keyed.items()):
        _combination_rows(ctx, f"{op}/{site}/{cls}", op, site, outs, screen)
    for op, outs in sorted(per_op.items()):
        _rate_rows(ctx, op, outs, None if op in CONTRAST_OPS else DETECTION_TARGET, screen,
                   "all sites and bit classes" + (
                       "; contrast: bf16 checked after rounding (not the product's method)"
                       if op in CONTRAST_OPS else "") + _accumulator(op, target))
    real = [o for o in outcomes if o["op"] not in CONTRAST_OPS]
    for cls, outs in sorted(per_class.items()):
        _rate_rows(ctx, f"bit_class/{cls}", [o for o in outs if o["op"] not in CONTRAST_OPS], DETECTION_TARGET,
                   screen, "all checked ops")
    sig = [o for o in real if o["significant"]]
    _rate_rows(ctx, "all", real, DETECTION_TARGET, screen,
               f"{len(real)} injected flips ({len(added)} of them top-up trials), {len(sig)} significant, "
               f"{sum(map(judged, real))} judged; {resumed} trials resumed; " + (
                   "full level: every rate decided from its 95% interval" if ctx.full else
                   "quick level: a screen (any miss of a judged flip fails), the rates are decided at the full "
                   "level"))
    res.add("detection_campaign", "all", "significant_fraction", len(sig) / len(real) if real else math.nan,
            status="info", detail="share of injected flips that are significant")


def _rate_rows(ctx: GroupContext, subject: str, outs: list[dict[str, Any]], target: float | None, screen: bool,
               detail: str) -> None:
    """The judged rate of ``outs`` (:func:`judged`; against ``target``) and, where some outcome is judged on
    the check's rule, the output rule's rate (a measurement) and the share of significant flips below the
    check's resolution."""
    res = ctx.res
    judge = [o for o in outs if judged(o)]
    known = [o for o in outs if o.get("sure") is not None]
    rule = (SURE_RULE if len(known) == len(outs) else OUTPUT_RULE if not known else
            f"{SURE_RULE} where it applies ({len(known)} of {len(outs)} flips), elsewhere {OUTPUT_RULE}")
    rate_rows(res, "detection_campaign", subject, "", "detection_rate", sum(o["detected"] for o in judge),
              len(judge), target=target, higher_is_better=True, screen=screen,
              detail=f"{rule}; {SIGNIFICANT}; {detail}")
    if not known:
        return
    sig = [o for o in outs if o["significant"]]
    missed = [o for o in sig if not o["detected"]]
    first = (f"; first miss: seed={missed[0]['seed']} sure={missed[0].get('sure')} shape={missed[0]['shape']} "
             f"bits={missed[0]['bits']} delta={missed[0]['delta']:.3g}") if missed else ""
    rate_rows(res, "detection_campaign", subject, "", "significant_detection_rate", sum(o["detected"] for o in sig),
              len(sig), target=None, higher_is_better=True, trials_metric="significant_trials",
              detail=f"the output rule, a measurement (the judged rate is detection_rate): detected among "
                     f"significant flips; {SIGNIFICANT}{first}")
    sig_known = [o for o in sig if o.get("sure") is not None]
    below = sum(not o["sure"] for o in sig_known)
    res.add("detection_campaign", subject, "below_resolution_fraction",
            below / len(sig_known) if sig_known else math.nan, status="info" if sig_known else "skip",
            detail=f"{below} of {len(sig_known)} significant flips (where the check's bound applies) are below "
                   f"the check's resolution: their checksum change is within thr(before) + thr(after), not sure "
                   f"to alarm ({sum(o['detected'] for o in sig_known if not o['sure'])} of them detected)")


def topup_plan(combos: list[tuple[str, str, str, str]], outcomes: list[dict[str, Any]], target: float,
               budget: int) -> dict[int, int]:
    """Top-up trials per combo index (into ``combos``) that would decide every judged (op, site, bit
    class) row still undecided by ``outcomes``, if none of its further judged flips (:func:`judged`) were
    missed.

    A row short of ``need`` judged flips (:func:`trials_to_pass`) gets ``(need - now) x 1.15 /
    share`` trials, ``share`` its share of judged flips so far (Laplace's estimate, at least 2%),
    spread evenly over its patterns; the plan stops adding rows at ``budget`` trials. Contrast ops
    (no target) and decided rows get none."""
    rows: dict[Row, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        if o["op"] not in CONTRAST_OPS:
            rows[(o["op"], o["site"], o["bit_class"])].append(o)
    plan: dict[int, int] = {}
    spent = 0
    for row, outs in sorted(rows.items()):
        sig = [o for o in outs if judged(o)]
        hits = sum(o["detected"] for o in sig)
        if sig and rate_verdict(hits, len(sig), target, True) != "inconclusive":
            continue
        need = trials_to_pass(hits, len(sig), target, True)
        if need is None:
            continue
        share = max(_SHARE_FLOOR, (len(sig) + 1) / (len(outs) + 2))
        extra = math.ceil((need - len(sig)) * _MARGIN / share)
        idx = [i for i, c in enumerate(combos) if c[:3] == row]
        each = math.ceil(extra / len(idx))
        if spent + each * len(idx) > budget:
            break
        for i in idx:
            plan[i] = each
        spent += each * len(idx)
    return plan


def _top_up(ctx: GroupContext, combos: list[tuple[str, str, str, str]], outcomes: list[dict[str, Any]],
            ops: tuple[str, ...]) -> list[dict[str, Any]]:
    """The top-up rounds of the full level (module docstring): their outcomes, checkpointed per round."""
    added: list[dict[str, Any]] = []
    for rnd in range(1, TOPUP_ROUNDS + 1):
        plan = topup_plan(combos, outcomes + added, DETECTION_TARGET, TOPUP_LIMIT - len(added))
        if not plan:
            break
        schedule = _interleave(plan)
        fn = detection_trial_fn(combos, ctx.seed, ctx.target.device, ctx.target.active, schedule=schedule,
                                salt=("detection-topup", rnd))
        outs, _ = run_campaign(ctx, f"detection_topup{rnd}", len(schedule), fn, max(500, len(schedule) // 10),
                               ops=list(ops), plan=sorted(plan.items()), **RECORDS)
        added.extend(outs)
    return added


def _interleave(plan: dict[int, int]) -> list[int]:
    """Combo indices, each ``plan[i]`` times, in rounds over the combos (progress spreads evenly)."""
    left = dict(sorted(plan.items()))
    out: list[int] = []
    while left:
        out.extend(left)
        left = {i: k - 1 for i, k in left.items() if k > 1}
    return out


def _combination_rows(ctx: GroupContext, subject: str, op: str, site: str, outs: list[dict[str, Any]],
                      screen: bool) -> None:
    """The detection rate of one op, site and bit class (:func:`_rate_rows`), with its first judged miss."""
    judge = [o for o in outs if judged(o)]
    missed = [o for o in judge if not o["detected"]]
    benign = sum(not o["significant"] for o in outs)
    detail = (f"{len(judge)} judged, {len(outs) - benign} significant, {benign} benign "
              f"({sum(o['detected'] for o in outs if not o['significant'])} of them flagged); seed={ctx.seed}")
    why = OLD_RULE_WHY.get(op if op == "gemm_int8" else site)
    if why and op not in CONTRAST_OPS:
        detail = f"{why}; {detail}"
    if missed:
        m = missed[0]
        detail += f"; first miss: seed={m['seed']} shape={m['shape']} bits={m['bits']} delta={m['delta']:.3g}"
    _rate_rows(ctx, subject, outs, None if op in CONTRAST_OPS else DETECTION_TARGET, screen, detail)


def _accumulator(op: str, target: Any) -> str:
    """Which product a detection campaign's half-precision GEMM trials flipped and checked (for the detail)."""
    kind = op.removeprefix("gemm_").removesuffix("_rounded_check")
    dt = getattr(torch, kind, None) if op.startswith("gemm_") else None
    if dt not in HALF:
        return ""
    with target.active():
        how = half_kind(torch.zeros(1, 1, dtype=dt, device=target.device))
    return f"; accumulator: {describe_half(how, dt)}"
