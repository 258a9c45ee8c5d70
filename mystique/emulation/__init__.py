"""Emulated accelerators: a healthy foreign device's *legal* differences, reproduced on this one.

A qualification suite must pass a healthy device whose kernels differ from the CPU's in ways the
framework allows: another summation order, no kernel for some dtype, auxiliary outputs with
backend-specific contents, an autocast policy that refuses an op, TF32 where the user allows it.
CI has no accelerator, so these differences are reproduced here as one ``TorchDispatchMode``
(:class:`EmulationMode`), active only while the device under test runs (``Target.active()``),
never while references or goldens are computed. ``--emulate PROFILE`` on ``validate``, ``qualify``
and ``selftest`` turns it on; under it a healthy run must report no failure, and every built-in
fault simulation must still be caught (``mystique selftest --device cpu --emulate cuda``).

Each difference is a :class:`~.difference.Difference` in one module of this package (one module
per behaviour: ``reductions``, ``attention``, ``autocast``, ``integer_gemm``, ``embedding_bag``,
``tf32``), naming the documented behaviour it imitates; a new difference goes in the module of its
behaviour and is listed in that module's ``DIFFERENCES``. A profile is the set of differences that
name it. This package's ``__init__`` imports no torch (the CLI reads :data:`PROFILES_HELP`).
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .difference import PASS, Difference

__all__ = ["PASS", "PROFILES_HELP", "Difference", "differences", "make_mode"]

PROFILES_HELP: dict[str, str] = {
    "cuda": "an NVIDIA GPU as PyTorch's CUDA backend computes (H100 differences seen 2026-11-25, and the documented ones)",
}


def differences(profile: str) -> list[Difference]:
    """The differences of ``profile`` (UsageError for an unknown profile)."""
    if profile not in PROFILES_HELP:
        raise UsageError(f"unknown --emulate profile {profile!r}; known: {', '.join(sorted(PROFILES_HELP))}")
    # imported here: they import torch, which importing this package must not
    from . import attention, autocast, embedding_bag, integer_gemm, reductions, tf32

    found: list[Difference] = []
    for mod in (reductions, attention, autocast, integer_gemm, embedding_bag, tf32):
        found.extend(d for d in mod.DIFFERENCES if profile in d.profiles)
    return found


def make_mode(profile: str) -> Any:
    """A fresh :class:`~.mode.EmulationMode` of ``profile``."""
    from .mode import EmulationMode

    return EmulationMode(profile, differences(profile))

