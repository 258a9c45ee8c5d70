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


def differences(profile: str) -> list[Difference]:
    """The differences of ``profile`` (UsageError for an unknown profile)."""
    if profile not in PROFILES_HELP:
        raise UsageError(f"unknown --emulate profile {profile!r}; known: {', '.join(sorted(PROFILES_HELP))}")
    found: list[Difference] = []
    for name in _MODULES:  # imported here: they import torch, and Difference from this module
        mod = importlib.import_module(f"{__name__}.{name}")
        found.extend(d for d in mod.DIFFERENCES if profile in d.profiles)
    return found


def make_mode(profile: str) -> Any:
    """A fresh :class:`~.mode.EmulationMode` of ``profile``."""
    from .mode import EmulationMode

    return EmulationMode(profile, differences(profile))


def active_profile() -> str | None:
    """The profile of the innermost active :class:`~.mode.EmulationMode`, or None.

    Validators ask this where a foreign device's behaviour is a *query*, not an op (``may this
    device use TF32?``, ``does this SDPA backend have a kernel for fp32?``).
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from .mode import EmulationMode

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, EmulationMode):
            return mode.profile
    return None
