"""What-ifs applied to a step before it is simulated: operator classes scaled by factors, the
existing transforms (``--dtype``, ``--batch-scale``) and a device profile, applied per operator.

The per-operator model (a roofline with the operator's achieved efficiency kept). An operator's
recorded time ``t`` is a fixed part ``o`` (dispatch and launch: the profile's ``launch_us``, else the
10th percentile of the step's operator times, never more than ``t``) plus its work ``w = t - o``:

- a GEMM or attention operator with known FLOPs keeps its fraction of the profile's GEMM throughput
  for its dtype, layout and size: ``w' = w * (F'/F) * (P_d(F) / P'_d'(F'))`` (FLOPs ``F``, throughput
  ``P`` of the dtype at that many FLOPs, for the op's layout, :func:`~.opmodel.gemm_layout`; a batched
  GEMM's ``F`` here is one product's, :attr:`~.opmodel.Work.unit_flops`).
  ``P(F)`` comes from the profile's GEMMs measured at several sizes (:meth:`Profile.tflops_at`): between
  two sampled sizes ``F_i <= F <= F_j`` it is interpolated linearly in ``log P`` against ``log F``; i.e.
  the time of a GEMM follows the power law ``t = t_i (F/F_i)^a`` through both points, which is exact
  at the sampled sizes and covers both regimes (``a = 0``: a call bound by its fixed cost; ``a = 1``:
  bound by the cores). Outside the sampled range ``P`` is clamped to the nearest end's. A profile with
  one size per dtype has a constant ``P``: the ratio of the dtypes' throughputs, as before sizes were
  sampled. An operator whose layout the profile has no curve for reads the ``nn`` curve.
  A GEMM whose product ``(batch, M, N, K)`` (:func:`~.opmodel.gemm_dims`), layout and dtype the profile
  measured at that very shape (``gemm_shape`` rows, ``validate performance --shapes-from``) reads ``P`` off
  that row instead (:meth:`Profile.gemm_rate`): a GEMM's throughput is a function of its three dimensions
  and layout, not of its FLOPs alone (a BLAS blocks ``M``, ``N`` and ``K`` apart; without a native kernel
  for a dtype, its conversion of each operand scales with that operand's size), so a tall and skinny GEMM
  does not run at the rate of the cube of its FLOPs. Here (1 thread, no AVX512-BF16) bert's
  ``(1024x256)(256x8192)`` ``nt`` runs fp32 at 39 GFLOP/s against the 86 of the cube curve at its FLOPs,
  and bf16 7x slower, not the curves' 13x. A profile measured at the workload's shapes is what vendors'
  models do (cuBLAS's heuristics, Lumos's and Daydream's kernel tables). The ratio ``P_d / P'_d'`` reads
  both sides off their shapes' rows when both profiles have them, else both off the curves: a curve misprices
  a shape by a bias that is largely common to the two sides (the same layout and proportions), which
  cancels in the ratio only when both sides carry it (a ``--batch-scale`` GEMM's new shape, unmeasured, reads
  the curves on both sides). The prediction's detail says how many GEMMs (and what share of their predicted
  time) were priced by shape;
- any other operator is split into the time its bytes take at the profile's memory bandwidth (at most
  ``w``), which scales with its bytes and the bandwidth, and the rest (its per-element work), which
  scales with its element count: ``w' = b * (B'/B) * (BW/BW') + (w - b) * (N'/N)``, each bandwidth that of
  the operator's dtype where the profile measured it (a triad of that dtype: without native arithmetic in a
  dtype, its halved bytes need not take half the time), else the float32 one. ``N`` counts the
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
a ``mystique validate performance`` results.csv: ``gemm_throughput`` rows (TFLOP/s per dtype at the
size in their subject, ``gemm_N``: ``2N^3`` FLOPs, layout ``nn``), ``gemm_curve`` rows (the same at each
size and layout, ``gemm_N_nt``), ``gemm_shape`` rows (the same at one GEMM's own shape, ``gemm_[bB]mMnNkK_LAYOUT``:
``validate performance --shapes-from``), ``attention_curve`` rows (scaled dot-product attention forward and
backward, TFLOP/s per dtype and size: an attention operator reads them, else the GEMM's), ``memory_bandwidth`` rows (GB/s, the best of them) and, where present, a
``launch_overhead`` row (us). A point whose host was too busy (``*_disturbed``) serves only where no
undisturbed one was measured at that size. A GEMM of a dtype the profile has no throughput for is refused
in one line (:func:`check_dtypes`): no other dtype's throughput stands in for it.
"""

