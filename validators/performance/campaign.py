"""The fleet-detection campaign: does the fleet comparison flag a throttled device and spare healthy ones?

:func:`campaign` simulates a fleet on this host: ``runs`` healthy devices and ``runs`` devices under
a slowness fault (``throttle`` by default), each replaying the reference workloads' benchmarks for
``duration`` seconds, while a background process keeps one of this process's CPUs busy part of the
time (``busy_s`` busy out of every ``period_s``: the noisy neighbour of the target, :mod:`.neighbour`,
which dies with this process however it ends). Each healthy run is judged against the other healthy
runs (leave one out) and each faulty run against all healthy runs, by :func:`.fleet.judge` over the
compared figures; a run is flagged when any of its fleet rows fails. No paired mode rows are run
(they would flag the fault by themselves): this measures the fleet comparison alone.

Two schedules:

* ``at-once`` (the default, :mod:`.at_once`): every run measured in the same window, in shuffled
  rounds of short bursts, as a synchronous job measures its devices: a change of the host's speed
  falls on every run alike instead of becoming fleet spread.
* ``sequential``: one ``sustained`` run after another (healthy, faulty, healthy, ...), after one
  discarded warm-up run (a process's first run pays for caches, allocator and lazily built state).
  A host whose speed wanders over the minutes this takes passes that wander into the fleet's
  spread and so into its limit: the schedule shows what a fleet measured at different times costs.

Returns the campaign's rows (suite ``performance``: ``campaign_flagged`` per side, with
``campaign_run`` rows per run and ``campaign_slowdown`` and ``campaign_pass_bound`` measurements per run
and figure: what the fleet's verdict on that figure reads) and writes each run's results under ``out_dir``. The command is
``mystique fleet-campaign``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from mystique import results
from mystique.errors import UsageError
from mystique.hostinfo import torch_threads
from mystique.progress import Progress
from mystique.targets import make_target
from mystique.timing import loadavg

from ..groups import select_workloads
from .fleet import COMPARED, DEFAULT_MARGIN, Judgement, interval_of, judgement
from .neighbour import neighbour


def _figures(df: pd.DataFrame) -> dict[tuple[str, str, str, str], tuple[float, float, float]]:
    """The compared figures of one run: key -> (value, low, high), the interval from its columns."""
    out = {}
    for r in df.itertuples():
        if r.status == "info" and (r.check, r.metric) in COMPARED:
            lo, hi = interval_of(r)
            out[(r.check, r.subject, r.dtype, r.metric)] = (float(r.value), lo, hi)
    return out


def _flag(figs: dict, peers: list[dict], margin: float) -> tuple[bool, int, str, list[tuple[tuple, Judgement]]]:
    """(flagged, inconclusive rows, the failing figures, every verdict as (key, :class:`.fleet.Judgement`))
    of one run against ``peers``' figures."""
    failing, unsure, judged = [], 0, []
    for key, (v, lo, hi) in figs.items():
        values = [p[key][0] for p in peers if key in p]
        if not values:
            continue
        j = judgement(v, lo, hi, values, COMPARED[(key[0], key[3])], margin)
        judged.append((key, j))
        if j.status == "fail":
            failing.append(f"{key[1]} {key[3]} {j.slowdown:.3f}>{j.limit:.3f}")
        unsure += j.status == "inconclusive"
    return bool(failing), unsure, "; ".join(failing), judged


SCHEDULES: tuple[str, ...] = ("at-once", "sequential")


def campaign(out_dir: str | os.PathLike, *, runs: int = 20, fault: str = "throttle", duration: float = 4.0,
             workloads: str = "dlrm", busy_s: float = 0.5, period_s: float = 2.0, margin: float = DEFAULT_MARGIN,
             seed: int = 0, device: str = "cpu", schedule: str = "at-once") -> pd.DataFrame:
    """Run the campaign (see the module docstring); UsageError for settings that cannot be run."""
    if runs < 3:
        raise UsageError(f"runs {runs}: a fleet needs at least 3 healthy runs to estimate its spread")
    if not duration > 0:
        raise UsageError(f"duration {duration:g} must be positive (seconds)")
    if not (period_s > 0 and 0 <= busy_s <= period_s):
        raise UsageError(f"--busy {busy_s:g},{period_s:g}: the busy seconds must lie within a positive period")
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    names = select_workloads(workloads)  # unknown names: refused before anything runs
    healthy_t, faulty_t = make_target(device), make_target(device, fault)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = [(f"{side}-{i:02d}", target, seed + i) for i in range(runs)
             for side, target in (("healthy", healthy_t), ("faulty", faulty_t))]
    measure = _at_once if schedule == "at-once" else _sequential
    with neighbour(busy_s, period_s):  # dies with this process, however it ends (.neighbour)
        frames = measure(specs, out, duration=duration, workloads=names, seed=seed)
    for name, df in frames.items():
        folder = out / name
        folder.mkdir(exist_ok=True)
        results.write_csv(df, folder / "results.csv")
    split = {side: [df for name, df in frames.items() if name.startswith(side)] for side in ("healthy", "faulty")}
    return _rows(healthy_t, split, fault, margin, duration, ",".join(names), busy_s, period_s, schedule)


