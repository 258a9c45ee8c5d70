"""Multi-rank replay: one process per rank, each replaying its plan with its collectives in order.

``replay_distributed`` takes a folder of ``rank-K/`` trace dirs or of per-rank ET files (see
:mod:`mystique.distributed.sources`), or one trace with ``world_size`` > 1. Each rank rebuilds the
process groups its trace records, replays its plan with :func:`mystique.replay.run.replay` while a
:class:`~mystique.distributed.runner.CollectiveRunner` replays every collective in order with the
compute, and writes ``OUT/rank-K/`` (ops.csv, summary.json, results.csv, collectives.csv,
rank.json). Ranks a trace set lacks (``--world-size`` above the number of files) are synthetic
peers that issue the matching collectives and nothing else. :mod:`mystique.distributed.merge`
then writes the run's own ``collectives.csv``, ``summary.json`` and ``results.csv``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mystique.distributed.launch as launch

from .. import progress as prog
from ..errors import EnvironmentUnsupported, UsageError
from ..io import atomic_write_text, check_output_dir, staged_output_dir
from ..progress import Progress
from ..replay import runtime as ex
from ..replay.plan import normalise, plan_from_path
from ..replay.run import replay
from ..results import Results, RunContext, write_csv
from ..targets import check_device
from ..trace import load_trace
from .collectives import comm_specs, mirror_for_peer, process_groups
from .merge import merge_replay, write_collectives_csv
from .runner import CollectiveRunner
from .sources import RankSet, find_rank_sources, recorded_world

BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


def replay_distributed(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    device: str = "cpu",
    iters: int = 10,
    warmup: int = 3,
    iteration: int | None = None,
    seed: int = 0,
    force: bool = False,
    world_size: int | None = None,
    backend: str | None = None,
    timeout: float = launch.DEFAULT_TIMEOUT_S,
    threads: int = 1,
) -> tuple[dict[str, Any], Any]:
    """Replay a multi-rank trace with one process per rank; returns ``(summary, results DataFrame)``.

    ``source``: a folder of ``rank-K/`` trace dirs or of per-rank ET files, or one trace (dir or
    file) with ``world_size`` > 1 (it replays as rank 0; the other ranks are synthetic peers).
    Raises :class:`DistributedFailure` (after writing what the ranks produced) when a rank died,
    failed or hung; UsageError for bad input; EnvironmentUnsupported for an unknown backend.
    """
    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    if timeout <= 0:
        raise UsageError("--timeout must be positive")
    backend = _check_backend(backend, device)
    rs, world = _rank_set(source, world_size)
    check_output_dir(out_dir, force)
    progress = Progress("distributed")
    peers = [r for r in range(world) if r not in rs.sources]
    progress.note(f"{world} ranks on {backend} ({len(rs.sources)} from traces"
                  + (f", synthetic peers {peers}" if peers else "") + f"); timeout {timeout:g} s")
    with staged_output_dir(out_dir, force) as stage:
        job = {"stage": str(stage), "sources": {str(k): str(v) for k, v in rs.sources.items()},
               "device": device, "backend": backend, "iters": iters, "warmup": warmup, "iteration": iteration,
               "seed": seed, "timeout": timeout, "threads": threads, "quiet": not prog.enabled()}
        res = launch.run(_replay_rank, world, job, timeout, progress, "replay")
        summary, df = merge_replay(stage, world, backend, device, res, timeout)
        failure = None if res.ok else launch.failure_message(res, stage, timeout)
        for extra in stage.iterdir():  # watchdog files, synthetic peers' plans, killed ranks' staging
            if extra.name.startswith("."):
                shutil.rmtree(extra, ignore_errors=True)
    if failure:
        raise launch.DistributedFailure(f"{failure} (results of the other ranks are in {out_dir})")
    crit = summary["replay_step_ms"]
    progress.note(f"critical-path step {crit:.3f} ms over {world} ranks; "
                  f"{summary['collectives']['replayed']}/{summary['collectives']['total']} collectives replayed")
    return summary, df


def _check_backend(backend: str | None, device: str) -> str:
    """The process-group backend (default: per device), checked against this torch build."""
    if not dist.is_available():
        raise EnvironmentUnsupported("this torch build has no torch.distributed")
    check_device(device)
    backend = backend or launch.default_backend(device)
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; expected gloo or nccl")
    if backend == "nccl" and not dist.is_nccl_available():
        raise EnvironmentUnsupported("backend nccl is not available in this torch build")
    if backend == "gloo" and not dist.is_gloo_available():
        raise EnvironmentUnsupported("backend gloo is not available in this torch build")
    return backend


def _rank_set(source: str | os.PathLike, world_size: int | None) -> tuple[RankSet, int]:
    """The sources by rank and the world size (``world_size``, else the ranks found or recorded)."""
    rs = find_rank_sources(source)
    src = Path(source)
    if rs is None:
        if not src.exists():
            raise UsageError(f"{src} does not exist")
        rs = RankSet({0: src}, src)
    recorded = recorded_world(rs)
    world = world_size or max(len(rs.sources), max(rs.sources) + 1, recorded or 1)
    if world < max(rs.sources) + 1:
        raise UsageError(f"--world-size {world} is smaller than the ranks found ({', '.join(map(str, rs.ranks))})")
    if world < 2:
        raise UsageError(f"{src} holds one rank of a one-rank job: replay it without --world-size")
    return rs, world


# ----------------------------------------------------------------------------------------------
# One rank (a spawned process)
# ----------------------------------------------------------------------------------------------


def import_fsdp_ops() -> None:
    """What a replaying rank process needs beyond the single-process replay: ``fsdp::*`` operators
    (FSDP2's copy-in/out ops) register when torch's FSDP is imported."""
    import torch.distributed.fsdp  # noqa: F401 - registers the fsdp:: operators


def _replay_rank(rank: int, world: int, job: dict[str, Any], status: launch.RankStatus) -> None:
    """One rank of a multi-rank replay; a failed rank's folder gets its error (error.json, results.csv)."""
    stage = Path(job["stage"])
    try:
        _replay_rank_body(rank, world, job, status, stage)
    except BaseException as exc:
        _write_rank_error(stage, rank, job, exc)
        raise


def _replay_rank_body(rank: int, world: int, job: dict[str, Any], status: launch.RankStatus,
                      stage: Path) -> None:
    import_fsdp_ops()
    torch.set_num_threads(int(job["threads"]))
    if rank != 0 or job.get("quiet"):
        prog.set_enabled(False)
    device = launch.init_group(job, rank, world)
    sources = {int(k): Path(v) for k, v in job["sources"].items()}
    synthetic = rank not in sources
    template = min(sources)
    trace = load_trace(sources.get(rank, sources[template]))
    plan, specs, dropped, src = _rank_plan(rank, world, job, stage, trace, device)
    groups, described = build_groups(trace, rank)
    check_schedules(specs, rank)
    runner = CollectiveRunner(specs, groups, rank, world, device, status=status, backend=job["backend"])
    out_dir = stage / f"rank-{rank}"
    t0 = time.perf_counter()
    replay(src, out_dir, device=device, iters=int(job["iters"]), warmup=int(job["warmup"]), iteration=None,
           force=True, seed=int(job["seed"]) + rank, collective_handler=runner.handler)
    runner.drain()
    wall = time.perf_counter() - t0
    rows = runner.rows(synthetic=synthetic)
    waits = sum(1 for s in specs.values() if s.kind == "wait")
    total = sum(1 for op in plan.ops if op.get("reason") == "collective") - waits
    write_collectives_csv(out_dir / "collectives.csv", rows)
    info = {"rank": rank, "world_size": world, "backend": job["backend"], "device": device,
            "synthetic": synthetic, "source": str(sources.get(rank, "")) if not synthetic else "",
            "template_rank": template if synthetic else None, "process_groups": described,
            "collectives_total": total, "collectives_replayed": sum(1 for r in rows if r["calls"] > 0),
            "waits": waits, "wall_s": wall, "inputs_not_materialised_bytes": dropped}
    atomic_write_text(out_dir / "rank.json", json.dumps(info, indent=2, default=str) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def _rank_plan(rank: int, world: int, job: dict[str, Any], stage: Path, trace: Any,
               device: str) -> tuple[Any, dict[int, Any], int, Path]:
    """This rank's plan (a synthetic peer's: the template rank's collectives only), its collective
    specs, the bytes of inputs not materialised, and where the plan was saved for the replay."""
    sources = {int(k): Path(v) for k, v in job["sources"].items()}
    template = min(sources)
    plan, _kind = plan_from_path(sources.get(rank, sources[template]), job.get("iteration"))
    specs = comm_specs(trace, plan)
    if rank not in sources:
        specs = mirror_for_peer(specs, template, rank, world)
        keep = {op["node_id"] for op in plan.ops if op["node_id"] in specs}
        plan.data["ops"] = [op for op in plan.ops if op["node_id"] in keep]
        plan.metadata["original_step_ms"] = None
        plan.metadata["source"] = f"synthetic peer of rank {template}"
        normalise(plan)
    dropped = drop_unrunnable_inputs(plan, device)
    plan_dir = stage / ".plans" / f"rank-{rank}"
    plan_dir.mkdir(parents=True, exist_ok=True)
    plan.save(plan_dir / "benchmark.json")
    launch.write_schedule(stage, rank, [s.describe() for s in specs.values() if s.kind != "wait"])
    return plan, specs, dropped, plan_dir / "benchmark.json"


def build_groups(trace: Any, rank: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Create the trace's process groups on every rank (same order everywhere); returns
    ``({pg_name: group or None for the default}, described)``.

    Each rank contributes the groups its trace records; the union (by name) is created in name
    order with ``new_group`` (a collective over the default group). A group over every rank is
    the default group.
    """
    mine = [vars(p) for p in process_groups(trace)] if trace is not None else []
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    world = dist.get_world_size()
    union: dict[str, dict[str, Any]] = {}
    for lst in everyone:
        for pg in lst or []:
            union.setdefault(pg["pg_name"], pg)
    groups: dict[str, Any] = {}

    def key(name: str) -> tuple[int, Any]:
        return (0, int(name)) if name.isdigit() else (1, name)

    described = []
    for name in sorted(union, key=key):
        pg = union[name]
        ranks = [r for r in pg.get("ranks") or [] if 0 <= r < world]
        if not ranks or sorted(set(ranks)) == list(range(world)):
            groups[name] = None
            described.append({**pg, "replayed_as": "default"})
            continue
        g = dist.new_group(ranks=sorted(set(ranks)), group_desc=pg.get("pg_desc") or None)
        groups[name] = g if rank in ranks else None
        described.append({**pg, "replayed_as": f"new_group({sorted(set(ranks))})"})
    return groups, described


def check_schedules(specs: dict[int, Any], rank: int) -> None:
    """Every rank must issue the same kinds of collective in the same order on each group."""
    p2p = {"send": "send/recv", "recv": "send/recv"}  # a send meets its peer's recv
    mine = [(s.pg_name or "default", p2p.get(s.kind, s.kind)) for s in specs.values() if s.kind != "wait"]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    ref = everyone[0]
    for r, other in enumerate(everyone):
        if other == ref:
            continue
        if len(other) != len(ref):
            raise UsageError(f"the ranks' traces disagree: rank 0 issues {len(ref)} collectives, rank {r} "
                             f"issues {len(other)}")
        for i, (a, b) in enumerate(zip(ref, other)):
            if a != b:
                raise UsageError(f"the ranks' traces disagree at collective #{i}: rank 0 issues {a[1]} on pg {a[0]}, "
                                 f"rank {r} issues {b[1]} on pg {b[0]}")


def drop_unrunnable_inputs(plan: Any, device: str = "cpu") -> int:
    """Stop materialising inputs that only ops which cannot run here read; returns their bytes.

    An op that cannot run here (skipped by the plan for another reason than being a collective,
    or whose operator this torch lacks: a custom op whose package is absent, e.g. fbgemm) is
    never called, so its tensor arguments whose storage no other op touches need no memory: they
    are replaced by None in its arguments (its recorded outputs stay, synthesised for the ops that
    read them). A trace's embedding tables that only an absent custom op reads are the typical case.
    """
    tensors = {t["id"]: t for t in plan.tensors}
    users: dict[int, set[int]] = {}
    for op in plan.ops:
        for tid in ex.op_tensor_ids(op):
            users.setdefault(tensors[tid]["storage"], set()).add(op["index"])
    dev = torch.device(device)

    def runnable(op: dict[str, Any]) -> bool:
        if op.get("action") == "skip":
            return op.get("reason") == "collective"
        if op.get("action") != "call":
            return True
        return (ex.substitute(op["op"], dev) or ex.resolve_overload(op["op"])) is not None

    skip = {op["index"] for op in plan.ops if not runnable(op)}
    lonely = {sid for sid, ops in users.items() if ops <= skip}
    if not lonely:
        return 0
    storages = {s["id"]: s for s in plan.storages}
    dropped = sum(int(storages[sid]["nbytes"]) for sid in lonely if storages[sid].get("external"))

    def strip(enc: Any) -> Any:
        if isinstance(enc, dict) and "t" in enc and tensors[enc["t"]]["storage"] in lonely:
            return None
        if isinstance(enc, list):
            return [strip(e) for e in enc]
        return enc

    for op in plan.ops:
        if op["index"] in skip:
            op["args"] = strip(op.get("args", []))
            op["kwargs"] = {k: strip(v) for k, v in op.get("kwargs", {}).items()}
    normalise(plan)
    return dropped


def _write_rank_error(stage: Path, rank: int, job: dict[str, Any], exc: BaseException) -> None:
    """A failed rank's folder: error.json and a results.csv holding the error row."""
    try:
        out = stage / f"rank-{rank}"
        out.mkdir(parents=True, exist_ok=True)
        msg = str(exc).strip() or type(exc).__name__
        atomic_write_text(out / "error.json", json.dumps({"rank": rank, "error": msg}, indent=2) + "\n")
        res = Results(RunContext(device=job["device"]), "distributed")
        res.add("rank_completed", f"rank-{rank}", "completed", 0, status="error", detail=msg)
        write_csv(res.frame(), out / "results.csv")
    except Exception:  # noqa: BLE001 - best effort: the parent reports the error anyway
        pass