from __future__ import annotations

import bisect
import copy
import math
import os
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UsageError
from ..io import show
from .graph import OpTiming, Step
from .kernels import Kernel
from .opmodel import FLOAT_DTYPES, Work, op_tensors, op_work
from .sim import CLASSES

#: a GEMM row's subject: ``gemm_N`` (layout ``nn``) or ``gemm_N_LAYOUT``
_GEMM_SUBJECT = re.compile(r"^gemm_(\d+)(?:_([nt]{2}))?$")
#: a gemm_shape row's subject: ``gemm_[bB]mMnNkK_LAYOUT`` (``B`` products of ``M x K`` by ``K x N``)
_SHAPE_SUBJECT = re.compile(r"^gemm_(?:b(\d+))?m(\d+)n(\d+)k(\d+)_([nt]{2})$")
#: an attention_curve row's subject: ``sdpa_fwd_bBhHlLdD`` (forward: 4BHL^2D FLOPs; backward 8BHL^2D)
_SDPA_SUBJECT = re.compile(r"^sdpa_(fwd|bwd)_b(\d+)h(\d+)l(\d+)d(\d+)$")
#: the curves a layout reads, in order
_FALLBACK = {"sdpa_bwd": ("sdpa_bwd", "sdpa", "nn"), "sdpa": ("sdpa", "nn")}


def interpolate(points: tuple[tuple[float, float], ...], flops: float) -> float:
    """The throughput at ``flops`` on a curve of ``(flops, throughput)`` points sorted by FLOPs: log-linear
    in log FLOPs between the two points around it, the nearest end's outside them (module docstring)."""
    xs = [f for f, _ in points]
    if flops <= xs[0] or len(points) == 1:
        return points[0][1]
    if flops >= xs[-1]:
        return points[-1][1]
    j = bisect.bisect_right(xs, flops)
    (f0, p0), (f1, p1) = points[j - 1], points[j]
    x = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
    return math.exp((1 - x) * math.log(p0) + x * math.log(p1))


