"""Replaying one rank's collectives in order with its compute: :class:`CollectiveRunner`.

The runner's :meth:`~CollectiveRunner.handler` is the executor's ``collective_handler``
(``Executor(plan, device, ..., collective_handler=runner.handler)``): for each collective op of
the plan it returns the callable that issues it (:mod:`mystique.distributed.issue`), times it and
keeps the numbers for ``collectives.csv`` (:meth:`~CollectiveRunner.rows`). A collective whose
``wait`` comes later is waited there; the others block where they were issued. The shared status
slots ``[entered, left, current index]`` tell the launcher's watchdog where the rank is.

Fault injection (tests of the watchdog): ``MYSTIQUE_DIST_FAULT="die:RANK:INDEX"`` or
``"hang:RANK:INDEX"`` (:func:`parse_fault`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..replay import runtime as ex
from .collectives import CommSpec, bandwidth
from .issue import ISSUERS, CollectiveFailed, Record, issue

FAULT_ENV = "MYSTIQUE_DIST_FAULT"


class CollectiveRunner:
    """Replays the collectives of one rank's plan with ``torch.distributed``.

    ``CollectiveRunner(specs, groups, rank, world, device, status=None, fault=None, backend=None)``:
    ``groups`` maps pg name -> ProcessGroup (None: the default group); ``status`` is an optional
    shared integer array ``[entered, left, current index]`` the launcher's watchdog reads;
    ``backend`` decides which dtypes travel as bytes. ``handler(op, executor)`` returns the
    callable that replays op (or None for ops it does not know).
    """

    def __init__(self, specs: dict[int, CommSpec], groups: dict[str, Any], rank: int, world: int,
                 device: Any, status: Any = None, fault: str | None = None, backend: str | None = None):
        self.specs = specs
        self.groups = groups
        self.rank = rank
        self.world = world
        self.device = torch.device(device)
        self.status = status
        self.records: dict[int, Record] = {}
        self.pending: dict[int, tuple[Any, float, Record, list[Callable[[], None]]]] = {}
        self.calls = 0
        self.fault = parse_fault(fault, rank)
        self.backend = backend

    # -- the executor hook -----------------------------------------------------------------

    def handler(self, op: dict[str, Any], executor: Any) -> Callable[..., Any] | None:
        spec = self.specs.get(op.get("node_id"))
        if spec is None:
            return None
        rec = self.records.setdefault(spec.node_id, Record(spec))
        outputs_enc = op.get("outputs", [])
        args_enc = op.get("args", [])

        def call(*args: Any, **_kw: Any) -> Any:
            by_tid: dict[int, Any] = {}
            _zip_tensors(args_enc, list(args), by_tid)
            return self._run(spec, rec, list(args), by_tid, executor, outputs_enc)

        return call

    # -- running one collective ------------------------------------------------------------

    def _group(self, spec: CommSpec) -> Any:
        if spec.pg_name is not None and spec.pg_name in self.groups:
            return self.groups[spec.pg_name]
        return None

    def _mark(self, spec: CommSpec, entering: bool) -> None:
        if self.status is None:
            return
        if entering:
            self.status[2] = spec.index
            self.status[0] += 1
        else:
            self.status[1] += 1

    def _run(self, spec: CommSpec, rec: Record, args: list[Any], by_tid: dict[int, Any], executor: Any,
             outputs_enc: Any) -> Any:
        if spec.kind == "wait":
            self._wait(spec)
            return _mirror(outputs_enc, by_tid)
        self.calls += 1
        if self.fault is not None and self.fault[1] == spec.index:
            _inject(self.fault[0])
        self._mark(spec, True)
        t0 = time.perf_counter()
        try:
            if spec.kind not in ISSUERS:
                raise CollectiveFailed(f"rank {self.rank}: collective kind {spec.kind!r} of {spec.describe()} "
                                       f"is not replayable")
            work, finish = issue(spec, rec, self._group(spec), args, by_tid, executor, outputs_enc, self.backend,
                                 self.device)
            if spec.asynchronous and work is not None and spec.seq is not None:
                self.pending[spec.seq] = (work, t0, rec, finish)
            else:
                self._complete(spec, work, t0, rec, finish)
        except CollectiveFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure aborts the whole replay of this rank
            raise _failed(f"rank {self.rank}: collective {spec.describe()} failed", exc) from exc
        return _mirror(outputs_enc, by_tid)

    def _complete(self, spec: CommSpec, work: Any, t0: float, rec: Record, finish: list[Callable[[], None]]) -> None:
        if work is not None:
            work.wait()
        for f in finish:
            f()
        if self.device.type != "cpu":
            ex.synchronize(self.device)
        rec.times.append(time.perf_counter() - t0)
        self._mark(spec, False)

    def _wait(self, spec: CommSpec) -> None:
        entry = self.pending.pop(spec.seq, None) if spec.seq is not None else None
        if entry is None:
            return  # the wait of a collective issued before the replayed iteration
        work, t0, rec, finish = entry
        try:
            work.wait()
            for f in finish:
                f()
        except Exception as exc:  # noqa: BLE001
            raise _failed(f"rank {self.rank}: wait of collective {rec.spec.describe()} failed", exc) from exc
        rec.times.append(time.perf_counter() - t0)
        self._mark(rec.spec, False)

    def drain(self) -> None:
        """Wait for every collective still in flight (end of an iteration or of the run)."""
        for seq in list(self.pending):
            self._wait(CommSpec(node_id=-1, op_index=-1, name="wait", kind="wait", seq=seq))

    # -- results ---------------------------------------------------------------------------

    def rows(self, synthetic: bool = False) -> list[dict[str, Any]]:
        """One dict per collective (columns :data:`~mystique.distributed.collectives.COLLECTIVE_COLUMNS`),
        in plan order.

        ``time_us`` is the median over every call but the first (the probe iteration), or the
        only call; ``calls`` counts them all.
        """
        out = []
        for rec in sorted(self.records.values(), key=lambda r: r.spec.op_index):
            s = rec.spec
            if s.kind == "wait":
                continue
            times = rec.times[1:] if len(rec.times) > 1 else rec.times
            med = statistics.median(times) if times else math.nan
            group = self._group(s)
            n = dist.get_world_size(group) if dist.is_initialized() else (s.pg_size or self.world)
            alg, bus = bandwidth(s.kind, rec.size_bytes, med, n)
            out.append({
                "rank": self.rank, "index": s.index, "op_index": s.op_index, "name": s.name, "kind": s.kind,
                "pg_name": s.pg_name or "default", "pg_size": n, "dtype": s.dtype, "wire_dtype": rec.wire_dtype,
                "in_nelems": s.in_nelems, "out_nelems": s.out_nelems, "size_bytes": rec.size_bytes,
                "mode": "async" if s.asynchronous else "sync", "calls": len(rec.times),
                "time_us": med * 1e6 if math.isfinite(med) else math.nan,
                "algbw_gbps": alg, "busbw_gbps": bus, "synthetic": synthetic,
            })
        return out


def _failed(what: str, exc: Exception) -> CollectiveFailed:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CollectiveFailed(f"{what}: {type(exc).__name__}: {msg[:300]}")


def _zip_tensors(enc: Any, val: Any, out: dict[int, Any]) -> None:
    """Map plan tensor ids of an op's encoded arguments to the tensors the executor passed."""
    if isinstance(enc, dict) and "t" in enc:
        if val is not None and hasattr(val, "data_ptr"):
            out[int(enc["t"])] = val
    elif isinstance(enc, list) and isinstance(val, (list, tuple)):
        for e, v in zip(enc, val):
            _zip_tensors(e, v, out)


def _mirror(enc: Any, by_tid: dict[int, Any]) -> Any:
    """The op's result shaped like its recorded outputs: tensors we hold, None elsewhere."""
    if isinstance(enc, list):
        return [_mirror(e, by_tid) for e in enc]
    if isinstance(enc, dict) and "t" in enc:
        return by_tid.get(int(enc["t"]))
    return None


# ----------------------------------------------------------------------------------------------
# Fault injection (tests of the watchdog)
# ----------------------------------------------------------------------------------------------


def parse_fault(spec: str | None, rank: int) -> tuple[str, int] | None:
    """``"die:1:2"``: rank 1 exits abruptly when it reaches collective #2; ``"hang:1:2"``: it
    sleeps forever there. Returns ``(action, index)`` for this rank, or None."""
    spec = spec if spec is not None else os.environ.get(FAULT_ENV)
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in ("die", "hang") or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected die:RANK:INDEX or hang:RANK:INDEX")
    if int(parts[1]) != rank:
        return None
    return parts[0], int(parts[2])


def _inject(action: str) -> None:
    if action == "die":
        os._exit(17)
    while True:  # hang: a rank that never reaches the collective
        time.sleep(3600)
