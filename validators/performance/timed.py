"""Timed calls with the host-contention guard: which calls the host disturbed.

A device is judged by how fast it is, not by how busy its host was. Every timed call (a GEMM, a
copy, a workload step) is bracketed by :class:`mystique.contention.RunDelay`: the seconds this
process's threads waited on a run queue during the call, summed over threads. A call is
*undisturbed* when that wait is at most ``EPS`` of its wall time. The waits bound from above what a
neighbour's time slices added to the call (see :mod:`mystique.contention`), so an undisturbed call's
time is the device's own to within ``EPS``:

``EPS`` = 0.005 is a tenth of the fleet margin (5%, :data:`.fleet.DEFAULT_MARGIN`): the host can
move an accepted figure by at most a tenth of what the fleet verdict resolves. A quiet host stays
under it on most steps (kernel threads and this process's own sampler wake now and then).

The figures the fleet compares are computed over undisturbed calls only, and a figure with fewer
than its minimum of undisturbed calls is not compared (the row says the host was too busy); calls
are taken until the budget has passed *and* the minimum is reached, up to ``CAP`` times the budget.
Neither a neighbour's cache and memory-bandwidth use nor a hypervisor's steal time is a run-queue
wait: those stay in the figures, and the fleet's spread absorbs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mystique.contention import RunDelay

EPS = 0.005
CAP = 3.0  # the most a budget is extended to collect undisturbed calls
MAX_CALLS = 100_000
#: undisturbed workload steps needed to compare a workload's figures: the median's 95% interval needs 6;
#: with 30 it spans order statistics 10-21, a third of the steps
MIN_UNDISTURBED = 30


def clock() -> float:
    """Seconds of the timed calls' clock (``time.perf_counter``); tests replace it with a fake clock
    so that the timing logic is tested on known series, not on this host's speed."""
    return time.perf_counter()


@dataclass
class Calls:
    """Wall seconds, run-queue waits and start times (seconds since the first) of timed calls."""

    seconds: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    source: str = ""
    min_undisturbed: int = 0

    @property
    def flags(self) -> list[bool]:
        """Per call: undisturbed (its threads waited at most ``EPS`` of its wall time)."""
        return [w <= EPS * t for t, w in zip(self.seconds, self.waited)]

    @property
    def undisturbed(self) -> list[float]:
        return [t for t, ok in zip(self.seconds, self.flags) if ok]

    @property
    def elapsed(self) -> float:
        """Seconds from the first call's start to the last call's end (0 without calls)."""
        return self.starts[-1] + self.seconds[-1] if self.starts else 0.0

    @property
    def enough(self) -> bool:
        """Whether the minimum of undisturbed calls was reached."""
        return len(self.undisturbed) >= self.min_undisturbed

    @property
    def chosen(self) -> list[float]:
        """The undisturbed calls' seconds where there are enough of them, else every call's."""
        return self.undisturbed if self.enough else list(self.seconds)

    def describe(self) -> str:
        """One clause for a row's detail: how many calls were undisturbed and what that means."""
        n, k = len(self.seconds), len(self.undisturbed)
        waited = sum(self.waited)
        head = (f"{k} of {n} calls undisturbed (threads waited for a CPU at most {EPS:g} of the call; "
                f"{waited:.3g} s waited in all; {self.source})")
        if self.enough:
            return head + "; figures over the undisturbed calls"
        return head + f"; host too busy: fewer than {self.min_undisturbed} undisturbed, figures over all calls"


def timed_calls(fn: Callable[[], Any], target: Any, *, seconds: float, min_undisturbed: int,
                warmup: int = 2, min_calls: int = 6) -> Calls:
    """Call ``fn`` under ``target.active()`` (the device synchronised around each call) for ``seconds``
    after ``warmup`` untimed calls, and on until ``min_undisturbed`` calls were undisturbed, up to
    ``CAP`` x ``seconds`` (at least ``min_calls`` calls)."""
    rd = RunDelay()
    out = Calls(source=rd.source, min_undisturbed=min_undisturbed)
    clean = 0
    with target.active():
        for _ in range(warmup):
            fn()
        target.synchronize()
        t_start = clock()
        while len(out.seconds) < MAX_CALLS:
            elapsed = clock() - t_start
            if len(out.seconds) >= min_calls and (
                    (elapsed >= seconds and clean >= min_undisturbed) or elapsed >= CAP * seconds):
                break
            rd.waited()
            t0 = clock()
            fn()
            target.synchronize()
            dt = clock() - t0
            w = rd.waited()
            out.seconds.append(dt)
            out.waited.append(w)
            out.starts.append(t0 - t_start)
            clean += w <= EPS * dt
    return out
