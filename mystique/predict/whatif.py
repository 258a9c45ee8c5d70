"""What-ifs applied to a step before it is simulated: operator classes scaled by factors, the
existing transforms (``--dtype``, ``--batch-scale``) and a device profile, applied per operator.

The per-operator model (a roofline with the operator's achieved efficiency kept). An operator's
recorded time ``t`` is a fixed part ``o`` (dispatch and launch: the profile's ``launch_us``, else the
10th percentile of the step's operator times, never more than ``t``) plus its work ``w = t - o``:

- a GEMM or attention operator with known FLOPs keeps its fraction of the profile's GEMM throughput
  for its dtype: ``w' = w * (F'/F) * (P_d / P'_d')`` (FLOPs ``F``, throughput ``P`` of the dtype);
- any other operator is split into the time its bytes take at the profile's memory bandwidth (at most
  ``w``), which scales with its bytes and the bandwidth, and the rest (its per-element work), which
  scales with its element count: ``w' = b * (B'/B) * (BW/BW') + (w - b) * (N'/N)``. ``N`` counts the
  elements the operator reads and writes, its inputs' and outputs' (a reduction's work is its input's,
  an embedding bag's backward its ids' and gradient rows' as well as the table-sized gradient it
  fills), except a lookup's table (``embedding``, ``embedding_bag``, ``index_select``), read only at
  the rows it gathers, which its output counts; a lookup's backward adds one gradient row of ``D`` per
  id into the table's gradient it fills, so it counts ``ids x D`` and its output.

A host-only step (a CPU capture) predicted on a device (``--target-profile``) keeps no host efficiency:
each operator's host time becomes its dispatch (``o``, or the target's ``launch_us``) and it launches
one kernel of the operator's roofline time at the target's measured throughput (:func:`roofline_us`):
a lower bound of the device time, with host and device overlapping as the simulation plays them.

The transforms change shapes and dtypes exactly as ``mystique generate`` does
(:func:`mystique.replay.generate.retarget_dtype`, :func:`~mystique.replay.generate.rescale_batch`), so
the prediction is of the benchmark that ``generate --dtype/--batch-scale`` writes. A profile comes from
a ``mystique validate performance`` results.csv: ``gemm_throughput`` rows (TFLOP/s per dtype),
``memory_bandwidth`` rows (GB/s, the best of them) and, where present, a ``launch_overhead`` row (us).
"""

from __future__ import annotations

import copy
import math
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UsageError
from ..io import show
from .graph import OpTiming, Step
from .kernels import Kernel
from .opmodel import Work, op_tensors, op_work
from .sim import CLASSES


@dataclass(frozen=True)
class Profile:
    """A device's throughput: GEMM TFLOP/s per dtype, memory GB/s, per-operator launch overhead (us)."""

    name: str
    gemm_tflops: dict[str, float] = field(default_factory=dict)
    mem_gbps: float | None = None
    launch_us: float | None = None

    def peak(self, dtype: str) -> float | None:
        v = self.gemm_tflops.get(dtype) or self.gemm_tflops.get("float32")
        return v if v and v > 0 else None


