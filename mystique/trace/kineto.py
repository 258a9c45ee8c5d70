"""Join a Kineto (``torch.profiler`` Chrome-trace) file to an execution trace by ``rf_id``.

Kineto writes every recorded CPU operator as a complete event (``"ph": "X"``, ``"cat":
"cpu_op"``; ``record_function`` regions as ``"user_annotation"``) with its duration ``dur`` in
microseconds and ``"args": {"Record function id": N, "External id": E, ...}``. ``N`` is the
same record-function id the execution trace observer stores as ``rf_id`` on the node (a profile
with ``execution_trace_observer=`` gives a Kineto file whose every ``cpu_op``/``user_annotation``
event names the ET node with that ``rf_id``).

Device time (best effort): device events (``"cat"`` ``kernel``, ``gpu_memcpy``, ``gpu_memset``)
carry ``"correlation"`` (the CUDA/HIP runtime launch's correlation id) and usually ``"External
id"`` (the external id of the CPU operator that was innermost at launch). A device event is
attributed to the CPU operator with that external id; without one, through the runtime event
(``cuda_runtime``/``cuda_driver``/``hip_runtime``) that has the same ``correlation`` and an
``External id``; failing that, through the innermost CPU operator on the runtime event's
thread whose time span contains the launch. Events that link nowhere are counted in
``unlinked_device_events``. Older Kineto files without ``Record function id`` cannot be joined:
the maps come back empty.

Step spans: every ``ProfilerStep#N`` region (a ``user_annotation`` or ``cpu_op`` event of that
name) gives ``steps_us[N]``, its host span in microseconds (summed when a step appears more than
once), and ``device_steps_us[N]`` the summed duration of the device events that started inside
that span (the step's device busy time). These need no record-function id, so a foreign Kineto
file without one still gives the step's recorded time.
"""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .files import in_folder, read_json_document

KINETO_FILE_NAMES = ("kineto.json.gz", "kineto.json")
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation", "Operator", "operator"})
DEVICE_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime", "xpu_runtime"})


@dataclass
class KinetoTimes:
    """Times from one Kineto trace, keyed by record-function id (the ET's ``rf_id``).

    ``cpu_us``: host duration of the operator (microseconds, summed if it appears more than
    once); ``device_us``: summed duration of the device events it launched itself (not those of
    nested operators: roll up over the ET subtree for that); ``names``: the event name per rf_id.
    """

    cpu_us: dict[int, float]
    device_us: dict[int, float]
    names: dict[int, str] = field(default_factory=dict)
    unlinked_device_events: int = 0
    steps_us: dict[int, float] = field(default_factory=dict)
    device_steps_us: dict[int, float] = field(default_factory=dict)
    # rf_id -> (start, end) of the operator's first event, in the trace's microseconds: the host
    # timeline (gaps between ops) that pacing reproduces
    cpu_spans_us: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def has_device_events(self) -> bool:
        return bool(self.device_us) or any(v > 0 for v in self.device_steps_us.values())


_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


def resolve_kineto_path(path: str | os.PathLike) -> Path:
    """Return the Kineto file ``path`` names: the file, or ``kineto.json[.gz]`` in a trace folder."""
    p = in_folder(path, KINETO_FILE_NAMES)
    if not p.is_file():
        raise UsageError(f"{p}: no such Kineto trace file")
    return p


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _thread(ev: dict) -> tuple[Any, Any]:
    """The (pid, tid) key of an event; a list or object there (an untrusted file) stands as its type name."""
    pid, tid = ev.get("pid"), ev.get("tid")
    return (pid if isinstance(pid, (int, str, float, type(None))) else f"<{type(pid).__name__}>",
            tid if isinstance(tid, (int, str, float, type(None))) else f"<{type(tid).__name__}>")


def parse_kineto_document(doc: Any, source: str = "<kineto>") -> KinetoTimes:
    """Build :class:`KinetoTimes` from a decoded Kineto JSON document (see :func:`read_kineto`)."""
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
    elif isinstance(doc, list):  # the bare-array form of the Chrome trace format
        events = doc
    else:
        events = None
    if not isinstance(events, list):
        raise UsageError(f"{source}: no 'traceEvents' list: not a Kineto/Chrome trace")
    seen = _Events()
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "X":
            seen.add(ev)
    device, unlinked = seen.device_times()
    steps, device_steps = seen.step_times()
    return KinetoTimes(cpu_us=seen.cpu, device_us=device, names=seen.names, unlinked_device_events=unlinked,
                       steps_us=steps, device_steps_us=device_steps, cpu_spans_us=seen.first_span)


