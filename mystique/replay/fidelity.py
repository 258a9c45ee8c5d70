"""How faithful a replay is in time: paired with the original step where it can run, else recorded.

**Paired** (the default where the original can run): the captured step is rebuilt in this process
(:func:`mystique.capture.rebuild_step`: a built-in workload with the captured config, mode, dtype
and seed, or the ``package.module:function`` factory the user names with ``--original``; a factory
that only the plan or capture folder names is data, never imported), and it alternates with
the replayed plan in ABBA rounds (:func:`mystique.timing.paired_rounds`) under the same thread
count, allocator and host load. The figure is the median paired ratio replay / original with its
95% interval, and the verdict comes from the interval (:func:`mystique.timing.verdict`).

**Recorded** (a trace from elsewhere, an obfuscated or transformed benchmark, or ``--timing
recorded``): the replay is compared with what the trace recorded: the capture's median step time
(``capture.json``) or the Kineto ``ProfilerStep`` span, and per op the Kineto host or device time.
That is a measurement (``info``), never a verdict: the two sides ran at different times, in
different processes, maybe on different hosts.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..capture import StepNotImported, rebuild_step, shown_target
from ..errors import EnvironmentUnsupported, UsageError
from ..timing import Paired, loadavg, paired_rounds
from ..timing import verdict as interval_verdict
from .plan import Plan
from .runtime import CollectiveHandler, Executor, synchronize

RATIO_LOW, RATIO_HIGH = 0.90, 1.10
TIMINGS = ("auto", "paired", "recorded")
PACINGS = ("none", "recorded")
# transforms after which the benchmark no longer replays the captured step as it ran
_CHANGING = ("filter", "batch_scale", "obfuscate")


def _kind(device: Any) -> str:
    return str(device or "cpu").split(":")[0]


def original_step(plan: Plan) -> dict[str, Any] | None:
    """The plan's description of the captured step (``metadata["original_step"]``), or None."""
    spec = plan.metadata.get("original_step")
    return spec if isinstance(spec, dict) and spec.get("target") else None


def why_not_paired(plan: Plan, device: str, collective_handler: CollectiveHandler | None = None,
                   original: str | None = None) -> str | None:
    """Why the original step cannot run beside this replay (None: it can, as far as the plan says);
    ``collective_handler``: the replay's (a multi-rank replay, whose original step needs its process
    group); ``original``: the ``package.module:function`` the user named (``--original``), which
    stands in where the plan describes no step."""
    spec = original_step(plan)
    if spec is None and original is not None and not plan.metadata.get("obfuscated"):
        spec = {"target": original, "device": device}  # the user's own step, built on this device
    if plan.metadata.get("obfuscated"):
        return "an obfuscated benchmark does not name the captured step"
    if spec is None:
        return ("no capture.json description of the original step (a trace from elsewhere, a multi-rank "
                "capture, or a benchmark generated without one): nothing to run beside the replay")
    for t in plan.metadata.get("transforms") or []:
        if not isinstance(t, dict):
            continue
        changed = [k for k in _CHANGING if k in t]
        if "dtype" in t and t["dtype"] != spec.get("dtype"):
            changed.append(f"dtype {t['dtype']}")
        if changed:
            return f"the benchmark was transformed ({', '.join(changed)}): it no longer replays the captured step"
    if _kind(spec.get("device")) != _kind(device):
        return f"captured on {spec.get('device')}, replayed on {device}: not the step that was captured"
    if collective_handler is not None:
        return "a multi-rank replay: the original step needs its process group"
    return None


