"""The cost model of a routing change: what a step should gain or lose when its experts' loads move.

A mixture of experts' grouped GEMM (``aten::_grouped_mm``) multiplies each expert's group of tokens
by that expert's weights. Two benchmarks of one capture that differ only in their routing (``generate
--routing uniform|skewed:ALPHA``, each layer's total tokens kept) run the same ops on the same shapes
except for the group sizes of their pinned grouped GEMMs:

* the routing pins are the grouped GEMMs' ``offs`` only (:data:`.pins.ROUTING_ARGS`): the ops that
  compute the routing (router, top-k, argsort, ``bincount``, ``cumsum``) and the dispatch around the
  experts (``index_select`` of the tokens in expert order, ``index_add`` of the outputs) run on the
  replay's synthetic data with the capture's shapes, which are the step's token count whatever the
  routing, in both benchmarks alike;
* the grouped path has no per-expert loop in forward or backward: the backward of ``_grouped_mm`` is two
  more grouped GEMMs (the input gradient ``grad @ w^T``, a transposed weight, and the weight gradient
  ``x^T @ grad``), each pinned like the forward's; a capture of the per-expert loop (``split`` by loads
  read back to the host) has no routing pins and is refused by ``replay --against``.

So what moves is the pinned grouped GEMMs, and the model is:

    step(candidate) - step(base) = sum over pinned grouped GEMMs g of T_g(candidate loads) - T_g(base loads)

with ``T_g`` the time of the whole call on the step's operands (shapes, strides, dtype: forward
``(T, K) @ (E, K, N)``; input gradient ``(T, N) @ (E, N, K)`` transposed; weight gradient ``(K, T) @
(T, N)``), so that the per-call and per-group costs, the zero-size groups and each layout's kernel are
those of the step. It is measured by :func:`time_sites` as a *paired* difference: every round runs one
pass of every moved grouped GEMM with the candidate's loads and one with the base's, on the same
operands (each site its own, as each layer has its own weights), in ABBA order; the prediction is the
median over rounds of the pass difference, with the distribution-free 95% interval of that median. The
host's drift and load touch both passes of a round alike and cancel in the difference, which two
independent timings' half-widths summed (this model's first form: ±4% of a Llama 4 small step) do not.

Two things make the passes' context the step's:

* *cold caches.* Between two calls of one site in the step the rest of the step runs, streaming the
  plan's parameters and activations (Llama 4 small-128e: 112 MB of weights in inference, about four
  times that with gradients and Adam's moments), more than a last-level cache holds, and ``replay
  --against`` runs other executors' steps between two of one executor's: a site's expert weights come
  from memory. Back-to-back passes need not: a skewed pass reads only its busy experts' weights (41 of
  128 under ``skewed:2``, 31 MB of infer's 96 MB), which a 32 MB L3 may still hold for the uniform pass
  after it (three rounds in four, ABBA), making the uniform pass cheaper than in the step and the
  change short. :func:`cache_flusher` reads and writes :data:`FLUSH_CAPACITIES` times the last-level
  cache before every pass (untimed). Measured beside other processes (issue 34) this moved the
  prediction by -0.6 ms (infer) and -0.4 ms (train), within its interval; a neighbour's traffic
  already evicts much of the L3 there;
* *one state of the host.* Timed in a phase of its own before the measured rounds, the prediction read
  -6.4 ms on a quiet host and -8.8 to -12.5 ms beside other processes, while the grouped GEMMs timed
  inside the step moved -7.6 to -9.2 ms (infer, per-op times of 30-40 paired rounds): the phase's host
  state, not the loads, set much of the number. ``replay --against`` therefore runs one pair of passes
  (:class:`PairedPasses`) after each of its measured rounds.

The ops between two grouped GEMMs are left out: inside the step they moved by less than the
measurement resolves (issue 34, infer, per-op times of 40 paired rounds: grouped GEMMs -7.9 ms
[-9.4, -7.2], all other ops -0.8 ms [-2.3, +0.4] of a 111 ms step). In training they moved -52 ms
[-65, -28] of 540, -31 ms of it Adam's sqrt, while the replayed step drove its second moments to inf
(more under uniform routing); ``replay --against`` puts the state back after each step
(:class:`.against.StateRestore`), and a state of special values makes its check an error.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..timing import median_interval
from .pins import is_routing, loads
from .runtime.format import contiguous_strides

#: how each pinned grouped GEMM groups its operands, from the ranks of (mat_a, mat_b)
LAYOUTS = {(2, 3): "rows", (2, 2): "inner", (3, 2): "cols"}

#: a flush writes this many times the last-level cache: under LRU replacement one capacity evicts every
#: older line; under random replacement a line survives n fresh lines written into a cache of C lines with
#: probability (1 - 1/C)^n ~ e^(-n/C), so four capacities leave under 2% of what a pass left behind
FLUSH_CAPACITIES = 4
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def llc_bytes(device: Any = "cpu", cache_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The last-level cache of ``device`` in bytes: a CUDA device's L2, or the highest-level data or
    unified cache that Linux lists for CPU 0 (``cache_dir``: sysfs, injected by tests); None where unknown."""
    import glob
    import os

    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)) or None
    best: tuple[int, int] | None = None
    for d in glob.glob(os.path.join(cache_dir, "index*")):
        try:
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        unit = size[-1] if size[-1:] in ("K", "M", "G") else ""
        if kind in ("Data", "Unified") and size.rstrip("KMG").isdigit():
            cand = (level, int(size.rstrip("KMG")) * _UNITS[unit])
            best = cand if best is None or cand > best else best
    return best[1] if best else None


