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

:class:`PlanWalker` is a :class:`~mystique.replay.runtime.PlanInterpreter`: the replay runtime's
interpreter core decodes every op, materialises tensors and binds results; what is ours is the
per-op driving loop, which runs each op on two devices and compares.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mystique.replay import runtime as rx
from mystique.replay.runtime import fill_slots

from ..unsupported import unsupported
from .semantics import RANDOM_OPS as RANDOM_OPS  # noqa: F401 - the ops never compared
from .semantics import OutputPlan, base_op_name, output_plan, random_draw
from .semantics import bind as bind_by_name
from .tolerance import (
    Verdict,
    bitwise_equal,
    is_floating,
    judge,
    normwise_error,
    reduction_length,
)
from .values import clone_group, flatten, shapes_of, to_float64_dtypes

# Operators whose results are undefined memory: compared never; their outputs are zero-filled on
# the reference so that every consumer reads defined values.
UNDEFINED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set", "resize", "resize_as",
    "_empty_affine_quantized", "empty_permuted",
})




def classify(name: str, bound: dict[str, Any] | None = None) -> str | None:
    """``"random op"``, ``"undefined memory"`` or None (compared) for an operator name and, when
    given, its arguments by name (a dropout with ``p = 0`` or ``train`` false draws nothing)."""
    base = base_op_name(name)
    if random_draw(name, bound):
        return "random op"
    if base in UNDEFINED_OPS:
        return "undefined memory"
    return None


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


class PlanWalker(rx.PlanInterpreter):
    """The values of a plan's tensors on ``device`` while its ops are walked in order.

    Inputs are drawn on the CPU from ``seed`` (the executor's data recipes) and copied to
    ``device``, so every device starts from the same numbers. ``value(tid)`` returns a tensor,
    materialising views of produced storages and synthetic stand-ins on demand; ``bind`` records
    an op's results; ``release`` drops storages after their last use.
    """

    def __init__(self, plan: dict[str, Any], device: str | torch.device, seed: int):
        super().__init__(plan, device)
        self.seed = int(seed)
        self.free_after = rx.free_lists(plan, rx.schedule(plan))
        self.vals: dict[int, torch.Tensor] = {}
        self.external: set[int] = set()
        self.standins: set[int] = set()  # synthetic stand-ins for results no op produced here
        self.fallbacks = 0
        self._materialise()

    def _materialise(self) -> None:
        views: dict[int, torch.Tensor] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for tid, buf in self.external_buffers(torch.device("cpu")):
                views[tid] = self.view(buf, tid)
        ids = list(views)
        copies = clone_group([views[i] for i in ids], [self.tensor_device(i) for i in ids])
        for tid, c in zip(ids, copies):
            self.vals[tid] = c
            self.external.add(tid)

    def synth(self, tid: int) -> torch.Tensor:
        """A seeded synthetic tensor with the recorded metadata of ``tid``, on its device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + tid) % (2 ** 63))
            t = self.synthetic(tid, torch.device("cpu"))
        dev = self.tensor_device(tid)
        return t.to(dev) if t.device != dev else t

    def _derive(self, tid: int) -> torch.Tensor | None:
        anchor = self.anchor_of(tid)
        return self.derived_view(tid, self.vals.get(anchor) if anchor is not None else None)

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
        args, kwargs = rx.decode_call(op, map_device or self.map_device, device or self.device)
        return fill_slots(args, lookup), {k: fill_slots(v, lookup) for k, v in kwargs.items()}

    def bind(self, op: dict[str, Any], result: Any) -> None:
        """Record ``result`` under the op's output ids (a synthetic stand-in where it disagrees)."""
        outs = rx.flatten_outputs(op.get("outputs", []))
        flat = rx.flat_results(result, len(outs))
        ins = set(rx.op_input_ids(op))
        for tid, r in zip(outs, flat):
            if tid is None:
                continue
            if self.agrees(tid, r):
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
    excluded: str = ""  # outputs with backend-specific semantics (OutputPlan.note)

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
    tgt = rx.PlanInterpreter(plan, target.device)
    cpu = torch.device("cpu")
    records: list[OpRecord] = []
    ops = plan["ops"]
    for op in ops:
        spec = op_spec(op)
        rec = OpRecord(spec.index, spec.name, spec.qualified, "pass")
        records.append(rec)
        if progress is not None and spec.index % 100 == 0:
            progress.note(f"op {spec.index}/{len(ops)} {spec.name}")
        fn_ref = resolve(spec.qualified, ref_dev) if spec.action == "call" else None
        if fn_ref is None:
            rec.status, rec.reason = _not_called(spec)
            continue
        try:
            ref_in = walker.inputs(op)
        except (RuntimeError, rx.ReplayError) as exc:
            rec.status, rec.reason = "skip", f"inputs could not be materialised: {exc}"
            continue
        category = classify(spec.qualified, _bound(spec, op, walker))
        ids = list(ref_in)
        snapshot = dict(zip(ids, clone_group([ref_in[i] for i in ids], cpu)))
        t_obs: list[Any] | None = None
        t_error = ""
        if category is None:
            t_obs, t_error, category = _run_target(target, tgt, spec, op, walker, snapshot,
                                                   {i: v.device for i, v in ref_in.items()})
        r_args, r_kwargs = walker.call_args(op, ref_in.__getitem__)
        rec.input_shapes = shapes_of(list(r_args) + list(r_kwargs.values()))
        try:
            r_res = call_reference(fn_ref, r_args, r_kwargs)
        except Exception as exc:  # noqa: BLE001 - an op the reference cannot run is not compared
            rec.status, rec.reason = "skip", f"raised on the reference: {_error_line(exc)}"
            walker.release(spec.index)
            continue
        r_obs_dev = observe(r_res, r_args, r_kwargs, spec)
        if category == "undefined memory":
            _zero_fill(r_obs_dev)
        walker.bind(op, r_res)
        r_obs = [_cpu(v) for v in r_obs_dev]
        rec.output_shapes = shapes_of(r_obs)
        rec.dtype = next((_dtype_name(v) for v in r_obs if is_floating(v)),
                         next((_dtype_name(v) for v in r_obs if isinstance(v, torch.Tensor)), ""))
        if category is not None:
            rec.status, rec.reason = "skip", category
        elif t_error:
            rec.status, rec.reason = "error", t_error
        else:
            oplan = output_plan(spec.qualified, spec.schema, r_res, spec.mutated, r_args, r_kwargs, spec.name)
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


