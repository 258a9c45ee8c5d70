"""What the replay does with each recorded operator: its action (``call``, ``noop`` or ``skip``,
with the reason) and, for an op the trace recorded no schema of, the overload its arguments match."""

from __future__ import annotations

from collections.abc import Sequence

from ..trace.model import Arg, Node, TensorRef
from .runtime.schemas import (
    COLLECTIVE_NAMES,
    COLLECTIVE_PREFIXES,
    NOOP_NAMES,
    Schema,
    op_refusal,
    overload_schemas,
    parse_schema,
)


def classify(node: Node) -> tuple[str, str]:
    """``(action, reason)`` of an outermost node: ``call``, ``noop`` or ``skip``."""
    name = node.name
    if name in COLLECTIVE_NAMES or name.startswith(COLLECTIVE_PREFIXES):
        return "skip", "collective"
    if name in NOOP_NAMES or name.startswith("profiler::") or name.startswith("[pytorch|profiler"):
        return "noop", "profiler/stream bookkeeping"
    if node.kernel_backend:
        return "skip", f"compiled kernel ({node.kernel_backend})"
    if "::" not in name and not node.op_schema:
        return "skip", "not an operator"
    return "call", ""


def _value_kind(a: Arg) -> str:
    if isinstance(a.value, TensorRef):
        return "Tensor"
    if isinstance(a.value, list):
        return "list"
    if a.value is None:
        return "None"
    if isinstance(a.value, bool):
        return "bool"
    if isinstance(a.value, int):
        return "int"
    if isinstance(a.value, float):
        return "float"
    return "str"


def _type_accepts(stype: str, a: Arg) -> bool:
    base = stype.replace("?", "")
    k = _value_kind(a)
    if k == "None":
        return "?" in stype or base.startswith(("Generator", "Tensor"))
    if base.startswith("Tensor") and "[" not in base:
        return k == "Tensor"
    if "[" in base:
        return k in ("list", "int") if not base.startswith("Tensor") else k == "list"
    if base in ("int", "SymInt"):
        return k in ("int", "bool")
    if base == "float":
        return k in ("int", "float")
    if base == "bool":
        return k in ("bool", "int")
    if base == "Scalar":
        return k in ("int", "float", "bool")
    if base in ("ScalarType", "Layout", "MemoryFormat"):
        return k == "int"
    if base == "Device":
        return k in ("str", "int")
    if base == "str":
        return k == "str"
    return True


def match_schema(name: str, inputs: list[Arg], allow_ops: Sequence[str] = ()) -> str | None:
    """The schema of the overload of ``name`` that accepts ``inputs`` (None when none does, or when
    :func:`mystique.replay.runtime.op_refusal` refuses ``name`` with ``allow_ops``)."""
    best = None
    for text in overload_schemas(name, allow_ops):
        try:
            sch = parse_schema(text)
        except ValueError:
            continue
        if len(inputs) > len(sch.args):
            continue
        if any(a.default is None and i >= len(inputs) for i, a in enumerate(sch.args)):
            continue
        if all(_type_accepts(sa.type, a) for sa, a in zip(sch.args, inputs)):
            if best is None or (sch.overload != "out" and len(sch.args) < len(best[1].args)):
                best = (text, sch)
    return best[0] if best else None


def resolve(node: Node, allow_ops: Sequence[str] = ()) -> tuple[str, str, str | None, Schema | None]:
    """``(action, reason, schema text, parsed schema)`` of an outermost node.

    A ``call`` op needs a schema (recorded, else matched by :func:`match_schema`) of an allowed
    namespace that takes its recorded arguments; otherwise it becomes ``skip`` with the reason.
    """
    action, reason = classify(node)
    schema_text = node.op_schema
    sch: Schema | None = None
    refused = op_refusal(node.name, allow_ops) if action == "call" else ""
    if refused:
        return "skip", refused, schema_text, None  # an operator of a namespace not allowed: never resolved
    if action != "call":
        return action, reason, schema_text, None
    if not schema_text:
        schema_text = match_schema(node.name, node.inputs, allow_ops) or ""
    if schema_text:
        try:
            sch = parse_schema(schema_text)
        except ValueError:
            sch = None
    if sch is None:
        ns = node.name.split("::", 1)[0]
        reason = ("custom op unavailable" if ns not in ("aten", "prims") and not overload_schemas(node.name, allow_ops)
                  else "no operator schema recorded or matched")
        return "skip", reason, schema_text, None
    if op_refusal(sch.qualified, allow_ops):  # a recorded schema of another namespace
        reason = op_refusal(sch.qualified, allow_ops)
    elif len(node.inputs) > len(sch.args):
        reason = "recorded arguments do not match the schema"
    elif any(a.kind in ("Storage",) for a in node.inputs):
        reason = "storage arguments are not replayable"
    return ("skip" if reason else "call"), reason, schema_text, sch
