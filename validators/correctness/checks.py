"""The check groups of the correctness validator, one function per group (``run_<group>(ctx)``).

Each adds its rows to ``ctx.res`` (:class:`CorrectnessContext`: a :class:`GroupContext` with the
reference device, the benchmarks to replay, the workloads and their config). A new check of an
existing group goes in its function; a new group is one more function here, listed in
:data:`validators.correctness.RUNNERS`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mystique.io import atomic_write_text, csv_text

from ..groups import GroupContext
from .engine import lockstep, replay_digests
from .workload import compare_workload, repeat_workload

MAX_FAILING_ROWS = 10
OPS_CSV_COLUMNS = ("index", "name", "op", "status", "kind", "dtype", "err_target", "err_reference", "bound",
                   "ratio", "k", "input_shapes", "output_shapes", "reason")


@dataclass
class CorrectnessContext(GroupContext):
    """One correctness run: the :class:`GroupContext` fields plus what the groups compare.

    ``benchmarks()`` returns the benchmarks to replay (captured on first use, then cached)."""

    reference_device: str | None = "cpu"  # None: no second device (:mod:`.reference`)
    benchmarks: Callable[[], list[Any]] = list
    workloads: tuple[str, ...] = ()
    config: str = "debug"
    worst: int = 3
    reference_label: str = ""  # how rows name the reference (:class:`.reference.Reference`)

    @property
    def reference_name(self) -> str:
        return self.reference_label or str(self.reference_device)


def _slug(subject: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", subject).strip("-") or "benchmark"


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"


def ops_csv_text(records: Iterable[Any]) -> str:
    """The per-op comparison table (columns :data:`OPS_CSV_COLUMNS`) as CSV text."""
    return csv_text(OPS_CSV_COLUMNS, (
        [r.index, r.name, r.qualified, r.status, r.kind, r.dtype, _fmt(r.err_target), _fmt(r.err_reference),
         _fmt(r.bound), _fmt(r.ratio), r.k, json.dumps(r.input_shapes, separators=(",", ":")),
         json.dumps(r.output_shapes, separators=(",", ":")),
         "; ".join(x for x in (r.reason, getattr(r, "excluded", "")) if x)] for r in records))


def run_operator_replay(ctx: CorrectnessContext) -> None:
    """Rows of every benchmark's op-by-op comparison (see :func:`_replay_rows`); without a second
    device one ``skip`` row (the comparison of a device with itself checks nothing)."""
    target, ref = ctx.target, ctx.reference_device
    if ref is None:
        ctx.res.add("first_divergent_op", "operator_replay", "op_index", None, status="skip",
                    detail=f"{ctx.reference_name}: the op-by-op comparison needs a reference on another device "
                           f"(validate correctness --reference-device), or --inject/--emulate to compare with this "
                           f"one without them; "
                           f"this device against fp64 goldens: workload_output here, numerics' op_sweep per op")
        return
    for bench in ctx.benchmarks():
        ctx.progress.note(f"operator replay {bench.subject} on {target.label} vs {ctx.reference_name}")
        records = lockstep(bench.plan, target, ref, ctx.seed, progress=ctx.progress)
        if ctx.out_dir is not None:
            folder = Path(ctx.out_dir) / "correctness_ops"
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(folder / f"{_slug(bench.subject)}.csv", ops_csv_text(records))
        _replay_rows(ctx.res, bench.subject, records, target, ctx.reference_name, ctx.seed, ctx.worst)


def _replay_rows(res: Any, subject: str, records: list[Any], target: Any, ref: str, seed: int, worst: int) -> None:
    compared = [r for r in records if r.status in ("pass", "fail")]
    failed = [r for r in compared if r.status == "fail"]
    errors = [r for r in records if r.status == "error"]
    skipped = [r for r in records if r.status == "skip"]
    noops = sum(r.status == "noop" for r in records)
    bitwise = sum(r.kind == "bitwise" for r in compared)
    who = f"target {target.label}, reference {ref}"
    if not compared:
        res.add("first_divergent_op", subject, "op_index", None, status="skip",
                detail=f"no operator could be compared ({len(skipped)} skipped, {len(errors)} raised on the "
                       f"target); {who}; seed {seed}")
    elif failed:
        first = failed[0]
        res.add("first_divergent_op", subject, "op_index", first.index, status="fail", dtype=first.dtype,
                detail=f"{first.describe()}; {len(failed)} of {len(compared)} compared ops diverge; {who}; "
                       f"seed {seed}")
    else:
        res.add("first_divergent_op", subject, "op_index", None, status="pass",
                detail=f"none of {len(compared)} compared ops diverges; {who}; seed {seed}")
    reasons: dict[str, int] = {}
    for r in skipped:
        reasons[r.reason.split(";")[0][:80]] = reasons.get(r.reason.split(";")[0][:80], 0) + 1
    skip_text = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    partial: dict[str, list[int]] = {}  # ops with outputs of backend-specific semantics (semantics.TABLE)
    for r in compared:
        if r.excluded:
            partial.setdefault(r.excluded.split(": ")[0], []).append(r.index)
    partial_text = "".join(f"; {what} (op {', '.join(map(str, idx[:8]))}{', ...' if len(idx) > 8 else ''})"
                           for what, idx in partial.items())
    res.add("ops_compared", subject, "ops", len(compared), status="info",
            detail=f"{len(compared)} of {len(records)} ops compared ({bitwise} bitwise equal to the reference)"
                   f"; {len(skipped)} skipped" + (f" ({skip_text})" if skip_text else "")
                   + f"; {noops} no-ops{partial_text}; seed {seed}")
    ratios = [r.ratio for r in compared if not math.isnan(r.ratio)]
    worst_ratio = max(ratios, default=math.nan)
    top = max(compared, key=lambda r: r.ratio if not math.isnan(r.ratio) else -1.0, default=None)
    res.add("max_error_ratio", subject, "error_ratio", worst_ratio, threshold=1.0,
            status="skip" if not ratios else ("pass" if worst_ratio <= 1.0 else "fail"),
            detail=("no op compared" if top is None or not ratios else
                    f"every compared op is bitwise equal to the reference; seed {seed}" if worst_ratio == 0 else
                    f"largest target error / bound over the compared ops: {top.describe()}; seed {seed}"))
    # zero ops run is no evidence that the target runs them: a skip (issue 30.7), as first_divergent_op
    res.add("target_op_errors", subject, "ops", len(errors), threshold=0,
            status="fail" if errors else "pass" if compared else "skip",
            detail=(f"{errors[0].describe()}; {len(errors)} op(s) raised on {target.label}; seed {seed}"
                    if errors else f"every compared op ran on {target.label}" if compared else
                    f"no operator ran on {target.label} to be compared ({len(skipped)} skipped); seed {seed}"))
    rows = failed[:MAX_FAILING_ROWS]
    chosen = {r.index for r in rows}
    passing = sorted((r for r in compared if r.status == "pass" and r.index not in chosen),
                     key=lambda r: (r.ratio if not math.isnan(r.ratio) else -1.0,
                                    r.err_reference if not math.isnan(r.err_reference) else -1.0), reverse=True)
    rows += passing[:worst]
    for r in sorted(rows, key=lambda r: r.index):
        res.add("op_error_vs_fp64", f"{r.index}:{r.name}", "error_vs_fp64", r.err_target, threshold=r.bound,
                dtype=r.dtype, status=r.status,
                detail=f"{subject}: {r.describe()}; ratio {r.ratio:.3g}; seed {seed}")
    by_kind: dict[tuple[str, str], list[int]] = {}
    for r in skipped:
        if r.reason in ("random op", "undefined memory") or r.reason.startswith(("raised", "fed synthetic")):
            by_kind.setdefault((r.name, r.reason.split(":")[0].split(";")[0]), []).append(r.index)
        else:
            by_kind.setdefault((r.name, r.reason[:120]), []).append(r.index)
    for (name, why), idx in sorted(by_kind.items()):
        shown = ", ".join(map(str, idx[:8])) + (", ..." if len(idx) > 8 else "")
        res.add("op_skipped", name, "ops", len(idx), status="skip",
                detail=f"{subject}: {why} (op {shown}); not compared")


def run_workload_output(ctx: CorrectnessContext) -> None:
    """Row ``workload_output_error`` per workload: its forward on the target vs the reference vs fp64."""
    res, target, seed, ref = ctx.res, ctx.target, ctx.seed, ctx.reference_name
    for name in ctx.workloads:
        ctx.progress.note(f"workload output {name} ({ctx.config}) on {target.label} vs {ref}")
        o = compare_workload(name, ctx.config, target, ctx.reference_device, seed)
        ok = o.err_target <= o.bound
        against = (f"{o.err_reference:.3g} on {ref}" + (" (bitwise equal)" if o.bitwise else "")
                   + "; bound max(2 x reference, floor)" if ctx.reference_device is not None else
                   f"{ref}: judged against the fp64 golden alone; bound floor(float32, K, s)")
        res.add("workload_output_error", f"{name}/{ctx.config}", "error_vs_fp64", o.err_target,
                threshold=o.bound, dtype="float32", status="pass" if ok else "fail",
                detail=f"forward output {o.output_shape}: error vs fp64 {o.err_target:.3g} on {target.label}, "
                       f"{against} with sensitivity {o.sensitivity:.3g}, K={o.k}; seed {seed}")


def run_repeatability(ctx: CorrectnessContext) -> None:
    """Rows ``replay_repeatability`` per benchmark and ``workload_repeatability`` per workload."""
    res, target, seed = ctx.res, ctx.target, ctx.seed
    for bench in ctx.benchmarks():
        ctx.progress.note(f"repeatability {bench.subject} on {target.label}")
        first = replay_digests(bench.plan, target, seed)
        second = replay_digests(bench.plan, target, seed)
        differing = [(a, b) for a, b in zip(first, second)
                     if a.digests is not None and b.digests is not None and a.digests != b.digests]
        compared = sum(a.digests is not None and b.digests is not None for a, b in zip(first, second))
        if not compared:
            res.add("replay_repeatability", bench.subject, "ops_differing", None, status="skip",
                    detail=f"no op ran twice on {target.label}; seed {seed}")
            continue
        if differing:
            a, b = differing[0]
            outs = [j for j, (x, y) in enumerate(zip(a.digests, b.digests)) if x != y]
            shapes = ",".join(str(s).replace(" ", "") for s in a.input_shapes)
            detail = (f"op {a.index} {a.name} ({a.qualified}) inputs [{shapes}]: output(s) {outs} differ between "
                      f"two replays on {target.label}; {len(differing)} of {compared} ops differ; seed {seed}")
        else:
            detail = f"{compared} ops bit-identical in two replays on {target.label}; seed {seed}"
        res.add("replay_repeatability", bench.subject, "ops_differing", len(differing), threshold=0,
                status="fail" if differing else "pass", detail=detail)
    for name in ctx.workloads:
        ctx.progress.note(f"repeatability of {name} ({ctx.config}) forward on {target.label}")
        same, shape = repeat_workload(name, ctx.config, target, seed)
        res.add("workload_repeatability", f"{name}/{ctx.config}", "bitwise_equal", float(same),
                threshold=1, dtype="float32", status="pass" if same else "fail",
                detail=f"two forwards on {target.label} from the same weights and batch (output {shape}) "
                       + ("are bit-identical" if same else "differ") + f"; seed {seed}")
