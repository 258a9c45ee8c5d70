"""Checking a prediction by running what it predicts, on this machine (``mystique predict --verify``).

- A capture's own step (self-prediction): the captured step is rebuilt here (a built-in workload from
  its name and config; a user's ``package.module:function`` only when named with ``--original``: a
  capture folder is data, see :func:`mystique.capture.rebuild_step`), with the capture's thread count,
  warmed up until its step time settles, then timed until the 95% interval of the median step time is
  within ``half_width`` or ``time_cap_s`` is spent. The error is predicted / measured - 1 with the
  interval that the median's interval gives it.
- A transform (``--dtype``, ``--batch-scale``): the transformed benchmark and the untransformed one
  are replayed in ABBA rounds in this process (:func:`mystique.timing.paired_rounds`); the measured
  change is the median paired ratio transformed / untransformed with its 95% interval, and the error is
  that of the predicted change: (predicted transformed / predicted untransformed) / measured ratio - 1.
  A ratio of two replays interleaved in one process cancels the host's drift and the replay's own
  distance from the captured step, so what is left is the model's error.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UsageError
from ..timing import median_interval, paired_rounds


@dataclass
class Measured:
    """A measured figure (ms, or a ratio) with the 95% interval of its median, and how it was measured."""

    value: float
    low: float
    high: float
    samples: list[float]
    how: str
    # what a prediction is checked against, for the error row's detail (None: the caller's words)
    what: str | None = None


def _settled(xs: list[float], window: int = 5, tol: float = 0.05) -> bool:
    if len(xs) < 2 * window:
        return False
    last, before = statistics.median(xs[-window:]), statistics.median(xs[-2 * window:-window])
    return abs(last - before) <= tol * before


def time_step(fn: Callable[[], Any], sync: Callable[[], None], *, half_width: float, time_cap_s: float,
              min_rounds: int = 12, clock: Callable[[], float] = time.perf_counter,
              progress: Callable[[str], None] | None = None) -> Measured:
    """Warm ``fn`` up until its time settles (at most a quarter of ``time_cap_s``, 5 s at least), then
    time it until the median's 95% interval is within ``half_width`` (relative) or the cap is spent."""

    def once() -> float:
        sync()
        t0 = clock()
        fn()
        sync()
        return (clock() - t0) * 1e3

    t_start = clock()
    warm: list[float] = []
    while not _settled(warm) and clock() - t_start < max(5.0, time_cap_s / 4):
        warm.append(once())
    if progress:
        progress(f"warm-up: {len(warm)} steps" + ("" if _settled(warm) else " (not settled: time cap)"))
    xs: list[float] = []
    t1 = clock()
    while True:
        xs.append(once())
        lo, hi = median_interval(xs)
        med = statistics.median(xs)
        if len(xs) >= min_rounds and (hi - lo) / 2 <= half_width * med:
            stop = "half-width"
            break
        if clock() - t1 > time_cap_s and len(xs) >= 6:
            stop = "time cap"
            break
    lo, hi = median_interval(xs)
    return Measured(statistics.median(xs), lo, hi, xs,
                    f"median of {len(xs)} steps after {len(warm)} warm-up steps (stopped on {stop})")


def measure_capture_step(step: Any, device: str, original: str | None, *, half_width: float, time_cap_s: float,
                         progress: Callable[[str], None] | None = None) -> tuple[Measured | None, str]:
    """The captured step, rebuilt and timed here; ``(None, why)`` where it cannot be rebuilt."""
    import torch

    from ..capture import StepNotImported, rebuild_step
    from ..errors import EnvironmentUnsupported
    from ..replay.capture_info import capture_original_step
    from ..replay.fidelity import device_sync

    spec = capture_original_step(step.capture)
    if spec is None and original is None:
        return None, "the source names no step this machine can rebuild (no capture.json of a single-process step)"
    try:
        fn = rebuild_step(spec or {}, device, original)
    except StepNotImported as exc:
        return None, str(exc)
    except (UsageError, EnvironmentUnsupported) as exc:
        return None, f"cannot rebuild the captured step: {exc}"
    threads = (step.capture or {}).get("threads")
    before = torch.get_num_threads()
    if isinstance(threads, int) and threads > 0:
        torch.set_num_threads(threads)
    try:
        m = time_step(fn, device_sync(torch.device(device)), half_width=half_width, time_cap_s=time_cap_s,
                      progress=progress)
    finally:
        torch.set_num_threads(before)
    m.how = f"the captured step rebuilt here with {threads or before} thread(s): {m.how}"
    return m, ""


def measure_transform(base_plan: Any, new_plan: Any, device: str, *, seed: int, half_width: float, time_cap_s: float,
                      allow_ops: tuple[str, ...] = (), progress: Callable[[str], None] | None = None) -> Measured:
    """The paired ratio transformed / untransformed replay (see the module docstring)."""
    import torch

    from ..replay.fidelity import device_sync
    from ..replay.run import make_executor

    base = make_executor(base_plan, device, seed=seed, allow_ops=allow_ops)
    new = make_executor(new_plan, device, seed=seed, allow_ops=allow_ops)
    base.run_iteration(probe=True)
    new.run_iteration(probe=True)
    p = paired_rounds(new.run_iteration, base.run_iteration, device=device, sync=device_sync(torch.device(device)),
                      half_width=half_width, time_cap_s=time_cap_s, progress=progress)
    lo, hi = p.interval
    return Measured(p.ratio, lo, hi, p.ratios,
                    f"median paired ratio transformed/untransformed replay of {p.rounds} ABBA rounds after "
                    f"{p.warmup_rounds} warm-up rounds (stopped on {p.stop}); transformed step "
                    f"{p.a_median_ms:.3f} ms, untransformed {p.b_median_ms:.3f} ms")


