"""Multi-rank capture and replay on one host: a launcher, per-rank process groups, a watchdog, a merge.

Capture (``mystique capture TARGET --nproc N`` or under ``torchrun``) records one trace dir per
rank: ``OUT/rank-K/`` with ``trace.json.gz``, ``kineto.json.gz``, ``capture.json`` (with a
``distributed`` entry: rank, world size, backend, parallelism, process groups) and
``results.csv``; ``OUT/capture.json`` and ``OUT/results.csv`` describe the whole run. Built-in
workloads train under ``DistributedDataParallel`` (``--parallel ddp``) or FSDP2
``fully_shard`` (``--parallel fsdp``); a ``package.module:function`` target is called once the
process group is up (it may wrap its model itself).

Replay (``mystique replay`` of a folder of ``rank-K/`` trace dirs, or of a folder of per-rank ET
files whose names end in the rank number such as PARAM's ``dlrm_eg_K.json``) launches one
process per rank. Each rank rebuilds the process groups its trace records, replays its plan
with :mod:`mystique.replay.run` while :class:`~mystique.replay.collectives.CollectiveRunner`
replays every collective in order with the compute, and writes ``OUT/rank-K/`` (ops.csv,
summary.json, results.csv, collectives.csv). Ranks a trace set lacks (``--world-size`` above the
number of files, e.g. a one-rank file of a two-rank job) are synthetic peers that issue the
matching collectives and nothing else. The merge writes ``OUT/collectives.csv``,
``OUT/summary.json`` (DESIGN.md's keys over the real ranks, the critical-path step time being
the slowest rank's, plus ``ranks``, ``world_size``, ``backend``, ``collectives``) and
``OUT/results.csv`` (the ranks' ``replay`` rows and ``distributed`` rows).

Processes are started with the ``spawn`` method; the parent holds the rendezvous store
(``torch.distributed.TCPStore`` on 127.0.0.1 and a free port) so that any rank may die without
taking it down. Process groups get ``timeout`` seconds; a parent watchdog ends a run whose rank
died, failed or hung (a collective waited in for longer than the timeout) with an error naming
the rank and the collective, after the other ranks wrote what they had.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import EnvironmentUnsupported, MystiqueError, UsageError
from .io import atomic_write_text, check_output_dir, staged_output_dir
from .progress import Progress

RANK_DIR = re.compile(r"^rank-(\d+)$")
RANK_FILE = re.compile(r"^(?P<stem>.*?)(?P<rank>\d+)\.json(\.gz)?$")
DEFAULT_TIMEOUT_S = 60.0
STEP_RATIO_LOW, STEP_RATIO_HIGH = 0.85, 1.15
# per-rank shared status slots: collectives entered, collectives left, current collective, state
_SLOTS = 4
_STARTING, _RUNNING, _DONE, _FAILED = 0, 1, 2, 3
_GRACE_S = 5.0


class DistributedFailure(MystiqueError):
    """A rank died, failed or hung: the message names the rank and the collective (exit 1)."""

    exit_code = 1


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


@dataclass
class RankSet:
    """The per-rank sources of a multi-rank trace: ``{rank: path}`` (trace dir, ET file or benchmark)."""

    sources: dict[int, Path]
    origin: Path
    recorded_world: int | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.sources)


def torchrun_env() -> tuple[int, int] | None:
    """``(rank, world_size)`` when launched by torchrun (``RANK``/``WORLD_SIZE`` set, world > 1)."""
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if r is None or w is None or not r.isdigit() or not w.isdigit():
        return None
    if int(w) <= 1:
        return None
    return int(r), int(w)


def find_rank_sources(path: str | os.PathLike) -> RankSet | None:
    """The per-rank sources under ``path``, or None when it is not a multi-rank trace.

    A folder of ``rank-K/`` subfolders, or a folder of ET files named ``<stem>K.json[.gz]`` with
    one common stem (PARAM's ``dlrm_eg_0.json`` ... ``dlrm_eg_7.json``). UsageError for a folder
    whose rank files repeat a rank.
    """
    p = Path(path)
    if not p.is_dir():
        return None
    dirs = {int(m.group(1)): d for d in p.iterdir() if d.is_dir() and (m := RANK_DIR.match(d.name))}
    if dirs:
        return RankSet(dict(sorted(dirs.items())), p)
    if (p / "trace.json").exists() or (p / "trace.json.gz").exists() or (p / "benchmark.json").exists():
        return None
    stems: dict[str, dict[int, Path]] = {}
    for f in p.iterdir():
        m = RANK_FILE.match(f.name)
        if f.is_file() and m and not f.name.startswith("._") and not f.name.startswith("kineto"):
            ranks = stems.setdefault(m.group("stem"), {})
            r = int(m.group("rank"))
            if r in ranks:
                raise UsageError(f"{p}: two files for rank {r}: {ranks[r].name} and {f.name}")
            ranks[r] = f
    if len(stems) != 1:
        return None
    (files,) = stems.values()
    if len(files) < 2:
        return None
    return RankSet(dict(sorted(files.items())), p)


def _free_store(world: int, timeout_s: float) -> Any:
    """The rendezvous store, held by this (parent) process on 127.0.0.1 and a free port."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=max(timeout_s, 30.0)),
                         wait_for_workers=False)


def default_backend(device: str) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.split(":")[0] == "cuda" else "gloo"


def _rank_device(device: str, rank: int) -> str:
    """Rank K's device: ``cuda:K mod count`` when ``device`` is ``cuda`` without an index."""
    if device == "cuda":
        import torch

        n = torch.cuda.device_count()
        return f"cuda:{rank % max(n, 1)}"
    return device