def rebuild_original(plan: Plan, device: str, timing: str, collective_handler: CollectiveHandler | None = None,
                     original: str | None = None) -> tuple[Callable[[], Any] | None, str]:
    """``(step, "")`` when the original step is rebuilt here for paired timing, else ``(None, why)``.

    ``timing``: ``auto`` (paired where possible), ``paired`` (UsageError when impossible) or
    ``recorded`` (never rebuilt); ``collective_handler``: see :func:`why_not_paired`; ``original``:
    the ``package.module:function`` the user named (``--original``). A step the plan names that is
    not a built-in workload is never imported: ``why`` says to pass ``--original`` (the hint).
    """
    if timing not in TIMINGS:
        raise UsageError(f"unknown timing {timing!r}; expected one of {', '.join(TIMINGS)}")
    if timing == "recorded":
        return None, "--timing recorded"
    why = why_not_paired(plan, device, collective_handler, original)
    if why is None:
        spec = original_step(plan) or {"target": original}
        shown = original or shown_target(spec.get("target"))
        try:
            return rebuild_step(spec, device, original), ""
        except StepNotImported as exc:
            why = str(exc)
        except (UsageError, EnvironmentUnsupported) as exc:
            why = f"cannot rebuild {shown}: {exc}"
        except Exception as exc:  # noqa: BLE001 - the user's factory, or out of device memory beside the plan
            why = f"cannot rebuild {shown}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if timing == "paired":
        raise UsageError(f"--timing paired: {why}")
    return None, why


def measure_paired(e: Executor, step: Callable[[], Any], device: str, *, half_width: float,
                   time_cap_s: float, min_rounds: int, min_warmup: int,
                   progress: Callable[[str], None] | None = None,
                   threads_note: dict[str, Any] | None = None,
                   between: Callable[[], Any] | None = None) -> Paired:
    """Alternate the replay (``a``) and the original step (``b``) in ABBA rounds (see module doc).

    Both sides are timed between device synchronisations (CUDA events on a GPU, wall time beside);
    the replay's ``run_iteration`` drops its intermediates at the end, so neither side holds the
    other's memory. On the CPU with the thread count chosen here (``threads_note`` from
    :func:`busy_host_threads`, not asked for), the host is watched between rounds: when other
    processes come to keep cores busy that these threads need, the rounds start again (warm-up
    included) with the free cores' count on both sides; ``threads_note`` records it (``restarts``).
    ``between``: also called between rounds (the CPU placement's sweep of threads started since)."""

    dev = e.device
    watch = None
    if dev.type == "cpu" and threads_note is not None and threads_note.get("threads_reason") != "as asked (threads=)":
        watch = _HostWatch()
    while True:
        try:
            return paired_rounds(e.run_iteration, step, device=str(dev), sync=device_sync(dev),
                                 half_width=half_width, time_cap_s=time_cap_s, min_rounds=max(6, min_rounds),
                                 min_warmup=min_warmup, progress=progress,
                                 between=_calls(watch.check if watch is not None else None, between))
        except HostBusy as busy:
            assert threads_note is not None
            cur = torch.get_num_threads()
            torch.set_num_threads(busy.free)
            threads_note.setdefault("restarts", []).append(
                {"after_s": round(busy.after_s, 1), "threads_from": cur, "threads_to": busy.free,
                 "cores_busy_other": busy.others})
            threads_note["threads_reason"] = (
                f"{busy.others:.1f} of the host's cores came to be busy with other processes after "
                f"{busy.after_s:.0f} s: the rounds started again with {busy.free} thread(s) on both sides instead "
                f"of {cur} (oversubscribed threads turn the step time into the scheduler's noise)")
            if progress:
                progress(threads_note["threads_reason"])
            # at most two restarts: each costs a warm-up and up to the time cap again
            watch = _HostWatch() if busy.free > 1 and len(threads_note["restarts"]) < 2 else None


def _calls(*fns: Callable[[], Any] | None) -> Callable[[], None] | None:
    """One callable calling each of ``fns`` that is not None, in order; None when all are."""
    live = [f for f in fns if f is not None]
    if not live:
        return None

    def call() -> None:
        for f in live:
            f()
    return call


class HostBusy(Exception):
    """Raised between rounds when other processes keep busy cores this process's threads need."""

    def __init__(self, free: int, others: float, after_s: float):
        super().__init__(f"{others:.1f} cores busy with other processes; {free} free")
        self.free, self.others, self.after_s = free, others, after_s


