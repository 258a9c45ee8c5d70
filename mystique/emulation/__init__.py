"""Emulated accelerators: a healthy foreign device's *legal* differences, reproduced on this one.

A qualification suite must pass a healthy device whose kernels differ from the CPU's in ways the
framework allows: another summation order, no kernel for some dtype, auxiliary outputs with
backend-specific contents, an autocast policy that refuses an op, TF32 where the user allows it.
CI has no accelerator, so these differences are reproduced here as one ``TorchDispatchMode``
(:class:`EmulationMode`), active only while the device under test runs (``Target.active()``),
never while references or goldens are computed. ``--emulate PROFILE`` on ``validate``, ``qualify``
and ``selftest`` turns it on; under it a healthy run must report no failure, and every built-in
fault simulation must still be caught (``mystique selftest --device cpu --emulate cuda``).

Each difference is a :class:`Difference` in one module of this package, naming the documented
behaviour it imitates. A profile is a list of differences (:data:`PROFILES`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

# The modules that define differences; each exposes ``DIFFERENCES: list[Difference]``.
_MODULES: tuple[str, ...] = ("reductions", "attention", "autocast", "integer_gemm", "embedding_bag", "tf32")


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

PROFILES_HELP: dict[str, str] = {
    "cuda": "an NVIDIA GPU as PyTorch's CUDA backend computes (H100 differences seen 2026-11-25, and the documented ones)",
}


def _base_name(func: Any) -> str:
    name = getattr(func, "__name__", str(func))  # e.g. "cumsum.default"
    return name.split(".")[0]


def differences(profile: str) -> list[Difference]:
    """The differences of ``profile`` (UsageError for an unknown profile)."""
    if profile not in PROFILES_HELP:
        raise UsageError(f"unknown --emulate profile {profile!r}; known: {', '.join(sorted(PROFILES_HELP))}")
    found: list[Difference] = []
    for name in _MODULES:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a difference module not written yet
            if exc.name != f"{__name__}.{name}":
                raise
            continue
        found.extend(d for d in getattr(mod, "DIFFERENCES", ()) if profile in d.profiles)
    return found


def make_mode(profile: str) -> Any:
    """A fresh :class:`EmulationMode` of ``profile``."""
    return EmulationMode(profile, differences(profile))


def _mode_base() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def _build_mode_class() -> type:
    base = _mode_base()

    class _EmulationMode(base):  # type: ignore[misc, valid-type]
        """Dispatch every op; the first difference that claims it computes it, else the host does."""

        def __init__(self, profile: str, diffs: list[Difference]):
            super().__init__()
            self.profile = profile
            self.differences = list(diffs)
            self._by_op: dict[str, list[Difference]] = {}
            for d in self.differences:
                for op in d.ops:
                    self._by_op.setdefault(op, []).append(d)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for d in self._by_op.get(_base_name(func), ()):
                out = d.run(func, args, kwargs)
                if out is not PASS:
                    return out
            return func(*args, **kwargs)

    _EmulationMode.__name__ = _EmulationMode.__qualname__ = "EmulationMode"
    return _EmulationMode


_MODE_CLASS: type | None = None


def EmulationMode(profile: str, diffs: list[Difference]) -> Any:  # noqa: N802 (a class, built lazily)
    global _MODE_CLASS
    if _MODE_CLASS is None:
        _MODE_CLASS = _build_mode_class()
    return _MODE_CLASS(profile, diffs)


def active_profile() -> str | None:
    """The profile of the innermost active :class:`EmulationMode`, or None.

    Validators ask this where a foreign device's behaviour is a *query*, not an op (``may this
    device use TF32?``, ``does this SDPA backend have a kernel for fp32?``).
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if _MODE_CLASS is not None and isinstance(mode, _MODE_CLASS):
            return mode.profile
    return None
