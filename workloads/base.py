"""The interface of a reference workload and the step builder shared by capture and validators.

A workload module (``llama``, ``dlrm``, ``bert``) provides, at module level, the names of the
:class:`Workload` protocol. :func:`make_step` turns one (workload, config, mode) into a :class:`Step`
whose ``fn()`` runs exactly one step:

- ``train``: ``optimizer.zero_grad(set_to_none=True)``, forward, loss, backward, ``optimizer.step()``;
  ``fn()`` returns the loss (a detached 0-d tensor, not synchronised to the host);
- ``infer``: the forward under ``torch.inference_mode()`` with the model in eval mode; ``fn()``
  returns the output (logits or predictions).

Before anything is allocated, the workload's memory estimate is compared with the memory the
device has available (:func:`available_bytes`); a config that cannot fit raises
:class:`WorkloadTooLarge`. This package imports only torch (never the mystique core: a test imports
each module alone and looks); the CLI maps ``ValueError`` to a usage error and ``WorkloadTooLarge``
to an unsupported environment.

:data:`WORKLOADS` is the registry: the reference workloads in the order the suite runs and lists
them. Every list of workload names elsewhere (CLI choices, validator defaults) is this one.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

MODES = ("train", "infer")
#: the registry: workload name -> module of this package, in the order the suite runs them
_MODULES = {"llama": "llama", "dlrm": "dlrm", "bert": "bert", "llama4": "llama4"}
#: the reference workloads the validators run by default, in registry order (:func:`names` gives every
#: registered workload, sorted): all of them, Llama 4 (MoE) included; numerics compares it with its
#: routing pinned to fp64's top-k and judges the flips in ``moe_router_flips``; ONNX refuses it
#: naming ``aten::_grouped_mm`` (a skip row)
WORKLOADS: tuple[str, ...] = tuple(_MODULES)
#: every registered workload, in registry order (the demo runs them all)
REGISTERED: tuple[str, ...] = tuple(_MODULES)
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


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

    def param_count(self, cfg: Any) -> int: ...


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
    """The workload names, sorted."""
    return sorted(_MODULES)


def get(name: str) -> Workload:
    """The workload module by name (``ValueError`` naming the known ones when unknown)."""
    if name not in _MODULES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(names())}")
    return importlib.import_module(f"{__package__}.{_MODULES[name]}")  # type: ignore[return-value]


class WorkloadTooLarge(MemoryError):
    """The config needs more memory than the device has (raised before allocating)."""

    def __init__(self, message: str, *, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


# ----------------------------------------------------------------------------------------------
# helpers shared by the workload modules


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


def format_bytes(n: float) -> str:
    """``n`` bytes as a short human string in binary units, e.g. ``'23.4 GiB'``, ``'1.1 TiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: weights and batches are drawn on the CPU so that the same
    seed gives the same numbers on every device, then copied to the device."""
    return torch.Generator(device="cpu").manual_seed(int(seed))


def materialize(model: torch.nn.Module, *, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Give a model built on the ``meta`` device real (uninitialised) storage on ``device``, with
    floating parameters and buffers in ``dtype``; returns the model. The caller then fills the
    weights (and recomputes buffers it wants in another dtype), so a published-size model never
    exists twice (no fp32 copy on the host before a cast and a move)."""
    model.to(dtype=dtype)  # on meta: metadata only (floating parameters and buffers)
    return model.to_empty(device=device)


def build_on_meta(make: Callable[[], torch.nn.Module], *, device: torch.device, dtype: torch.dtype,
                  seed: int) -> torch.nn.Module:
    """``make()`` built on the ``meta`` device, :func:`materialize`-d on ``device`` in ``dtype``, its
    weights then drawn from ``seed`` (the model's ``init_weights(generator)``)."""
    with torch.device("meta"):
        model = make()
    materialize(model, device=device, dtype=dtype)
    model.init_weights(cpu_generator(seed))
    return model


def language_model_terms(cfg: Any, dtype: torch.dtype, batch_size: int | None) -> tuple[int, int, int]:
    """For a language model's memory estimate: bytes per element of ``dtype``, tokens in the batch
    (``cfg.batch_size`` unless given, times ``cfg.seq_len``) and the bytes of the logits with their
    float32 copy, log-softmax and its gradient."""
    e = dtype_size(dtype)
    tokens = (batch_size or cfg.batch_size) * cfg.seq_len
    return e, tokens, tokens * cfg.vocab_size * (e + 3 * 4)