def _init_group(store_port: int, rank: int, world: int, backend: str, timeout_s: float, device: str) -> None:
    """Join the default process group through the parent's store."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", store_port, world + 1, False, timeout=timedelta(seconds=max(timeout_s, 30.0)))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


# ----------------------------------------------------------------------------------------------
# The launcher and its watchdog
# ----------------------------------------------------------------------------------------------


@dataclass
class RankOutcome:
    """What happened to one rank: ``done``, ``failed`` (it reported an error), ``died`` or ``hung``."""

    rank: int
    state: str
    exitcode: int | None = None
    error: str = ""
    entered: int = 0
    left: int = 0
    current: int = -1


@dataclass
class LaunchResult:
    outcomes: dict[int, RankOutcome] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.state == "done" for o in self.outcomes.values())


def _launch(target: Any, world: int, job: dict[str, Any], timeout_s: float, progress: Progress,
            label: str) -> LaunchResult:
    """Run ``target(rank, world, job, status)`` in ``world`` spawned processes and watch them.

    The watchdog ends the run when a rank died (exit without reporting), failed (reported an
    error), or when a collective has been waited in for ``timeout_s`` plus a grace period (the
    ranks not in it hung); the other ranks then get the grace period to finish or fail on their
    process-group timeout before they are terminated.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    status = ctx.Array("q", world * _SLOTS, lock=False)
    errors_dir = Path(job["stage"]) / ".errors"
    errors_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    t0 = time.perf_counter()
    for r in range(world):
        p = ctx.Process(target=target, args=(r, world, job, status), name=f"mystique-{label}-rank-{r}", daemon=False)
        p.start()
        procs.append(p)
    res = LaunchResult()
    entered_since: dict[int, tuple[int, float]] = {}
    first_bad: float | None = None
    last_note = time.perf_counter()
    try:
        while True:
            now = time.perf_counter()
            alive = 0
            for r, p in enumerate(procs):
                st = status[r * _SLOTS + 3]
                if r in res.outcomes:
                    continue
                if p.exitcode is None:
                    alive += 1
                    ent, left = status[r * _SLOTS], status[r * _SLOTS + 1]
                    if ent > left:
                        prev = entered_since.get(r)
                        if prev is None or prev[0] != ent:
                            entered_since[r] = (ent, now)
                    else:
                        entered_since.pop(r, None)
                    continue
                err_file = errors_dir / f"rank-{r}.txt"
                err = err_file.read_text(encoding="utf-8").strip() if err_file.exists() else ""
                state = "done" if st == _DONE and p.exitcode == 0 else ("failed" if st == _FAILED else "died")
                res.outcomes[r] = RankOutcome(r, state, p.exitcode, err, status[r * _SLOTS],
                                              status[r * _SLOTS + 1], status[r * _SLOTS + 2])
                if state != "done" and first_bad is None:
                    first_bad = now
            if alive == 0:
                break
            waited_out = any(now - since > timeout_s + _GRACE_S for _e, since in entered_since.values())
            if waited_out or (first_bad is not None and now - first_bad > 2 * _GRACE_S):
                for r, p in enumerate(procs):
                    if r in res.outcomes:
                        continue
                    ent, left = status[r * _SLOTS], status[r * _SLOTS + 1]
                    _terminate(p)
                    res.outcomes[r] = RankOutcome(r, "stopped", p.exitcode, "", ent, left, status[r * _SLOTS + 2])
                break
            if now - last_note > 30.0:
                states = ", ".join(f"rank {r}: {status[r * _SLOTS + 1]} collectives" for r in range(world))
                progress.note(f"{label}: {alive} rank(s) running ({states})")
                last_note = now
            time.sleep(0.05)
    except BaseException:
        for p in procs:
            _terminate(p)
        raise
    for p in procs:
        p.join(timeout=5)
    res.wall_s = time.perf_counter() - t0
    return res


def _terminate(p: Any) -> None:
    if p.exitcode is not None:
        return
    p.terminate()
    p.join(timeout=3)
    if p.exitcode is None and p.pid is not None:
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=3)