class _HostWatch:
    """Between paired rounds on the CPU: every ``period_s``, how many cores other processes used
    (all CPUs' busy time from /proc/stat less this process's own CPU time); :class:`HostBusy` when
    that leaves fewer free cores than this process runs threads, in two successive periods."""

    def __init__(self, period_s: float = 1.0):
        self.period = period_s
        self.start = time.perf_counter()
        self.next = self.start + period_s
        self.last = (_cpu_times(), os.times())
        self.strikes = 0

    def check(self) -> None:
        now = time.perf_counter()
        if now < self.next:
            return
        t0, c0 = self.last
        t1, c1 = _cpu_times(), os.times()
        self.last, self.next = (t1, c1), now + self.period
        if t0 is None or t1 is None or t1[1] <= t0[1]:
            return
        free, others = _free_from(t0, t1, c0, c1)
        threads = torch.get_num_threads()
        self.strikes = self.strikes + 1 if free < threads else 0
        if self.strikes >= 2:
            raise HostBusy(free, others, now - self.start)


def _cpu_times() -> tuple[float, float, int] | None:
    """(busy, total) jiffies over all CPUs and the number of CPUs, from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    head = lines[0].split()
    if not head or head[0] != "cpu":
        return None
    v = [float(x) for x in head[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0.0)  # idle + iowait
    total = sum(v[:8])  # guest times are already inside user/nice
    n = sum(1 for ln in lines[1:] if ln.startswith("cpu") and ln[3:4].isdigit())
    return total - idle, total, n


def free_cores(window_s: float = 0.3) -> tuple[int | None, float | None]:
    """``(cores free for this process, cores other processes keep busy)`` measured over ``window_s``
    while this process waits; ``(None, None)`` where /proc/stat is not readable.

    A core counts as busy when other processes use at least half of it. The free count is at least
    1 and at most the cores this process may run on."""

    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = os.cpu_count() or 1
    time.sleep(0.05)  # let this process's worker threads stop spinning
    t0 = _cpu_times()
    c0 = os.times()
    time.sleep(window_s)
    t1 = _cpu_times()
    c1 = os.times()
    if t0 is None or t1 is None or t1[1] <= t0[1]:
        return None, None
    return _free_from(t0, t1, c0, c1, mine)


BUSY_CORE = 0.3  # other processes' share of a core from which it counts as busy


def _free_from(t0: tuple[float, float, int], t1: tuple[float, float, int], c0: Any, c1: Any,
               mine: int | None = None) -> tuple[int, float]:
    """(free cores, cores other processes used) between two /proc/stat and os.times() samples."""

    if mine is None:
        try:
            mine = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            mine = os.cpu_count() or 1
    ncpu = t1[2] or mine
    busy = (t1[0] - t0[0]) / (t1[1] - t0[1]) * ncpu
    ours = ((c1.user - c0.user) + (c1.system - c0.system)) / max(c1.elapsed - c0.elapsed, 1e-9)
    others = max(0.0, busy - ours)
    busy_cores = math.ceil(others - BUSY_CORE) if others > BUSY_CORE else 0
    return max(1, min(mine, ncpu - busy_cores)), round(others, 2)


def busy_host_threads(target: Any, asked: int | None, note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Before paired rounds on the CPU: run both sides with no more intra-op threads than the cores
    other processes leave free (unless ``--threads`` was given: ``asked``).

    With more threads than free cores, every parallel region waits at its barrier for a thread the
    scheduler has parked behind another process: on a 2-core host with one core busy, dlrm/small/infer
    took 17-300 ms a step with 2 threads (paired half-width 15% after 70 rounds) and a steady 28 ms
    with 1 (half-width 1% after 10 rounds). Both sides run with the same setting, so the ratio still
    compares like with like; ``timing`` says which setting and why. Returns the keys it adds there."""

    if target.torch_device.type != "cpu":
        return {}
    cur = torch.get_num_threads()
    out: dict[str, Any] = {"threads_captured": cur}
    if asked is not None:
        out["threads_reason"] = "as asked (threads=)"
        return out
    free, others = free_cores()
    out.update(cores_free=free, cores_busy_other=others)
    if free is not None and others is not None and free < cur:
        torch.set_num_threads(free)
        out["threads_reason"] = (f"{others:.1f} of the host's cores busy with other processes: both sides run with "
                                  f"{free} thread(s) instead of {cur} (oversubscribed threads turn the step time "
                                  f"into the scheduler's noise)")
        if note:
            note(out["threads_reason"])
    else:
        out["threads_reason"] = "the captured setting (capped at the cores available)"
    return out


