"""The overhead rows of the GPU targets (issue 21): the device-checked Linear against ``F.linear``.

Timed side by side with the other overhead rows (:func:`.overhead.time_interleaved`: every round runs
every function once in a seeded random order, the overhead is the median of paired ratios with its 95%
interval, :func:`mystique.timing.median_interval`), on CUDA with CUDA events. The checked paths are the
product's own: :func:`.abft.device_linear.device_linear` (the device's kernel: fp32/TF32, or the half GEMM
with fp32 output; the verdict left on the device and read back 64 at a time, as :func:`.protect.protect`
does) and an ``nn.Linear`` under :func:`.protect.protect` (the rounded output checked in its hook).

Targets (the issue's, GPU only): bf16 at most 10% at n = 4096 and 5% at n >= 8192; fp32 at most 5% at
n >= 4096. Elsewhere, and on the CPU (which runs these rows at the CPU sizes), the rows are measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .abft.device_check import DeviceCheck, resolve
from .abft.device_linear import device_linear, encode_device_linear
from .protect import Guard, protect

#: the sizes the GPU targets name (M = K = N)
GPU_SIZES = (4096, 8192)


def linear_target(dtype: str, n: int, cuda: bool) -> float | None:
    """The issue's overhead target of a checked Linear of ``dtype`` at size ``n`` on a GPU, or None."""
    if not cuda:
        return None
    if dtype == "bfloat16":
        return 0.05 if n >= 8192 else (0.10 if n >= 4096 else None)
    return 0.05 if dtype == "float32" and n >= 4096 else None


def device_linear_functions(n: int, dtype: torch.dtype, device: str, seed: int) -> dict[str, Callable[[], Any]]:
    """Unchecked and checked ``dtype`` Linear of size n on ``device`` (the functions timed side by side)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(n, n, generator=g) / math.sqrt(n)).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=g).to(device=device, dtype=dtype)
    enc = encode_device_linear(w, b)
    pending: list[DeviceCheck] = []
    pw, pb = torch.nn.Parameter(w, requires_grad=False), torch.nn.Parameter(b, requires_grad=False)
    plain = torch.nn.Linear(n, n, device=device, dtype=dtype)
    guarded = torch.nn.Linear(n, n, device=device, dtype=dtype)
    for mod in (plain, guarded):  # two modules over the same weight tensors
        mod.weight, mod.bias = pw, pb
    guard = protect(guarded)

    def checked() -> Any:
        y, chk = device_linear(x, enc)
        pending.append(chk)
        if len(pending) >= Guard.FLUSH_EVERY:
            _no_alarm([r.describe() for r in resolve(pending) if r.alarm], "device-checked Linear")
            pending.clear()
        return y

    def protected() -> Any:
        out = guarded(x)
        if len(guard.pending) >= Guard.FLUSH_EVERY - 1:
            _no_alarm([a.describe() for a in guard.alarms], "protected Linear")
        return out

    return {
        "linear": lambda: F.linear(x, w, b),
        "linear_again": lambda: F.linear(x, w, b),
        "device_checked_linear": checked,
        "linear_module": lambda: plain(x),
        "protected_linear_module": protected,
    }


def _no_alarm(alarms: list[str], what: str) -> None:
    if alarms:
        raise RuntimeError(f"clean {what} raised an alarm: {alarms[0]}")


def device_comparisons(dtype: str) -> tuple[tuple[str, str, str, str, str], ...]:
    """The overhead rows of one (dtype, n) timing: (name, checked, base, dtype, what)."""
    return (
        ("device_linear", "device_checked_linear", "linear", dtype,
         "device-checked Linear (the device's own kernel, weight checksums cached per version: one GEMV over x and "
         "one reduction of y; verdicts left on the device, read back 64 at a time) vs F.linear"),
        ("protect_device_linear", "protected_linear_module", "linear_module", dtype,
         "nn.Linear under protect() (its output checked in the forward hook; on a GPU the verdicts are read back 64 at "
         "a time) vs plain"),
    )
