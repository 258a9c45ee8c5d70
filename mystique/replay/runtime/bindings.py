"""The Python binding eager code calls for an aten overload (``torch.add``, ``Tensor.view``),
verified on meta tensors to dispatch exactly as the overload does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .format import TensorSlot

try:
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
except ImportError:  # pragma: no cover - very old torch: the overloads themselves are called
    TorchDispatchMode, _disable_current_modes = None, None

# torch._C modules whose functions are the generated Python bindings of aten operators (torch.add,
# torch.nn.functional.linear's torch._C._nn.linear, ...); Tensor methods come from torch._C.TensorBase.
_BINDING_MODULES: tuple[str, ...] = ("_VariableFunctions", "_nn", "_linalg", "_special", "_fft")
_binding_verdicts: dict[tuple[Any, ...], Any] = {}


def _type_key(v: Any) -> Any:
    """What the Python argument parser looks at to pick an overload: types, not values."""
    if isinstance(v, TensorSlot):
        return "T"
    if isinstance(v, (list, tuple)):
        return ("L", tuple(_type_key(e) for e in v))
    return type(v).__name__


def _meta_value(v: Any, meta: Callable[[int], torch.Tensor]) -> Any:
    if isinstance(v, TensorSlot):
        return meta(v.tid)
    if isinstance(v, list):
        return [_meta_value(e, meta) for e in v]
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


def _call_key(v: Any) -> Any:
    """A comparable summary of an argument or result as the dispatcher saw it."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), tuple(v.stride()), v.dtype, v.storage_offset())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__ if not isinstance(v, tuple) else "tuple", tuple(_call_key(e) for e in v))
    if isinstance(v, dict):
        return tuple(sorted((k, _call_key(e)) for k, e in v.items()))
    return (type(v).__name__, repr(v))


_NO_DEFAULT = object()
_schema_defaults: dict[Any, tuple[list[Any], dict[str, tuple[bool, Any]]]] = {}


def _defaults_of(overload: Any) -> tuple[list[Any], dict[str, tuple[bool, Any]]]:
    """The defaults of ``overload``'s positional arguments in order, and ``name -> (kwarg_only,
    default)`` for all of them (:data:`_NO_DEFAULT` where there is none); cached per overload."""
    got = _schema_defaults.get(overload)
    if got is None:
        positional: list[Any] = []
        by_name: dict[str, tuple[bool, Any]] = {}
        for a in overload._schema.arguments:
            try:
                d = a.default_value if a.has_default_value() else _NO_DEFAULT
            except (AttributeError, RuntimeError):
                d = _NO_DEFAULT
            by_name[a.name] = (bool(a.kwarg_only), d)
            if not a.kwarg_only:
                positional.append(d)
        got = _schema_defaults[overload] = (positional, by_name)
    return got


def _is_default(v: Any, d: Any) -> bool:
    """Whether ``v`` is the default ``d`` (same type and value; never for a tensor)."""
    if d is _NO_DEFAULT or isinstance(v, TensorSlot) or type(v) is not type(d):
        return False
    try:
        return bool(v == d)
    except Exception:  # noqa: BLE001
        return False


