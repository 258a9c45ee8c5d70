"""Checker overhead: ``checked / unchecked - 1`` of the product's own checked paths, side by side.

Each comparison times the unchecked operator, the same operator again (an A/A control whose
difference is the resolution of the measurement at that moment) and the checked paths the
validators and :func:`~.protect.protect` use, in one process, interleaved: every round runs every
function once, in a fresh seeded random order (a fixed rotation would always run the same function
right after another and hand it that one's warm caches), and all functions read the same operands
and tables, so that their residency in the caches is alike; a table comparison draws fresh random
indices before every call, so that no call finds rows its predecessor in the round just loaded. The
overhead is the median over rounds of the paired ratio ``checked_r / unchecked_r`` minus one (pairs taken in the same round share the
state of the host, which a ratio of medians would not), with a distribution-free 95% interval of
that median from the order statistics of the ratios (binomial ranks).

On the CPU the comparison runs on ``threads`` intra-op threads (1 by default, the same for both
sides) and, with one thread, is timed with the CPU time of the calling thread
(``time.thread_time``), which does not count the time other processes of a busy host take the core
away; the wall-clock medians are reported beside it. Elsewhere it is wall-clock time between
device synchronisations, and on CUDA the time between CUDA events recorded on the current stream
around each call (read after the synchronisation).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mystique.hostinfo import torch_threads
from mystique.timing import LEVEL, median_interval

from .abft import (
    CheckReport,
    QuantizedTable,
    check_weights,
    checked_embedding_bag,
    checked_linear,
    checked_mm,
    checked_quantized_embedding_bag,
    checked_table,
    quantized_embedding_bag,
)
from .protect import protect

#: Overhead targets: fp32 GEMM at n >= 1024; EmbeddingBag 26% on the CPU (the DLRM soft-error paper's
#: own EmbeddingBag figure: on a CPU torch's lookup plus only the gather of one row sum per index
#: already costs +9% (fp32) to +15% (8-bit) at D = 64, a floor the overhead rows measure beside it)
#: and 10% on accelerators, where the lookup is memory-bound and the checksum gather is cheap.
TARGETS = {"gemm": 0.05, "embedding_bag": 0.26, "embedding_bag_accelerator": 0.10}


def embedding_bag_target(device: str) -> float:
    """The EmbeddingBag overhead target on ``device`` (see :data:`TARGETS`)."""
    return TARGETS["embedding_bag" if torch.device(device).type == "cpu" else "embedding_bag_accelerator"]
GEMM_TARGET_MIN_N = 1024
#: Table comparisons draw fresh random indices before every call (untimed), not once per round: with the
#: indices of the round, every call but the first found the rows the first one had just brought into the
#: caches, so each path's time depended on where the shuffle put it and on how many paths a round held
FRESH_INDICES = ", fresh random indices for every call (untimed)"
#: Rounds of a table comparison per ``reps``: a lookup is short and its time varies with its fresh
#: indices, so the median needs many more rounds than a GEMM's to resolve a few percent
TABLE_ROUNDS = 10


@dataclass
class Timings:
    """Per-function samples (seconds, one per round) on the chosen clock and on the wall clock."""

    samples: dict[str, list[float]]
    wall_samples: dict[str, list[float]]
    reps: int
    clock: str
    resolution: float

    @functools.cached_property
    def median(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.samples.items()}

    @functools.cached_property
    def wall(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.wall_samples.items()}

    def ratios(self, checked: str, base: str) -> list[float]:
        return [c / b for c, b in zip(self.samples[checked], self.samples[base], strict=True) if b > 0]

    def overhead(self, checked: str, base: str) -> float:
        """Median over rounds of ``checked_r / base_r``, minus one."""
        return statistics.median(self.ratios(checked, base)) - 1.0

    def interval(self, checked: str, base: str, level: float = LEVEL) -> tuple[float, float]:
        """``level`` (95%) interval of :meth:`overhead` (order statistics of the paired ratios)."""
        lo, hi = median_interval(self.ratios(checked, base), level)
        return lo - 1.0, hi - 1.0


def _clock(device: str, threads: int) -> tuple[Callable[[], float], str, float]:
    if torch.device(device).type == "cpu" and threads == 1:
        return time.thread_time, "thread CPU time", time.get_clock_info("thread_time").resolution
    return time.perf_counter, "wall clock", time.get_clock_info("perf_counter").resolution


def time_interleaved(fns: dict[str, Callable[[], Any]], reps: int, *, device: str, threads: int,
                     sync: Callable[[], None], prepare: Callable[[int], None] | None = None,
                     seed: int = 0, before_each: Callable[[str], None] | None = None,
                     until: Callable[[Timings, float], Any] | None = None) -> Timings:
    """Time every function of ``fns`` once per round for ``reps`` rounds, in a seeded random order each round.

    ``prepare(r)`` runs untimed before round ``r`` (fresh inputs), ``before_each(name)`` untimed before each
    call, the warm-up's too (fresh inputs per call). ``until(timings, seconds)`` (if given) is asked after
    every round with the timings so far and the wall seconds since the first round; a true answer stops
    the rounds before ``reps`` (an adaptive stop: :class:`mystique.stopping.Stopper`). Returns the
    :class:`Timings`.
    """
    rng = random.Random(seed)
    clock, name, resolution = _clock(device, threads)
    times: dict[str, list[float]] = {k: [] for k in fns}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    # on CUDA: the device time between events on the current stream (the host's launch gaps included)
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
        if torch.device(device).type == "cuda" and torch.cuda.is_available() else None
    label = "CUDA events" if events is not None else name
    if prepare is not None:
        prepare(-1)
    for k, f in fns.items():  # warm-up: caches, lazily built encodings, allocator
        for _ in range(2):
            if before_each is not None:
                before_each(k)
            f()
    start = time.perf_counter()
    for r in range(reps):
        if prepare is not None:
            prepare(r)
        order = keys[:]
        rng.shuffle(order)
        for k in order:
            if before_each is not None:
                before_each(k)
            sync()
            w0, t0 = time.perf_counter(), clock()
            if events is not None:
                events[0].record()
            fns[k]()
            if events is not None:
                events[1].record()
            sync()
            times[k].append(clock() - t0 if events is None else events[0].elapsed_time(events[1]) * 1e-3)
            wall[k].append(time.perf_counter() - w0)
        if until is not None and until(Timings(times, wall, r + 1, label, resolution), time.perf_counter() - start):
            break
    return Timings(times, wall, len(times[keys[0]]) if keys else 0, label, resolution)


@contextlib.contextmanager
def cpu_threads(device: str, threads: int) -> Iterator[int]:
    """Run the block on ``threads`` intra-op threads on the CPU (0: leave torch's setting); yields the count."""
    with torch_threads(threads if threads > 0 else None, device):
        yield torch.get_num_threads()


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
    pw, pb = torch.nn.Parameter(w, requires_grad=False), torch.nn.Parameter(bias, requires_grad=False)
    plain, guarded = torch.nn.Linear(n, n, device=device), torch.nn.Linear(n, n, device=device)
    for mod in (plain, guarded):  # two modules over the same weight tensors
        mod.weight, mod.bias = pw, pb
    guard = protect(guarded)

    def protected() -> Any:
        out = guarded(a)
        if guard.alarms:
            raise RuntimeError(f"clean protected Linear raised an alarm: {guard.alarms[0].describe()}")
        return out

    def checked_gemm() -> Any:
        out, rep = checked_mm(a, b)
        if rep.alarm:
            raise RuntimeError(f"clean checked GEMM raised an alarm: {rep.describe()}")
        return out

    def checked_layer() -> Any:
        out, rep = checked_linear(a, w, bias)
        if rep.alarm:
            raise RuntimeError(f"clean checked Linear raised an alarm: {rep.describe()}")
        return out

    wt = check_weights(n, a.device, a.dtype)

    def bare_passes() -> Any:  # the memory traffic of any unfused check, without its verdict
        ref = (wt @ b.t()) @ a.t()
        c = a @ b
        return c, ref, wt @ c.t()

    return {
        "mm": lambda: a @ b,
        "mm_again": lambda: a @ b,
        "mm_bare_passes": bare_passes,
        "checked_mm": checked_gemm,
        "linear": lambda: F.linear(a, w, bias),
        "checked_linear": checked_layer,
        "linear_module": lambda: plain(a),
        "protected_linear_module": protected,
    }


GEMM_COMPARISONS = (
    ("gemm", "checked_mm", "mm", "float32", "checked_mm(a, b) vs a @ b (fresh operands: passes over B, A and C, "
                                            "exact threshold)"),
    ("linear", "checked_linear", "linear", "float32", "checked_linear(x, W, b) vs F.linear (cached weight "
                                                      "encoding: one pass over x and y, exact threshold)"),
    ("protect_linear", "protected_linear_module", "linear_module", "float32",
     "nn.Linear under protect() vs plain nn.Linear"),
)
#: informational rows: what the memory traffic of a check costs with no verdict at all (the floor
#: of an unfused checker on this host)
GEMM_FLOORS = (
    ("gemm_passes_floor", "mm_bare_passes", "mm", "a @ b plus the three bare passes B W, A (B W), C W (torch "
                                                  "ops only, no verdict) vs a @ b"),
)


class EmbeddingFunctions:
    """Unchecked and checked EmbeddingBag paths over one table shape, with fresh indices per round."""

    def __init__(self, rows: int, dim: int, bags: int, length: int, device: str, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.rows, self.n = rows, bags * length
        source = torch.randn(rows, dim, generator=g).to(device)
        # every path reads the same table (and the 8-bit paths the same packed table), so that the
        # table's residency in the caches is the same whichever path ran before
        self.w = source
        self.table = checked_table(source)
        weight = torch.nn.Parameter(source, requires_grad=False)
        self.plain = torch.nn.EmbeddingBag(rows, dim, mode="sum", _weight=weight)
        self.guarded = torch.nn.EmbeddingBag(rows, dim, mode="sum", _weight=weight)
        self.guard = protect(self.guarded)
        self.qt = QuantizedTable.from_float(source)
        self.rowsum = self.table.checks.rowsum[:, 0]
        self.device = device
        self.offsets = torch.arange(0, self.n, length, device=device)
        self.idx = torch.zeros(self.n, dtype=torch.int64, device=device)

    def fresh(self, name: str) -> None:
        """Fresh indices for every call (see :data:`FRESH_INDICES`)."""
        self.idx = torch.randint(0, self.rows, (self.n,), generator=self.g).to(self.device)

    def _ok(self, out_rep: tuple[Any, CheckReport]) -> Any:
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
            "embedding_bag_again": lambda: F.embedding_bag(self.idx, self.w, self.offsets, mode="sum"),
            "checked_embedding_bag": lambda: self._ok(checked_embedding_bag(self.table, self.idx, self.offsets)),
            "embedding_bag_module": lambda: self.plain(self.idx, self.offsets),
            "protected_embedding_bag_module": protected,
            "embedding_bag_8bit": lambda: quantized_embedding_bag(self.qt, self.idx, self.offsets),
            "checked_embedding_bag_8bit": lambda: self._ok(
                checked_quantized_embedding_bag(self.qt, self.idx, self.offsets)),
            "embedding_bag_bare_gather": lambda: (F.embedding_bag(self.idx, self.w, self.offsets, mode="sum"),
                                                  self.rowsum.index_select(0, self.idx)),
            "embedding_bag_8bit_bare_gather": lambda: (quantized_embedding_bag(self.qt, self.idx, self.offsets),
                                                       self.rowsum.index_select(0, self.idx)),
        }


EMBEDDING_COMPARISONS = (
    ("embedding_bag", "checked_embedding_bag", "embedding_bag", "float32",
     "checked_embedding_bag (the compiled lookup, bitwise torch's, after a pass that gathers the R x 1 row sums "
     "into each bag's reference; each bag checked as it is pooled) vs F.embedding_bag"),
    ("embedding_bag_8bit", "checked_embedding_bag_8bit", "embedding_bag_8bit", "uint8",
     "checked 8-bit row-wise lookup (compiled, bitwise fbgemm's, each row read with its fp32 row sum beside it in "
     "the checker's own layout, each bag checked as it is pooled) vs torch's fused 8-bit kernel"),
    ("protect_embedding_bag", "protected_embedding_bag_module", "embedding_bag_module", "float32",
     "nn.EmbeddingBag under protect() (its forward the compiled lookup after the row-sum gather's own pass, each "
     "bag checked after it; no forward hook unless another one is registered) vs plain"),
)
EMBEDDING_FLOORS = (
    ("embedding_bag_gather_floor", "embedding_bag_bare_gather", "embedding_bag",
     "F.embedding_bag plus the bare gather of one 4-byte row sum per index (no sums, no verdict) vs "
     "F.embedding_bag"),
    ("embedding_bag_8bit_gather_floor", "embedding_bag_8bit_bare_gather", "embedding_bag_8bit",
     "the 8-bit row-wise fused kernel plus the bare gather of one 4-byte row sum per index from an array of its "
     "own (what the checked lookup's in-row layout avoids) vs the kernel alone"),
)
