"""A fleet measured at once: many simulated devices on one host, interleaved in short bursts.

A fleet measured one member after another on one host takes the host's drift for the fleet's
spread: a virtual machine's speed wanders by several percent over tens of seconds (its neighbours
on the physical machine, their memory traffic, the host's clocks), for every run alike, and a fleet
of runs spread over minutes carries that wander into the spread its limit is built from. A real
fleet is measured in one window (a synchronous job runs every device at once), where a common-mode
change of speed falls on all members alike.

:func:`measure_at_once` measures the members of a simulated fleet that way: every member (a
target, healthy or under a slowness fault, with its own executor, tensors and seed per workload)
runs its workloads' steps in bursts of about :data:`BURST_S` seconds, every member once per round
in an order shuffled each round (seeded), until each member has had its share of ``duration``. One
untimed round comes first and is discarded (caches, allocator, lazily built state), and each burst
starts with one untimed step (the caches the previous member left). Each step is timed as the
``sustained`` group times it (:func:`.timed.timed_calls`: the host-contention guard), so a member's
figures are its undisturbed steps' figures; a member with fewer than :data:`.timed.MIN_UNDISTURBED`
undisturbed steps after its share runs extra bursts on its own, up to :data:`.timed.CAP` times its
share (such bursts are no longer simultaneous with the fleet's; the row says so).

:func:`member_frame` makes one member's rows: ``host_contention``, ``step_time`` (or
``step_time_disturbed``), ``step_cv`` and ``stalls`` as :mod:`.sustained` writes them, so a member's
results.csv is a peer for ``mystique fleet`` and ``--baseline``. The drift and clock rows are not
written: a member's steps are spread over the whole window, between the other members' steps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mystique.errors import UsageError
from mystique.hostinfo import device_memory_bytes
from mystique.replay import runtime as ex
from mystique.results import Results, RunContext

from . import timed
from ._ctx import PerformanceContext
from .sustained import contention_row, distribution_rows
from .timed import CAP, MIN_UNDISTURBED, Calls, timed_calls

#: seconds of one burst: short against the tens of seconds over which a host's speed wanders, long
#: against a step (a CPU step of the small reference workloads takes milliseconds)
BURST_S = 0.25
#: the fewest rounds a member's share is split into, so that every member samples the whole window
MIN_ROUNDS = 10
#: the share of the device's available memory the members' executors may take together
MEMORY_SHARE = 0.5


@dataclass
class Member:
    """One simulated device of the fleet: its name, target, seed and, per workload subject, its
    executor and the steps measured so far."""

    name: str
    target: Any
    seed: int
    executors: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, Calls] = field(default_factory=dict)
    extra_bursts: int = 0

    def short(self) -> list[str]:
        """The subjects with fewer undisturbed steps than a figure needs."""
        return [s for s, c in self.calls.items() if len(c.undisturbed) < MIN_UNDISTURBED]


def schedule(duration: float, n_workloads: int) -> tuple[int, float]:
    """(rounds, seconds per burst) for each member to run each of ``n_workloads`` for its share of
    ``duration``: bursts of about :data:`BURST_S`, at least :data:`MIN_ROUNDS` rounds."""
    share = duration / max(n_workloads, 1)
    rounds = max(MIN_ROUNDS, math.ceil(share / BURST_S))
    return rounds, share / rounds


def build_members(specs: Sequence[tuple[str, Any, int]], benches: Sequence[Any], device: Any) -> list[Member]:
    """A :class:`Member` per ``(name, target, seed)``, with an executor per benchmark (probed under
    its target); UsageError when their plans' peak memory together exceeds :data:`MEMORY_SHARE` of
    what the device has available."""
    need = sum(int(ex.schedule(b.plan)["peak_bytes"]) for b in benches) * len(specs)
    avail = device_memory_bytes(device, available=True)
    if avail is not None and need > MEMORY_SHARE * avail:
        raise UsageError(f"{len(specs)} members need {need / 2**30:.2f} GiB of executors at once, more than "
                         f"{MEMORY_SHARE:.0%} of the {avail / 2**30:.2f} GiB available on {device}: fewer runs, "
                         "or --schedule sequential")
    members = []
    for name, target, seed in specs:
        m = Member(name, target, seed)
        for b in benches:
            e = ex.Executor(b.plan, target.device, seed=seed)
            with target.active():
                e.probe()
            m.executors[b.subject] = e
            m.calls[b.subject] = Calls(min_undisturbed=MIN_UNDISTURBED)
        members.append(m)
    return members


def _burst(m: Member, subject: str, seconds: float, t0: float, keep: bool) -> None:
    offset = timed.clock() - t0
    c = timed_calls(m.executors[subject].run_iteration, m.target, seconds=seconds, min_undisturbed=0,
                    warmup=1, min_calls=1)
    if keep:
        acc = m.calls[subject]
        acc.source = c.source
        acc.seconds += c.seconds
        acc.waited += c.waited
        acc.starts += [offset + s for s in c.starts]


def measure_at_once(members: Sequence[Member], duration: float, progress: Any, seed: int = 0) -> dict[str, Any]:
    """Run every member's workloads for its share of ``duration`` in shuffled rounds of bursts (see
    the module docstring); returns how it went (rounds, burst seconds, wall seconds, extra bursts)."""
    subjects = list(members[0].executors) if members else []
    rounds, burst = schedule(duration, len(subjects))
    rng = random.Random(seed)
    slots = [(m, s) for m in members for s in subjects]
    t0 = timed.clock()
    progress.note(f"one untimed round of {len(slots)} bursts (discarded)")
    for m, s in slots:
        _burst(m, s, burst, t0, keep=False)
    for r in range(rounds):
        progress.step(f"round {r + 1} of {rounds}: {len(slots)} bursts of {burst:.2g} s in shuffled order")
        for m, s in rng.sample(slots, len(slots)):
            _burst(m, s, burst, t0, keep=True)
    for m in members:  # the host disturbed too many of its steps: more bursts of its own, up to CAP x its share
        while m.short() and m.extra_bursts < (CAP - 1) * rounds:
            for s in m.short():
                _burst(m, s, burst, t0, keep=True)
            m.extra_bursts += 1
    return {"rounds": rounds, "burst_s": burst, "wall_s": timed.clock() - t0, "members": len(members)}


def member_frame(m: Member, how: dict[str, Any], host: str) -> pd.DataFrame:
    """The rows of one member (see the module docstring) in the results schema."""
    res = Results(RunContext.for_target(m.target), "performance")
    ctx = PerformanceContext(target=m.target, res=res, seed=m.seed, level="quick", progress=None)
    words = (f"measured at once with {how['members'] - 1} other simulated devices on this host: "
             f"{how['rounds']} rounds of {how['burst_s']:.3g} s bursts per workload, each round in a shuffled order, "
             f"{how['wall_s']:.0f} s in all"
             + (f"; {m.extra_bursts} extra rounds of its own after the fleet's, for enough undisturbed steps"
                if m.extra_bursts else "")
             + f"; {host}")
    for subject, calls in m.calls.items():
        contention_row(ctx, subject, calls)
        distribution_rows(ctx, subject, calls, words)
    return res.frame()
