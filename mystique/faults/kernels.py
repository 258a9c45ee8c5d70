"""Kernel faults: ``stuck_lane`` (one SIMD lane or matrix-unit column stuck), ``wrong_gelu`` (the
tanh GELU kernel run for erf GELU) and ``nondeterministic_reduction`` (a summation order drawn per
call). Each changes only what its class docstring says; everything else runs untouched.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mystique import dtypes
from mystique.errors import UsageError

from .modes import MATMUL_OPERANDS, FaultMode, entropy_seed, grouped_parts, matmul_selection
from .schema import base_name, bind, is_float, map_outputs, replace_args

_REDUCTIONS = frozenset({"sum", "mean", "nansum"})


def _parse_mask(text: str, what: str) -> int:
    if not text:
        return 0
    try:
        value = int(text, 0) if text.lower().startswith(("0x", "0b", "0o")) else int(text, 16)
    except ValueError as exc:
        raise UsageError(f"--inject stuck_lane: {what}={text!r} is not a bit mask (e.g. 0x40000000)") from exc
    if value < 0 or value >= 1 << 64:
        raise UsageError(f"--inject stuck_lane: {what}={text!r} does not fit in 64 bits")
    return value


def _signed(mask: int, width: int) -> int:
    mask &= (1 << width) - 1
    return mask - (1 << width) if mask >= 1 << (width - 1) else mask


class StuckLaneMode(FaultMode):
    """One output lane of matrix-multiply results is stuck.

    Elements whose index along the last dimension is ``lane`` modulo ``width`` read ``value``, or,
    when ``stuck1``/``stuck0`` bit masks are given (hex), have those bits forced to 1/0 instead.
    Only the matmul family (``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``mv``,
    ``addmv``, ``_grouped_mm``; ``ops``, a regular expression, narrows it) is affected; scalar
    results (``dot``) have no lanes and are left alone. A grouped matmul is one GEMM per group
    (:func:`.modes.grouped_parts`): the lane is counted from each group's first output column (the
    groups of a 3D x 2D grouped matmul sit side by side along the last dimension), and output rows
    that belong to no group are left as the device wrote them.
    """

    name = "stuck_lane"

    def __init__(self, lane: int = 3, width: int = 16, value: float = 0.0, stuck1: str = "", stuck0: str = "",
                 ops: str = ""):
        super().__init__()
        self.ops = matmul_selection(ops, self.name)
        if width < 1:
            raise UsageError(f"--inject stuck_lane: width={width} must be at least 1")
        if not 0 <= lane < width:
            raise UsageError(f"--inject stuck_lane: lane={lane} must be in [0, width={width})")
        self.lane = lane
        self.width = width
        self.value = value
        self.stuck1 = _parse_mask(stuck1, "stuck1")
        self.stuck0 = _parse_mask(stuck0, "stuck0")

    def fault(self, func, args, kwargs):
        out = func(*args, **kwargs)
        name = base_name(func)
        if name not in self.ops:
            return out
        if name == "_grouped_mm":
            b = bind(func, args, kwargs)
            y = out.clone()
            for index, _, _ in grouped_parts(b["self"], b["mat2"], b["offs"]):
                self._stick_(y[index])
            return y
        return map_outputs(func, args, kwargs, out, self._stick)

    def _stick(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[-1] <= self.lane:
            return t
        return self._stick_(t.clone())

    def _stick_(self, y: torch.Tensor) -> torch.Tensor:
        """``y``'s lanes stuck in place (``y`` may be a view of a larger result)."""
        if y.dim() == 0 or y.shape[-1] <= self.lane:
            return y
        lanes = y[..., self.lane::self.width]
        if self.stuck1 or self.stuck0:
            width = y.element_size() * 8
            bits = lanes.view(dtypes.int_dtype(y.dtype))
            if self.stuck1:
                bits.bitwise_or_(_signed(self.stuck1, width))
            if self.stuck0:
                bits.bitwise_and_(_signed(~self.stuck0, width))
        else:
            lanes.fill_(self.value)
        return y


