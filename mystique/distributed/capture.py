"""Multi-rank capture: one trace dir per rank, ``OUT/rank-K/``, and the run's own summary.

``mystique capture TARGET --nproc N`` (or under ``torchrun``) records into ``OUT/rank-K/`` the
trace dir of :mod:`mystique.capture` (``trace.json.gz``, ``kineto.json.gz``, ``results.csv``, and
``capture.json`` with a ``distributed`` entry: rank, world size, backend, parallelism, process
groups); ``OUT/capture.json`` and ``OUT/results.csv`` describe the whole run. Built-in workloads
train under ``DistributedDataParallel`` (``--parallel ddp``) or FSDP2 ``fully_shard``
(``--parallel fsdp``); a ``package.module:function`` target is called once the process group is up
(it may wrap its model itself).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mystique.distributed.launch as launch

from .. import capture as cap
from .. import progress as prog
from .. import workloads
from ..errors import UsageError
from ..io import atomic_write_text, check_output_dir, staged_output_dir
from ..progress import Progress
from ..results import Results, RunContext, concat, read_csv, write_csv
from ..targets import Target, check_device
from ..trace import load_trace
from ..workloads.base import step_function
from .collectives import process_groups
from .sources import torchrun_env

PARALLEL = ("ddp", "fsdp", "none")


def capture_distributed(target_name: str, out_dir: str | os.PathLike, *, nproc: int | None = None,
                        parallel: str = "ddp", backend: str | None = None, force: bool = False,
                        timeout: float = launch.DEFAULT_TIMEOUT_S * 5, threads: int = 1, **options: Any) -> Path:
    """Capture TARGET on ``nproc`` ranks into ``out_dir/rank-K/`` (see the module docstring).

    ``options``: the fields of :class:`mystique.capture.CaptureOptions`. Under torchrun
    (``RANK``/``WORLD_SIZE`` set) this process is one rank: it joins the group torchrun set up
    (``env://``) and writes only its own ``rank-K/``. Returns the folder.
    """
    o = cap.CaptureOptions(**options)
    o.check()
    if parallel not in PARALLEL:
        raise UsageError(f"unknown parallelism {parallel!r}; expected one of {', '.join(PARALLEL)}")
    check_device(o.device)
    backend = backend or launch.default_backend(o.device)
    job = {"target": target_name, **asdict(o), "parallel": parallel, "backend": backend, "timeout": timeout,
           "threads": threads}
    env = torchrun_env()
    if env is not None and not nproc:
        return _capture_under_torchrun(env, job, Path(out_dir), force)
    if not nproc or nproc < 2:
        raise UsageError("--nproc must be at least 2 for a multi-rank capture")
    if parallel == "fsdp" and o.mode != "train":
        raise UsageError("--parallel fsdp captures training steps (--mode train)")
    check_output_dir(out_dir, force)
    progress = Progress("capture")
    progress.note(f"{nproc} ranks on {backend}, {parallel}: {target_name} ({o.config}, {o.mode}) on {o.device}")
    with staged_output_dir(out_dir, force) as stage:
        job.update(stage=str(stage), quiet=not prog.enabled())
        res = launch.run(_capture_rank, nproc, job, timeout, progress, "capture")
        if not res.ok:
            raise launch.DistributedFailure(f"capture failed: {launch.failure_message(res, stage, timeout)}")
        shutil.rmtree(stage / ".errors", ignore_errors=True)
        _merge_capture(stage, nproc, job)
    progress.note(f"wrote {out_dir} ({nproc} rank trace dirs)")
    return Path(out_dir)


def _capture_under_torchrun(env: tuple[int, int], job: dict[str, Any], out: Path, force: bool) -> Path:
    rank, world = env
    rank_dir = out / f"rank-{rank}"
    check_output_dir(rank_dir, force)
    if not dist.is_initialized():
        dev = launch.rank_device(job["device"], int(os.environ.get("LOCAL_RANK", rank)))
        if dev.startswith("cuda"):
            torch.cuda.set_device(torch.device(dev))
        dist.init_process_group(job["backend"], init_method="env://", timeout=timedelta(seconds=job["timeout"]))
    with staged_output_dir(rank_dir, force) as stage:
        capture_rank(rank, world, job, stage)
    dist.barrier()
    if rank == 0:
        _merge_capture(out, world, job)
    return out


def _merge_capture(stage: Path, world: int, job: dict[str, Any]) -> None:
    """The run's own ``capture.json`` (ranks, step times) and ``results.csv`` (every rank's rows)."""
    metas = []
    for r in range(world):
        f = stage / f"rank-{r}" / "capture.json"
        if f.exists():
            metas.append(json.loads(f.read_text(encoding="utf-8")))
    steps = [m["step_time"]["median_ms"] for m in metas]
    doc = {"format": "mystique-capture-distributed", "version": 1, "target": job["target"], "config": job["config"],
           "mode": job["mode"], "device": job["device"], "dtype": job["dtype"], "parallel": job["parallel"],
           "backend": job["backend"], "world_size": world, "ranks": [f"rank-{r}" for r in range(world)],
           "step_time": {"median_ms_by_rank": steps, "critical_path_ms": max(steps) if steps else None,
                         "median_ms": statistics.median(steps) if steps else None},
           "process_groups": metas[0]["distributed"]["process_groups"] if metas else []}
    atomic_write_text(stage / "capture.json", json.dumps(doc, indent=2) + "\n")
    frames = [read_csv(stage / f"rank-{r}" / "results.csv") for r in range(world)
              if (stage / f"rank-{r}" / "results.csv").exists()]
    write_csv(concat(frames), stage / "results.csv")


# ----------------------------------------------------------------------------------------------
# One rank
# ----------------------------------------------------------------------------------------------


def wrap_step(step: Any, parallel: str, device: str) -> Any:
    """The workload step with its model under DDP or FSDP2 (the optimizer rebuilt for FSDP)."""
    mod = workloads.get(step.name)
    model = step.model
    opt = step.optimizer
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [model_device_index(device)] if device.startswith("cuda") else None
        model = DistributedDataParallel(model, device_ids=ids)
    elif parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for sub in model.modules():
            for child in getattr(sub, "layers", []) if hasattr(sub, "layers") else []:
                fully_shard(child)
        fully_shard(model)
        if step.mode == "train":
            opt = mod.make_optimizer(model)
    step.model, step.optimizer = model, opt
    step.fn = step_function(mod, model, step.batch, opt, step.mode)
    return step


def model_device_index(device: str) -> int:
    d = torch.device(device)
    return d.index if d.index is not None else 0


def _capture_rank(rank: int, world: int, job: dict[str, Any], status: launch.RankStatus) -> None:
    """One rank of a multi-rank capture (spawned process)."""
    launch.init_group(job, rank, world)
    capture_rank(rank, world, job, Path(job["stage"]) / f"rank-{rank}")


def capture_rank(rank: int, world: int, job: dict[str, Any], out: Path) -> dict[str, Any]:
    """Capture this rank (the process group is up) into ``out``; returns its ``capture.json``."""
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    if rank != 0 or job.get("quiet"):
        prog.set_enabled(False)
    device = launch.rank_device(job["device"], rank)
    target = Target(device)
    progress = Progress(f"capture rank {rank}")
    parallel = job["parallel"]
    if job["target"] in workloads.names():
        full, described = cap.workload_step(job["target"], config=job["config"], mode=job["mode"], device=device,
                                            dtype=job["dtype"], seed=int(job["seed"]))
        if parallel != "none":
            full = wrap_step(full, parallel, device)
        step = full.fn
    else:
        step, described = cap.resolve_step(job["target"], config=job["config"], mode=job["mode"], device=device,
                                           dtype=job["dtype"], seed=int(job["seed"]))
        parallel = "user"
    progress.note(f"{world} ranks, {job['backend']}, {parallel}: timing {job['steps']} steps")
    dist.barrier()
    timing = cap.time_step(step, target, warmup=int(job["warmup"]), iters=int(job["steps"]))
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    cap.record_step(step, target, out / cap.TRACE_FILE, out / cap.KINETO_FILE, out / cap.PACING_FILE)
    dist.barrier()
    counts = cap.trace_counts(out / cap.TRACE_FILE)
    info = target.info()
    meta = cap.capture_meta(job["target"], described, device, info.name, job["dtype"], int(job["seed"]), timing,
                            counts)
    meta["distributed"] = {
        "rank": rank, "world_size": world, "backend": dist.get_backend(), "parallel": parallel,
        "process_groups": [vars(p) for p in process_groups(load_trace(out / cap.TRACE_FILE))],
        "collectives": sorted(n for n in counts["op_names"] if n.startswith(("c10d::", "_c10d")))}
    atomic_write_text(out / cap.CAPTURE_FILE, json.dumps(meta, indent=2, default=str) + "\n")
    _write_rank_results(out, meta, job, rank, world, parallel, timing, counts, info.name)
    progress.note(f"rank {rank}: step median {timing['median_ms']:.2f} ms; wrote {out}")
    return meta


def _write_rank_results(out: Path, meta: dict[str, Any], job: dict[str, Any], rank: int, world: int, parallel: str,
                        timing: dict[str, Any], counts: dict[str, Any], device_name: str) -> None:
    """The rank's ``results.csv``: its step time and whether a trace was recorded."""
    res = Results(RunContext(device=meta["device"], device_name=device_name, torch_version=torch.__version__),
                  "capture")
    subject = (f"{job['target']}/{job['config']}/{job['mode']}" if meta["kind"] == "workload"
               else job["target"]) + f"/rank-{rank}"
    dt = meta["dtype"] or ""
    res.add("uninstrumented_step_time", subject, "median_ms", timing["median_ms"], unit="ms", status="info", dtype=dt,
            detail=f"{job['steps']} steps after {job['warmup']} warm-up; IQR {timing['iqr_ms']:.3f} ms; "
                   f"{parallel} on {world} ranks ({dist.get_backend()}); seed {job['seed']}")
    ok = counts["aten_ops"] > 0
    res.add("trace_recorded", subject, "aten_ops", counts["aten_ops"], status="pass" if ok else "fail", dtype=dt,
            threshold=1, detail=f"ET schema {counts['schema']}, {counts['nodes']} nodes")
    write_csv(res.frame(), out / "results.csv")
