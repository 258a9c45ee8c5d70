"""Run a Mystique replay plan (``benchmark.json``) with synthetic data on any torch device.

This module depends only on torch and the Python standard library: it is copied verbatim into
every generated standalone ``benchmark.py``. It holds everything needed to run a plan:

* operator schemas (``ns::op.overload(args) -> ret``) and overload resolution from ``torch.ops``;
* decoding of the plan's JSON argument encoding (tensor references, scalars, lists, dtypes,
  layouts, memory formats, devices);
* materialisation of storages with their data recipes and of tensors as strided views into them,
  so tensors alias exactly as the trace recorded;
* a late-allocation / early-free schedule (storages produced by replayed ops are dropped after
  their last use), the peak memory it implies and a refusal when the device cannot hold it;
* the replay loop itself: device remapping, in-place and ``out=`` ops, ``_foreach_*`` ops,
  no-ops (``record_stream``, profiler nodes), skipped collectives and unavailable custom ops,
  and a synthetic fallback when an op's result disagrees with the recorded metadata;
* per-op cost at eager's: each op calls the Python binding eager code calls (``torch.add``,
  ``Tensor.view``), checked on meta tensors to dispatch the recorded overload, and whole
  iterations after the first run one generated straight-line function (the compiled iteration);
* pacing: optionally, the captured step's host gaps between ops (``gap_us``) waited for;
* timing: whole iterations with a single device synchronisation, and per-op passes.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gc
import importlib
import json
import keyword
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

PLAN_FORMAT = "mystique-benchmark"
PLAN_VERSION = 1

# c10::ScalarType, c10::Layout and c10::MemoryFormat in enum order: the trace records them as ints.
SCALAR_TYPES: tuple[str, ...] = (
    "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32", "complex64",
    "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2", "quint2x4", "bits1x8",
    "bits2x4", "bits4x2", "bits8", "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
    "float8_e4m3fnuz", "uint16", "uint32", "uint64",
)
LAYOUTS: tuple[str, ...] = (
    "strided", "sparse_coo", "sparse_csr", "_mkldnn", "sparse_csc", "sparse_bsr", "sparse_bsc", "jagged",
)
MEMORY_FORMATS: tuple[str, ...] = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")

# Modules that register the operators of a custom namespace when imported.
CUSTOM_OP_MODULES: dict[str, tuple[str, ...]] = {
    "fbgemm": ("fbgemm_gpu",),
    "fsdp": ("torch.distributed.fsdp",),  # FSDP2's copy-in/out ops
    "torchrec": ("torchrec",),
    "torchvision": ("torchvision",),
    "torchaudio": ("torchaudio",),
    "xformers": ("xformers.ops",),
    "mkldnn": (),
    "quantized": (),
}

# Operator namespaces a replay calls without being asked: torch's own (aten, prims, the profiler's
# bookkeeping, the collectives and DTensor/FSDP2 helpers) and those of the workload libraries above
# whose traces this suite replays (fbgemm/torchrec for DLRM, torchvision, torchaudio, quantized and
# mkldnn kernels, xformers attention). A trace names the operators the replay calls, so any other
# namespace (whatever a loaded extension registered) is refused unless the user allows it with
# ``--allow-ops PATTERN`` (fnmatch on ``ns::name``, e.g. ``mylib::*``); see :func:`op_refusal`.
ALLOWED_OP_NAMESPACES: tuple[str, ...] = (
    "aten", "prims", "profiler", "c10d", "c10d_functional", "_c10d_functional", "_c10d_functional_autograd",
    "_dtensor", "fsdp", "fbgemm", "torchrec", "torchvision", "torchaudio", "quantized", "mkldnn", "xformers",
)

COLLECTIVE_PREFIXES: tuple[str, ...] = ("c10d::", "c10d_functional::", "_c10d_functional::", "nccl:", "gloo:")
COLLECTIVE_NAMES: frozenset[str] = frozenset({"record_param_comms"})
# Scale-out hook: ``handler(op, executor) -> callable | None``. None (single process): collectives
# are skipped. A multi-rank replay (mystique.distributed) sets it in each rank's process.
COLLECTIVE_HANDLER: Callable[[dict[str, Any], Any], Callable[..., Any] | None] | None = None
NOOP_NAMES: frozenset[str] = frozenset({
    "aten::record_stream",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "profiler::_call_end_callbacks_on_jit_fut",
})


class ReplayError(Exception):
    """A plan that cannot be run (malformed, unknown version)."""


class InsufficientMemory(ReplayError):
    """The plan's peak memory exceeds what the device has available."""

    def __init__(self, needed: int, available: int, device: str):
        self.needed = needed
        self.available = available
        self.device = device
        super().__init__(
            f"the benchmark needs {needed / 2**30:.2f} GiB at its peak but {device} has "
            f"{available / 2**30:.2f} GiB available"
        )


# ----------------------------------------------------------------------------------------------
# Operator schemas
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaArg:
    name: str
    type: str  # "Tensor(a!)", "SymInt[]", "ScalarType?", ...
    default: str | None
    kwarg_only: bool

    @property
    def base_type(self) -> str:
        """The type without alias annotations, optional marks or list sizes: ``Tensor``, ``int[]``."""
        t = self.type
        out, depth = [], 0
        for ch in t:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif depth == 0:
                out.append(ch)
        t = "".join(out).replace("?", "")
        if "[" in t:
            t = t[: t.index("[")] + "[]"
        return t

    @property
    def optional(self) -> bool:
        return "?" in self.type

    @property
    def is_list(self) -> bool:
        return "[" in self.type

    @property
    def mutable(self) -> bool:
        return "!" in self.type


@dataclass(frozen=True)
class Schema:
    namespace: str
    name: str
    overload: str  # "default" when the schema names none
    args: tuple[SchemaArg, ...]
    returns: str

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}.{self.overload}"


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    quote = ""
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


def parse_schema(text: str) -> Schema:
    """Parse ``ns::op.overload(Type name=default, *, ...) -> ret`` (raises ValueError)."""
    text = text.strip()
    if "(" not in text or "::" not in text.split("(", 1)[0]:
        raise ValueError(f"not an operator schema: {text!r}")
    head, rest = text.split("(", 1)
    ns, _, qual = head.strip().partition("::")
    name, _, overload = qual.partition(".")
    depth, end = 1, -1
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end < 0:
        raise ValueError(f"unbalanced parentheses in schema {text!r}")
    arg_text, returns = rest[:end], rest[end + 1:].strip()
    if returns.startswith("->"):
        returns = returns[2:].strip()
    args: list[SchemaArg] = []
    kwarg_only = False
    for part in _split_top(arg_text):
        if part == "*":
            kwarg_only = True
            continue
        decl, eq, default = part.partition("=")
        decl = decl.strip()
        cut = decl.rfind(" ")
        if cut < 0:
            raise ValueError(f"cannot read argument {part!r} of schema {text!r}")
        args.append(SchemaArg(decl[cut + 1:], decl[:cut].strip(), default.strip() if eq else None, kwarg_only))
    return Schema(ns, name, overload or "default", tuple(args), returns)


_ns_import_tried: set[str] = set()


def import_namespace(ns: str) -> None:
    """Import the modules known to register operators of namespace ``ns`` (once, quietly)."""
    if ns in _ns_import_tried:
        return
    _ns_import_tried.add(ns)
    for mod in CUSTOM_OP_MODULES.get(ns, ()):
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - an absent or broken optional package means "unavailable"
            pass


def op_refusal(qualified: str, allow_ops: Sequence[str] = ()) -> str:
    """Why a replay must not call operator ``qualified`` (``ns::name`` or ``ns::name.overload``): its
    namespace is not in :data:`ALLOWED_OP_NAMESPACES` and no pattern of ``allow_ops`` (fnmatch,
    case-sensitive, on ``ns::name`` or on the whole ``qualified``) matches it. "" when it may."""
    ns, sep, rest = qualified.partition("::")
    if not sep or ns in ALLOWED_OP_NAMESPACES:
        return ""  # a name without a namespace resolves to no operator anyway
    short = f"{ns}::{rest.split('.', 1)[0]}"
    if any(fnmatch.fnmatchcase(short, p) or fnmatch.fnmatchcase(qualified, p) for p in allow_ops):
        return ""
    return f"namespace {ns!r} not allowed (pass --allow-ops '{ns}::*')"