def read_profile(path: str | os.PathLike) -> Profile:
    """The :class:`Profile` in a ``validate performance`` results.csv (UsageError when it holds none)."""
    from ..results import read_csv

    p = Path(path)
    if p.is_dir():
        p = p / "results.csv"
    if not p.is_file():
        raise UsageError(f"{show(p)}: no such results.csv (a `mystique validate performance` run's)")
    try:
        df = read_csv(p)
    except (ValueError, KeyError, OSError) as exc:
        raise UsageError(f"{show(p)}: not a results.csv: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    gemm: dict[str, float] = {}
    mem: list[float] = []
    launch = None
    name = ""
    for r in df.itertuples():
        v = r.value
        if not (isinstance(v, float) and math.isfinite(v) and v > 0):
            continue
        if r.check == "gemm_throughput" and r.metric == "tflops" and r.dtype:
            gemm[str(r.dtype)] = max(gemm.get(str(r.dtype), 0.0), float(v))
            name = name or str(r.device_name)
        elif r.check == "memory_bandwidth" and r.metric == "gbps":
            mem.append(float(v))
        elif r.check == "launch_overhead" and r.unit == "us":
            launch = float(v)
    if not gemm and not mem:
        raise UsageError(f"{show(p)}: no gemm_throughput or memory_bandwidth rows: not a `mystique validate "
                         "performance` run (its micro group writes them)")
    return Profile(name or show(p), gemm, max(mem) if mem else None, launch)


def parse_factors(spec: str | None) -> dict[str, float]:
    """``gemm=0.5,host=2`` -> {class: factor} (UsageError naming a bad entry)."""
    out: dict[str, float] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in CLASSES:
            raise UsageError(f"--scale {part.strip()!r}: expected CLASS=FACTOR with CLASS one of {', '.join(CLASSES)}")
        try:
            f = float(v)
        except ValueError as exc:
            raise UsageError(f"--scale {part.strip()!r}: {v.strip()!r} is not a number") from exc
        if not (math.isfinite(f) and f >= 0):
            raise UsageError(f"--scale {part.strip()!r}: the factor must be a finite number >= 0")
        out[k] = f
    return out


def scale_classes(step: Step, factors: dict[str, float]) -> Step:
    """The step with every task of class C taking ``factors[C]`` times as long (host: gaps, lead, tail,
    and a device step's host operator time)."""
    if not factors:
        return step
    host = factors.get("host", 1.0)
    new = copy.copy(step)
    new.lead_us, new.tail_us = step.lead_us * host, step.tail_us * host
    ops = []
    for o in step.ops:
        f_op = host if o.kernels and o.cls != "communication" else factors.get(o.cls, 1.0)
        kernels = [replace(k, dur_us=k.dur_us * factors.get(_kernel_cls(k.name, o), 1.0)) for k in o.kernels]
        ops.append(replace(o, host_us=o.host_us * f_op, gap_us=o.gap_us * host, kernels=kernels))
    new.ops = ops
    return new


def _kernel_cls(name: str, o: OpTiming) -> str:
    from .opmodel import kernel_class

    kc = kernel_class(name)
    return kc if kc != "memory" else o.cls


def fixed_us(step: Step, profile: Profile | None) -> float:
    """The fixed part of an operator's time (see the module docstring)."""
    if profile is not None and profile.launch_us is not None:
        return profile.launch_us
    times = sorted(o.host_us for o in step.ops if o.host_us > 0)
    return times[len(times) // 10] if times else 0.0


#: lookups whose first input is a table read only at the rows they gather (see the module docstring)
GATHER_OPS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag",
                        "aten::_embedding_bag_forward_only", "aten::index_select"})


#: lookups' backwards (gradient, ids, ...): one gradient row per id accumulated into the table's gradient
GATHER_BACKWARD_OPS = frozenset({"aten::_embedding_bag_backward", "aten::_embedding_bag_dense_backward",
                                 "aten::embedding_backward", "aten::embedding_dense_backward"})


def _numel(op: dict, tensors: dict) -> int:
    """The elements an operator reads and writes (see the module docstring)."""
    ins, outs = op_tensors(op, tensors)
    name = str(op.get("name", "")).split(".", 1)[0]
    if name in GATHER_OPS:
        ins = ins[1:]
    elif name in GATHER_BACKWARD_OPS and len(ins) >= 2 and ins[0].shape:
        return ins[1].numel * ins[0].shape[-1] + sum(t.numel for t in outs)
    return sum(t.numel for t in ins) + sum(t.numel for t in outs)


def op_time(t: float, o: float, cls: str, w0: Work, w1: Work, n0: int, n1: int, p0: Profile | None,
            p1: Profile | None) -> float:
    """One operator's predicted time (see the module docstring)."""
    fixed = min(o, t)
    work = t - fixed
    if cls in ("gemm", "attention") and w0.flops > 0:
        speed = 1.0
        if p0 is not None and p1 is not None and p0.peak(w0.dtype) and p1.peak(w1.dtype or w0.dtype):
            speed = p0.peak(w0.dtype) / p1.peak(w1.dtype or w0.dtype)
        return fixed + work * (w1.flops / w0.flops) * speed
    bw_part = 0.0
    if p0 is not None and p0.mem_gbps and w0.bytes > 0:
        bw_part = min(work, w0.bytes / (p0.mem_gbps * 1e9) * 1e6)
    bw_new = p1.mem_gbps if p1 is not None and p1.mem_gbps else (p0.mem_gbps if p0 is not None else None)
    bw_ratio = (p0.mem_gbps / bw_new) if p0 is not None and p0.mem_gbps and bw_new else 1.0
    byte_ratio = w1.bytes / w0.bytes if w0.bytes > 0 else 1.0
    elem_ratio = n1 / n0 if n0 > 0 else 1.0
    return fixed + bw_part * byte_ratio * bw_ratio + (work - bw_part) * elem_ratio