def upcast(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least float32 precision: half types go to float32, float32 and float64 stay."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@torch.no_grad()
def fill_(param: torch.Tensor, values: torch.Tensor) -> None:
    """Copy CPU-drawn ``values`` into ``param`` (cast to its dtype, moved to its device)."""
    param.copy_(values)


def host_available_bytes() -> int | None:
    """Host memory available now (``MemAvailable``), where the OS tells.

    The same reading as :func:`mystique.hostinfo.host_memory_bytes`, kept here because both sides
    must stay leaves: workloads import only torch, and ``hostinfo`` is part of the standalone replay
    runtime, which never imports workloads.
    """
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device: torch.device) -> int | None:
    """Memory available now on ``device`` in bytes (host ``MemAvailable`` for the CPU,
    ``torch.cuda.mem_get_info`` for CUDA), or ``None`` where the backend does not say."""
    if device.type == "cpu":
        return host_available_bytes()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(device.index if device.index is not None else torch.cuda.current_device())
        return int(free)
    backend = getattr(torch, device.type, None)
    if device.type == "mps" and backend is not None and hasattr(backend, "recommended_max_memory"):
        try:
            return int(backend.recommended_max_memory() - backend.driver_allocated_memory())
        except RuntimeError:
            return None
    mem_get_info = getattr(backend, "mem_get_info", None)
    if mem_get_info is not None:
        try:
            return int(mem_get_info(device.index if device.index is not None else 0)[0])
        except (RuntimeError, AssertionError):
            return None
    return None


def check_fits(what: str, needed: int, device: torch.device) -> None:
    """Raise :class:`WorkloadTooLarge` when ``needed`` bytes exceed what ``device`` has available.

    The message names both, e.g. ``"llama3-70b train needs ~1.1 TiB, cpu has 23.4 GiB available"``.
    Does nothing when the device does not report its memory.
    """
    avail = available_bytes(device)
    if avail is not None and needed > avail:
        raise WorkloadTooLarge(
            f"{what} needs ~{format_bytes(needed)}, {device} has {format_bytes(avail)} available",
            needed=needed,
            available=avail,
        )


def _resolve(name: str, config: str, mode: str) -> tuple[Workload, Any]:
    mod = get(name)
    if config not in mod.CONFIGS:
        raise ValueError(f"unknown config {config!r} for workload {name!r}; known: {', '.join(mod.CONFIGS)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    return mod, mod.CONFIGS[config]


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

    Returns a :class:`Step`; ``step.fn()`` runs one step and returns the loss (train) or the model
    output (infer). The same ``seed`` gives the same weights and the same batch on every device.

    Raises ``ValueError`` for an unknown name, config or mode, a non-floating ``dtype`` or a
    ``batch_size`` below 1, and :class:`WorkloadTooLarge` (naming the bytes needed and available)
    before allocating a config the device cannot hold.
    """
    mod, cfg = _resolve(name, config, mode)
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be a floating type; got {dtype}; known: "
                         f"{', '.join(str(d).removeprefix('torch.') for d in _FLOAT_DTYPES)}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1; got {batch_size}")
    dev = torch.device(device)
    needed = mod.memory_bytes(cfg, mode=mode, dtype=dtype, batch_size=batch_size)
    check_fits(f"{name} {config} {mode}", needed, dev)

    model = mod.build_model(cfg, device=dev, dtype=dtype, seed=seed)
    batch = mod.make_batch(cfg, device=dev, seed=seed, batch_size=batch_size)
    optimizer: torch.optim.Optimizer | None = None
    if mode == "train":
        model.train()
        optimizer = mod.make_optimizer(model)
    fn = step_function(mod, model, batch, optimizer, mode)
    return Step(name=name, config_name=config, config=cfg, mode=mode, device=dev, dtype=dtype,
                model=model, batch=batch, optimizer=optimizer, fn=fn)


def step_function(mod: Workload, model: torch.nn.Module, batch: Any, optimizer: torch.optim.Optimizer | None,
                  mode: str) -> Callable[[], torch.Tensor]:
    """One step of ``mod`` on ``model`` (possibly wrapped, e.g. in DDP): ``train`` zeroes the
    gradients, backpropagates the loss, steps ``optimizer`` and returns the detached loss; ``infer``
    puts the model in eval mode and returns the forward output under inference mode."""
    if mode == "train":
        if optimizer is None:
            raise ValueError("a train step needs an optimizer")
        opt = optimizer

        def fn() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            value = mod.loss(model, batch)
            value.backward()
            opt.step()
            return value.detach()

        return fn
    model.eval()

    def infer() -> torch.Tensor:
        with torch.inference_mode():
            return mod.forward(model, batch)

    return infer