def _sequential(specs: list[tuple[str, Any, int]], out: Path, *, duration: float, workloads: tuple[str, ...],
                seed: int) -> dict[str, pd.DataFrame]:
    """One ``sustained`` run per member after the other (after one discarded warm-up run)."""
    from . import run as perf_run

    progress = Progress("campaign", total=len(specs))
    progress.note("warm-up run (discarded)")
    perf_run(specs[0][1], groups=["sustained"], duration=duration, workloads=workloads, seed=seed,
             out_dir=str(out / "warm-up"), paired=False)
    frames = {}
    for name, target, member_seed in specs:
        progress.step(f"run {name} ({target.label})")
        frames[name] = perf_run(target, groups=["sustained"], duration=duration, workloads=workloads,
                                seed=member_seed, out_dir=str(out / name), paired=False)
    return frames


def _at_once(specs: list[tuple[str, Any, int]], out: Path, *, duration: float, workloads: tuple[str, ...],
             seed: int) -> dict[str, pd.DataFrame]:
    """Every member measured in the same window, in shuffled rounds of short bursts (:mod:`.at_once`)."""
    from mystique.validators.correctness import benchmarks as bm

    from . import LEVELS
    from .at_once import build_members, measure_at_once, member_frame, schedule
    from .sustained import steady_allocator

    spec, device = LEVELS["quick"], specs[0][1].device
    rounds, _ = schedule(duration, len(workloads))
    progress = Progress("campaign", total=rounds)
    with bm.cache_root(out) as root:
        benches = [bm.reference(w, spec["config"], spec["mode"], "float32", root, progress) for w in workloads]
    threads = len(os.sched_getaffinity(0))
    with steady_allocator(specs[0][1]) as allocator, torch_threads(threads):  # as the sustained group runs
        progress.note(f"{len(specs)} simulated devices: an executor each per workload")
        members = build_members(specs, benches, device)
        load = loadavg()
        how = measure_at_once(members, duration, progress, seed)
    host = f"host load average {load} -> {loadavg()} (1, 5, 15 min); {threads} threads; host allocator: {allocator}"
    return {m.name: member_frame(m, how, host) for m in members}


def _rows(target: Any, frames: dict[str, list[pd.DataFrame]], fault: str, margin: float, duration: float,
          workloads: str, busy_s: float, period_s: float, schedule: str) -> pd.DataFrame:
    res = results.Results(results.RunContext.for_target(target), "performance")
    healthy = [_figures(df) for df in frames["healthy"]]
    faulty = [_figures(df) for df in frames["faulty"]]
    how = ("the runs measured at once: shuffled rounds of short bursts after one discarded round"
           if schedule == "at-once" else "the runs one after another, after one discarded warm-up run")
    setup = (f"sustained {workloads} for {duration:g} s per run, {how}; fleet margin {margin:g}; a background "
             f"process busy {busy_s:g} s of every {period_s:g} s on this process's CPUs")
    flagged = {"healthy": 0, "faulty": 0}
    for side, figs_list in (("healthy", healthy), ("faulty", faulty)):
        for i, figs in enumerate(figs_list):
            peers = [h for j, h in enumerate(healthy) if side == "faulty" or j != i]
            hit, unsure, why, judged = _flag(figs, peers, margin)
            flagged[side] += hit
            res.add("campaign_run", f"{side}-{i:02d}", "flagged", float(hit), status="info",
                    detail=f"against {len(peers)} healthy peers; {unsure} inconclusive rows" + (f"; {why}" if why else ""))
            for (_check, subject, dtype, metric), j in judged:
                _slowdown_rows(res, f"{side}-{i:02d}: {subject}", dtype, metric, j)
    n = len(healthy)
    res.add("campaign_flagged", f"healthy ({n} runs)", "runs_flagged", flagged["healthy"], threshold=0,
            status="pass" if flagged["healthy"] == 0 else "fail",
            detail=f"healthy runs flagged against the other healthy runs (leave one out); {setup}")
    need = n - n // 20
    res.add("campaign_flagged", f"{fault} ({len(faulty)} runs)", "runs_flagged", flagged["faulty"], threshold=need,
            status="pass" if flagged["faulty"] >= need else "fail",
            detail=f"runs under {fault} flagged against the {n} healthy runs; target at least {need} of {len(faulty)}; "
                   f"{setup}")
    return res.frame()


def _slowdown_rows(res: results.Results, subject: str, dtype: str, metric: str, j: Judgement) -> None:
    """A run's figure against its fleet, as measurements (the campaign's checks are ``campaign_flagged``):
    ``campaign_slowdown`` (the slowdown, its interval in ``low`` and ``high``, the limit as threshold) and
    ``campaign_pass_bound`` (the bound at or below which the interval passes). The verdict follows from
    these columns (:func:`.fleet.verdict`); the detail only says it."""
    res.add("campaign_slowdown", subject, metric, j.slowdown, threshold=j.limit, low=j.low, high=j.high, unit="x",
            status="info", dtype=dtype, detail=f"the fleet comparison's verdict: {j.status}; {j.detail}")
    res.add("campaign_pass_bound", subject, metric, j.pass_bound, unit="x", status="info", dtype=dtype,
            detail="the slowdown passes when its 95% interval lies at or below this bound (the limit, or less where "
                   "the fleet's spread decides)")
