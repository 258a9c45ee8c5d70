"""Read a PyTorch Execution Trace file into the schema-independent :mod:`model`.

The parser is chosen by the recorded ``schema`` version through :data:`PARSERS`, a table keyed
by the version family (``MAJOR.MINOR.PATCH``, the part before ``-chakra...``):

- ``1.0.1`` (execution *graph* era, e.g. the DLRM traces): flat node keys ``parent``,
  ``inputs``/``input_shapes``/``input_types``, ``outputs``/``output_shapes``/``output_types`` and
  ``rf_id``, ``fw_parent``, ``seq_id``, ``scope``, ``tid``, ``fw_tid``, ``op_schema`` as plain keys.
- ``1.0.2`` ... ``1.1.1`` (``-chakra.0.0.4``): ``ctrl_deps`` for the parent,
  ``inputs``/``outputs`` objects with ``values``, ``shapes``, ``types`` (and ``strides`` from
  1.1.1), and ``attrs`` as a list of ``{"name", "type", "value"}``; 1.0.3+ add
  ``kernel_backend``/``kernel_file``, torch's observer adds ``tensor_range`` (a JSON string
  keyed by the *input position* of an integral tensor, ``{"1": [0, 2]}``) and
  ``record_param_comms`` nodes carry the collective's attributes.

Facts relied on (those of the reference traces and of the traces torch writes):

- A node's ``id`` is taken from one process-wide counter when the operator *starts*, and the
  node is written when it *ends*; so the file is in post-order (children before parents) while
  the id order is the start order across all threads. Every child's id is greater than its
  parent's. Children are therefore ordered by id.
- The root ``[pytorch|profiler|execution_trace|process]`` (``execution_graph`` in 1.0.1) names
  itself as its parent; one ``[...|thread]`` node per recording thread hangs below it (the
  autograd engine's backward thread gets its own).
- A tensor is ``[tensor_id, storage_id, offset_in_elements, numel, itemsize_bytes, device]``
  in every supported version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import reprlib
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .files import gc_paused, is_tar, read_json_document, resolve_trace_path, show_path
from .model import Arg, Node, TensorRef, Trace
from .types import parse_type

#: Deepest nesting of argument lists accepted (real traces nest 3 levels: a list of lists of tensors).
MAX_ARG_DEPTH = 32
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_ITEMSIZE = 64  # bytes per element: complex128 is 16; anything far above is not a dtype
#: Largest tensor extent accepted (1 EiB): far beyond any device, far enough below 2^63 that a dtype
#: change (up to 8x the bytes) cannot overflow torch's 64-bit size arithmetic.
MAX_TENSOR_BYTES = 2**60
_STRUCTURAL_FLAT = {
    "id", "name", "parent", "inputs", "input_shapes", "input_types", "input_strides",
    "outputs", "output_shapes", "output_types", "output_strides",
}
_TOP_LEVEL_FIELDS = {"schema", "pid", "time", "start_ts", "finish_ts", "nodes"}


class _Ctx:
    """Where a parse problem is: file name and node, for error messages."""

    __slots__ = ("src", "node_id", "node_name")

    def __init__(self, src: str) -> None:
        self.src = show_path(src)
        self.node_id: Any = None
        self.node_name: str = ""

    def error(self, what: str) -> UsageError:
        if self.node_id is None:
            return UsageError(f"{self.src}: {what}")
        return UsageError(f"{self.src}: node {self.node_id} ({show_path(self.node_name)}): {what}")


def load_trace(path: str | os.PathLike) -> Trace:
    """Load an execution trace (``.json``, ``.json.gz`` or a trace folder) into a :class:`Trace`.

    Returns a trace whose ``nodes`` map id -> :class:`Node` with ``children`` filled in
    execution (id) order and ``root_id`` set. Raises :class:`UsageError` for anything malformed,
    naming the file, the node and the field.
    """
    p = resolve_trace_path(path)
    if p.suffix.lower() not in (".json", ".gz") and is_tar(p):
        raise UsageError(f"{show_path(p)}: is a tar archive; extract it first and pass the .json inside")
    with gc_paused():
        doc = read_json_document(p)
        return parse_trace_document(doc, source=str(p))


def parse_trace_document(doc: Any, source: str = "<trace>") -> Trace:
    """Build a :class:`Trace` from an already decoded ET JSON document (see :func:`load_trace`)."""
    ctx = _Ctx(source)
    if not isinstance(doc, dict):
        raise ctx.error(f"expected a JSON object at the top level, found {type(doc).__name__}")
    if "nodes" not in doc:
        raise ctx.error("no 'nodes' list: not a PyTorch execution trace")
    if not isinstance(doc["nodes"], list):
        raise ctx.error(f"'nodes' is a {type(doc['nodes']).__name__}, expected a list")
    schema = doc.get("schema")
    if not isinstance(schema, str):
        raise ctx.error(f"no 'schema' version string (supported: {', '.join(supported_schemas())})")
    parser = parser_for_schema(schema, source)
    nodes: dict[int, Node] = {}
    for index, raw in enumerate(doc["nodes"]):
        ctx.node_id = None
        if not isinstance(raw, dict):
            raise ctx.error(f"nodes[{index}] is a {type(raw).__name__}, expected an object")
        node = parser(raw, ctx, index)
        if node.id in nodes:
            other = nodes[node.id]
            ctx.node_id = None
            raise ctx.error(f"duplicate node id {node.id} ({show_path(other.name)} and {show_path(node.name)})")
        nodes[node.id] = node
    ctx.node_id = None
    root_id = _link(nodes, ctx)
    meta = {k: v for k, v in doc.items() if k not in _TOP_LEVEL_FIELDS}
    return Trace(
        schema=schema,
        nodes=nodes,
        root_id=root_id,
        pid=_opt_int(doc.get("pid")),
        time=doc.get("time") if isinstance(doc.get("time"), str) else None,
        start_ts=_opt_int(doc.get("start_ts")),
        finish_ts=_opt_int(doc.get("finish_ts")),
        source=source,
        metadata=meta,
    )


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _link(nodes: dict[int, Node], ctx: _Ctx) -> int:
    """Check parents, fill ``children`` in id order, return the root id."""
    roots = []
    for node in nodes.values():
        if node.parent is None:
            roots.append(node.id)
            continue
        parent = nodes.get(node.parent)
        if parent is None:
            raise ctx.error(f"node {node.id} ({show_path(node.name)}): parent {node.parent} is not in the trace")
        parent.children.append(node.id)
    if not roots:
        raise ctx.error("no root node (a node that names itself as its parent)")
    if len(roots) > 1:
        names = ", ".join(f"{r} ({show_path(nodes[r].name)})" for r in sorted(roots)[:4])
        raise ctx.error(f"{len(roots)} root nodes ({names}); expected one")
    for node in nodes.values():
        if len(node.children) > 1:
            node.children.sort()
    root = roots[0]
    seen = 0
    stack = [root]
    while stack:
        nid = stack.pop()
        seen += 1
        stack.extend(nodes[nid].children)
    if seen != len(nodes):
        reach: set[int] = set()
        stack = [root]
        while stack:
            nid = stack.pop()
            reach.add(nid)
            stack.extend(nodes[nid].children)
        lost = min(set(nodes) - reach)
        raise ctx.error(
            f"{len(nodes) - seen} nodes are not reachable from the root {root}, "
            f"e.g. node {lost} ({show_path(nodes[lost].name)}): the parent links form a cycle"
        )
    return root


# ------------------------------------------------------------------------------- node parsing


def _node_id(raw: dict, ctx: _Ctx, index: int) -> tuple[int, str]:
    name = raw.get("name")
    if "id" not in raw:
        ctx.node_id = None
        label = f" ({show_path(name)})" if isinstance(name, str) else ""
        raise ctx.error(f"nodes[{index}]{label} has no 'id'")
    nid = raw["id"]
    if not isinstance(nid, int) or isinstance(nid, bool):
        raise ctx.error(f"nodes[{index}] has a non-integer id {_short(nid)}")
    ctx.node_id = nid
    ctx.node_name = name if isinstance(name, str) else "?"
    if not isinstance(name, str):
        raise ctx.error("has no 'name' string")
    return nid, name


def _parent(value: Any, nid: int, key: str, ctx: _Ctx) -> int | None:
    if isinstance(value, list) and len(value) == 1:  # chakra converters may write [parent]
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ctx.error(f"'{key}' is {_short(value)}, expected the parent node id")
    return None if value == nid else value


def _int_attr(attrs: dict[str, Any], key: str, ctx: _Ctx) -> int | None:
    v = attrs.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ctx.error(f"attribute {key} is {_short(v)}, expected an integer")
    return v


def _str_attr(attrs: dict[str, Any], key: str, ctx: _Ctx) -> str:
    v = attrs.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise ctx.error(f"attribute {key} is {_short(v)}, expected a string")
    return v


def _make_node(nid: int, name: str, parent: int | None, inputs: list[Arg], outputs: list[Arg],
               attrs: dict[str, Any], ctx: _Ctx) -> Node:
    rng = attrs.get("tensor_range")
    if rng:
        inputs = _apply_tensor_range(inputs, rng, ctx)
    return Node(
        id=nid,
        name=name,
        parent=parent,
        inputs=inputs,
        outputs=outputs,
        op_schema=_str_attr(attrs, "op_schema", ctx),
        rf_id=_int_attr(attrs, "rf_id", ctx),
        seq_id=_int_attr(attrs, "seq_id", ctx),
        tid=_int_attr(attrs, "tid", ctx),
        fw_parent=_int_attr(attrs, "fw_parent", ctx),
        scope=_int_attr(attrs, "scope", ctx),
        kernel_backend=_str_attr(attrs, "kernel_backend", ctx),
        kernel_file=_str_attr(attrs, "kernel_file", ctx),
        attrs=attrs,
    )


def _apply_tensor_range(inputs: list[Arg], rng: Any, ctx: _Ctx) -> list[Arg]:
    """Set ``value_range`` of the input tensors named by ``tensor_range``.

    The keys count the node's input *tensors* in order, tensors inside lists included and
    non-tensor arguments skipped (torch 2.13: ``aten::gather(float x, int dim, long index)``
    records ``{"1": [min, max]}`` for ``index``; ``aten::cat([a, b])`` records ``"0"`` and ``"1"``).
    Only integral, non-bool tensors are recorded.
    """
    if isinstance(rng, str):
        try:
            rng = json.loads(rng)
        except json.JSONDecodeError as exc:
            raise ctx.error(f"attribute tensor_range is not valid JSON ({exc.msg})") from exc
        except (ValueError, RecursionError) as exc:  # a 5000-digit number; nesting too deep to decode
            raise ctx.error(f"attribute tensor_range is not usable JSON ({type(exc).__name__})") from None
    if not isinstance(rng, dict):
        raise ctx.error(f"attribute tensor_range is {_short(rng)}, expected an object")
    wanted: dict[int, tuple[float, float]] = {}
    for key, mm in rng.items():
        try:
            pos = int(key)
        except ValueError:
            raise ctx.error(f"tensor_range key {_short(key)} is not an input tensor index") from None
        if (not isinstance(mm, list) or len(mm) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in mm)):
            raise ctx.error(f"tensor_range[{show_path(key)}] is {_short(mm)}, expected [min, max]")
        wanted[pos] = (mm[0], mm[1])
    counter = [0]

    def visit(arg: Arg) -> Arg:
        v = arg.value
        if isinstance(v, TensorRef):
            k = counter[0]
            counter[0] += 1
            if k in wanted:
                return dataclasses.replace(arg, value=dataclasses.replace(v, value_range=wanted[k]))
            return arg
        if isinstance(v, list) and arg.kind != "Tensor":
            return dataclasses.replace(arg, value=[visit(x) if isinstance(x, Arg) else x for x in v])
        return arg

    out = [visit(a) for a in inputs]
    if wanted and max(wanted) >= counter[0]:
        raise ctx.error(f"tensor_range names input tensor {max(wanted)}, but the node has {counter[0]} "
                        "input tensors")
    return out


def _parse_chakra_node(raw: dict, ctx: _Ctx, index: int) -> Node:
    nid, name = _node_id(raw, ctx, index)
    if "ctrl_deps" not in raw:
        raise ctx.error("has no 'ctrl_deps' (parent id)")
    parent = _parent(raw["ctrl_deps"], nid, "ctrl_deps", ctx)
    attrs_raw = raw.get("attrs", [])
    if not isinstance(attrs_raw, list):
        raise ctx.error(f"'attrs' is a {type(attrs_raw).__name__}, expected a list")
    try:
        attrs: dict[str, Any] = {a["name"]: a["value"] for a in attrs_raw}
        ok = all(type(k) is str for k in attrs)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        for i, a in enumerate(attrs_raw):
            if not isinstance(a, dict) or not isinstance(a.get("name"), str) or "value" not in a:
                raise ctx.error(f"attrs[{i}] is {_short(a)}, expected {{'name', 'type', 'value'}}")
    inputs = _chakra_args(raw.get("inputs"), "inputs", ctx)
    outputs = _chakra_args(raw.get("outputs"), "outputs", ctx)
    return _make_node(nid, name, parent, inputs, outputs, attrs, ctx)


def _chakra_args(block: Any, label: str, ctx: _Ctx) -> list[Arg]:
    if block is None:
        return []
    if not isinstance(block, dict):
        raise ctx.error(f"'{label}' is a {type(block).__name__}, expected an object with values/shapes/types")
    values = block.get("values", [])
    types = block.get("types", [])
    shapes = block.get("shapes")
    strides = block.get("strides")
    return _args(values, shapes, types, strides, label, ctx)


def _parse_flat_node(raw: dict, ctx: _Ctx, index: int) -> Node:
    nid, name = _node_id(raw, ctx, index)
    if "parent" not in raw:
        raise ctx.error("has no 'parent' id")
    parent = _parent(raw["parent"], nid, "parent", ctx)
    attrs = {k: v for k, v in raw.items() if k not in _STRUCTURAL_FLAT}
    inputs = _args(raw.get("inputs", []), raw.get("input_shapes"), raw.get("input_types", []),
                   raw.get("input_strides"), "inputs", ctx)
    outputs = _args(raw.get("outputs", []), raw.get("output_shapes"), raw.get("output_types", []),
                    raw.get("output_strides"), "outputs", ctx)
    return _make_node(nid, name, parent, inputs, outputs, attrs, ctx)


# ------------------------------------------------------------------------------- arguments


def _args(values: Any, shapes: Any, types: Any, strides: Any, label: str, ctx: _Ctx) -> list[Arg]:
    if not isinstance(values, list):
        raise ctx.error(f"{label} values are a {type(values).__name__}, expected a list")
    if not isinstance(types, list):
        raise ctx.error(f"{label} types are a {type(types).__name__}, expected a list")
    n = len(values)
    if len(types) != n:
        raise ctx.error(f"{label} has {n} values but {len(types)} types")
    if shapes is not None and (not isinstance(shapes, list) or len(shapes) != n):
        raise ctx.error(f"{label} has {n} values but shapes {_short(shapes)}")
    if strides is not None:
        # Triton kernel nodes (PT2) record no stride entry for trailing scalars: pad with None.
        if not isinstance(strides, list) or len(strides) > n:
            raise ctx.error(f"{label} has {n} values but strides {_short(strides)}")
        if len(strides) < n:
            strides = strides + [None] * (n - len(strides))
    return [
        _arg(values[i], None if shapes is None else shapes[i], types[i],
             None if strides is None else strides[i], strides is not None, f"{label}[{i}]", ctx)
        for i in range(n)
    ]


def _make_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxstring, r.maxlong, r.maxother = 3, 6, 6, 4, 50, 30, 40
    return r


_REPR = _make_repr()


def _short(v: Any) -> str:
    """A value of the trace for a one-line message: bounded in size and depth (``repr`` of a value nested
    a thousand levels deep recurses past the interpreter's limit), control characters escaped."""
    s = show_path(_REPR.repr(v))
    return s if len(s) <= 80 else s[:77] + "..."


_INT_ONLY = {int}


def _int_tuple(v: Any, what: str, where: str, ctx: _Ctx) -> tuple[int, ...]:
    """A list of non-negative 64-bit integers (sizes and strides are never negative in torch)."""
    if type(v) is list:
        t = tuple(v)
        if not t or set(map(type, t)) == _INT_ONLY:  # bool is not int here: type(True) is bool
            if t and (min(t) < 0 or max(t) > _INT64_MAX):
                raise ctx.error(f"{where} has {what} {_short(v)}, expected non-negative 64-bit integers")
            return t
    raise ctx.error(f"{where} has {what} {_short(v)}, expected a list of integers")


def _arg(value: Any, shape: Any, type_str: Any, stride: Any, has_strides: bool, where: str,
         ctx: _Ctx, depth: int = 0) -> Arg:
    if not isinstance(type_str, str):
        raise ctx.error(f"{where} has type {_short(type_str)}, expected a type string")
    if depth > MAX_ARG_DEPTH:
        raise ctx.error(f"{where} nests lists more than {MAX_ARG_DEPTH} levels deep")
    try:
        kind, dtype, elems = parse_type(type_str)
    except ValueError as exc:
        raise ctx.error(f"{where}: {ascii(str(exc))[1:-1]}") from None
    if kind == "Tensor":
        return Arg(kind, _tensor(value, shape, stride, has_strides, dtype or "unknown", where, ctx),
                   type_str, shape)
    if elems is not None:
        if not isinstance(value, list):
            raise ctx.error(f"{where} is {type_str} but its value is {_short(value)}, not a list")
        n = len(value)
        if len(elems) != n:
            if len(elems) == 1:
                elems = elems * n
            else:
                raise ctx.error(f"{where} is a list of {n} values but its type {type_str} names {len(elems)}")
        sub_shapes = shape if isinstance(shape, list) and len(shape) == n else [None] * n
        sub_strides = stride if isinstance(stride, list) and len(stride) == n else [None] * n
        items = [
            _arg(value[i], sub_shapes[i], elems[i], sub_strides[i], has_strides and stride is not None,
                 f"{where}[{i}]", ctx, depth + 1)
            for i in range(n)
        ]
        return Arg(kind, items, type_str, shape)
    if kind == "None" and value == "<None>":
        value = None
    if isinstance(value, (list, dict)):
        # the model's invariant: lists are typed (GenericList[...], Tuple[...]) and hold Args
        raise ctx.error(f"{where} is {_short(type_str)} but its value is {_short(value)}, expected a single value")
    return Arg(kind, value, type_str, shape)


def _tensor(value: Any, shape: Any, stride: Any, has_strides: bool, dtype: str, where: str,
            ctx: _Ctx) -> TensorRef:
    if not isinstance(value, list):
        raise ctx.error(f"{where} is a tensor but its value is {_short(value)}, expected a list of 6 fields")
    if len(value) != 6:
        raise ctx.error(f"{where} is a tensor of {len(value)} fields, expected 6")
    if set(map(type, value[:5])) != _INT_ONLY:
        for k in range(5):
            if type(value[k]) is not int:
                field_name = ("tensor_id", "storage_id", "offset", "numel", "itemsize")[k]
                raise ctx.error(f"{where} is a tensor whose {field_name} is {_short(value[k])}, expected an integer")
    if min(value[:5]) < 0 or max(value[:5]) > _INT64_MAX:
        for k in range(5):
            if value[k] < (_INT64_MIN if k < 2 else 0) or value[k] > _INT64_MAX:
                field_name = ("tensor_id", "storage_id", "offset", "numel", "itemsize")[k]
                bound = "a 64-bit integer" if k < 2 else "a non-negative 64-bit integer"
                raise ctx.error(f"{where} is a tensor whose {field_name} is {value[k]}, expected {bound}")
    if value[4] > _MAX_ITEMSIZE:
        raise ctx.error(f"{where} is a tensor whose itemsize is {value[4]} bytes, expected at most {_MAX_ITEMSIZE}")
    device = value[5]
    if device is not None and not isinstance(device, str):
        raise ctx.error(f"{where} is a tensor whose device is {_short(device)}, expected a string")
    shp = _int_tuple(shape, "shape", where, ctx) if shape is not None else ()
    strides = None
    if has_strides and stride is not None:
        strides = _int_tuple(stride, "strides", where, ctx)
    _check_extent(shp, strides, value[2], value[4], where, ctx)
    return TensorRef(value[0], value[1], value[2], value[3], value[4], device, shp, strides, dtype)


def _check_extent(shape: tuple[int, ...], strides: tuple[int, ...] | None, offset: int, itemsize: int,
                  where: str, ctx: _Ctx) -> None:
    """Refuse a tensor whose elements or storage span overflow what any device addresses (1 EiB),
    before a size computation in torch overflows 64 bits on it. A single size or stride beyond 2^60
    is refused even when another size is 0 (no elements): no device has such a dimension, and the
    replay plan refuses it too (``plan_check``), so a trace that loads always generates a plan that
    loads back."""
    for what, dims in (("shape", shape), ("strides", strides or ())):
        if any(d > MAX_TENSOR_BYTES for d in dims):
            raise ctx.error(f"{where} has {what} {_short(list(dims))}: a size or stride beyond 2^60")
    numel = 1
    for d in shape:
        numel *= d
    if numel > MAX_TENSOR_BYTES:
        raise ctx.error(f"{where} has shape {_short(list(shape))}: more than 2^60 elements")
    if strides is None or len(strides) != len(shape):
        extent = numel
    else:
        extent = 0 if numel == 0 else 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    if (offset + extent) * max(itemsize, 1) > MAX_TENSOR_BYTES:
        raise ctx.error(f"{where} spans {offset + extent} elements of {max(itemsize, 1)} bytes from its storage's "
                        "start: more than 1 EiB, beyond any device")


# ------------------------------------------------------------------------------- dispatch

NodeParser = Callable[[dict, _Ctx, int], Node]

#: version family -> node parser. ``1.0.1`` is the flat execution-graph format; the chakra
#: family (ctrl_deps + attrs) spans 1.0.2 to 1.1.1.
PARSERS: dict[str, NodeParser] = {
    "1.0.1": _parse_flat_node,
    "1.0.2": _parse_chakra_node,
    "1.0.3": _parse_chakra_node,
    "1.0.4": _parse_chakra_node,
    "1.1.0": _parse_chakra_node,
    "1.1.1": _parse_chakra_node,
}

_FAMILY = re.compile(r"^(\d+\.\d+\.\d+)(?:-chakra\.[0-9.]+)?$")


def supported_schemas() -> list[str]:
    """Return the supported schema version families, e.g. ``["1.0.1", ..., "1.1.1"]``."""
    return list(PARSERS)


def schema_family(schema: str) -> str | None:
    """Return ``"1.1.1"`` for ``"1.1.1-chakra.0.0.4"``; None when the string is not a version."""
    m = _FAMILY.match(schema.strip())
    return m.group(1) if m else None


def parser_for_schema(schema: str, source: str = "<trace>") -> NodeParser:
    """Return the node parser for a schema version; :class:`UsageError` naming the supported ones."""
    fam = schema_family(schema)
    parser = PARSERS.get(fam) if fam else None
    if parser is None:
        raise UsageError(
            f"{show_path(source)}: unsupported execution trace schema {_short(schema)}; supported: "
            + ", ".join(f"{v}" for v in supported_schemas())
            + " (with or without a -chakra.X suffix)"
        )
    return parser


__all__ = [
    "PARSERS",
    "load_trace",
    "parse_trace_document",
    "parser_for_schema",
    "schema_family",
    "supported_schemas",
]