@dataclass(frozen=True)
class Profile:
    """A device's throughput: GEMM TFLOP/s per dtype (the best measured), memory GB/s, per-operator launch
    overhead (us), and the GEMM throughput curves: ``(dtype, layout)`` -> ``(FLOPs, TFLOP/s)`` points sorted
    by FLOPs (:meth:`tflops_at`); ``source``: the results.csv it was read from."""

    name: str
    gemm_tflops: dict[str, float] = field(default_factory=dict)
    mem_gbps: float | None = None
    launch_us: float | None = None
    gemm_curves: dict[tuple[str, str], tuple[tuple[float, float], ...]] = field(default_factory=dict)
    source: str = ""
    mem_gbps_dtype: dict[str, float] = field(default_factory=dict)
    #: ``(dtype, layout, batch, M, N, K)`` -> TFLOP/s measured at that shape (``gemm_shape`` rows)
    gemm_shapes: dict[tuple[str, str, int, int, int, int], float] = field(default_factory=dict)

    def bandwidth(self, dtype: str) -> float | None:
        """The memory bandwidth an operator of ``dtype`` moves its bytes at: that dtype's triad where the profile
        measured one, else the (float32) best."""
        return self.mem_gbps_dtype.get(dtype) or self.mem_gbps

    def peak(self, dtype: str) -> float | None:
        v = self.gemm_tflops.get(dtype) or self.gemm_tflops.get("float32")
        return v if v and v > 0 else None

    def has_dtype(self, dtype: str) -> bool:
        return (bool(self.gemm_tflops.get(dtype)) or any(d == dtype for d, _ in self.gemm_curves)
                or any(k[0] == dtype for k in self.gemm_shapes))

    def gemm_rate(self, w: Work) -> tuple[float | None, bool]:
        """The throughput a GEMM or attention operator ``w`` runs at, and whether it is its own shape's: the
        ``gemm_shape`` row of its dtype, layout and ``(batch, M, N, K)`` where the profile has one (module
        docstring), else :meth:`tflops_at` its layout's curve at one product's FLOPs. Both are TFLOP/s of one
        product's rate (a batched row's FLOPs over its time: its products run one after another)."""
        if w.dims is not None and (v := self.gemm_shapes.get((w.dtype, w.layout, *w.dims))):
            return v, True
        return self.tflops_at(w.dtype, w.layout, w.unit_flops), False

    def tflops_at(self, dtype: str, layout: str, flops: float) -> float | None:
        """The GEMM throughput of ``dtype`` for an operator of ``flops`` FLOPs and ``layout`` (``nn`` when the
        profile has no curve of that layout; an attention backward reads the forward's curve, then ``nn``'s,
        as a profile from before attention was measured did): :func:`interpolate` on the sampled curve, the
        dtype's one figure when it has no curve, None when the profile has neither."""
        pts = next((c for lay in _FALLBACK.get(layout or "nn", (layout, "nn")) if (c := self.gemm_curves.get((dtype, lay)))),
                   None)
        if not pts:
            pts = next((c for (d, _), c in sorted(self.gemm_curves.items()) if d == dtype), None)
        if pts:
            return interpolate(pts, flops)
        v = self.gemm_tflops.get(dtype)
        return v if v and v > 0 else None


def _curves(points: dict[tuple[str, str, float], tuple[bool, float]]) -> dict[tuple[str, str], tuple[tuple[float, float], ...]]:
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for (dtype, layout, flops), (_, v) in points.items():
        out.setdefault((dtype, layout), []).append((flops, v))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _point(points: dict, key: tuple[str, str, float], clean: bool, v: float) -> None:
    if (clean, v) > points.get(key, (False, 0.0)):  # undisturbed first, then the best
        points[key] = (clean, v)


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
    shapes: dict[tuple[str, str, int, int, int, int], tuple[bool, float]] = {}
    points: dict[tuple[str, str, float], tuple[bool, float]] = {}  # (dtype, layout, FLOPs) -> (undisturbed, TFLOP/s)
    mem: list[float] = []
    by_dtype: dict[str, float] = {}
    launch = None
    name = ""
    for r in df.itertuples():
        v = r.value
        if not (isinstance(v, float) and math.isfinite(v) and v > 0):
            continue
        check = str(r.check)
        clean = not check.endswith("_disturbed")
        check = check.removesuffix("_disturbed")
        if check in ("gemm_throughput", "gemm_curve") and r.metric == "tflops" and r.dtype:
            if check == "gemm_throughput" and clean:
                gemm[str(r.dtype)] = max(gemm.get(str(r.dtype), 0.0), float(v))
            name = name or str(r.device_name)
            m = _GEMM_SUBJECT.match(str(r.subject))
            if m:
                _point(points, (str(r.dtype), m[2] or "nn", 2.0 * int(m[1]) ** 3), clean, float(v))
        elif check == "gemm_shape" and r.metric == "tflops" and r.dtype:
            m = _SHAPE_SUBJECT.match(str(r.subject))
            if m:
                _point(shapes, (str(r.dtype), m[5], int(m[1] or 1), int(m[2]), int(m[3]), int(m[4])), clean, float(v))
        elif check == "attention_curve" and r.metric == "tflops" and r.dtype:
            m = _SDPA_SUBJECT.match(str(r.subject))
            if m:
                b, h, n, d = (int(x) for x in m.groups()[1:])
                fwd = m[1] == "fwd"
                _point(points, (str(r.dtype), "sdpa" if fwd else "sdpa_bwd", (4.0 if fwd else 8.0) * b * h * n * n * d),
                       clean, float(v))
        elif check == "memory_bandwidth" and r.metric == "gbps" and clean:
            if str(r.dtype or "float32") == "float32":
                mem.append(float(v))
            else:
                by_dtype[str(r.dtype)] = max(by_dtype.get(str(r.dtype), 0.0), float(v))
        elif check == "launch_overhead" and r.unit == "us" and clean:
            launch = float(v)
    if not gemm and not mem and not points and not shapes:
        raise UsageError(f"{show(p)}: no gemm_throughput or memory_bandwidth rows: not a `mystique validate "
                         "performance` run (its micro group writes them)")
    best = max(mem) if mem else None
    if best is not None:  # a dtype's triad at the float32 bandwidth or above it is the float32 figure's noise
        by_dtype = {d: v for d, v in by_dtype.items() if v < best}
    return Profile(name or show(p), gemm, best, launch, _curves(points), show(p), by_dtype,
                   {k: v for k, (_, v) in shapes.items()})


