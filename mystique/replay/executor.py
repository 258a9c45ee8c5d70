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
* timing: whole iterations with a single device synchronisation, and per-op passes.
"""

from __future__ import annotations

import argparse
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


def resolve_overload(qualified: str) -> Any:
    """``"aten::addmm.default"`` -> ``torch.ops.aten.addmm.default`` (None when unavailable)."""
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


def overload_schemas(ns_name: str) -> list[str]:
    """Schema strings of every overload of ``ns::name`` registered in this torch (empty if none)."""
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


def _has_slot(v: Any) -> bool:
    return isinstance(v, TensorSlot) or (isinstance(v, list) and any(_has_slot(e) for e in v))


def _make_call(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Callable[[list[Any]], Any]:
    """Compile ``fn(*args, **kwargs)`` with tensor slots read from the value table ``v`` into a lambda.

    Constants are bound as default arguments, so a call costs one Python frame plus the op.
    """
    ns: dict[str, Any] = {"_f": getattr(fn, "_op", fn) if isinstance(fn, torch._ops.OpOverload) else fn}

    def expr(v: Any) -> str:
        if isinstance(v, TensorSlot):
            return f"v[{v.tid}]"
        if isinstance(v, list) and _has_slot(v):
            return "[" + "".join(expr(e) + ", " for e in v) + "]"
        if v is None or isinstance(v, bool) or (isinstance(v, int) and abs(v) < 2**62):
            return repr(v)
        name = f"_k{len(ns)}"
        ns[name] = v
        return name

    parts = [expr(a) for a in args]
    odd: list[str] = []
    for k, v in kwargs.items():
        if k.isidentifier() and not keyword.iskeyword(k):
            parts.append(f"{k}={expr(v)}")
        else:
            odd.append(f"{k!r}: {expr(v)}")
    if odd:
        parts.append("**{" + ", ".join(odd) + "}")
    defaults = "".join(f", {k}={k}" for k in ns)
    return eval(f"lambda v{defaults}: _f({', '.join(parts)})", ns)  # noqa: S307 - our own generated code


class Executor:
    """Run a plan on ``device``.

    ``Executor(plan, device="cpu", seed=0)``; ``prepare()`` materialises the external tensors
    (raises :class:`InsufficientMemory` first when the schedule's peak does not fit);
    ``run_iteration(per_op=False)`` runs the ops once and returns per-op seconds when
    ``per_op`` (each op bracketed by device synchronisations) else an empty list;
    ``time_iterations(iters, warmup)`` returns whole-iteration seconds (one synchronisation at
    the end of each). ``status`` lists what happened to each op.
    """

    def __init__(self, plan: dict[str, Any], device: str | torch.device = "cpu", seed: int = 0,
                 check_memory: bool = True, emulate_autograd: bool = True):
        self.plan = check_plan(plan)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.seed = seed
        self.check_memory = check_memory
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

    def _derive(self, tid: int) -> torch.Tensor:
        """Materialise a tensor that views a storage produced by an earlier op (or synthesise it)."""
        t = self.tensors[tid]
        anchor = self.storages[t["storage"]].get("anchor")
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
        self._compile()
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
            if action == "call":
                fn = substitute(op["op"], self.device) or resolve_overload(op["op"])
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
                c.call = _make_call(c.fn, args, kwargs)
            self._compiled.append(c)

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
        vals = self.vals
        for i in range(self.n_slots):
            vals[i] = None
        for tid, t in self._external.items():
            vals[tid] = t

    def _bind(self, c: _Compiled, res: Any, st: OpStatus, count: bool) -> None:
        """Bind an op's results to the recorded output ids used later (synthetic when they disagree)."""
        if not c.any_bind and not self.record_shapes:
            return
        outs = c.outputs
        if len(outs) == 1 and isinstance(res, torch.Tensor):
            flat = [res]
        else:
            flat = []
            self._flatten_result(res, flat)
            if len(flat) != len(outs):
                flat = [None] * len(outs)
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

    def run_iteration(self, per_op: bool = False, probe: bool = False) -> list[float]:
        """Run every op once. Returns per-op seconds when ``per_op`` (else an empty list).

        ``probe``: the first run, which marks ops that raise as skipped (reason: the error).
        """
        self.prepare()
        probe = probe or not self._probed  # the first run counts the fallbacks
        self._begin_iteration()
        vals = self.vals
        times: list[float] = []
        dev = self.device
        sync = synchronize
        clock = time.perf_counter
        status = self.status
        set_grad = torch._C._set_grad_enabled
        prev_grad = torch.is_grad_enabled()
        grad_on = False
        set_grad(False)
        try:
            self._run_ops(vals, times, per_op, probe, dev, sync, clock, status, set_grad, grad_on)
        finally:
            set_grad(prev_grad)
        sync(dev)
        self._begin_iteration()  # drop every intermediate of this iteration
        self._probed = True
        return times

    def _run_ops(self, vals, times, per_op, probe, dev, sync, clock, status, set_grad, grad_on) -> None:
        shapes = self._shapes
        dts = self._dtypes
        tensor = torch.Tensor
        nan = math.nan
        for c in self._compiled:
            if c.derived:
                for tid in c.derived:
                    if vals[tid] is None:
                        vals[tid] = self._derive(tid)
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
            if c.free:
                for tid in c.free:
                    vals[tid] = None

    def _failed(self, c: _Compiled, exc: Exception, vals, times, per_op, probe, st: OpStatus, set_grad) -> bool:
        """An op raised: retry it without autograd if it ran with it, else mark it skipped.

        Returns the grad mode now in effect.
        """
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
    """Run a plan: ``--plan PATH --device DEV --iters N --warmup N``; prints per-iteration times.

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
        ex = Executor(plan, dev, seed=ns.seed)
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
          f"{torch.get_num_threads()} CPU threads")
    for i, t in enumerate(times):
        print(f"iteration {i}: {t * 1e3:.3f} ms")
    print(f"median: {statistics.median(times) * 1e3:.3f} ms")
    return 0