class WrongGeluMode(FaultMode):
    """Exact (erf) GELU is computed with the tanh approximation.

    ``aten.gelu`` (functional, in place and ``out=``) called with ``approximate='none'`` runs
    with ``approximate='tanh'``; with ``backward`` (default) so does ``aten.gelu_backward``, as a
    library that ships only the tanh kernel would do. Calls that already ask for tanh are
    unchanged.
    """

    name = "wrong_gelu"

    def __init__(self, backward: bool = True):
        super().__init__()
        self.backward = backward

    def fault(self, func, args, kwargs):
        name = base_name(func)
        if name == "gelu" or (self.backward and name == "gelu_backward"):
            if kwargs.get("approximate", "none") == "none":
                kwargs = {**kwargs, "approximate": "tanh"}
        return func(*args, **kwargs)




def permute_along(t: torch.Tensor, dims: Iterable[int], perm: torch.Tensor) -> torch.Tensor:
    """``t`` with its elements permuted jointly over ``dims`` (flattened) by ``perm``; same shape."""
    dims = sorted({d % t.dim() for d in dims})
    end = list(range(t.dim() - len(dims), t.dim()))
    moved = t.movedim(dims, end)
    flat = moved.reshape(*moved.shape[: t.dim() - len(dims)], -1)
    shuffled = flat.index_select(-1, perm.to(t.device)).reshape(moved.shape)
    return shuffled.movedim(end, dims)


class NondeterministicReductionMode(FaultMode):
    """Reductions add their terms in a random order, drawn anew for every call.

    ``sum``, ``mean`` and ``nansum`` (all their overloads, ``out=`` included) reduce a copy of the
    input whose elements are shuffled over the reduced dimensions; the matmul family shuffles
    its K dimension (a 2D x 2D ``_grouped_mm``, whose groups split K, within each group's stretch).
    The mathematical result is the same; the rounding, and so the last bits,
    change from call to call. ``seed=-1`` (default) draws the orders from OS entropy, so runs
    differ too; any other seed makes the sequence of orders reproducible.
    """

    name = "nondeterministic_reduction"

    def __init__(self, seed: int = -1):
        super().__init__()
        self.seed = seed
        self.gen = torch.Generator().manual_seed(entropy_seed(seed))

    def _perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)

    def _grouped_perm(self, offs: torch.Tensor, n: int) -> torch.Tensor:
        """A 2D x 2D grouped matmul reduces over each group's own stretch of K (``offs``): the terms
        are shuffled within each group, never across (that would change the sums)."""
        parts, start = [], 0
        for end in [int(v) for v in offs.tolist()] + [n]:
            if end > start:
                parts.append(start + self._perm(end - start))
            start = max(start, end)
        return torch.cat(parts) if parts else torch.arange(n)

    def fault(self, func, args, kwargs):
        name = base_name(func)
        if name in _REDUCTIONS:
            b = bind(func, args, kwargs)
            x = b["self"]
            if is_float(x) and x.dim() > 0:
                dims = b.get("dim")
                dims = list(range(x.dim())) if not dims else ([dims] if isinstance(dims, int) else list(dims))
                if all(isinstance(d, int) for d in dims):
                    n = 1
                    for d in dims:
                        n *= x.shape[d]
                    if n > 1:
                        args, kwargs = replace_args(func, args, kwargs, self=permute_along(x, dims, self._perm(n)))
        elif name in MATMUL_OPERANDS:
            b = bind(func, args, kwargs)
            first, second = MATMUL_OPERANDS[name]
            x, y = b[first], b[second]
            if is_float(x) and is_float(y) and x.shape[-1] > 1:
                perm = self._perm(x.shape[-1]) if not (name == "_grouped_mm" and x.dim() == y.dim() == 2) \
                    else self._grouped_perm(b["offs"], x.shape[-1])
                perm = perm.to(x.device)
                y_dim = -2 if y.dim() >= 2 else -1
                args, kwargs = replace_args(func, args, kwargs, **{
                    first: x.index_select(-1, perm), second: y.index_select(y_dim, perm)})
        return func(*args, **kwargs)