def check_dtypes(pairs: list[tuple[Work, Work]], base: Profile | None, target: Profile | None) -> None:
    """UsageError, in one line, when a GEMM or attention operator's dtype (``w0``'s on ``base``, ``w1``'s on
    ``target``) has no throughput in its profile: predicting it from another dtype's would be a guess."""
    for prof, role, dtypes in ((base, "--profile", {w0.dtype for w0, _ in pairs}),
                               (target, "the target profile", {w1.dtype or w0.dtype for w0, w1 in pairs})):
        if prof is None:
            continue
        missing = sorted(d for d in dtypes if d in FLOAT_DTYPES and not prof.has_dtype(d))
        if missing:
            raise UsageError(f"{role} {prof.source or prof.name}: no GEMM throughput for {', '.join(missing)} (no "
                             "gemm_throughput or gemm_curve row of that dtype), which the step's GEMMs need: measure "
                             "it with `mystique validate performance` on that device")


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
        if p0 is not None and p1 is not None:
            t1 = _as_target(w0, w1)
            (before, exact0), (after, exact1) = p0.gemm_rate(w0), p1.gemm_rate(t1)
            if exact0 != exact1:  # one side by its shape, the other by the curve: both by the curves
                before = p0.tflops_at(w0.dtype, w0.layout, w0.unit_flops)
                after = p1.tflops_at(t1.dtype, t1.layout, t1.unit_flops)
            if before and after:
                speed = before / after
        return fixed + work * (w1.flops / w0.flops) * speed
    bw_part = 0.0
    bw_old = p0.bandwidth(w0.dtype) if p0 is not None else None
    if bw_old and w0.bytes > 0:
        bw_part = min(work, w0.bytes / (bw_old * 1e9) * 1e6)
    d1 = w1.dtype or w0.dtype
    bw_new = p1.bandwidth(d1) if p1 is not None and p1.mem_gbps else (p0.bandwidth(d1) if p0 is not None else None)
    bw_ratio = (bw_old / bw_new) if bw_old and bw_new else 1.0
    byte_ratio = w1.bytes / w0.bytes if w0.bytes > 0 else 1.0
    elem_ratio = n1 / n0 if n0 > 0 else 1.0
    return fixed + bw_part * byte_ratio * bw_ratio + (work - bw_part) * elem_ratio


def _as_target(w0: Work, w1: Work) -> Work:
    """The transformed operator ``w1`` with the dtype and layout of ``w0`` where it names none."""
    return w1 if w1.dtype and w1.layout else replace(w1, dtype=w1.dtype or w0.dtype, layout=w1.layout or w0.layout)


def roofline_us(cls: str, w: Work, p: Profile) -> float:
    """An operator's time on a device at its profile's measured throughput: its FLOPs at the GEMM
    throughput of its dtype, layout and shape (GEMM and attention; :meth:`Profile.gemm_rate`) or its bytes at
    the memory bandwidth of its dtype (:meth:`Profile.bandwidth`, as :func:`op_time` reads it), the larger."""
    tflops = (p.gemm_rate(w)[0] or p.peak(w.dtype)) if cls in ("gemm", "attention") and w.flops else None
    compute = w.flops / (tflops * 1e12) * 1e6 if tflops else 0.0
    bw = p.bandwidth(w.dtype)
    memory = w.bytes / (bw * 1e9) * 1e6 if bw and w.bytes else 0.0
    return max(compute, memory)


