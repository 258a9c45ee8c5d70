"""The plan interpreter core, shared by everything that walks a plan's ops: the executor (timing,
pacing), the correctness validator (lockstep comparison on two devices) and the ONNX export
(tracing).

:class:`PlanInterpreter` holds a plan's tables on one device and materialises its tensors: storages
filled by their data recipes, tensors as strided views into them, views of storages produced by
earlier ops, and synthetic stand-ins. The functions decode an op's call (:func:`decode_call`,
:func:`fill_slots`), bind its flattened results to its recorded output ids (:func:`flatten_outputs`,
:func:`flat_results`, :meth:`PlanInterpreter.agrees`) and list what the schedule frees after each
op (:func:`free_lists`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .format import TensorSlot, check_plan, contiguous_strides, decode_value, dtype_from_name, extent
from .storage import fill_storage

DEFAULT_RECIPE: dict[str, Any] = {"kind": "randn"}
# recipes that still fit a tensor read with another dtype than its storage's (else: randn)
_DTYPE_FREE_RECIPES = ("randint", "bernoulli", "offsets")


def fill_slots(value: Any, lookup: Callable[[int], Any]) -> Any:
    """A copy of a decoded argument with every :class:`TensorSlot` replaced by ``lookup(tid)``."""
    if isinstance(value, TensorSlot):
        return lookup(value.tid)
    if isinstance(value, list):
        return [fill_slots(v, lookup) for v in value]
    return value


def decode_call(op: dict[str, Any], map_device: Callable[[str | None], torch.device],
                device: torch.device) -> tuple[list[Any], dict[str, Any]]:
    """An op's decoded ``(args, kwargs)`` (tensors as :class:`TensorSlot`, devices mapped), with
    ``pin_memory`` turned off where ``device`` is not CUDA."""
    args = decode_value(op.get("args", []), map_device)
    kwargs = {k: decode_value(v, map_device) for k, v in op.get("kwargs", {}).items()}
    if device.type != "cuda" and kwargs.get("pin_memory") is not None:
        kwargs["pin_memory"] = False
    return args, kwargs


def flatten_outputs(enc: Any, out: list[int | None] | None = None) -> list[int | None]:
    """An op's recorded outputs flattened: tensor ids, None for other values."""
    out = [] if out is None else out
    if isinstance(enc, list):
        for e in enc:
            flatten_outputs(e, out)
    elif isinstance(enc, dict) and "t" in enc:
        out.append(int(enc["t"]))
    else:
        out.append(None)
    return out


def flatten_result(res: Any, out: list[Any] | None = None) -> list[Any]:
    """An op's results flattened: nested lists and tuples expanded, other values kept."""
    out = [] if out is None else out
    if isinstance(res, (list, tuple)):
        for r in res:
            flatten_result(r, out)
    else:
        out.append(res)
    return out


def flat_results(res: Any, n: int) -> list[Any]:
    """An op's results in output order; ``n`` Nones when they do not match its ``n`` recorded outputs."""
    if n == 1 and isinstance(res, torch.Tensor):
        return [res]
    flat = flatten_result(res)
    return flat if len(flat) == n else [None] * n


def free_lists(plan: dict[str, Any], sched: dict[str, Any]) -> dict[int, list[int]]:
    """``op index -> tensor ids`` whose storages the schedule (:func:`.format.schedule`) frees after it."""
    by_storage: dict[int, list[int]] = {}
    for t in plan["tensors"]:
        by_storage.setdefault(t["storage"], []).append(t["id"])
    out: dict[int, list[int]] = {}
    for i, sids in sched["free_after"].items():
        for sid in sids:
            out.setdefault(int(i), []).extend(by_storage.get(sid, []))
    return out