def _not_called(spec: OpSpec) -> tuple[str, str]:
    """``(status, reason)`` of an op not run: a no-op, an op the plan skips, or one not in this torch."""
    if spec.action == "noop":
        return "noop", spec.reason or "no-op"
    if spec.action != "call":
        return "skip", spec.reason or "not replayable"
    return "skip", "operator not in this torch"


def _zero_fill(values: list[Any]) -> None:
    """Zero the tensors among ``values`` (results of undefined memory, so that consumers read defined values)."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel():
            v.zero_()


def _error_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {msg[:200]}"


def _run_target(target: Any, tgt: rx.PlanInterpreter, spec: OpSpec, op: dict[str, Any], walker: PlanWalker,
                snapshot: dict[int, torch.Tensor], ref_devices: dict[int, torch.device],
                ) -> tuple[list[Any] | None, str, str | None]:
    """Run one op on the target (inside ``target.active()``) on copies of the reference's inputs:
    ``(observed results on the CPU, error, category)``; the category says why it was not compared
    (no kernel for the target's device), the error that it raised."""
    tgt_dev = tgt.device
    fn_t = resolve(spec.qualified, tgt_dev)
    if fn_t is None:
        return None, "", f"no kernel for {tgt_dev.type}"
    ids = list(snapshot)
    devs = [tgt_dev if ref_devices[i].type == walker.device.type else ref_devices[i] for i in ids]
    copies = dict(zip(ids, clone_group([snapshot[i] for i in ids], devs)))
    t_args, t_kwargs = walker.call_args(op, copies.__getitem__, tgt.map_device, tgt_dev)
    try:
        t_res = call_target(target, fn_t, t_args, t_kwargs)
        return [_cpu(v) for v in observe(t_res, t_args, t_kwargs, spec)], "", None
    except Exception as exc:  # noqa: BLE001 - an op the target cannot run is reported
        why = unsupported(exc)  # torch's own "no kernel for this dtype/backend" only (a skip); else an error
        if why:
            return None, "", f"no kernel for {tgt_dev.type}: {why[:160]}"
        return None, f"raised on the target: {_error_line(exc)}", None


def _bound(spec: OpSpec, op: dict[str, Any], walker: PlanWalker) -> dict[str, Any]:
    """The op's arguments by schema name, tensors left out (for argument-dependent classification)."""
    args, kwargs = walker.call_args(op, lambda _tid: None)
    return bind_by_name(spec.schema, args, kwargs)


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
             fp64_always: bool, oplan: OutputPlan | None = None) -> None:
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
    equal = {j: bitwise_equal(t, r) for j, t, r in pairs}
    floating = [j for j, _t, r in pairs if is_floating(r)]
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
    worst: tuple[tuple[bool, float], int, Verdict, int] | None = None
    for j, t, r in pairs:
        e = exact[j] if exact is not None else None
        k = reduction_length(spec.qualified, inputs, r if isinstance(r, torch.Tensor) else None)
        s = None
        if sens is not None and isinstance(e, torch.Tensor) and isinstance(sens[j], torch.Tensor) \
                and sens[j].shape == e.shape:
            s = normwise_error(sens[j], e)
        if equal[j] and isinstance(e, torch.Tensor) and isinstance(r, torch.Tensor) and e.shape == r.shape \
                and r.dtype.is_floating_point:
            err = normwise_error(r, e)
            v = Verdict("pass", "bitwise", err, err, math.nan, 0.0)
        else:
            v = judge(t, r, e if isinstance(e, torch.Tensor) else None, k=k, sensitivity=s, note=note)
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
            category = classify(spec.qualified, bind_by_name(spec.schema, args, kwargs))
            oplan = output_plan(spec.qualified, spec.schema, res, spec.mutated, args, kwargs, spec.name)
            if category == "undefined memory":
                _zero_fill(seen)
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
