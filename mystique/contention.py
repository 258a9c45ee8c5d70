"""Host contention: how long this process's threads waited for a CPU (no torch).

Linux keeps, per thread, the time it spent runnable but not running: waiting on a run queue while
another task had the CPU (``/proc/<pid>/task/<tid>/schedstat``, second field, nanoseconds; kept by
the scheduler whenever the kernel has ``CONFIG_SCHED_INFO``, as distribution kernels do). That
wait is what a noisy neighbour costs a timed region: time the region's threads could have run and
did not. Sleeping, waiting on a lock or on a device is not counted, nor is the region's own work.

:class:`RunDelay` reads the waits of every thread of this process; :meth:`RunDelay.waited` returns
the seconds waited since its previous call, summed over threads (a thread that started in between
counts its whole wait, one that ended is dropped). Summing over threads over-counts when several
waited at once, so it bounds from above what the waits could have added to the region's wall time:
a region whose summed wait is at most ``eps`` of its wall time was slowed by the host by at most
``eps`` (up to cache and frequency effects of the neighbour, which no run-queue count sees).
"""

from __future__ import annotations

import os

_TASKS = "/proc/self/task"


def _read_waits() -> dict[str, int]:
    """tid -> cumulative run-queue wait (ns) of every thread of this process (threads that end while
    being read are skipped)."""
    out: dict[str, int] = {}
    for tid in os.listdir(_TASKS):
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def available() -> bool:
    """Whether this host accounts run-queue waits per thread (Linux with schedstat files)."""
    try:
        return bool(_read_waits())
    except OSError:
        return False


class RunDelay:
    """Seconds this process's threads waited for a CPU between calls of :meth:`waited`.

    ``available`` is False where the host keeps no such account (not Linux, no schedstat): then
    :meth:`waited` returns 0.0 and ``source`` says why, so callers can state that nothing was
    excluded."""

    def __init__(self) -> None:
        self.available = available()
        self.source = ("per-thread run-queue wait from /proc/self/task/*/schedstat" if self.available
                       else "no per-thread run-queue accounting on this host (no /proc/self/task/*/schedstat)")
        self._last = _read_waits() if self.available else {}

    def waited(self) -> float:
        """Seconds waited on run queues, summed over this process's threads, since the last call."""
        if not self.available:
            return 0.0
        now = _read_waits()
        last = self._last
        total = sum(ns - last.get(tid, 0) for tid, ns in now.items())
        self._last = now
        return max(total, 0) / 1e9
