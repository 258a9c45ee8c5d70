"""Issuing one collective with ``torch.distributed``: a function per kind, chosen from :data:`ISSUERS`.

:func:`issue` gathers the op's tensors into an :class:`Issue` (inputs, outputs, process group,
copy-backs) and calls the issue function of the collective's kind; every call is issued
asynchronously, the caller (:class:`~mystique.distributed.runner.CollectiveRunner`) waits now or at
the recorded ``wait``. A new collective kind gets a function here and an entry in :data:`ISSUERS`.
Tensors travel contiguous and in a dtype the backend moves (:data:`GLOO_DTYPES` for gloo; others as
their bytes), copied back once the collective completed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .. import dtypes
from ..replay import runtime as ex
from .collectives import CommSpec

# dtypes the gloo backend moves; others travel as their bytes (uint8), the byte count kept
GLOO_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"})
# c10d ops of these kinds take the buffer(s) first
_BUFFER_FIRST = ("all_reduce", "broadcast", "reduce", "send", "recv")


class CollectiveFailed(BaseException):  # noqa: N818 - a BaseException on purpose, see below
    """A collective could not complete (peer gone, timeout, mismatch).

    Derived from BaseException so that the executor's per-op error handling (which marks an op
    that raises ``Exception`` as skipped and goes on) lets it through: a rank that skipped a
    collective its peers run would deadlock them.
    """


@dataclass
class Record:
    """What one collective moved and how long each of its calls took."""

    spec: CommSpec
    size_bytes: int = 0
    wire_dtype: str = ""
    times: list[float] = field(default_factory=list)


@dataclass
class Issue:
    """One collective about to be issued: its tensors, group, and the copy-backs once it completed."""

    spec: CommSpec
    rec: Record
    group: Any
    n: int
    ins: list[Any]
    outs: list[Any]
    backend: str | None
    device: Any
    finish: list[Callable[[], None]] = field(default_factory=list)

    def wired(self, ts: list[Any]) -> list[Any]:
        """Each tensor as it travels (see :func:`wire`); its copy-back joins :attr:`finish`."""
        res = []
        for t in ts:
            w, back = wire(t, self.backend)
            if back is not None:
                self.finish.append(back)
            res.append(w)
        return res

    def buffer(self, nelems: int, like: Any) -> Any:
        """A fresh 1-d buffer of ``nelems`` elements of ``like``'s dtype and device."""
        return torch.empty(max(int(nelems), 0), dtype=like.dtype if like is not None else torch.float32,
                           device=like.device if like is not None else self.device)

    def root(self) -> int:
        """The global rank of the spec's root (or peer)."""
        return global_rank(self.group, self.spec.root or 0)

    def moved(self, t: Any, times: int = 1) -> None:
        """Record ``times`` the bytes of ``t`` and its wire dtype."""
        self.rec.size_bytes = t.numel() * t.element_size() * times
        self.rec.wire_dtype = dtypes.name(t.dtype)


def wire(t: Any, backend: str | None) -> tuple[Any, Callable[[], None] | None]:
    """A contiguous tensor of a dtype the backend moves, with the same bytes, and how to copy back.

    Non-contiguous tensors travel as a contiguous copy (copied back once the collective
    completed); dtypes gloo cannot move travel as their bytes (a uint8 view, byte count kept).
    """
    c = t if t.is_contiguous() else t.contiguous()
    w = c
    if backend == "gloo" and dtypes.name(c.dtype) not in GLOO_DTYPES:
        w = c.reshape(-1).view(torch.uint8)
    if c.data_ptr() == t.data_ptr() and c is t:
        return w, None
    return w, lambda: t.copy_(c)


def global_rank(group: Any, group_rank: int) -> int:
    if group is None:
        return int(group_rank)
    return int(dist.get_global_rank(group, int(group_rank)))


