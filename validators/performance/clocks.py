"""Clock sampling while a workload runs: throttling evidence.

:class:`ClockSampler` samples in a background thread every ``interval_s``:

* NVIDIA GPUs through NVML (``pynvml`` from the optional ``nvidia-ml-py``, extra ``[nvml]``): SM and
  memory clocks (MHz), power (W), temperature (C), the clock-throttle reason bits and the GPU
  utilisation (``gpu_util_pct``: the share of NVML's last sample period, 1/6 s to 1 s, in which a
  kernel ran). The GPU is found by its PCI bus id, so ``CUDA_VISIBLE_DEVICES`` renumbering does not
  point NVML at another device;
* CPUs: the current frequency (MHz) of the CPUs this process may run on, from
  ``/sys/devices/system/cpu/cpuN/cpufreq/scaling_cur_freq`` or else ``/proc/cpuinfo``'s ``cpu MHz``
  (without cpufreq, as on most VMs, a constant nominal figure: the sampler's ``static`` says so and
  no verdict is drawn from it). A reading that fails is NaN.

``samples`` holds ``(seconds since start, {metric: value})``; ``source`` names what was read, or
why nothing could be (no NVML, no readable frequency); ``static`` why the clock read cannot change
(empty when it can); ``failure`` why sampling stopped early (a reading raised; empty otherwise).
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

_MHZ = re.compile(r"^cpu MHz\s*:\s*([0-9.]+)", re.M)
PROC_CPUINFO = "/proc/cpuinfo cpu MHz"
#: why a CPU clock read from /proc/cpuinfo cannot show a drop (the sampler's ``static``)
STATIC_CPUINFO = ("no cpufreq in sysfs: /proc/cpuinfo's cpu MHz is then the kernel's fixed calibration figure on most "
                  "hosts (every virtual machine without cpufreq), a constant that cannot show the clock drop")
# NVML clock-throttle reason bits that mean the device slowed itself (not idle or app clocks)
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def cpu_mhz() -> tuple[float | None, str]:
    """(mean current MHz of this process's CPUs, source) or (None, why not)."""
    cpus = _cpus()
    vals = []
    for c in cpus:
        p = Path(f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq")
        try:
            vals.append(int(p.read_text().strip()) / 1000.0)
        except (OSError, ValueError):
            break
    if vals and len(vals) == len(cpus):
        return sum(vals) / len(vals), "sysfs scaling_cur_freq"
    try:
        found = [float(x) for x in _MHZ.findall(Path("/proc/cpuinfo").read_text())]
    except OSError:
        found = []
    if found:
        chosen = [found[c] for c in cpus if c < len(found)] or found
        return sum(chosen) / len(chosen), PROC_CPUINFO
    return None, "no CPU frequency readable (no cpufreq in sysfs, no cpu MHz in /proc/cpuinfo)"


class _Nvml:
    """NVML readings of one GPU (index ``index``)."""

    def __init__(self, index: int, pci_bus_id: str | None = None):
        import pynvml  # optional: nvidia-ml-py (extra [nvml])

        pynvml.nvmlInit()
        self.nv = pynvml
        # torch numbers the devices CUDA_VISIBLE_DEVICES leaves, NVML every device: the bus id names one
        self.handle = None
        if pci_bus_id:
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
            except pynvml.NVMLError:  # (a bus id format this driver does not take: the index, as before)
                self.handle = None
        if self.handle is None:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict[str, float]:
        nv, h = self.nv, self.handle
        out = {"sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
               "mem_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
               "temperature_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))}
        try:
            out["power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except nv.NVMLError:
            pass
        try:
            out["throttle_reasons"] = float(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        except (nv.NVMLError, AttributeError):
            pass
        try:
            out["gpu_util_pct"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        except (nv.NVMLError, AttributeError):
            pass
        return out


def _pci_bus_id(dev: Any) -> str | None:
    """The PCI bus id (``domain:bus:device.0``) torch reports for a CUDA device, or None."""
    import torch

    try:
        p = torch.cuda.get_device_properties(dev)
        return f"{int(p.pci_domain_id):08X}:{int(p.pci_bus_id):02X}:{int(p.pci_device_id):02X}.0"
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


def throttle_names(samples: list[tuple[float, dict[str, float]]]) -> list[str]:
    """The throttle reasons (:data:`THROTTLE_BITS`) seen in any of ``samples``."""
    bits = 0
    for _, v in samples:
        bits |= int(v.get("throttle_reasons", 0))
    return [name for bit, name in THROTTLE_BITS.items() if bits & bit]


def median_of(samples: list[tuple[float, dict[str, float]]], metric: str) -> float | None:
    """The median of ``metric`` over the samples that carry it, or None."""
    vals = sorted(v[metric] for _, v in samples if metric in v)
    return vals[len(vals) // 2] if vals else None


def describe(samples: list[tuple[float, dict[str, float]]], source: str) -> str:
    """One phrase for a row's detail: the clocks, power and throttle reasons while the calls ran."""
    parts = []
    clock = "sm_clock_mhz" if any("sm_clock_mhz" in v for _, v in samples) else "cpu_mhz"
    vals = [v[clock] for _, v in samples if clock in v]
    if vals:
        parts.append(f"{'SM' if clock == 'sm_clock_mhz' else 'CPU'} clock median {median_of(samples, clock):.0f} MHz "
                     f"({min(vals):.0f}-{max(vals):.0f})")
    power = median_of(samples, "power_w")
    if power is not None:
        parts.append(f"power median {power:.0f} W")
    temp = median_of(samples, "temperature_c")
    if temp is not None:
        parts.append(f"{temp:.0f} C")
    named = throttle_names(samples)
    if named:
        parts.append(f"throttle reasons: {', '.join(named)}")
    if not parts:
        return f"no clock evidence ({source})"
    return f"during these calls {', '.join(parts)} ({len(samples)} samples, {source})"


class ClockSampler:
    """Samples clocks in a thread between ``start()`` and ``stop()``."""

    def __init__(self, device: str, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read: Any = None
        self.source = ""
        self.static = ""  # why the clock read cannot change whatever the device does ("" when it can)
        self.failure = ""  # why sampling stopped early ("" when it did not)
        kind = device.split(":")[0]
        if kind == "cuda":
            try:
                import torch

                dev = torch.device(device)
                index = dev.index if dev.index is not None else torch.cuda.current_device()
                self._read = _Nvml(index, _pci_bus_id(index)).read
                self.source = "NVML"
            except ImportError:
                self.source = "no NVML: install nvidia-ml-py (pip install 'mystique-suite[nvml]')"
            except Exception as exc:  # an NVML error of any kind: no evidence, said so in the rows
                self.source = f"NVML unavailable: {type(exc).__name__}: {exc}"
        elif kind == "cpu":
            mhz, why = cpu_mhz()
            self.source = why
            self.static = STATIC_CPUINFO if why == PROC_CPUINFO else ""
            if mhz is not None:
                self._read = lambda: {"cpu_mhz": cpu_mhz()[0] or float("nan")}
        else:
            self.source = f"no clock source for device type {kind}"

    @property
    def available(self) -> bool:
        return self._read is not None

    def _loop(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter() - t0, self._read()))
            except Exception as exc:  # a reading that fails mid-run ends sampling, said so
                self.failure = f"sampling stopped: {type(exc).__name__}: {exc}"
                self.source += f"; {self.failure}"
                return
            self._stop.wait(self.interval_s)

    def start(self) -> ClockSampler:
        if self.available:
            self._thread = threading.Thread(target=self._loop, name="mystique-clocks", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        return self.samples
