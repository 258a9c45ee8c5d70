"""The cost model of a routing change: what a step should gain or lose when its experts' loads move.

A mixture of experts' grouped GEMM (``aten::_grouped_mm``) multiplies each expert's group of tokens
by that expert's weights. Two benchmarks of one capture that differ only in their routing (``generate
--routing uniform|skewed:ALPHA``, each layer's total tokens kept) run the same ops on the same shapes
except for the group sizes of their pinned grouped GEMMs. The model:

    step(candidate) - step(base) = sum over pinned grouped GEMMs g and experts e of
                                   t_g(n_e^candidate) - t_g(n_e^base)

where ``t_g(n)`` is the time of one group of ``n`` tokens of GEMM ``g``'s shape and layout (forward
``(n, K) @ (K, N)``; a weight gradient's ``(K, n) @ (n, N)``; an input gradient's ``(M, K) @ (K, n)``),
measured here by :func:`time_points`: the device's own ``torch._grouped_mm`` with one group, at exactly
the sizes the two routings use (no curve is fitted, so no interpolation error: GEMM time is not linear in
``n`` for small ``n``, where a kernel's blocking and per-call cost dominate). The per-call and per-group
costs cancel (each side runs every GEMM once with the same number of groups); every other op of the step
keeps its shapes (the ops that compute the routing still run on their synthetic data; only the grouped
GEMMs read the pinned loads), so the model says they do not move.

The prediction's uncertainty is the sum, over the terms, of each measured point's 95% half-width (the
distribution-free interval of the median of its timed batches): a linear sum, since a point used by
several layers carries the same error into each. What it leaves out is the step's context (operands cold
in cache in the step, hot in the isolated timing); the check reports it rather than widening a tolerance.
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


@dataclass
class Point:
    """One measured group time: median seconds per call with its 95% interval."""

    median_s: float
    low_s: float
    high_s: float
    samples: list[float] = field(default_factory=list)

    @property
    def half_width_s(self) -> float:
        return max(self.high_s - self.median_s, self.median_s - self.low_s)


@dataclass
class Prediction:
    """The predicted change of the step (seconds, candidate - base) and its uncertainty (seconds)."""

    delta_s: float
    uncertainty_s: float
    terms: int  # expert groups whose load differs between the two plans
    points: int  # distinct (layout, dims, dtype, n) timed

    def ratio(self, base_s: float) -> tuple[float, float, float]:
        """The predicted candidate / base step ratio on a base step of ``base_s``, and its interval."""
        if not (base_s > 0 and math.isfinite(base_s)):
            return math.nan, math.nan, math.nan
        return (1 + self.delta_s / base_s, 1 + (self.delta_s - self.uncertainty_s) / base_s,
                1 + (self.delta_s + self.uncertainty_s) / base_s)


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
        out.append(Site(pin["node_id"], *_layout(list(a["shape"]), list(b["shape"])), a["dtype"], tuple(cand), tuple(bas)))
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


def needed(ss: list[Site]) -> set[tuple[str, tuple[int, int], str, int]]:
    """The points the prediction needs: (layout, dims, dtype, n) for every load that differs."""
    out = set()
    for s in ss:
        for c, b in zip(s.candidate, s.base):
            if c != b:
                out.add((s.layout, s.dims, s.dtype, c))
                out.add((s.layout, s.dims, s.dtype, b))
    return out


def predict(ss: list[Site], points: dict[tuple[str, tuple[int, int], str, int], Point]) -> Prediction:
    """The model's change (see the module docstring) from measured ``points``."""
    delta = unc = 0.0
    terms = 0
    for s in ss:
        for c, b in zip(s.candidate, s.base):
            if c == b:
                continue
            pc, pb = points[(s.layout, s.dims, s.dtype, c)], points[(s.layout, s.dims, s.dtype, b)]
            delta += pc.median_s - pb.median_s
            unc += pc.half_width_s + pb.half_width_s
            terms += 1
    return Prediction(delta, unc, terms, len(needed(ss)))


def _operands(layout: str, dims: tuple[int, int], n: int, dtype: Any, device: Any) -> tuple[Any, Any, Any]:
    import torch

    d0, d1 = dims
    offs = torch.tensor([n], dtype=torch.int32, device=device)
    if layout == "rows":
        return torch.randn(n, d0, device=device).to(dtype), torch.randn(1, d0, d1, device=device).to(dtype), offs
    if layout == "inner":  # the weight gradient: x^T (K, T) grouped along T
        return (torch.randn(n, d0, device=device).to(dtype).t(), torch.randn(n, d1, device=device).to(dtype), offs)
    return torch.randn(1, d0, d1, device=device).to(dtype), torch.randn(n, d1, device=device).to(dtype).t(), offs


def time_points(keys: set[tuple[str, tuple[int, int], str, int]], device: str, *, batches: int = 31,
                batch_s: float = 0.01, sync: Callable[[], None] = lambda: None,
                clock: Callable[[], float] = time.perf_counter) -> dict[Any, Point]:
    """Each point's time per call: ``batches`` batches of calls (as many as fill ``batch_s``, found on
    a first batch), interleaved across points so that the host's drift touches all alike; the median
    of the batches' per-call times with its 95% interval."""
    import torch

    from ..dtypes import from_name

    dev = torch.device(device)
    ops = {k: _operands(k[0], k[1], k[3], from_name(k[2]), dev) for k in sorted(keys)}
    reps = {}
    for k, (a, b, offs) in ops.items():
        for _ in range(3):
            torch._grouped_mm(a, b, offs=offs)
        sync()
        once = []
        for _ in range(3):
            t0 = clock()
            torch._grouped_mm(a, b, offs=offs)
            sync()
            once.append(clock() - t0)
        reps[k] = max(1, min(1000, int(batch_s / max(min(once), 1e-7))))
    samples: dict[Any, list[float]] = {k: [] for k in ops}
    for _ in range(batches):
        for k, (a, b, offs) in ops.items():
            t0 = clock()
            for _ in range(reps[k]):
                torch._grouped_mm(a, b, offs=offs)
            sync()
            samples[k].append((clock() - t0) / reps[k])
    out = {}
    for k, xs in samples.items():
        lo, hi = median_interval(xs)
        out[k] = Point(statistics.median(xs), lo, hi, xs)
    return out


def verdict(pred_lo: float, pred_hi: float, meas_lo: float, meas_hi: float) -> str:
    """The measured ratio's 95% interval against the predicted one. ``fail``: disjoint (the step moved
    otherwise than its expert loads predict, beyond both intervals); ``pass``: they overlap and either
    the model predicts a change (its interval excludes 1) whose direction the measurement resolves (its
    interval excludes 1 on the same side), or the model predicts exactly none (no load moved: both ends
    1); ``inconclusive``: they overlap otherwise, a predicted change the measurement does not resolve
    (more rounds, a quieter host or a larger skew decide) or a prediction whose own interval holds 1
    (the model does not say which way the step moves, so agreeing with it confirms nothing)."""
    if not all(math.isfinite(x) for x in (pred_lo, pred_hi, meas_lo, meas_hi)):
        return "inconclusive"
    if meas_hi < pred_lo or meas_lo > pred_hi:
        return "fail"
    if pred_lo == pred_hi == 1:
        return "pass"
    if pred_lo > 1:
        return "pass" if meas_lo > 1 else "inconclusive"
    if pred_hi < 1:
        return "pass" if meas_hi < 1 else "inconclusive"
    return "inconclusive"


__all__ = ["LAYOUTS", "Point", "Prediction", "Site", "needed", "predict", "sites", "time_points", "verdict"]
