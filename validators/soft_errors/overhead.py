"""Checker overhead: ``checked / unchecked - 1`` of the product's own checked paths, side by side.

Each comparison times the unchecked operator, the same operator again (an A/A control whose
difference is the resolution of the measurement at that moment) and the checked paths the
validators and :func:`~.protect.protect` use, in one process, interleaved: every round runs every
function once, in an order rotated by one each round, and the value is the ratio of the medians.

On the CPU the comparison runs on ``threads`` intra-op threads (1 by default, the same for both
sides) and, with one thread, is timed with the CPU time of the calling thread
(``time.thread_time``), which does not count the time other processes of a busy host take the core
away; the wall-clock medians are reported beside it. Elsewhere it is wall-clock time between
device synchronisations.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import abft
from .protect import protect

#: Targets of the issue: fp32 GEMM at n >= 1024 and EmbeddingBag.
TARGETS = {"gemm": 0.05, "embedding_bag": 0.10}
GEMM_TARGET_MIN_N = 1024


@dataclass
class Timings:
    """Medians (seconds) per function name, on the chosen clock and on the wall clock."""

    median: dict[str, float]
    wall: dict[str, float]
    reps: int
    clock: str
    resolution: float

    def overhead(self, checked: str, base: str) -> float:
        return self.median[checked] / self.median[base] - 1.0


def _clock(device: str, threads: int) -> tuple[Callable[[], float], str, float]:
    if torch.device(device).type == "cpu" and threads == 1:
        return time.thread_time, "thread CPU time", time.get_clock_info("thread_time").resolution
    return time.perf_counter, "wall clock", time.get_clock_info("perf_counter").resolution


def time_interleaved(fns: dict[str, Callable[[], Any]], reps: int, *, device: str, threads: int,
                     sync: Callable[[], None], prepare: Callable[[int], None] | None = None) -> Timings:
    """Time every function of ``fns`` once per round for ``reps`` rounds, order rotated each round.

    ``prepare(r)`` runs untimed before round ``r`` (fresh inputs). Returns the :class:`Timings`.
    """
    clock, name, resolution = _clock(device, threads)
    times: dict[str, list[float]] = {k: [] for k in fns}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    if prepare is not None:
        prepare(-1)
    for f in fns.values():  # warm-up: caches, lazily built encodings, allocator
        f()
        f()
    for r in range(reps):
        if prepare is not None:
            prepare(r)
        shift = r % len(keys)
        for k in keys[shift:] + keys[:shift]:
            sync()
            w0, t0 = time.perf_counter(), clock()
            fns[k]()
            sync()
            times[k].append(clock() - t0)
            wall[k].append(time.perf_counter() - w0)
    return Timings({k: statistics.median(v) for k, v in times.items()},
                   {k: statistics.median(v) for k, v in wall.items()}, reps, name, resolution)


@contextlib.contextmanager
def cpu_threads(device: str, threads: int) -> Iterator[int]:
    """Run the block on ``threads`` intra-op threads on the CPU (0: leave torch's setting); yields the count."""
    if torch.device(device).type != "cpu" or threads <= 0:
        yield torch.get_num_threads()
        return
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(old)


def load_average() -> float:
    """The 1-minute load average of the host (NaN where the OS does not tell)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


@dataclass
class Comparison:
    """One overhead row: ``checked`` against ``base`` from one set of timings."""

    subject: str
    checked: str
    base: str
    target: float | None
    dtype: str
    what: str


def gemm_functions(n: int, device: str, seed: int) -> dict[str, Callable[[], Any]]:
    """Unchecked and checked fp32 GEMM / Linear / protected Linear of size n (the product's own paths)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    w = torch.randn(n, n, generator=g).to(device)
    bias = torch.randn(n, generator=g).to(device)
    plain = torch.nn.Linear(n, n).to(device)
    with torch.no_grad():
        plain.weight.copy_(w)
        plain.bias.copy_(bias)
    guarded = copy.deepcopy(plain)
    guard = protect(guarded)

    def protected() -> Any:
        out = guarded(a)
        if guard.alarms:
            raise RuntimeError(f"clean protected Linear raised an alarm: {guard.alarms[0].describe()}")
        return out

    def checked_mm() -> Any:
        out, rep = abft.checked_mm(a, b)
        if rep.alarm:
            raise RuntimeError(f"clean checked GEMM raised an alarm: {rep.describe()}")
        return out

    def checked_linear() -> Any:
        out, rep = abft.checked_linear(a, w, bias)
        if rep.alarm:
            raise RuntimeError(f"clean checked Linear raised an alarm: {rep.describe()}")
        return out

    return {
        "mm": lambda: a @ b,
        "mm_again": lambda: a @ b,
        "checked_mm": checked_mm,
        "linear": lambda: F.linear(a, w, bias),
        "checked_linear": checked_linear,
        "linear_module": lambda: plain(a),
        "protected_linear_module": protected,
    }


GEMM_COMPARISONS = (
    ("gemm", "checked_mm", "mm", "checked_mm(a, b) vs a @ b (fresh operands: passes over B, A and C)"),
    ("linear", "checked_linear", "linear", "checked_linear(x, W, b) vs F.linear (cached weight encoding: "
                                           "passes over x and y)"),
    ("protect_linear", "protected_linear_module", "linear_module", "nn.Linear under protect() vs plain nn.Linear"),
)


class EmbeddingFunctions:
    """Unchecked and checked EmbeddingBag paths over one table shape, with fresh indices per round."""

    def __init__(self, rows: int, dim: int, bags: int, length: int, device: str, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.rows, self.n = rows, bags * length
        source = torch.randn(rows, dim, generator=g)
        # every side gets its own copy, allocated the same way, so that no side reads a table
        # another side has just brought into the cache
        self.w = source.clone().to(device)
        self.w_again = source.clone().to(device)
        self.aug = abft.augment_table(source.to(device))
        self.plain = torch.nn.EmbeddingBag(rows, dim, mode="sum").to(device)
        self.guarded = torch.nn.EmbeddingBag(rows, dim, mode="sum").to(device)
        with torch.no_grad():
            self.plain.weight.copy_(source)
            self.guarded.weight.copy_(source)
        self.guard = protect(self.guarded)
        self.qt = abft.QuantizedTable.from_float(source.to(device))
        self.qt_checked = abft.QuantizedTable.from_float(source.to(device))
        self.device = device
        self.offsets = torch.arange(0, self.n, length, device=device)
        self.idx = torch.zeros(self.n, dtype=torch.int64, device=device)
        del source

    def prepare(self, r: int) -> None:
        self.idx = torch.randint(0, self.rows, (self.n,), generator=self.g).to(self.device)

    def _ok(self, out_rep: tuple[Any, abft.CheckReport]) -> Any:
        out, rep = out_rep
        if rep.alarm:
            raise RuntimeError(f"clean checked EmbeddingBag raised an alarm: {rep.describe()}")
        return out

    def functions(self) -> dict[str, Callable[[], Any]]:
        def protected() -> Any:
            out = self.guarded(self.idx, self.offsets)
            if self.guard.alarms:
                raise RuntimeError(f"clean protected EmbeddingBag raised an alarm: {self.guard.alarms[0].describe()}")
            return out

        return {
            "embedding_bag": lambda: F.embedding_bag(self.idx, self.w, self.offsets, mode="sum"),
            "embedding_bag_again": lambda: F.embedding_bag(self.idx, self.w_again, self.offsets, mode="sum"),
            "checked_embedding_bag": lambda: self._ok(abft.checked_embedding_bag(self.aug, self.idx, self.offsets)),
            "embedding_bag_module": lambda: self.plain(self.idx, self.offsets),
            "protected_embedding_bag_module": protected,
            "embedding_bag_8bit": lambda: abft.quantized_embedding_bag(self.qt, self.idx, self.offsets),
            "checked_embedding_bag_8bit": lambda: self._ok(
                abft.checked_quantized_embedding_bag(self.qt_checked, self.idx, self.offsets)),
        }


EMBEDDING_COMPARISONS = (
    ("embedding_bag", "checked_embedding_bag", "embedding_bag", "float32",
     "checked_embedding_bag over the [W | W1 | |W|1] table (one gather) vs F.embedding_bag over W"),
    ("embedding_bag_8bit", "checked_embedding_bag_8bit", "embedding_bag_8bit", "uint8",
     "8-bit row-wise fused kernel + checksum gather (R x 2 table) vs the fused kernel alone"),
    ("protect_embedding_bag", "protected_embedding_bag_module", "embedding_bag_module", "float32",
     "nn.EmbeddingBag under protect() (second gather over an R x 2 checksum table) vs plain"),
)
