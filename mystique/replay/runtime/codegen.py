"""Generated code: one op's call as a lambda over the value table (:func:`make_call`), and the
compiled iteration, a straight-line function running every op once (:class:`IterationWriter`)."""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .format import TensorSlot


@dataclass
class CompiledOp:
    """One op of the plan prepared for the replay: its call, where its tensors come from and go."""


    index: int
    fn: Any  # callable or None for no-ops / skips
    args: list[Any]
    kwargs: dict[str, Any]
    arg_slots: list[tuple[Any, ...]]  # (container, key, tid) or (container, key, [tids]) for lists
    outputs: list[int | None]  # flattened recorded outputs (tensor ids, None for non-tensors)
    alias_out: dict[int, int]  # outputs that are inputs too (in-place ops): kept when the op is skipped
    derived: list[int]  # tensors materialised from a live storage right before the op
    free: list[int]  # tensor ids whose slots are cleared after the op
    bind: list[bool] = field(default_factory=list)  # whether each output is used later
    grad: bool = False  # run with grad mode on (the op recorded an autograd node when captured)
    any_bind: bool = False  # some output is used later
    single: int | None = None  # the one output id to bind, when the op has exactly one tensor output
    call: Any = None  # vals -> result: the op called with its arguments read from the value table
    active: bool = True  # still replayed (False once skipped)
    direct: Any = None  # what is called: the Python binding, the overload's raw C++ callable, or fn
    dargs: list[Any] = field(default_factory=list)  # the arguments direct is called with (defaults left out)
    dkwargs: dict[str, Any] = field(default_factory=dict)
    fast: str = ""  # how the compiled iteration binds the results, learnt in the probe (see IterationWriter)


# Operators whose output shapes depend on the data: the compiled iteration checks their results
# every time (like the per-op loop does for every op); other ops' shapes follow from their inputs'.
DATA_DEPENDENT_SHAPES: frozenset[str] = frozenset({
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select", "aten::unique",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::unique_dim_consecutive", "aten::repeat_interleave", "aten::bincount", "aten::index",
    "aten::_unsafe_index", "aten::where", "aten::_local_scalar_dense", "aten::item", "aten::to_sparse",
    "aten::_to_sparse", "aten::coalesce", "aten::_coalesce", "aten::segment_reduce",
    "aten::_segment_reduce_backward", "aten::masked_scatter", "aten::histogram", "aten::_nested_tensor_from_mask",
})


def _has_slot(v: Any) -> bool:
    return isinstance(v, TensorSlot) or (isinstance(v, list) and any(_has_slot(e) for e in v))


def _literal(v: Any) -> bool:
    """Whether ``repr(v)`` reads back as ``v`` (a constant the compiled code may spell out)."""
    if v is None or isinstance(v, bool) or isinstance(v, str):
        return True
    if isinstance(v, int):
        return abs(v) < 2**62
    return isinstance(v, float) and math.isfinite(v)


def _call_source(args: list[Any], kwargs: dict[str, Any], slot: Callable[[int], str],
                 const: Callable[[Any], str]) -> str:
    """The argument list of a call, with tensor slots spelt by ``slot(tid)`` and other constants
    that do not read back from their repr bound by name by ``const(value)``."""

    def expr(v: Any) -> str:
        if isinstance(v, TensorSlot):
            return slot(v.tid)
        if isinstance(v, list) and _has_slot(v):
            return "[" + "".join(expr(e) + ", " for e in v) + "]"
        if _literal(v):
            return repr(v)
        return const(v)

    parts = [expr(a) for a in args]
    odd: list[str] = []
    for k, v in kwargs.items():
        if k.isidentifier() and not keyword.iskeyword(k):
            parts.append(f"{k}={expr(v)}")
        else:
            odd.append(f"{k!r}: {expr(v)}")
    if odd:
        parts.append("**{" + ", ".join(odd) + "}")
    return ", ".join(parts)


def raw_callable(fn: Any) -> Any:
    """An ``OpOverload``'s raw C++ callable (skips ``OpOverload.__call__``'s Python frame), else ``fn``."""
    return getattr(fn, "_op", fn) if isinstance(fn, torch._ops.OpOverload) else fn


def make_call(fn: Any, args: list[Any], kwargs: dict[str, Any], direct: Any = None) -> Callable[[list[Any]], Any]:
    """Compile ``fn(*args, **kwargs)`` with tensor slots read from the value table ``v`` into a lambda.

    ``direct``: what to call instead of ``fn`` (its verified Python binding). Constants are bound as
    default arguments, so a call costs one Python frame plus the op.
    """
    ns: dict[str, Any] = {"_f": direct if direct is not None else raw_callable(fn)}

    def const(v: Any) -> str:
        name = f"_k{len(ns)}"
        ns[name] = v
        return name

    call = _call_source(args, kwargs, lambda tid: f"v[{tid}]", const)
    defaults = "".join(f", {k}={k}" for k in ns)
    return eval(f"lambda v{defaults}: _f({call})", ns)  # noqa: S307 - our own generated code


