"""The fault registry: what ``--inject NAME[:k=v,...]`` may name, and how its parameters are read.

A :class:`FaultSpec` names a dispatch-mode factory, says what it changes and which real failure
it imitates, and lists its parameters with their defaults (a parameter's type is its default's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mystique.errors import UsageError


@dataclass(frozen=True)
class FaultSpec:
    name: str
    summary: str
    imitates: str
    build: Callable[..., Any]  # build(**params) -> TorchDispatchMode
    params: dict[str, Any] = field(default_factory=dict)  # name -> default


FAULTS: dict[str, FaultSpec] = {}


def register(spec: FaultSpec) -> FaultSpec:
    FAULTS[spec.name] = spec
    return spec


def _typed(name: str, key: str, raw: str, default: Any) -> Any:
    raw = raw.strip()
    if isinstance(default, bool):
        low = raw.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"--inject {name}: {key}={raw!r} is not a bool (true/false)")
    if default is None or isinstance(default, str):
        return raw
    try:
        return type(default)(raw)
    except ValueError as exc:
        raise UsageError(f"--inject {name}: {key}={raw!r} is not a {type(default).__name__}") from exc


def parse_params(text: str, name: str) -> dict[str, Any]:
    """Parse ``k=v,k=v`` against the defaults of fault ``name`` (values typed like the defaults).

    Raises UsageError for an unknown key, a missing ``=`` or a value of the wrong type.
    """
    spec = FAULTS[name]
    params = dict(spec.params)
    if not text.strip():
        return params
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in spec.params:
            known = ", ".join(spec.params) or "none"
            raise UsageError(f"--inject {name}: unknown parameter {item!r} (parameters: {known})")
        params[key] = _typed(name, key, raw, spec.params[key])
    return params


def make_factory(name: str, params: dict[str, Any]) -> Callable[[], Any]:
    """A factory of fresh modes of fault ``name``; builds one now so bad values fail early (UsageError)."""
    spec = FAULTS[name]
    spec.build(**params)
    return lambda: spec.build(**params)
