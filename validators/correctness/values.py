"""Values an op-by-op comparison handles: copies of tensors that keep their storage sharing, and
arguments and results (float64 dtypes, flattening, shapes for details)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mystique.replay.runtime import flatten_result

from .tolerance import accumulation_dtype, unit_roundoff

# ----------------------------------------------------------------------------------------------
# Copies that keep storage sharing


def clone_group(values: Sequence[torch.Tensor], device: torch.device | Sequence[torch.device], *,
                upcast: bool = False, perturb: torch.Generator | None = None) -> list[torch.Tensor]:
    """Copies of ``values`` on ``device`` (one device, or one per value) that alias each other
    exactly as the originals do.

    Each distinct storage is copied once, whole, and every tensor is set onto its copy with the
    original sizes, strides and offset (sharing its memory, not an autograd view of it, like the
    executor's materialised tensors), so in-place and ``out=`` operators and
    ``as_strided`` views see the same memory layout. ``upcast`` turns floating storages into
    float64; ``perturb`` (a generator) then multiplies every floating element by ``1 + u * r``,
    ``r`` uniform in [-1, 1], ``u`` the unit roundoff of the accumulation dtype of its original
    dtype. A storage read with two dtypes is copied per tensor (views of it do not alias then).
    """
    cache: dict[tuple[str, int, int, str], tuple[torch.Tensor, torch.dtype]] = {}
    out: list[torch.Tensor] = []
    devices = [device] * len(values) if isinstance(device, torch.device) else list(device)
    for t, dev in zip(values, devices):
        new_dtype = torch.float64 if upcast and t.dtype.is_floating_point else t.dtype
        if t.layout != torch.strided:
            out.append(t.detach().to(device=dev, dtype=new_dtype, copy=True))
            continue
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr(), st.nbytes(), str(dev))
        entry = cache.get(key)
        base = None
        if entry is not None and entry[1] == t.dtype:
            base = entry[0]
        else:
            itemsize = t.element_size()
            n = st.nbytes() // itemsize
            flat = torch.empty(0, dtype=t.dtype, device=t.device)
            flat.set_(st, 0, (n,), (1,))
            base = flat.detach().to(device=dev, dtype=new_dtype, copy=True)
            if perturb is not None and base.dtype.is_floating_point and base.numel():
                u = unit_roundoff(accumulation_dtype(t.dtype))
                r = torch.rand(base.shape, generator=perturb, dtype=torch.float64).to(base.device)
                base.mul_(1.0 + u * (2.0 * r - 1.0))
            if entry is None:
                cache[key] = (base, t.dtype)
        try:  # a tensor on the copied storage (not an autograd view of it: in-place detach_ works)
            v = torch.empty(0, dtype=base.dtype, device=base.device)
            v.set_(base.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            out.append(v)
        except RuntimeError:
            out.append(t.detach().to(device=dev, dtype=new_dtype, copy=True))
    return out


# ----------------------------------------------------------------------------------------------
# Arguments


def to_float64_dtypes(value: Any) -> Any:
    """Every floating ``torch.dtype`` inside an argument replaced by ``torch.float64``."""
    if isinstance(value, torch.dtype):
        return torch.float64 if value.is_floating_point else value
    if isinstance(value, list):
        return [to_float64_dtypes(v) for v in value]
    return value


def flatten(value: Any) -> list[Any]:
    """Results flattened: nested lists/tuples expanded, other values kept (None included)."""
    return flatten_result(value)


def shapes_of(values: Iterable[Any]) -> list[Any]:
    """Shapes of the tensors among ``values`` (lists of shapes for tensor lists); for details."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(list(v.shape))
        elif isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
            out.append([list(e.shape) if isinstance(e, torch.Tensor) else None for e in v])
    return out
