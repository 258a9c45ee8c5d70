"""The executor: runs a plan's ops on a device, probes them once, then runs whole iterations as one
generated straight-line function; times whole iterations or single ops, optionally paced."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .bindings import binding_call
from .codegen import DATA_DEPENDENT_SHAPES, CompiledOp, IterationWriter, make_call, raw_callable
from .format import InsufficientMemory, ReplayError, TensorSlot, dtype_from_name, op_input_ids, schedule
from .interpret import PlanInterpreter, decode_call, flat_results, flatten_outputs, free_lists
from .schemas import op_refusal, plan_refusal, resolve_overload
from .storage import available_memory, prime_host_allocator, synchronize
from .substitutes import substitute

# Scale-out hook: ``handler(op, executor) -> callable | None`` runs a collective the plan marks
# skipped; without one (a single process) collectives are skipped. A multi-rank replay
# (mystique.distributed) passes one to each rank's executor.
CollectiveHandler = Callable[[dict[str, Any], Any], Callable[..., Any] | None]


@dataclass
class OpStatus:
    """What happened to one op of the plan: ``replayed``, ``noop`` or ``skipped`` (with a reason)."""

    index: int
    name: str
    state: str
    reason: str = ""
    fallbacks: int = 0  # outputs replaced by synthetic tensors (shape/dtype disagreed)


PACINGS: tuple[str, ...] = ("none", "recorded")


def _finite_gap(v: Any) -> float:
    """A recorded host gap in microseconds (0 when absent, negative or not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return 0.0
    return float(v)


class UnknownPacing(ReplayError, ValueError):
    """``pacing`` is not one of :data:`PACINGS`."""


class RefusedOperator(ReplayError):
    """The plan calls an operator the operator policy refuses (:func:`plan_refusal`)."""


class Executor(PlanInterpreter):
    """Run a plan on ``device``.

    ``Executor(plan, device="cpu", seed=0)``; ``prepare()`` materialises the external tensors
    (raises :class:`InsufficientMemory` first when the schedule's peak does not fit);
    ``run_iteration(per_op=False)`` runs the ops once and returns per-op seconds when
    ``per_op`` (each op bracketed by device synchronisations) else an empty list;
    ``time_iterations(iters, warmup)`` returns whole-iteration seconds (one synchronisation at
    the end of each). ``status`` lists what happened to each op.

    Per-op cost: every op calls its verified Python binding (:func:`python_binding`, what eager code
    calls) or else its overload's raw C++ callable. The first run (the probe) goes through the
    general per-op loop, which also serves per-op timing, ``record_shapes`` and ``propagate``; it
    learns how each op's results bind, and later whole iterations run one generated function (the
    compiled iteration: straight-line code, one statement per op, tensors in local variables, grad
    mode switched only where it changes, the schedule's frees as assignments of None). Set ``fast``
    to False to keep the per-op loop. Should an op raise in a compiled iteration, that iteration is
    run again by the per-op loop (which marks the op skipped) and the function is regenerated.

    ``pacing``: ``"none"`` runs the ops back to back; ``"recorded"`` reproduces the host gaps the
    captured step left between its ops (the plan's per-op ``gap_us``, from Kineto): before each op
    the replay busy-waits until ``gap_us`` has passed since the previous op returned, so the
    executor's own work between two ops counts towards the gap (the original's Python time between
    ops is replaced, not added to). ``pacing_gap_us`` is the recorded gap time paced per iteration
    and ``paced_ops`` the number of ops with a gap (both 0 when the plan records none).

    ``allow_ops``: fnmatch patterns (``ns::name``) of operators outside
    :data:`ALLOWED_OP_NAMESPACES` that may be called; any other such op is skipped with the reason
    (:func:`op_refusal`) and never resolved. A plan that calls an operator the operator policy
    refuses (files, shared memory, process state, no tensor semantics: :func:`plan_refusal`) and no
    pattern allows is refused whole: :class:`RefusedOperator` before anything runs.

    ``collective_handler``: ``handler(op, executor) -> callable | None``, asked for every op the plan
    skips as a collective; a callable it returns is called in the op's place (None: stays skipped).
    """

    def __init__(self, plan: dict[str, Any], device: str | torch.device = "cpu", seed: int = 0,
                 check_memory: bool = True, emulate_autograd: bool = True, pacing: str = "none",
                 allow_ops: Sequence[str] = (), collective_handler: CollectiveHandler | None = None):
        if pacing not in PACINGS:
            raise UnknownPacing(f"unknown pacing {pacing!r}; expected one of: {', '.join(PACINGS)}")
        refused = plan_refusal(plan.get("ops", []) if isinstance(plan, dict) else [], allow_ops)
        if refused:
            raise RefusedOperator(refused)
        super().__init__(plan, device)
        self.seed = seed
        self.check_memory = check_memory
        self.allow_ops = tuple(allow_ops)  # patterns of operators outside ALLOWED_OP_NAMESPACES to call
        self.collective_handler = collective_handler
        self.n_slots = (max(self.tensors) + 1) if self.tensors else 0
        self.vals: list[Any] = [None] * self.n_slots
        self.sched = schedule(plan)
        self.status: list[OpStatus] = []
        self.output_shapes: dict[int, tuple[list[int], list[int]]] = {}
        self.record_shapes = False  # keep the shape and strides of every op result in output_shapes
        self.propagate = False  # bind results whatever their shape (shape propagation on the meta device)
        # forward ops that recorded autograd nodes run with grad mode on and float inputs requiring grad,
        # so that they pay the autograd bookkeeping the captured step paid
        self.emulate_autograd = emulate_autograd and self.device.type != "meta"
        self._compiled: list[CompiledOp] = []
        self._external: dict[int, torch.Tensor] = {}  # tid -> materialised external tensor
        self._prepared = False
        self._probed = False
        self.fast = True  # whole iterations after the probe run the compiled iteration
        self._fast_fn: Callable[[tuple[Any, ...]], None] | None = None
        self._fast_failures = 0
        # whole untimed-instrumentation iterations by path: the compiled iteration, or the per-op loop
        # (fast off, or after 3 compiled iterations raised): what a replay's timing ran (summary.json)
        self.path_counts = {"compiled": 0, "per_op": 0}
        self._ext_values: tuple[Any, ...] = ()
        self._blank: list[Any] = []
        self.pacing = pacing
        gaps = [_finite_gap(op.get("gap_us")) for op in self.ops] if pacing == "recorded" else []
        self.pacing_gap_us = float(sum(gaps))
        self.paced_ops = sum(1 for g in gaps if g > 0)
        self._gaps: list[float] | None = [g * 1e-6 for g in gaps] if self.paced_ops else None

    # -- materialisation -------------------------------------------------------------------

    def synth(self, tid: int) -> torch.Tensor:
        """A fresh tensor with the recorded metadata of ``tid`` and its storage's data recipe."""
        return self.synthetic(tid, self.tensor_device(tid))

    def _derive(self, tid: int, base: Any = TensorSlot) -> torch.Tensor:
        """Materialise a tensor that views a storage produced by an earlier op (or synthesise it).

        ``base``: the current value of the storage's anchor tensor (default: read from the value table).
        """
        anchor = self.anchor_of(tid)
        if base is TensorSlot:
            base = self.vals[anchor] if anchor is not None else None
        if self.propagate and isinstance(base, torch.Tensor):
            # shape propagation: the view changes its dims the way its storage's producer did
            t = self.tensors[tid]
            old = self.tensors[anchor]["shape"]
            mapping = {o: n for o, n in zip(old, base.shape) if o != n}
            shape = [mapping.get(d, d) for d in t["shape"]]
            out = torch.empty(shape, dtype=dtype_from_name(t["dtype"]), device=base.device)
            if self.record_shapes:
                self.output_shapes[tid] = (list(out.shape), list(out.stride()))
            return out
        out = self.derived_view(tid, base)
        if out is not None:
            return out
        if not self._probed:
            self._fallbacks += 1  # counted once, in the probe iteration
        return self.synth(tid)

    def pinned_values(self, tid: int) -> list[int] | None:
        """The values external tensor ``tid`` holds now (a pinned input: what its ops were given);
        None when it is not one of this executor's external tensors."""
        t = self._external.get(tid)
        return None if t is None else [int(v) for v in t.detach().cpu().flatten().tolist()]

    def peak_bytes(self) -> int:
        return int(self.sched["peak_bytes"])

    def prepare(self) -> None:
        """Compile the ops and materialise external storages (refusing first if memory is short)."""
        if self._prepared:
            return
        if self.check_memory and self.device.type != "meta":
            avail = available_memory(self.device)
            if avail is not None and self.peak_bytes() > avail:
                raise InsufficientMemory(self.peak_bytes(), avail, str(self.device))
        if self.device.type == "cpu":
            prime_host_allocator(max((int(s["nbytes"]) for s in self.plan["storages"]), default=0))
        torch.manual_seed(self.seed)
        self._fallbacks = 0
        for tid, buf in self.external_buffers():
            self._external[tid] = self.view(buf, tid)
        self._dtypes = {tid: dtype_from_name(t["dtype"]) for tid, t in self.tensors.items()}
        self._shapes = {tid: torch.Size(t["shape"]) for tid, t in self.tensors.items()}
        was_collecting = gc.isenabled()
        gc.disable()  # compiling allocates many small objects: cyclic collections would dominate a large plan
        try:
            self._compile()
        finally:
            if was_collecting:
                gc.enable()
        blank: list[Any] = [None] * self.n_slots
        for tid, t in self._external.items():
            blank[tid] = t
        self._blank = blank
        self._ext_values = tuple(self._external[tid] for tid in sorted(self._external))
        if self.emulate_autograd:
            for c in self._compiled:
                if not c.grad:
                    continue
                for *_x, ref in c.arg_slots:
                    for tid in (ref if isinstance(ref, list) else [ref]):
                        t = self._external.get(tid) if tid is not None else None
                        if t is not None and (t.is_floating_point() or t.is_complex()) and not t.requires_grad:
                            t.requires_grad_(True)
        self._prepared = True

    def _compile(self) -> None:
        later_use: dict[int, int] = {}
        for op in self.ops:
            for tid in op_input_ids(op):
                later_use[tid] = op["index"]
        free_after = free_lists(self.plan, self.sched)
        derived_seen: set[int] = set()
        self.status = []
        for op in self.ops:
            i = op["index"]
            action, fn, reason = self._resolve(op)
            args, kwargs = decode_call(op, self.map_device, self.device)
            slots: list[tuple[Any, ...]] = []
            for key, v in enumerate(args):
                self._collect_slots(args, key, v, slots)
            for key, v in kwargs.items():
                self._collect_slots(kwargs, key, v, slots)
            outs = flatten_outputs(op.get("outputs", []))
            in_ids = op_input_ids(op)
            derived = []
            for tid in in_ids:
                if self.tensors[tid].get("source") == "derived" and tid not in derived_seen:
                    derived.append(tid)
                    derived_seen.add(tid)
            derived_seen.update(tid for tid in outs if tid is not None)
            in_set = set(in_ids)
            alias_out = {tid: tid for tid in outs if tid is not None and tid in in_set}
            bind = [tid is not None and later_use.get(tid, -1) > i for tid in outs]
            name = op.get("name", op.get("op", "?"))
            state = {"call": "replayed", "noop": "noop"}.get(action, "skipped")
            self.status.append(OpStatus(i, name, state, reason))
            grad = bool(op.get("grad")) and self.emulate_autograd
            free = [t for t in free_after.get(i, []) if t not in self._external]
            c = CompiledOp(i, fn if action == "call" else None, args, kwargs, slots, outs, alias_out, derived,
                           free, bind, grad, any(bind))
            if len(outs) == 1 and bind and bind[0]:
                c.single = outs[0]
            c.active = c.fn is not None
            if c.fn is not None:
                found = binding_call(c.fn, args, kwargs, self._meta_tensor) if self.device.type != "meta" else None
                c.direct, c.dargs, c.dkwargs = found if found is not None else (raw_callable(c.fn), args, kwargs)
                c.call = make_call(c.fn, c.dargs, c.dkwargs, c.direct)
            self._compiled.append(c)

    def _resolve(self, op: dict[str, Any]) -> tuple[str, Any, str]:
        """``(action, callable, reason)`` of an op here: the plan's action, turned into a skip when
        the operator is refused or unavailable, or into a call when the collective handler runs it."""
        action = op.get("action", "call")
        fn = None
        reason = op.get("reason", "")
        refused = op_refusal(op["op"], self.allow_ops) if action == "call" else ""
        if refused:
            action, reason = "skip", refused  # never resolved, never called
        if action == "call":
            fn = substitute(op["op"], self.device) or resolve_overload(op["op"], self.allow_ops)
            if fn is None:
                ns = op["op"].split("::", 1)[0]
                action = "skip"
                reason = "custom op unavailable" if ns not in ("aten", "prims") else "operator not in this torch"
        if action == "skip" and reason == "collective" and self.collective_handler is not None:
            fn = self.collective_handler(op, self)
            if fn is not None:
                action, reason = "call", ""
        return action, fn, reason

    def _meta_tensor(self, tid: int) -> torch.Tensor:
        """A meta tensor with the recorded shape, strides and dtype of plan tensor ``tid``."""
        shape, strides = self.layout(tid)
        return torch.empty_strided(shape, strides, dtype=self._dtypes[tid], device="meta")

    @staticmethod
    def _collect_slots(container: Any, key: Any, v: Any, slots: list[tuple[Any, ...]]) -> None:
        if isinstance(v, TensorSlot):
            slots.append((container, key, v.tid))
        elif isinstance(v, list) and any(isinstance(e, (TensorSlot, list)) for e in v):
            if all(isinstance(e, TensorSlot) or e is None for e in v):
                slots.append((container, key, [e.tid if e is not None else None for e in v]))
            else:
                for j, e in enumerate(v):
                    Executor._collect_slots(v, j, e, slots)

    # -- running ---------------------------------------------------------------------------

    def _begin_iteration(self) -> None:
        self.vals[:] = self._blank

    def _bind(self, c: CompiledOp, res: Any, st: OpStatus, count: bool) -> None:
        """Bind an op's results to the recorded output ids used later (synthetic when they disagree)."""
        if not c.any_bind and not self.record_shapes:
            return
        outs = c.outputs
        flat = flat_results(res, len(outs))
        vals = self.vals
        dts = self._dtypes
        shapes = self._shapes
        for tid, r, b in zip(outs, flat, c.bind):
            if tid is None:
                continue
            if self.record_shapes and isinstance(r, torch.Tensor):
                self.output_shapes[tid] = (list(r.shape), list(r.stride()))
            if not b:
                continue
            if isinstance(r, torch.Tensor) and r.dtype == dts[tid] and (self.propagate or r.shape == shapes[tid]):
                vals[tid] = r
            else:
                vals[tid] = self.synth(tid)
                if count:
                    st.fallbacks += 1

    def _skip_outputs(self, c: CompiledOp) -> None:
        vals = self.vals
        for tid, b in zip(c.outputs, c.bind):
            if tid is None or not b:
                continue
            if tid in c.alias_out and vals[tid] is not None:
                continue  # an in-place output: the input tensor itself
            vals[tid] = self.synth(tid)

    def _bind_values(self, k: int, res: Any) -> list[Any]:
        """The values of op ``k``'s outputs used later, in order: its results where they agree with
        the recorded dtype and shape, else synthetic tensors (the compiled iteration's ``checked``)."""
        c = self._compiled[k]
        outs = c.outputs
        flat = flat_results(res, len(outs))
        dts, shapes = self._dtypes, self._shapes
        out = []
        for tid, r, b in zip(outs, flat, c.bind):
            if tid is None or not b:
                continue
            if isinstance(r, torch.Tensor) and r.dtype == dts[tid] and r.shape == shapes[tid]:
                out.append(r)
            else:
                out.append(self.synth(tid))
        return out

    def iteration_source(self) -> tuple[str, dict[str, Any]]:
        """The compiled iteration's source and the namespace it runs in (see
        :class:`.codegen.IterationWriter`)."""
        ns: dict[str, Any] = {"_synth": self.synth, "_derive": self._derive, "_bindv": self._bind_values,
                              "_set_grad": torch._C._set_grad_enabled, "_clock": time.perf_counter}
        return IterationWriter(ns, self._external, self.anchor_of, self._gaps).source(self._compiled), ns

    def _make_fast(self) -> Callable[[tuple[Any, ...]], None]:
        """Generate and compile the compiled iteration."""
        src, ns = self.iteration_source()
        exec(compile(src, f"<mystique plan iteration {id(self):x}>", "exec"), ns)  # noqa: S102 - our own code
        self._fast_fn = ns["_iteration"]
        return self._fast_fn

    def run_iteration(self, per_op: bool = False, probe: bool = False) -> list[float]:
        """Run every op once. Returns per-op seconds when ``per_op`` (else an empty list).

        ``probe``: the first run, which marks ops that raise as skipped (reason: the error).
        """
        self.prepare()
        probe = probe or not self._probed  # the first run counts the fallbacks
        dev = self.device
        set_grad = torch._C._set_grad_enabled
        prev_grad = torch.is_grad_enabled()
        if not (per_op or probe or self.record_shapes or self.propagate) and self.fast and self._fast_failures < 3:
            fn = self._fast_fn or self._make_fast()
            ok = False
            set_grad(False)
            try:
                fn(self._ext_values)
                ok = True
            except Exception:  # noqa: BLE001 - an op raised: this iteration goes through the per-op loop
                self._fast_fn = None
                self._fast_failures += 1
            finally:
                set_grad(prev_grad)
            if ok:
                synchronize(dev)
                self.path_counts["compiled"] += 1
                return []
        self._begin_iteration()
        vals = self.vals
        times: list[float] = []
        set_grad(False)
        try:
            self._run_ops(vals, times, per_op, probe, dev, synchronize, time.perf_counter, self.status, set_grad,
                          False)
        finally:
            set_grad(prev_grad)
        synchronize(dev)
        self._begin_iteration()  # drop every intermediate of this iteration
        if not (per_op or probe):
            self.path_counts["per_op"] += 1
        self._probed = True
        return times

    def _run_ops(self, vals, times, per_op, probe, dev, sync, clock, status, set_grad, grad_on) -> None:
        shapes = self._shapes
        dts = self._dtypes
        tensor = torch.Tensor
        nan = math.nan
        gaps = self._gaps
        last = clock()
        for c in self._compiled:
            if c.derived:
                for tid in c.derived:
                    if vals[tid] is None:
                        vals[tid] = self._derive(tid)
            if gaps is not None and gaps[c.index] > 0:  # pacing: the recorded host gap since the last op
                deadline = last + gaps[c.index]
                while clock() < deadline:
                    pass
            if not c.active:
                if per_op:
                    times.append(nan)
                self._skip_outputs(c)
            else:
                if c.grad != grad_on:
                    grad_on = c.grad
                    set_grad(grad_on)
                try:
                    if per_op:
                        sync(dev)
                        t0 = clock()
                        res = c.call(vals)
                        sync(dev)
                        times.append(clock() - t0)
                    else:
                        res = c.call(vals)
                except Exception as exc:  # noqa: BLE001 - an op that cannot run is skipped, not fatal
                    grad_on = self._failed(c, exc, vals, times, per_op, probe, status[c.index], set_grad)
                else:
                    if probe:
                        c.fast = self._fast_kind(c, res)
                    tid = c.single
                    if tid is not None and not self.record_shapes:
                        if type(res) is tensor or isinstance(res, tensor):
                            if res.dtype == dts[tid] and (res.shape == shapes[tid] or self.propagate):
                                vals[tid] = res
                            else:
                                self._bind(c, res, status[c.index], probe)
                        else:
                            self._bind(c, res, status[c.index], probe)
                    elif c.any_bind or self.record_shapes:
                        self._bind(c, res, status[c.index], probe)
                    res = None
            if gaps is not None:
                last = clock()
            if c.free:
                for tid in c.free:
                    vals[tid] = None

    def _fast_kind(self, c: CompiledOp, res: Any) -> str:
        """How the compiled iteration binds ``c``'s results, from the probe's result ``res``:
        ``none`` (nothing used later), ``single`` (one tensor, as recorded), ``unpack`` (a flat
        tuple or list of tensors, as recorded) or ``checked`` (checked every time, synthetic
        tensors where they disagree, as the per-op loop does)."""
        if not c.any_bind:
            return "none"
        name = str(self.ops[c.index].get("op", "")).split(".", 1)[0]
        if name in DATA_DEPENDENT_SHAPES or not isinstance(c.fn, torch._ops.OpOverload):
            return "checked"
        dts, shapes = self._dtypes, self._shapes

        def agrees(tid: int, r: Any) -> bool:
            return isinstance(r, torch.Tensor) and r.dtype == dts[tid] and r.shape == shapes[tid]

        if c.single is not None and len(c.outputs) == 1:
            return "single" if agrees(c.single, res) else "checked"
        if isinstance(res, (tuple, list)) and len(res) == len(c.outputs) and all(
                tid is None or not b or agrees(tid, r) for tid, b, r in zip(c.outputs, c.bind, res)):
            return "unpack"
        return "checked"

    def _failed(self, c: CompiledOp, exc: Exception, vals, times, per_op, probe, st: OpStatus, set_grad) -> bool:
        """An op raised: retry it without autograd if it ran with it, else mark it skipped.

        Returns the grad mode now in effect.
        """
        self._fast_fn = None  # the compiled iteration follows the op's new grad mode or state
        c.fast = "checked"
        if c.grad:  # e.g. an in-place op on a leaf that requires grad: run it without autograd
            c.grad = False
            set_grad(False)
            try:
                res = c.call(vals)
            except Exception as exc2:  # noqa: BLE001
                exc = exc2
            else:
                if per_op and len(times) <= c.index:
                    times.append(math.nan)
                self._bind(c, res, st, probe)
                return False
        if per_op and len(times) <= c.index:
            times.append(math.nan)
        c.active = False
        st.state = "skipped"
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        st.reason = f"error: {type(exc).__name__}: {msg[:200]}"
        self._skip_outputs(c)
        return c.grad

    def probe(self) -> None:
        """The first, untimed run: finds the ops that cannot run here and the fallback outputs."""
        if not self._probed:
            self.run_iteration(probe=True)

    def time_iterations(self, iters: int, warmup: int = 0) -> list[float]:
        """Seconds of each of ``iters`` whole iterations (after ``warmup`` untimed ones).

        No per-op synchronisation: the device is synchronised once before and once after each
        iteration, so the time is that of the uninstrumented step.
        """
        self.probe()
        for _ in range(warmup):
            self.run_iteration()
        out = []
        for _ in range(iters):
            synchronize(self.device)
            t0 = time.perf_counter()
            self.run_iteration()
            out.append(time.perf_counter() - t0)
        return out

    def time_ops(self, iters: int) -> list[float]:
        """Median seconds of each op over ``iters`` per-op timed passes (NaN for ops not run)."""
        self.probe()
        runs = [self.run_iteration(per_op=True) for _ in range(max(1, iters))]
        out = []
        for j in range(len(self._compiled)):
            xs = [r[j] for r in runs if j < len(r) and not math.isnan(r[j])]
            out.append(statistics.median(xs) if xs else math.nan)
        return out

    def counts(self) -> dict[str, Any]:
        """``{"total", "replayed", "noop", "skipped": {name: count}, "reasons": {name: reason},
        "fallbacks"}`` over the plan's ops (replayed counts no-ops too)."""
        skipped: dict[str, int] = {}
        reasons: dict[str, str] = {}
        replayed = noop = fallbacks = 0
        for st in self.status:
            if st.state == "skipped":
                skipped[st.name] = skipped.get(st.name, 0) + 1
                reasons.setdefault(st.name, st.reason)
            else:
                replayed += 1
                noop += st.state == "noop"
            fallbacks += st.fallbacks
        return {"total": len(self.status), "replayed": replayed, "noop": noop, "skipped": skipped,
                "reasons": reasons, "fallbacks": fallbacks + getattr(self, "_fallbacks", 0)}
