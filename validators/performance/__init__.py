"""Performance qualification: is this device as fast as its peers, and does it stay fast?

``run(target, *, level="quick", seed=0, groups=None, out_dir=None, baseline=(), **options)``
returns the results rows (suite ``performance``); ``groups(level)`` names the check groups:

* ``micro`` (:mod:`.micro`): GEMM throughput per dtype the device runs (fp32, TF32, bf16, fp16,
  fp8 where available), memory bandwidth (copy, triad), host<->device transfers (pinned,
  pageable) on accelerators; each a measured figure with its 95% interval and, where
  :mod:`.nominal` knows the device, its fraction of the datasheet peak.
* ``sustained`` (:mod:`.sustained`): the reference workloads' generated benchmarks replayed for
  ``duration`` seconds: step-time distribution, CV, drift first vs last third, clock evidence
  (:mod:`.clocks`: NVML on NVIDIA GPUs, CPU frequency on CPUs); with a mode injected, the mode's
  cost paired against the same device without it (:mod:`.paired`).
* ``mode`` (:mod:`.mode`, qualification's item, ``--group mode``): with a mode injected, its paired
  rows for a few seconds on one workload; without one, a skip and the step time.
* ``fleet`` (:mod:`.compare`, :mod:`.fleet`): every figure against ``baseline`` peers of the same
  device model by robust statistics; fails a device slower than the fleet beyond the margin with
  confidence.

Options: ``baseline`` (results.csv files or folders of peers), ``duration`` (seconds of sustained
load in all, default 60 at quick and 600 at full), ``workloads`` (names or a comma list; default all
of :data:`mystique.workloads.WORKLOADS`), ``margin`` (fleet margin, default 0.05), ``threads`` (CPU
threads, default: the CPUs this process may use), ``paired`` (default True: with a mode injected,
pair it against the device without it), ``shapes_from`` (captures or benchmarks whose GEMMs' own shapes
the micro group measures as ``gemm_shape`` rows, :mod:`.shapes`). ``out_dir`` receives ``step_times.csv`` (every step: its
seconds, the seconds this process's threads waited for a CPU during it, and whether that left it
undisturbed (:mod:`.timed`); the fleet summary's per-step distribution) and the reference
benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from mystique.errors import UsageError
from mystique.hostinfo import torch_threads
from mystique.io import write_csv as write_table
from mystique.progress import Progress
from mystique.results import Results, RunContext

from ..groups import run_groups, select_groups, select_workloads
from ._ctx import Measured, PerformanceContext
from .compare import run_fleet
from .fleet import results_paths
from .micro import run_micro
from .mode import run_mode
from .sustained import run_sustained

__all__ = ["GROUPS", "LEVELS", "RUNNERS", "Measured", "PerformanceContext", "groups", "qualification_groups", "run"]

RUNNERS: dict[str, Callable[[PerformanceContext], None]] = {
    "micro": run_micro, "sustained": run_sustained, "fleet": run_fleet, "mode": run_mode,
}
GROUPS: tuple[str, ...] = tuple(RUNNERS)
#: what ``mystique validate performance`` runs by default (``mode`` by ``--group mode``: sustained pairs too)
DEFAULT_GROUPS: tuple[str, ...] = ("micro", "sustained", "fleet")
#: the qualification's performance item at every level (:mod:`.mode`: a few seconds)
QUALIFICATION_GROUPS: tuple[str, ...] = ("mode",)
_COMMON = {"min_reps": 7, "drift_tolerance": 0.10, "mode_margin": 0.05, "paired_share": 0.5, "warmup_steps": 3,
           "gemm_n_cpu": 1024, "gemm_n_cuda": 8192, "mem_bytes_cpu": 64 << 20, "mem_bytes_cuda": 1 << 30,
           "transfer_bytes": 256 << 20, "mode_budget_s": 6.0,
           # gemm_curve sizes (micro.run_gemm_curve): the equivalent cube sizes (F/2)^(1/3) of the small reference
           # captures' GEMMs span 100-1024 (2 MFLOP to 2.1 GFLOP)
           "gemm_sizes_cpu": (64, 128, 256, 512, 1024), "gemm_sizes_cuda": (256, 512, 1024, 2048, 4096, 8192),
           # attention_curve sequence lengths (B, H, D = 1, 8, 64): the reference captures' attention is 33 MFLOP
           # (llama small: B 8, H 8, L 128, D 32), L = 128 here
           "sdpa_lengths_cpu": (128, 256, 512), "sdpa_lengths_cuda": (512, 1024, 2048, 4096),
           # --shapes-from (shapes.run_gemm_shapes): at most this many distinct shapes (the 8 reference captures hold
           # 61), operands of at most this many bytes, and this many seconds in all
           "shape_max": 128, "shape_max_bytes_cpu": 2 << 30, "shape_max_bytes_cuda": 16 << 30, "shape_budget_s": 600.0}
LEVELS: dict[str, dict[str, Any]] = {
    "quick": {**_COMMON, "duration": 60.0, "config": "small", "mode": "infer", "micro_budget_s": 1.0},
    "full": {**_COMMON, "duration": 600.0, "config": "small", "mode": "train", "micro_budget_s": 5.0,
             "gemm_n_cpu": 2048, "min_reps": 20},
}
_OPTIONS = ("baseline", "duration", "workloads", "margin", "threads", "paired", "shapes_from")


def groups(level: str = "quick") -> list[str]:
    """The check groups ``mystique validate performance`` runs at ``level`` (micro, sustained and fleet at
    both levels; ``full`` runs longer)."""
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    return list(DEFAULT_GROUPS)


def qualification_groups(level: str = "quick") -> list[str]:
    """The groups qualification (the pytest plugin) runs at ``level``: the ``mode`` item, a few seconds
    (:mod:`.mode`); the sustained and fleet verdicts take minutes and peers: ``validate performance``."""
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    return list(QUALIFICATION_GROUPS)


def _settings(level: str, options: dict[str, Any]) -> dict[str, Any]:
    s = dict(LEVELS[level])
    if options.get("duration") is not None:
        s["duration"] = float(options["duration"])
        if not s["duration"] > 0:
            raise UsageError(f"duration {options['duration']} must be positive (seconds)")
    if options.get("margin") is not None and not 0 <= float(options["margin"]) < 1:
        raise UsageError(f"margin {options['margin']} must be within 0..1")
    s["workloads"] = select_workloads(options.get("workloads"))
    s["paired"] = bool(options.get("paired", True))
    if options.get("shapes_from"):  # read (and refused) before anything is measured
        from .shapes import read_shapes

        s["gemm_shapes"] = read_shapes([options["shapes_from"]] if isinstance(options["shapes_from"], str)
                                       else list(options["shapes_from"]))
    return s


def run(target: Any, *, level: str = "quick", seed: int = 0, groups: Iterable[str] | None = None,
        out_dir: Any = None, baseline: Any = (), **options: Any):
    """Run the performance checks on ``target``; return the results DataFrame (suite ``performance``).

    ``groups``: None for all, else a non-empty selection; a group that raises becomes a
    ``group_error`` row (:mod:`mystique.validators.groups`). Raises UsageError for unknown levels,
    groups, options or workloads and unreadable baselines.
    """
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    chosen = select_groups("performance", groups, GROUPS, DEFAULT_GROUPS)
    bad = [x for x in options if x not in _OPTIONS]
    if bad:
        raise UsageError(f"unknown performance option(s) {', '.join(bad)}; known: {', '.join(_OPTIONS)}")
    settings = _settings(level, options)
    if baseline:
        results_paths([baseline] if isinstance(baseline, str) else list(baseline))  # bad paths: before any work
    ctx_run = RunContext.for_target(target)
    res = Results(ctx_run, "performance")
    progress = Progress("performance", total=len(chosen))
    ctx = PerformanceContext(target=target, res=res, seed=int(seed), level=level, progress=progress,
                             options={**options, "baseline": baseline}, out_dir=out_dir, settings=settings,
                             device_name=ctx_run.device_name)
    threads = options.get("threads") or len(os.sched_getaffinity(0))
    with torch_threads(threads):
        run_groups(RUNNERS, ctx, chosen)
    if out_dir is not None and ctx.step_times:
        os.makedirs(out_dir, exist_ok=True)
        write_table(os.path.join(out_dir, "step_times.csv"), ("subject", "step", "seconds", "waited_s", "undisturbed"),
                    [(s, i, t, w, int(ok)) for s, c in ctx.step_times.items()
                     for i, (t, w, ok) in enumerate(zip(c.seconds, c.waited, c.flags))])
    return res.frame()

