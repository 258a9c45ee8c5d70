"""The fleet-detection campaign: does the fleet comparison flag a throttled device and spare healthy ones?

:func:`campaign` runs the ``sustained`` group ``runs`` times on the healthy device and ``runs``
times under a slowness fault (``throttle`` by default), interleaved (healthy, faulty, healthy, ...)
so that the host's drift falls on both alike, while a background process keeps one of this
process's CPUs busy part of the time (``busy_s`` busy out of every ``period_s``: the noisy
neighbour of the target). One untimed healthy run of the same length comes first and is discarded:
a process's first run pays for its caches, allocator and lazily built state, and would be a
healthy outlier of every campaign's fleet. Each healthy run is then judged against the other
healthy runs (leave one out) and each faulty run against all healthy runs, by :func:`.fleet.judge` over the compared
figures; a run is flagged when any of its fleet rows fails. The paired mode rows are not run
(they would flag the fault by themselves): this measures the fleet comparison alone.

Returns the campaign's rows (suite ``performance``: ``campaign_flagged`` per side, with
``campaign_run`` rows per run) and writes each run's results under ``out_dir``. The command is
``mystique fleet-campaign``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from mystique import results
from mystique.errors import UsageError
from mystique.progress import Progress
from mystique.targets import make_target

from .fleet import COMPARED, DEFAULT_MARGIN, interval_of, judge

_BUSY = ("import time,sys\nb,p=float(sys.argv[1]),float(sys.argv[2])\n"
         "while True:\n t=time.perf_counter()\n while time.perf_counter()-t<b: pass\n time.sleep(max(p-b,0))\n")


def _figures(df: pd.DataFrame) -> dict[tuple[str, str, str, str], tuple[float, float, float]]:
    out = {}
    for r in df.itertuples():
        if r.status == "info" and (r.check, r.metric) in COMPARED:
            lo, hi = interval_of(r.detail)
            out[(r.check, r.subject, r.dtype, r.metric)] = (float(r.value), lo, hi)
    return out


def _flag(figs: dict, peers: list[dict], margin: float) -> tuple[bool, int, str]:
    """(flagged, inconclusive rows, the failing figures) of one run against ``peers``' figures."""
    failing, unsure = [], 0
    for key, (v, lo, hi) in figs.items():
        values = [p[key][0] for p in peers if key in p]
        if not values:
            continue
        status, r, limit, _ = judge(v, lo, hi, values, COMPARED[(key[0], key[3])], margin)
        if status == "fail":
            failing.append(f"{key[1]} {key[3]} {r:.3f}>{limit:.3f}")
        unsure += status == "inconclusive"
    return bool(failing), unsure, "; ".join(failing)


def campaign(out_dir: str | os.PathLike, *, runs: int = 20, fault: str = "throttle", duration: float = 4.0,
             workloads: str = "dlrm", busy_s: float = 0.5, period_s: float = 2.0, margin: float = DEFAULT_MARGIN,
             seed: int = 0, device: str = "cpu") -> pd.DataFrame:
    """Run the campaign (see the module docstring); UsageError for settings that cannot be run."""
    from . import _workloads
    from . import run as perf_run

    if runs < 3:
        raise UsageError(f"runs {runs}: a fleet needs at least 3 healthy runs to estimate its spread")
    if not duration > 0:
        raise UsageError(f"duration {duration:g} must be positive (seconds)")
    if not (period_s > 0 and 0 <= busy_s <= period_s):
        raise UsageError(f"--busy {busy_s:g},{period_s:g}: the busy seconds must lie within a positive period")
    _workloads(workloads)  # unknown names: refused before anything runs
    healthy_t, faulty_t = make_target(device), make_target(device, fault)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    busy = subprocess.Popen([sys.executable, "-c", _BUSY, str(busy_s), str(period_s)]) if busy_s > 0 else None
    progress = Progress("campaign", total=2 * runs)
    frames: dict[str, list[pd.DataFrame]] = {"healthy": [], "faulty": []}
    try:
        progress.note("warm-up run (discarded)")
        perf_run(healthy_t, groups=["sustained"], duration=duration, workloads=workloads, seed=seed,
                 out_dir=str(out / "warm-up"), paired=False)
        for i in range(runs):
            for side, target in (("healthy", healthy_t), ("faulty", faulty_t)):
                progress.step(f"{side} run {i + 1} of {runs} ({target.label})")
                folder = out / f"{side}-{i:02d}"
                folder.mkdir(exist_ok=True)
                df = perf_run(target, groups=["sustained"], duration=duration, workloads=workloads, seed=seed + i,
                              out_dir=str(folder), paired=False)
                results.write_csv(df, folder / "results.csv")
                frames[side].append(df)
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait(timeout=10)
    return _rows(healthy_t, frames, fault, margin, duration, workloads, busy_s, period_s)


def _rows(target: Any, frames: dict[str, list[pd.DataFrame]], fault: str, margin: float, duration: float,
          workloads: str, busy_s: float, period_s: float) -> pd.DataFrame:
    res = results.Results(results.RunContext.for_target(target), "performance")
    healthy = [_figures(df) for df in frames["healthy"]]
    faulty = [_figures(df) for df in frames["faulty"]]
    setup = (f"sustained {workloads} for {duration:g} s per run after one discarded warm-up run, fleet margin "
             f"{margin:g}, a background process busy {busy_s:g} s of every {period_s:g} s on this process's CPUs")
    flagged = {"healthy": 0, "faulty": 0}
    for side, figs_list in (("healthy", healthy), ("faulty", faulty)):
        for i, figs in enumerate(figs_list):
            peers = [h for j, h in enumerate(healthy) if side == "faulty" or j != i]
            hit, unsure, why = _flag(figs, peers, margin)
            flagged[side] += hit
            res.add("campaign_run", f"{side}-{i:02d}", "flagged", float(hit), status="info",
                    detail=f"against {len(peers)} healthy peers; {unsure} inconclusive rows" + (f"; {why}" if why else ""))
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
