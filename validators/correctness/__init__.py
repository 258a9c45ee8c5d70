"""Cross-device correctness validator: the same benchmark on the target and on a reference device.

``run(target, level="quick", seed=0, groups=None, out_dir=None, benchmark=None,
reference_device="cpu", **options)`` returns the results rows (suite ``correctness``);
``groups(level)`` names the check groups, each runnable alone:

* ``operator_replay``: every operator of each benchmark (a given benchmark, else the built-in
  reference benchmarks of :mod:`.benchmarks`) runs on the target and on the reference device
  with identical synthetic inputs, and in fp64 on the CPU; each output is judged by
  :func:`.tolerance.judge` (bitwise equal to the reference, or an error vs fp64 within
  ``max(2 * reference error, floor(dtype, K, sensitivity))``). Auxiliary outputs whose contents
  are backend-specific (``embedding_bag``'s ``offset2bag``, saved batch statistics, attention
  log-sum-exps, ...) are excluded or compared as :data:`.semantics.TABLE` says, and the op's rows
  name them. Every op is fed the reference device's results of the ops before it, so a divergence
  cannot cascade and the first failing op is the first divergent op (rows ``first_divergent_op``,
  ``max_error_ratio``, ``target_op_errors``, ``op_error_vs_fp64`` for the worst ops; ``ops_compared``,
  a measurement (status ``info``); ``op_skipped`` per skip reason).
* ``workload_output``: each reference workload's forward from the same weights and batch on the
  target vs the reference device vs fp64 (:mod:`.workload`; row ``workload_output_error``).
* ``repeatability``: each benchmark replayed twice on the target alone and each workload's
  forward run twice: results must be bit-identical (rows ``replay_repeatability`` naming the first
  differing op, ``workload_repeatability``).

Options: ``workloads`` (names or a comma list; default llama, dlrm, bert), ``config`` (workload
config instead of the level's ``debug``/``small``), ``worst`` (``op_error_vs_fp64`` rows per
benchmark besides the failing ones; default 3 at quick, 5 at full), ``threads`` (CPU threads
while the validator runs, default 1: the per-op comparison runs thousands of small operators
(and their fp64 recomputations) one at a time, where thread wake-ups dominate, on a busy 2-core
host by 10-50x; None keeps torch's setting, e.g. to qualify a CPU target's multi-threaded kernels).
``out_dir`` receives ``correctness_ops/<benchmark>.csv`` (one row per op: the comparison) and the
cached reference captures and plans (``reference_benchmarks/``).

Only the target's operators run inside ``target.active()``; the reference device, the fp64
golden and the sensitivity runs never do (see :mod:`.engine`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

GROUPS: tuple[str, ...] = ("operator_replay", "workload_output", "repeatability")
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "quick": {"worst": 3, "threads": 1},
    "full": {"worst": 5, "threads": 1},
}
MAX_FAILING_ROWS = 10
OPS_CSV_COLUMNS = ("index", "name", "op", "status", "kind", "dtype", "err_target", "err_reference", "bound",
                   "ratio", "k", "input_shapes", "output_shapes", "reason")
_OPTIONS = ("workloads", "config", "worst", "threads")


def groups(level: str = "quick") -> list[str]:
    """The check groups run at ``level`` (all three at both levels; ``full`` uses bigger workloads)."""
    _check_level(level)
    return list(GROUPS)


def _check_level(level: str) -> None:
    from mystique.errors import UsageError

    if level not in LEVEL_DEFAULTS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")


def _workload_names(value: Any) -> tuple[str, ...]:
    from mystique.errors import UsageError

    from .benchmarks import WORKLOADS

    if value is None:
        return WORKLOADS
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if str(v).strip()]
    bad = [n for n in names if n not in WORKLOADS]
    if bad or not names:
        raise UsageError(f"unknown workload(s) {', '.join(bad) or '(none given)'}; expected some of "
                         f"{', '.join(WORKLOADS)}")
    return tuple(dict.fromkeys(names))


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    import torch

    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _slug(subject: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", subject).strip("-") or "benchmark"


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"


def ops_csv_text(records: Iterable[Any]) -> str:
    """The per-op comparison table (columns :data:`OPS_CSV_COLUMNS`) as CSV text."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OPS_CSV_COLUMNS)
    for r in records:
        w.writerow([r.index, r.name, r.qualified, r.status, r.kind, r.dtype, _fmt(r.err_target),
                    _fmt(r.err_reference), _fmt(r.bound), _fmt(r.ratio), r.k,
                    json.dumps(r.input_shapes, separators=(",", ":")),
                    json.dumps(r.output_shapes, separators=(",", ":")),
                    "; ".join(x for x in (r.reason, getattr(r, "excluded", "")) if x)])
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------
# groups


