"""``mystique replay``: run a benchmark (or a trace) and measure how close the replay is.

Writes ``OUT_DIR/ops.csv``, ``OUT_DIR/summary.json`` (keys and types as docs/design.md defines, and
the timing statistics beside them; :mod:`.summary`) and ``OUT_DIR/results.csv`` (suite ``replay``;
:mod:`.result_rows`). Where the captured step can be rebuilt here, the replay is timed side by side
with it (paired ABBA rounds, see :mod:`mystique.replay.fidelity`); otherwise against what the trace
recorded, labelled as such.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..capture import is_step_target
from ..errors import EnvironmentUnsupported, UsageError
from ..io import atomic_write_text, check_output_dir, show, staged_output_dir
from ..placement import Placed, check_policy, parse_policy, placed
from ..progress import Progress
from ..results import write_csv
from ..targets import make_target
from ..timing import Paired, loadavg
from .boundness import Bound, measure_bound
from .fidelity import (
    PACINGS,
    TIMINGS,
    busy_host_threads,
    device_sync,
    gpu_clocks,
    measure_paired,
    op_errors,
    original_step,
    rebuild_original,
    timing_stats,
)
from .plan import Plan, plan_from_path
from .result_rows import reproduce_command, results
from .runtime import (
    CollectiveHandler,
    Executor,
    InsufficientMemory,
    ReplayError,
    replay_threads,
    steady_host_allocator,
)
from .summary import ops_csv_text, summarize

DEFAULT_HALF_WIDTH = 0.025
DEFAULT_TIME_CAP_S = 60.0
__all__ = ["DEFAULT_HALF_WIDTH", "DEFAULT_TIME_CAP_S", "make_executor", "replay", "subject_of"]


def make_executor(plan: Plan, device: str, seed: int = 0, pacing: str = "none", allow_ops: Sequence[str] = (),
                  collective_handler: CollectiveHandler | None = None) -> Executor:
    """An executor for ``plan`` on ``device`` with ``pacing`` (``none`` | ``recorded``), memory checked
    (EnvironmentUnsupported when the device cannot hold the plan's tensors); ``allow_ops``: patterns of
    operators outside ``runtime.ALLOWED_OP_NAMESPACES`` it may call (``--allow-ops``);
    ``collective_handler``: what runs the plan's collectives (a multi-rank replay), see :class:`Executor`."""
    try:
        e = Executor(plan.data, device, seed=seed, pacing=pacing, allow_ops=allow_ops,
                     collective_handler=collective_handler)
        e.prepare()
    except (InsufficientMemory, MemoryError, torch.OutOfMemoryError) as exc:
        raise EnvironmentUnsupported(str(exc) or "out of memory") from exc
    except ReplayError as exc:
        raise UsageError(str(exc)) from exc
    except RuntimeError as exc:
        if "alloc_cpu" in str(exc) or ("alloc" in str(exc).lower() and "memory" in str(exc).lower()):
            raise EnvironmentUnsupported(f"the plan's tensors do not fit on {device}: {str(exc).splitlines()[0]}") from exc
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UsageError(f"malformed benchmark plan: {type(exc).__name__}: {exc}") from exc
    return e


@dataclass
class _Options:
    """How one replay runs (the keyword arguments of :func:`replay`)."""

    iters: int
    warmup: int
    force: bool
    op_iters: int | None
    seed: int
    timing: str
    half_width: float
    time_cap: float
    pacing: str
    threads: int | None
    allow_ops: Sequence[str]
    collective_handler: CollectiveHandler | None
    original: str | None = None  # --original: the user's package.module:function step to pair with
    cpu_affinity: str = "none"  # --cpu-affinity: none | auto | a CPU list (mystique.placement)

    def check(self) -> None:
        if self.iters < 1 or self.warmup < 0:
            raise UsageError("--iters must be at least 1 and --warmup at least 0")
        if self.threads is not None and self.threads < 0:
            raise UsageError("--threads must be at least 0")
        if self.timing not in TIMINGS:
            raise UsageError(f"unknown timing {self.timing!r}; expected one of {', '.join(TIMINGS)}")
        if self.pacing not in PACINGS:
            raise UsageError(f"unknown pacing {self.pacing!r}; expected one of {', '.join(PACINGS)}")
        if not (self.half_width > 0 and self.time_cap > 0):
            raise UsageError("--half-width and --time-cap must be positive")
        if self.original is not None and not is_step_target(self.original):
            raise UsageError(f"--original {show(self.original)}: expected package.module:function or a built-in workload")
        check_policy(self.cpu_affinity)

    def reproduce(self, source: Any, device: str) -> str:
        """The command line that reruns this replay."""
        return reproduce_command(
            source, device, self.seed, iters=self.iters, warmup=self.warmup,
            timing=self.timing if self.timing != "auto" else None,
            pacing=self.pacing if self.pacing != "none" else None, threads=self.threads,
            half_width=self.half_width if self.half_width != DEFAULT_HALF_WIDTH else None,
            time_cap=self.time_cap if self.time_cap != DEFAULT_TIME_CAP_S else None, allow_ops=list(self.allow_ops),
            original=self.original, cpu_affinity=self.cpu_affinity if self.cpu_affinity != "none" else None)


def replay(source: str | os.PathLike, out_dir: str | os.PathLike, *, device: str = "cpu", iters: int = 10,
           warmup: int = 3, iteration: int | None = None, force: bool = False, op_iters: int | None = None,
           seed: int = 0, threads: int | None = None, timing: str = "auto", half_width: float = DEFAULT_HALF_WIDTH,
           time_cap: float = DEFAULT_TIME_CAP_S, pacing: str = "none", allow_ops: Sequence[str] = (),
           collective_handler: CollectiveHandler | None = None, original: str | None = None,
           cpu_affinity: str = "none") -> tuple[dict[str, Any], Any]:
    """Replay a benchmark dir / ``benchmark.json`` / trace dir / ET file on ``device``.

    Runs one untimed probe iteration, then times the replay:

    - ``timing="auto"`` (default) or ``"paired"``: where the captured step can be rebuilt here
      (:func:`fidelity.rebuild_original`), the replay and the original alternate in paired ABBA
      rounds after a warm-up until stable (at least ``warmup`` rounds), at least ``iters`` rounds,
      until the 95% interval of the median ratio has a relative half-width of at most
      ``half_width`` or ``time_cap`` seconds are spent. ``"paired"`` fails (UsageError) where that
      is impossible; ``"auto"`` then falls back to recorded timing and says why.
    - ``timing="recorded"``: ``warmup`` untimed iterations, ``iters`` whole iterations timed with one
      synchronisation each, compared with the recorded original (a measurement, no verdict).

    Then ``op_iters`` (default ``min(iters, 3)``) per-op timed passes for ops.csv. On the CPU both
    sides run with the captured step's thread count (``threads``: see
    :func:`runtime.replay_threads`; torch's setting is restored afterwards). ``pacing`` goes to the
    executor (``none``: ops back to back), as do ``allow_ops`` (with the plan builder: fnmatch
    patterns of operators outside ``runtime.ALLOWED_OP_NAMESPACES`` to call, else skipped) and
    ``collective_handler`` (a multi-rank replay's collectives; the original step is then not
    rebuilt). ``original``: the ``package.module:function`` step to pair with (``--original``); a
    step the plan names is rebuilt only when it is a built-in workload, never imported (the plan is
    data). ``cpu_affinity``: where this process's threads run while both sides are timed (``none``,
    ``auto`` or a CPU list, :mod:`mystique.placement`; ``timing.cpu_placement`` records it). Returns
    ``(summary, results DataFrame)`` and writes ops.csv, summary.json and results.csv into ``out_dir``.
    """
    o = _Options(iters=iters, warmup=warmup, force=force, op_iters=op_iters, seed=seed, timing=timing,
                 half_width=half_width, time_cap=time_cap, pacing=pacing, threads=threads, allow_ops=allow_ops,
                 collective_handler=collective_handler, original=original, cpu_affinity=cpu_affinity)
    o.check()
    check_output_dir(out_dir, force)
    target = make_target(device)
    prog = Progress("replay")
    prog.note(f"reading {source}")
    plan, kind = plan_from_path(source, iteration, allow_ops)
    n = replay_threads(plan.data, torch.device(target.device), threads)
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        return _replay(plan, kind, source, out_dir, target, prog, o)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def subject_of(plan: Plan, source: str | os.PathLike, kind: str) -> str:
    """The ``subject`` of a replay's result rows.

    The captured workload (``llama/small/train``, or the user's ``package.module:function``) when
    the plan knows it (from ``capture.json``); else the benchmark folder's name for a benchmark,
    the trace folder's name for a trace dir, and the file name for a bare ET file.
    """
    named = plan.metadata.get("subject")
    if isinstance(named, str) and named:
        return named
    p = Path(source)
    if p.is_dir():
        return p.resolve().name or str(source)
    if kind == "benchmark" or p.name in ("trace.json", "trace.json.gz"):
        return p.resolve().parent.name or p.name
    return p.name or str(source)


def _replay(plan: Plan, kind: str, source: str | os.PathLike, out_dir: str | os.PathLike, target: Any,
            prog: Progress, o: _Options) -> tuple[dict[str, Any], Any]:
    # CPU: large blocks from a heap never trimmed, for the replay and the original beside it, while they
    # are built and timed only (steady_host_allocator: page faults of fresh mmaps are the allocator's
    # history, not the ops'; the process's settings come back after)
    cpu = torch.device(target.device).type == "cpu"
    with steady_host_allocator() if cpu else contextlib.nullcontext() as allocator:
        e = make_executor(plan, target.device, seed=o.seed, pacing=o.pacing, allow_ops=o.allow_ops,
                          collective_handler=o.collective_handler)
        prog.note(f"{len(plan.ops)} ops, {len(plan.data.get('inputs', []))} input tensors materialised; "
                  f"peak memory {e.peak_bytes() / 2**20:.1f} MiB; probing")
        e.probe()
        c = e.counts()
        prog.note(f"probe: {c['replayed']}/{c['total']} ops replayed, {sum(c['skipped'].values())} skipped")
        load0 = loadavg()
        gpu0 = gpu_clocks(target.device)
        with placed(parse_policy(o.cpu_affinity), target.device) as pl:
            if o.cpu_affinity != "none":
                prog.note(f"CPU placement: {pl.record['why']}")
            paired, why, threads_note, paired_threads, bound = _paired_timing(plan, e, target, prog, o, pl)
            step_times = ([ms / 1e3 for ms in paired.a_ms] if paired is not None
                          else _recorded_timing(e, prog, o, why))
            op_iters = o.op_iters if o.op_iters is not None else min(o.iters, 3)
            pl.sweep()
            op_times = _op_times(e, len(plan.ops), prog, op_iters)
    stats = timing_stats(paired, why=why, step_times_s=step_times, iters=o.iters, warmup=o.warmup,
                             pacing=o.pacing, device=target.device,
                             threads=paired_threads if paired is not None else torch.get_num_threads(),
                             load_start=load0, gpu_before=gpu0)
    if paired is not None:
        stats.update(threads_note)
    stats["host_allocator"] = allocator or "as the process had it"
    stats["cpu_placement"] = pl.record
    if e.pacing == "recorded":  # what was paced, and where the gaps came from
        stats.update(paced_ops=e.paced_ops, paced_gap_ms=e.pacing_gap_us / 1e3,
                     gap_source=plan.metadata.get("gap_source"))
    if bound is None:  # recorded timing: the replay's busy fraction over its median step
        bound = measure_bound(e.run_iteration, None, target.device, device_sync(e.device), None,
                              statistics.median(step_times) * 1e3 if step_times else None)
    summary = summarize(plan, e, step_times, target.device, paired=paired, timing=stats,
                        op_error=op_errors(plan, e, op_times, device=target.device),
                        device_name=target.info().name, bound=bound)
    df = results(summary, e, plan, target.device, subject_of(plan, source, kind), target, o.iters, o.warmup,
                 o.seed, reproduce=o.reproduce(source, target.device))
    with staged_output_dir(out_dir, o.force) as stage:
        atomic_write_text(stage / "ops.csv", ops_csv_text(plan, e, op_times, target.device))
        atomic_write_text(stage / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
        write_csv(df, stage / "results.csv")
    ratio = summary["ratio"]
    prog.note(f"replay step {summary['replay_step_ms']:.3f} ms"
              + (f", original {summary['original_step_ms']:.3f} ms, ratio {ratio:.3f} ({summary['ratio_kind']})"
                 if ratio is not None else ""))
    return summary, df


def _paired_timing(plan: Plan, e: Executor, target: Any, prog: Progress, o: _Options,
                   pl: Placed | None = None) -> tuple[Paired | None, str, dict[str, Any], int, Bound | None]:
    """``(paired rounds or None, why not paired, threads note, threads the rounds ran with, bound)``: the
    replay alternated with the original step rebuilt here, where it can be (see :func:`replay`); ``bound``
    what the step is bound by (:func:`boundness.measure_bound`, one profiled iteration of each side after
    the rounds), None where not paired; ``pl``: the CPU placement, whose threads started since are
    moved between rounds."""
    original, why = rebuild_original(plan, target.device, o.timing, o.collective_handler, o.original)
    paired_threads = torch.get_num_threads()
    if original is None:
        return None, why, {}, paired_threads, None
    spec = original_step(plan) or {}
    prog.note(f"paired timing: the replay alternates with {o.original or spec.get('target')} rebuilt here "
              f"(ABBA rounds, until the 95% interval is within {o.half_width:.1%} or {o.time_cap:g} s)")
    set_threads = torch.get_num_threads()
    threads_note = busy_host_threads(target, o.threads, prog.note)
    try:
        paired = measure_paired(e, original, target.device, half_width=o.half_width, time_cap_s=o.time_cap,
                                    min_rounds=o.iters, min_warmup=o.warmup, progress=prog.note,
                                    threads_note=threads_note or None,
                                    between=pl.sweep if pl is not None else None)
    except Exception as exc:  # noqa: BLE001 - the user's step failed: fall back, saying why
        if o.timing == "paired":
            raise UsageError(f"--timing paired: the original step failed: {type(exc).__name__}: {exc}") from exc
        why = f"the original step failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        paired = None
    finally:
        paired_threads = torch.get_num_threads()
        if paired_threads != set_threads:
            torch.set_num_threads(set_threads)  # the per-op passes run with the captured setting
    bound = (measure_bound(e.run_iteration, original, target.device, device_sync(e.device), paired, None)
             if paired is not None else None)
    del original  # free the original's model before the per-op passes
    if paired is not None:
        lo, hi = paired.interval
        prog.note(f"paired: {paired.rounds} rounds, ratio {paired.ratio:.3f} [{lo:.3f}, {hi:.3f}] ({paired.stop})")
    return paired, why, threads_note, paired_threads, bound


def _recorded_timing(e: Executor, prog: Progress, o: _Options, why: str) -> list[float]:
    """Whole-iteration step times (s) after ``warmup`` untimed iterations."""
    prog.note(f"recorded timing ({why})")
    for i in range(o.warmup):
        e.run_iteration()
        prog.note(f"warm-up {i + 1}/{o.warmup}")
    step_times: list[float] = []
    for i in range(o.iters):
        step_times.extend(e.time_iterations(1, 0))
        prog.note(f"iteration {i + 1}/{o.iters}: {step_times[-1] * 1e3:.3f} ms")
    return step_times


def _op_times(e: Executor, n_ops: int, prog: Progress, n_op: int) -> list[float]:
    """Each op's median time (s) over ``n_op`` per-op timed passes (NaN where never timed)."""
    runs = []
    for i in range(max(1, n_op)):
        runs.append(e.run_iteration(per_op=True))
        prog.note(f"per-op pass {i + 1}/{n_op}")
    return [statistics.median(xs) if (xs := [r[j] for r in runs if not math.isnan(r[j])]) else math.nan
            for j in range(n_ops)]