def _without_defaults(overload: Any, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``args``/``kwargs`` less the trailing positional and the keyword arguments that equal their
    schema defaults (eager code leaves them out; the Python argument parser fills them in again)."""
    positional, by_name = _defaults_of(overload)
    out = list(args)
    while out and len(out) <= len(positional) and _is_default(out[-1], positional[len(out) - 1]):
        out.pop()
    if len(out) < len(args) and any(k in by_name and not by_name[k][0] for k in kwargs):
        out = list(args)  # positional arguments passed by name follow the left-out ones: keep them all
    kw = {k: v for k, v in kwargs.items() if not (k in by_name and _is_default(v, by_name[k][1]))}
    return out, kw


def binding_call(overload: Any, args: list[Any], kwargs: dict[str, Any],
                 meta: Callable[[int], torch.Tensor]) -> tuple[Callable[..., Any], list[Any], dict[str, Any]] | None:
    """``(binding, args, kwargs)``: the generated Python binding (``torch.add``, ``Tensor.view``,
    ...) and the arguments to call it with (those equal to their defaults left out, a trailing int
    list spread as varargs, where that changes nothing) that dispatch ``overload`` exactly as
    calling the overload with ``args`` and ``kwargs`` does; None when no binding does.

    Calling an ``OpOverload`` (even its raw ``_op``) goes through the boxed JIT operator path, which
    converts every argument by schema and costs more per call than the Python binding eager code
    calls. The binding picks an overload by the arguments' Python types, which need not be the
    recorded one (a Python number ``other`` makes ``torch.add`` call ``add.Tensor``, not
    ``add.Scalar``), so each candidate is checked on meta tensors of the recorded metadata, with
    every other dispatch mode set aside: under a recording dispatch mode the binding must reach
    the same operators with the same arguments as the overload does, and return the same.
    Verdicts are cached per operator, argument types and left-out defaults (the parser's choice
    depends only on them). ``meta(tid)``: a meta tensor with the recorded metadata of plan tensor
    ``tid``.
    """
    if not isinstance(overload, torch._ops.OpOverload) or overload.namespace != "aten":
        return None
    name = overload._schema.name.split("::", 1)[-1]
    short_args, short_kwargs = _without_defaults(overload, args, kwargs)
    key = (str(overload), tuple(_type_key(a) for a in args), tuple((k, _type_key(v)) for k, v in kwargs.items()),
           len(short_args), tuple(short_kwargs))
    if key in _binding_verdicts:
        return _binding_form(_binding_verdicts[key], args, kwargs, short_args, short_kwargs)
    cands = [getattr(getattr(torch._C, m, None), name, None) for m in _BINDING_MODULES]
    cands.append(getattr(torch._C.TensorBase, name, None))
    cands = [c for c in cands if c is not None and callable(c)] if TorchDispatchMode is not None else []
    found = _find_binding(overload, cands, _call_forms(args, kwargs, short_args, short_kwargs), args, kwargs, meta)
    _binding_verdicts[key] = found
    return _binding_form(found, args, kwargs, short_args, short_kwargs)


def _call_forms(args: list[Any], kwargs: dict[str, Any], short_args: list[Any],
                short_kwargs: dict[str, Any]) -> list[tuple[list[Any], dict[str, Any], str]]:
    """The argument forms a binding is tried with, in order of preference: a trailing int list
    spread as varargs, defaults left out, all arguments."""
    forms: list[tuple[list[Any], dict[str, Any], str]] = []
    last = short_args[-1] if short_args else None
    if (not short_kwargs and isinstance(last, list) and last
            and all(isinstance(v, int) and not isinstance(v, bool) for v in last)):
        # x.view(2, 8) rather than x.view([2, 8]): the parser takes a list argument given as varargs faster
        forms.append((short_args[:-1] + list(last), {}, "spread"))
    forms.append((short_args, short_kwargs, "short"))
    if len(short_args) != len(args) or len(short_kwargs) != len(kwargs):
        forms.append((list(args), dict(kwargs), "full"))
    return forms


class _Recorder(TorchDispatchMode or object):  # type: ignore[misc]
    """A dispatch mode that records every operator call with a summary of its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []

    def __torch_dispatch__(self, func, types, f_args=(), f_kwargs=None):
        f_kwargs = f_kwargs or {}
        self.calls.append((func, _call_key(list(f_args)), _call_key(f_kwargs)))
        return func(*f_args, **f_kwargs)


def _dispatch_trace(fn: Callable[..., Any], c_args: list[Any], c_kwargs: dict[str, Any],
                    meta: Callable[[int], torch.Tensor]) -> Any:
    """What calling ``fn`` on meta tensors dispatches (operators and arguments) and returns; None
    when it raises or dispatches nothing."""
    cache: dict[int, torch.Tensor] = {}

    def m(tid: int) -> torch.Tensor:
        if tid not in cache:
            cache[tid] = meta(tid)
        return cache[tid]

    a = [_meta_value(v, m) for v in c_args]
    k = {n: _meta_value(v, m) for n, v in c_kwargs.items()}
    rec = _Recorder()
    try:
        with rec:
            res = fn(*a, **k)
    except Exception:  # noqa: BLE001 - no meta kernel, or the binding refuses these arguments
        return None
    return (tuple(rec.calls), _call_key(res)) if rec.calls else None


def _find_binding(overload: Any, cands: list[Any], forms: list[tuple[list[Any], dict[str, Any], str]],
                  args: list[Any], kwargs: dict[str, Any], meta: Callable[[int], torch.Tensor]) -> tuple[Any, str] | None:
    """The first ``(candidate, form)`` that dispatches as the overload does, other dispatch modes set aside."""
    if not cands:
        return None
    modes = torch._C._len_torch_dispatch_stack() or torch._ops._len_torch_dispatch_stack_pre_dispatch()
    try:
        with (_disable_current_modes() if modes else contextlib.nullcontext()), torch.no_grad():
            want = _dispatch_trace(overload._op, list(args), dict(kwargs), meta)
            if want is None:
                return None
            for f_args, f_kwargs, form in forms:
                found = next(((c, form) for c in cands if _dispatch_trace(c, f_args, f_kwargs, meta) == want), None)
                if found is not None:
                    return found
    except Exception:  # noqa: BLE001 - any trouble: keep calling the overload
        return None
    return None


def _binding_form(found: tuple[Any, str] | None, args: list[Any], kwargs: dict[str, Any], short_args: list[Any],
                  short_kwargs: dict[str, Any]) -> tuple[Callable[..., Any], list[Any], dict[str, Any]] | None:
    if found is None:
        return None
    fn, form = found
    if form == "spread":
        return fn, short_args[:-1] + list(short_args[-1]), {}
    if form == "short":
        return fn, list(short_args), dict(short_kwargs)
    return fn, list(args), dict(kwargs)


def python_binding(overload: Any, args: list[Any], kwargs: dict[str, Any],
                   meta: Callable[[int], torch.Tensor]) -> Callable[..., Any] | None:
    """The Python binding :func:`binding_call` finds for ``overload`` and these arguments, or None."""
    found = binding_call(overload, args, kwargs, meta)
    return found[0] if found is not None else None
