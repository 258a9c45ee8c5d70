"""CUDA's auxiliary outputs of ``embedding_bag``: ``offset2bag``, ``bag_size`` and ``max_indices``.

``aten::_embedding_bag`` and ``aten::_embedding_bag_forward_only`` (what ``F.embedding_bag`` and
``nn.EmbeddingBag`` call; the composite ``aten::embedding_bag`` decomposes into them before any
dispatch mode sees it) return ``(output, offset2bag, bag_size, max_indices)``. Only ``output`` has
documented semantics; the other three are what the backend's backward kernel wants, and the CPU
and CUDA kernels fill them differently (``aten/src/ATen/native/EmbeddingBag.cpp`` vs
``aten/src/ATen/native/cuda/EmbeddingBag.cu``, ``_embedding_bag_cuda``):

=============  ==========================================  ==========================================
output         CPU                                         CUDA
=============  ==========================================  ==========================================
offset2bag     ``[0]`` on the fast sum path (float/half/   ``[numIndices]``, the bag of every index,
               bfloat16 weight, no ``padding_idx``): the   always (written by the forward kernel)
               backward rebuilds it; else ``[numIndices]``
bag_size       mode sum: zeros ("deterministic"); mean/    ``[len(offsets)]``: non-padding indices
               max: ``[numBags]`` counts minus padding     per bag; with ``include_last_offset`` the
                                                           last entry is never written
max_indices    mode sum/mean: a copy of ``bag_size``;      mode sum/mean: ``[0]``; max: ``[numBags,
               max: ``[numBags, D]``, 0 for empty bags     D]``, -1 for bags without an index
=============  ==========================================  ==========================================

So a CUDA device returns ``offset2bag`` of shape ``[48]`` for DLRM's 48 indices where the CPU
returns ``[0]``. This module builds the three auxiliary outputs as ``_embedding_bag_cuda``
does, and ``output`` as CUDA's kernel rounds it: each thread sums its bag's rows in index order in
``acc_type`` (float32 for half and bfloat16 weights) and rounds once. For float32 weights (and in
mode max, which selects without rounding) that is the host's result bit for bit (the CPU kernels
also sum in index order); for half and bfloat16 sums and means the host's kernel rounds otherwise
(its fast path and its mean round to the weight's dtype more than once), so those bags are summed
by the host's float32 kernel and rounded once: a legal difference of a few ulps the validators'
tolerances must admit. Left to the host: ``per_sample_weights`` sums (CUDA may contract them into
FMAs), and 2-d ``indices``. Memory CUDA leaves unwritten (the last ``bag_size`` entry with
``include_last_offset``, ``offset2bag`` of indices outside every bag) is zero here, so that emulated
runs stay repeatable. Offsets whose last entry is not ``len(indices)`` with ``include_last_offset``
are malformed CSR: CUDA's last bag then runs to the end of ``indices``, the CPU's fast path stops at
the last offset; ``output`` is the host's either way.

No backward needs emulating: the CPU's ``_embedding_bag_backward`` accepts CUDA's forms (it
rebuilds ``offset2bag`` only when it is empty, which gives the same bags; ``bag_size`` is read
only in mode mean, where both backends count the non-padding indices; the max backward keeps the
bags whose ``bag_size`` is non-zero, so CUDA's -1 rows are never used). Gradients under this
difference are bitwise those of the host (``tests/test_emulation_correctness.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .difference import PASS, Difference

MODE_MAX = 2
OPS = frozenset({"_embedding_bag", "_embedding_bag_forward_only"})
HALF = (torch.float16, torch.bfloat16)


def bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of an ``_embedding_bag*`` call by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    positional = list(args)
    for a in func._schema.arguments:
        if not a.kwarg_only and positional:
            bound[a.name] = positional.pop(0)
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def cuda_aux(indices: torch.Tensor, offsets: torch.Tensor, *, mode: int, include_last_offset: bool,
             padding_idx: int | None, host_max_indices: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(offset2bag, bag_size, max_indices)`` as ``_embedding_bag_cuda`` returns them.

    ``indices`` and ``offsets`` are 1-d integer tensors (promoted to their common dtype, like the
    kernel); ``padding_idx`` an already wrapped row or -1/None for none. In mode max,
    ``host_max_indices`` ``[numBags, D]`` is the CPU kernel's (same rows: both take the first
    maximum among the non-padding indices); bags without a non-padding index become -1.
    """
    dtype = torch.promote_types(indices.dtype, offsets.dtype)
    idx, off = indices.to(dtype), offsets.to(dtype)
    n, m = idx.numel(), off.numel()
    num_bags = m - 1 if include_last_offset else m
    dev = idx.device
    if num_bags > 0:
        # bag b holds indices [offsets[b], offsets[b + 1]) (bag 0 from 0, the last bag up to n)
        starts = off[1:num_bags].contiguous()
        offset2bag = torch.searchsorted(starts, torch.arange(n, dtype=dtype, device=dev), right=True).to(dtype)
    else:
        offset2bag = torch.zeros(n, dtype=dtype, device=dev)  # no bag: never written by the kernel
    pad = -1 if padding_idx is None else int(padding_idx)
    bag_size = torch.zeros(m, dtype=dtype, device=dev)
    if num_bags > 0 and n:
        real = (idx != pad).to(dtype)
        bag_size[:num_bags] = torch.zeros(num_bags, dtype=dtype, device=dev).index_add_(0, offset2bag, real)
    if mode == MODE_MAX:
        if host_max_indices is None:
            raise ValueError("mode max needs the host's max_indices")
        max_indices = host_max_indices.to(dtype).clone()
        if max_indices.dim() == 2 and max_indices.size(0) == num_bags:
            max_indices[bag_size[:num_bags] == 0] = -1
    else:
        max_indices = torch.empty(0, dtype=dtype, device=dev)
    return offset2bag, bag_size, max_indices


