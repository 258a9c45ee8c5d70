"""The interface of a reference workload and the step builder shared by capture and validators."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

MODES = ("train", "infer")
_MODULES = {"llama": "llama", "dlrm": "dlrm", "bert": "bert"}


class Workload(Protocol):
    """What each workload module provides (module-level functions and constants)."""

    NAME: str
    DESCRIPTION: str
    CONFIGS: dict[str, Any]  # name -> config dataclass instance

    def build_model(self, cfg: Any, *, device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module: ...

    def make_batch(self, cfg: Any, *, device: torch.device, seed: int, batch_size: int | None = None) -> dict[str, torch.Tensor]: ...

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def make_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer: ...

    def memory_bytes(self, cfg: Any, *, mode: str, dtype: torch.dtype, batch_size: int | None = None) -> int: ...


@dataclass
class Step:
    """One step of a workload, ready to call: ``step()`` runs forward (+ backward + optimizer step)."""

    name: str
    config_name: str
    config: Any
    mode: str
    device: torch.device
    dtype: torch.dtype
    model: torch.nn.Module
    batch: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer | None
    fn: Callable[[], Any]

    def __call__(self) -> Any:
        return self.fn()


def names() -> list[str]:
    return sorted(_MODULES)


def get(name: str) -> Workload:
    """The workload module by name (``ValueError`` naming the known ones when unknown)."""
    if name not in _MODULES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(names())}")
    return importlib.import_module(f"{__package__}.{_MODULES[name]}")  # type: ignore[return-value]


class WorkloadTooLarge(MemoryError):
    """The config needs more memory than the device has (raised before allocating)."""


def make_step(
    name: str,
    config: str = "debug",
    mode: str = "train",
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    batch_size: int | None = None,
) -> Step:
    """Build model, batch and optimizer and return the step callable.

    Raises ``ValueError`` for an unknown name, config or mode and :class:`WorkloadTooLarge`
    (naming the bytes needed and available) before allocating a config the device cannot hold.
    """
    raise NotImplementedError("filled in by the workloads implementation")
