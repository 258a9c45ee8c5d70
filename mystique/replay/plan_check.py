"""Validation of a loaded replay plan: a ``benchmark.json`` is untrusted input, like a trace.

:func:`plan_problem` names, in one line, what makes a decoded plan unusable by the executor.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

from ..io import show
from .runtime.format import contiguous_strides, extent

_MAX_PLAN_BYTES = 2**60  # one storage or tensor extent (1 EiB): beyond any device, far from 64-bit overflow
_MAX_ENC_DEPTH = 32
_ENC_KEYS = frozenset({"t", "dtype", "layout", "memory_format", "device", "float", "none"})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _nat_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) and 0 <= x <= _MAX_PLAN_BYTES for x in v)


def plan_problem(data: Any) -> str:
    """What makes a decoded plan unusable by the executor, in one line ("" when nothing does).

    Checked: the tables' types, that ids are ``0..n-1`` (the executor sizes arrays by them), that
    every reference (a tensor's storage, ``{"t": id}`` in an op, an anchor, an input) exists,
    non-negative sizes, offsets and strides with extents below 1 EiB, op names and actions, the
    argument encodings' shapes and the data recipes' types. Unknown keys are left alone.
    """
    if not isinstance(data, dict):
        return "not an object"
    for key, kind in (("metadata", dict), ("storages", list), ("tensors", list), ("ops", list)):
        if not isinstance(data.get(key), kind):
            return f"{key!r} is not a{'n object' if kind is dict else ' list'}"
    storages, tensors = data["storages"], data["tensors"]
    for table, rows in (("storages", storages), ("tensors", tensors)):
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or row.get("id") != i or not _is_int(row.get("id")):
                return f"{table}[{i}] has no id {i} (ids are 0..n-1 in order)"
    for s in storages:
        where = f"storage {s['id']}"
        if not _is_int(s.get("nbytes")) or not 0 <= s["nbytes"] <= _MAX_PLAN_BYTES:
            return f"{where} has nbytes {_short_value(s.get('nbytes'))}"
        if not isinstance(s.get("dtype"), str):
            return f"{where} has dtype {_short_value(s.get('dtype'))}"
        if s.get("device") is not None and not isinstance(s["device"], str):
            return f"{where} has device {_short_value(s['device'])}"
        anchor = s.get("anchor")
        if anchor is not None and not (_is_int(anchor) and 0 <= anchor < len(tensors)):
            return f"{where} has anchor {_short_value(anchor)}, not a tensor"
        recipe = s.get("recipe")
        if recipe is not None and not _recipe_ok(recipe):
            return f"{where} has recipe {_short_value(recipe)}"
    for t in tensors:
        where = f"tensor {t['id']}"
        if not (_is_int(t.get("storage")) and 0 <= t["storage"] < len(storages)):
            return f"{where} has storage {_short_value(t.get('storage'))}, not a storage"
        shape, strides, offset = t.get("shape"), t.get("strides"), t.get("offset")
        if not _nat_list(shape):
            return f"{where} has shape {_short_value(shape)}, expected non-negative integers"
        if strides is not None and not (_nat_list(strides) and len(strides) == len(shape)):
            return f"{where} has strides {_short_value(strides)} for shape {_short_value(shape)}"
        if not (_is_int(offset) and 0 <= offset <= _MAX_PLAN_BYTES):
            return f"{where} has offset {_short_value(offset)}"
        if not isinstance(t.get("dtype"), str):
            return f"{where} has dtype {_short_value(t.get('dtype'))}"
        if t.get("source", "unused") not in ("external", "output", "derived", "unused"):
            return f"{where} has source {_short_value(t.get('source'))}"
        if t.get("device") is not None and not isinstance(t["device"], str):
            return f"{where} has device {_short_value(t['device'])}"
        numel = math.prod(shape)
        span = extent(shape, strides or contiguous_strides(shape), offset)
        if numel > _MAX_PLAN_BYTES or span * 16 > _MAX_PLAN_BYTES:
            return f"{where} of shape {_short_value(shape)} spans more than any device holds"
    inputs = data.get("inputs", [])
    if not isinstance(inputs, list) or not all(_is_int(i) and 0 <= i < len(tensors) for i in inputs):
        return "'inputs' is not a list of tensor ids"
    for i, op in enumerate(data["ops"]):
        where = f"op {i}"
        if not isinstance(op, dict):
            return f"{where} is not an object"
        for key in ("name", "op", "schema"):
            if op.get(key) is not None and not isinstance(op[key], str):
                return f"{where} has {key} {_short_value(op[key])}, expected a string"
        if not isinstance(op.get("name"), str):
            return f"{where} has no name"
        if op.get("action") not in ("call", "noop", "skip"):
            return f"{where} has action {_short_value(op.get('action'))}, expected call, noop or skip"
        if not isinstance(op.get("args", []), list) or not isinstance(op.get("outputs", []), list):
            return f"{where} has args or outputs that are not lists"
        kwargs = op.get("kwargs", {})
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            return f"{where} has kwargs that are not an object"
        for label, enc in (("args", op.get("args", [])), ("kwargs", list(kwargs.values())),
                           ("outputs", op.get("outputs", []))):
            bad = _encoding_problem(enc, len(tensors))
            if bad:
                return f"{where} ({show(op['name'])[:60]}) {label}: {bad}"
    return ""


def _recipe_ok(recipe: Any) -> bool:
    if not isinstance(recipe, dict) or not isinstance(recipe.get("kind", ""), str):
        return False
    for k, v in recipe.items():
        if k == "segments":  # [start, count, stride, ...two numbers]: positions into the storage
            if not (isinstance(v, list) and all(
                    isinstance(seg, list) and len(seg) == 5 and all(_is_int(x) and 0 <= x <= _MAX_PLAN_BYTES
                                                                    for x in seg[:3])
                    and all(isinstance(x, (int, float)) and math.isfinite(x) for x in seg[3:]) for seg in v)):
                return False
        elif k == "values" and not (isinstance(v, list) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
            return False
        elif k in ("low", "high", "total", "std", "zipf") and not (
                isinstance(v, (int, float)) and math.isfinite(v)):
            return False
    return True


def _encoding_problem(enc: Any, n_tensors: int) -> str:
    stack = [(enc, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > _MAX_ENC_DEPTH:
            return f"nested more than {_MAX_ENC_DEPTH} levels"
        if isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, dict):
            if len(v) != 1 or not set(v) <= _ENC_KEYS:
                return f"unknown encoding {_short_value(v)}"
            ((key, val),) = v.items()
            if key == "t":
                if not (_is_int(val) and 0 <= val < n_tensors):
                    return f"tensor reference {_short_value(val)} names no tensor"
            elif key != "none" and not isinstance(val, str):
                return f"encoding {_short_value(v)} holds no string"
        elif v is not None and not isinstance(v, (bool, int, float, str)):
            return f"value {_short_value(v)}"
    return ""


def _short_value(v: Any) -> str:
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxlong, r.maxother = 2, 4, 3, 40, 24, 30
    return show(r.repr(v))[:80]
