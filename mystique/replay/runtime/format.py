"""The plan format and its codec: the ``benchmark.json`` header, tables and schedule, the JSON
encoding of operator arguments, and tensor layout arithmetic."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
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


def extent(shape: Sequence[int], strides: Sequence[int], offset: int) -> int:
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


#: Largest ``benchmark.json`` read by default: 2 GiB, the cap of a trace (``MYSTIQUE_MAX_TRACE_BYTES``
#: changes both: bytes, or a number with a K, M, G or T suffix).
DEFAULT_MAX_PLAN_BYTES = 2 * 1024**3
MAX_PLAN_BYTES_ENV = "MYSTIQUE_MAX_TRACE_BYTES"


def max_plan_bytes() -> int:
    """The size cap of a ``benchmark.json`` (ReplayError when the variable is not a size)."""
    raw = os.environ.get(MAX_PLAN_BYTES_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_PLAN_BYTES
    m = re.fullmatch(r"\s*(\d{1,20})\s*([kmgt]?)i?b?\s*", raw.lower())
    if not m or int(m.group(1)) <= 0:
        raise ReplayError(f"{MAX_PLAN_BYTES_ENV}={raw!r} is not a positive size (bytes, or e.g. 4G)")
    return int(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")


def load_plan(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a ``benchmark.json`` of at most :func:`max_plan_bytes` (ReplayError when it is
    not one, or larger)."""
    cap = max_plan_bytes()
    try:
        with open(path, "rb") as fh:
            raw = fh.read(cap + 1)  # never more than the cap, whatever the file claims to hold
        if len(raw) > cap:
            raise ReplayError(f"benchmark plan {path} is larger than {cap} bytes "
                              f"({MAX_PLAN_BYTES_ENV} raises the cap)")
        data = json.loads(raw.decode("utf-8"))
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
        for tid in op_tensor_ids(op):
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


def walk_tensor_ids(enc: Any, out: list[int]) -> None:
    if isinstance(enc, list):
        for e in enc:
            walk_tensor_ids(e, out)
    elif isinstance(enc, dict) and "t" in enc:
        out.append(int(enc["t"]))


def op_tensor_ids(op: dict[str, Any]) -> list[int]:
    out: list[int] = []
    walk_tensor_ids(op.get("args", []), out)
    walk_tensor_ids(list(op.get("kwargs", {}).values()), out)
    walk_tensor_ids(op.get("outputs", []), out)
    return out


def op_input_ids(op: dict[str, Any]) -> list[int]:
    out: list[int] = []
    walk_tensor_ids(op.get("args", []), out)
    walk_tensor_ids(list(op.get("kwargs", {}).values()), out)
    return out


def op_output_ids(op: dict[str, Any]) -> list[int]:
    out: list[int] = []
    walk_tensor_ids(op.get("outputs", []), out)
    return out
