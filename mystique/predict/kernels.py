"""Device work of each operator from a Kineto trace: its kernels (name, stream, duration, where in
the operator's host span it was launched) and the points where its host thread waited for the device.

Kernels (``cat`` ``kernel``/``gpu_memcpy``/``gpu_memset``) link to the CPU operator whose ``External
id`` they carry, or through the runtime launch with the same ``correlation`` (as
:mod:`mystique.trace.kineto` joins them); the launch's start within the operator's span gives the
kernel's launch point as a fraction of the operator's host time. A runtime call that blocks the
host until the device is done (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
``cudaEventSynchronize``, a synchronous ``cudaMemcpy``; their HIP names alike) is a sync point of the
operator it ran in. Events from an untrusted file that lack a field or carry a wrong type are left
out, never guessed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from ..trace.kineto import CPU_CATEGORIES, DEVICE_CATEGORIES, RUNTIME_CATEGORIES

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy")


@dataclass
class Kernel:
    name: str
    stream: str
    dur_us: float
    launch: float  # fraction of the operator's host time at which it was launched, 0..1


@dataclass
class DeviceWork:
    """Per record-function id: kernels launched (in launch order) and sync points (fractions)."""

    kernels: dict[int, list[Kernel]] = field(default_factory=dict)
    syncs: dict[int, list[float]] = field(default_factory=dict)
    unlinked: int = 0


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _frac(ts: float, span: tuple[float, float]) -> float:
    a, b = span
    return min(max((ts - a) / (b - a), 0.0), 1.0) if b > a else 0.0


def device_work(doc: Any) -> DeviceWork:
    """Collect :class:`DeviceWork` from a decoded Kineto document (events of other shapes ignored)."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    out = DeviceWork()
    if not isinstance(events, list):
        return out
    span_of_rf: dict[int, tuple[float, float]] = {}
    rf_of_ext: dict[int, int] = {}
    launches: dict[int, tuple[int | None, float, Any]] = {}  # correlation -> (external id, ts, thread)
    kernels: list[tuple[float, str, str, float, int | None, int | None]] = []
    syncs: list[tuple[float, Any, int | None]] = []
    host_spans: dict[Any, list[tuple[float, float, int]]] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        ts, dur, cat, name = _num(ev.get("ts")), _num(ev.get("dur")), ev.get("cat"), ev.get("name")
        if ts is None or dur is None or not isinstance(name, str):
            continue
        thread = (str(ev.get("pid")), str(ev.get("tid")))
        if cat in CPU_CATEGORIES:
            rf, ext = _int(args.get("Record function id")), _int(args.get("External id"))
            if rf is not None:
                span_of_rf.setdefault(rf, (ts, ts + dur))
                host_spans.setdefault(thread, []).append((ts, ts + dur, rf))
                if ext is not None:
                    rf_of_ext.setdefault(ext, rf)
        elif cat in RUNTIME_CATEGORIES:
            corr = _int(args.get("correlation"))
            if corr is not None:
                launches.setdefault(corr, (_int(args.get("External id")), ts, thread))
            if name.startswith(SYNC_CALLS):
                syncs.append((ts, thread, _int(args.get("External id"))))
        elif cat in DEVICE_CATEGORIES:
            stream = args.get("stream", ev.get("tid"))
            kernels.append((ts, name, str(stream if isinstance(stream, (int, str)) else "?"), dur,
                            _int(args.get("External id")), _int(args.get("correlation"))))
    starts = {}
    for k, lst in host_spans.items():
        lst.sort()
        starts[k] = [s[0] for s in lst]

    def innermost(thread: Any, ts: float) -> int | None:
        lst = host_spans.get(thread, [])
        i = bisect.bisect_right(starts.get(thread, []), ts)
        for j in range(i - 1, max(-1, i - 257), -1):
            if lst[j][0] <= ts <= lst[j][1]:
                return lst[j][2]
        return None

    kernels.sort(key=lambda k: k[0])
    for _ts, name, stream, dur, ext, corr in kernels:
        launch = launches.get(corr) if corr is not None else None
        rf = rf_of_ext.get(ext) if ext is not None else None
        if rf is None and launch is not None:
            rf = rf_of_ext.get(launch[0]) if launch[0] is not None else innermost(launch[2], launch[1])
        if rf is None or rf not in span_of_rf:
            out.unlinked += 1
            continue
        at = _frac(launch[1], span_of_rf[rf]) if launch is not None else 0.0
        out.kernels.setdefault(rf, []).append(Kernel(name, stream, dur, at))
    for ts, thread, ext in syncs:
        rf = rf_of_ext.get(ext) if ext is not None else innermost(thread, ts)
        if rf is not None and rf in span_of_rf:
            out.syncs.setdefault(rf, []).append(_frac(ts, span_of_rf[rf]))
    return out


__all__ = ["SYNC_CALLS", "DeviceWork", "Kernel", "device_work"]
