"""The Triton kernels of the fused checks (:mod:`._jit`), loaded on first use (Triton is imported only then).

Importing :mod:`.linear` or :mod:`.bag` never imports Triton: :func:`gemm_kernels` and :func:`bag_kernel`
load :mod:`._jit` once per mode (compiled for CUDA, or interpreted where ``TRITON_INTERPRET=1``: the
decorator reads the flag when it runs, so a mode changed later loads it again as another module).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from . import interpreting

_LOADED: dict[bool, Any] = {}


def jit_module() -> Any:
    """:mod:`._jit` as loaded for the current mode (interpreted or compiled), loaded on first need."""
    mode = interpreting()
    if mode not in _LOADED:
        path = Path(__file__).with_name("_jit.py")
        spec = importlib.util.spec_from_file_location(f"{__package__}._jit_{'interpreted' if mode else 'compiled'}",
                                                      path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # (Triton resolves a kernel's globals through its module)
        spec.loader.exec_module(mod)
        _LOADED[mode] = mod
    return _LOADED[mode]


def gemm_kernels() -> tuple[Any, Any]:
    """``(checked_mm_kernel, verdict_kernel)`` of :mod:`.linear`."""
    mod = jit_module()
    return mod.checked_mm_kernel, mod.verdict_kernel


def bag_kernel() -> Any:
    """The fused checked EmbeddingBag kernel of :mod:`.bag`."""
    return jit_module().checked_bag_kernel