def cache_flusher(device: Any = "cpu", llc: int | None = None) -> tuple[Callable[[], None], int]:
    """``(flush, bytes)``: ``flush()`` reads and writes a buffer of :data:`FLUSH_CAPACITIES` times the
    last-level cache (``llc``, else :func:`llc_bytes`) on ``device``, so that the next pass finds none of its
    operands cached (module docstring); a no-op and 0 bytes where the cache's size is unknown."""
    import torch

    llc = llc if llc is not None else llc_bytes(device)
    if not llc:
        return (lambda: None), 0
    buf = torch.zeros(FLUSH_CAPACITIES * llc // 4, dtype=torch.float32, device=torch.device(device))

    def flush() -> None:
        buf.add_(1.0)  # a read and a write of every line: through the cache, unlike a streaming store

    flush.buffer = buf  # type: ignore[attr-defined]
    return flush, buf.numel() * 4


@dataclass(frozen=True)
class Site:
    """One pinned grouped GEMM: its layout, fixed dims (the two that are not the group size), dtype
    and the tokens per expert that the two plans give it."""

    node_id: Any
    layout: str  # rows: (n, K) @ (K, N); inner: (K, n) @ (n, N); cols: (M, K) @ (K, n)
    dims: tuple[int, int]
    dtype: str
    candidate: tuple[int, ...]
    base: tuple[int, ...]
    operands: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()  # (shape, strides) of mat_a, mat_b

    @property
    def moved(self) -> int:
        """Expert groups whose load differs between the two plans."""
        return sum(c != b for c, b in zip(self.candidate, self.base))


@dataclass
class Prediction:
    """The predicted change of the step (seconds, candidate - base): the median of the paired rounds'
    differences, with its distribution-free 95% interval ``[low_s, high_s]``."""

    delta_s: float
    low_s: float
    high_s: float
    rounds: int = 0  # paired rounds timed (0: nothing moved, the prediction is exactly no change)
    sites: int = 0  # grouped GEMMs whose loads differ between the two plans (those timed)
    groups: int = 0  # expert groups whose load differs

    def ratio(self, base_s: float) -> tuple[float, float, float]:
        """The predicted candidate / base step ratio on a base step of ``base_s``, and its interval."""
        if not (base_s > 0 and math.isfinite(base_s)):
            return math.nan, math.nan, math.nan
        return 1 + self.delta_s / base_s, 1 + self.low_s / base_s, 1 + self.high_s / base_s


def _planned(plan: Any, pin: dict[str, Any]) -> list[int]:
    storages = {s["id"]: s for s in plan.data["storages"]}
    tensors = {t["id"]: t for t in plan.data["tensors"]}
    return loads(storages[tensors[pin["tensor"]]["storage"]]["recipe"].get("values") or [])


def sites(candidate: Any, base: Any) -> list[Site]:
    """The pinned grouped GEMMs of two plans of one capture, paired by node id; ValueError naming what
    differs when they are not two routings of one step (other ops, other totals)."""
    if len(candidate.ops) != len(base.ops):
        raise ValueError(f"the benchmarks have {len(candidate.ops)} and {len(base.ops)} ops: not two routings of one step")
    bpins = {p["node_id"]: p for p in base.metadata.get("pins") or [] if is_routing(p)}
    tensors = {t["id"]: t for t in candidate.data["tensors"]}
    by_node = {op.get("node_id"): op for op in candidate.ops}
    out = []
    for pin in candidate.metadata.get("pins") or []:
        if not is_routing(pin):
            continue
        other = bpins.pop(pin["node_id"], None)
        if other is None:
            raise ValueError(f"grouped GEMM node {pin['node_id']} is pinned in one benchmark only")
        cand, bas = _planned(candidate, pin), _planned(base, other)
        if len(cand) != len(bas) or sum(cand) != sum(bas):
            raise ValueError(f"grouped GEMM node {pin['node_id']}: {sum(cand)} tokens in {len(cand)} groups against "
                             f"{sum(bas)} in {len(bas)}: a routing transform keeps each layer's total")
        op = by_node[pin["node_id"]]
        a, b = (tensors[x["t"]] for x in op["args"][:2])
        out.append(Site(pin["node_id"], *_layout(list(a["shape"]), list(b["shape"])), a["dtype"], tuple(cand), tuple(bas),
                        tuple(_shape_strides(t) for t in (a, b))))
    if bpins:
        raise ValueError(f"{len(bpins)} grouped GEMM(s) pinned in one benchmark only")
    return out


def _layout(a: list[int], b: list[int]) -> tuple[str, tuple[int, int]]:
    kind = LAYOUTS.get((len(a), len(b)))
    if kind == "rows":
        return kind, (a[1], b[2])  # (T, K) @ (E, K, N): K, N
    if kind == "inner":
        return kind, (a[0], b[1])  # (K, T) @ (T, N) -> (E, K, N): K, N
    if kind == "cols":
        return kind, (a[1], a[2])  # (E, M, K) @ (K, T): M, K
    raise ValueError(f"grouped GEMM of operand ranks {len(a)} and {len(b)}: no known layout")


def _shape_strides(t: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = tuple(int(d) for d in t["shape"])
    return shape, tuple(int(x) for x in (t.get("strides") or contiguous_strides(list(shape))))


def _operand(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """A tensor of ``shape`` and ``strides`` (a transposed weight stays transposed: the kernel sees the
    step's layout) on its own storage, filled with N(0, 1)."""
    import torch

    numel = 1 + sum((d - 1) * st for d, st in zip(shape, strides)) if all(shape) else 0
    return torch.randn(max(numel, 1), device=device).to(dtype).as_strided(shape, strides)


@dataclass
class Paired:
    """Seconds of each paired round's two passes (every moved grouped GEMM with the candidate's loads,
    then or before the same with the base's)."""

    candidate_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    stop: str = ""

    def differences(self) -> list[float]:
        return [c - b for c, b in zip(self.candidate_s, self.base_s)]


class PairedPasses:
    """The moved sites' grouped GEMMs ready to run: one pass with the candidate's group offsets and one with
    the base's (the same operands, the step's shapes, strides and dtype, each site its own tensors as each
    layer has its own). ``round(r)`` times the two passes of round ``r`` in ABBA order (rounds AB, BA, BA,
    AB: the candidate first in half of them, so that a linear drift of the host touches both alike),
    each after ``flush()`` (untimed: :func:`cache_flusher`'s, so that each pass starts from the step's cold
    caches). ``run(a, b, offs)`` is the grouped GEMM (``torch._grouped_mm``; injected by tests with ``clock``)."""

    def __init__(self, ss: list[Site], device: str, *, sync: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter, run: Callable[..., Any] | None = None,
                 flush: Callable[[], None] = lambda: None) -> None:
        import torch

        from ..dtypes import from_name

        dev = torch.device(device)
        self.run = run or (lambda a, b, offs: torch._grouped_mm(a, b, offs=offs))
        self.sync, self.clock, self.flush = sync, clock, flush
        self.work = []
        for s in (s for s in ss if s.moved):
            dt = from_name(s.dtype)
            a, b = (_operand(shape, strides, dt, dev) for shape, strides in s.operands)
            ends = [[sum(ls[:i + 1]) for i in range(len(ls))] for ls in (s.candidate, s.base)]
            self.work.append((a, b, *(torch.tensor(e, dtype=torch.int32, device=dev) for e in ends)))

    def one(self, side: int) -> float:
        """Seconds of one pass: ``side`` 0 the candidate's offsets, 1 the base's."""
        self.flush()
        self.sync()
        t0 = self.clock()
        for w in self.work:
            self.run(w[0], w[1], w[2 + side])
        self.sync()
        return self.clock() - t0

    def warm(self) -> None:
        """Two untimed pairs: the operands paged in, the kernels' first-call costs paid."""
        for _ in range(2):
            self.one(0)
            self.one(1)

    def round(self, r: int, into: Paired) -> None:
        """Round ``r``'s two passes, added to ``into``."""
        if r % 4 in (0, 3):
            c = self.one(0)
            b = self.one(1)
        else:
            b = self.one(1)
            c = self.one(0)
        into.candidate_s.append(c)
        into.base_s.append(b)


def time_sites(ss: list[Site], device: str, *, sync: Callable[[], None] = lambda: None,
               clock: Callable[[], float] = time.perf_counter, min_rounds: int = 21, rel_half_width: float = 0.1,
               time_cap_s: float = 15.0, run: Callable[..., Any] | None = None,
               flush: Callable[[], None] = lambda: None) -> Paired:
    """The paired rounds of :func:`predict` on their own (:class:`PairedPasses`, which the arguments are
    for): rounds are added (at least ``min_rounds``) until the difference's 95% half-width is within
    ``rel_half_width`` of its median or ``time_cap_s`` is spent. ``replay --against`` runs the rounds of
    :class:`PairedPasses` inside its measured rounds instead, one pair a round, so that the prediction and
    the measurement see one state of the host."""
    passes = PairedPasses(ss, device, sync=sync, clock=clock, run=run, flush=flush)
    out = Paired()
    passes.warm()
    t0 = clock()
    r = 0
    while True:
        passes.round(r, out)
        r += 1
        if r >= min_rounds:
            d = out.differences()
            lo, hi = median_interval(d)
            if (hi - lo) / 2 <= rel_half_width * abs(statistics.median(d)):
                out.stop = "half-width"
                break
            if clock() - t0 > time_cap_s:
                out.stop = "time cap"
                break
    return out


def predict(ss: list[Site], paired: Paired | None) -> Prediction:
    """The model's change (module docstring): the median paired difference candidate - base of the
    moved sites' passes, with its distribution-free 95% interval; exactly 0 when no load moved."""
    moved = [s for s in ss if s.moved]
    groups = sum(s.moved for s in moved)
    d = paired.differences() if paired is not None else []
    if not moved:
        return Prediction(0.0, 0.0, 0.0, 0, 0, 0)
    if not d:
        return Prediction(math.nan, math.nan, math.nan, 0, len(moved), groups)
    lo, hi = median_interval(d)
    return Prediction(statistics.median(d), lo, hi, len(d), len(moved), groups)


def verdict(pred_lo: float, pred_hi: float, meas_lo: float, meas_hi: float, floor: float = 0.0) -> str:
    """The measured ratio's 95% interval ``[meas_lo, meas_hi]`` against the predicted one, with the
    comparison's ``floor`` (what two sets of executors of one plan read apart in the same rounds), added
    linearly as an offset the rounds may not have averaged out:

    * ``fail``: the measured interval widened by the floor and the predicted interval are disjoint (the
      step moved otherwise than its expert loads predict, beyond the measurement, the model and the floor);
    * ``pass``: the *direction* is confirmed (the widened measured interval excludes 1 on the predicted
      side, which the predicted interval itself must exclude) and the *amount* is (the measured interval
      lies inside the predicted one widened by the floor); or no load moved (both predicted ends exactly
      1) and the widened measured interval holds 1;
    * ``inconclusive`` otherwise: a change the measurement does not resolve beyond the floor, a
      measurement too wide to place inside the prediction, or a prediction whose own interval holds 1
      (agreeing with a model that does not say which way confirms nothing); more rounds, a quieter host
      or a larger skew decide."""
    if not all(math.isfinite(x) for x in (pred_lo, pred_hi, meas_lo, meas_hi, floor)):
        return "inconclusive"
    wlo, whi = meas_lo - floor, meas_hi + floor
    if whi < pred_lo or wlo > pred_hi:
        return "fail"
    if pred_lo == pred_hi == 1:
        return "pass"
    direction = wlo > 1 if pred_lo > 1 else whi < 1 if pred_hi < 1 else False
    amount = pred_lo - floor <= meas_lo and meas_hi <= pred_hi + floor
    return "pass" if direction and amount else "inconclusive"


__all__ = ["FLUSH_CAPACITIES", "LAYOUTS", "Paired", "PairedPasses", "Prediction", "Site", "cache_flusher", "llc_bytes", "predict", "sites",
           "time_sites", "verdict"]