class IterationWriter:
    """Writes the compiled iteration's source: ``_iteration(_ext)`` runs every op once.

    Tensors live in local variables (externals unpacked from ``_ext``); a tensor no op has bound
    yet, or one already freed, reads as None, as in the value table; results are bound as the
    probe found (:attr:`CompiledOp.fast`); the schedule's frees assign None, except that a single
    result takes over the variable of a tensor freed by the same op (``x = op(x, b)``, as eager
    code does: the old value goes when the new one is stored, right after the call); pacing spins
    on ``_clock``. ``ns``: the namespace the source runs in, holding ``_synth(tid)``,
    ``_derive(tid, base)``, ``_bindv(k, result)``, ``_set_grad`` and ``_clock``; constants the
    code names are added to it.
    """

    def __init__(self, ns: dict[str, Any], external: Iterable[int], anchor_of: Callable[[int], int | None],
                 gaps: list[float] | None):
        self.ns = ns
        self.ext = sorted(external)
        self.names: dict[int, str] = {tid: f"t{tid}" for tid in self.ext}  # live tensors' variables
        self.anchor_of = anchor_of
        self.gaps = gaps
        self.body: list[str] = []
        self.grad_on = False

    def const(self, v: Any) -> str:
        name = f"_k{len(self.ns)}"
        self.ns[name] = v
        return name

    def slot(self, tid: int) -> str:
        return self.names.get(tid, "None")

    def bind(self, tid: int) -> str:
        if tid not in self.names:
            self.names[tid] = f"t{tid}"
        return self.names[tid]

    def source(self, compiled: list[CompiledOp]) -> str:
        body, gaps = self.body, self.gaps
        if self.ext:
            body.append("(" + "".join(f"t{tid}, " for tid in self.ext) + ") = _ext")
        if gaps is not None:
            body.append("_e = _clock()")
        n = len(compiled)
        for k, c in enumerate(compiled):
            for tid in c.derived:
                anchor = self.anchor_of(tid)
                base = self.slot(anchor) if anchor is not None else "None"
                body.append(f"{self.bind(tid)} = _derive({tid}, {base})")
            if gaps is not None and gaps[k] > 0:
                body.append(f"_d = _e + {gaps[k]!r}")
                body.append("while _clock() < _d: pass")
            bound = [tid for tid, b in zip(c.outputs, c.bind) if tid is not None and b]
            freed = [tid for tid in c.free if tid in self.names and tid not in bound]
            if not c.active:
                self._skipped(c, bound)
            else:
                self._call(k, c, bound, freed)
            if gaps is not None and k + 1 < n and gaps[k + 1] > 0:
                body.append("_e = _clock()")
            for tid in freed:
                body.append(f"{self.names.pop(tid)} = None")
        if not body:
            body.append("pass")
        return "def _iteration(_ext):\n    " + "\n    ".join(body) + "\n"

    def _skipped(self, c: CompiledOp, bound: list[int]) -> None:
        names = self.names
        for tid in bound:
            if tid in c.alias_out and tid in names:
                self.body.append(f"if {names[tid]} is None: {names[tid]} = _synth({tid})")
            else:
                self.body.append(f"{self.bind(tid)} = _synth({tid})")

    def _call(self, k: int, c: CompiledOp, bound: list[int], freed: list[int]) -> None:
        body = self.body
        if c.grad != self.grad_on:
            self.grad_on = c.grad
            body.append(f"_set_grad({self.grad_on})")
        call = f"{self.const(c.direct)}({_call_source(c.dargs, c.dkwargs, self.slot, self.const)})"
        kind = c.fast if bound else "none"
        if kind == "none":
            body.append(call)
        elif kind == "single":
            if c.single not in self.names and freed:
                self.names[c.single] = self.names.pop(freed.pop(0))  # the freed tensor's variable
            body.append(f"{self.bind(c.single)} = {call}")
        elif kind == "unpack":
            targets = [self.bind(tid) if tid is not None and b else "_" for tid, b in zip(c.outputs, c.bind)]
            body.append(f"{', '.join(targets)}, = {call}")
        else:
            body.append(f"{''.join(self.bind(tid) + ', ' for tid in bound)}= _bindv({k}, {call})")
