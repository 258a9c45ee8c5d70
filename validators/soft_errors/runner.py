"""The soft-error validator: ``run(target, level=..., groups=...)`` -> results rows (suite ``soft_errors``).

Groups (``groups(level)``):

* ``abft_gemm``          checked GEMM per dtype and checked Linear layers of a workload: clean run passes,
                         an injected accumulator/operand/output flip is detected and located; bf16/fp16 on the
                         device's own half-precision GEMM (its fp32 output where the backend has one, else its
                         rounded output with the rounding in the threshold), int8 on its int8 GEMM;
* ``abft_embedding_bag`` checked EmbeddingBag (fp32 sum/mean, 8-bit row-wise sum/mean): same;
* ``false_positives``    clean checked operations (random shapes, scales, distributions, dtypes) and
                         protected workload forwards: alarms must be zero; rate with Wilson interval;
* ``detection_campaign`` injected flips per op, site, bit class and pattern: detection rate of the
                         flips sure to alarm by the check's bound (else of significant flips; Wilson
                         interval, trials), the significant flips' rate a measurement beside it;
* ``pvf``                Parameter Vulnerability Factor per parameter group of DLRM, BERT, Llama (measurements:
                         status ``info``);
* ``sdc_screen``         repeat-and-compare screening with fp64 goldens;
* ``overhead``           checked / unchecked time - 1 of the product's checked paths (fp32 GEMM, Linear and
                         protected Linear: target 5% at n >= 1024; EmbeddingBag fp32 / 8-bit / protected:
                         target 10%), with an A/A row giving the resolution and ``abft_floor`` rows; the
                         95% interval of the median paired ratio decides: pass inside the target, fail
                         above it, inconclusive across it (see :mod:`.overhead`).

Rows without a verdict (rates without a target, interval bounds, trial counts, PVFs, times and
overheads without a target) are measurements, status ``info``.

Every operator of the device under test runs inside ``target.active()``; goldens outside it. Each group
lives in its module of :mod:`.checks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from mystique import workloads
from mystique.errors import UsageError
from mystique.hostinfo import torch_threads
from mystique.progress import Progress
from mystique.results import Results, RunContext

from ..groups import GroupContext, run_groups, select_groups, select_workloads
from .checks import RUNNERS

GROUPS = tuple(RUNNERS)

# groups of many tiny operators: single-threaded on the CPU, where thread wake-ups would dominate
_SMALL_OP_GROUPS = ("abft_gemm", "abft_embedding_bag", "abft_fbgemm", "false_positives", "detection_campaign", "pvf")

LEVELS: dict[str, dict[str, Any]] = {
    "quick": {"trials": 900, "fp_trials": 2000, "pvf_trials": 24, "pvf_config": "debug", "sdc_runs": 4,
              "overhead_sizes": (1024, 2048), "overhead_reps": 31, "overhead_threads": 1,
              "overhead_tables": ((100_000, 64, 2048, 40), (100_000, 128, 2048, 40)),
              "workloads": workloads.WORKLOADS},
    "full": {"trials": 30000, "fp_trials": 30000, "pvf_trials": 200, "pvf_config": "small", "sdc_runs": 20,
             "overhead_sizes": (1024, 2048), "overhead_reps": 41, "overhead_threads": 1,
             "overhead_tables": ((100_000, 16, 2048, 40), (100_000, 64, 2048, 40), (100_000, 128, 2048, 40),
                                 (1_000_000, 64, 2048, 20), (100_000, 256, 512, 100)),
             "workloads": workloads.WORKLOADS},
}


_TIMED_GROUPS = ("overhead", "overhead_fbgemm")  # run at full or when named


def groups(level: str = "quick") -> list[str]:
    """Names of the check groups run at ``level``.

    ``overhead`` (a property of the checker, timed, so sensitive to a busy host) runs at ``full`` or
    when named; ``quick`` runs the others, sized small.
    """
    return _level_groups(level)


def _level_groups(level: str) -> list[str]:
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    return [g for g in GROUPS if level == "full" or g not in _TIMED_GROUPS]


def run(target: Any, *, level: str = "quick", seed: int = 0, groups: list[str] | tuple[str, ...] | None = None,
        out_dir: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """Run the soft-error checks on ``target``; returns the results table (``mystique.results`` columns).

    ``options`` override the level's sizes: ``trials`` (detection campaign), ``fp_trials`` (clean
    checked ops), ``pvf_trials`` (per parameter group), ``pvf_config``, ``workloads``, ``sdc_runs``,
    ``overhead_sizes``, ``overhead_reps``, ``overhead_threads`` (CPU intra-op threads of the timing, 0 for
    torch's setting), ``overhead_tables`` ((rows, dim, bags, bag length) per EmbeddingBag shape), ``ops``
    (detection ops), ``checkpoint`` (folder of the campaign checkpoints; default ``out_dir``). Campaign
    checkpoints are JSONL files in that folder, one per campaign, keyed on everything that changes an
    outcome (:func:`.checks.common.campaign_key`; torch and mystique versions): a rerun with the same settings resumes, one with other settings (another device model,
    fault, emulation, seed, level or trial count) raises :class:`UsageError` naming what differs.
    ``groups``: None for the level's groups, else a non-empty selection; a group that raises becomes a
    ``group_error`` row (:mod:`mystique.validators.groups`).
    """
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    chosen = select_groups("soft-error", groups, GROUPS, _level_groups(level))
    opts = {**LEVELS[level], "level": level}
    bad = [k for k in options if k not in (*LEVELS[level], "ops", "checkpoint", "workload_seeds", "sdc_kernels")]
    if bad:
        raise UsageError(f"unknown soft-error option(s) {', '.join(bad)}")
    opts.update({k: v for k, v in options.items() if v is not None})
    opts["workloads"] = select_workloads(opts["workloads"])
    if opts.get("checkpoint") is None and out_dir is not None:
        opts["checkpoint"] = out_dir
    if opts.get("checkpoint") is not None:
        Path(opts["checkpoint"]).mkdir(parents=True, exist_ok=True)
    res = Results(RunContext.for_target(target), "soft_errors")
    prog = Progress("soft_errors", total=len(chosen))
    ctx = GroupContext(target, res, seed, level, prog, opts, Path(out_dir) if out_dir is not None else None)

    def threads(name: str) -> Any:
        return torch_threads(1 if name in _SMALL_OP_GROUPS else None, target.device)

    run_groups(RUNNERS, ctx, chosen, scope=threads)
    return res.frame()
