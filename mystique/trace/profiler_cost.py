"""What the light profiler costs per recorded event on this host, measured at capture time.

A light profile (``pacing.json.gz``: the Kineto profiler alone, CPU events, no shapes) times a step
that pays the profiler's own work: at every operator it records, a timestamp on entry and exit and
an event pushed to its buffer. ``mystique predict`` builds a step from those times, so it takes this
cost out again (:mod:`mystique.predict.graph`): ``c`` microseconds per event the profile holds.

``c`` is measured on a loop of one tiny operator that records exactly one event per call
(``torch.add(a, b, out=o)`` on one element: ``aten::add`` with no operator below it), timed with
and without the profiler in alternating rounds: each round times :data:`REPEATS` plain loops and
:data:`REPEATS` loops in one profiling session and gives ``(min profiled - min plain) / events per
loop`` (the minimum: the loop's fixed work, since a busy host only ever adds time to it), and ``c``
is the median of the rounds, with the distribution-free 95% interval of that median
(:func:`mystique.timing.median_interval`). The loop is independent of
the captured step, so the correction is a measurement of the profiler, not a fit to the step's
error. What it leaves out: any cost that is not per event (the profiler's buffers evicting the
step's own data from the caches), which a loop of one hot operator cannot see.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

#: operator calls per timed loop, and alternating rounds (plain, profiled) measured: 7 rounds give a
#: median with a 98% order-statistics interval between the smallest and the largest round
LOOP_OPS = 400
ROUNDS = 7
REPEATS = 3


def measure_event_cost(*, ops: int = LOOP_OPS, rounds: int = ROUNDS,
                       clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """``{"per_event_us", "low_us", "high_us", "rounds_us", "events_per_call", "how"}`` (see the module
    docstring); the figures are None when the profiler recorded no event."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..timing import median_interval

    a, out = torch.ones(1), torch.empty(1)

    def loop() -> float:
        t0 = clock()
        for _ in range(ops):
            torch.add(a, a, out=out)
        return clock() - t0

    loop()  # warm: the operator's dispatch resolved, the output allocated
    per_round: list[float] = []
    events = 0.0
    for r in range(rounds):
        plain = min(loop() for _ in range(REPEATS))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            profiled = min(loop() for _ in range(REPEATS))
        if r == 0:
            events = sum(1 for e in prof.events() if e.name == "aten::add") / REPEATS
        if events:
            per_round.append((profiled - plain) / events * 1e6)
    per_call = events / ops if ops else 0.0
    if not per_round:
        return {"per_event_us": None, "low_us": None, "high_us": None, "rounds_us": [], "events_per_call": per_call,
                "how": "the profiler recorded no event of the calibration loop"}
    lo, hi = median_interval(per_round)
    return {"per_event_us": statistics.median(per_round), "low_us": lo, "high_us": hi, "rounds_us": per_round,
            "events_per_call": per_call,
            "how": f"median of {len(per_round)} alternating rounds of {ops} x aten::add on one element, timed with "
                   f"and without the Kineto profiler (CPU events, no shapes): (fastest of {REPEATS} profiled - "
                   f"fastest of {REPEATS} plain) / events"}


def event_cost_us(capture: dict[str, Any] | None) -> float | None:
    """The per-event cost a ``capture.json`` recorded (None for a capture made before it was
    measured, or a value that is not a finite number); a negative measurement (the noise of a busy
    host around a cost near zero) counts as none: 0."""
    import math

    cost = (capture or {}).get("profiler_event_cost")
    v = cost.get("per_event_us") if isinstance(cost, dict) else None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return max(float(v), 0.0)


__all__ = ["LOOP_OPS", "REPEATS", "ROUNDS", "event_cost_us", "measure_event_cost"]
