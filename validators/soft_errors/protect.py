"""Protect every Linear, Embedding and EmbeddingBag of a model with checksums during a run.

``with protect(model) as guard: model(batch)`` installs forward hooks that verify each output
against checksums computed from the inputs and cached weight checksums (recomputed when a weight
changes, e.g. after an optimizer step); ``guard.alarms`` lists the detections and ``guard.checks``
counts the verified calls. Outputs are never changed: on the CPU an EmbeddingBag's ``forward`` is
replaced, while protected, by a fused lookup that computes torch's output bitwise (checked once per
process against torch, see :func:`.abft.fused_lookups_agree`) and the checksum reference with it.

Cost per call (the weight side is cached): a Linear, one pass over its input and one over its
output (:func:`.abft.verify_linear`; on the CPU the pass over the input in a forward pre-hook, before
the product); an Embedding or EmbeddingBag, a gather of the R x 1 row sums
with the same indices plus one pass over the output (:func:`.abft.verify_bag_output`; on the CPU
prepared by a forward pre-hook, so that the hook after the lookup is one compiled call, and for an
EmbeddingBag without autograd the gather and the check are fused into the lookup itself). An
EmbeddingBag's replaced ``forward`` takes the verdict itself where no forward hook is registered (a
module with hooks costs more per call); where one is, it registers the guard's hook after them, so
that the verdict is on the output as they leave it.

Linear layers are verified at the precision of their output: fp32 layers with the fp32 GEMM bound;
bf16/fp16 layers (whose fp32 accumulator is gone once the hook sees the output) with the output's
rounding allowed (the ``check_rounded`` bound of :mod:`.abft`), which is weaker. Use
:func:`.abft.checked_linear`, or ``protect(model, accumulator=True)`` on a GPU, where
accumulator-level checking of a bf16 layer is needed.

On a CUDA device (and under ``--emulate cuda``) every check is made of device operations
(:mod:`.abft.device_linear`: the bound of the device's kernel, TF32 and cuBLAS's reduced-precision
split-K reductions included where the user's flags allow them; :func:`.abft.bag_verdict.device_bag_output`)
and its verdict stays on the device until the guard reads a batch of them back (:class:`Guard`). A
protected module inside CUDA graph capture is refused with one line (:func:`refuse_capture`). Where Triton
is importable on CUDA, Linear (bf16/fp16; fp32 with TF32) and EmbeddingBag forwards run the fused checked
kernels instead, checksums inside the kernel (:mod:`.triton_abft.guard`; ``MYSTIQUE_TRITON=0`` turns them off).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _torch_module

from mystique.dtypes import HALF_DTYPES
from mystique.dtypes import name as dtype_name
from mystique.emulation.mode import active_profile
from mystique.errors import UsageError

from ._kernels import available as kernels_available
from .abft import (
    UNIT_ROUNDOFF,
    Bags,
    CheckReport,
    CompiledBags,
    CompiledLinear,
    EmbeddingChecks,
    FusedCall,
    LinearEncoding,
    bags_args,
    encode_linear,
    fused_table,
    verify_bag_output,
    verify_linear,
)
from .abft.bag_verdict import device_bag_output
from .abft.device_check import DeviceCheck, resolve
from .abft.device_linear import (
    check_device_linear,
    cuda_like,
    device_linear,
    encode_device_linear,
    gemm_path,
)
from .abft.embedding_bag import without_padding
from .abft.fused_lookup import fused_checked
from .triton_abft import guard as fused_guard
from .triton_abft.guard import installable as fused_installable


@dataclass
class Alarm:
    module: str
    kind: str
    call: int
    report: CheckReport

    def describe(self) -> str:
        return f"{self.module} ({self.kind}) call {self.call}: {self.report.describe()}"


class Guard:
    """Handle of :func:`protect`: counts, alarms, the largest clean ratio, and ``remove()``.

    On a CUDA device (or under ``--emulate cuda``) a Linear's verdict stays on the device
    (:class:`.abft.device_linear.DeviceCheck`) until it is read: reading ``checks``, ``alarms``,
    ``max_ratio`` or ``unchecked``, :meth:`flush`, leaving the ``with`` block, or every
    :attr:`FLUSH_EVERY` checks read the pending verdicts back in one transfer.
    """

    #: pending device verdicts read back at once when this many have accumulated
    FLUSH_EVERY = 64

    def __init__(self) -> None:
        self._checks = 0
        self._alarms: list[Alarm] = []
        self._max_ratio = 0.0
        self._unchecked = 0
        self.handles: list[Any] = []
        self.per_module: dict[str, int] = {}
        self.pending: list[tuple[str, str, int, DeviceCheck]] = []

    @property
    def checks(self) -> int:
        self.flush()
        return self._checks

    @property
    def alarms(self) -> list[Alarm]:
        self.flush()
        return self._alarms

    @property
    def max_ratio(self) -> float:
        self.flush()
        return self._max_ratio

    @property
    def unchecked(self) -> int:
        self.flush()
        return self._unchecked

    @unchecked.setter
    def unchecked(self, value: int) -> None:
        self._unchecked = value

    def remove(self) -> None:
        self.flush()
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def _call(self, name: str) -> int:
        self.per_module[name] = self.per_module.get(name, 0) + 1
        return self.per_module[name]

    def record(self, name: str, kind: str, rep: CheckReport, call: int | None = None) -> None:
        self._checks += 1
        call = self._call(name) if call is None else call
        if not rep.checked:
            self._unchecked += 1
        if rep.alarm:
            self._alarms.append(Alarm(name, kind, call, rep))
        elif rep.max_ratio > self._max_ratio:
            self._max_ratio = rep.max_ratio

    def defer(self, name: str, kind: str, check: DeviceCheck) -> None:
        """Record a device verdict, read later (see the class docstring)."""
        self.pending.append((name, kind, self._call(name), check))
        if len(self.pending) >= self.FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Read the pending device verdicts back (one transfer) and record them."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        for (name, kind, call, _), rep in zip(pending, resolve([p[3] for p in pending])):
            self.record(name, kind, rep, call)


def refuse_capture(t: torch.Tensor) -> None:
    """A checked call inside CUDA graph capture is refused with one line: a captured graph replays the
    kernels without the hooks, so its replays would go unchecked while looking protected."""
    if (t.is_cuda or active_profile() == "cuda") and torch.cuda.is_available() and \
            torch.cuda.is_current_stream_capturing():
        raise UsageError("protect(): a protected module ran inside CUDA graph capture; graph replays skip the "
                         "checksum hooks, so protect the model outside torch.cuda.graph() / CUDA-graph "
                         "compilation (or guard.remove() before capturing)")


class _WeightCache:
    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.value: Any = None

    def get(self, key: tuple[Any, ...], make: Any) -> Any:
        if key != self.key:
            self.value = make()
            self.key = key
        return self.value


def _key(*ts: torch.Tensor | None) -> tuple[Any, ...]:
    # (the shape too: ``weight.data = weight.data.view(...)`` keeps the pointer and the version; the
    # device as is_cpu and get_device(): a torch.device object costs microseconds on the hot path)
    return tuple((t.data_ptr(), t._version, t.dtype, t.is_cpu, t.get_device(), t.shape) if t is not None else None
                 for t in ts)


def _linear_hooks(guard: Guard, name: str, lam: float | None, exact: bool):
    """A forward pre-hook and a forward hook checking a Linear.

    On the CPU, for float32 input and output, the pre-hook makes the pass over the input (the
    reference checksums and the input's row norms, :meth:`.abft.CompiledLinear.reference`) before the
    product, and the hook the pass over the output and the verdict: one compiled call on each side of
    the GEMM (reading x before the product is cheaper than after it). Otherwise
    the hook runs :func:`.abft.verify_linear`.
    """
    cache, dcache = _WeightCache(), _WeightCache()
    state: dict[str, Any] = {}

    def encoding(mod: nn.Linear) -> LinearEncoding:
        w, bias = mod.weight, mod.bias
        return cache.get(_key(w, bias), lambda: encode_linear(w, bias))

    def on_device(mod: nn.Linear, x2: torch.Tensor, y2: torch.Tensor) -> None:
        """The device verdict (:mod:`.abft.device_linear`) of a Linear on a CUDA(-like) device, deferred."""
        refuse_capture(y2)
        w, bias = mod.weight, mod.bias
        enc = dcache.get(_key(w, bias), lambda: encode_device_linear(w, bias))
        path = gemm_path(y2.dtype, True, fp32_out=False)
        if y2.dtype != w.dtype and y2.dtype in HALF_DTYPES:  # autocast: operands cast to the half dtype first
            path = replace(path, u_in=2 * UNIT_ROUNDOFF[y2.dtype] + UNIT_ROUNDOFF[y2.dtype] ** 2)
        chk = check_device_linear(enc, x2, y2, path, lam=lam)
        if exact:
            guard.record(name, "linear", chk.exact(True))
        else:
            guard.defer(name, "linear", chk.watch(x2, y2))

    def pre(mod: nn.Linear, inputs: tuple[Any, ...]) -> None:
        state.clear()
        x = inputs[0] if inputs else None
        if exact or not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or not x.is_cpu or cuda_like(x) or \
                mod.weight.dtype != torch.float32 or not x.numel() or x.dim() == 0 or \
                x.shape[-1] != mod.weight.shape[1] or not kernels_available():
            return  # (torch reports a wrong input width)
        # (detached views and NumPy only: no autograd context needed, and none entered on the hot path)
        x2 = x.detach() if x.dim() == 2 else x.detach().reshape(-1, x.shape[-1])
        run = CompiledLinear(encoding(mod), x2, None, dtype=torch.float32, lam=lam,
                                   u=UNIT_ROUNDOFF[torch.float32], u_out=0.0, op="linear")
        run.reference()
        state["run"] = (x, x._version, mod.weight._version, mod.bias._version if mod.bias is not None else None, run)

    def hook(mod: nn.Linear, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        if state.pop("accumulator", None) is output:  # checked on its accumulator by the forward already
            return
        prepared = state.pop("run", None)
        x = inputs[0] if inputs else None
        if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor) or not x.is_floating_point():
            return
        if prepared is not None and prepared[0] is x and prepared[1] == x._version and \
                prepared[2] == mod.weight._version and \
                prepared[3] == (mod.bias._version if mod.bias is not None else None) and \
                output.dtype == torch.float32 and output.is_cpu and output.dim() and \
                output.shape[-1] == mod.weight.shape[0] and output.numel() == prepared[4].x2.shape[0] * output.shape[-1]:
            run = prepared[4]
            run.bind(output.detach() if output.dim() == 2 else output.detach().reshape(-1, output.shape[-1]))
            guard.record(name, "linear", run.verdict(referenced=True))
            return
        with torch.no_grad():
            if x.dim() == 0 or output.dim() == 0 or x.shape[-1] != mod.weight.shape[1] or \
                    output.shape[-1] != mod.weight.shape[0] or x.shape[:-1].numel() != output.shape[:-1].numel():
                guard.unchecked += 1  # (an output that is not this layer's product of x: nothing to check it against)
                return
            x2 = x.detach().reshape(-1, x.shape[-1])
            y2 = output.detach().reshape(-1, output.shape[-1])
            if cuda_like(output):
                on_device(mod, x2, y2)
                return
            enc = encoding(mod)
            x2 = x2 if x2.dtype == torch.float32 else x2.float()
            y2 = y2 if y2.dtype == torch.float32 else y2.float()
            u_out = UNIT_ROUNDOFF[output.dtype] if output.dtype != torch.float32 else 0.0
            rep = verify_linear(enc, x2, y2, dtype=output.dtype, lam=lam, u=UNIT_ROUNDOFF[torch.float32],
                                     u_out=u_out, op="linear", exact_ratio=exact)
            guard.record(name, "linear", rep)

    return pre, hook, state


def _accumulator_forward(guard: Guard, name: str, lam: float | None, state: dict[str, Any]) -> Any:
    """The ``forward`` of a bf16/fp16 Linear under ``protect(accumulator=True)``: on a CUDA(-like) device,
    without autograd, the device's half GEMM with fp32 output checked on that accumulator
    (:func:`.abft.device_linear.device_linear`, ``fp32_out``), its output the accumulator plus bias rounded
    once; otherwise the module's own forward (checked by the hook on its rounded output)."""
    cache = _WeightCache()

    def forward(mod: nn.Module, pf: _ProtectedForward, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs.get("input")
        w = mod.weight
        if not isinstance(x, torch.Tensor) or x.dtype != w.dtype or w.dtype not in HALF_DTYPES or \
                not cuda_like(x) or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
            return pf.own(mod)(*args, **kwargs)
        refuse_capture(x)
        enc = cache.get(_key(w, mod.bias), lambda: encode_device_linear(w, mod.bias))
        y, chk = device_linear(x, enc, lam=lam)
        guard.defer(name, "linear", chk)
        state["accumulator"] = y
        return y

    return forward


def _call_args(args: tuple[Any, ...], kwargs: dict[str, Any], bag: bool) -> tuple[Any, ...]:
    """The positional ``(input, offsets, per_sample_weights)`` (EmbeddingBag) or ``(input,)`` of a call
    made with positional or keyword arguments."""
    names = ("input", "offsets", "per_sample_weights") if bag else ("input",)
    vals = list(args[:len(names)]) + [kwargs.get(k) for k in names[len(args):]]
    return tuple(vals)


def _lookup_args(mod: nn.Module, inputs: tuple[Any, ...], bag: bool, keep_padding: bool = False
                 ) -> tuple[Any, torch.Tensor | None, torch.Tensor | None, str] | None:
    """``(indices, offsets, per_sample_weights, mode)`` of an Embedding/EmbeddingBag call, or None when
    it cannot be checked. With a padding index the bags are those torch pools: the padding entries left out
    (:func:`.abft.embedding_bag.without_padding`; 1-D indices then), or with ``keep_padding`` left in for a
    verdict that leaves them out itself (:func:`.abft.bag_verdict.device_bag_output`'s ``padding_idx``: no
    host read); None where torch's CPU lookup pools indices past the last offset (a padding index with
    ``include_last_offset``: see checked_embedding_bag) or where torch will refuse the arguments."""
    indices = inputs[0]
    offsets = inputs[1] if len(inputs) > 1 and bag else None
    psw = inputs[2] if len(inputs) > 2 and bag else None
    pad = getattr(mod, "padding_idx", None) if bag else None
    mode = getattr(mod, "mode", "sum") if bag else "none"
    if pad is not None and not (isinstance(indices, torch.Tensor) and indices.dim() in (1, 2) and
                                (indices.dim() == 2) != (offsets is not None) and
                                (psw is None or (isinstance(psw, torch.Tensor) and psw.numel() == indices.numel()))):
        return None  # (torch reports these)
    if bag and getattr(mod, "include_last_offset", False) and offsets is not None:
        if pad is not None and (not offsets.numel() or int(offsets[-1]) != indices.numel()):
            return None
        offsets = offsets[:-1]
    if pad is None:
        return indices, offsets, psw, mode
    idx, off = bags_args(indices, offsets)
    psw = None if psw is None else psw.reshape(-1)
    return (idx, off, psw, mode) if keep_padding else (*without_padding(idx, off, psw, pad), mode)


class _ProtectedForward:
    """The ``forward`` of a protected EmbeddingBag, bound to its module with :class:`types.MethodType` (so
    that a deep copy of the module calls it with the copy); once its guard is removed it passes every
    call to the module's own ``forward``."""

    def __init__(self, run: Any, saved: Any) -> None:
        self.run, self.saved, self.active = run, saved, True

    def own(self, module: nn.Module) -> Any:
        """The ``forward`` this one replaced (the module class's, or an instance-level one)."""
        return self.saved if self.saved is not None else type(module).forward.__get__(module)

    def __call__(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return self.run(module, self, *args, **kwargs) if self.active else self.own(module)(*args, **kwargs)


class _ForwardHandle:
    """Installs a :class:`_ProtectedForward` as a module's ``forward``; ``remove()`` turns it off and takes
    every turned-off one off the top of the module (guards may be removed in any order)."""

    def __init__(self, mod: nn.Module, run: Any) -> None:
        self.mod = mod
        self.forward = _ProtectedForward(run, mod.__dict__.get("forward"))
        mod.forward = types.MethodType(self.forward, mod)

    def remove(self) -> None:
        self.forward.active = False
        mod = self.mod
        while True:
            top = mod.__dict__.get("forward")
            if not (isinstance(top, types.MethodType) and isinstance(top.__func__, _ProtectedForward)
                    and not top.__func__.active):
                return
            if top.__func__.saved is None:
                del mod.forward
            else:
                mod.forward = top.__func__.saved


def _prepare_lookup(mod: nn.Module, inputs: tuple[Any, ...], bag: bool, kind: str, lam: float | None,
                    checks_of: Any, fused: _WeightCache) -> Any:
    """A fused call (:class:`.abft.FusedCall`), a prepared compiled verdict
    (:class:`.abft.CompiledBags`) or None for this lookup call (see :func:`_embedding_hooks`);
    ``checks_of(w)`` gives the table's cached checksums, ``fused`` caches its fused layout."""
    w = mod.weight
    if not w.is_cpu or cuda_like(w) or not w.is_floating_point() or not kernels_available():
        return None
    largs = _lookup_args(mod, inputs, bag)
    if largs is None or not isinstance(largs[0], torch.Tensor) or largs[3] not in ("sum", "mean") or \
            (largs[0].dim() == 2) == (largs[1] is not None):  # (torch reports missing or extra offsets)
        return None
    with torch.no_grad():
        idx, off = bags_args(largs[0], largs[1])
        psw = largs[2]
        if isinstance(psw, torch.Tensor) and psw.dim() == 2:  # (the weights of 2-D indices, as torch)
            psw = psw.reshape(-1)
        nb, d = off.shape[0], w.shape[1]
        u_out = UNIT_ROUNDOFF[w.dtype] if w.dtype != torch.float32 else 0.0
        checks = checks_of(w)
        bags = Bags(checks, idx, off, largs[3], psw, nb, d, 4.0, u_out, lam, kind, dtype_name(w.dtype), (nb, d))
        if w.dtype is torch.float32 and mod.max_norm is None and not mod.include_last_offset and \
                mod.padding_idx is None:  # (torch's lookup with a padding index: checked after it)
            call = FusedCall.of(fused.get(_key(w), lambda: fused_table(w, checks, d)), bags)
            if call is not None:
                return call
        return CompiledBags(bags)


def _fast_fused(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], lam: float | None,
                fused: _WeightCache, checks_of: Any, lookup: Any) -> tuple[torch.Tensor, CheckReport, Any] | None:
    """The checked fused lookup (:func:`.abft.fused_lookup.fused_checked`: ``(out, report, FusedCall or
    None)``) of the commonest protected call, ``bag(indices, offsets)`` over a float32 CPU table (sum or
    mean; no per-sample weights, padding index, max_norm or last offset), with the fewest Python
    operations before the lookup: each runs with cold caches right after the previous lookup, at several
    times its cost in a loop. ``fused`` is the table's fused layout cache (the one :func:`_prepare_lookup`
    uses; the layout holds the checksums). None: :func:`_prepare_lookup` decides (same verdicts, more work)."""
    if kwargs or len(args) != 2 or mod.padding_idx is not None or mod.max_norm is not None or \
            mod.include_last_offset:
        return None
    idx, off = args
    w = mod._parameters.get("weight")  # (a Parameter, as EmbeddingBag's: no Module.__getattr__ call)
    if not isinstance(w, torch.Tensor) or not isinstance(idx, torch.Tensor) or not isinstance(off, torch.Tensor) \
            or w.dtype is not torch.float32 or not w.is_cpu or idx.dim() != 1:
        return None
    mode, nb, d = mod.mode, off.shape[0], w.shape[1]
    ft = fused.get(_key(w), lambda: fused_table(w, checks_of(w), d))
    return None if ft is None else fused_checked(ft, idx, off, mode, 4.0, lam, ("embedding_bag", "float32", (nb, d)),
                                                 lambda: Bags(ft.checks, idx, off, mode, None, nb, d, 4.0, 0.0, lam,
                                                              "embedding_bag", "float32", (nb, d)), lookup)


def _first_forward_hook(mod: nn.Module, fn: Any) -> bool:
    """Whether no forward hook runs on ``mod`` before ``fn`` (called by the module's forward itself, or its
    first forward hook): then nothing can have changed the output between the lookup and ``fn``."""
    if _torch_module._global_forward_hooks:
        return False
    for first in mod._forward_hooks.values():
        return first is fn
    return True


def _after_lookup(guard: Guard, mod: nn.Module, hook: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  out: Any) -> None:
    """After a protected EmbeddingBag's lookup: where neither the module nor torch has a forward hook, none
    can run after the lookup and ``hook`` takes the verdict now (a module with hooks costs more per call);
    else ``hook`` is registered, once, after the others, so that it sees the output as they leave it."""
    hooks = mod._forward_hooks
    if not hooks and not _torch_module._global_forward_hooks:
        hook(mod, args, kwargs, out)
    elif hook not in hooks.values():
        guard.handles.append(mod.register_forward_hook(hook, with_kwargs=True))


def _embedding_hooks(guard: Guard, name: str, lam: float | None, bag: bool, exact: bool):
    """A forward hook and (EmbeddingBag) a ``forward`` checking an Embedding/EmbeddingBag.

    On the CPU, with the compiled kernels, an EmbeddingBag's ``forward`` prepares the check from the indices.
    Where the fused lookup applies (:class:`.abft.FusedCall`: a float32 table, no autograd, no max_norm, no
    include_last_offset) it runs that: torch's lookup bitwise, each bag checked in the same pass; the hook
    records that verdict where no forward hook ran before it, else (a fault injected into the output, say)
    checks the output as it is then against the lookup's references (one compiled pass). Otherwise torch's
    lookup runs and the hook makes the prepared compiled verdict (gather and check in one call), or elsewhere
    :func:`.abft.verify_bag_output`. The ``forward`` may call the hook itself (:func:`_after_lookup`)."""
    cache, fused = _WeightCache(), _WeightCache()
    kind = "embedding_bag" if bag else "embedding"
    device_fused = bag and not exact and fused_installable()
    state: dict[str, Any] = {}

    def checks_of(w: torch.Tensor) -> EmbeddingChecks:
        return cache.get(_key(w), lambda: EmbeddingChecks.of(w))

    def forward(mod: nn.Module, pf: _ProtectedForward, *args: Any, **kwargs: Any) -> Any:
        state.clear()
        if device_fused:  # CUDA with Triton: lookup and check in one kernel, the verdict deferred (issue 32)
            inputs = _call_args(args, kwargs, bag)
            call = fused_guard.bag_call(mod, inputs, kwargs, checks_of, lam)
            if call is not None:
                state["device"] = (inputs[0], call[0], call[0]._version, call[1])
                _after_lookup(guard, mod, hook, args, kwargs, call[0])
                return call[0]
        lookup = functools.partial(pf.own(mod), *args, **kwargs)
        done = None if exact else _fast_fused(mod, args, kwargs, lam, fused, checks_of, lookup)
        if done is None and not exact:
            inputs = _call_args(args, kwargs, bag)
            call = _prepare_lookup(mod, inputs, bag, kind, lam, checks_of, fused)
            if isinstance(call, FusedCall):  # checked in the lookup's own pass (the hook checks again if need be)
                out, rep = call.run(lookup)
                done = (out, rep, call if call.referenced else None)
            elif call is not None:
                state["run"] = (inputs[0], mod.weight._version, call)
        if done is not None:
            state["checked"] = (args[0] if args else kwargs.get("input"), *done)
        out = done[0] if done is not None else lookup()
        _after_lookup(guard, mod, hook, args, kwargs, out)
        return out

    def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor) -> None:
        dev = state.pop("device", None)
        if dev is not None and (args[0] if args else _call_args(args, kwargs, bag)[0]) is dev[0] and \
                output is dev[1] and output._version == dev[2]:
            guard.defer(name, kind, dev[3])  # (else the output as it is now, below)
            return
        prepared = state.pop("run", None)
        checked, call = state.pop("checked", None), None
        if checked is not None and (args[0] if args else _call_args(args, kwargs, bag)[0]) is checked[0]:
            if checked[3] is None or (output is checked[1] and _first_forward_hook(mod, hook)):
                guard.record(name, kind, checked[2])  # (nothing ran between the lookup's check and this hook)
                return
            call = checked[3]  # a hook ran before this one: the output as it is now
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return
        inputs = _call_args(args, kwargs, bag)
        if call is not None and output.dtype is torch.float32 and output.is_cpu and \
                output.shape == (call.nb, call.ft.d):
            # the fused lookup ran: its references against the output as it is now (NumPy only: no autograd)
            guard.record(name, kind, call.verdict(output.detach()))
            return
        with torch.no_grad():
            w = mod.weight
            if prepared is not None and prepared[0] is inputs[0] and prepared[1] == w._version \
                    and output.dim() == 2 and output.is_cpu:
                out2 = output.detach()
                guard.record(name, kind, prepared[2].verdict(out2 if out2.dtype == torch.float32 else out2.float()))
                return
            on_device = cuda_like(output) and not exact  # the verdict left on the device, read back in batches
            largs = _lookup_args(mod, inputs, bag, keep_padding=on_device)
            if largs is None:
                guard.unchecked += 1
                return
            u_out = UNIT_ROUNDOFF[output.dtype] if output.dtype != torch.float32 else 0.0
            if on_device:
                refuse_capture(output)
                chk = device_bag_output(output.detach(), checks_of(w), *largs[:2], largs[3], largs[2], lam=lam,
                                        u_out=u_out, op=kind, padding_idx=getattr(mod, "padding_idx", None))
                if isinstance(chk, DeviceCheck):
                    guard.defer(name, kind, chk.watch(output))
                else:
                    guard.record(name, kind, chk)
                return
            rep = verify_bag_output(output.detach(), checks_of(w), *largs[:2], largs[3], largs[2], lam=lam,
                                    u_out=u_out, op=kind, exact_ratio=exact)
            guard.record(name, kind, rep)

    def install(mod: nn.Module) -> list[Any]:  # (an EmbeddingBag's hook: see _after_lookup)
        return [_ForwardHandle(mod, forward)] if bag else [mod.register_forward_hook(hook, with_kwargs=True)]

    return install


def protect(model: nn.Module, *, lam: float | None = None, linear: bool = True, embeddings: bool = True,
            exact_ratios: bool = False, accumulator: bool = False) -> Guard:
    """Install checksum hooks on every Linear / Embedding / EmbeddingBag of ``model``.

    ``exact_ratios`` evaluates every exact threshold, so that ``guard.max_ratio`` is exact rather
    than an upper bound (same verdicts, slower; for calibration and reports). ``accumulator``: on a
    CUDA device, bf16/fp16 Linear layers run without autograd compute through the device's half GEMM
    with fp32 output and are checked on that accumulator (a bound 2^16 (bf16) times tighter than the
    rounded output's), their output then the accumulator plus bias rounded once, which may differ in
    the last bit from cuBLAS's own rounded output (reduced-precision reductions): outputs may change.
    Returns a :class:`Guard` (a context manager that removes the hooks on exit).
    """
    guard = Guard()
    for name, mod in model.named_modules():
        if linear and isinstance(mod, nn.Linear):
            pre, hook, state = _linear_hooks(guard, name, lam, exact_ratios)
            guard.handles.append(mod.register_forward_pre_hook(pre))
            guard.handles.append(mod.register_forward_hook(hook))
            if accumulator and not exact_ratios:
                guard.handles.append(_ForwardHandle(mod, _accumulator_forward(guard, name, lam, state)))
            elif not exact_ratios and fused_installable():  # CUDA with Triton: the fused checked kernel (issue 32)
                guard.handles.append(_ForwardHandle(mod, fused_guard.linear_forward(guard, name, lam, state)))
        elif embeddings and isinstance(mod, (nn.EmbeddingBag, nn.Embedding)):
            install = _embedding_hooks(guard, name, lam, isinstance(mod, nn.EmbeddingBag), exact_ratios)
            guard.handles.extend(install(mod))
    return guard
