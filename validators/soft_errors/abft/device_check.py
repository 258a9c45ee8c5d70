"""A checked operator's verdict left on the device: read back later, many at once.

On a GPU, reading a verdict after every checked call would synchronise the host with the device
each time. A :class:`DeviceCheck` holds the verdict as a 0-d device tensor (``max |diff| /
lower-bound threshold``) and the exact verdict to take should it exceed 1; :func:`resolve` reads
the verdicts of many checks in one transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mystique.emulation.mode import active_profile

from .report import CheckReport, host


def cuda_like(t: torch.Tensor) -> bool:
    """Whether ``t`` is computed as on a CUDA device: a CUDA tensor, or under ``--emulate cuda``."""
    return t.is_cuda or (torch._C._len_torch_dispatch_stack() > 0 and active_profile() == "cuda")


@dataclass
class DeviceCheck:
    """One device-checked call: ``worst`` (a 0-d device tensor, ``max |diff| / lower-bound threshold``) and
    ``exact(exact_ratio)``, the exact verdict should it exceed 1. :meth:`report` reads it (a
    synchronisation); :func:`resolve` reads many at once. ``path`` names the checked GEMM (Linear)."""

    worst: torch.Tensor
    dtype: str
    shape: tuple[int, ...]
    exact: Callable[[bool], CheckReport]
    op: str = "linear"
    path: Any = None
    #: ``(tensor, its _version)`` of the operands the exact verdict reads later (:meth:`watch`)
    watched: tuple[tuple[torch.Tensor, int], ...] = ()

    def watch(self, *tensors: torch.Tensor) -> DeviceCheck:
        """Remember the versions of the tensors :attr:`exact` reads: one modified in place before the verdict
        is read (``nn.ReLU(inplace=True)`` after a Linear) leaves no exact verdict (an unchecked report, never
        a verdict on other data)."""
        self.watched = tuple((t, t._version) for t in tensors)
        return self

    def report(self, worst: float | None = None) -> CheckReport:
        w = float(self.worst) if worst is None else worst
        if w <= 1.0 - 2.0**-15:  # (the fp32 rounding of the bound, its reciprocal and the difference)
            return CheckReport(self.op, self.dtype, False, w, True, [], [], None, self.shape)
        if any(t._version != v for t, v in self.watched):
            return CheckReport(self.op, self.dtype, False, w, False, [], [], None, self.shape)
        return self.exact(False)  # NaN (something not finite) falls through too


def resolve(checks: list[DeviceCheck]) -> list[CheckReport]:
    """The reports of ``checks``, their device scalars read back in one transfer."""
    if not checks:
        return []
    worst = host(torch.stack([c.worst.reshape(()) for c in checks]).float()).tolist()
    return [c.report(w) for c, w in zip(checks, worst)]


