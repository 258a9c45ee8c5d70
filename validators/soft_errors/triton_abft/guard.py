"""The fused kernels under :func:`..protect.protect` on CUDA: a Linear's and an EmbeddingBag's forward.

Where Triton is importable and CUDA is available (:func:`installable`), ``protect()`` gives each Linear a
``forward`` that runs :func:`.linear.fused_linear` (bf16/fp16, and fp32 where TF32 is allowed; its output
is the fused kernel's accumulator plus bias rounded once, which may differ in the last bit from cuBLAS's
own) and each EmbeddingBag one that runs :func:`.bag.fused_embedding_bag`. Their verdicts stay on the
device and are read back in batches (:meth:`..protect.Guard.defer`): no host synchronisation per call.
An EmbeddingBag's padding index, per-sample weights and ``include_last_offset`` are options of its kernel.
Calls the kernels do not cover (autograd, max_norm, fp32 without TF32, which cuBLAS runs faster than a
Triton FMA GEMM) take the module's own forward and the checks of :mod:`..abft.device_linear` /
:mod:`..abft.bag_verdict` as before, their verdicts deferred as well (an EmbeddingBag's padding index left
out by the reference's own lookup over the row sums: :func:`..abft.bag_verdict.device_bag_output`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from mystique.emulation.tf32 import matmul_tf32_allowed

from . import SWITCH, available, cuda_wanted


def installable() -> bool:
    """Whether ``protect()`` installs the fused forwards: Triton importable, CUDA available, switch not off."""
    return os.environ.get(SWITCH, "1") != "0" and available() and torch.cuda.is_available()


def gemm_wanted(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether a checked product of ``x`` and ``w`` on CUDA takes the fused kernel: bf16/fp16, or fp32 with
    TF32 allowed (a plain fp32 product stays on cuBLAS's SIMT GEMM, faster than Triton's FMA dots)."""
    if x.dtype != w.dtype or (x.dtype == torch.float32 and not matmul_tf32_allowed()):
        return False
    return cuda_wanted(x, w) if bias is None else cuda_wanted(x, w, bias)


def linear_forward(guard: Any, name: str, lam: float | None, state: dict[str, Any]) -> Any:
    """A protected Linear's ``forward`` (for :class:`..protect._ForwardHandle`): the fused kernel where it
    applies, its verdict deferred; the module's own forward otherwise (then the hook checks it)."""
    from ..abft.device_linear import encode_device_linear
    from ..protect import _key, _WeightCache, refuse_capture
    from .linear import fused_linear

    cache = _WeightCache()

    def forward(mod: nn.Module, pf: Any, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs.get("input")
        w, b = mod.weight, mod.bias
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != w.shape[1] or \
                not gemm_wanted(x, w, b):
            return pf.own(mod)(*args, **kwargs)
        refuse_capture(x)
        enc = cache.get(_key(w, b), lambda: encode_device_linear(w, b))
        y, chk = fused_linear(x, enc, lam=lam)
        guard.defer(name, "linear", chk)
        state["accumulator"] = y  # (the hook: checked already)
        return y

    return forward


def bag_call(mod: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], checks_of: Any,
             lam: float | None) -> tuple[torch.Tensor, Any] | None:
    """The fused checked lookup ``(out, DeviceCheck)`` of a protected EmbeddingBag's call ``inputs``
    (``(input, offsets, per_sample_weights)``), or None where it does not apply (max_norm: torch renormalises
    the table in place; arguments torch refuses, which its own forward then reports). A padding index,
    per-sample weights and ``include_last_offset`` are the kernel's options, read on the device: the call
    makes no host synchronisation (a padding index left out on the host, :func:`..abft.embedding_bag.
    without_padding`, would make two)."""
    from ..abft.bag_verdict import bags_args
    from .bag import fused_embedding_bag

    idx, off, psw = inputs
    w, last = mod.weight, bool(mod.include_last_offset)
    if set(kwargs) - {"input", "offsets", "per_sample_weights"} or mod.max_norm is not None or \
            mod.mode not in ("sum", "mean") or not isinstance(idx, torch.Tensor) or \
            w.dtype not in (torch.float32, torch.bfloat16, torch.float16) or \
            (idx.dim() == 2) == isinstance(off, torch.Tensor) or idx.dim() not in (1, 2) or (last and idx.dim() != 1) or \
            (psw is not None and (mod.mode != "sum" or not isinstance(psw, torch.Tensor) or psw.shape != idx.shape)) or \
            not cuda_wanted(w, idx, *(() if psw is None else (psw,))):
        return None
    if not last:  # (with the last offset the kernel reads the offsets as given: 1-D indices)
        idx, off = bags_args(idx, off)
    if not cuda_wanted(off):
        return None
    return fused_embedding_bag(w, checks_of(w), idx, off, mod.mode, lam=lam, op="embedding_bag",
                               per_sample_weights=psw, padding_idx=mod.padding_idx, include_last_offset=last)