def device_sync(dev: Any) -> Callable[[], None]:
    """A function that waits for everything queued on ``dev`` (that very CUDA device, not the current one)."""

    dev = torch.device(dev)
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: synchronize(dev)


def gpu_clocks(device: str) -> dict[str, Any] | None:
    """SM and memory clocks (MHz) and the GPU's name where NVML answers; None elsewhere (silently)."""
    if _kind(device) != "cuda":
        return None
    try:

        if not torch.cuda.is_available():
            return None
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        out: dict[str, Any] = {"name": torch.cuda.get_device_name(index)}
    except Exception:  # noqa: BLE001 - clocks are a courtesy
        return None
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out["sm_clock_mhz"] = int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
        out["mem_clock_mhz"] = int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
        out["sm_clock_max_mhz"] = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
        try:
            out["temperature_c"] = int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
        except Exception:  # noqa: BLE001
            pass
        return out
    except Exception:  # noqa: BLE001
        pass
    try:

        out["sm_clock_mhz"] = int(torch.cuda.clock_rate(index))
    except Exception:  # noqa: BLE001
        pass
    return out if len(out) > 1 else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def timing_stats(paired: Paired | None, *, why: str, step_times_s: list[float], iters: int, warmup: int,
                 pacing: str, device: str, threads: int | None, load_start: list[float] | None,
                 gpu_before: dict[str, Any] | None) -> dict[str, Any]:
    """``summary.json["timing"]``: how the step times were measured (see docs/design.md's Measuring)."""
    base: dict[str, Any] = {"pacing": pacing, "threads": threads, "host": socket.gethostname()}
    if paired is not None:
        d = paired.summary()
        base.update(
            kind="paired", rounds=d["rounds"], order=d["order"], level=d["level"],
            replay_ms=d["a_ms"], original_ms=d["b_ms"], replay_wall_ms=d["a_wall_ms"],
            original_wall_ms=d["b_wall_ms"], ratios=d["ratios"], half_width=d["half_width"],
            half_width_target=d["half_width_target"], time_cap_s=d["time_cap_s"], stop=d["stop"],
            warmup_rounds=d["warmup_rounds"], warmup_s=d["warmup_s"], warmup_settled=d["warmup_settled"],
            seconds=d["seconds"], clock=d["clock"], loadavg_start=d["loadavg_start"], loadavg_end=d["loadavg_end"],
        )
    else:
        base.update(kind="recorded", why_not_paired=why, iterations=iters, warmup_iterations=warmup,
                    replay_ms=[t * 1e3 for t in step_times_s], clock="wall",
                    loadavg_start=load_start, loadavg_end=loadavg())
    gpu_after = gpu_clocks(device)
    if gpu_before or gpu_after:
        base["gpu"] = {"before": gpu_before, "after": gpu_after}
    return base


# -- recorded fidelity: per-op errors against the trace's own (Kineto) times ---------------------


def op_reference(plan: Plan) -> str:
    """Which recorded per-op time a replay op is compared with: ``device`` (kernel time, for an
    accelerator original with Kineto device events) or ``host`` (the op's CPU span)."""
    if _kind(plan.metadata.get("original_device")) != "cpu" and plan.metadata.get("original_device_op_times"):
        return "device"
    return "host"


