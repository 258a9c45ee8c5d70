"""Slowness fault simulations: a device that computes right but slowly.

* :class:`ThrottleMode` (``throttle``): a ``fraction`` of operator calls (drawn per call from a
  seeded generator) take ``factor`` times their own measured time: after the operator returns,
  the mode busy-waits ``(factor - 1) x`` the time it took (on the CPU both on the calling thread's
  CPU time, so a busy host's time slices are not multiplied into the fault). It imitates a device held at reduced
  clocks (thermal or power capping, a slow memory channel): every affected kernel is
  proportionally slower, the results are right.
* :class:`StragglerMode` (``straggler``): occasional long stalls: after every ``every_s`` seconds of
  operator time on average (exponential gaps, seeded) the device stalls ``stall_ms``. It
  imitates stragglers: ECC page retirement, driver or firmware hiccups, host interrupts.
* :class:`PassThroughMode`: a mode that only calls each operator, the paired reference of the
  performance validator (the same Python dispatch cost as a mode, no slowness).

The time of an operator is measured around the call on the host (on the CPU, the calling thread's
CPU time); on an accelerator the device is synchronised before and after it so the measured time is the kernel's (a simulation: the
synchronisation itself changes the overlap of host and device, which the paired reference of the
performance validator does not have; state so when using it there).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from mystique.errors import UsageError

from .modes import FaultMode, entropy_seed

SLOWNESS_FAULTS: tuple[str, ...] = ("throttle", "straggler")


def _sync_devices(args: tuple, kwargs: dict) -> str | None:
    """The accelerator type of the first tensor argument not on the CPU (None when all are on the CPU)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.device.type not in ("cpu", "meta"):
            return a.device.type
    return None


def _timed(func: Any, args: tuple, kwargs: dict) -> tuple[Any, float, Callable[[], float]]:
    """(result, seconds, clock) of one operator call. On an accelerator the device is synchronised at
    both ends and the clock is the wall clock. On the CPU the clock is the calling thread's CPU time,
    so that the time a busy host takes the core away is neither counted nor multiplied by the factor."""
    kind = _sync_devices(args, kwargs)
    mod = getattr(torch, kind, None) if kind else None
    sync = getattr(mod, "synchronize", None) if mod is not None else None
    clock = time.perf_counter if kind else time.thread_time
    if sync is not None:
        sync()
    t0 = clock()
    out = func(*args, **kwargs)
    if sync is not None:
        sync()
    return out, clock() - t0, clock


class _Schedule:
    """The random state of one simulated device, shared by every mode built with the same parameters.

    Validators enter ``target.active()`` (a fresh mode) per step or per operator; a real slow
    device keeps its state across them, so the draws continue where the last mode left them
    rather than restarting from the seed each time."""

    _ALL: dict[tuple[Any, ...], _Schedule] = {}

    def __init__(self, seed: int):
        self.rng = random.Random(entropy_seed(seed))
        self.until = math.nan

    @classmethod
    def of(cls, key: tuple[Any, ...], seed: int) -> _Schedule:
        if seed < 0:  # entropy: a schedule of its own
            return cls(seed)
        if key not in cls._ALL:
            cls._ALL[key] = cls(seed)
        return cls._ALL[key]


def busy_wait(seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
    """Spin for ``seconds`` of ``clock`` (sleep is too coarse for microsecond operators)."""
    end = clock() + seconds
    while clock() < end:
        pass


class PassThroughMode(FaultMode):
    """Calls every operator as it is: the dispatch cost of a Python mode, nothing else."""

    name = "pass_through"


class ThrottleMode(FaultMode):
    """A ``fraction`` of operator calls take ``factor`` x their measured time."""

    name = "throttle"

    def __init__(self, factor: float = 1.1, fraction: float = 1.0, seed: int = 0):
        super().__init__()
        if not factor >= 1.0:
            raise UsageError(f"--inject throttle: factor={factor} must be at least 1 (1.1: 10% slower)")
        if not 0.0 <= fraction <= 1.0:
            raise UsageError(f"--inject throttle: fraction={fraction} must be within 0..1")
        self.factor = float(factor)
        self.fraction = float(fraction)
        self.rng = _Schedule.of(("throttle", self.factor, self.fraction, seed), seed).rng

    def fault(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.fraction < 1.0 and self.rng.random() >= self.fraction:
            return func(*args, **kwargs)
        out, dt, clock = _timed(func, args, kwargs)
        busy_wait((self.factor - 1.0) * dt, clock)
        return out


class StragglerMode(FaultMode):
    """A stall of ``stall_ms`` after every ``every_s`` seconds of operator time (exponential gaps).

    The built-in ``straggler`` stalls 150 ms every 0.1 s of operator time on average (until issue 33:
    every 1 s, which no quick item can resolve). Why: the quick performance item
    (:mod:`mystique.validators.performance.mode`) judges the mean by a bootstrap interval over the
    paired rounds of a few seconds. A mean moved by rare events is resolved only by the events seen:
    with ``N`` stalls observed the stall share of the mean has a relative standard error of about
    ``1/sqrt(N)`` (Poisson), so for an interval at 98.3% (``z`` = 2.4) to clear the 5% margin from a
    mean excess ``delta`` it needs ``delta (1 - 2.4/sqrt(N)) > 0.05``, about 10 stalls or more for any
    ``delta`` of a few tenths. The item's device side runs about a quarter of its budget of operator
    time (half the rounds, and about half of a replayed step is operator time on a CPU: the rest is
    the replay's dispatch): 1.5 s of a 6 s budget, so ``every_s`` = 1 s gave 1-2 stalls, below any
    statistic's resolution, and 0.1 s gives about 15 (4 by the first look, 8 by the second; mean
    excess ``stall / every_s x share`` ~ 0.75, 15 times the margin). The stall stays long (150 ms: several steps of a GPU, a step or so of a
    CPU's replay) and a real straggler's "occasional" now means several times a second of compute;
    rarer stalls are the ``sustained`` group's (a long run), as the README says."""

    name = "straggler"

    def __init__(self, every_s: float = 0.1, stall_ms: float = 150.0, seed: int = 0):
        super().__init__()
        if not (every_s > 0 and stall_ms >= 0):
            raise UsageError(f"--inject straggler: every_s={every_s} must be > 0 and stall_ms={stall_ms} >= 0")
        self.every_s = float(every_s)
        self.stall_s = float(stall_ms) / 1e3
        self.state = _Schedule.of(("straggler", self.every_s, self.stall_s, seed), seed)
        if math.isnan(self.state.until):
            self.state.until = self.state.rng.expovariate(1.0 / self.every_s)

    def fault(self, func: Any, args: tuple, kwargs: dict) -> Any:
        out, dt, _clock = _timed(func, args, kwargs)
        st = self.state
        st.until -= dt
        if st.until <= 0:
            time.sleep(self.stall_s)
            st.until = st.rng.expovariate(1.0 / self.every_s)
        return out