def resolve_overload(qualified: str, allow_ops: Sequence[str] = ()) -> Any:
    """``"aten::addmm.default"`` -> ``torch.ops.aten.addmm.default`` (None when unavailable, or
    refused by :func:`op_refusal` with ``allow_ops``)."""
    if op_refusal(qualified, allow_ops):
        return None
    ns, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    overload = overload or "default"
    if ns not in ("aten", "prims"):
        import_namespace(ns)
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None


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
    calls (0.3 us for ``add`` on a 4-element tensor, 2.3 us for ``linear`` on this project's CPU
    host). The binding picks an overload by the arguments' Python types, which need not be the
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
    forms: list[tuple[list[Any], dict[str, Any], str]] = []
    last = short_args[-1] if short_args else None
    if (not short_kwargs and isinstance(last, list) and last
            and all(isinstance(v, int) and not isinstance(v, bool) for v in last)):
        # x.view(2, 8) rather than x.view([2, 8]): the parser takes a list argument given as varargs
        # faster (0.5 us less for view on this project's CPU host)
        forms.append((short_args[:-1] + list(last), {}, "spread"))
    forms.append((short_args, short_kwargs, "short"))
    if len(short_args) != len(args) or len(short_kwargs) != len(kwargs):
        forms.append((list(args), dict(kwargs), "full"))
    found: tuple[Any, str] | None = None
    try:
        from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
    except ImportError:  # pragma: no cover - very old torch: keep the overload
        cands = []
    if any(c is not None and callable(c) for c in cands):

        class _Recorder(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.calls: list[Any] = []

            def __torch_dispatch__(self, func, types, f_args=(), f_kwargs=None):
                f_kwargs = f_kwargs or {}
                self.calls.append((func, _call_key(list(f_args)), _call_key(f_kwargs)))
                return func(*f_args, **f_kwargs)

        def trace(fn: Callable[..., Any], c_args: list[Any], c_kwargs: dict[str, Any]) -> Any:
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

        modes = torch._C._len_torch_dispatch_stack() or torch._ops._len_torch_dispatch_stack_pre_dispatch()
        try:
            with (_disable_current_modes() if modes else contextlib.nullcontext()), torch.no_grad():
                want = trace(overload._op, list(args), dict(kwargs))
                if want is not None:
                    for f_args, f_kwargs, form in forms:
                        found = next(((c, form) for c in cands
                                      if c is not None and callable(c) and trace(c, f_args, f_kwargs) == want), None)
                        if found is not None:
                            break
        except Exception:  # noqa: BLE001 - any trouble: keep calling the overload
            found = None
    _binding_verdicts[key] = found
    return _binding_form(found, args, kwargs, short_args, short_kwargs)


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


def overload_schemas(ns_name: str, allow_ops: Sequence[str] = ()) -> list[str]:
    """Schema strings of every overload of ``ns::name`` registered in this torch (empty if none, or
    if :func:`op_refusal` refuses it with ``allow_ops``)."""
    if op_refusal(ns_name, allow_ops):
        return []
    ns, _, name = ns_name.partition("::")
    if ns not in ("aten", "prims"):
        import_namespace(ns)
    try:
        packet = getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return []
    out = []
    for ov in packet.overloads():
        try:
            out.append(str(getattr(packet, ov)._schema))
        except (AttributeError, RuntimeError):
            continue
    return out


# ----------------------------------------------------------------------------------------------
# Argument encoding (JSON) <-> Python values
# ----------------------------------------------------------------------------------------------


class TensorSlot:
    """A reference to plan tensor ``tid`` inside a decoded argument (filled at call time)."""

    __slots__ = ("tid",)

    def __init__(self, tid: int):
        self.tid = tid

    def __repr__(self) -> str:
        return f"TensorSlot({self.tid})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorSlot) and other.tid == self.tid

    def __hash__(self) -> int:
        return hash(("TensorSlot", self.tid))


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ReplayError(f"unknown dtype {name!r}")
    return dt


def decode_value(enc: Any, map_device: Callable[[str | None], torch.device] | None = None) -> Any:
    """Decode one JSON-encoded argument into a Python value; tensors become :class:`TensorSlot`.

    Encodings: JSON scalars and strings as themselves, lists element-wise, ``{"t": id}`` a tensor,
    ``{"dtype": name}``, ``{"layout": name}``, ``{"memory_format": name}``, ``{"device": str}``,
    ``{"float": "nan"|"inf"|"-inf"}``, ``{"none": kind}`` (an argument passed as None, e.g. a
    Generator).
    """
    if enc is None or isinstance(enc, (bool, int, float, str)):
        return enc
    if isinstance(enc, list):
        return [decode_value(e, map_device) for e in enc]
    if isinstance(enc, dict):
        if "t" in enc:
            return TensorSlot(int(enc["t"]))
        if "dtype" in enc:
            return dtype_from_name(enc["dtype"])
        if "layout" in enc:
            return getattr(torch, enc["layout"])
        if "memory_format" in enc:
            return getattr(torch, enc["memory_format"])
        if "device" in enc:
            return map_device(enc["device"]) if map_device else torch.device(enc["device"])
        if "float" in enc:
            return float(enc["float"])
        if "none" in enc:
            return None
    raise ReplayError(f"cannot decode argument {enc!r}")


def _device_str(dev: Any) -> str:
    return str(dev)


def encode_value(value: Any) -> Any:
    """Inverse of :func:`decode_value` for Python values (TensorSlot, dtype, device, ...)."""
    if isinstance(value, TensorSlot):
        return {"t": value.tid}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return {"float": repr(value)}
        return value
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).replace("torch.", "")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).replace("torch.", "")}
    if isinstance(value, torch.device):
        return {"device": _device_str(value)}
    raise ReplayError(f"cannot encode {type(value).__name__} value {value!r}")


# ----------------------------------------------------------------------------------------------
# Data recipes and materialisation
# ----------------------------------------------------------------------------------------------


_TILE = 1 << 22  # elements generated at random per storage; larger storages repeat them


