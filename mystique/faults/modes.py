"""The base of every built-in fault simulation: a ``TorchDispatchMode`` whose ``fault`` computes
each operator's (possibly faulty) result.

PyTorch pops a mode off the dispatch-mode stack while its ``__torch_dispatch__`` runs, so plain
torch calls made inside ``fault`` run on the healthy device (or the next mode of the stack) and
never re-enter the same mode.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.errors import UsageError

# Matrix-multiply family as the dispatcher sees it (linear and matmul decompose into these; a mixture
# of experts' expert GEMMs are one grouped matmul, ``_grouped_mm``, forward and backward alike).
MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_grouped_mm"})
# name -> (the operand whose last dimension is K, the operand whose K dimension is -2 (-1 for a vector))
MATMUL_OPERANDS = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"),
    "baddbmm": ("batch1", "batch2"), "addbmm": ("batch1", "batch2"), "mv": ("self", "vec"),
    "addmv": ("mat", "vec"), "dot": ("self", "tensor"), "vdot": ("self", "other"),
    "_grouped_mm": ("self", "mat2"),
}


def matmul_selection(ops: str, fault: str) -> frozenset[str]:
    """The members of :data:`MATMUL_OPS` a fault's ``ops`` parameter selects: all of them when empty,
    else those the regular expression (``,`` separates alternatives too) matches whole. UsageError
    when it is not a regular expression or selects none (a fault that changes nothing)."""
    text = "|".join(o.strip() for o in ops.split(",") if o.strip())
    if not text:
        return MATMUL_OPS
    try:
        rx = re.compile(text)
    except re.error as exc:
        raise UsageError(f"--inject {fault}: ops={ops!r} is not a regular expression: {exc}") from exc
    chosen = frozenset(n for n in MATMUL_OPS if rx.fullmatch(n))
    if not chosen:
        raise UsageError(f"--inject {fault}: ops={ops!r} selects none of the matmul family "
                         f"({', '.join(sorted(MATMUL_OPS))})")
    return chosen


def grouped_parts(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> list[tuple[Any, Any, Any]]:
    """The ordinary GEMMs one ``torch._grouped_mm(a, b, offs=offs)`` computes: ``(index, a_g, b_g)``
    per group, ``a_g @ b_g`` being the output's ``out[index]``. ``offs`` holds each group's cumulative
    end along the grouped dimension (empty groups repeat the previous end):

    * ``a`` 2D ``(T, K)``, ``b`` 3D ``(G, K, N)``: rows ``s:e`` of ``a`` times ``b[g]`` -> ``out[s:e]``
      (output rows past ``offs[-1]`` belong to no group: left as the device wrote them);
    * 2D ``(K, T)`` x 2D ``(T, N)`` (a weight gradient): ``a[:, s:e] @ b[s:e]`` -> ``out[g]`` of ``(G, K, N)``
      (an empty group's is a zero matrix: a K of 0);
    * 3D ``(G, M, K)`` x 2D ``(K, T)``: ``a[g] @ b[:, s:e]`` -> ``out[:, s:e]``;
    * 3D x 3D (no ``offs``): ``a[g] @ b[g]`` -> ``out[g]``.
    """
    if a.dim() == 3 and b.dim() == 3:
        return [((g,), a[g], b[g]) for g in range(a.shape[0])]
    if offs is None:
        raise ValueError(f"_grouped_mm of a {a.dim()}D and a {b.dim()}D operand needs offs")
    parts, start = [], 0
    for g, end in enumerate(int(v) for v in offs.tolist()):
        if a.dim() == 2 and b.dim() == 3:
            if end > start:
                parts.append(((slice(start, end),), a[start:end], b[g]))
        elif a.dim() == 2 and b.dim() == 2:
            parts.append(((g,), a[:, start:end], b[start:end]))
        else:
            if end > start:
                parts.append(((slice(None), slice(start, end)), a[g], b[:, start:end]))
        start = end
    return parts


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
