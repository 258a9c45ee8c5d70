"""Recorded values of data-dependent integers: what a replay needs to reproduce routing.

A mixture of experts' work depends on data, not on shapes alone: the group offsets of a grouped GEMM
(``aten::_grouped_mm``'s ``offs``: where each expert's tokens end) say how many tokens each expert
multiplies, and document ids decide which positions a packed sequence's mask lets attend. The
Execution Trace keeps shapes, not values, so a replay on synthetic data would route differently.

PyTorch's observer keeps the values of the integral inputs of named operators
(``ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_DATA`` with extra resource collection): one raw
file per (node, input) in a resource folder beside the trace. :func:`collect` turns them into one
``values.json`` in the capture folder, keyed by ET node id and input index, with each tensor's dtype
and shape from the trace; :func:`read_values` reads it back as untrusted data (size-capped, checked:
integers only). The plan pins them (:mod:`mystique.replay.pins`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .files import read_json_document

#: operators whose integral inputs a capture keeps the values of: grouped GEMMs' group offsets (tokens
#: per expert) and integer comparisons (the document ids of a packed sequence's mask)
VALUE_OPS = ("aten::_grouped_mm", "aten::eq")
VALUES_FILE = "values.json"
VALUES_FORMAT = "mystique-values"
_MAX_VALUES_BYTES = 256 * 1024**2
_MAX_ELEMENTS = 1 << 22  # per recorded tensor: larger ones are not routing metadata
_DAT = re.compile(r"nid_(\d+)_tid_(\d+)\.dat")
_ET_INT_TYPES = {"Tensor(int)": "int32", "Tensor(long int)": "int64", "Tensor(short int)": "int16",
                 "Tensor(signed char)": "int8", "Tensor(unsigned char)": "uint8"}


def resource_dir(trace_path: Path) -> Path:
    """The folder the observer writes its resources to for ``trace_path``: the first ``.json`` of the
    name replaced by ``_resources/``; a gzipped trace is recorded uncompressed first (capture)."""
    name = trace_path.name.removesuffix(".gz")
    return trace_path.parent / (name.removesuffix(".json") + "_resources")


def _trace_inputs(trace_path: Path, wanted: set[int]) -> dict[int, dict[str, Any]]:
    doc = read_json_document(trace_path)
    out = {}
    for node in doc.get("nodes", []) if isinstance(doc, dict) else []:
        if isinstance(node, dict) and node.get("id") in wanted:
            out[node["id"]] = node
    return out


def collect(trace_path: Path, rdir: Path, out_path: Path) -> int:
    """Turn the observer's resource files (in ``rdir``) of the nodes of ``trace_path`` into ``out_path``
    (``values.json``) and remove them; returns the number of tensors kept (0: no file written)."""
    files = {}
    for f in rdir.rglob("*.dat") if rdir.is_dir() else []:
        m = _DAT.search(f.name)
        if m:
            files[(int(m.group(1)), int(m.group(2)))] = f
    nodes = _trace_inputs(trace_path, {nid for nid, _ in files}) if files else {}
    kept: dict[str, dict[str, Any]] = {}
    for (nid, idx), f in sorted(files.items()):
        node = nodes.get(nid) or {}
        inputs = node.get("inputs", {})
        try:
            et_type, shape = inputs["types"][idx], inputs["shapes"][idx]
        except (KeyError, IndexError, TypeError):
            continue
        dtype = _ET_INT_TYPES.get(et_type)
        if dtype is None:
            continue
        vals = np.fromfile(f, dtype=dtype)
        if vals.size != int(np.prod(shape)) or vals.size > _MAX_ELEMENTS:
            continue
        kept.setdefault(str(nid), {})[str(idx)] = {"op": node.get("name"), "dtype": dtype, "shape": list(shape),
                                                   "values": vals.astype(np.int64).tolist()}
    shutil.rmtree(rdir, ignore_errors=True)
    if kept:
        out_path.write_text(json.dumps({"format": VALUES_FORMAT, "version": 1, "ops": list(VALUE_OPS),
                                        "nodes": kept}) + "\n", encoding="utf-8")
    return sum(len(v) for v in kept.values())


def read_values(trace_path: str | os.PathLike) -> dict[int, dict[int, dict[str, Any]]]:
    """``values.json`` beside a trace (or in a trace dir): ``{node id: {input index: {"dtype",
    "shape", "values"}}}``; empty when absent, too large or malformed (the entries that check out are
    kept: integer lists whose length is the shape's element count)."""
    p = Path(trace_path)
    f = (p if p.is_dir() else p.parent) / VALUES_FILE
    try:
        if not f.is_file() or f.stat().st_size > _MAX_VALUES_BYTES:
            return {}
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != VALUES_FORMAT or not isinstance(doc.get("nodes"), dict):
        return {}
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for nid, inputs in doc["nodes"].items():
        if not (isinstance(nid, str) and nid.isdigit() and isinstance(inputs, dict)):
            continue
        for idx, e in inputs.items():
            if _entry_ok(idx, e):
                out.setdefault(int(nid), {})[int(idx)] = {"dtype": e["dtype"], "shape": list(e["shape"]),
                                                          "values": list(e["values"])}
    return out


def _entry_ok(idx: Any, e: Any) -> bool:
    if not (isinstance(idx, str) and idx.isdigit() and isinstance(e, dict)):
        return False
    shape, vals = e.get("shape"), e.get("values")
    if e.get("dtype") not in _ET_INT_TYPES.values() or not isinstance(shape, list) or not isinstance(vals, list):
        return False
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= _MAX_ELEMENTS for s in shape):
        return False
    return len(vals) == int(np.prod(shape)) <= _MAX_ELEMENTS and all(
        isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53 for v in vals)
