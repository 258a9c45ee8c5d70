"""Fused checked kernels in Triton (issue 32): the checked GEMM/Linear and EmbeddingBag in one pass.

On a GPU the checks of :mod:`..abft` are chains of small torch operations (34 launches a checked
Linear, 2.7 ms of host enqueue on an H100). Here each check rides inside the kernel of the operation
it checks:

* :mod:`.linear`: a tiled ``tl.dot`` GEMM (fp32 accumulation of bf16/fp16, fp32 or TF32 operands)
  whose launch holds one more column block of programs computing the reference checksums (the
  weight's checksum, cached per weight version, as extra output columns), and whose epilogue reduces
  the output's weighted row sums; one tiny second launch reduces the partial sums and takes the
  verdict on the device (:func:`.linear.fused_linear`, :func:`.linear.fused_mm`).
* :mod:`.bag`: the EmbeddingBag lookup (fp32, bf16/fp16, 8-bit row-wise) gathering each row's checksum
  and magnitude in the same pass and taking each bag's verdict against the exact bound
  (:func:`.bag.fused_bag`).

Triton is optional (the ``triton`` extra; it ships with PyTorch's CUDA builds). The kernels run on CUDA
tensors, and on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1``), which is how the
default tests hold their logic on a host without a GPU. Nothing here imports Triton until a kernel is
needed: where it is absent, :func:`available` is False and the torch paths of :mod:`..abft` run.
``MYSTIQUE_TRITON=0`` turns the fused kernels off on CUDA (the torch paths, for comparison).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

#: environment switch: ``0`` keeps the torch paths on CUDA even where Triton is importable
SWITCH = "MYSTIQUE_TRITON"


@functools.cache
def _importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def available() -> bool:
    """Whether Triton can be imported here (the fused kernels can be built)."""
    return _importable()


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``: NumPy on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def why_not() -> str | None:
    """Why the fused kernels cannot run here, or None."""
    if not _importable():
        return "triton is not installed (pip install 'mystique-suite[triton]'; it ships with PyTorch's CUDA builds)"
    return None


def wanted(*tensors: torch.Tensor) -> bool:
    """Whether a checked call on these tensors takes the fused kernels: Triton importable, the switch not
    off, every tensor on CUDA (or, under the interpreter, on the CPU), no autograd through them."""
    if os.environ.get(SWITCH, "1") == "0" or not _importable():
        return False
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return False
    if all(t.is_cuda for t in tensors):
        return True
    return interpreting() and all(t.is_cpu for t in tensors)


def cuda_wanted(*tensors: torch.Tensor) -> bool:
    """:func:`wanted` for real CUDA tensors only (the dispatch of the CUDA paths of :mod:`..abft`)."""
    return bool(tensors) and all(t.is_cuda for t in tensors) and wanted(*tensors)