class PlanInterpreter:
    """A plan's tables on ``device`` and how its tensors materialise there.

    ``map_device`` places what the capture recorded on its original device on ``device`` (and
    keeps the CPU for what was recorded there); :meth:`storage_buffer`, :meth:`view`,
    :meth:`synthetic` and :meth:`derived_view` build tensors; :meth:`agrees` tells whether a result
    matches the recorded dtype and shape of an output.
    """

    def __init__(self, plan: dict[str, Any], device: str | torch.device = "cpu"):
        self.plan = check_plan(plan)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        meta = plan.get("metadata", {})
        self.original_device = torch.device(meta.get("original_device") or "cpu")
        self.tensors: dict[int, dict[str, Any]] = {t["id"]: t for t in plan["tensors"]}
        self.storages: dict[int, dict[str, Any]] = {s["id"]: s for s in plan["storages"]}
        self.ops: list[dict[str, Any]] = plan["ops"]

    def map_device(self, recorded: str | None) -> torch.device:
        """Where a tensor or device argument recorded on ``recorded`` goes in this replay."""
        if recorded is None or recorded == "" or self.device.type == "meta":
            return self.device
        try:
            rec = torch.device(recorded)
        except (RuntimeError, TypeError):
            return self.device
        if rec.type == self.original_device.type:
            return self.device
        if rec.type == "cpu":
            return rec
        return self.device

    def tensor_device(self, tid: int) -> torch.device:
        """Where plan tensor ``tid`` lives in this replay (its own recorded device, else its storage's)."""
        t = self.tensors[tid]
        return self.map_device(t.get("device") or self.storages[t["storage"]].get("device"))

    def layout(self, tid: int) -> tuple[list[int], list[int]]:
        """The recorded ``(shape, strides)`` of plan tensor ``tid``."""
        t = self.tensors[tid]
        shape = list(t["shape"])
        return shape, t.get("strides") or contiguous_strides(shape)

    def agrees(self, tid: int, r: Any) -> bool:
        """Whether ``r`` is a tensor of the recorded dtype and shape of output ``tid``."""
        t = self.tensors[tid]
        return isinstance(r, torch.Tensor) and r.dtype == dtype_from_name(t["dtype"]) \
            and list(r.shape) == list(t["shape"])

    def storage_buffer(self, sid: int, device: torch.device | None = None) -> torch.Tensor:
        """A flat tensor as large as storage ``sid``, filled by its data recipe (on its mapped device)."""
        s = self.storages[sid]
        dt = dtype_from_name(s["dtype"])
        itemsize = torch.empty((), dtype=dt).element_size()
        numel = max(1, -(-int(s["nbytes"]) // itemsize))
        dev = self.map_device(s.get("device")) if device is None else device
        buf = torch.empty(numel, dtype=dt, device=dev)
        fill_storage(buf, s.get("recipe") or DEFAULT_RECIPE)
        return buf

    def external_buffers(self, device: torch.device | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """Each external tensor's id with its storage's buffer (:meth:`storage_buffer`), in the plan's
        tensor order; a storage is filled when its first tensor comes, so the random draws follow
        that order (and whatever the caller draws in between)."""
        bufs: dict[int, torch.Tensor] = {}
        for t in self.plan["tensors"]:
            if t.get("source") != "external":
                continue
            sid = t["storage"]
            if sid not in bufs:
                bufs[sid] = self.storage_buffer(sid, device)
            yield t["id"], bufs[sid]

    def view(self, buf: torch.Tensor, tid: int, offset: int | None = None) -> torch.Tensor:
        """Plan tensor ``tid`` as a view into ``buf``'s storage (at its recorded offset by default)."""
        t = self.tensors[tid]
        shape, strides = self.layout(tid)
        out = torch.empty(0, dtype=dtype_from_name(t["dtype"]), device=buf.device)
        out.set_(buf.untyped_storage(), int(t["offset"] if offset is None else offset), shape, strides)
        return out

    def synthetic(self, tid: int, device: torch.device, dense: bool = False) -> torch.Tensor:
        """A fresh tensor with the recorded metadata of ``tid`` and its storage's data recipe (with
        the recorded strides; ``dense``: contiguous)."""
        t = self.tensors[tid]
        s = self.storages[t["storage"]]
        dt = dtype_from_name(t["dtype"])
        shape, strides = self.layout(tid)
        numel = math.prod(shape)
        n = max(1, numel if dense else extent(shape, strides, 0))
        buf = torch.empty(n, dtype=dt, device=device)
        recipe = s.get("recipe") or DEFAULT_RECIPE
        if s["dtype"] != t["dtype"] and recipe.get("kind") not in _DTYPE_FREE_RECIPES:
            recipe = DEFAULT_RECIPE
        fill_storage(buf, recipe)
        if dense:
            return buf[:numel].view(shape)
        return buf.as_strided(shape, strides, 0)

    def anchor_of(self, tid: int) -> int | None:
        """The tensor whose value carries the storage a derived tensor ``tid`` views (None: none)."""
        return self.storages[self.tensors[tid]["storage"]].get("anchor")

    def derived_view(self, tid: int, base: Any) -> torch.Tensor | None:
        """Tensor ``tid`` as a view into the storage of ``base``, the current value of its storage's
        anchor tensor, at the offset the anchor's own offset implies; None when it cannot be (no
        base, a meta base, an offset that is not a whole element, a view past the storage's end)."""
        if not isinstance(base, torch.Tensor) or base.device.type == "meta":
            return None
        t = self.tensors[tid]
        a = self.tensors[self.anchor_of(tid)]
        dt = dtype_from_name(t["dtype"])
        itemsize = torch.empty((), dtype=dt).element_size()
        off_bytes = int(t["offset"]) * itemsize + (base.storage_offset() - int(a["offset"])) * base.element_size()
        if off_bytes < 0 or off_bytes % itemsize:
            return None
        shape, strides = self.layout(tid)
        off = off_bytes // itemsize
        if extent(shape, strides, off) * itemsize > base.untyped_storage().nbytes():
            return None
        return self.view(base, tid, off)
