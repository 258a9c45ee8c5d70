"""Protect every Linear, Embedding and EmbeddingBag of a model with checksums during a run.

``with protect(model) as guard: model(batch)`` installs forward hooks that verify each output
against checksums computed from the inputs and cached weight checksums (recomputed when a weight
changes, e.g. after an optimizer step); ``guard.alarms`` lists the detections and ``guard.checks``
counts the verified calls. The hooks never change an output.

Cost per call (the weight side is cached): a Linear, one pass over its input and one over its
output (:func:`.abft.verify_linear`); an Embedding or EmbeddingBag, a gather of the R x 1 row sums
with the same indices plus one pass over the output (:func:`.abft.verify_bag_output`; on the CPU
prepared by a forward pre-hook, so that the hook after the lookup is one compiled call).

Linear layers are verified at the precision of their output: fp32 layers with the fp32 GEMM bound;
bf16/fp16 layers (whose fp32 accumulator is gone once the hook sees the output) with the output's
rounding allowed (the ``check_rounded`` bound of :mod:`.abft`), which is weaker. Use
:func:`.abft.checked_linear` where accumulator-level checking of a bf16 layer is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import _kernels, abft


@dataclass
class Alarm:
    module: str
    kind: str
    call: int
    report: abft.CheckReport

    def describe(self) -> str:
        return f"{self.module} ({self.kind}) call {self.call}: {self.report.describe()}"


@dataclass
class Guard:
    """Handle of :func:`protect`: counts, alarms, the largest clean ratio, and ``remove()``."""

    checks: int = 0
    alarms: list[Alarm] = field(default_factory=list)
    max_ratio: float = 0.0
    unchecked: int = 0
    handles: list[Any] = field(default_factory=list)
    per_module: dict[str, int] = field(default_factory=dict)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def record(self, name: str, kind: str, rep: abft.CheckReport) -> None:
        self.checks += 1
        self.per_module[name] = self.per_module.get(name, 0) + 1
        if not rep.checked:
            self.unchecked += 1
        if rep.alarm:
            self.alarms.append(Alarm(name, kind, self.per_module[name], rep))
        elif rep.max_ratio > self.max_ratio:
            self.max_ratio = rep.max_ratio


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
    return tuple((t.data_ptr(), t._version, t.dtype, t.device) if t is not None else None for t in ts)


def _linear_hook(guard: Guard, name: str, lam: float | None, exact: bool):
    cache = _WeightCache()

    def hook(mod: nn.Linear, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x = inputs[0]
        if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor) or not x.is_floating_point():
            return
        with torch.no_grad():
            w = mod.weight
            bias = mod.bias
            enc = cache.get(_key(w, bias), lambda: abft.encode_linear(w, bias))
            x2 = x.detach().reshape(-1, x.shape[-1])
            y2 = output.detach().reshape(-1, output.shape[-1])
            x2 = x2 if x2.dtype == torch.float32 else x2.float()
            y2 = y2 if y2.dtype == torch.float32 else y2.float()
            u_out = abft.UNIT_ROUNDOFF[output.dtype] if output.dtype != torch.float32 else 0.0
            rep = abft.verify_linear(enc, x2, y2, dtype=output.dtype, lam=lam, u=abft.UNIT_ROUNDOFF[torch.float32],
                                     u_out=u_out, op="linear", exact_ratio=exact)
            guard.record(name, "linear", rep)

    return hook


def _lookup_args(mod: nn.Module, inputs: tuple[Any, ...], bag: bool
                 ) -> tuple[Any, torch.Tensor | None, torch.Tensor | None, str] | None:
    """``(indices, offsets, per_sample_weights, mode)`` of an Embedding/EmbeddingBag call, or None when
    it cannot be checked (a padding index: its row is left out of the bag, which no row checksum knows)."""
    if bag and getattr(mod, "padding_idx", None) is not None:
        return None
    indices = inputs[0]
    offsets = inputs[1] if len(inputs) > 1 and bag else None
    psw = inputs[2] if len(inputs) > 2 and bag else None
    if bag and getattr(mod, "include_last_offset", False) and offsets is not None:
        offsets = offsets[:-1]
    return indices, offsets, psw, getattr(mod, "mode", "sum") if bag else "none"


def _embedding_hooks(guard: Guard, name: str, lam: float | None, bag: bool, exact: bool):
    """A forward pre-hook and a forward hook checking an Embedding/EmbeddingBag.

    On the CPU, with the compiled verdict, the pre-hook prepares it from the indices before the lookup
    (:class:`.abft._CompiledBags`), so that the hook after it is one kernel call (the Python work after a
    ~1 ms lookup costs more than the check's own memory traffic otherwise); elsewhere the hook runs
    :func:`.abft.verify_bag_output`.
    """
    cache = _WeightCache()
    kind = "embedding_bag" if bag else "embedding"
    state: dict[str, Any] = {}

    def checks_of(w: torch.Tensor) -> abft.EmbeddingChecks:
        return cache.get(_key(w), lambda: abft.EmbeddingChecks.of(w))

    def pre(mod: nn.Module, inputs: tuple[Any, ...]) -> None:
        state.clear()
        w = mod.weight
        if exact or not bag or w.device.type != "cpu" or not w.is_floating_point() or not _kernels.available():
            return
        args = _lookup_args(mod, inputs, bag)
        if args is None or not isinstance(args[0], torch.Tensor) or args[3] not in ("sum", "mean"):
            return
        with torch.no_grad():
            idx, off = abft._bags_args(args[0], args[1])
            nb, d = off.shape[0], w.shape[1]
            u_out = abft.UNIT_ROUNDOFF[w.dtype] if w.dtype != torch.float32 else 0.0
            state["run"] = (inputs[0], w._version, abft._CompiledBags(abft._Bags(
                checks_of(w), idx, off, args[3], args[2], nb, d, 4.0, u_out, lam, kind, abft._dt(w.dtype), (nb, d))))

    def hook(mod: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        prepared = state.pop("run", None)
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return
        with torch.no_grad():
            w = mod.weight
            if prepared is not None and prepared[0] is inputs[0] and prepared[1] == w._version \
                    and output.dim() == 2 and output.device.type == "cpu":
                out2 = output.detach()
                guard.record(name, kind, prepared[2].verdict(out2 if out2.dtype == torch.float32 else out2.float()))
                return
            args = _lookup_args(mod, inputs, bag)
            if args is None:
                guard.unchecked += 1
                return
            u_out = abft.UNIT_ROUNDOFF[output.dtype] if output.dtype != torch.float32 else 0.0
            rep = abft.verify_bag_output(output.detach(), checks_of(w), *args[:2], args[3], args[2], lam=lam,
                                         u_out=u_out, op=kind, exact_ratio=exact)
            guard.record(name, kind, rep)

    return pre, hook


def protect(model: nn.Module, *, lam: float | None = None, linear: bool = True, embeddings: bool = True,
            exact_ratios: bool = False) -> Guard:
    """Install checksum hooks on every Linear / Embedding / EmbeddingBag of ``model``.

    ``exact_ratios`` evaluates every exact threshold, so that ``guard.max_ratio`` is exact rather
    than an upper bound (same verdicts, slower; for calibration and reports).
    Returns a :class:`Guard` (a context manager that removes the hooks on exit).
    """
    guard = Guard()
    for name, mod in model.named_modules():
        if linear and isinstance(mod, nn.Linear):
            guard.handles.append(mod.register_forward_hook(_linear_hook(guard, name, lam, exact_ratios)))
        elif embeddings and isinstance(mod, (nn.EmbeddingBag, nn.Embedding)):
            pre, hook = _embedding_hooks(guard, name, lam, isinstance(mod, nn.EmbeddingBag), exact_ratios)
            guard.handles.append(mod.register_forward_pre_hook(pre))
            guard.handles.append(mod.register_forward_hook(hook))
    return guard
