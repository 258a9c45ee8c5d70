"""A replay plan as an ``nn.Module`` for the ONNX export (:func:`mystique.onnx_export.export_benchmark`):
its forward runs the plan's ``call`` operators in order, through the runtime's interpreter core."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from .runtime import (
    PlanInterpreter,
    decode_call,
    dtype_from_name,
    extent,
    fill_slots,
    flat_results,
    flatten_outputs,
    op_input_ids,
    resolve_overload,
)

_CPU = torch.device("cpu")


def _error_line(exc: BaseException, limit: int = 160) -> str:
    """``Type: first line of the message`` (terminal colour codes removed)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {line[:limit]}"


class PlanModule(nn.Module):
    """A replay plan as a module: ``forward(*inputs)`` runs the plan's ``call`` operators in order.

    External tensors are materialised once from the plan's data recipes (seeded): those of
    integer or bool dtype are the forward's inputs (``self.input_ids``), floating ones buffers.
    A tensor the plan derives from an earlier op's storage is an ``as_strided`` view of that op's
    output. The outputs of ops the plan skips, and results that disagree with the recorded shape
    or dtype, or ops that fail on the CPU with the plan's synthetic data (as the replay skips
    them), become constant buffers filled by the same recipes; :attr:`substituted` lists each
    with the reason. The forward returns the floating tensors produced and never read again
    (every such tensor when none is floating).
    """

    def __init__(self, plan: dict[str, Any], seed: int = 0, float_inputs: bool = False) -> None:
        super().__init__()
        self.core = PlanInterpreter(plan, _CPU)
        self.plan = plan
        self.tensors = self.core.tensors
        self.storages = self.core.storages
        self.ops = [op for op in plan["ops"] if op.get("action", "call") != "noop"]
        self.substituted: list[dict[str, Any]] = []
        self._eager = False
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            externals = self._materialise_externals()
            self.input_ids = [tid for tid, v in externals.items()
                              if float_inputs or not (v.dtype.is_floating_point or v.dtype.is_complex)]
            self.example_inputs = tuple(externals[t] for t in self.input_ids)
            self._buffer_ids = [tid for tid in externals if tid not in self.input_ids]
            for tid in self._buffer_ids:
                self.register_buffer(f"t{tid}", externals[tid])
            self._compile()
        finally:
            torch.random.set_rng_state(gen_state)

    def _materialise_externals(self) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        for tid, buf in self.core.external_buffers(_CPU):
            t = self.tensors[tid]
            shape, strides = self.core.layout(tid)
            if dtype_from_name(t["dtype"]) == buf.dtype and extent(shape, strides, int(t["offset"])) <= buf.numel():
                view = buf.as_strided(shape, strides, int(t["offset"]))
                out[tid] = view.clone(memory_format=torch.contiguous_format)
            else:
                out[tid] = self.core.synthetic(tid, _CPU, dense=True)
        return out

    def _compile(self) -> None:
        consumers: dict[int, int] = {}
        for op in self.ops:
            for tid in op_input_ids(op):
                consumers[tid] = op["index"]
        produced: dict[int, int] = {}  # tensor -> index of the op producing it (last)
        self._steps: list[tuple[Any, list[Any], dict[str, Any], list[int | None], dict[str, Any]]] = []
        for op in self.ops:
            outs = flatten_outputs(op.get("outputs", []))
            fn = resolve_overload(op["op"]) if op.get("action", "call") == "call" else None
            if fn is None:
                reason = op.get("reason") or "operator not in this torch"
                for tid in outs:
                    if tid is not None and consumers.get(tid, -1) > op["index"]:
                        self._substitute(tid, op, f"plan skips {op['name']}: {reason}")
                continue
            args, kwargs = decode_call(op, lambda _d: _CPU, _CPU)
            self._steps.append((fn, args, kwargs, outs, op))
            for tid in outs:
                if tid is not None:
                    produced[tid] = op["index"]
        self.output_ids = [t for t, at in produced.items() if consumers.get(t, -1) <= at]

    def _substitute(self, tid: int, op: dict[str, Any] | None, reason: str) -> None:
        name = f"s{tid}"
        if hasattr(self, name):
            return
        self.register_buffer(name, self.core.synthetic(tid, _CPU, dense=True))
        self.substituted.append({"op": op["op"] if op else "", "index": op["index"] if op else None,
                                 "tensor": tid, "reason": reason})

    def _value(self, env: dict[int, torch.Tensor], tid: int) -> torch.Tensor:
        if tid in env:
            return env[tid]
        t = self.tensors[tid]
        if hasattr(self, f"s{tid}"):
            return getattr(self, f"s{tid}")
        if t.get("source") == "derived":
            anchor = self.core.anchor_of(tid)
            base = env.get(anchor) if anchor is not None else None
            if base is not None and base.dtype == dtype_from_name(t["dtype"]):
                # traced code: a view of the base's (contiguous) values, at the offset the plan records
                off = int(t["offset"]) - int(self.tensors[anchor]["offset"])
                shape, strides = self.core.layout(tid)
                if off >= 0 and extent(shape, strides, off) <= base.numel():
                    return base.contiguous().as_strided(shape, strides, off)
        if self._eager:
            self._substitute(tid, None, "derived from a storage no earlier result can hold (as the replay "
                                        "does, it is synthesised)")
            return getattr(self, f"s{tid}")
        raise UsageError(f"benchmark tensor {tid} ({t['dtype']}{t['shape']}) is read before any operator "
                         "produces it; the plan cannot be exported")

    def _call(self, env: dict[int, torch.Tensor], fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        def lookup(tid: int) -> torch.Tensor:
            return self._value(env, tid)

        return fn(*fill_slots(args, lookup), **{k: fill_slots(v, lookup) for k, v in kwargs.items()})

    def _start(self, inputs: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
        env: dict[int, torch.Tensor] = dict(zip(self.input_ids, inputs))
        for tid in self._buffer_ids:
            env[tid] = getattr(self, f"t{tid}")
        return env

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env = self._start(inputs)
        for fn, args, kwargs, outs, _op in self._steps:
            res = self._call(env, fn, args, kwargs)
            for tid, r, _got in self._bind(res, outs):
                if r is not None:
                    env[tid] = r
                elif hasattr(self, f"s{tid}"):
                    env[tid] = getattr(self, f"s{tid}")
        return tuple(env[t] for t in self.output_ids if t in env)

    def _bind(self, res: Any, outs: Sequence[int | None]) -> list[tuple[int, torch.Tensor | None, str]]:
        """Pair an op's results with its recorded output ids: ``(tid, result, got)`` where result is
        None when it disagrees with the recorded shape/dtype (``got`` then describes it)."""
        bound = []
        for tid, r in zip(outs, flat_results(res, len(outs))):
            if tid is None:
                continue
            if self.core.agrees(tid, r):
                bound.append((tid, r, ""))
            else:
                got = f"{r.dtype}{list(r.shape)}" if isinstance(r, torch.Tensor) else type(r).__name__
                bound.append((tid, None, got))
        return bound

    def check_results(self) -> None:
        """Run once eagerly; results that disagree with the recorded metadata become constants
        (listed in :attr:`substituted`), so the traced graph matches what the plan recorded."""
        env = self._start(self.example_inputs)
        failed: set[int] = set()
        self._eager = True
        with torch.no_grad():
            for fn, args, kwargs, outs, op in self._steps:
                try:
                    res = self._call(env, fn, args, kwargs)
                except Exception as exc:  # noqa: BLE001 - as the replay does: skipped, its outputs synthesised
                    failed.add(op["index"])
                    for tid in outs:
                        if tid is not None:
                            self._substitute(tid, op, f"fails on the CPU with the plan's data: {_error_line(exc)}")
                            env[tid] = getattr(self, f"s{tid}")
                    continue
                for tid, r, got in self._bind(res, outs):
                    if r is None:
                        t = self.tensors[tid]
                        self._substitute(tid, op, f"result {got} disagrees with the recorded {t['dtype']}{t['shape']}")
                        r = getattr(self, f"s{tid}")
                    env[tid] = r
        self._eager = False
        self._steps = [step for step in self._steps if step[4]["index"] not in failed]
        self.output_ids = [t for t in self.output_ids if not hasattr(self, f"s{t}")]
        floating = [t for t in self.output_ids if dtype_from_name(self.tensors[t]["dtype"]).is_floating_point]
        if floating:  # the results, not the index bookkeeping of ops such as embedding_bag
            self.output_ids = floating