def original_op_us(plan: Plan, op: dict[str, Any]) -> float | None:
    """The recorded time (us) of ``op`` under :func:`op_reference`; None when unknown."""
    key = "orig_device_us" if op_reference(plan) == "device" else "orig_us"
    v = _num(op.get(key))
    return v if v is not None and v > 0 else None


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    if not ys:
        return math.nan
    pos = q * (len(ys) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def comparable(plan: Plan, device: str | None) -> bool:
    """Whether per-op times replayed on ``device`` compare with the recorded ones (same kind of device)."""
    return device is None or _kind(plan.metadata.get("original_device")) == _kind(device)


def op_errors(plan: Plan, e: Executor, op_times_s: list[float], top: int = 8,
              device: str | None = None) -> dict[str, Any]:
    """The op-level error table's summary: ``|replay/original - 1|`` per op against the recorded
    per-op time (:func:`op_reference`), its median and 90th percentile overall and per op type
    (op types ordered by recorded time, the first ``top`` kept). Replayed on another kind of device
    than recorded (``device``), nothing is compared (``cross_device``)."""
    ref = op_reference(plan)
    if not comparable(plan, device):
        return {"reference": ref, "ops_compared": 0, "median_abs_error": None, "p90_abs_error": None,
                "by_op_type": [], "cross_device": True}
    per_type: dict[str, list[tuple[float, float, float]]] = {}
    errs: list[float] = []
    for op, st in zip(plan.ops, e.status):
        orig = original_op_us(plan, op)
        i = op["index"]
        t = op_times_s[i] if i < len(op_times_s) else math.nan
        if orig is None or st.state != "replayed" or not math.isfinite(t) or t <= 0:
            continue
        err = abs(t * 1e6 / orig - 1.0)
        errs.append(err)
        per_type.setdefault(op["name"], []).append((err, orig, t * 1e6))
    by_type = []
    for name, rows in per_type.items():
        es = [r[0] for r in rows]
        by_type.append({"op": name, "n": len(rows), "original_us": sum(r[1] for r in rows),
                        "replay_us": sum(r[2] for r in rows), "median_abs_error": statistics.median(es),
                        "p90_abs_error": _quantile(es, 0.9)})
    by_type.sort(key=lambda d: -d["original_us"])
    return {
        "reference": ref,
        "ops_compared": len(errs),
        "median_abs_error": statistics.median(errs) if errs else None,
        "p90_abs_error": _quantile(errs, 0.9) if errs else None,
        "by_op_type": by_type[:top],
    }


def lacks(plan: Plan) -> list[str]:
    """What the input lacks for fidelity, in plain words (empty when nothing is missing)."""
    m = plan.metadata
    out = []
    if not m.get("original_op_times"):
        out.append("no Kineto trace joined by rf_id: no recorded per-op times (ops.csv original_us empty, "
                   "coverage_by_time weighs every op the same)")
    elif _kind(m.get("original_device")) != "cpu" and not m.get("original_device_op_times"):
        out.append("no device (kernel) events in the Kineto trace: per-op times are host times")
    if not isinstance(m.get("original_step_ms"), (int, float)) and not isinstance(m.get("original_step_span_ms"),
                                                                                   (int, float)):
        out.append("no recorded step time (no capture.json, no Kineto ProfilerStep span): recorded ratio null")
    if original_step(plan) is None and not m.get("obfuscated"):
        out.append("no capture.json description of the step: the original cannot run beside the replay")
    return out


def recorded_original(plan: Plan) -> tuple[float | None, str | None]:
    """The recorded original step time (ms) and where it comes from: the capture's uninstrumented
    median (``capture.json``), else the Kineto ``ProfilerStep`` span (profiled, so slower)."""
    m = plan.metadata
    v = _num(m.get("original_step_ms"))
    if v is not None and v > 0:
        return v, "capture.json median (uninstrumented, capture time)"
    span = _num(m.get("original_step_span_ms"))
    if span is not None and span > 0:
        return span, "Kineto ProfilerStep span (profiled, capture time)"
    return None, None


def ratio_verdict(lo: float, hi: float) -> str:
    """pass / fail / inconclusive of a paired ratio interval against the band."""
    return interval_verdict(lo, hi, RATIO_LOW, RATIO_HIGH)