def issue(spec: CommSpec, rec: Record, group: Any, args: list[Any], by_tid: dict[int, Any], executor: Any,
          outputs_enc: Any, backend: str | None, device: Any) -> tuple[Any, list[Callable[[], None]]]:
    """Start the collective (its kind one of :data:`ISSUERS`); returns (work or None, copy-backs to run
    once it completed)."""
    c10d = spec.name.startswith("c10d::")
    first = [x for x in ex.flatten_result(args[:1]) if isinstance(x, torch.Tensor)] if args else []
    second = [x for x in ex.flatten_result(args[1:2]) if isinstance(x, torch.Tensor)] if len(args) > 1 else []
    if not c10d:  # record_param_comms / functional: inputs first; outputs allocated here
        ins = first
        outs = [o for o in (_alloc_out(tid, executor, by_tid) for tid in _out_tids(outputs_enc)) if o is not None]
        if spec.name.startswith(("_c10d_functional::", "c10d_functional::")) and spec.kind in ("all_reduce",
                                                                                                "broadcast"):
            for o, i in zip(outs, ins):
                o.copy_(i)
            ins = outs
    else:
        outs, ins = first, second
    if spec.kind in _BUFFER_FIRST and c10d:
        ins = first
    call = Issue(spec, rec, group, dist.get_world_size(group), [t for t in ins if t is not None],
                 [t for t in outs if t is not None], backend, device)
    rec.wire_dtype = ""
    return ISSUERS[spec.kind](call), call.finish


# ----------------------------------------------------------------------------------------------
# One function per kind
# ----------------------------------------------------------------------------------------------


def _barrier(c: Issue) -> Any:
    c.rec.size_bytes = 0
    return dist.barrier(group=c.group, async_op=True)


def _buffered(c: Issue) -> Any:
    """all_reduce, broadcast, reduce, send, recv: each buffer in place."""
    ts = c.wired(c.ins or [])
    if not ts:
        ts = [c.buffer(c.spec.in_nelems or 0, None)]
    c.rec.size_bytes = sum(t.numel() * t.element_size() for t in ts)
    c.rec.wire_dtype = dtypes.name(ts[0].dtype)
    kind, g = c.spec.kind, c.group
    works = []
    for t in ts:
        if kind == "all_reduce":
            works.append(dist.all_reduce(t, group=g, async_op=True))
        elif kind == "broadcast":
            works.append(dist.broadcast(t, src=c.root(), group=g, async_op=True))
        elif kind == "reduce":
            works.append(dist.reduce(t, dst=c.root(), group=g, async_op=True))
        elif kind == "send":
            works.append(dist.isend(t, dst=c.root(), group=g))
        else:
            works.append(dist.irecv(t, src=c.root(), group=g))
    return _Works(works)


def _all_gather(c: Issue) -> Any:
    ins, outs, n = c.ins, c.outs, c.n
    src = ins[0] if ins else c.buffer(c.spec.in_nelems or 0, outs[0] if outs else None)
    total = src.numel() * n
    out_flat = outs[0] if (len(outs) == 1 and outs[0].numel() == total) else None
    (s,) = c.wired([src])
    if out_flat is not None:
        (o,) = c.wired([out_flat])
    else:
        o = c.buffer(s.numel() * n, s)
        if len(outs) == n and all(x.numel() == src.numel() for x in outs):
            chunks = list(outs)
            c.finish.append(lambda: [ch.view(-1).copy_(p.view(ch.dtype) if p.dtype != ch.dtype else p)
                                     for ch, p in zip(chunks, o.view(n, -1))])
    c.moved(o)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
    return gather(o, s, group=c.group, async_op=True)


def _reduce_scatter(c: Issue) -> Any:
    ins, outs, n = c.ins, c.outs, c.n
    if outs and ins and ins[0].numel() == outs[0].numel() * n and len(ins) == 1:
        src, dst = ins[0], outs[0]
    elif outs and len(ins) == n:
        dst = outs[0]
        src = torch.cat([t.reshape(-1) for t in ins])
    else:
        dst = outs[0] if outs else c.buffer(c.spec.out_nelems or 0, None)
        src = c.buffer(dst.numel() * n, dst)
    (s, d) = c.wired([src, dst])
    c.moved(s)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in 2.13
    return scatter(d, s, group=c.group, async_op=True)


def _all_to_all(c: Issue) -> Any:
    if c.spec.kind == "all_to_all" and len(c.ins) == c.n and len(c.outs) == c.n:
        src, dst, in_sp, out_sp = _all_to_all_lists(c)
    else:
        src, dst, in_sp, out_sp = _all_to_all_splits(c)
    row_in, row_out = _row(src), _row(dst)
    s, d = c.wired([src.reshape(-1), dst.reshape(-1)])
    scale = s.numel() // max(src.numel(), 1) if src.numel() else 1
    in_e = [x * row_in * scale for x in in_sp] if in_sp is not None else None
    out_e = [x * row_out * scale for x in out_sp] if out_sp is not None else None
    c.moved(s)
    return dist.all_to_all_single(d, s, out_e, in_e, group=c.group, async_op=True)