def _operator_replay(ctx: dict[str, Any]) -> None:
    from . import engine

    res, target, seed = ctx["res"], ctx["target"], ctx["seed"]
    ref = ctx["reference_device"]
    for bench in ctx["benchmarks"]():
        ctx["progress"].note(f"operator replay {bench.subject} on {target.label} vs {ref}")
        records = engine.lockstep(bench.plan, target, ref, seed, progress=ctx["progress"])
        if ctx["out_dir"] is not None:
            from mystique.io import atomic_write_text

            folder = Path(ctx["out_dir"]) / "correctness_ops"
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(folder / f"{_slug(bench.subject)}.csv", ops_csv_text(records))
        _replay_rows(res, bench.subject, records, target, ref, seed, ctx["worst"])


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
    res.add("target_op_errors", subject, "ops", len(errors), threshold=0, status="fail" if errors else "pass",
            detail=(f"{errors[0].describe()}; {len(errors)} op(s) raised on {target.label}; seed {seed}"
                    if errors else f"every compared op ran on {target.label}"))
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


def _workload_output(ctx: dict[str, Any]) -> None:
    from .workload import compare_workload

    res, target, seed, ref = ctx["res"], ctx["target"], ctx["seed"], ctx["reference_device"]
    for name in ctx["workloads"]:
        ctx["progress"].note(f"workload output {name} ({ctx['config']}) on {target.label} vs {ref}")
        o = compare_workload(name, ctx["config"], target, ref, seed)
        ok = o.err_target <= o.bound
        res.add("workload_output_error", f"{name}/{ctx['config']}", "error_vs_fp64", o.err_target,
                threshold=o.bound, dtype="float32", status="pass" if ok else "fail",
                detail=f"forward output {o.output_shape}: error vs fp64 {o.err_target:.3g} on {target.label}, "
                       f"{o.err_reference:.3g} on {ref}"
                       + (" (bitwise equal)" if o.bitwise else "")
                       + f"; bound max(2 x reference, floor) with sensitivity {o.sensitivity:.3g}, K={o.k}; "
                         f"seed {seed}")


def _repeatability(ctx: dict[str, Any]) -> None:
    from . import engine
    from .workload import repeat_workload

    res, target, seed = ctx["res"], ctx["target"], ctx["seed"]
    for bench in ctx["benchmarks"]():
        ctx["progress"].note(f"repeatability {bench.subject} on {target.label}")
        first = engine.replay_digests(bench.plan, target, seed)
        second = engine.replay_digests(bench.plan, target, seed)
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
    for name in ctx["workloads"]:
        ctx["progress"].note(f"repeatability of {name} ({ctx['config']}) forward on {target.label}")
        same, shape = repeat_workload(name, ctx["config"], target, seed)
        res.add("workload_repeatability", f"{name}/{ctx['config']}", "bitwise_equal", float(same),
                threshold=1, dtype="float32", status="pass" if same else "fail",
                detail=f"two forwards on {target.label} from the same weights and batch (output {shape}) "
                       + ("are bit-identical" if same else "differ") + f"; seed {seed}")


_RUNNERS = {"operator_replay": _operator_replay, "workload_output": _workload_output,
            "repeatability": _repeatability}


def run(target: Any, *, level: str = "quick", seed: int = 0, groups: Iterable[str] | None = None,
        out_dir: Any = None, benchmark: Any = None, reference_device: str = "cpu", **options: Any):
    """Run the correctness checks on ``target``; return the results DataFrame (``mystique.results`` columns).

    ``benchmark``: a benchmark dir, ``benchmark.json``, trace dir or ET file to replay instead of
    the built-in reference benchmarks. ``reference_device``: where the reference runs (checked
    like ``--device``). Raises UsageError for unknown groups, levels, options or workloads, and
    EnvironmentUnsupported when the reference device is absent.
    """
    from mystique.errors import UsageError
    from mystique.progress import Progress
    from mystique.results import Results, RunContext
    from mystique.targets import check_device

    from . import benchmarks as bm

    _check_level(level)
    chosen = list(GROUPS) if groups is None else list(groups)
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown:
        raise UsageError(f"unknown correctness group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    extra = [k for k in options if k not in _OPTIONS]
    if extra:
        raise UsageError(f"unknown correctness option(s) {', '.join(extra)}; known: {', '.join(_OPTIONS)}")
    ref = check_device(str(reference_device or "cpu"))
    defaults = LEVEL_DEFAULTS[level]
    names = _workload_names(options.get("workloads"))
    config = options.get("config") or bm.LEVELS[level]["config"]
    from mystique import workloads as wl

    for n in names:
        if config not in wl.get(n).CONFIGS:
            raise UsageError(f"unknown config {config!r} for workload {n}; known: {', '.join(wl.get(n).CONFIGS)}")
    worst = int(options.get("worst") if options.get("worst") is not None else defaults["worst"])
    threads = options.get("threads", defaults["threads"])
    user_bench = bm.load(benchmark) if benchmark is not None else None
    res = Results(RunContext.for_target(target), "correctness")
    progress = Progress("correctness", total=len(chosen))
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(bm.cache_root(out_dir))
        cache: list[Any] = []

        def benches() -> list[Any]:
            if not cache:
                cache.extend([user_bench] if user_bench is not None else
                             bm.references(level, root, names, options.get("config"), progress))
            return cache

        ctx = {"res": res, "target": target, "seed": int(seed), "reference_device": ref, "level": level,
               "out_dir": out_dir, "benchmarks": benches, "workloads": names, "config": config, "worst": worst,
               "progress": progress}
        stack.enter_context(_threads(threads))
        for name in chosen:
            progress.step(f"group {name}")
            _RUNNERS[name](ctx)
    return res.frame()
