"""Write a :class:`~mystique.trace.model.Trace` back as an ET JSON document (chakra 1.1.1 layout).

Used to trim real traces into small test inputs and to check the parsers (parse -> write ->
parse gives the same model). Attributes are written as recorded; ``tensor_range`` is rebuilt
from the tensors' ``value_range`` when any input carries one.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..io import atomic_write_bytes
from .analysis import tensors
from .model import Arg, Node, TensorRef, Trace

WRITE_SCHEMA = "1.1.1-chakra.0.0.4"
_ATTR_TYPES = {"rf_id": "uint64", "fw_parent": "uint64", "seq_id": "int64", "scope": "uint64",
               "tid": "uint64", "fw_tid": "uint64"}


def tensor_value(t: TensorRef) -> list:
    """Return the ET value of a tensor: ``[tensor_id, storage_id, offset, numel, itemsize, device]``."""
    return [t.tensor_id, t.storage_id, t.offset, t.numel, t.itemsize, t.device]


def encode_arg(arg: Arg) -> tuple[Any, Any, Any]:
    """Return ``(value, shape, strides)`` of one argument as the observer writes them."""
    v = arg.value
    if isinstance(v, TensorRef):
        return tensor_value(v), list(v.shape), list(v.strides) if v.strides is not None else []
    if isinstance(v, list) and all(isinstance(x, Arg) for x in v):
        parts = [encode_arg(x) for x in v]
        return [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts]
    if arg.kind == "None" and v is None:
        return "<None>", arg.shape if arg.shape is not None else [], []
    return v, arg.shape if arg.shape is not None else [], []


def _encode_args(args: list[Arg]) -> dict:
    """Encode a node's inputs or outputs; ``strides`` only when its tensors record strides."""
    parts = [encode_arg(a) for a in args]
    out = {"values": [p[0] for p in parts], "shapes": [p[1] for p in parts], "types": [a.type for a in args]}
    if any(t.strides is not None for t in tensors(args)):
        out["strides"] = [p[2] for p in parts]
    return out


def _attr_type(name: str, value: Any) -> str:
    if name in _ATTR_TYPES:
        return _ATTR_TYPES[name]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "double"
    return "string"


def node_to_dict(node: Node, root_id: int) -> dict:
    """Return the chakra-layout JSON object of one node."""
    attrs = dict(node.attrs)
    for key in ("rf_id", "seq_id", "tid", "fw_parent", "scope"):
        val = getattr(node, key)
        if val is not None:
            attrs[key] = val
    attrs["op_schema"] = node.op_schema
    for key in ("kernel_backend", "kernel_file"):
        if key in attrs or getattr(node, key):
            attrs[key] = getattr(node, key)
    ranges = {str(i): list(t.value_range) for i, t in enumerate(tensors(node.inputs))
              if t.value_range is not None}
    if ranges:
        attrs["tensor_range"] = json.dumps(ranges, separators=(",", ":"))
    elif "tensor_range" in attrs:
        attrs["tensor_range"] = ""
    return {
        "id": node.id,
        "name": node.name,
        "ctrl_deps": node.id if node.parent is None else node.parent,
        "inputs": _encode_args(node.inputs),
        "outputs": _encode_args(node.outputs),
        "attrs": [{"name": k, "type": _attr_type(k, v), "value": v} for k, v in attrs.items()],
    }


def trace_to_document(trace: Trace, node_ids: list[int] | None = None) -> dict:
    """Return the trace as an ET JSON document in the 1.1.1-chakra layout.

    ``node_ids``: write only these nodes (they must include the root and every kept node's parent).
    """
    ids = sorted(trace.nodes) if node_ids is None else sorted(node_ids)
    doc: dict[str, Any] = {"schema": WRITE_SCHEMA, "pid": trace.pid, "time": trace.time,
                           "start_ts": trace.start_ts}
    doc["nodes"] = [node_to_dict(trace.nodes[i], trace.root_id) for i in ids]
    doc["finish_ts"] = trace.finish_ts
    doc.update(trace.metadata)
    return doc


def write_trace(trace: Trace, path: str | os.PathLike, node_ids: list[int] | None = None) -> None:
    """Write the trace (or the ``node_ids`` part of it) atomically as JSON (gzip for ``.gz``)."""
    data = json.dumps(trace_to_document(trace, node_ids)).encode("utf-8")
    if str(path).endswith(".gz"):
        import gzip

        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(path, data)


__all__ = ["WRITE_SCHEMA", "encode_arg", "node_to_dict", "tensor_value", "trace_to_document", "write_trace"]