def capture_measured(capture: dict[str, Any] | None) -> Measured | None:
    """The step time a capture measured, as a median with its interval.

    A capture that paired its light-profiled steps with plain ones (``capture.json``
    ``light_reference``, see :func:`mystique.capture.record_pacing`) gives the plain step as the pairs
    give it: the light steps' median over the median of the pairs' ratios light / plain, with the
    interval of that median ratio. The prediction reproduces the light steps with the profiler's cost
    taken out, so this checks it against plain steps taken beside them; each step is compared with its
    own pair's, so a host whose speed drifts from pair to pair moves both and cancels (a median of
    the plain steps alone carries that drift into its interval: over 40 pairs of dlrm small train on
    this host, with another process starting midway, the plain steps' median interval was 58% wide,
    the paired ratio's 7%). Where the light steps were not kept, the plain steps' median; older
    captures give the uninstrumented steps timed before the step was recorded (``step_time``)."""
    ref = (capture or {}).get("light_reference")
    plain = ref.get("plain_ms") if isinstance(ref, dict) else None
    light = ref.get("light_ms") if isinstance(ref, dict) else None
    pairs = _paired(light, plain)
    if pairs is not None:
        return pairs
    paired = _median_of(plain, lambda n: f"median of the {n} plain steps the capture timed paired with its "
                                         f"light-profiled steps (alternating in one profiler session)")
    if paired is not None:
        return replace(paired, what="the predicted step against the plain steps the capture timed paired with "
                                    "the light-profiled steps it predicts from (same window, same host speed)")
    st = (capture or {}).get("step_time")
    times = st.get("times_ms") if isinstance(st, dict) else None
    return _median_of(times, lambda n: f"median of the {n} uninstrumented steps the capture timed before "
                                       f"recording one (after {st.get('warmup', '?')} warm-up steps)")


def _paired(light: Any, plain: Any) -> Measured | None:
    """The plain step the light/plain pairs give (see :func:`capture_measured`); None unless both lists
    hold as many positive finite times."""
    lt = _median_of(light, str)
    pl = _median_of(plain, str)
    if lt is None or pl is None or len(lt.samples) != len(pl.samples):
        return None
    ratios = [a / b for a, b in zip(lt.samples, pl.samples)]
    r = statistics.median(ratios)
    lo, hi = median_interval(ratios)
    n = len(ratios)
    return Measured(lt.value / r, lt.value / hi, lt.value / lo, [lt.value / x for x in ratios],
                    f"the light-profiled steps' median {lt.value:.4g} ms over the median ratio light/plain "
                    f"{r:.4f} [{lo:.4f}, {hi:.4f}] of the {n} pairs the capture timed (alternating in one "
                    f"profiler session; the plain steps' own median {pl.value:.4g} ms)",
                    what="the predicted step against the plain step its light/plain pairs give (each light "
                         "step against the plain step beside it: the host's drift between pairs cancels)")


def _median_of(times: Any, why: Callable[[int], str]) -> Measured | None:
    """The median of a recorded list of step times with its interval; None unless every entry is a
    positive finite number (``why(n)`` says where the n times came from)."""
    if not isinstance(times, list):
        return None
    xs = [float(x) for x in times if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0]
    if not xs or len(xs) != len(times):
        return None
    lo, hi = median_interval(xs)
    return Measured(statistics.median(xs), lo, hi, xs, why(len(xs)))


def replay_measured(ops_csv: str | None) -> Measured | None:
    """The step time of the replay whose ops.csv timed the graph: its ``summary.json`` beside it
    (``timing.replay_ms``, every timed iteration or round), as a median with its interval; None when
    there is none or it is not a replay's summary."""
    import json
    from pathlib import Path

    if ops_csv is None:
        return None
    p = Path(ops_csv).parent / "summary.json"
    try:
        if not p.is_file() or p.stat().st_size > 64 * 1024**2:
            return None
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    times = (doc.get("timing") or {}).get("replay_ms") if isinstance(doc, dict) and isinstance(doc.get("timing"), dict) else None
    return _median_of(times, lambda n: f"median of the {n} whole iterations its replay timed "
                                       f"({p.parent.name}/summary.json)")


def error_interval(predicted: float, m: Measured) -> tuple[float, float, float]:
    """predicted / measured - 1 and its interval from the measured interval."""
    if not (m.value > 0 and m.low > 0 and m.high > 0 and math.isfinite(predicted)):
        return math.nan, math.nan, math.nan
    return predicted / m.value - 1, predicted / m.high - 1, predicted / m.low - 1


def error_verdict(low: float, high: float, bound: float) -> str:
    """``pass`` when the error's interval lies within ±bound, ``fail`` when wholly outside, else
    ``inconclusive``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "error"
    if -bound <= low and high <= bound:
        return "pass"
    if high < -bound or low > bound:
        return "fail"
    return "inconclusive"


__all__ = ["Measured", "capture_measured", "replay_measured", "error_interval", "error_verdict", "measure_capture_step", "measure_transform", "time_step"]
