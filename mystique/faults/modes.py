"""The base of every built-in fault simulation: a ``TorchDispatchMode`` whose ``fault`` computes
each operator's (possibly faulty) result.

PyTorch pops a mode off the dispatch-mode stack while its ``__torch_dispatch__`` runs, so plain
torch calls made inside ``fault`` run on the healthy device (or the next mode of the stack) and
never re-enter the same mode.
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# Matrix-multiply family as the dispatcher sees it (linear and matmul decompose into these).
MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot"})
# name -> (the operand whose last dimension is K, the operand whose K dimension is -2 (-1 for a vector))
MATMUL_OPERANDS = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"),
    "baddbmm": ("batch1", "batch2"), "addbmm": ("batch1", "batch2"), "mv": ("self", "vec"),
    "addmv": ("mat", "vec"), "dot": ("self", "tensor"), "vdot": ("self", "other"),
}


def entropy_seed(seed: int) -> int:
    """``seed`` itself, or a seed drawn from OS entropy when ``seed`` is negative."""
    return int.from_bytes(os.urandom(8), "little") >> 1 if seed < 0 else seed


class FaultMode(TorchDispatchMode):
    """Base of the built-in simulations: ``fault(func, args, kwargs)`` computes each result."""

    name = "fault"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.fault(func, tuple(args), dict(kwargs or {}))

    def fault(self, func: Any, args: tuple, kwargs: dict) -> Any:  # pragma: no cover - overridden
        return func(*args, **kwargs)