class _Events:
    """What one pass over a Kineto file's complete events collects, and the joins made from it."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.first_span: dict[int, tuple[float, float]] = {}
        self.rf_of_external: dict[int, int] = {}
        self.external_of_corr: dict[int, int] = {}
        self.launch_of_corr: dict[int, tuple[Any, float]] = {}  # runtime events without an external id
        self.spans: dict[Any, list[tuple[float, float, int]]] = {}  # (pid, tid) -> [(start, end, rf_id)]
        self.device_events: list[tuple[float, int | None, int | None]] = []
        self.device_starts: list[tuple[float, float]] = []  # (ts, dur) of every device event
        self.step_spans: list[tuple[float, float, int]] = []  # (start, end, N) of ProfilerStep#N regions

    def add(self, ev: dict) -> None:
        cat = ev.get("cat")
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        dur = _num(ev.get("dur"))
        name = ev.get("name")
        if isinstance(name, str) and dur is not None and cat not in DEVICE_CATEGORIES and name.startswith("ProfilerStep#"):
            m = _STEP_NAME.match(name)
            ts = _num(ev.get("ts"))
            if m and ts is not None:
                self.step_spans.append((ts, ts + dur, int(m.group(1))))
        if cat in CPU_CATEGORIES:
            self._cpu_op(ev, args, dur)
        elif cat in RUNTIME_CATEGORIES:
            corr = _int(args.get("correlation"))
            ext = _int(args.get("External id"))
            if corr is not None and ext is not None:
                self.external_of_corr.setdefault(corr, ext)
            elif corr is not None and _num(ev.get("ts")) is not None:
                self.launch_of_corr.setdefault(corr, (_thread(ev), float(ev["ts"])))
        elif cat in DEVICE_CATEGORIES and dur is not None:
            self.device_events.append((dur, _int(args.get("External id")), _int(args.get("correlation"))))
            ts = _num(ev.get("ts"))
            if ts is not None:
                self.device_starts.append((ts, dur))

    def _cpu_op(self, ev: dict, args: dict, dur: float | None) -> None:
        rf = _int(args.get("Record function id"))
        if rf is None or dur is None:
            return
        self.cpu[rf] = self.cpu.get(rf, 0.0) + dur
        ts = _num(ev.get("ts"))
        if ts is not None:
            self.spans.setdefault(_thread(ev), []).append((ts, ts + dur, rf))
            self.first_span.setdefault(rf, (ts, ts + dur))
        if isinstance(ev.get("name"), str):
            self.names.setdefault(rf, ev["name"])
        ext = _int(args.get("External id"))
        if ext is not None:
            self.rf_of_external.setdefault(ext, rf)

    def device_times(self) -> tuple[dict[int, float], int]:
        """rf_id -> summed duration of the device events it launched, and the unlinked events' count."""
        for lst in self.spans.values():
            lst.sort()
        starts = {key: [s[0] for s in lst] for key, lst in self.spans.items()}
        device: dict[int, float] = {}
        unlinked = 0
        for dur, ext, corr in self.device_events:
            rf = self.rf_of_external.get(ext) if ext is not None else None
            if rf is None and corr is not None:
                ext2 = self.external_of_corr.get(corr)
                rf = self.rf_of_external.get(ext2) if ext2 is not None else None
                if rf is None and corr in self.launch_of_corr:
                    thread, ts = self.launch_of_corr[corr]
                    rf = _innermost(self.spans.get(thread, []), starts.get(thread, []), ts)
            if rf is None:
                unlinked += 1
                continue
            device[rf] = device.get(rf, 0.0) + dur
        return device, unlinked

    def step_times(self) -> tuple[dict[int, float], dict[int, float]]:
        """Step N -> its host span, and the summed duration of the device events started inside it."""
        steps: dict[int, float] = {}
        device_steps: dict[int, float] = {}
        self.device_starts.sort()
        dev_ts = [d[0] for d in self.device_starts]
        for start, end, n in self.step_spans:
            steps[n] = steps.get(n, 0.0) + (end - start)
            i, j = bisect.bisect_left(dev_ts, start), bisect.bisect_right(dev_ts, end)
            if self.device_starts:
                device_steps[n] = device_steps.get(n, 0.0) + sum(d for _, d in self.device_starts[i:j])
        return steps, device_steps


_MAX_BACKTRACK = 256


def _innermost(spans: list[tuple[float, float, int]], starts: list[float], ts: float) -> int | None:
    """Return the rf_id of the latest-starting span (sorted by start) that contains ``ts``."""
    i = bisect.bisect_right(starts, ts)
    for k in range(i - 1, max(-1, i - 1 - _MAX_BACKTRACK), -1):
        start, end, rf = spans[k]
        if start <= ts <= end:
            return rf
    return None


def read_kineto(path: str | os.PathLike) -> KinetoTimes:
    """Read a Kineto trace (``.json``, ``.json.gz`` or a trace folder) into :class:`KinetoTimes`."""
    p = resolve_kineto_path(path)
    return parse_kineto_document(read_json_document(p, what="Kineto trace"), source=str(p))


def load_kineto(path: str | os.PathLike) -> dict[int, float]:
    """Return rf_id -> host (CPU) duration in microseconds from a Kineto trace file or folder."""
    return read_kineto(path).cpu_us


def load_kineto_device_times(path: str | os.PathLike) -> dict[int, float]:
    """Return rf_id -> summed device-kernel duration (us) of the kernels each operator launched."""
    return read_kineto(path).device_us


__all__ = [
    "KinetoTimes",
    "load_kineto",
    "load_kineto_device_times",
    "parse_kineto_document",
    "read_kineto",
    "resolve_kineto_path",
]
