"""Process spawning for a multi-rank run: the rendezvous store, one process per rank, the watchdog.

Processes are started with the ``spawn`` method; the parent holds the rendezvous store
(``torch.distributed.TCPStore`` on 127.0.0.1 and a free port) so that any rank may die without
taking it down. Process groups get ``timeout`` seconds. :func:`run` runs ``body(rank, world,
job, status)`` in every rank; each rank's shared status slots (``entered``, ``left``, ``current``
collective, ``state``) let the watchdog end a run whose rank died, failed or hung (a collective
waited in for longer than the timeout), after the other ranks wrote what they had;
:func:`failure_message` names the rank and the collective.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..errors import MystiqueError
from ..io import atomic_write_text
from ..progress import Progress

DEFAULT_TIMEOUT_S = 60.0
# per-rank shared status slots: collectives entered, collectives left, current collective, state
_SLOTS = 4
_STARTING, _RUNNING, _DONE, _FAILED = 0, 1, 2, 3
_GRACE_S = 5.0


class DistributedFailure(MystiqueError):
    """A rank died, failed or hung: the message names the rank and the collective (exit 1)."""

    exit_code = 1


def free_store(world: int, timeout_s: float) -> Any:
    """The rendezvous store, held by this (parent) process on 127.0.0.1 and a free port."""
    return dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=max(timeout_s, 30.0)),
                         wait_for_workers=False)


def default_backend(device: str) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.split(":")[0] == "cuda" else "gloo"


def rank_device(device: str, rank: int) -> str:
    """Rank K's device: ``cuda:K mod count`` when ``device`` is ``cuda`` without an index."""
    if device == "cuda":
        n = torch.cuda.device_count()
        return f"cuda:{rank % max(n, 1)}"
    return device


def init_group(job: dict[str, Any], rank: int, world: int) -> str:
    """Join the default process group through the parent's store (``job["store_port"]``); returns
    this rank's device."""
    device = rank_device(job["device"], rank)
    timeout_s = float(job["timeout"])
    store = dist.TCPStore("127.0.0.1", job["store_port"], world + 1, False,
                          timeout=timedelta(seconds=max(timeout_s, 30.0)))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(job["backend"], store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    return device


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


class RankStatus:
    """The shared status slots of one rank, indexable as ``[entered, left, current, state]``."""

    def __init__(self, array: Any, rank: int):
        self.array = array
        self.base = rank * _SLOTS

    def __getitem__(self, i: int) -> int:
        return self.array[self.base + i]

    def __setitem__(self, i: int, v: int) -> None:
        self.array[self.base + i] = v


def run(body: Callable[[int, int, dict[str, Any], RankStatus], None], world: int, job: dict[str, Any],
        timeout_s: float, progress: Progress, label: str) -> LaunchResult:
    """Run ``body(rank, world, job, status)`` (a module-level function) in ``world`` spawned processes
    and watch them; this process holds the rendezvous store meanwhile (``job["store_port"]``).

    The watchdog ends the run when a rank died (exit without reporting), failed (reported an
    error), or when a collective has been waited in for ``timeout_s`` plus a grace period (the
    ranks not in it hung); the other ranks then get the grace period to finish or fail on their
    process-group timeout before they are terminated.
    """
    store = free_store(world, timeout_s)
    job["store_port"] = store.port
    try:
        return _spawn_and_watch(body, world, job, timeout_s, progress, label)
    finally:
        del store


def _spawn_and_watch(body: Callable[..., None], world: int, job: dict[str, Any], timeout_s: float,
                     progress: Progress, label: str) -> LaunchResult:
    ctx = mp.get_context("spawn")
    status = ctx.Array("q", world * _SLOTS, lock=False)
    (Path(job["stage"]) / ".errors").mkdir(parents=True, exist_ok=True)
    procs = []
    t0 = time.perf_counter()
    for r in range(world):
        p = ctx.Process(target=_rank_entry, args=(body, r, world, job, status), name=f"mystique-{label}-rank-{r}",
                        daemon=False)
        p.start()
        procs.append(p)
    watch = _Watch(procs, [RankStatus(status, r) for r in range(world)], Path(job["stage"]) / ".errors")
    last_note = time.perf_counter()
    try:
        while True:
            now = time.perf_counter()
            alive = watch.poll(now)
            if alive == 0:
                break
            if watch.waited_out(now, timeout_s):
                watch.stop_the_rest()
                break
            if now - last_note > 30.0:
                states = ", ".join(f"rank {r}: {s[1]} collectives" for r, s in enumerate(watch.status))
                progress.note(f"{label}: {alive} rank(s) running ({states})")
                last_note = now
            time.sleep(0.05)
    except BaseException:
        for p in procs:
            _terminate(p)
        raise
    for p in procs:
        p.join(timeout=5)
    watch.res.wall_s = time.perf_counter() - t0
    return watch.res


class _Watch:
    """The watchdog's view of the rank processes: their outcomes and who waits in a collective since when."""

    def __init__(self, procs: list[Any], status: list[RankStatus], errors_dir: Path):
        self.procs, self.status, self.errors_dir = procs, status, errors_dir
        self.res = LaunchResult()
        self.entered_since: dict[int, tuple[int, float]] = {}
        self.first_bad: float | None = None

    def poll(self, now: float) -> int:
        """Record the outcome of ranks that exited; returns how many still run."""
        alive = 0
        for r, p in enumerate(self.procs):
            s = self.status[r]
            if r in self.res.outcomes:
                continue
            if p.exitcode is None:
                alive += 1
                if s[0] > s[1]:
                    prev = self.entered_since.get(r)
                    if prev is None or prev[0] != s[0]:
                        self.entered_since[r] = (s[0], now)
                else:
                    self.entered_since.pop(r, None)
                continue
            err_file = self.errors_dir / f"rank-{r}.txt"
            err = err_file.read_text(encoding="utf-8").strip() if err_file.exists() else ""
            state = "done" if s[3] == _DONE and p.exitcode == 0 else ("failed" if s[3] == _FAILED else "died")
            self.res.outcomes[r] = RankOutcome(r, state, p.exitcode, err, s[0], s[1], s[2])
            if state != "done" and self.first_bad is None:
                self.first_bad = now
        return alive

    def waited_out(self, now: float, timeout_s: float) -> bool:
        """A collective waited in past the timeout, or a rank went bad more than the grace ago."""
        if any(now - since > timeout_s + _GRACE_S for _e, since in self.entered_since.values()):
            return True
        return self.first_bad is not None and now - self.first_bad > 2 * _GRACE_S

    def stop_the_rest(self) -> None:
        for r, p in enumerate(self.procs):
            if r in self.res.outcomes:
                continue
            s = self.status[r]
            ent, left = s[0], s[1]
            _terminate(p)
            self.res.outcomes[r] = RankOutcome(r, "stopped", p.exitcode, "", ent, left, s[2])


def _terminate(p: Any) -> None:
    if p.exitcode is not None:
        return
    p.terminate()
    p.join(timeout=3)
    if p.exitcode is None and p.pid is not None:
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=3)


