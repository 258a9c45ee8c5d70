"""Operator-by-operator replay of a benchmark plan on the target, the reference device and fp64.

:class:`PlanWalker` keeps the values of a plan's tensors on one device the way the replay
executor does (seeded synthetic inputs, views of storages produced by earlier ops, synthetic
stand-ins for results that disagree with the trace, storages dropped after their last use).
:func:`lockstep` walks a plan on the reference device and, for every operator, runs the same
operator on copies of the same inputs on the target (inside ``target.active()``) and in fp64 on
the CPU (outside it), then judges each output with :func:`.tolerance.judge`. Because every op
is fed the reference device's state, a divergence cannot cascade: the first failing op is the
first divergent op. :func:`replay_digests` runs a plan on the target alone and fingerprints every
op's outputs (for the repeatability check).

The replay engine's public helpers are used for everything the plan encodes
(:func:`~mystique.replay.executor.decode_value`, :func:`~mystique.replay.executor.resolve_overload`,
:func:`~mystique.replay.executor.substitute`, :func:`~mystique.replay.executor.fill_storage`,
:meth:`~mystique.replay.executor.Executor.synth`, :meth:`~mystique.replay.executor.Executor.map_device`,
:func:`~mystique.replay.executor.schedule`); the per-op driving loop is ours because the executor
has no per-op hook.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mystique.replay import executor as rx

from . import semantics
from . import tolerance as tol

RANDOM_OPS = semantics.RANDOM_OPS  # random draws: compared never (see semantics.random_draw)
# Operators whose results are undefined memory: compared never; their outputs are zero-filled on
# the reference so that every consumer reads defined values.
UNDEFINED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set", "resize", "resize_as",
    "_empty_affine_quantized", "empty_permuted",
})


base_op_name = semantics.base_op_name


def classify(name: str, bound: dict[str, Any] | None = None) -> str | None:
    """``"random op"``, ``"undefined memory"`` or None (compared) for an operator name and, when
    given, its arguments by name (a dropout with ``p = 0`` or ``train`` false draws nothing)."""
    base = base_op_name(name)
    if semantics.random_draw(name, bound):
        return "random op"
    if base in UNDEFINED_OPS:
        return "undefined memory"
    return None


# ----------------------------------------------------------------------------------------------
# Copies that keep storage sharing


def clone_group(values: Sequence[torch.Tensor], device: torch.device | Sequence[torch.device], *,
                upcast: bool = False, perturb: torch.Generator | None = None) -> list[torch.Tensor]:
    """Copies of ``values`` on ``device`` (one device, or one per value) that alias each other
    exactly as the originals do.

    Each distinct storage is copied once, whole, and every tensor is set onto its copy with the
    original sizes, strides and offset (sharing its memory, not an autograd view of it, like the
    executor's materialised tensors), so in-place and ``out=`` operators and
    ``as_strided`` views see the same memory layout. ``upcast`` turns floating storages into
    float64; ``perturb`` (a generator) then multiplies every floating element by ``1 + u * r``,
    ``r`` uniform in [-1, 1], ``u`` the unit roundoff of the accumulation dtype of its original
    dtype. A storage read with two dtypes is copied per tensor (views of it do not alias then).
    """
    cache: dict[tuple[str, int, int, str], tuple[torch.Tensor, torch.dtype]] = {}
    out: list[torch.Tensor] = []
    devices = [device] * len(values) if isinstance(device, torch.device) else list(device)
    for t, dev in zip(values, devices):
        new_dtype = torch.float64 if upcast and t.dtype.is_floating_point else t.dtype
        if t.layout != torch.strided:
            out.append(t.detach().to(device=dev, dtype=new_dtype, copy=True))
            continue
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr(), st.nbytes(), str(dev))
        entry = cache.get(key)
        base = None
        if entry is not None and entry[1] == t.dtype:
            base = entry[0]
        else:
            itemsize = t.element_size()
            n = st.nbytes() // itemsize
            flat = torch.empty(0, dtype=t.dtype, device=t.device)
            flat.set_(st, 0, (n,), (1,))
            base = flat.detach().to(device=dev, dtype=new_dtype, copy=True)
            if perturb is not None and base.dtype.is_floating_point and base.numel():
                u = tol.unit_roundoff(tol.accumulation_dtype(t.dtype))
                r = torch.rand(base.shape, generator=perturb, dtype=torch.float64).to(base.device)
                base.mul_(1.0 + u * (2.0 * r - 1.0))
            if entry is None:
                cache[key] = (base, t.dtype)
        try:  # a tensor on the copied storage (not an autograd view of it: in-place detach_ works)
            v = torch.empty(0, dtype=base.dtype, device=base.device)
            v.set_(base.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            out.append(v)
        except RuntimeError:
            out.append(t.detach().to(device=dev, dtype=new_dtype, copy=True))
    return out


# ----------------------------------------------------------------------------------------------
# Arguments


def fill_slots(value: Any, lookup: Callable[[int], Any]) -> Any:
    """A copy of a decoded argument with every :class:`TensorSlot` replaced by ``lookup(tid)``."""
    if isinstance(value, rx.TensorSlot):
        return lookup(value.tid)
    if isinstance(value, list):
        return [fill_slots(v, lookup) for v in value]
    return value


def to_float64_dtypes(value: Any) -> Any:
    """Every floating ``torch.dtype`` inside an argument replaced by ``torch.float64``."""
    if isinstance(value, torch.dtype):
        return torch.float64 if value.is_floating_point else value
    if isinstance(value, list):
        return [to_float64_dtypes(v) for v in value]
    return value


def flatten(value: Any) -> list[Any]:
    """Results flattened: nested lists/tuples expanded, other values kept (None included)."""
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out.extend(flatten(v))
        return out
    return [value]


def shapes_of(values: Iterable[Any]) -> list[Any]:
    """Shapes of the tensors among ``values`` (lists of shapes for tensor lists); for details."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(list(v.shape))
        elif isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
            out.append([list(e.shape) if isinstance(e, torch.Tensor) else None for e in v])
    return out


@dataclass(frozen=True)
class OpSpec:
    """What the plan says about one op and how to call it."""

    index: int
    name: str  # aten::gelu
    qualified: str  # aten::gelu.default
    action: str  # call | noop | skip
    reason: str
    args: list[Any]  # decoded with TensorSlots, devices as recorded (re-decoded per device)
    schema: rx.Schema | None
    mutated: tuple[tuple[Any, bool], ...]  # (position or kwarg name, is a list) of written arguments
    view_only: bool  # every result aliases an input without writing it


def op_spec(op: dict[str, Any]) -> OpSpec:
    """The :class:`OpSpec` of a plan op (schema from the plan, else from the resolved overload)."""
    text = op.get("schema") or ""
    schema = None
    if not text and op.get("action", "call") == "call":
        fn = rx.resolve_overload(op["op"])
        text = str(getattr(fn, "_schema", "")) if fn is not None else ""
    if text:
        try:
            schema = rx.parse_schema(text)
        except ValueError:
            schema = None
    mutated: list[tuple[Any, bool]] = []
    view_only = False
    if schema is not None:
        pos = 0
        for a in schema.args:
            key: Any = a.name if a.kwarg_only else pos
            if not a.kwarg_only:
                pos += 1
            if a.mutable:
                mutated.append((key, a.is_list))
        rets = [r.strip() for r in schema.returns.strip("()").split(",") if r.strip()]
        view_only = bool(rets) and all("(" in r and "!" not in r for r in rets)
    return OpSpec(int(op["index"]), op.get("name", op.get("op", "?")), op.get("op", op.get("name", "?")),
                  op.get("action", "call"), op.get("reason", ""), op.get("args", []), schema, tuple(mutated),
                  view_only)


def observe(result: Any, args: list[Any], kwargs: dict[str, Any], spec: OpSpec) -> list[Any]:
    """What an op produced: its flattened results, then every argument its schema marks as written."""
    seen = flatten(result)
    for key, _is_list in spec.mutated:
        if isinstance(key, int):
            v = args[key] if key < len(args) else None
        else:
            v = kwargs.get(key)
        seen.extend(flatten(v))
    return seen


def resolve(qualified: str, device: torch.device) -> Any:
    """The callable of an op on ``device`` (a device substitute where one applies), or None."""
    return rx.substitute(qualified, device) or rx.resolve_overload(qualified)


# ----------------------------------------------------------------------------------------------
# The walker


class PlanWalker:
    """The values of a plan's tensors on ``device`` while its ops are walked in order.

    Inputs are drawn on the CPU from ``seed`` (the executor's data recipes) and copied to
    ``device``, so every device starts from the same numbers. ``value(tid)`` returns a tensor,
    materialising views of produced storages and synthetic stand-ins on demand; ``bind`` records
    an op's results; ``release`` drops storages after their last use.
    """

    def __init__(self, plan: dict[str, Any], device: str | torch.device, seed: int):
        self.plan = plan
        self.device = torch.device(device)
        self.seed = int(seed)
        self.cpu = rx.Executor(plan, "cpu", seed=seed, check_memory=False)
        self.here = rx.Executor(plan, self.device, seed=seed, check_memory=False)
        self.tensors = {t["id"]: t for t in plan["tensors"]}
        self.storages = {s["id"]: s for s in plan["storages"]}
        sched = rx.schedule(plan)
        by_storage: dict[int, list[int]] = {}
        for t in plan["tensors"]:
            by_storage.setdefault(t["storage"], []).append(t["id"])
        self.free_after = {int(i): [tid for sid in sids for tid in by_storage.get(sid, [])]
                           for i, sids in sched["free_after"].items()}
        self.vals: dict[int, torch.Tensor] = {}
        self.external: set[int] = set()
        self.standins: set[int] = set()  # synthetic stand-ins for results no op produced here
        self.fallbacks = 0
        self._materialise()

    def map_device(self, recorded: Any) -> torch.device:
        return self.here.map_device(recorded)

    def _materialise(self) -> None:
        bufs: dict[int, torch.Tensor] = {}
        views: dict[int, torch.Tensor] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for t in self.plan["tensors"]:
                if t.get("source") != "external":
                    continue
                sid = t["storage"]
                if sid not in bufs:
                    s = self.storages[sid]
                    dt = rx.dtype_from_name(s["dtype"])
                    itemsize = torch.empty((), dtype=dt).element_size()
                    buf = torch.empty(max(1, -(-int(s["nbytes"]) // itemsize)), dtype=dt)
                    rx.fill_storage(buf, s.get("recipe") or {"kind": "randn"})
                    bufs[sid] = buf
                shape = list(t["shape"])
                strides = t.get("strides") or rx.contiguous_strides(shape)
                v = torch.empty(0, dtype=rx.dtype_from_name(t["dtype"]))
                v.set_(bufs[sid].untyped_storage(), int(t["offset"]), shape, strides)
                views[t["id"]] = v
        ids = list(views)
        devs = {tid: self.map_device(self.tensors[tid].get("device") or
                                     self.storages[self.tensors[tid]["storage"]].get("device")) for tid in ids}
        copies = clone_group([views[i] for i in ids], [devs[i] for i in ids])
        for tid, c in zip(ids, copies):
            self.vals[tid] = c
            self.external.add(tid)

    def synth(self, tid: int) -> torch.Tensor:
        """A seeded synthetic tensor with the recorded metadata of ``tid``, on its device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + tid) % (2 ** 63))
            t = self.cpu.synth(tid)
        rec = self.tensors[tid]
        dev = self.map_device(rec.get("device") or self.storages[rec["storage"]].get("device"))
        return t.to(dev) if t.device != dev else t

    def _derive(self, tid: int) -> torch.Tensor | None:
        t = self.tensors[tid]
        anchor = self.storages[t["storage"]].get("anchor")
        base = self.vals.get(anchor) if anchor is not None else None
        if not isinstance(base, torch.Tensor):
            return None
        a = self.tensors[anchor]
        dt = rx.dtype_from_name(t["dtype"])
        itemsize = torch.empty((), dtype=dt).element_size()
        off_bytes = int(t["offset"]) * itemsize + (base.storage_offset() - int(a["offset"])) * base.element_size()
        shape = list(t["shape"])
        strides = t.get("strides") or rx.contiguous_strides(shape)
        if off_bytes < 0 or off_bytes % itemsize:
            return None
        off = off_bytes // itemsize
        if (off + 1 + sum((s - 1) * st for s, st in zip(shape, strides))) * itemsize > base.untyped_storage().nbytes() \
                and all(s > 0 for s in shape):
            return None
        out = torch.empty(0, dtype=dt, device=base.device)
        out.set_(base.untyped_storage(), off, shape, strides)
        return out

    def value(self, tid: int) -> torch.Tensor:
        v = self.vals.get(tid)
        if v is None:
            if self.tensors[tid].get("source") == "derived":
                v = self._derive(tid)
            if v is None:
                v = self.synth(tid)
                self.standins.add(tid)
                self.fallbacks += self.tensors[tid].get("source") == "derived"
            self.vals[tid] = v
        return v

    def inputs(self, op: dict[str, Any]) -> dict[int, torch.Tensor]:
        return {tid: self.value(tid) for tid in rx.op_input_ids(op)}

    def call_args(self, op: dict[str, Any], lookup: Callable[[int], Any],
                  map_device: Callable[[Any], torch.device] | None = None,
                  device: torch.device | None = None) -> tuple[list[Any], dict[str, Any]]:
        """Decoded ``(args, kwargs)`` of ``op`` with tensors from ``lookup`` and devices mapped."""
        mapper = map_device or self.map_device
        args = fill_slots(rx.decode_value(op.get("args", []), mapper), lookup)
        kwargs = {k: fill_slots(rx.decode_value(v, mapper), lookup) for k, v in op.get("kwargs", {}).items()}
        dev = device or self.device
        if dev.type != "cuda" and kwargs.get("pin_memory") is not None:
            kwargs["pin_memory"] = False
        return args, kwargs

    def bind(self, op: dict[str, Any], result: Any) -> None:
        """Record ``result`` under the op's output ids (a synthetic stand-in where it disagrees)."""
        outs: list[int | None] = []
        rx.Executor._flatten_outputs(op.get("outputs", []), outs)
        flat = [result] if len(outs) == 1 and isinstance(result, torch.Tensor) else flatten(result)
        if len(flat) != len(outs):
            flat = [None] * len(outs)
        ins = set(rx.op_input_ids(op))
        for tid, r in zip(outs, flat):
            if tid is None:
                continue
            rec = self.tensors[tid]
            ok = isinstance(r, torch.Tensor) and r.dtype == rx.dtype_from_name(rec["dtype"]) \
                and list(r.shape) == list(rec["shape"])
            if ok:
                self.vals[tid] = r
                self.standins.discard(tid)
            elif tid in ins and tid in self.vals:
                continue  # an in-place output: the input tensor itself, already updated
            else:
                self.vals.pop(tid, None)  # re-synthesised on demand
                self.fallbacks += 1

    def release(self, index: int) -> None:
        for tid in self.free_after.get(index, ()):
            if tid not in self.external:
                self.vals.pop(tid, None)


# ----------------------------------------------------------------------------------------------
# Calls: the only three places operators run. The target's inside target.active(), the others
# outside it (a user's dispatch mode must never touch reference or golden computations).


def call_target(target: Any, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``fn`` as the device under test (inside ``target.active()``)."""
    with torch.no_grad(), target.active():
        out = fn(*args, **kwargs)
    return out


def call_reference(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``fn`` on the reference device (no mode active)."""
    with torch.no_grad():
        return fn(*args, **kwargs)


def call_fp64(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``fn`` on the CPU in float64 (no mode active)."""
    with torch.no_grad():
        return fn(*args, **kwargs)


# ----------------------------------------------------------------------------------------------
# Lockstep comparison


@dataclass
class OpRecord:
    """The comparison of one op. ``status``: ``pass``, ``fail``, ``skip``, ``noop`` or ``error``
    (the op raised on the target while the reference ran it). Errors are normwise vs fp64 (see
    :mod:`.tolerance`); ``ratio`` = ``err_target / bound``; ``output`` names the worst output."""

    index: int
    name: str
    qualified: str
    status: str
    reason: str = ""
    input_shapes: list[Any] = field(default_factory=list)
    output_shapes: list[Any] = field(default_factory=list)
    dtype: str = ""
    kind: str = ""
    err_target: float = math.nan
    err_reference: float = math.nan
    bound: float = math.nan
    ratio: float = math.nan
    k: int = 1
    output: int = 0
    outputs_compared: int = 0
    excluded: str = ""  # outputs with backend-specific semantics (semantics.OutputPlan.note)

    def describe(self) -> str:
        """One line: index, name, shapes, dtype, the errors and the outputs not compared as is."""
        return self._describe() + (f"; {self.excluded}" if self.excluded else "")

    def _describe(self) -> str:
        ins = ",".join(str(s).replace(" ", "") for s in self.input_shapes)
        outs = ",".join(str(s).replace(" ", "") for s in self.output_shapes)
        text = f"op {self.index} {self.name} ({self.qualified}) inputs [{ins}] -> [{outs}]"
        if self.dtype:
            text += f" {self.dtype}"
        if self.status == "error":
            return f"{text}: {self.reason}"
        if self.kind == "bitwise":
            extra = "" if math.isnan(self.err_reference) else f" (error vs fp64 {self.err_reference:.3g})"
            return f"{text}: bitwise equal to the reference{extra}"
        if self.kind == "exact":
            return f"{text}: output {self.output} differs from the reference ({self.reason})"
        text += (f": output {self.output} error vs fp64 {self.err_target:.3g} on the target, "
                 f"{self.err_reference:.3g} on the reference, bound {self.bound:.3g} (K={self.k})")
        if self.kind == "reference":
            text = text.replace("error vs fp64", "difference from the reference")
        return text + (f"; {self.reason}" if self.reason else "")


def _dtype_name(v: Any) -> str:
    return str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else ""


def _cpu(v: Any) -> Any:
    return v.detach().cpu() if isinstance(v, torch.Tensor) else v


def lockstep(plan: dict[str, Any], target: Any, reference_device: str, seed: int, *,
             progress: Any = None, fp64_always: bool = True) -> list[OpRecord]:
    """Compare every op of ``plan`` on ``target`` with the reference device and fp64.

    For op i the reference device's state (its results of ops 0..i-1) is snapshotted on the
    CPU; copies of the snapshot go to the target (run inside ``target.active()``), to the
    reference (which then advances its state) and, upcast, to the CPU in fp64 (plus a run on
    perturbed inputs for the sensitivity of the floor when an output is not bitwise equal).
    ``fp64_always``: recompute floating ops in fp64 even when the target's outputs are bitwise
    equal to the reference's (for the reference's own error in the per-op table). Returns one
    :class:`OpRecord` per op of the plan.
    """
    ref_dev = torch.device(reference_device)
    walker = PlanWalker(plan, ref_dev, seed)
    tgt = rx.Executor(plan, target.device, seed=seed, check_memory=False)
    tgt_dev = tgt.device
    cpu = torch.device("cpu")
    records: list[OpRecord] = []
    ops = plan["ops"]
    for op in ops:
        spec = op_spec(op)
        rec = OpRecord(spec.index, spec.name, spec.qualified, "pass")
        records.append(rec)
        if progress is not None and spec.index % 100 == 0:
            progress.note(f"op {spec.index}/{len(ops)} {spec.name}")
        if spec.action == "noop":
            rec.status, rec.reason = "noop", spec.reason or "no-op"
            continue
        if spec.action != "call":
            rec.status, rec.reason = "skip", spec.reason or "not replayable"
            continue
        fn_ref = resolve(spec.qualified, ref_dev)
        if fn_ref is None:
            rec.status, rec.reason = "skip", "operator not in this torch"
            continue
        try:
            ref_in = walker.inputs(op)
        except (RuntimeError, rx.ReplayError) as exc:
            rec.status, rec.reason = "skip", f"inputs could not be materialised: {exc}"
            continue
        category = classify(spec.qualified, _bound(spec, op, walker))
        ids = list(ref_in)
        snapshot = dict(zip(ids, clone_group([ref_in[i] for i in ids], cpu)))
        # target
        t_obs: list[Any] | None = None
        t_error = ""
        if category is None:
            fn_t = resolve(spec.qualified, tgt_dev)
            if fn_t is None:
                category = f"no kernel for {tgt_dev.type}"
            else:
                devs = [tgt_dev if ref_in[i].device.type == ref_dev.type else ref_in[i].device for i in ids]
                copies = dict(zip(ids, clone_group([snapshot[i] for i in ids], devs)))
                t_args, t_kwargs = walker.call_args(op, copies.__getitem__, tgt.map_device, tgt_dev)
                try:
                    t_res = call_target(target, fn_t, t_args, t_kwargs)
                    t_obs = [_cpu(v) for v in observe(t_res, t_args, t_kwargs, spec)]
                except NotImplementedError:  # no kernel for this device (e.g. a CPU-only op of a CPU capture)
                    category = f"no kernel for {tgt_dev.type}"
                except Exception as exc:  # noqa: BLE001 - an op the target cannot run is reported
                    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    t_error = f"raised on the target: {type(exc).__name__}: {msg[:200]}"
        # reference
        r_args, r_kwargs = walker.call_args(op, ref_in.__getitem__)
        rec.input_shapes = shapes_of(list(r_args) + list(r_kwargs.values()))
        try:
            r_res = call_reference(fn_ref, r_args, r_kwargs)
        except Exception as exc:  # noqa: BLE001 - an op the reference cannot run is not compared
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            rec.status, rec.reason = "skip", f"raised on the reference: {type(exc).__name__}: {msg[:200]}"
            walker.release(spec.index)
            continue
        r_obs_dev = observe(r_res, r_args, r_kwargs, spec)
        if category == "undefined memory":
            for v in r_obs_dev:
                if isinstance(v, torch.Tensor) and v.numel():
                    v.zero_()
        walker.bind(op, r_res)
        r_obs = [_cpu(v) for v in r_obs_dev]
        rec.output_shapes = shapes_of(r_obs)
        rec.dtype = next((_dtype_name(v) for v in r_obs if tol.is_floating(v)),
                         next((_dtype_name(v) for v in r_obs if isinstance(v, torch.Tensor)), ""))
        if category is not None:
            rec.status, rec.reason = "skip", category
        elif t_error:
            rec.status, rec.reason = "error", t_error
        else:
            oplan = semantics.output_plan(spec.qualified, spec.schema, r_res, spec.mutated, r_args, r_kwargs,
                                          spec.name)
            _compare(rec, spec, op, walker, snapshot, t_obs or [], r_obs, seed, fp64_always, oplan)
            if rec.status == "fail" and any(i in walker.standins for i in ids):
                # inputs made up for results of skipped ops can be inconsistent (offsets that do
                # not match their indices): kernels then read undefined memory and disagree anywhere
                rec.status = "skip"
                rec.reason = ("fed synthetic stand-ins for results of skipped ops; differed "
                              f"(ratio {rec.ratio:.3g}) but not judged")
        walker.release(spec.index)
        del snapshot, r_obs_dev
    return records


def _bound(spec: OpSpec, op: dict[str, Any], walker: PlanWalker) -> dict[str, Any]:
    """The op's arguments by schema name, tensors left out (for argument-dependent classification)."""
    args, kwargs = walker.call_args(op, lambda _tid: None)
    return semantics.bind(spec.schema, args, kwargs)


def _fp64_run(spec: OpSpec, op: dict[str, Any], walker: PlanWalker, snapshot: dict[int, torch.Tensor],
              perturb: torch.Generator | None) -> list[Any] | None:
    ids = list(snapshot)
    cpu = torch.device("cpu")
    fn = resolve(spec.qualified, cpu)
    if fn is None:
        return None
    copies = dict(zip(ids, clone_group([snapshot[i] for i in ids], cpu, upcast=True, perturb=perturb)))
    args, kwargs = walker.call_args(op, copies.__getitem__, lambda _rec: cpu, cpu)
    args = to_float64_dtypes(args)
    kwargs = {k: to_float64_dtypes(v) for k, v in kwargs.items()}
    try:
        res = call_fp64(fn, args, kwargs)
    except Exception:  # noqa: BLE001 - no fp64 kernel: judged against the reference instead
        return None
    return observe(res, args, kwargs, spec)


def _compare(rec: OpRecord, spec: OpSpec, op: dict[str, Any], walker: PlanWalker,
             snapshot: dict[int, torch.Tensor], t_obs: list[Any], r_obs: list[Any], seed: int,
             fp64_always: bool, oplan: semantics.OutputPlan | None = None) -> None:
    if len(t_obs) != len(r_obs):
        rec.status, rec.kind = "fail", "exact"
        rec.reason = f"the target returned {len(t_obs)} results, the reference {len(r_obs)}"
        rec.ratio = math.inf
        return
    pairs = [(j, t, r) for j, (t, r) in enumerate(zip(t_obs, r_obs)) if t is not None or r is not None]
    if oplan is not None:  # outputs with backend-specific semantics: excluded, or compared as the table says
        rec.excluded = oplan.note()
        pairs = [(j, *oplan.prepare(j, t, r)) for j, t, r in pairs if not oplan.excluded(j)]
    rec.outputs_compared = len(pairs)
    equal = {j: tol.bitwise_equal(t, r) for j, t, r in pairs}
    floating = [j for j, _t, r in pairs if tol.is_floating(r)]
    need_exact = [j for j in floating if not equal[j]]
    exact: list[Any] | None = None
    sens: list[Any] | None = None
    note = ""
    if need_exact or (fp64_always and floating and not spec.view_only):
        exact = _fp64_run(spec, op, walker, snapshot, None)
        if exact is None:
            note = "no fp64 kernel: judged against the reference output and the floor"
        elif len(exact) != len(r_obs):
            exact, note = None, "the fp64 run returned other results: judged against the reference"
    if need_exact:
        gen = torch.Generator().manual_seed((seed * 7919 + spec.index) % (2 ** 63))
        sens = _fp64_run(spec, op, walker, snapshot, gen)
        if sens is not None and len(sens) != len(r_obs):
            sens = None
    inputs = list(snapshot.values())
    worst: tuple[tuple[bool, float], int, tol.Verdict, int] | None = None
    for j, t, r in pairs:
        e = exact[j] if exact is not None else None
        k = tol.reduction_length(spec.qualified, inputs, r if isinstance(r, torch.Tensor) else None)
        s = None
        if sens is not None and isinstance(e, torch.Tensor) and isinstance(sens[j], torch.Tensor) \
                and sens[j].shape == e.shape:
            s = tol.normwise_error(sens[j], e)
        if equal[j] and isinstance(e, torch.Tensor) and isinstance(r, torch.Tensor) and e.shape == r.shape \
                and r.dtype.is_floating_point:
            err = tol.normwise_error(r, e)
            v = tol.Verdict("pass", "bitwise", err, err, math.nan, 0.0)
        else:
            v = tol.judge(t, r, e if isinstance(e, torch.Tensor) else None, k=k, sensitivity=s, note=note)
        key = (v.status == "fail", v.ratio if not math.isnan(v.ratio) else -1.0)
        if worst is None or key > worst[0]:
            worst = (key, j, v, k)
    if worst is None:
        rec.status, rec.kind, rec.ratio = "pass", "bitwise", 0.0
        return
    _key, j, v, rec.k = worst
    rec.status, rec.kind, rec.output = v.status, v.kind, j
    rec.err_target, rec.err_reference, rec.bound, rec.ratio = v.err_target, v.err_reference, v.bound, v.ratio
    if v.note:
        rec.reason = v.note


# ----------------------------------------------------------------------------------------------
# Repeatability


def digest(value: Any) -> str:
    """A fingerprint of one result: dtype, shape and a hash of the bytes (the repr for non-tensors)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        if t.dtype.is_complex:
            t = torch.view_as_real(t).reshape(-1)
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return f"{t.dtype}{list(value.shape)}:{hashlib.blake2b(raw, digest_size=16).hexdigest()}"
    return repr(value)


@dataclass
class DigestRecord:
    """One op of a replay on the target alone: its fingerprints (None when not run or not compared)."""

    index: int
    name: str
    qualified: str
    digests: list[str] | None
    reason: str = ""
    input_shapes: list[Any] = field(default_factory=list)


def replay_digests(plan: dict[str, Any], target: Any, seed: int) -> list[DigestRecord]:
    """Run ``plan`` on the target alone (each op inside ``target.active()``) and fingerprint every
    op's results. Random ops are reseeded (the global generators are seeded with ``seed`` first)
    but not fingerprinted; undefined-memory results are zero-filled. Returns one record per op.
    """
    walker = PlanWalker(plan, target.device, seed)
    out: list[DigestRecord] = []
    with torch.random.fork_rng(devices=[walker.device] if walker.device.type == "cuda" else []):
        torch.manual_seed(seed)
        for op in plan["ops"]:
            spec = op_spec(op)
            rec = DigestRecord(spec.index, spec.name, spec.qualified, None)
            out.append(rec)
            if spec.action != "call":
                rec.reason = spec.reason or spec.action
                continue
            fn = resolve(spec.qualified, walker.device)
            if fn is None:
                rec.reason = "operator not in this torch"
                continue
            try:
                ins = walker.inputs(op)
                args, kwargs = walker.call_args(op, ins.__getitem__)
                rec.input_shapes = shapes_of(list(args) + list(kwargs.values()))
                res = call_target(target, fn, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - an op that cannot run is skipped, like replay
                rec.reason = f"raised: {type(exc).__name__}"
                walker.release(spec.index)
                continue
            seen = observe(res, args, kwargs, spec)
            category = classify(spec.qualified, semantics.bind(spec.schema, args, kwargs))
            oplan = semantics.output_plan(spec.qualified, spec.schema, res, spec.mutated, args, kwargs, spec.name)
            if category == "undefined memory":
                for v in seen:
                    if isinstance(v, torch.Tensor) and v.numel():
                        v.zero_()
            if any(tid in walker.standins for tid in ins):
                # made-up inputs can make a kernel read undefined memory: its results are replaced by
                # seeded stand-ins so that nothing downstream depends on them
                category = "fed synthetic stand-ins for results of skipped ops"
                for tid in rx.op_output_ids(op):
                    walker.vals.pop(tid, None)
            else:
                walker.bind(op, res)
            if category is None:
                rec.digests = [digest(v) if oplan is None else
                               "not compared" if oplan.excluded(j) else digest(oplan.canonical(j, v))
                               for j, v in enumerate(seen)]
            else:
                rec.reason = category
            walker.release(spec.index)
    return out
