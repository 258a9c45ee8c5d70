"""Cross-device correctness validator: the same benchmark on the target and on a reference device.

``run(target, level="quick", seed=0, groups=None, out_dir=None, benchmark=None,
reference_device=None, **options)`` returns the results rows (suite ``correctness``);
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

Options: ``workloads`` (names or a comma list; default all of :data:`mystique.workloads.WORKLOADS`),
``config`` (workload config instead of the level's ``debug``/``small``), ``worst``
(``op_error_vs_fp64`` rows per benchmark besides the failing ones; default 3 at quick, 5 at full),
``threads`` (CPU threads while the validator runs, default 1: the per-op comparison runs thousands
of small operators (and their fp64 recomputations) one at a time, where thread wake-ups dominate;
None keeps torch's setting, e.g. to qualify a CPU target's multi-threaded kernels).
``out_dir`` receives ``correctness_ops/<benchmark>.csv`` (one row per op: the comparison) and the
cached reference captures and plans (``reference_benchmarks/``).

Only the target's operators run inside ``target.active()``; the reference device, the fp64
golden and the sensitivity runs never do (see :mod:`.engine`). The group functions are in
:mod:`.checks`; a new group is one more ``run_<group>(ctx)`` there and one more entry of
:data:`RUNNERS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from mystique import workloads as wl
from mystique.errors import UsageError
from mystique.hostinfo import torch_threads
from mystique.progress import Progress
from mystique.results import Results, RunContext

from ..groups import run_groups, select_groups, select_workloads
from . import benchmarks as bm
from . import reference
from .checks import (
    OPS_CSV_COLUMNS,
    CorrectnessContext,
    ops_csv_text,
    run_operator_replay,
    run_repeatability,
    run_workload_output,
)

__all__ = ["GROUPS", "LEVEL_DEFAULTS", "OPS_CSV_COLUMNS", "RUNNERS", "CorrectnessContext", "groups", "ops_csv_text",
           "run"]

RUNNERS: dict[str, Callable[[CorrectnessContext], None]] = {
    "operator_replay": run_operator_replay, "workload_output": run_workload_output,
    "repeatability": run_repeatability,
}
GROUPS: tuple[str, ...] = tuple(RUNNERS)
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "quick": {"worst": 3, "threads": 1},
    "full": {"worst": 5, "threads": 1},
}
_OPTIONS = ("workloads", "config", "worst", "threads")


def groups(level: str = "quick") -> list[str]:
    """The check groups run at ``level`` (all three at both levels; ``full`` uses bigger workloads)."""
    _check_level(level)
    return list(GROUPS)


def _check_level(level: str) -> None:
    if level not in LEVEL_DEFAULTS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")


def run(target: Any, *, level: str = "quick", seed: int = 0, groups: Iterable[str] | None = None,
        out_dir: Any = None, benchmark: Any = None, reference_device: str | None = None, **options: Any):
    """Run the correctness checks on ``target``; return the results DataFrame (``mystique.results`` columns).

    ``benchmark``: a benchmark dir, ``benchmark.json``, trace dir or ET file to replay instead of
    the built-in reference benchmarks. ``reference_device``: where the reference runs (checked
    like ``--device``; None: the CPU, or no second device for an unmodified CPU target; the
    target's own device only with an inject or emulate, else a UsageError: :mod:`.reference`).
    ``groups``: None for all, else a non-empty selection; a group that raises
    becomes a ``group_error`` row (:mod:`mystique.validators.groups`). Raises UsageError for unknown
    groups, levels, options or workloads, and EnvironmentUnsupported when the reference device is
    absent.
    """
    _check_level(level)
    chosen = select_groups("correctness", groups, GROUPS, GROUPS)
    extra = [k for k in options if k not in _OPTIONS]
    if extra:
        raise UsageError(f"unknown correctness option(s) {', '.join(extra)}; known: {', '.join(_OPTIONS)}")
    ref = reference.choose(target, reference_device, chosen)
    defaults = LEVEL_DEFAULTS[level]
    names = select_workloads(options.get("workloads"))
    config = options.get("config") or bm.LEVELS[level]["config"]
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

        ctx = CorrectnessContext(target=target, res=res, seed=int(seed), level=level, progress=progress,
                                 options=options, out_dir=out_dir, reference_device=ref.device, benchmarks=benches,
                                 workloads=names, config=config, worst=worst, reference_label=ref.label)
        stack.enter_context(torch_threads(threads))
        run_groups(RUNNERS, ctx, chosen)
    return res.frame()