def priced_by_shape(step: Step, works: list[tuple[Work, Work]], new_ops: list[OpTiming], base: Profile | None,
                    target: Profile | None) -> str:
    """One clause for the prediction's detail: how many GEMMs the ``gemm_shape`` rows priced (both sides' shapes
    measured), how many had one side's only (priced by the curves, :func:`op_time`) and their share of the
    GEMMs' predicted time; '' when neither profile has such rows."""
    if not ((base is not None and base.gemm_shapes) or (target is not None and target.gemm_shapes)):
        return ""
    n = both = one = 0
    t_both = t_all = 0.0
    for ot, new, (w0, w1) in zip(step.ops, new_ops, works):
        if ot.cls != "gemm" or w0.flops <= 0:
            continue
        n += 1
        hits = sum(p is not None and p.gemm_rate(w)[1] for p, w in ((base, w0), (target, _as_target(w0, w1))))
        t = new.host_us + sum(k.dur_us for k in new.kernels)
        t_all += t
        both += hits == 2
        one += hits == 1
        t_both += t if hits == 2 else 0.0
    share = f" ({t_both / t_all:.1%} of their predicted time)" if t_all > 0 else ""
    return (f"{both} of {n} GEMMs{share} priced by their own shapes' gemm_shape rows; the rest by the curves' "
            f"interpolation in FLOPs ({one} of them had a row on one side only)")


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
    works = [(op_work(op0, t0), op_work(op1, t1)) for op0, op1 in zip(step.plan.ops, new_plan.ops)]
    check_dtypes([w for ot, w in zip(step.ops, works) if ot.cls in ("gemm", "attention") and w[0].flops > 0],
                 base, target)
    for ot, op0, op1, (w0, w1) in zip(step.ops, step.plan.ops, new_plan.ops, works):
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
    note = priced_by_shape(step, works, ops, base, target)
    if note:
        new.notes = [*step.notes, note]
    return new


def describe(profile: Profile | None) -> str:
    if profile is None:
        return "no profile"
    g = ", ".join(f"{d} {v:.3g} TFLOP/s" for d, v in sorted(profile.gemm_tflops.items()))
    shapes = f"; {len(profile.gemm_shapes)} gemm_shape rows" if profile.gemm_shapes else ""
    n = {}
    for (d, _), pts in profile.gemm_curves.items():
        n[d] = n.get(d, 0) + len(pts)
    if any(k > 1 for k in n.values()):
        lo_hi = {d: [v for (dd, _), pts in profile.gemm_curves.items() if dd == d for _, v in pts] for d in n}
        g = ", ".join(f"{d} {min(v):.3g}-{max(v):.3g} TFLOP/s at {n[d]} sizes and layouts" for d, v in sorted(lo_hi.items()))
        g += (" (a GEMM's throughput interpolated log-log in its FLOPs between the sizes of its dtype and layout, "
              "clamped at the ends)")
    return (f"{profile.name}: GEMM {g or 'unknown'}; memory {profile.mem_gbps:.3g} GB/s" if profile.mem_gbps
            else f"{profile.name}: GEMM {g or 'unknown'}") + shapes + (f"; launch {profile.launch_us:.3g} us"
                                                                       if profile.launch_us is not None else "")


def median_op_us(step: Step) -> float:
    xs = [o.host_us for o in step.ops if o.host_us > 0]
    return statistics.median(xs) if xs else 0.0


__all__ = ["Profile", "apply_model", "check_dtypes", "interpolate", "priced_by_shape", "roofline_us", "describe", "fixed_us", "op_time", "parse_factors", "read_profile",
           "scale_classes", "transformed_plan"]