def fill_storage(buf: torch.Tensor, recipe: dict[str, Any]) -> None:
    """Fill the flat tensor ``buf`` in place according to a data recipe.

    Recipes: ``randn`` (floats with standard deviation ``std``, default 1; 0/1 for integers), ``randint`` (``low`` <= v < ``high``;
    optional ``segments`` ``[start, count, stride, low, high]`` give views of the storage ranges of their own;
    optional ``zipf`` (an exponent) skews the values, see :func:`_draw_ints`),
    ``uniform_pos`` (floats in [0.1, 1)), ``bernoulli`` (0/1, False/True), ``offsets``
    (per segment ``[start, count, stride, total, include_last]``: non-decreasing, first 0, all <=
    ``total``), ``zeros``, ``ones``.
    """
    n = buf.numel()
    if n == 0 or buf.device.type == "meta":
        return
    if n > _TILE and recipe.get("kind") != "offsets" and not recipe.get("segments"):
        # large storages: random data for one block, repeated (generation is far slower than copying)
        fill_storage(buf[:_TILE], recipe)
        done = _TILE
        while done < n:
            k = min(done, n - done)
            buf[done:done + k].copy_(buf[:k])
            done += k
        return
    kind = recipe.get("kind", "randn")
    dt = buf.dtype
    floating = dt.is_floating_point or dt.is_complex
    with torch.no_grad():
        if kind == "zeros":
            buf.zero_()
        elif kind == "ones":
            buf.fill_(1)
        elif kind == "randint" and dt != torch.bool:
            low, high = int(recipe.get("low", 0)), int(recipe.get("high", 2))
            if high <= low:
                high = low + 1
            if dt.is_floating_point:
                buf.copy_(torch.randint(low, high, (n,), device=buf.device).to(dt))
            else:
                info = torch.iinfo(dt) if not dt.is_complex else None
                if info is not None:
                    low, high = max(low, info.min), min(high, info.max + 1) if high <= info.max else info.max
                    high = max(high, low + 1)
                buf.copy_(_draw_ints(low, high, n, buf.device, recipe.get("zipf")).to(dt))
            for start, count, stride, s_low, s_high in recipe.get("segments") or []:
                count = min(int(count), max((n - 1 - int(start)) // max(int(stride), 1) + 1, 0))
                if count > 0:
                    pos = int(start) + torch.arange(count, device=buf.device) * int(stride)
                    vals = _draw_ints(int(s_low), max(int(s_high), int(s_low) + 1), count, buf.device, recipe.get("zipf"))
                    buf[pos] = vals.to(dt)
        elif kind == "offsets":
            # non-decreasing bag starts beginning at 0, one run per offsets view (segment)
            segments = recipe.get("segments") or [
                [0, n, 1, int(recipe.get("total", 0)), bool(recipe.get("include_last"))]]
            buf.zero_()
            for start, count, stride, total, include_last in segments:
                count = min(int(count), max((n - 1 - int(start)) // max(int(stride), 1) + 1, 0))
                if count <= 0:
                    continue
                total = max(int(total), 0)
                vals = torch.randint(0, total + 1, (count,), device=buf.device, dtype=torch.int64).sort().values
                vals[0] = 0
                if include_last and count > 1:
                    vals[-1] = total
                pos = int(start) + torch.arange(count, device=buf.device) * int(stride)
                buf[pos] = vals.to(dt)
        elif dt == torch.bool or kind == "bernoulli":
            buf.copy_(torch.rand(n, device=buf.device) < 0.5)
        elif kind == "uniform_pos":
            if floating:
                buf.uniform_(0.1, 1.0)
            else:
                buf.copy_(torch.randint(1, 3, (n,), device=buf.device).to(dt))
        elif floating:
            std = float(recipe.get("std", 1.0))
            if dt.is_floating_point and dt.itemsize == 1:  # float8: generate wider, then cast
                buf.copy_(torch.randn(n, device=buf.device) * std)
            else:
                buf.normal_(0.0, std)
        else:
            buf.copy_(torch.randint(0, 2, (n,), device=buf.device).to(dt))


def _draw_ints(low: int, high: int, n: int, device: torch.device, zipf: Any = None) -> torch.Tensor:
    """``n`` int64 values in ``[low, high)``: uniform, or Zipf-skewed when ``zipf`` is an exponent > 0.

    Skewed: the value of popularity rank ``r`` (0 = most popular) is drawn with weight ``(r + 1) ** -zipf``
    (inverse CDF of the continuous power law, truncated to the range), and ranks are spread over the range
    by a fixed stride coprime with its size, so that popular values are not neighbours.
    """
    size = high - low
    if not zipf or size <= 1:
        return torch.randint(low, high, (n,), device=device, dtype=torch.int64)
    a = float(zipf)
    u = torch.rand(n, device=device, dtype=torch.float64)
    top = float(size + 1)
    if abs(a - 1.0) < 1e-9:
        x = torch.exp(u * math.log(top))
    else:
        x = (u * (top ** (1.0 - a) - 1.0) + 1.0) ** (1.0 / (1.0 - a))
    rank = (x.floor().to(torch.int64) - 1).clamp_(0, size - 1)
    stride = max(1, int(size * 0.381966))
    while math.gcd(stride, size) != 1:
        stride += 1
    return (rank * stride) % size + low


def _extent(shape: Sequence[int], strides: Sequence[int], offset: int) -> int:
    """Elements of storage a strided tensor spans (offset + 1 + sum((size-1)*stride)); 0 if empty."""
    if any(s == 0 for s in shape):
        return offset
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return list(reversed(strides))


def available_memory(device: torch.device) -> int | None:
    """Bytes the device can still allocate (free CUDA memory, or MemAvailable of the host)."""
    if device.type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(device.index if device.index is not None else 0)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def replay_threads(plan: dict[str, Any], device: torch.device, requested: int | None = None) -> int | None:
    """The intra-op CPU thread count a replay on ``device`` should use (None: leave torch's setting).

    ``requested`` > 0 wins; 0 keeps torch's setting; None (the default) takes the plan's
    ``original_threads`` (``capture.json``'s ``threads``) so that kernels split their work as they did
    when the original step was timed, capped at the cores this process may run on. Accelerator
    replays keep torch's setting.
    """
    if requested is not None:
        return int(requested) if requested > 0 else None
    if device.type != "cpu":
        return None
    want = (plan.get("metadata") or {}).get("original_threads")
    if not isinstance(want, int) or isinstance(want, bool) or want < 1:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or want
    return max(1, min(want, cores))


# glibc's cap on its dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts)
_MALLOC_DYNAMIC_MMAP_MAX = 32 << 20


def prime_host_allocator(nbytes: int) -> None:
    """Allocate and free one host block of ``nbytes`` (capped just below 32 MiB), before a CPU replay.

    glibc serves blocks above its mmap threshold (128 KiB at start) with a fresh ``mmap``, and raises
    the threshold (and the heap-trim threshold, to twice that) to the size of the largest such block
    freed so far, up to 32 MiB. The captured step was timed in a process that had built its model
    and freed temporaries as large as its parameters, so its large intermediates were recycled from
    the heap; a fresh replay process has freed nothing yet, so its heap is trimmed and regrown and
    every page of those intermediates faults again, each iteration (bert/small/infer: 15k instead of
    8k minor faults a step, about 4% of the step). Freeing one block as large as the plan's largest
    storage puts the replay's allocator in the state the original's was in. Elsewhere (another
    malloc, a caching allocator) it is one allocation and one free.
    """
    n = min(int(nbytes), _MALLOC_DYNAMIC_MMAP_MAX - (64 << 10))
    if n >= 1 << 20:
        block = torch.empty(n, dtype=torch.uint8)
        del block


def synchronize(device: torch.device) -> None:
    if device.type == "cpu" or device.type == "meta":
        return
    mod = getattr(torch, device.type, None)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


# ----------------------------------------------------------------------------------------------
# Device substitutes: operators that exist only for one backend, replaced by their generic form
# ----------------------------------------------------------------------------------------------


def _accelerator_available() -> bool:
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        try:
            return bool(acc.is_available())
        except RuntimeError:
            return False
    return torch.cuda.is_available()


def _pin_identity(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    return self


def _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    out, mean, invstd = torch.ops.aten.native_batch_norm.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, invstd, torch.empty((0,), dtype=torch.uint8, device=input.device)


def _bn_forward3(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    return torch.ops.aten.native_batch_norm.default(input, weight, bias, running_mean, running_var,
                                                    training, momentum, eps)


def _bn_backward(input, grad_output, weight, running_mean, running_var, save_mean, save_var, epsilon,  # noqa: A002
                 reserveSpace=None):  # noqa: N803
    return torch.ops.aten.native_batch_norm_backward.default(
        grad_output, input, weight, running_mean, running_var, save_mean, save_var, True, epsilon,
        [True, True, True])


def _cudnn_conv(self, weight, padding, stride, dilation, groups, benchmark=False, deterministic=False,
                allow_tf32=False):
    n = weight.dim() - 2
    return torch.ops.aten.convolution.default(self, weight, None, list(stride), list(padding), list(dilation),
                                              False, [0] * n, groups)


def _cudnn_conv_t(self, weight, padding, output_padding, stride, dilation, groups, benchmark=False,
                  deterministic=False, allow_tf32=False):
    return torch.ops.aten.convolution.default(self, weight, None, list(stride), list(padding), list(dilation),
                                              True, list(output_padding), groups)


def _flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        query, key, value, dropout_p, is_causal, scale=scale)
    return out, lse


# op (without overload) -> (device types it runs on natively, substitute)
DEVICE_SUBSTITUTES: dict[str, tuple[tuple[str, ...], Callable[..., Any]]] = {
    "aten::cudnn_batch_norm": (("cuda",), _bn_forward),
    "aten::cudnn_batch_norm_backward": (("cuda",), _bn_backward),
    "aten::miopen_batch_norm": (("cuda",), _bn_forward3),
    "aten::miopen_batch_norm_backward": (("cuda",), _bn_backward),
    "aten::cudnn_convolution": (("cuda",), _cudnn_conv),
    "aten::cudnn_convolution_transpose": (("cuda",), _cudnn_conv_t),
    "aten::_scaled_dot_product_flash_attention": (("cuda",), _flash_cpu),
}


def substitute(qualified: str, device: torch.device) -> Callable[..., Any] | None:
    """A replacement for an operator that the replay device has no kernel for (None: keep it)."""
    name = qualified.split(".", 1)[0]
    if name in ("aten::pin_memory", "aten::_pin_memory") and not _accelerator_available():
        return _pin_identity
    entry = DEVICE_SUBSTITUTES.get(name)
    if entry is not None and device.type not in entry[0]:
        return entry[1]
    return None


# ----------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------


def check_plan(data: Any) -> dict[str, Any]:
    """Check the plan's header and tables; return it (ReplayError naming the first problem)."""
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise ReplayError("not a Mystique benchmark plan (format field missing)")
    if data.get("version") != PLAN_VERSION:
        raise ReplayError(f"benchmark plan version {data.get('version')!r} is not supported (expected {PLAN_VERSION})")
    for key in ("ops", "tensors", "storages", "metadata"):
        if key not in data:
            raise ReplayError(f"benchmark plan lacks {key!r}")
    return data


def load_plan(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a ``benchmark.json`` (ReplayError when it is not one)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReplayError(f"cannot read benchmark plan {path}: {exc}") from exc
    return check_plan(data)


def schedule(plan: dict[str, Any]) -> dict[str, Any]:
    """The late-allocation / early-free schedule of a plan.

    Returns ``{"last_use": {storage_id: op_index}, "free_after": {op_index: [storage ids]},
    "external_bytes": int, "peak_bytes": int, "peak_op": int}``: external storages live all
    the iteration; a produced storage lives from the op producing it to its last use.
    """
    storages = {s["id"]: s for s in plan["storages"]}
    tensors = {t["id"]: t for t in plan["tensors"]}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for op in plan["ops"]:
        i = op["index"]
        for tid in _op_tensor_ids(op):
            sid = tensors[tid]["storage"]
            if storages[sid].get("external"):
                continue
            first.setdefault(sid, i)
            last[sid] = i
    external = sum(int(s["nbytes"]) for s in plan["storages"] if s.get("external"))
    delta: dict[int, int] = {}
    for sid, i in first.items():
        nb = int(storages[sid]["nbytes"])
        delta[i] = delta.get(i, 0) + nb
        delta[last[sid] + 1] = delta.get(last[sid] + 1, 0) - nb
    live, peak, peak_op = 0, 0, -1
    for i in sorted(delta):
        live += delta[i]
        if live > peak:
            peak, peak_op = live, i
    free_after: dict[int, list[int]] = {}
    for sid, i in last.items():
        free_after.setdefault(i, []).append(sid)
    return {"last_use": last, "free_after": free_after, "external_bytes": external,
            "peak_bytes": external + peak, "peak_op": peak_op}


def _walk_tensor_ids(enc: Any, out: list[int]) -> None:
    if isinstance(enc, list):
        for e in enc:
            _walk_tensor_ids(e, out)
    elif isinstance(enc, dict) and "t" in enc:
        out.append(int(enc["t"]))


def _op_tensor_ids(op: dict[str, Any]) -> list[int]:
    out: list[int] = []
    _walk_tensor_ids(op.get("args", []), out)
    _walk_tensor_ids(list(op.get("kwargs", {}).values()), out)
    _walk_tensor_ids(op.get("outputs", []), out)
    return out


def op_input_ids(op: dict[str, Any]) -> list[int]:
    out: list[int] = []
    _walk_tensor_ids(op.get("args", []), out)
    _walk_tensor_ids(list(op.get("kwargs", {}).values()), out)
    return out


def op_output_ids(op: dict[str, Any]) -> list[int]:
    out: list[int] = []
    _walk_tensor_ids(op.get("outputs", []), out)
    return out


# ----------------------------------------------------------------------------------------------
# The executor
# ----------------------------------------------------------------------------------------------


@dataclass
class OpStatus:
    """What happened to one op of the plan: ``replayed``, ``noop`` or ``skipped`` (with a reason)."""

    index: int
    name: str
    state: str
    reason: str = ""
    fallbacks: int = 0  # outputs replaced by synthetic tensors (shape/dtype disagreed)


@dataclass
class _Compiled:
    index: int
    fn: Any  # callable or None for no-ops / skips
    args: list[Any]
    kwargs: dict[str, Any]
    arg_slots: list[tuple[Any, ...]]  # (container, key, tid) or (container, key, [tids]) for lists
    outputs: list[int | None]  # flattened recorded outputs (tensor ids, None for non-tensors)
    alias_out: dict[int, int]  # outputs that are inputs too (in-place ops): kept when the op is skipped
    derived: list[int]  # tensors materialised from a live storage right before the op
    free: list[int]  # tensor ids whose slots are cleared after the op
    bind: list[bool] = field(default_factory=list)  # whether each output is used later
    grad: bool = False  # run with grad mode on (the op recorded an autograd node when captured)
    any_bind: bool = False  # some output is used later
    single: int | None = None  # the one output id to bind, when the op has exactly one tensor output
    call: Any = None  # vals -> result: the op called with its arguments read from the value table
    active: bool = True  # still replayed (False once skipped)
    direct: Any = None  # what is called: the Python binding, the overload's raw C++ callable, or fn
    dargs: list[Any] = field(default_factory=list)  # the arguments direct is called with (defaults left out)
    dkwargs: dict[str, Any] = field(default_factory=dict)
    fast: str = ""  # how the compiled iteration binds the results, learnt in the probe (see _fast_source)


# Operators whose output shapes depend on the data: the compiled iteration checks their results
# every time (like the per-op loop does for every op); other ops' shapes follow from their inputs'.
DATA_DEPENDENT_SHAPES: frozenset[str] = frozenset({
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select", "aten::unique",
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::unique_dim_consecutive", "aten::repeat_interleave", "aten::bincount", "aten::index",
    "aten::_unsafe_index", "aten::where", "aten::_local_scalar_dense", "aten::item", "aten::to_sparse",
    "aten::_to_sparse", "aten::coalesce", "aten::_coalesce", "aten::segment_reduce",
    "aten::_segment_reduce_backward", "aten::masked_scatter", "aten::histogram", "aten::_nested_tensor_from_mask",
})


def _has_slot(v: Any) -> bool:
    return isinstance(v, TensorSlot) or (isinstance(v, list) and any(_has_slot(e) for e in v))


def _literal(v: Any) -> bool:
    """Whether ``repr(v)`` reads back as ``v`` (a constant the compiled code may spell out)."""
    if v is None or isinstance(v, bool) or isinstance(v, str):
        return True
    if isinstance(v, int):
        return abs(v) < 2**62
    return isinstance(v, float) and math.isfinite(v)


def _call_source(args: list[Any], kwargs: dict[str, Any], slot: Callable[[int], str],
                 const: Callable[[Any], str]) -> str:
    """The argument list of a call, with tensor slots spelt by ``slot(tid)`` and other constants
    that do not read back from their repr bound by name by ``const(value)``."""

    def expr(v: Any) -> str:
        if isinstance(v, TensorSlot):
            return slot(v.tid)
        if isinstance(v, list) and _has_slot(v):
            return "[" + "".join(expr(e) + ", " for e in v) + "]"
        if _literal(v):
            return repr(v)
        return const(v)

    parts = [expr(a) for a in args]
    odd: list[str] = []
    for k, v in kwargs.items():
        if k.isidentifier() and not keyword.iskeyword(k):
            parts.append(f"{k}={expr(v)}")
        else:
            odd.append(f"{k!r}: {expr(v)}")
    if odd:
        parts.append("**{" + ", ".join(odd) + "}")
    return ", ".join(parts)


def _raw(fn: Any) -> Any:
    """An ``OpOverload``'s raw C++ callable (skips ``OpOverload.__call__``'s Python frame), else ``fn``."""
    return getattr(fn, "_op", fn) if isinstance(fn, torch._ops.OpOverload) else fn


def _make_call(fn: Any, args: list[Any], kwargs: dict[str, Any], direct: Any = None) -> Callable[[list[Any]], Any]:
    """Compile ``fn(*args, **kwargs)`` with tensor slots read from the value table ``v`` into a lambda.

    ``direct``: what to call instead of ``fn`` (its verified Python binding). Constants are bound as
    default arguments, so a call costs one Python frame plus the op.
    """
    ns: dict[str, Any] = {"_f": direct if direct is not None else _raw(fn)}

    def const(v: Any) -> str:
        name = f"_k{len(ns)}"
        ns[name] = v
        return name

    call = _call_source(args, kwargs, lambda tid: f"v[{tid}]", const)
    defaults = "".join(f", {k}={k}" for k in ns)
    return eval(f"lambda v{defaults}: _f({call})", ns)  # noqa: S307 - our own generated code


PACINGS: tuple[str, ...] = ("none", "recorded")


def _finite_gap(v: Any) -> float:
    """A recorded host gap in microseconds (0 when absent, negative or not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return 0.0
    return float(v)


class UnknownPacing(ReplayError, ValueError):
    """``pacing`` is not one of :data:`PACINGS`."""


class Executor:
    """Run a plan on ``device``.

    ``Executor(plan, device="cpu", seed=0)``; ``prepare()`` materialises the external tensors
    (raises :class:`InsufficientMemory` first when the schedule's peak does not fit);
    ``run_iteration(per_op=False)`` runs the ops once and returns per-op seconds when
    ``per_op`` (each op bracketed by device synchronisations) else an empty list;
    ``time_iterations(iters, warmup)`` returns whole-iteration seconds (one synchronisation at
    the end of each). ``status`` lists what happened to each op.

    Per-op cost: every op calls its verified Python binding (:func:`python_binding`, what eager code
    calls) or else its overload's raw C++ callable. The first run (the probe) goes through the
    general per-op loop, which also serves per-op timing, ``record_shapes`` and ``propagate``; it
    learns how each op's results bind, and later whole iterations run one generated function (the
    compiled iteration: straight-line code, one statement per op, tensors in local variables, grad
    mode switched only where it changes, the schedule's frees as assignments of None). Set ``fast``
    to False to keep the per-op loop. Should an op raise in a compiled iteration, that iteration is
    run again by the per-op loop (which marks the op skipped) and the function is regenerated.

    ``pacing``: ``"none"`` runs the ops back to back; ``"recorded"`` reproduces the host gaps the
    captured step left between its ops (the plan's per-op ``gap_us``, from Kineto): before each op
    the replay busy-waits until ``gap_us`` has passed since the previous op returned, so the
    executor's own work between two ops counts towards the gap (the original's Python time between
    ops is replaced, not added to). ``pacing_gap_us`` is the recorded gap time paced per iteration
    and ``paced_ops`` the number of ops with a gap (both 0 when the plan records none).

    ``allow_ops``: fnmatch patterns (``ns::name``) of operators outside
    :data:`ALLOWED_OP_NAMESPACES` that may be called; any other such op is skipped with the reason
    (:func:`op_refusal`) and never resolved.
    """

    def __init__(self, plan: dict[str, Any], device: str | torch.device = "cpu", seed: int = 0,
                 check_memory: bool = True, emulate_autograd: bool = True, pacing: str = "none",
                 allow_ops: Sequence[str] = ()):
        if pacing not in PACINGS:
            raise UnknownPacing(f"unknown pacing {pacing!r}; expected one of: {', '.join(PACINGS)}")
        self.plan = check_plan(plan)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.seed = seed
        self.check_memory = check_memory
        self.allow_ops = tuple(allow_ops)  # patterns of operators outside ALLOWED_OP_NAMESPACES to call
        meta = plan.get("metadata", {})
        self.original_device = torch.device(meta.get("original_device") or "cpu")
        self.tensors = {t["id"]: t for t in plan["tensors"]}
        self.storages = {s["id"]: s for s in plan["storages"]}
        self.ops = plan["ops"]
        self.n_slots = (max(self.tensors) + 1) if self.tensors else 0
        self.vals: list[Any] = [None] * self.n_slots
        self.sched = schedule(plan)
        self.status: list[OpStatus] = []
        self.output_shapes: dict[int, tuple[list[int], list[int]]] = {}
        self.record_shapes = False  # keep the shape and strides of every op result in output_shapes
        self.propagate = False  # bind results whatever their shape (shape propagation on the meta device)
        # forward ops that recorded autograd nodes run with grad mode on and float inputs requiring grad,
        # so that they pay the autograd bookkeeping the captured step paid
        self.emulate_autograd = emulate_autograd and self.device.type != "meta"
        self._compiled: list[_Compiled] = []
        self._external: dict[int, torch.Tensor] = {}  # tid -> materialised external tensor
        self._prepared = False
        self._probed = False
        self.fast = True  # whole iterations after the probe run the compiled iteration
        self._fast_fn: Callable[[tuple[Any, ...]], None] | None = None
        self._fast_failures = 0
        self._ext_values: tuple[Any, ...] = ()
        self._blank: list[Any] = []
        self.pacing = pacing
        gaps = [_finite_gap(op.get("gap_us")) for op in self.ops] if pacing == "recorded" else []
        self.pacing_gap_us = float(sum(gaps))
        self.paced_ops = sum(1 for g in gaps if g > 0)
        self._gaps: list[float] | None = [g * 1e-6 for g in gaps] if self.paced_ops else None

    # -- devices ---------------------------------------------------------------------------

    def map_device(self, recorded: str | None) -> torch.device:
        """Where a tensor or device argument recorded on ``recorded`` goes in this replay."""
        if recorded is None or recorded == "" or self.device.type == "meta":
            return self.device
        try:
            rec = torch.device(recorded)
        except (RuntimeError, TypeError):
            return self.device
        if rec.type == self.original_device.type:
            return self.device
        if rec.type == "cpu":
            return rec
        return self.device

    # -- materialisation -------------------------------------------------------------------

    def _storage_buffer(self, sid: int) -> torch.Tensor:
        s = self.storages[sid]
        dt = dtype_from_name(s["dtype"])
        itemsize = torch.empty((), dtype=dt).element_size()
        numel = max(1, -(-int(s["nbytes"]) // itemsize))
        dev = self.map_device(s.get("device"))
        buf = torch.empty(numel, dtype=dt, device=dev)
        fill_storage(buf, s.get("recipe") or {"kind": "randn"})
        return buf

    def _view(self, buf: torch.Tensor, t: dict[str, Any], offset: int | None = None) -> torch.Tensor:
        dt = dtype_from_name(t["dtype"])
        shape = list(t["shape"])
        strides = t.get("strides") or contiguous_strides(shape)
        out = torch.empty(0, dtype=dt, device=buf.device)
        out.set_(buf.untyped_storage(), int(t["offset"] if offset is None else offset), shape, strides)
        return out

    def synth(self, tid: int) -> torch.Tensor:
        """A fresh tensor with the recorded metadata of ``tid`` and its storage's data recipe."""
        t = self.tensors[tid]
        s = self.storages[t["storage"]]
        dt = dtype_from_name(t["dtype"])
        shape = list(t["shape"])
        strides = t.get("strides") or contiguous_strides(shape)
        n = max(1, _extent(shape, strides, 0))
        buf = torch.empty(n, dtype=dt, device=self.map_device(t.get("device") or s.get("device")))
        recipe = s.get("recipe") or {"kind": "randn"}
        if s["dtype"] != t["dtype"] and recipe.get("kind") not in ("randint", "bernoulli", "offsets"):
            recipe = {"kind": "randn"}
        fill_storage(buf, recipe)
        return buf.as_strided(shape, strides, 0)

    def _derive(self, tid: int, base: Any = TensorSlot) -> torch.Tensor:
        """Materialise a tensor that views a storage produced by an earlier op (or synthesise it).

        ``base``: the current value of the storage's anchor tensor (default: read from the value table).
        """
        t = self.tensors[tid]
        anchor = self.storages[t["storage"]].get("anchor")
        if base is TensorSlot:
            base = self.vals[anchor] if anchor is not None else None
        if self.propagate and isinstance(base, torch.Tensor):
            # shape propagation: the view changes its dims the way its storage's producer did
            old = self.tensors[anchor]["shape"]
            mapping = {o: n for o, n in zip(old, base.shape) if o != n}
            shape = [mapping.get(d, d) for d in t["shape"]]
            out = torch.empty(shape, dtype=dtype_from_name(t["dtype"]), device=base.device)
            if self.record_shapes:
                self.output_shapes[tid] = (list(out.shape), list(out.stride()))
            return out
        if isinstance(base, torch.Tensor) and base.device.type != "meta":
            a = self.tensors[anchor]
            dt = dtype_from_name(t["dtype"])
            itemsize = torch.empty((), dtype=dt).element_size()
            delta_bytes = (base.storage_offset() - int(a["offset"])) * base.element_size()
            off_bytes = int(t["offset"]) * itemsize + delta_bytes
            shape = list(t["shape"])
            strides = t.get("strides") or contiguous_strides(shape)
            if off_bytes >= 0 and off_bytes % itemsize == 0:
                off = off_bytes // itemsize
                if _extent(shape, strides, off) * itemsize <= base.untyped_storage().nbytes():
                    out = torch.empty(0, dtype=dt, device=base.device)
                    out.set_(base.untyped_storage(), off, shape, strides)
                    return out
        if not self._probed:
            self._fallbacks += 1  # counted once, in the probe iteration
        return self.synth(tid)

    def peak_bytes(self) -> int:
        return int(self.sched["peak_bytes"])

    def prepare(self) -> None:
        """Compile the ops and materialise external storages (refusing first if memory is short)."""
        if self._prepared:
            return
        if self.check_memory and self.device.type != "meta":
            avail = available_memory(self.device)
            if avail is not None and self.peak_bytes() > avail:
                raise InsufficientMemory(self.peak_bytes(), avail, str(self.device))
        if self.device.type == "cpu":
            prime_host_allocator(max((int(s["nbytes"]) for s in self.plan["storages"]), default=0))
        torch.manual_seed(self.seed)
        self._fallbacks = 0
        bufs: dict[int, torch.Tensor] = {}
        for t in self.plan["tensors"]:
            if t.get("source") != "external":
                continue
            sid = t["storage"]
            if sid not in bufs:
                bufs[sid] = self._storage_buffer(sid)
            self._external[t["id"]] = self._view(bufs[sid], t)
        self._dtypes = {tid: dtype_from_name(t["dtype"]) for tid, t in self.tensors.items()}
        self._shapes = {tid: torch.Size(t["shape"]) for tid, t in self.tensors.items()}
        was_collecting = gc.isenabled()
        gc.disable()  # compiling allocates many small objects: cyclic collections would dominate a large plan
        try:
            self._compile()
        finally:
            if was_collecting:
                gc.enable()
        blank: list[Any] = [None] * self.n_slots
        for tid, t in self._external.items():
            blank[tid] = t
        self._blank = blank
        self._ext_values = tuple(self._external[tid] for tid in sorted(self._external))
        if self.emulate_autograd:
            for c in self._compiled:
                if not c.grad:
                    continue
                for *_x, ref in c.arg_slots:
                    for tid in (ref if isinstance(ref, list) else [ref]):
                        t = self._external.get(tid) if tid is not None else None
                        if t is not None and (t.is_floating_point() or t.is_complex()) and not t.requires_grad:
                            t.requires_grad_(True)
        self._prepared = True

    def _compile(self) -> None:
        later_use: dict[int, int] = {}
        for op in self.ops:
            for tid in op_input_ids(op):
                later_use[tid] = op["index"]
        free_after: dict[int, list[int]] = {}
        by_storage: dict[int, list[int]] = {}
        for t in self.plan["tensors"]:
            by_storage.setdefault(t["storage"], []).append(t["id"])
        for i, sids in self.sched["free_after"].items():
            for sid in sids:
                free_after.setdefault(int(i), []).extend(by_storage.get(sid, []))
        derived_seen: set[int] = set()
        self.status = []
        for op in self.ops:
            i = op["index"]
            action = op.get("action", "call")
            fn = None
            reason = op.get("reason", "")
            refused = op_refusal(op["op"], self.allow_ops) if action == "call" else ""
            if refused:
                action, reason = "skip", refused  # never resolved, never called
            if action == "call":
                fn = substitute(op["op"], self.device) or resolve_overload(op["op"], self.allow_ops)
                if fn is None:
                    ns = op["op"].split("::", 1)[0]
                    action = "skip"
                    reason = "custom op unavailable" if ns not in ("aten", "prims") else "operator not in this torch"
            # -- scale-out hook (mystique.replay.collectives): a multi-rank replay installs a handler
            if action == "skip" and reason == "collective" and COLLECTIVE_HANDLER is not None:
                fn = COLLECTIVE_HANDLER(op, self)
                if fn is not None:
                    action, reason = "call", ""
            # -- end of scale-out hook
            args = decode_value(op.get("args", []), self.map_device)
            kwargs = {k: decode_value(v, self.map_device) for k, v in op.get("kwargs", {}).items()}
            if self.device.type != "cuda" and "pin_memory" in kwargs:
                kwargs["pin_memory"] = False if kwargs["pin_memory"] is not None else None
            slots: list[tuple[Any, ...]] = []
            for key, v in enumerate(args):
                self._collect_slots(args, key, v, slots)
            for key, v in kwargs.items():
                self._collect_slots(kwargs, key, v, slots)
            outs: list[int | None] = []
            self._flatten_outputs(op.get("outputs", []), outs)
            in_ids = op_input_ids(op)
            derived = []
            for tid in in_ids:
                if self.tensors[tid].get("source") == "derived" and tid not in derived_seen:
                    derived.append(tid)
                    derived_seen.add(tid)
            for tid in outs:
                if tid is not None:
                    derived_seen.add(tid)
            in_set = set(in_ids)
            alias_out = {tid: tid for tid in outs if tid is not None and tid in in_set}
            bind = [tid is not None and later_use.get(tid, -1) > i for tid in outs]
            name = op.get("name", op.get("op", "?"))
            state = {"call": "replayed", "noop": "noop"}.get(action, "skipped")
            self.status.append(OpStatus(i, name, state, reason))
            grad = bool(op.get("grad")) and self.emulate_autograd
            free = [t for t in free_after.get(i, []) if t not in self._external]
            c = _Compiled(i, fn if action == "call" else None, args, kwargs, slots, outs, alias_out, derived,
                          free, bind, grad, any(bind))
            if len(outs) == 1 and bind and bind[0]:
                c.single = outs[0]
            c.active = c.fn is not None
            if c.fn is not None:
                found = binding_call(c.fn, args, kwargs, self._meta_tensor) if self.device.type != "meta" else None
                c.direct, c.dargs, c.dkwargs = found if found is not None else (_raw(c.fn), args, kwargs)
                c.call = _make_call(c.fn, c.dargs, c.dkwargs, c.direct)
            self._compiled.append(c)

    def _meta_tensor(self, tid: int) -> torch.Tensor:
        """A meta tensor with the recorded shape, strides and dtype of plan tensor ``tid``."""
        t = self.tensors[tid]
        shape = list(t["shape"])
        strides = t.get("strides") or contiguous_strides(shape)
        return torch.empty_strided(shape, strides, dtype=self._dtypes[tid], device="meta")

    @staticmethod
    def _collect_slots(container: Any, key: Any, v: Any, slots: list[tuple[Any, ...]]) -> None:
        if isinstance(v, TensorSlot):
            slots.append((container, key, v.tid))
        elif isinstance(v, list) and any(isinstance(e, (TensorSlot, list)) for e in v):
            if all(isinstance(e, TensorSlot) or e is None for e in v):
                slots.append((container, key, [e.tid if e is not None else None for e in v]))
            else:
                for j, e in enumerate(v):
                    Executor._collect_slots(v, j, e, slots)

    @staticmethod
    def _flatten_outputs(enc: Any, out: list[int | None]) -> None:
        if isinstance(enc, list):
            for e in enc:
                Executor._flatten_outputs(e, out)
        elif isinstance(enc, dict) and "t" in enc:
            out.append(int(enc["t"]))
        else:
            out.append(None)

    @staticmethod
    def _flatten_result(res: Any, out: list[Any]) -> None:
        if isinstance(res, (list, tuple)):
            for r in res:
                Executor._flatten_result(r, out)
        else:
            out.append(res)

    # -- running ---------------------------------------------------------------------------

    def _begin_iteration(self) -> None:
        self.vals[:] = self._blank

    def _flat_results(self, res: Any, n: int) -> list[Any]:
        """An op's results in output order; ``n`` Nones when they do not match its ``n`` recorded outputs."""
        if n == 1 and isinstance(res, torch.Tensor):
            return [res]
        flat: list[Any] = []
        self._flatten_result(res, flat)
        return flat if len(flat) == n else [None] * n

    def _bind(self, c: _Compiled, res: Any, st: OpStatus, count: bool) -> None:
        """Bind an op's results to the recorded output ids used later (synthetic when they disagree)."""
        if not c.any_bind and not self.record_shapes:
            return
        outs = c.outputs
        flat = self._flat_results(res, len(outs))
        vals = self.vals
        dts = self._dtypes
        shapes = self._shapes
        for tid, r, b in zip(outs, flat, c.bind):
            if tid is None:
                continue
            if self.record_shapes and isinstance(r, torch.Tensor):
                self.output_shapes[tid] = (list(r.shape), list(r.stride()))
            if not b:
                continue
            if isinstance(r, torch.Tensor) and r.dtype == dts[tid] and (self.propagate or r.shape == shapes[tid]):
                vals[tid] = r
            else:
                vals[tid] = self.synth(tid)
                if count:
                    st.fallbacks += 1

    def _skip_outputs(self, c: _Compiled) -> None:
        vals = self.vals
        for tid, b in zip(c.outputs, c.bind):
            if tid is None or not b:
                continue
            if tid in c.alias_out and vals[tid] is not None:
                continue  # an in-place output: the input tensor itself
            vals[tid] = self.synth(tid)

    def _bind_values(self, k: int, res: Any) -> list[Any]:
        """The values of op ``k``'s outputs used later, in order: its results where they agree with
        the recorded dtype and shape, else synthetic tensors (the compiled iteration's ``checked``)."""
        c = self._compiled[k]
        outs = c.outputs
        flat = self._flat_results(res, len(outs))
        dts, shapes = self._dtypes, self._shapes
        out = []
        for tid, r, b in zip(outs, flat, c.bind):
            if tid is None or not b:
                continue
            if isinstance(r, torch.Tensor) and r.dtype == dts[tid] and r.shape == shapes[tid]:
                out.append(r)
            else:
                out.append(self.synth(tid))
        return out

    def _fast_source(self) -> tuple[str, dict[str, Any]]:
        """The compiled iteration's source and namespace: ``_iteration(_ext)`` runs every op once.

        Tensors live in local variables (externals unpacked from ``_ext``); a tensor no op has
        bound yet, or one already freed, reads as None, as in the value table; results are bound
        as the probe found (:meth:`_fast_kind`); the schedule's frees assign None, except that a
        single result takes over the variable of a tensor freed by the same op (``x = op(x, b)``,
        as eager code does: the old value goes when the new one is stored, right after the call);
        pacing spins on ``perf_counter``.
        """
        ns: dict[str, Any] = {"_synth": self.synth, "_derive": self._derive, "_bindv": self._bind_values,
                              "_set_grad": torch._C._set_grad_enabled, "_clock": time.perf_counter}

        def const(v: Any) -> str:
            name = f"_k{len(ns)}"
            ns[name] = v
            return name

        names: dict[int, str] = {tid: f"t{tid}" for tid in self._external}  # live tensors' variables

        def slot(tid: int) -> str:
            return names.get(tid, "None")

        def bind(tid: int) -> str:
            if tid not in names:
                names[tid] = f"t{tid}"
            return names[tid]

        body: list[str] = []
        ext = sorted(self._external)
        if ext:
            body.append("(" + "".join(f"t{tid}, " for tid in ext) + ") = _ext")
        gaps = self._gaps
        if gaps is not None:
            body.append("_e = _clock()")
        grad_on = False
        n = len(self._compiled)
        for k, c in enumerate(self._compiled):
            for tid in c.derived:
                anchor = self.storages[self.tensors[tid]["storage"]].get("anchor")
                base = slot(anchor) if anchor is not None else "None"
                body.append(f"{bind(tid)} = _derive({tid}, {base})")
            if gaps is not None and gaps[k] > 0:
                body.append(f"_d = _e + {gaps[k]!r}")
                body.append("while _clock() < _d: pass")
            bound = [tid for tid, b in zip(c.outputs, c.bind) if tid is not None and b]
            freed = [tid for tid in c.free if tid in names and tid not in bound]
            if not c.active:
                for tid in bound:
                    if tid in c.alias_out and tid in names:
                        body.append(f"if {names[tid]} is None: {names[tid]} = _synth({tid})")
                    else:
                        body.append(f"{bind(tid)} = _synth({tid})")
            else:
                if c.grad != grad_on:
                    grad_on = c.grad
                    body.append(f"_set_grad({grad_on})")
                call = f"{const(c.direct)}({_call_source(c.dargs, c.dkwargs, slot, const)})"
                kind = c.fast if bound else "none"
                if kind == "none":
                    body.append(call)
                elif kind == "single":
                    if c.single not in names and freed:
                        names[c.single] = names.pop(freed.pop(0))  # the freed tensor's variable
                    body.append(f"{bind(c.single)} = {call}")
                elif kind == "unpack":
                    targets = [bind(tid) if tid is not None and b else "_" for tid, b in zip(c.outputs, c.bind)]
                    body.append(f"{', '.join(targets)}, = {call}")
                else:
                    body.append(f"{''.join(bind(tid) + ', ' for tid in bound)}= _bindv({k}, {call})")
            if gaps is not None and k + 1 < n and gaps[k + 1] > 0:
                body.append("_e = _clock()")
            for tid in freed:
                body.append(f"{names.pop(tid)} = None")
        if not body:
            body.append("pass")
        return "def _iteration(_ext):\n    " + "\n    ".join(body) + "\n", ns

    def _make_fast(self) -> Callable[[tuple[Any, ...]], None]:
        """Generate and compile the compiled iteration (see :meth:`_fast_source`)."""
        src, ns = self._fast_source()
        exec(compile(src, f"<mystique plan iteration {id(self):x}>", "exec"), ns)  # noqa: S102 - our own code
        self._fast_fn = ns["_iteration"]
        return self._fast_fn

    def run_iteration(self, per_op: bool = False, probe: bool = False) -> list[float]:
        """Run every op once. Returns per-op seconds when ``per_op`` (else an empty list).

        ``probe``: the first run, which marks ops that raise as skipped (reason: the error).
        """
        self.prepare()
        probe = probe or not self._probed  # the first run counts the fallbacks
        dev = self.device
        set_grad = torch._C._set_grad_enabled
        prev_grad = torch.is_grad_enabled()
        if not (per_op or probe or self.record_shapes or self.propagate) and self.fast and self._fast_failures < 3:
            fn = self._fast_fn or self._make_fast()
            ok = False
            set_grad(False)
            try:
                fn(self._ext_values)
                ok = True
            except Exception:  # noqa: BLE001 - an op raised: this iteration goes through the per-op loop
                self._fast_fn = None
                self._fast_failures += 1
            finally:
                set_grad(prev_grad)
            if ok:
                synchronize(dev)
                return []
        self._begin_iteration()
        vals = self.vals
        times: list[float] = []
        set_grad(False)
        try:
            self._run_ops(vals, times, per_op, probe, dev, synchronize, time.perf_counter, self.status, set_grad,
                          False)
        finally:
            set_grad(prev_grad)
        synchronize(dev)
        self._begin_iteration()  # drop every intermediate of this iteration
        self._probed = True
        return times

    def _run_ops(self, vals, times, per_op, probe, dev, sync, clock, status, set_grad, grad_on) -> None:
        shapes = self._shapes
        dts = self._dtypes
        tensor = torch.Tensor
        nan = math.nan
        gaps = self._gaps
        last = clock()
        for c in self._compiled:
            if c.derived:
                for tid in c.derived:
                    if vals[tid] is None:
                        vals[tid] = self._derive(tid)
            if gaps is not None and gaps[c.index] > 0:  # pacing: the recorded host gap since the last op
                deadline = last + gaps[c.index]
                while clock() < deadline:
                    pass
            if not c.active:
                if per_op:
                    times.append(nan)
                self._skip_outputs(c)
            else:
                if c.grad != grad_on:
                    grad_on = c.grad
                    set_grad(grad_on)
                try:
                    if per_op:
                        sync(dev)
                        t0 = clock()
                        res = c.call(vals)
                        sync(dev)
                        times.append(clock() - t0)
                    else:
                        res = c.call(vals)
                except Exception as exc:  # noqa: BLE001 - an op that cannot run is skipped, not fatal
                    grad_on = self._failed(c, exc, vals, times, per_op, probe, status[c.index], set_grad)
                else:
                    if probe:
                        c.fast = self._fast_kind(c, res)
                    tid = c.single
                    if tid is not None and not self.record_shapes:
                        if type(res) is tensor or isinstance(res, tensor):
                            if res.dtype == dts[tid] and (res.shape == shapes[tid] or self.propagate):
                                vals[tid] = res
                            else:
                                self._bind(c, res, status[c.index], probe)
                        else:
                            self._bind(c, res, status[c.index], probe)
                    elif c.any_bind or self.record_shapes:
                        self._bind(c, res, status[c.index], probe)
                    res = None
            if gaps is not None:
                last = clock()
            if c.free:
                for tid in c.free:
                    vals[tid] = None

    def _fast_kind(self, c: _Compiled, res: Any) -> str:
        """How the compiled iteration binds ``c``'s results, from the probe's result ``res``:
        ``none`` (nothing used later), ``single`` (one tensor, as recorded), ``unpack`` (a flat
        tuple or list of tensors, as recorded) or ``checked`` (checked every time, synthetic
        tensors where they disagree, as the per-op loop does)."""
        if not c.any_bind:
            return "none"
        name = str(self.ops[c.index].get("op", "")).split(".", 1)[0]
        if name in DATA_DEPENDENT_SHAPES or not isinstance(c.fn, torch._ops.OpOverload):
            return "checked"
        dts, shapes = self._dtypes, self._shapes

        def agrees(tid: int, r: Any) -> bool:
            return isinstance(r, torch.Tensor) and r.dtype == dts[tid] and r.shape == shapes[tid]

        if c.single is not None and len(c.outputs) == 1:
            return "single" if agrees(c.single, res) else "checked"
        if isinstance(res, (tuple, list)) and len(res) == len(c.outputs) and all(
                tid is None or not b or agrees(tid, r) for tid, b, r in zip(c.outputs, c.bind, res)):
            return "unpack"
        return "checked"

    def _failed(self, c: _Compiled, exc: Exception, vals, times, per_op, probe, st: OpStatus, set_grad) -> bool:
        """An op raised: retry it without autograd if it ran with it, else mark it skipped.

        Returns the grad mode now in effect.
        """
        self._fast_fn = None  # the compiled iteration follows the op's new grad mode or state
        c.fast = "checked"
        if c.grad:  # e.g. an in-place op on a leaf that requires grad: run it without autograd
            c.grad = False
            set_grad(False)
            try:
                res = c.call(vals)
            except Exception as exc2:  # noqa: BLE001
                exc = exc2
            else:
                if per_op and len(times) <= c.index:
                    times.append(math.nan)
                self._bind(c, res, st, probe)
                return False
        if per_op and len(times) <= c.index:
            times.append(math.nan)
        c.active = False
        st.state = "skipped"
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        st.reason = f"error: {type(exc).__name__}: {msg[:200]}"
        self._skip_outputs(c)
        return c.grad

    def probe(self) -> None:
        """The first, untimed run: finds the ops that cannot run here and the fallback outputs."""
        if not self._probed:
            self.run_iteration(probe=True)

    def time_iterations(self, iters: int, warmup: int = 0) -> list[float]:
        """Seconds of each of ``iters`` whole iterations (after ``warmup`` untimed ones).

        No per-op synchronisation: the device is synchronised once before and once after each
        iteration, so the time is that of the uninstrumented step.
        """
        self.probe()
        for _ in range(warmup):
            self.run_iteration()
        out = []
        for _ in range(iters):
            synchronize(self.device)
            t0 = time.perf_counter()
            self.run_iteration()
            out.append(time.perf_counter() - t0)
        return out

    def time_ops(self, iters: int) -> list[float]:
        """Median seconds of each op over ``iters`` per-op timed passes (NaN for ops not run)."""
        self.probe()
        runs = [self.run_iteration(per_op=True) for _ in range(max(1, iters))]
        out = []
        for j in range(len(self._compiled)):
            xs = [r[j] for r in runs if j < len(r) and not math.isnan(r[j])]
            out.append(statistics.median(xs) if xs else math.nan)
        return out

    def counts(self) -> dict[str, Any]:
        """``{"total", "replayed", "noop", "skipped": {name: count}, "reasons": {name: reason},
        "fallbacks"}`` over the plan's ops (replayed counts no-ops too)."""
        skipped: dict[str, int] = {}
        reasons: dict[str, str] = {}
        replayed = noop = fallbacks = 0
        for st in self.status:
            if st.state == "skipped":
                skipped[st.name] = skipped.get(st.name, 0) + 1
                reasons.setdefault(st.name, st.reason)
            else:
                replayed += 1
                noop += st.state == "noop"
            fallbacks += st.fallbacks
        return {"total": len(self.status), "replayed": replayed, "noop": noop, "skipped": skipped,
                "reasons": reasons, "fallbacks": fallbacks + getattr(self, "_fallbacks", 0)}


# ----------------------------------------------------------------------------------------------
# Standalone entry point (benchmark.py)
# ----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, default_plan: str | None = None) -> int:
    """Run a plan: ``--plan PATH --device DEV --iters N --warmup N [--pacing recorded]``; prints
    per-iteration times.

    Exit codes: 0 ran, 2 bad input, 3 the device cannot do it.
    """
    ap = argparse.ArgumentParser(description="Replay a Mystique benchmark plan with synthetic data.")
    ap.add_argument("--plan", default=default_plan, help="benchmark.json (default: the one beside this file)")
    ap.add_argument("--device", default=None, help="torch device: cpu, cuda, cuda:1, ... (default: the plan's)")
    ap.add_argument("--iters", type=int, default=10, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up iterations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads (default on cpu: those of the captured step; 0: torch's default)")
    ap.add_argument("--pacing", choices=PACINGS, default="none",
                    help="none: ops back to back; recorded: wait the captured step's host gaps between ops")
    ap.add_argument("--allow-ops", dest="allow_ops", action="append", default=[], metavar="PATTERN",
                    help="also call the operators matching PATTERN (fnmatch on ns::name, e.g. 'mylib::*'; "
                    "repeatable); outside the namespaces " + ", ".join(ALLOWED_OP_NAMESPACES) + " others are skipped")
    ns = ap.parse_args(argv)
    if not ns.plan:
        print("error: no plan given (--plan)", file=sys.stderr)
        return 2
    if ns.iters < 1 or ns.warmup < 0 or (ns.threads is not None and ns.threads < 0):
        print("error: --iters must be >= 1, --warmup >= 0 and --threads >= 0", file=sys.stderr)
        return 2
    try:
        plan = load_plan(ns.plan)
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = ns.device or plan["metadata"].get("default_device") or "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        print(f"error: bad device {name!r}: {exc}", file=sys.stderr)
        return 2
    backend = getattr(torch, dev.type, None)
    if dev.type not in ("cpu", "meta") and not (backend is not None and backend.is_available()):
        print(f"error: device {name} is not available", file=sys.stderr)
        return 3
    threads = replay_threads(plan, dev, ns.threads)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        ex = Executor(plan, dev, seed=ns.seed, pacing=ns.pacing, allow_ops=ns.allow_ops)
        ex.prepare()
    except InsufficientMemory as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        print(f"error: malformed benchmark plan: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    times = ex.time_iterations(ns.iters, ns.warmup)
    c = ex.counts()
    print(f"ops: {c['total']} total, {c['replayed']} replayed, {sum(c['skipped'].values())} skipped; "
          f"{torch.get_num_threads()} CPU threads; pacing {ex.pacing}"
          + (f" ({ex.paced_ops} recorded gaps, {ex.pacing_gap_us / 1e3:.3f} ms an iteration)" if ex.paced_ops else ""))
    for i, t in enumerate(times):
        print(f"iteration {i}: {t * 1e3:.3f} ms")
    print(f"median: {statistics.median(times) * 1e3:.3f} ms")
    return 0
