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

What it leaves out is the step's context: in the step the other ops run between two grouped GEMMs
(their operands may be evicted; a skewed GEMM reads fewer experts' weights and may evict less of the
next op's data). The check reports that rather than widening a tolerance.
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


def time_sites(ss: list[Site], device: str, *, sync: Callable[[], None] = lambda: None,
               clock: Callable[[], float] = time.perf_counter, min_rounds: int = 21, rel_half_width: float = 0.1,
               time_cap_s: float = 15.0, run: Callable[..., Any] | None = None) -> Paired:
    """The paired rounds of :func:`predict`: per round one pass of the moved sites' grouped GEMMs with the
    candidate's group offsets and one with the base's (the same operands, the step's shapes, strides and
    dtype, each site its own tensors as each layer has its own), in ABBA order so that a linear drift of
    the host touches both alike. Rounds are added (at least ``min_rounds``) until the difference's 95%
    half-width is within ``rel_half_width`` of its median or ``time_cap_s`` is spent. ``run(a, b, offs)``
    is the grouped GEMM (``torch._grouped_mm``; injected by tests with ``clock``)."""
    import torch

    from ..dtypes import from_name

    dev = torch.device(device)
    if run is None:
        run = lambda a, b, offs: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
    work = []
    for s in (s for s in ss if s.moved):
        dt = from_name(s.dtype)
        a, b = (_operand(shape, strides, dt, dev) for shape, strides in s.operands)
        ends = [[sum(ls[:i + 1]) for i in range(len(ls))] for ls in (s.candidate, s.base)]
        work.append((a, b, *(torch.tensor(e, dtype=torch.int32, device=dev) for e in ends)))

    def one(side: int) -> float:
        sync()
        t0 = clock()
        for w in work:
            run(w[0], w[1], w[2 + side])
        sync()
        return clock() - t0

    out = Paired()
    for _ in range(2):  # warm-up: the operands paged in, the kernels' first-call costs paid
        one(0)
        one(1)
    t0 = clock()
    r = 0
    while True:
        if r % 4 in (0, 3):  # rounds AB, BA, BA, AB: the candidate first in half of them
            c = one(0)
            b = one(1)
        else:
            b = one(1)
            c = one(0)
        out.candidate_s.append(c)
        out.base_s.append(b)
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


__all__ = ["LAYOUTS", "Paired", "Prediction", "Site", "predict", "sites", "time_sites", "verdict"]