def _all_to_all_lists(c: Issue) -> tuple[Any, Any, list[int], list[int]]:
    """all_to_all of one tensor per peer each way: one flat buffer each way, outputs copied back."""
    src = torch.cat([t.reshape(-1) for t in c.ins])
    dst = c.buffer(sum(t.numel() for t in c.outs), c.outs[0])
    out_sp = [t.numel() for t in c.outs]
    chunks = list(c.outs)
    c.finish.append(lambda: [ch.view(-1).copy_(p) for ch, p in zip(chunks, dst.split(out_sp))])
    return src, dst, [t.numel() for t in c.ins], out_sp


def _all_to_all_splits(c: Issue) -> tuple[Any, Any, list[int] | None, list[int] | None]:
    """all_to_all_single: the recorded splits (rows of dim 0) where they fit, else even ones."""
    spec, n = c.spec, c.n
    src = c.ins[0] if c.ins else c.buffer(spec.in_nelems or 0, None)
    dst = c.outs[0] if c.outs else c.buffer(spec.out_nelems or src.numel(), src)
    in_sp = list(spec.in_splits) if len(spec.in_splits) == n else None
    out_sp = list(spec.out_splits) if len(spec.out_splits) == n else None
    if in_sp is not None and src.dim() and sum(in_sp) != src.shape[0]:
        src = c.buffer(sum(in_sp) * _row(src), src)
    if out_sp is not None and (not dst.dim() or sum(out_sp) != dst.shape[0]):
        dst = c.buffer(sum(out_sp) * _row(src), src)
    if in_sp is None and src.numel() % n:
        in_sp = _even(src.shape[0] if src.dim() else 1, n)
    if out_sp is None and dst.numel() % n:
        out_sp = _even(dst.shape[0] if dst.dim() else 1, n)
    return src, dst, in_sp, out_sp


def _gather_scatter(c: Issue) -> Any:
    """gather (the root receives one buffer per rank) and scatter (the root sends one to each)."""
    gather = c.spec.kind == "gather"
    mine = c.ins if gather else c.outs
    t = mine[0] if mine else c.buffer((c.spec.in_nelems if gather else c.spec.out_nelems) or 0, None)
    (w,) = c.wired([t])
    me = dist.get_rank(c.group) if c.group is not None else dist.get_rank()
    lst = [c.buffer(w.numel(), w) for _ in range(c.n)] if me == (c.spec.root or 0) else None
    c.moved(w, c.n)
    if gather:
        return dist.gather(w, lst, dst=c.root(), group=c.group, async_op=True)
    return dist.scatter(w, lst, src=c.root(), group=c.group, async_op=True)


#: collective kind -> the function that issues it (returns its work)
ISSUERS: dict[str, Callable[[Issue], Any]] = {
    "barrier": _barrier,
    **{k: _buffered for k in _BUFFER_FIRST},
    "all_gather": _all_gather, "all_gather_into_tensor": _all_gather,
    "reduce_scatter": _reduce_scatter, "reduce_scatter_tensor": _reduce_scatter,
    "all_to_all_single": _all_to_all, "all_to_all": _all_to_all,
    "gather": _gather_scatter, "scatter": _gather_scatter,
}


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


class _Works:
    """Several works waited as one."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            if w is not None:
                w.wait()
        return True


def _alloc_out(tid: int, executor: Any, by_tid: dict[int, Any]) -> Any:
    if tid in by_tid:
        return by_tid[tid]
    t = executor.tensors.get(tid)
    if t is None:
        return None
    out = torch.empty(list(t["shape"]), dtype=ex.dtype_from_name(t["dtype"]),
                      device=executor.map_device(t.get("device")))
    by_tid[tid] = out
    return out


def _row(t: Any) -> int:
    """Elements per dim-0 row of ``t`` (1 for 0-d and 1-d tensors)."""
    if t.dim() <= 1:
        return 1
    return int(math.prod(t.shape[1:]))


def _even(rows: int, n: int) -> list[int]:
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _out_tids(enc: Any) -> list[int]:
    out: list[int] = []
    ex.walk_tensor_ids(enc, out)
    return out
