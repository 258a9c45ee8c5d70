"""Side-by-side fidelity of a multi-rank capture: the captured step and its replay, interleaved in
the same rank processes, compared by the paired ratio of their critical paths."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mystique.distributed.launch as launch

from .. import progress as prog
from .. import workloads
from ..errors import UsageError
from ..io import atomic_write_text
from ..progress import Progress
from ..replay.plan import plan_from_path
from ..replay.run import make_executor
from ..targets import synchronize
from ..timing import median_interval, verdict
from ..trace import load_trace
from .capture import wrap_step
from .collectives import comm_specs
from .replay import build_groups, import_fsdp_ops
from .runner import CollectiveRunner
from .sources import find_rank_sources

STEP_RATIO_LOW, STEP_RATIO_HIGH = 0.85, 1.15


def measure_fidelity(capture_dir: str | os.PathLike, *, iters: int = 10, warmup: int = 2, device: str = "cpu",
                     backend: str | None = None, seed: int = 0, timeout: float = launch.DEFAULT_TIMEOUT_S,
                     threads: int = 1) -> dict[str, Any]:
    """Time a multi-rank capture's step and its replay side by side in the same rank processes.

    For each of ``iters`` repetitions every rank runs the rebuilt captured step (its workload under
    the recorded parallelism), then one replay iteration of its own trace, with barriers around
    each so the ranks start together; interleaving cancels the drift of a shared machine's load.
    Returns ``{"world_size", "captured_ms", "replayed_ms", "ratio", "ratio_low", "ratio_high",
    "ratio_kind", "ratios", "verdict", "per_rank": {...}}``: the step times are the critical path (max
    over ranks) of the per-rank medians; ``ratio`` is the median over the repetitions of the paired
    ratio replayed / captured of that repetition's critical path, ``ratio_low``/``ratio_high`` its 95%
    interval and ``verdict`` the interval's against ``STEP_RATIO_LOW``-``STEP_RATIO_HIGH`` (pass
    inside, fail outside, inconclusive straddling).
    """
    rs = find_rank_sources(capture_dir)
    if rs is None or not all((p / "capture.json").exists() for p in rs.sources.values()):
        raise UsageError(f"{capture_dir} is not a multi-rank capture (rank-K/ folders with capture.json)")
    world = len(rs.sources)
    backend = backend or launch.default_backend(device)
    progress = Progress("fidelity")
    with tempfile.TemporaryDirectory(prefix="mystique-fidelity.") as tmp:
        job = {"stage": tmp, "sources": {str(k): str(v) for k, v in rs.sources.items()},
               "device": device, "backend": backend, "iters": iters, "warmup": warmup, "seed": seed,
               "timeout": timeout, "threads": threads}
        res = launch.run(_fidelity_rank, world, job, timeout, progress, "fidelity")
        if not res.ok:
            raise launch.DistributedFailure(launch.failure_message(res, Path(tmp), timeout))
        raw = [json.loads((Path(tmp) / f"fidelity-rank-{r}.json").read_text(encoding="utf-8")) for r in range(world)]
    per_rank = {str(r): {"captured_ms": statistics.median(d["captured_ms"]),
                         "replayed_ms": statistics.median(d["replayed_ms"])} for r, d in enumerate(raw)}
    cap_ms = max(v["captured_ms"] for v in per_rank.values())
    rep_ms = max(v["replayed_ms"] for v in per_rank.values())
    n = min(len(d["captured_ms"]) for d in raw)
    ratios = [max(d["replayed_ms"][i] for d in raw) / max(d["captured_ms"][i] for d in raw) for i in range(n)]
    lo, hi = median_interval(ratios)
    return {"world_size": world, "captured_ms": cap_ms, "replayed_ms": rep_ms,
            "ratio": statistics.median(ratios) if ratios else math.nan, "ratio_low": lo, "ratio_high": hi,
            "ratio_kind": "paired", "ratios": ratios, "verdict": verdict(lo, hi, STEP_RATIO_LOW, STEP_RATIO_HIGH),
            "per_rank": per_rank}


def _fidelity_rank(rank: int, world: int, job: dict[str, Any], status: launch.RankStatus) -> None:
    """Rebuild the captured (DDP/FSDP) step and the replay of this rank's trace; time them interleaved."""
    device = launch.init_group(job, rank, world)
    result = _fidelity_body(rank, world, job, device, status)
    atomic_write_text(Path(job["stage"]) / f"fidelity-rank-{rank}.json", json.dumps(result) + "\n")


def _fidelity_body(rank: int, world: int, job: dict[str, Any], device: str,
                   status: launch.RankStatus) -> dict[str, Any]:
    import_fsdp_ops()
    torch.set_num_threads(int(job["threads"]))
    prog.set_enabled(False)
    src = Path(job["sources"][str(rank)])
    meta = json.loads((src / "capture.json").read_text(encoding="utf-8"))
    step = workloads.make_step(meta["workload"], meta["config"], meta["mode"], device=device,
                               dtype=getattr(torch, meta["dtype"]), seed=int(meta.get("seed", 0)))
    parallel = meta.get("distributed", {}).get("parallel", "ddp")
    if parallel in ("ddp", "fsdp"):
        step = wrap_step(step, parallel, device)
    trace = load_trace(src)
    plan, _ = plan_from_path(src)
    groups, _ = build_groups(trace, rank)
    runner = CollectiveRunner(comm_specs(trace, plan), groups, rank, world, device, status=status,
                              backend=job["backend"])
    e = make_executor(plan, device, seed=int(job["seed"]) + rank, collective_handler=runner.handler)
    e.probe()
    for _ in range(int(job["warmup"])):
        step.fn()
        e.run_iteration()
    captured, replayed = [], []
    for _ in range(int(job["iters"])):
        dist.barrier()
        t0 = time.perf_counter()
        step.fn()
        synchronize(device)
        captured.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        e.run_iteration()
        replayed.append(time.perf_counter() - t0)
    runner.drain()
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "captured_ms": [t * 1e3 for t in captured], "replayed_ms": [t * 1e3 for t in replayed]}
