"""What a timed step is bound by, and which of its times a fidelity verdict judges (issue 33).

**Busy fraction.** On an accelerator, ``busy = union of the device's kernel intervals / step time``:
the kernels of one iteration come from a Kineto profile of that iteration (:func:`kernel_intervals`,
overlapping kernels counted once), the step time is the side's median of the paired (uninstrumented,
CUDA-event timed) rounds, so the profiler's own host cost does not dilute the fraction. On the CPU the
host runs the operators: the step is ``host`` by definition and the fraction is n/a (None).

**Bound by** (:func:`bound_by`), from the original step's fraction where paired (the step whose
timing the replay must reproduce), else the replay's:

- ``device`` when ``busy >= BUSY_DEVICE`` (0.8): the host is at most 20% of the step's timeline.
  The verdict band is +-10%; host cadences of a replay and of eager code differ by up to about 25%
  (compiled straight-line iteration vs Python modules), and under a serial model a host difference
  ``d`` moves the step by at most ``(1 - busy) d``: ``0.2 * 0.25 = 5%``, half the band, so the device
  time decides.
- ``host`` when ``busy <= BUSY_HOST`` (0.5): the device idles at least half of the step, waiting for
  launches; the wall time is the host's launch cadence.
- ``mixed`` between: neither side alone sets the step.

**Verdict basis** (:func:`verdict_basis`): a host-bound step is judged on its host timeline (each
round's wall time between synchronisations, replay and original paired), a device-bound or mixed step
on device time (CUDA events around the step, which also hold any host gaps between kernels). On the
CPU both clocks are the wall clock: the verdict is what it was before this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..timing import Paired

BUSY_DEVICE = 0.8
BUSY_HOST = 0.5
HOST_TIMELINE = "host timeline"
DEVICE_TIME = "device time"
#: what each basis reads from the paired rounds (summary.json timing keys)
BASIS_SERIES = {HOST_TIMELINE: ("a_wall_ms", "b_wall_ms"), DEVICE_TIME: ("a_ms", "b_ms")}
BASIS_TEXT = {
    HOST_TIMELINE: "host timeline (each round's wall time between synchronisations: the launch cadence)",
    DEVICE_TIME: "device time (CUDA events around the step)",
}


def union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (any unit; overlaps counted once)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def busy_fraction(kernel_ms: Iterable[tuple[float, float]], step_ms: float | None) -> float | None:
    """``union(kernel intervals) / step_ms``, clipped to [0, 1]; None without a positive step time."""
    if step_ms is None or not math.isfinite(step_ms) or step_ms <= 0:
        return None
    return min(1.0, union_ms(kernel_ms) / step_ms)


def bound_by(busy: float | None) -> str:
    """``device``, ``host`` or ``mixed`` from a busy fraction (None: the host runs the step: ``host``)."""
    if busy is None or not math.isfinite(busy):
        return "host"
    if busy >= BUSY_DEVICE:
        return "device"
    return "host" if busy <= BUSY_HOST else "mixed"


def verdict_basis(bound: str) -> str:
    """The times a step bound by ``bound`` is judged on: the host timeline for a host-bound step."""
    return HOST_TIMELINE if bound == "host" else DEVICE_TIME


def kernel_intervals(fn: Callable[[], Any], device: str, sync: Callable[[], None]) -> list[tuple[float, float]]:
    """The device kernels' ``(start, end)`` ms of one call of ``fn`` under a Kineto profile (CUDA only)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    out = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.time_range.end > ev.time_range.start:
            out.append((ev.time_range.start / 1e3, ev.time_range.end / 1e3))
    return out


Profiler = Callable[[Callable[[], Any], str, Callable[[], None]], list[tuple[float, float]]]


@dataclass
class Bound:
    """The busy fractions of both sides, what the step is bound by and the verdict's basis."""

    replay_busy: float | None = None
    original_busy: float | None = None
    bound_by: str = "host"
    basis: str = HOST_TIMELINE
    how: str = "cpu: the host runs the step (busy fraction n/a)"

    @classmethod
    def judge(cls, replay_busy: float | None, original_busy: float | None, how: str) -> Bound:
        ref = original_busy if original_busy is not None else replay_busy
        b = bound_by(ref)
        return cls(replay_busy, original_busy, b, verdict_basis(b), how)

    def timing(self) -> dict[str, Any]:
        """What summary.json's ``timing`` says of it."""
        return {"basis": self.basis, "bound_thresholds": {"device_at_least": BUSY_DEVICE, "host_at_most": BUSY_HOST},
                "busy_how": self.how}


def measure_bound(replay: Callable[[], Any], original: Callable[[], Any] | None, device: str,
                  sync: Callable[[], None], paired: Paired | None, replay_step_ms: float | None,
                  profiler: Profiler | None = None) -> Bound:
    """:class:`Bound` of a timed step: on the CPU the host's; on an accelerator one profiled iteration
    of each side (``profiler``, default :func:`kernel_intervals`) over the side's median step time."""
    if str(device).split(":")[0] == "cpu":
        return Bound()
    prof = profiler or kernel_intervals
    how = "union of the kernels of one Kineto-profiled iteration / the side's median step time"
    try:
        rb = busy_fraction(prof(replay, device, sync), paired.a_median_ms if paired else replay_step_ms)
        ob = busy_fraction(prof(original, device, sync), paired.b_median_ms) if original and paired else None
    except Exception as exc:  # noqa: BLE001 - a profiler that cannot run here: judged as before
        return Bound(None, None, "mixed", DEVICE_TIME, f"not measured ({type(exc).__name__}: {exc})"[:200])
    return Bound.judge(rb, ob, how)


def basis_paired(paired: Paired, basis: str) -> Paired:
    """``paired`` with the chosen basis's series as its per-round times (a_ms, b_ms)."""
    a, b = BASIS_SERIES[basis]
    if basis == DEVICE_TIME or len(getattr(paired, a)) != paired.rounds:  # no wall series: as timed
        return paired
    out = Paired(**{**paired.__dict__})
    out.a_ms, out.b_ms = list(getattr(paired, a)), list(getattr(paired, b))
    return out


__all__ = ["BUSY_DEVICE", "BUSY_HOST", "Bound", "basis_paired", "bound_by", "busy_fraction", "measure_bound",
           "union_ms", "verdict_basis"]
