"""The reference the cross-device groups compare the target with, and how rows name it.

A device compared with itself checks nothing: every output is bitwise equal to "the reference",
so the comparison passes whatever the device computes. The reference is therefore another
device, or the same device without what the target adds (an ``--inject`` mode, an ``--emulate``
profile), where the comparison is meaningful and the rows say so ("same device, reference
without the fault"). :func:`choose` decides:

* ``reference_device`` given and the same device as the target's, the target unmodified: a
  :class:`UsageError` (``--reference-device must differ from --device``) when a cross-device
  group (:data:`CROSS_DEVICE_GROUPS`) is asked for;
* ``reference_device`` None (the API's and the qualification's default): the CPU, unless the
  target is itself an unmodified CPU: then there is no second device, ``operator_replay`` is a
  ``skip`` row and ``workload_output`` is judged against the fp64 golden alone
  (:mod:`.workload`); ``repeatability`` never needs a reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from mystique.errors import UsageError
from mystique.targets import check_device

CROSS_DEVICE_GROUPS = ("operator_replay", "workload_output")
SAME_DEVICE = "--reference-device must differ from --device"
NO_SECOND_DEVICE = "no second device"


@dataclass(frozen=True)
class Reference:
    """Where the reference runs (None: no second device) and how the rows name it."""

    device: str | None
    label: str


def modified(target: Any) -> str:
    """What the target adds to its device: ``the fault``, ``the emulation``, both, or ``""``."""
    fault = bool(getattr(target, "inject", None) or getattr(target, "mode_factory", None) is not None)
    emulation = bool(getattr(target, "emulate", None))
    return " and ".join(w for w, on in (("the fault", fault), ("the emulation", emulation)) if on)


def same_device(a: str, b: str) -> bool:
    """Whether two device strings name one device (``cpu`` and ``cpu:0``, ``cuda`` and ``cuda:0``)."""
    da, db = torch.device(a), torch.device(b)
    return da.type == db.type and (da.index or 0) == (db.index or 0)


def choose(target: Any, reference_device: str | None, groups: Iterable[str]) -> Reference:
    """The :class:`Reference` of a run of ``groups`` on ``target`` (module docstring); raises
    UsageError for a self-comparison and as :func:`mystique.targets.check_device` does."""
    adds = modified(target)
    if reference_device is None:
        if torch.device(target.device).type == "cpu" and not adds:
            return Reference(None, f"{NO_SECOND_DEVICE} (target {target.label} alone)")
        reference_device = "cpu"
    ref = check_device(str(reference_device))
    if not same_device(ref, target.device):
        return Reference(ref, ref)
    if adds:
        return Reference(ref, f"{ref} (same device, reference without {adds})")
    cross = [g for g in groups if g in CROSS_DEVICE_GROUPS]
    if cross:
        raise UsageError(f"{SAME_DEVICE} (both {ref}): a device compared with itself passes whatever it computes; "
                         f"name another device, or --inject/--emulate to compare with this one without them "
                         f"({', '.join(cross)})")
    return Reference(None, f"{NO_SECOND_DEVICE} (target {target.label} alone)")