def _schedule(stage: Path, rank: int) -> list[str]:
    f = stage / ".errors" / f"rank-{rank}.schedule.json"
    try:
        return list(json.loads(f.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        return []


def failure_message(res: LaunchResult, stage: Path, timeout_s: float) -> str:
    """One line naming the rank(s) that died, failed or hung, and the collective concerned.

    Ranks the watchdog stopped are blamed (``hung``) when they were not inside the collective the
    others waited in (they never reached it); those stopped inside it are reported as waiting.
    """

    def coll(rank: int, idx: int) -> str:
        sched = _schedule(stage, rank)
        return sched[idx] if 0 <= idx < len(sched) else f"#{idx}"

    outcomes = sorted(res.outcomes.values(), key=lambda o: o.rank)
    died = [o for o in outcomes if o.state == "died"]
    failed = [o for o in outcomes if o.state == "failed"]
    stopped = [o for o in outcomes if o.state == "stopped"]
    waiting = [o for o in stopped + failed if o.entered > o.left]
    culprits_known = died or [f for f in failed if f.entered <= f.left]
    hung = [] if culprits_known or not waiting else [o for o in stopped if o.entered <= o.left]
    parts = []
    for o in died:
        how = (f"killed by signal {-o.exitcode}" if o.exitcode is not None and o.exitcode < 0
               else f"exit code {o.exitcode}")
        if o.entered > o.left:
            where = f"during collective {coll(o.rank, o.current)}"
        elif o.left:
            where = f"after collective {coll(o.rank, o.left - 1)}, before collective {coll(o.rank, o.left)}"
        else:
            where = f"before its first collective {coll(o.rank, 0)}"
        parts.append(f"rank {o.rank} died ({how}) {where}")
    for o in hung:
        idx = max((w.current for w in waiting), default=o.left)
        parts.append(f"rank {o.rank} hung: it never reached collective {coll(o.rank, idx)} that rank(s) "
                     f"{', '.join(str(w.rank) for w in waiting) or '?'} waited in (timeout {timeout_s:g} s; it had "
                     f"completed {o.left} collective(s))")
    same: dict[str, list[int]] = {}
    for o in failed:
        line = o.error.splitlines()[0] if o.error else f"rank {o.rank} failed (exit code {o.exitcode})"
        line = re.sub(r"^rank \d+: ", "", line)
        line = re.sub(r"\[/[^\]]*\] ", "", line)  # gloo's source location
        line = re.sub(r"(\[127\.0\.0\.1\]|127\.0\.0\.1):\d+", "127.0.0.1", line)
        line = line.split(". This is typically")[0]
        same.setdefault(line, []).append(o.rank)
    for line, rs in same.items():
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
        parts.append(f"{who}: {line}")
    for o in stopped:
        if o not in hung:
            what = (f"while waiting in collective {coll(o.rank, o.current)}" if o.entered > o.left
                    else f"after {o.left} collective(s)")
            parts.append(f"rank {o.rank} was stopped {what}")
    return "; ".join(parts) or "a rank did not finish"


def _report(stage: Path, rank: int, status: Any, error: BaseException) -> None:
    """Record a rank's error for the parent (file + FAILED state)."""
    msg = str(error).strip() or type(error).__name__
    try:
        atomic_write_text(stage / ".errors" / f"rank-{rank}.txt", msg + "\n")
    finally:
        status[rank * _SLOTS + 3] = _FAILED


class _RankStatus:
    """The shared status slots of one rank, indexable as ``[entered, left, current]``."""

    def __init__(self, array: Any, rank: int):
        self.array = array
        self.base = rank * _SLOTS

    def __getitem__(self, i: int) -> int:
        return self.array[self.base + i]

    def __setitem__(self, i: int, v: int) -> None:
        self.array[self.base + i] = v


# ----------------------------------------------------------------------------------------------
# Replay
# ----------------------------------------------------------------------------------------------


def _build_groups(trace: Any, rank: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Create the trace's process groups on every rank (same order everywhere); returns
    ``({pg_name: group or None for the default}, described)``.

    Each rank contributes the groups its trace records; the union (by name) is created in name
    order with ``new_group`` (a collective over the default group). A group over every rank is
    the default group.
    """
    import torch.distributed as dist

    from .replay.collectives import process_groups

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


def _check_schedules(specs: dict[int, Any], rank: int) -> None:
    """Every rank must issue the same kinds of collective in the same order on each group."""
    import torch.distributed as dist

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


def _replay_rank(rank: int, world: int, job: dict[str, Any], status_array: Any) -> None:
    """One rank of a multi-rank replay (runs in a spawned process)."""
    stage = Path(job["stage"])
    status = _RankStatus(status_array, rank)
    try:
        _replay_rank_body(rank, world, job, status, stage)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        _report(stage, rank, status_array, exc)
        _write_rank_error(stage, rank, job, exc)
        _exit_now(1)
    status_array[rank * _SLOTS + 3] = _DONE


def _exit_now(code: int) -> None:
    sys.stderr.flush()
    os._exit(code)


def _rank_process_setup() -> None:
    """What a replaying rank process needs beyond the single-process replay: ``fsdp::*`` operators
    (FSDP2's copy-in/out ops) register when torch's FSDP is imported."""
    import torch.distributed.fsdp  # noqa: F401 - registers the fsdp:: operators


def _replay_rank_body(rank: int, world: int, job: dict[str, Any], status: _RankStatus, stage: Path) -> None:
    import torch
    import torch.distributed as dist

    _rank_process_setup()

    from . import progress
    from .replay import collectives as coll
    from .replay import executor as ex
    from .replay.plan import normalise, plan_from_path
    from .replay.run import replay
    from .trace import load_trace

    torch.set_num_threads(int(job["threads"]))
    if rank != 0 or job.get("quiet"):
        progress.set_enabled(False)
    status[3] = _RUNNING
    device = _rank_device(job["device"], rank)
    _init_group(job["store_port"], rank, world, job["backend"], float(job["timeout"]), device)
    sources = {int(k): Path(v) for k, v in job["sources"].items()}
    synthetic = rank not in sources
    template = min(sources)
    src = sources.get(rank, sources[template])
    trace = load_trace(src)
    plan, _kind = plan_from_path(src, job.get("iteration"))
    specs = coll.comm_specs(trace, plan)
    out_dir = stage / f"rank-{rank}"
    if synthetic:
        specs = coll.mirror_for_peer(specs, template, rank, world)
        keep = {op["node_id"] for op in plan.ops if op["node_id"] in specs}
        plan.data["ops"] = [op for op in plan.ops if op["node_id"] in keep]
        plan.metadata["original_step_ms"] = None
        plan.metadata["source"] = f"synthetic peer of rank {template}"
        normalise(plan)
    dropped = drop_unrunnable_inputs(plan, device)
    plan_dir = stage / ".plans" / f"rank-{rank}"
    plan_dir.mkdir(parents=True, exist_ok=True)
    plan.save(plan_dir / "benchmark.json")
    src = plan_dir / "benchmark.json"
    atomic_write_text(stage / ".errors" / f"rank-{rank}.schedule.json",
                      json.dumps([s.describe() for s in specs.values() if s.kind != "wait"]))
    groups, described = _build_groups(trace, rank)
    _check_schedules(specs, rank)
    runner = coll.CollectiveRunner(specs, groups, rank, world, device, status=status)
    runner.backend = job["backend"]
    ex.COLLECTIVE_HANDLER = runner.handler
    t0 = time.perf_counter()
    summary, _df = replay(src, out_dir, device=device, iters=int(job["iters"]), warmup=int(job["warmup"]),
                          iteration=None, force=True,
                          seed=int(job["seed"]) + rank)
    runner.drain()
    wall = time.perf_counter() - t0
    rows = runner.rows(synthetic=synthetic)
    waits = sum(1 for s in specs.values() if s.kind == "wait")
    total = sum(1 for op in plan.ops if op.get("reason") == "collective") - waits
    replayed = sum(1 for r in rows if r["calls"] > 0)
    _write_csv(out_dir / "collectives.csv", rows, coll.COLLECTIVE_COLUMNS)
    info = {"rank": rank, "world_size": world, "backend": job["backend"], "device": device,
            "synthetic": synthetic, "source": str(sources.get(rank, "")) if not synthetic else "",
            "template_rank": template if synthetic else None, "process_groups": described,
            "collectives_total": total, "collectives_replayed": replayed,
            "waits": waits, "wall_s": wall, "inputs_not_materialised_bytes": dropped}
    atomic_write_text(out_dir / "rank.json", json.dumps(info, indent=2, default=str) + "\n")
    del summary
    dist.barrier()
    dist.destroy_process_group()


def drop_unrunnable_inputs(plan: Any, device: str = "cpu") -> int:
    """Stop materialising inputs that only ops which cannot run here read; returns their bytes.

    An op that cannot run here (skipped by the plan for another reason than being a collective,
    or whose operator this torch lacks: a custom op whose package is absent, e.g. fbgemm) is
    never called, so its tensor arguments whose storage no other op
    touches need no memory: they are replaced by None in its arguments (its recorded outputs
    stay, synthesised for the ops that read them). PARAM's DLRM ranks would otherwise each hold
    two 2.4 GB embedding tables that only ``fbgemm::split_embedding_codegen_lookup_*`` reads.
    """
    from .replay import executor as ex
    from .replay.plan import normalise

    tensors = {t["id"]: t for t in plan.tensors}
    users: dict[int, set[int]] = {}
    for op in plan.ops:
        for tid in ex._op_tensor_ids(op):
            users.setdefault(tensors[tid]["storage"], set()).add(op["index"])
    import torch

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
        from .results import Results, RunContext, write_csv

        out = stage / f"rank-{rank}"
        out.mkdir(parents=True, exist_ok=True)
        msg = str(exc).strip() or type(exc).__name__
        atomic_write_text(out / "error.json", json.dumps({"rank": rank, "error": msg}, indent=2) + "\n")
        res = Results(RunContext(device=job["device"]), "distributed")
        res.add("rank_completed", f"rank-{rank}", "completed", 0, status="error", detail=msg)
        write_csv(res.frame(), out / "results.csv")
    except Exception:  # noqa: BLE001 - best effort: the parent reports the error anyway
        pass


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else
                        (f"{v:.6g}" if isinstance(v, float) else v)) for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())


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
    timeout: float = DEFAULT_TIMEOUT_S,
    threads: int = 1,
) -> tuple[dict[str, Any], Any]:
    """Replay a multi-rank trace with one process per rank; returns ``(summary, results DataFrame)``.

    ``source``: a folder of ``rank-K/`` trace dirs or of per-rank ET files, or one trace (dir or
    file) with ``world_size`` > 1 (it replays as rank 0; the other ranks are synthetic peers).
    Raises :class:`DistributedFailure` (after writing what the ranks produced) when a rank died,
    failed or hung; UsageError for bad input; EnvironmentUnsupported for an unknown backend.
    """
    import torch.distributed as dist

    from .targets import check_device

    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    if timeout <= 0:
        raise UsageError("--timeout must be positive")
    if not dist.is_available():
        raise EnvironmentUnsupported("this torch build has no torch.distributed")
    check_device(device)
    backend = backend or default_backend(device)
    if backend not in ("gloo", "nccl", "mpi", "ucc", "xccl"):
        raise UsageError(f"unknown backend {backend!r}; expected gloo or nccl")
    if backend == "nccl" and not dist.is_nccl_available():
        raise EnvironmentUnsupported("backend nccl is not available in this torch build")
    if backend == "gloo" and not dist.is_gloo_available():
        raise EnvironmentUnsupported("backend gloo is not available in this torch build")
    rs = find_rank_sources(source)
    src = Path(source)
    if rs is None:
        if not src.exists():
            raise UsageError(f"{src} does not exist")
        rs = RankSet({0: src}, src)
    recorded = _recorded_world(rs)
    world = world_size or max(len(rs.sources), max(rs.sources) + 1, recorded or 1)
    if world < max(rs.sources) + 1:
        raise UsageError(f"--world-size {world} is smaller than the ranks found ({', '.join(map(str, rs.ranks))})")
    if world < 2:
        raise UsageError(f"{src} holds one rank of a one-rank job: replay it without --world-size")
    check_output_dir(out_dir, force)
    progress = Progress("distributed")
    peers = [r for r in range(world) if r not in rs.sources]
    progress.note(f"{world} ranks on {backend} ({len(rs.sources)} from traces"
                  + (f", synthetic peers {peers}" if peers else "") + f"); timeout {timeout:g} s")
    with staged_output_dir(out_dir, force) as stage:
        store = _free_store(world, timeout)
        job = {"stage": str(stage), "store_port": store.port, "sources": {str(k): str(v) for k, v in rs.sources.items()},
               "device": device, "backend": backend, "iters": iters, "warmup": warmup, "iteration": iteration,
               "seed": seed, "timeout": timeout, "threads": threads, "quiet": not _progress_enabled()}
        res = _launch(_replay_rank, world, job, timeout, progress, "replay")
        del store
        summary, df = merge_replay(stage, world, backend, device, res, timeout)
        failure = None if res.ok else failure_message(res, stage, timeout)
        for extra in stage.iterdir():  # watchdog files, synthetic peers' plans, killed ranks' staging
            if extra.name.startswith("."):
                shutil.rmtree(extra, ignore_errors=True)
    if failure:
        raise DistributedFailure(f"{failure} (results of the other ranks are in {out_dir})")
    crit = summary["replay_step_ms"]
    progress.note(f"critical-path step {crit:.3f} ms over {world} ranks; "
                  f"{summary['collectives']['replayed']}/{summary['collectives']['total']} collectives replayed")
    return summary, df


def _recorded_world(rs: RankSet) -> int | None:
    from .replay.collectives import world_size_of
    from .trace import load_trace

    src = rs.sources[min(rs.sources)]
    if src.is_dir() and (src / "benchmark.json").exists():
        return None
    try:
        return world_size_of(load_trace(src))
    except MystiqueError:
        return None


def _read_csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    if not path.exists():
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def merge_replay(stage: Path, world: int, backend: str, device: str, res: LaunchResult,
                 timeout: float) -> tuple[dict[str, Any], Any]:
    """Write ``collectives.csv``, ``summary.json`` and ``results.csv`` of the whole run into ``stage``.

    ``summary.json`` holds DESIGN.md's keys summed (counts) or taken over the real ranks
    (``replay_step_ms`` and ``original_step_ms``: the slowest rank's, the critical path; ``ratio``
    their quotient), and ``ranks`` (per rank: its summary, ``synthetic``, state), ``world_size``,
    ``backend``, ``collectives`` (``total``, ``replayed``, ``coverage``, ``by_kind``).
    Returns ``(summary, results DataFrame)``.
    """
    from .replay.collectives import COLLECTIVE_COLUMNS, bandwidth
    from .results import Results, RunContext, concat, read_csv, write_csv

    ranks: dict[str, Any] = {}
    coll_rows: list[dict[str, Any]] = []
    frames = []
    real_summaries = []
    coll_total = coll_replayed = 0
    for r in range(world):
        d = stage / f"rank-{r}"
        info = {}
        if (d / "rank.json").exists():
            info = json.loads((d / "rank.json").read_text(encoding="utf-8"))
        summ = json.loads((d / "summary.json").read_text(encoding="utf-8")) if (d / "summary.json").exists() else None
        outcome = res.outcomes.get(r)
        entry = {"state": outcome.state if outcome else "unknown", "synthetic": bool(info.get("synthetic")),
                 "summary": summ, "collectives_total": info.get("collectives_total"),
                 "collectives_replayed": info.get("collectives_replayed"), "source": info.get("source"),
                 "process_groups": info.get("process_groups")}
        if outcome and outcome.error:
            entry["error"] = outcome.error.splitlines()[0]
        ranks[str(r)] = entry
        if (d / "results.csv").exists():
            try:
                df = read_csv(d / "results.csv")
                df["subject"] = [f"rank-{r}/{s}" for s in df["subject"]]
                frames.append(df)
            except UsageError:
                pass
        rows = _read_csv_rows(d / "collectives.csv")
        coll_rows.extend(rows)
        if not info.get("synthetic"):
            for row in rows:
                entry.setdefault("by_kind", {})
                entry["by_kind"][row["kind"]] = entry["by_kind"].get(row["kind"], 0) + 1
            if summ is not None:
                real_summaries.append((r, summ))
            coll_total += int(info.get("collectives_total") or 0)
            coll_replayed += int(info.get("collectives_replayed") or 0)
    _write_csv(stage / "collectives.csv", coll_rows, COLLECTIVE_COLUMNS)
    for r, e in ranks.items():
        d = stage / f"rank-{r}"
        if e["state"] != "done" and not (d / "error.json").exists():
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_text(d / "error.json", json.dumps({"rank": int(r), "state": e["state"],
                                                           "error": e.get("error", "")}, indent=2) + "\n")
    ctx = RunContext(device=device, device_name=_device_name(device), torch_version=_torch_version())
    res_d = Results(ctx, "distributed")
    summary = _merge_summaries(real_summaries, world, backend, ranks, coll_total, coll_replayed)
    n_real = sum(1 for e in ranks.values() if not e["synthetic"])
    ok_cov = coll_total > 0 and coll_replayed == coll_total
    res_d.add("collectives_replayed", f"{world} ranks", "coverage", summary["collectives"]["coverage"],
              threshold=1.0, status="pass" if ok_cov else "fail",
              detail=f"{coll_replayed}/{coll_total} collectives of the {n_real} traced rank(s) replayed on {backend}")
    for r, e in ranks.items():
        if e["state"] != "done":
            res_d.add("rank_completed", f"rank-{r}", "completed", 0, status="error",
                      detail=e.get("error") or f"rank {r} {e['state']} (timeout {timeout:g} s)")
    if summary["replay_step_ms"] is not None and math.isfinite(summary["replay_step_ms"]):
        res_d.add("critical_path_step_time", f"{world} ranks", "median_ms", summary["replay_step_ms"], unit="ms",
                  status="info", detail=f"slowest rank: rank {summary['critical_rank']}")
    if summary["ratio"] is not None:
        # two medians measured at different times, in different processes: a measurement, never a
        # verdict (measure_fidelity times both side by side and gives one from its interval)
        res_d.add("critical_path_step_time_ratio", f"{world} ranks", "ratio", summary["ratio"], status="info",
                  detail=f"recorded (not paired): replay {summary['replay_step_ms']:.3f} ms / captured "
                         f"{summary['original_step_ms']:.3f} ms (max over ranks), measured at different times: "
                         f"no verdict")
    by_index: dict[str, list[dict[str, str]]] = {}
    for row in coll_rows:
        by_index.setdefault(row["index"], []).append(row)
    for idx in sorted(by_index, key=lambda x: int(x)):
        rows = by_index[idx]
        times = [_num(r["time_us"]) for r in rows if math.isfinite(_num(r["time_us"]))]
        r0 = rows[0]
        if not times:
            res_d.add("collective_bus_bandwidth", f"#{idx} {r0['kind']}", "busbw_gbps", None, status="error",
                      detail=f"{r0['name']}: not completed on any rank")
            continue
        slowest = max(times)
        size = int(_num(r0["size_bytes"]) or 0)
        n = int(_num(r0["pg_size"]) or world)
        alg, bus = bandwidth(r0["kind"], size, slowest * 1e-6, n)
        res_d.add("collective_bus_bandwidth", f"#{idx} {r0['kind']}", "busbw_gbps", bus, unit="GB/s",
                  dtype=r0["dtype"], status="pass",
                  detail=f"{r0['name']} on pg {r0['pg_name']} ({n} ranks), {size} B, slowest rank {slowest:.1f} us, "
                         f"algbw {alg:.4g} GB/s ({r0['mode']}; nccl-tests conventions)")
    frames.append(res_d.frame())
    df = concat(frames)
    write_csv(df, stage / "results.csv")
    atomic_write_text(stage / "summary.json", json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
    return summary, df


def _merge_summaries(real: list[tuple[int, dict[str, Any]]], world: int, backend: str, ranks: dict[str, Any],
                     coll_total: int, coll_replayed: int) -> dict[str, Any]:
    ops_total = sum(int(s["ops_total"]) for _, s in real)
    ops_replayed = sum(int(s["ops_replayed"]) for _, s in real)
    skipped: dict[str, int] = {}
    for _, s in real:
        for k, v in (s.get("ops_skipped") or {}).items():
            skipped[k] = skipped.get(k, 0) + int(v)
    cbt = [(float(s["coverage_by_time"]), int(s["ops_total"])) for _, s in real]
    steps = [(float(s["replay_step_ms"]), r) for r, s in real if s.get("replay_step_ms") is not None]
    crit_ms, crit_rank = max(steps) if steps else (math.nan, None)
    originals = [s.get("original_step_ms") for _, s in real]
    original = max(originals) if originals and all(isinstance(o, (int, float)) for o in originals) else None
    ratios_known = all(s.get("ratio") is not None for _, s in real) and real
    ratio = crit_ms / original if (original and ratios_known and math.isfinite(crit_ms)) else None
    kinds: dict[str, int] = {}
    for e in ranks.values():
        for k, v in (e.get("by_kind") or {}).items():
            kinds[k] = kinds.get(k, 0) + v
    return {
        "ops_total": ops_total,
        "ops_replayed": ops_replayed,
        "ops_skipped": dict(sorted(skipped.items())),
        "coverage": ops_replayed / ops_total if ops_total else 1.0,
        "coverage_by_time": (sum(c * n for c, n in cbt) / sum(n for _, n in cbt)) if cbt and sum(n for _, n in cbt)
        else 1.0,
        "original_step_ms": original,
        "replay_step_ms": crit_ms if math.isfinite(crit_ms) else None,
        "ratio": ratio,
        "ratio_kind": "recorded" if ratio is not None else None,
        "world_size": world,
        "backend": backend,
        "critical_rank": crit_rank,
        "per_rank_step_ms": {str(r): ms for ms, r in sorted(steps, key=lambda x: x[1])},
        "collectives": {"total": coll_total, "replayed": coll_replayed,
                        "coverage": coll_replayed / coll_total if coll_total else 1.0, "by_kind": kinds},
        "ranks": ranks,
    }


def _progress_enabled() -> bool:
    from . import progress

    return bool(progress._ENABLED)


def _device_name(device: str) -> str:
    from .targets import device_info

    try:
        return device_info(device).name
    except Exception:  # noqa: BLE001
        return ""


def _torch_version() -> str:
    import torch

    return torch.__version__


# ----------------------------------------------------------------------------------------------
# Capture
# ----------------------------------------------------------------------------------------------


PARALLEL = ("ddp", "fsdp", "none")


def _wrap_step(step: Any, parallel: str, device: str) -> Any:
    """The workload step with its model under DDP or FSDP2 (the optimizer rebuilt for FSDP)."""
    from . import workloads

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
    from .workloads.base import step_function

    step.model, step.optimizer = model, opt
    step.fn = step_function(mod, model, step.batch, opt, step.mode)
    return step


def model_device_index(device: str) -> int:
    import torch

    d = torch.device(device)
    return d.index if d.index is not None else 0


def _capture_rank(rank: int, world: int, job: dict[str, Any], status_array: Any) -> None:
    """One rank of a multi-rank capture (spawned process)."""
    stage = Path(job["stage"])
    try:
        status_array[rank * _SLOTS + 3] = _RUNNING
        _init_group(job["store_port"], rank, world, job["backend"], float(job["timeout"]),
                    _rank_device(job["device"], rank))
        capture_rank(rank, world, job, stage / f"rank-{rank}")
    except BaseException as exc:  # noqa: BLE001
        _report(stage, rank, status_array, exc)
        _exit_now(1)
    status_array[rank * _SLOTS + 3] = _DONE


def capture_rank(rank: int, world: int, job: dict[str, Any], out: Path) -> dict[str, Any]:
    """Capture this rank (the process group is up) into ``out``; returns its ``capture.json``."""
    import platform
    import socket

    import torch
    import torch.distributed as dist

    from . import capture as cap
    from . import progress as prog
    from .results import Results, RunContext, utc_now, write_csv
    from .targets import Target

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    if rank != 0 or job.get("quiet"):
        prog.set_enabled(False)
    device = _rank_device(job["device"], rank)
    target = Target(device)
    progress = Progress(f"capture rank {rank}")
    from . import workloads

    parallel = job["parallel"]
    if job["target"] in workloads.names():
        try:
            full = workloads.make_step(job["target"], job["config"], job["mode"], device=device,
                                       dtype=getattr(torch, job["dtype"]), seed=int(job["seed"]))
        except workloads.WorkloadTooLarge as exc:
            raise EnvironmentUnsupported(str(exc)) from exc
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        if parallel != "none":
            full = _wrap_step(full, parallel, device)
        step = full.fn
        cfg = full.config
        from dataclasses import asdict, is_dataclass

        described = {"kind": "workload", "workload": job["target"], "config": job["config"],
                     "config_values": asdict(cfg) if is_dataclass(cfg) else repr(cfg), "mode": job["mode"],
                     "batch": {k: list(v.shape) for k, v in full.batch.items()}}
    else:
        step, described = cap.resolve_step(job["target"], config=job["config"], mode=job["mode"], device=device,
                                           dtype=job["dtype"], seed=int(job["seed"]))
        parallel = "user"
    progress.note(f"{world} ranks, {job['backend']}, {parallel}: timing {job['steps']} steps")
    dist.barrier()
    timing = cap.time_step(step, target, warmup=int(job["warmup"]), iters=int(job["steps"]))
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    cap.record_step(step, target, out / cap.TRACE_FILE, out / cap.KINETO_FILE)
    dist.barrier()
    counts = cap._trace_counts(out / cap.TRACE_FILE)
    from .replay.collectives import process_groups
    from .trace import load_trace

    pgs = [vars(p) for p in process_groups(load_trace(out / cap.TRACE_FILE))]
    info = target.info()
    meta = {
        **cap.CAPTURE_FORMAT, "target": job["target"], **described, "device": device, "device_name": info.name,
        "dtype": job["dtype"] if described["kind"] == "workload" else None, "seed": int(job["seed"]),
        "torch_version": torch.__version__, "python": platform.python_version(), "host": socket.gethostname(),
        "argv": sys.argv, "created_at": utc_now(), "threads": torch.get_num_threads(), "step_time": timing,
        "files": {"trace": cap.TRACE_FILE, "kineto": cap.KINETO_FILE},
        "trace": {k: v for k, v in counts.items() if k != "op_names"},
        "distributed": {"rank": rank, "world_size": world, "backend": dist.get_backend(), "parallel": parallel,
                        "process_groups": pgs,
                        "collectives": sorted(n for n in counts["op_names"] if n.startswith(("c10d::", "_c10d")))},
    }
    atomic_write_text(out / cap.CAPTURE_FILE, json.dumps(meta, indent=2, default=str) + "\n")
    ctx = RunContext(device=device, device_name=info.name, torch_version=torch.__version__)
    res = Results(ctx, "capture")
    subject = (f"{job['target']}/{job['config']}/{job['mode']}" if described["kind"] == "workload"
               else job["target"]) + f"/rank-{rank}"
    dt = meta["dtype"] or ""
    res.add("uninstrumented_step_time", subject, "median_ms", timing["median_ms"], unit="ms", status="pass", dtype=dt,
            detail=f"{job['steps']} steps after {job['warmup']} warm-up; IQR {timing['iqr_ms']:.3f} ms; "
                   f"{parallel} on {world} ranks ({dist.get_backend()}); seed {job['seed']}")
    ok = counts["aten_ops"] > 0
    res.add("trace_recorded", subject, "aten_ops", counts["aten_ops"], status="pass" if ok else "fail", dtype=dt,
            threshold=1, detail=f"ET schema {counts['schema']}, {counts['nodes']} nodes")
    write_csv(res.frame(), out / "results.csv")
    progress.note(f"rank {rank}: step median {timing['median_ms']:.2f} ms; wrote {out}")
    return meta


def capture_distributed(
    target_name: str,
    out_dir: str | os.PathLike,
    *,
    nproc: int | None = None,
    parallel: str = "ddp",
    backend: str | None = None,
    config: str = "debug",
    mode: str = "train",
    device: str = "cpu",
    dtype: str = "float32",
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S * 5,
    threads: int = 1,
) -> Path:
    """Capture TARGET on ``nproc`` ranks into ``out_dir/rank-K/`` (see the module docstring).

    Under torchrun (``RANK``/``WORLD_SIZE`` set) this process is one rank: it joins the group
    torchrun set up (``env://``) and writes only its own ``rank-K/``. Returns the folder.
    """
    from .targets import check_device

    if mode not in ("train", "infer"):
        raise UsageError(f"unknown mode {mode!r}; expected train or infer")
    if parallel not in PARALLEL:
        raise UsageError(f"unknown parallelism {parallel!r}; expected one of {', '.join(PARALLEL)}")
    if steps < 1 or warmup < 0:
        raise UsageError("--steps must be at least 1 and --warmup at least 0")
    check_device(device)
    backend = backend or default_backend(device)
    job = {"target": target_name, "config": config, "mode": mode, "device": device, "dtype": dtype,
           "steps": steps, "warmup": warmup, "seed": seed, "parallel": parallel, "backend": backend,
           "timeout": timeout, "threads": threads}
    env = torchrun_env()
    if env is not None and not nproc:
        return _capture_under_torchrun(env, job, Path(out_dir), force)
    if not nproc or nproc < 2:
        raise UsageError("--nproc must be at least 2 for a multi-rank capture")
    if parallel == "fsdp" and mode != "train":
        raise UsageError("--parallel fsdp captures training steps (--mode train)")
    check_output_dir(out_dir, force)
    progress = Progress("capture")
    progress.note(f"{nproc} ranks on {backend}, {parallel}: {target_name} ({config}, {mode}) on {device}")
    with staged_output_dir(out_dir, force) as stage:
        store = _free_store(nproc, timeout)
        job.update(stage=str(stage), store_port=store.port, quiet=not _progress_enabled())
        res = _launch(_capture_rank, nproc, job, timeout, progress, "capture")
        del store
        if not res.ok:
            raise DistributedFailure(f"capture failed: {failure_message(res, stage, timeout)}")
        shutil.rmtree(stage / ".errors", ignore_errors=True)
        _merge_capture(stage, nproc, job)
    progress.note(f"wrote {out_dir} ({nproc} rank trace dirs)")
    return Path(out_dir)


def _capture_under_torchrun(env: tuple[int, int], job: dict[str, Any], out: Path, force: bool) -> Path:
    import torch.distributed as dist

    rank, world = env
    rank_dir = out / f"rank-{rank}"
    check_output_dir(rank_dir, force)
    if not dist.is_initialized():
        from datetime import timedelta

        dev = _rank_device(job["device"], int(os.environ.get("LOCAL_RANK", rank)))
        if dev.startswith("cuda"):
            import torch

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
    from .results import concat, read_csv, write_csv

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
# Side-by-side fidelity: the captured step and its replay, interleaved in the same rank processes
# ----------------------------------------------------------------------------------------------


def _fidelity_rank(rank: int, world: int, job: dict[str, Any], status_array: Any) -> None:
    """Rebuild the captured (DDP/FSDP) step and the replay of this rank's trace; time them interleaved."""
    stage = Path(job["stage"])
    try:
        status_array[rank * _SLOTS + 3] = _RUNNING
        device = _rank_device(job["device"], rank)
        _init_group(job["store_port"], rank, world, job["backend"], float(job["timeout"]), device)
        result = _fidelity_body(rank, world, job, device, _RankStatus(status_array, rank))
        atomic_write_text(stage / f"fidelity-rank-{rank}.json", json.dumps(result) + "\n")
    except BaseException as exc:  # noqa: BLE001
        _report(stage, rank, status_array, exc)
        _exit_now(1)
    status_array[rank * _SLOTS + 3] = _DONE


def _fidelity_body(rank: int, world: int, job: dict[str, Any], device: str, status: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    _rank_process_setup()

    from . import progress, workloads
    from .replay import collectives as coll
    from .replay import executor as ex
    from .replay.plan import plan_from_path
    from .replay.run import make_executor
    from .targets import synchronize
    from .trace import load_trace

    torch.set_num_threads(int(job["threads"]))
    progress.set_enabled(False)
    src = Path(job["sources"][str(rank)])
    meta = json.loads((src / "capture.json").read_text(encoding="utf-8"))
    step = workloads.make_step(meta["workload"], meta["config"], meta["mode"], device=device,
                               dtype=getattr(torch, meta["dtype"]), seed=int(meta.get("seed", 0)))
    parallel = meta.get("distributed", {}).get("parallel", "ddp")
    if parallel in ("ddp", "fsdp"):
        step = _wrap_step(step, parallel, device)
    trace = load_trace(src)
    plan, _ = plan_from_path(src)
    specs = coll.comm_specs(trace, plan)
    groups, _ = _build_groups(trace, rank)
    runner = coll.CollectiveRunner(specs, groups, rank, world, device, status=status)
    runner.backend = job["backend"]
    ex.COLLECTIVE_HANDLER = runner.handler
    e = make_executor(plan, device, seed=int(job["seed"]) + rank)
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


def measure_fidelity(capture_dir: str | os.PathLike, *, iters: int = 10, warmup: int = 2, device: str = "cpu",
                     backend: str | None = None, seed: int = 0, timeout: float = DEFAULT_TIMEOUT_S,
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
    import tempfile

    from .timing import median_interval, verdict

    rs = find_rank_sources(capture_dir)
    if rs is None or not all((p / "capture.json").exists() for p in rs.sources.values()):
        raise UsageError(f"{capture_dir} is not a multi-rank capture (rank-K/ folders with capture.json)")
    world = len(rs.sources)
    backend = backend or default_backend(device)
    progress = Progress("fidelity")
    with tempfile.TemporaryDirectory(prefix="mystique-fidelity.") as tmp:
        store = _free_store(world, timeout)
        job = {"stage": tmp, "store_port": store.port, "sources": {str(k): str(v) for k, v in rs.sources.items()},
               "device": device, "backend": backend, "iters": iters, "warmup": warmup, "seed": seed,
               "timeout": timeout, "threads": threads}
        res = _launch(_fidelity_rank, world, job, timeout, progress, "fidelity")
        del store
        if not res.ok:
            raise DistributedFailure(failure_message(res, Path(tmp), timeout))
        per_rank = {}
        raw = []
        for r in range(world):
            d = json.loads((Path(tmp) / f"fidelity-rank-{r}.json").read_text(encoding="utf-8"))
            raw.append(d)
            per_rank[str(r)] = {"captured_ms": statistics.median(d["captured_ms"]),
                                "replayed_ms": statistics.median(d["replayed_ms"])}
    cap_ms = max(v["captured_ms"] for v in per_rank.values())
    rep_ms = max(v["replayed_ms"] for v in per_rank.values())
    n = min(len(d["captured_ms"]) for d in raw)
    ratios = [max(d["replayed_ms"][i] for d in raw) / max(d["captured_ms"][i] for d in raw) for i in range(n)]
    lo, hi = median_interval(ratios)
    return {"world_size": world, "captured_ms": cap_ms, "replayed_ms": rep_ms,
            "ratio": statistics.median(ratios) if ratios else math.nan, "ratio_low": lo, "ratio_high": hi,
            "ratio_kind": "paired", "ratios": ratios, "verdict": verdict(lo, hi, STEP_RATIO_LOW, STEP_RATIO_HIGH),
            "per_rank": per_rank}