def _rank_entry(body: Callable[..., None], rank: int, world: int, job: dict[str, Any], status_array: Any) -> None:
    """A spawned rank: run ``body``; an error of any kind is reported to the parent (file + FAILED state)."""
    stage = Path(job["stage"])
    status = RankStatus(status_array, rank)
    try:
        status[3] = _RUNNING
        body(rank, world, job, status)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        msg = str(exc).strip() or type(exc).__name__
        try:
            atomic_write_text(stage / ".errors" / f"rank-{rank}.txt", msg + "\n")
        finally:
            status[3] = _FAILED
        sys.stderr.flush()
        os._exit(1)
    status[3] = _DONE


def write_schedule(stage: Path, rank: int, described: list[str]) -> None:
    """The rank's collectives in order (one line each), which :func:`failure_message` names."""
    atomic_write_text(stage / ".errors" / f"rank-{rank}.schedule.json", json.dumps(described))


def _schedule(stage: Path, rank: int) -> list[str]:
    f = stage / ".errors" / f"rank-{rank}.schedule.json"
    try:
        return list(json.loads(f.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        return []


# ----------------------------------------------------------------------------------------------
# The failure, in one line
# ----------------------------------------------------------------------------------------------


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
    parts = [_died(o, coll) for o in died]
    for o in hung:
        idx = max((w.current for w in waiting), default=o.left)
        parts.append(f"rank {o.rank} hung: it never reached collective {coll(o.rank, idx)} that rank(s) "
                     f"{', '.join(str(w.rank) for w in waiting) or '?'} waited in (timeout {timeout_s:g} s; it had "
                     f"completed {o.left} collective(s))")
    parts += _failed(failed)
    for o in stopped:
        if o not in hung:
            what = (f"while waiting in collective {coll(o.rank, o.current)}" if o.entered > o.left
                    else f"after {o.left} collective(s)")
            parts.append(f"rank {o.rank} was stopped {what}")
    return "; ".join(parts) or "a rank did not finish"


def _died(o: RankOutcome, coll: Callable[[int, int], str]) -> str:
    how = (f"killed by signal {-o.exitcode}" if o.exitcode is not None and o.exitcode < 0
           else f"exit code {o.exitcode}")
    if o.entered > o.left:
        where = f"during collective {coll(o.rank, o.current)}"
    elif o.left:
        where = f"after collective {coll(o.rank, o.left - 1)}, before collective {coll(o.rank, o.left)}"
    else:
        where = f"before its first collective {coll(o.rank, 0)}"
    return f"rank {o.rank} died ({how}) {where}"


def _failed(failed: list[RankOutcome]) -> list[str]:
    """The failed ranks' first error lines, ranks with the same error named together."""
    same: dict[str, list[int]] = {}
    for o in failed:
        line = o.error.splitlines()[0] if o.error else f"rank {o.rank} failed (exit code {o.exitcode})"
        line = re.sub(r"^rank \d+: ", "", line)
        line = re.sub(r"\[/[^\]]*\] ", "", line)  # gloo's source location
        line = re.sub(r"(\[127\.0\.0\.1\]|127\.0\.0\.1):\d+", "127.0.0.1", line)
        line = line.split(". This is typically")[0]
        same.setdefault(line, []).append(o.rank)
    out = []
    for line, rs in same.items():
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
        out.append(f"{who}: {line}")
    return out
