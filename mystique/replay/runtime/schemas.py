"""Operator schemas (``ns::op.overload(args) -> ret``), the namespace allow-list, the operator
policy (:mod:`.policy`) and overload resolution from ``torch.ops``."""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .policy import schema_refusal

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

# Operators the plan builder marks as collectives (skipped unless a collective handler runs them)
# and as no-ops.
COLLECTIVE_PREFIXES: tuple[str, ...] = ("c10d::", "c10d_functional::", "_c10d_functional::", "nccl:", "gloo:")
COLLECTIVE_NAMES: frozenset[str] = frozenset({"record_param_comms"})
NOOP_NAMES: frozenset[str] = frozenset({
    "aten::record_stream",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "profiler::_call_end_callbacks_on_jit_fut",
})


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


def _pattern_allows(qualified: str, allow_ops: Sequence[str]) -> bool:
    """Whether a pattern of ``allow_ops`` (fnmatch, case-sensitive) matches ``ns::name`` or the whole
    ``qualified``."""
    short = qualified.split(".", 1)[0]
    return any(fnmatch.fnmatchcase(short, p) or fnmatch.fnmatchcase(qualified, p) for p in allow_ops)


def op_refusal(qualified: str, allow_ops: Sequence[str] = ()) -> str:
    """Why a replay must not call operator ``qualified`` (``ns::name`` or ``ns::name.overload``): its
    namespace is not in :data:`ALLOWED_OP_NAMESPACES` and no pattern of ``allow_ops`` (fnmatch,
    case-sensitive, on ``ns::name`` or on the whole ``qualified``) matches it. "" when it may."""
    ns, sep, _rest = qualified.partition("::")
    if not sep or ns in ALLOWED_OP_NAMESPACES:
        return ""  # a name without a namespace resolves to no operator anyway
    if _pattern_allows(qualified, allow_ops):
        return ""
    return f"namespace {ns!r} not allowed (pass --allow-ops '{ns}::*')"


def _packet(ns_name: str) -> Any:
    """``torch.ops.ns.name`` (None when this process registers no such operator)."""
    ns, _, name = ns_name.partition("::")
    if ns not in ("aten", "prims"):
        import_namespace(ns)
    try:
        return getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return None


def policy_refusal(qualified: str, allow_ops: Sequence[str] = ()) -> str:
    """Why the operator policy (:mod:`.policy`) refuses ``qualified`` (``ns::name.overload``; no
    overload means ``default``, as for :func:`resolve_overload`), judged by the schema this process
    registers for it; "" when it may run, when a pattern of ``allow_ops`` matches it, when its
    namespace is not allowed (:func:`op_refusal`: never resolved anyway) or when no such operator
    exists here."""
    if "::" not in qualified or op_refusal(qualified) or _pattern_allows(qualified, allow_ops):
        return ""
    ns_name, _, overload = qualified.partition(".")
    packet = _packet(ns_name)
    try:
        schema = getattr(packet, overload or "default")._schema if packet is not None else None
    except (AttributeError, RuntimeError):
        schema = None
    why = schema_refusal(schema) if schema is not None else ""
    if not why:
        return ""
    return (f"operator {ns_name}.{overload or 'default'} refused: it {why}; a plan or trace is data, not a "
            f"program (pass --allow-ops '{ns_name}' to call it)")


def plan_refusal(ops: Sequence[Any], allow_ops: Sequence[str] = ()) -> str:
    """The refusal (:func:`policy_refusal`) of the first op of a plan's ``ops`` that it calls, as
    ``op K: ...``; "" when the policy allows every one."""
    for i, op in enumerate(ops if isinstance(ops, list) else []):
        if isinstance(op, dict) and op.get("action", "call") == "call" and isinstance(op.get("op"), str):
            why = policy_refusal(op["op"], allow_ops)
            if why:
                return f"op {i}: {why}"
    return ""


def resolve_overload(qualified: str, allow_ops: Sequence[str] = ()) -> Any:
    """``"aten::addmm.default"`` -> ``torch.ops.aten.addmm.default`` (None when unavailable, or
    refused by :func:`op_refusal` or :func:`policy_refusal` with ``allow_ops``)."""
    if op_refusal(qualified, allow_ops) or policy_refusal(qualified, allow_ops):
        return None
    ns_name, _, overload = qualified.partition(".")
    packet = _packet(ns_name)
    try:
        return getattr(packet, overload or "default") if packet is not None else None
    except (AttributeError, RuntimeError):
        return None


def overload_schemas(ns_name: str, allow_ops: Sequence[str] = ()) -> list[str]:
    """Schema strings of every overload of ``ns::name`` registered in this torch (empty if none, or
    if :func:`op_refusal` refuses it with ``allow_ops``)."""
    if op_refusal(ns_name, allow_ops):
        return []
    packet = _packet(ns_name)
    if packet is None:
        return []
    out = []
    for ov in packet.overloads():
        try:
            out.append(str(getattr(packet, ov)._schema))
        except (AttributeError, RuntimeError):
            continue
    return out
