"""The device under test.

A :class:`Target` is a torch device string plus, optionally, a factory of a
``TorchDispatchMode`` that is active only while operators run on the device under test
(``with target.active(): ...``), never while a reference or golden result is computed. The mode
is how a user plugs in a custom backend or a fault simulation (``--inject SPEC``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from . import emulation, faults
from .errors import EnvironmentUnsupported, UsageError
from .hostinfo import device_memory_bytes, host_memory_bytes
from .refs import import_callable

ModeFactory = Callable[[], Any]
# a device type (lower case, as torch spells them) and an optional index without sign or leading zero
_DEVICE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}(?::(?:0|[1-9][0-9]{0,5}))?")
_DEVICE_HINT = "expected e.g. cpu, cuda, cuda:1, xpu, mps"
_MODULE_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


@dataclass(frozen=True)
class DeviceInfo:
    device: str
    name: str
    capability: str
    memory_bytes: int | None


@dataclass(frozen=True)
class Target:
    """Where the code under test runs."""

    device: str = "cpu"
    mode_factory: ModeFactory | None = None
    inject: str | None = None
    emulate: str | None = None  # a profile of mystique.emulation: a foreign device's legal differences

    @property
    def label(self) -> str:
        """Device string as results rows show it: ``cuda:0``, ``cpu+bitflip:rate=1e-3``,
        ``cpu[emulate=cuda]+bitflip``."""
        base = f"{self.device}[emulate={self.emulate}]" if self.emulate else self.device
        return f"{base}+{self.inject}" if self.inject else base

    @property
    def device_type(self) -> str:
        """The device type the code under test behaves as: the emulated one where emulating."""
        return self.emulate or self.device.split(":")[0]

    @property
    def torch_device(self):
        return torch.device(self.device)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Run the enclosed operators as the device under test (the injected mode, if any)."""
        with contextlib.ExitStack() as stack:
            if self.emulate:  # outermost: a fault acts on top of the (emulated) device's own kernels
                stack.enter_context(emulation.make_mode(self.emulate))
            if self.mode_factory is not None:
                stack.enter_context(self.mode_factory())
            yield

    def synchronize(self) -> None:
        synchronize(self.device)

    def info(self) -> DeviceInfo:
        info = device_info(self.device)
        if self.emulate:
            return DeviceInfo(info.device, f"{info.name} (emulating {self.emulate})", info.capability,
                              info.memory_bytes)
        return info

    def without_mode(self) -> Target:
        """The same device with no fault injected: the reference side of a comparison.

        An emulation stays: it stands for the device itself, whose own healthy kernels are the
        reference on a real accelerator too.
        """
        return Target(self.device, emulate=self.emulate)


def synchronize(device: str) -> None:
    kind = device.split(":")[0]
    mod = getattr(torch, kind, None)
    if kind != "cpu" and mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


def parse_device(device: str) -> str:
    """A well-formed device string torch knows, which this machine may lack (UsageError, exit 2, otherwise).

    ``TYPE`` or ``TYPE:INDEX``: the type in lower case as torch spells it, the index a
    non-negative integer without sign or leading zero, no white space anywhere.
    """
    if not isinstance(device, str) or not _DEVICE_RE.fullmatch(device):
        shown = repr(device) if isinstance(device, str) else type(device).__name__
        raise UsageError(f"unknown device {shown}; {_DEVICE_HINT} (a lower-case type and an optional "
                         "index, no spaces)")
    try:
        with warnings.catch_warnings():  # torch warns about deprecated types (mkldnn): one line stays one
            warnings.simplefilter("ignore")
            dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"unknown device {device!r}: torch {torch.__version__} has no device type "
                         f"{device.split(':')[0]!r}; {_DEVICE_HINT}") from None
    return str(dev)


def check_device(device: str) -> str:
    """Validate a device string: exit 2 when malformed or a type torch does not know, exit 3 when the
    device is absent from this machine."""
    device = parse_device(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dev = torch.device(device)
    if dev.type in ("cpu", "meta"):
        return device
    backend = getattr(torch, dev.type, None)
    try:
        available = backend is not None and bool(getattr(backend, "is_available", lambda: False)())
        count = int(getattr(backend, "device_count", lambda: 1)()) if available else 0
    except Exception as exc:  # a backend whose probe fails (a broken driver) is an absent device
        raise EnvironmentUnsupported(f"device {device} is not available on this machine "
                                     f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    if not available:
        raise EnvironmentUnsupported(f"device {device} is not available on this machine")
    if dev.index is not None and dev.index >= count:
        raise EnvironmentUnsupported(f"device {device} is not available: this machine has {count} {dev.type} device(s)")
    return device


def resolve_inject(spec: str) -> ModeFactory:
    """Turn ``--inject SPEC`` into a mode factory.

    SPEC is a built-in fault simulation ``NAME`` or ``NAME:key=value,...`` (``mystique faults``
    lists them), or ``package.module:factory`` naming a callable of no arguments that returns a
    ``TorchDispatchMode``.
    """
    faults.load_builtin()
    spec = spec.strip()
    head, _, tail = spec.partition(":")
    if head in faults.FAULTS:
        return faults.make_factory(head, faults.parse_params(tail, head))
    if not _MODULE_RE.match(head) or not tail or not tail.isidentifier():
        known = ", ".join(sorted(faults.FAULTS)) or "none yet"
        raise UsageError(
            f"--inject {spec!r} is neither a built-in fault simulation ({known}) nor package.module:factory"
        )
    return import_callable(head, tail, f"--inject {spec!r}")


def make_target(device: str = "cpu", inject: str | None = None, emulate: str | None = None) -> Target:
    """Build a Target from CLI-style strings, validating each (UsageError, exit 2)."""
    device = check_device(device)
    factory = resolve_inject(inject) if inject else None
    if emulate:
        emulate = emulate.strip()
        emulation.differences(emulate)  # an unknown profile is refused before anything runs
    return Target(device, factory, inject.strip() if inject else None, emulate or None)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_info(device: str) -> DeviceInfo:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index or 0
        props = torch.cuda.get_device_properties(idx)
        return DeviceInfo(device, props.name, f"sm_{props.major}{props.minor}", props.total_memory)
    if dev.type == "cpu":
        return DeviceInfo(device, _cpu_name(), f"{platform.machine()} x{os.cpu_count()}", host_memory_bytes())
    return DeviceInfo(device, dev.type, "", device_memory_bytes(device))
