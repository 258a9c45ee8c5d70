"""What one legal difference of a foreign device is (:class:`Difference`), and :data:`PASS`.

A leaf module without torch: every module of this package that defines differences imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Difference:
    """One legal difference of a foreign device.

    ``ops`` are the aten base names (``cumsum``, ``mm``, ...) it may change; ``run(func, args,
    kwargs)`` computes the op as the foreign device would, or returns :data:`PASS` to leave it to
    the host's kernel. ``documented`` says where the behaviour is stated (PyTorch docs, the
    kernel's source) or observed (an evidence folder).
    """

    name: str
    summary: str
    documented: str
    ops: frozenset[str]
    run: Callable[[Any, tuple, dict], Any]
    profiles: frozenset[str] = field(default_factory=lambda: frozenset({"cuda"}))


PASS = object()  # returned by Difference.run: "the host's kernel is right here"
