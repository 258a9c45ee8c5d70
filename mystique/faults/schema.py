"""Operator-schema helpers for dispatch modes: name an operator, bind a call's arguments, and
deliver a changed result the way the operator would (fresh, in place or ``out=``; views never).

Shared by the fault simulations and the device emulation (:mod:`mystique.emulation`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from mystique.dtypes import FLOAT_DTYPES


def op_name(func: Any) -> str:
    """The operator's name without namespace or overload: ``mm``, ``addmm_``, ``_to_copy``."""
    return func.overloadpacket.__name__


def base_name(func: Any) -> str:
    """The name with an in-place trailing underscore removed (``addmm_`` -> ``addmm``)."""
    name = op_name(func)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Map every schema argument name of ``func`` to the value of this call (defaults filled in)."""
    bound: dict[str, Any] = {}
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    for i, arg in enumerate(positional):
        if i < len(args):
            bound[arg.name] = args[i]
    for arg in func._schema.arguments:
        if arg.name in bound:
            continue
        if arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


def replace_args(func: Any, args: tuple, kwargs: dict, **new: Any) -> tuple[tuple, dict]:
    """Return ``(args, kwargs)`` of the same call with the named arguments replaced."""
    args = list(args)
    kwargs = dict(kwargs)
    positional = [a.name for a in func._schema.arguments if not a.kwarg_only]
    for name, value in new.items():
        if name in positional and positional.index(name) < len(args):
            args[positional.index(name)] = value
        else:
            kwargs[name] = value
    return tuple(args), kwargs


def written_args(func: Any) -> list[tuple[str, bool]]:
    """``(name, kwarg_only)`` of each argument the operator writes (``self`` in place, ``out=``)."""
    return [(a.name, a.kwarg_only) for a in func._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write]


def is_view(func: Any) -> bool:
    """True when a result of the operator aliases an input without writing it (a view)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def is_float(t: Any) -> bool:
    """True for a non-empty strided floating tensor with data (not on the meta device)."""
    return (isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES and t.layout == torch.strided
            and t.device.type != "meta" and t.numel() > 0)


def storage_key(t: torch.Tensor) -> int | None:
    """The data pointer of ``t``'s storage (None where the tensor has no real storage)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def input_storages(args: tuple, kwargs: dict) -> set[int]:
    """Storage keys of every tensor among a call's arguments."""
    keys: set[int] = set()

    def visit(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = storage_key(x)
            if key:
                keys.add(key)
        return x

    tree_map(visit, (args, kwargs))
    return keys


def map_outputs(func: Any, args: tuple, kwargs: dict, out: Any,
                fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` (tensor -> faulty tensor of the same shape and dtype) to the op's floating results.

    Fresh results are replaced by ``fn``'s result; results that are written inputs (in-place,
    ``out=``) get the faulty values copied into them; results that alias an input without the
    schema saying it is written (views, ``_unsafe_view``) are returned untouched. Returns the
    operator's result with those replacements.
    """
    if is_view(func):
        return out
    mutable = func._schema.is_mutable
    inputs = input_storages(args, kwargs)

    def one(t: Any) -> Any:
        if not is_float(t):
            return t
        aliased = storage_key(t) in inputs
        if aliased and not mutable:
            return t
        faulty = fn(t)
        if faulty is t:
            return t
        if aliased:
            t.copy_(faulty)
            return t
        return faulty

    return tree_map(one, out)


def finish(func: Any, bound: dict[str, Any], value: torch.Tensor) -> torch.Tensor:
    """Deliver a functionally computed faulty ``value`` the way ``func`` would: into its written
    argument (in place or ``out=``, resized as ``out=`` semantics allow) or as a fresh result."""
    written = written_args(func)
    if not written:
        return value
    target = bound[written[0][0]]
    if written[0][1] and target.shape != value.shape:  # out=: resized like the real kernel does
        target.resize_(value.shape)
    target.copy_(value)
    return target