def _with(func: Any, args: tuple, kwargs: dict, name: str, value: Any) -> tuple[list, dict]:
    """``args``/``kwargs`` with argument ``name`` replaced by ``value``."""
    args, kwargs = list(args), dict(kwargs)
    positional = [a.name for a in func._schema.arguments if not a.kwarg_only]
    i = positional.index(name) if name in positional else -1
    if 0 <= i < len(args):
        args[i] = value
    else:
        kwargs[name] = value
    return args, kwargs


def _run(func: Any, args: tuple, kwargs: dict) -> Any:
    overload = getattr(func, "_overloadname", "default")
    if overload not in ("default", "out"):
        return PASS
    b = bind(func, args, kwargs)
    weight, indices, offsets = b.get("weight"), b.get("indices"), b.get("offsets")
    if not all(isinstance(t, torch.Tensor) for t in (weight, indices, offsets)) \
            or indices.dim() != 1 or offsets.dim() != 1:
        return PASS  # 2-d indices never reach these ops from F.embedding_bag; leave odd calls to the host
    mode = int(b.get("mode", 0))
    functional = func if overload == "default" else func.overloadpacket.default
    call_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("out")}
    res = functional(*args, **call_kwargs)
    output = res[0]
    if weight.dtype in HALF and mode != MODE_MAX and b.get("per_sample_weights") is None:
        # CUDA: one float32 sum per (bag, feature) in index order, rounded once
        a32, k32 = _with(functional, args, call_kwargs, "weight", weight.float())
        output = functional(*a32, **k32)[0].to(weight.dtype)
    offset2bag, bag_size, max_indices = cuda_aux(
        indices, offsets, mode=mode, include_last_offset=bool(b.get("include_last_offset", False)),
        padding_idx=b.get("padding_idx", -1), host_max_indices=res[3] if mode == MODE_MAX else None)
    result = (output, offset2bag, bag_size, max_indices)
    if overload == "default":
        return result
    outs = [kwargs[f"out{i}"] for i in range(4)]
    for o, r in zip(outs, result):
        o.resize_(r.shape).copy_(r)
    return tuple(outs)


DIFFERENCES: list[Difference] = [
    Difference(
        name="embedding_bag_aux_outputs",
        summary="embedding_bag's offset2bag/bag_size/max_indices in CUDA's shapes and contents "
                "(offset2bag always [numIndices], bag_size counts per len(offsets), max_indices [0] "
                "outside mode max and -1 for empty bags); half/bfloat16 bags summed in float32, rounded once",
        documented="aten/src/ATen/native/cuda/EmbeddingBag.cu (_embedding_bag_cuda, "
                   "EmbeddingBag_updateOutputKernel_sum_mean/_max) vs aten/src/ATen/native/EmbeddingBag.cpp "
                   "(make_offset2bag_out, make_bag_size_out, _embedding_bag_cpu_impl_out); observed on an "
                   "H100 on 2026-11-25 (offset2bag [48] vs the CPU's [0] in DLRM)",
        ops=OPS,
        run=_run,
    ),
]