def roofline_us(cls: str, w: Work, p: Profile) -> float:
    """An operator's time on a device at its profile's measured throughput: its FLOPs at the GEMM
    throughput of its dtype (GEMM and attention) or its bytes at the memory bandwidth, the larger."""
    compute = w.flops / (p.peak(w.dtype) * 1e12) * 1e6 if cls in ("gemm", "attention") and w.flops and p.peak(w.dtype) else 0.0
    memory = w.bytes / (p.mem_gbps * 1e9) * 1e6 if p.mem_gbps and w.bytes else 0.0
    return max(compute, memory)


def transformed_plan(step: Step, *, dtype: str | None, batch_scale: float | None, allow_ops: tuple[str, ...] = ()):
    """The plan ``mystique generate --dtype/--batch-scale`` makes of the step's plan."""
    from ..replay.generate import rescale_batch, retarget_dtype

    plan = step.plan.copy()
    if batch_scale is not None and batch_scale != 1:
        plan = rescale_batch(plan, batch_scale, allow_ops)
    if dtype:
        plan = retarget_dtype(plan, dtype)
    if len(plan.ops) != len(step.plan.ops):
        raise UsageError(f"the transformed plan has {len(plan.ops)} ops, the step {len(step.plan.ops)}: "
                         "no op-by-op prediction")
    return plan


def apply_model(step: Step, new_plan, base: Profile | None, target: Profile | None) -> Step:
    """The step with each operator's time (or its kernels', on a device) as :func:`op_time` predicts for
    ``new_plan``'s shapes and dtypes and the ``target`` profile (``base``: the profile the step ran at)."""
    t0 = {t["id"]: t for t in step.plan.tensors}
    t1 = {t["id"]: t for t in new_plan.tensors}
    o = fixed_us(step, base)
    new = copy.copy(step)
    ops = []
    to_device = target is not None and target is not base and not step.on_device
    for ot, op0, op1 in zip(step.ops, step.plan.ops, new_plan.ops):
        w0, w1 = op_work(op0, t0), op_work(op1, t1)
        n0, n1 = _numel(op0, t0), _numel(op1, t1)
        if to_device:  # a host-only step onto a device: the host dispatches, the device runs the roofline
            host = min(o, ot.host_us) if target.launch_us is None else target.launch_us
            kernel = Kernel(ot.name, "0", roofline_us(ot.cls, w1, target), 1.0)
            ops.append(replace(ot, host_us=host, kernels=[kernel] if kernel.dur_us > 0 else []))
        elif ot.kernels:  # device work scales; the host's launch time does not
            kernels = [replace(k, dur_us=op_time(k.dur_us, 0.0, ot.cls, w0, w1, n0, n1, base, target))
                       for k in ot.kernels]
            ops.append(replace(ot, kernels=kernels))
        else:
            ops.append(replace(ot, host_us=op_time(ot.host_us, o, ot.cls, w0, w1, n0, n1, base, target)))
    new.ops = ops
    return new


def describe(profile: Profile | None) -> str:
    if profile is None:
        return "no profile"
    g = ", ".join(f"{d} {v:.3g} TFLOP/s" for d, v in sorted(profile.gemm_tflops.items()))
    return (f"{profile.name}: GEMM {g or 'unknown'}; memory {profile.mem_gbps:.3g} GB/s" if profile.mem_gbps
            else f"{profile.name}: GEMM {g or 'unknown'}") + (f"; launch {profile.launch_us:.3g} us"
                                                              if profile.launch_us is not None else "")


def median_op_us(step: Step) -> float:
    xs = [o.host_us for o in step.ops if o.host_us > 0]
    return statistics.median(xs) if xs else 0.0


__all__ = ["Profile", "apply_model", "roofline_us", "describe", "fixed_us", "op_time", "parse_factors", "read_profile",
           "scale_classes", "transformed_plan"]
