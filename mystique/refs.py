"""``package.module:name`` references to user code (capture targets, --inject mode factories)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .errors import UsageError


def import_callable(module_name: str, attr: str, what: str) -> Callable[..., Any]:
    """Import ``module_name`` and return its callable ``attr``; UsageError naming ``what`` otherwise."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{what}: cannot import module {module_name!r}: {exc}") from exc
    obj = getattr(module, attr, None)
    if not callable(obj):
        raise UsageError(f"{what}: module {module_name!r} has no callable {attr!r}")
    return obj
