"""Capture: time a workload step uninstrumented, then record one step as an execution trace.

``capture(target, out_dir, ...)`` writes the trace dir of docs/design.md:

- ``trace.json.gz``: the PyTorch Execution Trace exactly as ``ExecutionTraceObserver`` wrote it
  (integral tensor ranges recorded), one ``ProfilerStep#N`` holding the recorded step;
- ``kineto.json.gz``: the Kineto profiler trace of the same step (events carry
  ``Record function id`` = the ET node's ``rf_id``);
- ``pacing.json.gz``: a Kineto trace of :data:`PACING_STEPS` more steps recorded with nothing else
  attached (no execution-trace observer, no shapes): the host gaps between ops that ``--pacing
  recorded`` reproduces, free of the observer's own time (ops matched to the ET by order), and the
  op times ``mystique predict`` takes the median of;
- ``capture.json``: what was captured, the measured step time of the uninstrumented step and the
  light profiler's cost per recorded event on this host (``profiler_event_cost``,
  :mod:`mystique.trace.profiler_cost`) and the wall times of the light steps paired with plain steps
  timed between them (``light_reference``: ``plain_ms``, ``light_ms``; what ``mystique predict``
  checks its prediction against, see :func:`record_pacing`);
- ``results.csv``: the capture suite's rows (step time, trace size).

TARGET is a built-in workload name (``mystique.workloads.names()``) or ``package.module:function``
naming a function of no arguments that returns a callable doing one step. How the step is built
and timed: :class:`CaptureOptions` (shared with the multi-rank capture, :mod:`mystique.distributed`).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

from . import workloads
from .errors import EnvironmentUnsupported, UsageError
from .io import atomic_write_text, check_output_dir, staged_output_dir
from .placement import check_policy, parse_policy, placed, placement_words
from .progress import Progress
from .refs import import_callable
from .results import Results, RunContext, utc_now, write_csv
from .targets import Target, check_device
from .trace.files import export_chrome_trace, gzip_file
from .trace.profiler_cost import measure_event_cost
from .trace.values import VALUE_OPS, VALUES_FILE, collect, resource_dir

TRACE_FILE = "trace.json.gz"
KINETO_FILE = "kineto.json.gz"
PACING_FILE = "pacing.json.gz"
CAPTURE_FILE = "capture.json"
CAPTURE_FORMAT = {"format": "mystique-capture", "version": 1}
_USER_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class CaptureOptions:
    """How a capture builds and times the step: the workload's named size and mode, the device and
    dtype, ``steps`` timed uninstrumented steps after ``warmup``, the seed of weights and batch."""

    config: str = "debug"
    mode: str = "train"
    device: str = "cpu"
    dtype: str = "float32"
    steps: int = 5
    warmup: int = 2
    seed: int = 0
    cpu_affinity: str = "none"  # where the timed steps' threads run (mystique.placement)
    #: record the light profile (pacing.json.gz: the replay's recorded pacing, predict's op times and its
    #: light/plain pairs) and the profiler's per-event cost; False where nothing will time the capture's
    #: steps (correctness's reference captures), saving 2 x pacing_pairs(steps) + 1 steps and the
    #: calibration (most of a debug capture: llama debug train 2.9 of 4.6 s at load 3)
    light: bool = True

    def check(self) -> None:
        """UsageError for an unknown mode, too few steps or a bad ``cpu_affinity``."""
        if self.mode not in ("train", "infer"):
            raise UsageError(f"unknown mode {self.mode!r}; expected train or infer")
        if self.steps < 1 or self.warmup < 0:
            raise UsageError("--steps must be at least 1 and --warmup at least 0")
        check_policy(self.cpu_affinity)


def workload_step(target: str, *, config: str, mode: str, device: str, dtype: str, seed: int) -> tuple[Any, dict[str, Any]]:
    """The built-in workload's step (a :mod:`mystique.workloads` step: ``fn``, ``model``, ``batch``...)
    and its description for ``capture.json``."""
    try:
        step = workloads.make_step(target, config, mode, device=device, dtype=getattr(torch, dtype), seed=seed)
    except workloads.WorkloadTooLarge as exc:
        raise EnvironmentUnsupported(str(exc)) from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    cfg = step.config
    return step, {
        "kind": "workload",
        "workload": target,
        "config": config,
        "config_values": asdict(cfg) if is_dataclass(cfg) else repr(cfg),
        "mode": mode,
        "batch": {k: list(v.shape) for k, v in step.batch.items()},
        # what the workload says of the model it built (llama4: the expert GEMM path that ran)
        **({"model": workloads.get(target).describe(step.model)} if hasattr(workloads.get(target), "describe") else {}),
    }


def resolve_step(
    target: str, *, config: str, mode: str, device: str, dtype: str, seed: int
) -> tuple[Callable[[], Any], dict[str, Any]]:
    """Return the step callable for TARGET and a description of it for ``capture.json``."""
    if dtype not in _DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
    if target in workloads.names():
        step, described = workload_step(target, config=config, mode=mode, device=device, dtype=dtype, seed=seed)
        return step.fn, described
    if not _USER_TARGET.match(target):
        raise UsageError(
            f"unknown capture target {target!r}; expected one of {', '.join(workloads.names())} "
            "or package.module:function"
        )
    module_name, _, func_name = target.partition(":")
    factory = import_callable(module_name, func_name, f"capture target {target!r}")
    torch.manual_seed(seed)
    step = factory()
    if not callable(step):
        raise UsageError(
            f"capture target {target!r} must return a callable doing one step; it returned {type(step).__name__}"
        )
    return step, {"kind": "user", "function": target, "config": None, "mode": None}


class StepNotImported(UsageError):
    """A plan or capture folder names a ``package.module:function`` step that nobody named on the
    command line: it is data, never imported (:func:`rebuild_step`)."""


def is_step_target(target: Any) -> bool:
    """Whether ``target`` is a built-in workload name or a well-formed ``package.module:function``."""
    return isinstance(target, str) and (target in workloads.names() or _USER_TARGET.match(target) is not None)


def shown_target(target: Any) -> str:
    """A step target read from a plan or capture folder, for a one-line message: itself when it is a
    built-in workload name or a well-formed ``package.module:function``, else a description."""
    if is_step_target(target):
        return target
    return "a step that is neither a built-in workload nor package.module:function"


def rebuild_step(original: dict[str, Any], device: str, user_step: str | None = None) -> Callable[[], Any]:
    """The captured step, built again in this process on ``device``, from the description a plan
    keeps of its ``capture.json`` (``metadata["original_step"]``: target, config, mode, dtype, seed;
    see :func:`mystique.replay.plan.capture_original_step`).

    A plan or capture folder is data, so what it names is never imported: its target is rebuilt only
    when it is a built-in workload (the registry's name; config, mode and dtype checked by
    :func:`mystique.workloads.make_step`), with the same weights and batch (same seed). A user's
    ``package.module:function`` factory is imported and called (after ``torch.manual_seed(seed)``)
    only when the user names it, ``user_step`` (``mystique replay --original``); a plan naming one
    otherwise raises :class:`StepNotImported`. UsageError when the target cannot be imported or
    built, EnvironmentUnsupported when it does not fit the device."""
    target = user_step if user_step is not None else original.get("target")
    if not isinstance(target, str) or not target:
        raise UsageError("the capture description names no target")
    if user_step is None and target not in workloads.names():
        shown = shown_target(target)
        raise StepNotImported(f"original step {shown} named by the capture is not imported (a plan is data); "
                              f"pass --original {shown if _USER_TARGET.match(shown) else 'MODULE:FUNCTION'} "
                              "to time it paired")
    dtype = original.get("dtype") or "float32"
    step, _described = resolve_step(target, config=original.get("config") or "debug",
                                    mode=original.get("mode") or "train", device=device, dtype=dtype,
                                    seed=int(original.get("seed") or 0))
    return step


def time_step(step: Callable[[], Any], target: Target, *, warmup: int, iters: int,
              progress: Progress | None = None) -> dict[str, Any]:
    """Warm up, then time ``iters`` uninstrumented steps (device-synchronised); medians in ms."""
    for i in range(warmup):
        step()
        if progress:
            progress.note(f"warm-up {i + 1}/{warmup}")
    target.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        target.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {
        "warmup": warmup,
        "iterations": iters,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "iqr_ms": q[2] - q[0],
        "stdev_ms": statistics.stdev(times) if len(times) > 1 else 0.0,
        "times_ms": times,
        **step_spread(statistics.median(times), q[2] - q[0], iters),
    }


#: the widest spread (IQR over median) of the uninstrumented step times that still makes a reference:
#: a replay is judged against a ±10% band (fidelity.RATIO_LOW/HIGH), so a reference that itself moves
#: by more than 10% could pass or fail a faithful replay by chance
STEP_SPREAD_MAX = 0.10


def step_spread(median_ms: float, iqr_ms: float, iters: int) -> dict[str, Any]:
    """``spread`` (IQR / median), ``too_noisy`` (over :data:`STEP_SPREAD_MAX`) and the ``reason``."""
    spread = iqr_ms / median_ms if median_ms > 0 else float("inf")
    noisy = not spread <= STEP_SPREAD_MAX
    reason = (f"IQR/median {spread:.1%} of {iters} steps is over {STEP_SPREAD_MAX:.0%}: the replay is judged "
              f"against a ±10% band, so a reference this noisy could decide it by chance (rerun on a quieter host "
              f"or with more --steps)" if noisy else
              f"IQR/median {spread:.1%} of {iters} steps is within {STEP_SPREAD_MAX:.0%}")
    return {"spread": spread if math.isfinite(spread) else None, "too_noisy": noisy, "reason": reason}


#: steps the light profile records after its warm-up step: ``mystique predict`` takes each op's median
#: over them, so one slow step (the first after the execution trace was written, a preempted one)
#: does not set the prediction; each is paired with an unprofiled step timed beside it (see
#: :func:`record_pacing`), so 8 pairs: the plain steps' median outlasts a few slow ones. A capture with
#: more ``--steps`` takes as many pairs (:func:`pacing_pairs`)
PACING_STEPS = 8


def record_step(step: Callable[[], Any], target: Target, trace_path: Path, kineto_path: Path,
                pacing_path: Path | None = None, pairs: int = PACING_STEPS) -> dict[str, Any] | None:
    """Record one step with the Execution Trace observer and the Kineto profiler together; with
    ``pacing_path``, then ``pairs`` more steps with the Kineto profiler alone (host timeline only;
    :func:`pacing_pairs` of the capture's steps), each paired with a plain step, and the
    profiler's measured cost per event: what :func:`record_pacing` returns is returned (else None).

    The profiler schedule runs one warm-up step (profiler started, nothing kept), then one active
    step, so the ET holds exactly one ``ProfilerStep#N``.
    """
    os.environ["ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE"] = "1"
    activities = [ProfilerActivity.CPU]
    if target.torch_device.type == "cuda" and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    exported: list[bool] = []

    def on_ready(prof) -> None:
        export_chrome_trace(prof, kineto_path)
        exported.append(True)

    os.environ["ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_DATA"] = ",".join(VALUE_OPS)
    et = ExecutionTraceObserver()
    # recorded uncompressed, then gzipped here: the observer writes the integral inputs of VALUE_OPS
    # into a resource folder named after the file it records to (values.collect reads them)
    raw_path = trace_path.with_name(trace_path.name.removesuffix(".gz"))
    et.register_callback(str(raw_path))
    et.set_extra_resource_collection(True)
    # the observer prints where it compresses to: keep stdout for the command's own output
    with contextlib.redirect_stdout(sys.stderr):
        _profile_two_steps(step, target, et, activities, on_ready)
    if raw_path != trace_path and raw_path.exists():
        gzip_file(raw_path, trace_path)
    if not exported or not trace_path.exists():
        raise RuntimeError("the profiler recorded no step")
    # recorded routing and document ids, where the step had any (values.json beside the trace)
    collect(trace_path, resource_dir(raw_path), trace_path.parent / VALUES_FILE)
    if pacing_path is None:
        return None
    return record_pacing(step, target, pacing_path, pairs)


def pacing_pairs(steps: int) -> int:
    """Light/plain pairs a capture of ``steps`` timed steps records: :data:`PACING_STEPS`, or ``steps``
    where that is more. What ``predict`` judges its self-prediction by is the median of the pairs'
    ratios (:func:`mystique.predict.verify.capture_measured`); its 95% interval is about ``+-2.5 s /
    sqrt(n)`` for a spread ``s`` of one pair's ratio (the median's asymptotic standard error, 1.2533 s
    / sqrt(n), times 1.96): at this 2-core host's 10%, 8 pairs give about +-9%, 40 pairs +-4%, so a
    figure judged against a 6% bound wants ``--steps 40`` (each pair costs two steps)."""
    return max(PACING_STEPS, int(steps))


def record_pacing(step: Callable[[], Any], target: Target, path: Path, pairs: int = PACING_STEPS) -> dict[str, Any]:
    """``pairs`` steps under the Kineto profiler alone, CPU events only, no shapes: the
    lightest profile torch offers, so the gaps between its ops are the step's own host time (see
    :func:`mystique.trace.pacing.align_spans`); then the profiler's cost per recorded event, measured
    on this host (:func:`mystique.trace.profiler_cost.measure_event_cost`).

    Each profiled step is paired with a plain one in the same profiler session, collection toggled
    off for it (no event recorded; order alternating pair by pair), so the step time ``mystique
    predict`` checks its prediction of the light steps against is taken in their window: a host
    whose speed drifts between the capture's earlier timed steps and these would otherwise read as
    the prediction's error. Returns ``{"profiler_event_cost": ..., "light_reference": {"plain_ms",
    "light_ms"}}`` (wall times of the pairs, in order)."""
    cpu = [ProfilerActivity.CPU]
    plain_ms: list[float] = []
    light_ms: list[float] = []

    def timed(label: str | None) -> float:
        t0 = time.perf_counter()
        if label is None:
            step()
            target.synchronize()
        else:
            with torch.profiler.record_function(label):
                step()
                target.synchronize()
        return (time.perf_counter() - t0) * 1e3

    with profile(activities=cpu, record_shapes=False) as prof:
        timed(None)  # warm-up step under the profiler, outside every step region (not kept as a step)
        for i in range(pairs):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                prof.toggle_collection_dynamic(on, cpu)
                if on:
                    light_ms.append(timed(f"ProfilerStep#{i}"))
                else:
                    plain_ms.append(timed(None))
        prof.toggle_collection_dynamic(True, cpu)
    export_chrome_trace(prof, path)
    return {"profiler_event_cost": measure_event_cost(),
            "light_reference": {"plain_ms": plain_ms, "light_ms": light_ms, "pairs": pairs,
                                "how": "plain and light-profiled steps alternating in one profiler "
                                       "session (collection toggled off for the plain ones)"}}


def _profile_two_steps(step, target, et, activities, on_ready) -> None:
    try:
        with profile(
            activities=activities,
            execution_trace_observer=et,
            record_shapes=True,
            schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
            on_trace_ready=on_ready,
        ) as prof:
            for _ in range(2):
                step()
                target.synchronize()
                prof.step()
    finally:
        et.unregister_callback()


def trace_counts(trace_path: Path) -> dict[str, Any]:
    """The recorded ET's schema, node count, ``aten::`` op count and operator names."""
    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt", encoding="utf-8") as fh:
        et = json.load(fh)
    nodes = et.get("nodes", [])
    return {
        "schema": et.get("schema", ""),
        "nodes": len(nodes),
        "aten_ops": sum(1 for n in nodes if str(n.get("name", "")).startswith("aten::")),
        "op_names": sorted({n["name"] for n in nodes if "::" in str(n.get("name", ""))}),
    }


def capture_meta(target_name: str, described: dict[str, Any], device: str, device_name: str, dtype: str,
                 seed: int, timing: dict[str, Any], counts: dict[str, Any]) -> dict[str, Any]:
    """The ``capture.json`` of a trace dir: what was captured, where, and its uninstrumented step time."""
    return {
        **CAPTURE_FORMAT,
        "target": target_name,
        **described,
        "device": device,
        "device_name": device_name,
        "dtype": dtype if described["kind"] == "workload" else None,
        "seed": seed,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "argv": sys.argv,
        "created_at": utc_now(),
        "threads": torch.get_num_threads(),
        "step_time": timing,
        "files": {"trace": TRACE_FILE, "kineto": KINETO_FILE, "pacing": PACING_FILE},
        "trace": {k: v for k, v in counts.items() if k != "op_names"},
    }


def capture(target_name: str, out_dir: str | os.PathLike, *, force: bool = False, **options: Any) -> Path:
    """Capture TARGET into ``out_dir`` (see the module docstring); returns the folder.

    ``options``: the fields of :class:`CaptureOptions` (``config``, ``mode``, ``device``, ``dtype``,
    ``steps``, ``warmup``, ``seed``, ``cpu_affinity``: where the timed steps' threads run, see
    :mod:`mystique.placement`, kept in capture.json's ``cpu_placement``); ``force`` replaces an existing
    output folder's files.
    """
    o = CaptureOptions(**options)
    o.check()
    check_output_dir(out_dir, force)
    target = Target(check_device(o.device))
    progress = Progress("capture")
    progress.note(f"building {target_name} ({o.config}, {o.mode}) on {o.device}")
    step, described = resolve_step(target_name, config=o.config, mode=o.mode, device=o.device, dtype=o.dtype,
                                   seed=o.seed)
    progress.note(f"timing {o.steps} uninstrumented steps after {o.warmup} warm-up")
    with placed(parse_policy(o.cpu_affinity), o.device) as pl:
        timing = time_step(step, target, warmup=o.warmup, iters=o.steps, progress=progress)
    progress.note(f"step median {timing['median_ms']:.2f} ms; recording one step")
    info = target.info()
    ctx = RunContext(device=o.device, device_name=info.name, torch_version=torch.__version__)
    with staged_output_dir(out_dir, force) as stage:
        light = record_step(step, target, stage / TRACE_FILE, stage / KINETO_FILE,
                            stage / PACING_FILE if o.light else None, pacing_pairs(o.steps)) or {}
        counts = trace_counts(stage / TRACE_FILE)
        meta = capture_meta(target_name, described, o.device, info.name, o.dtype, o.seed, timing, counts)
        meta["profiler_event_cost"] = light.get("profiler_event_cost")
        meta["light_reference"] = light.get("light_reference")
        meta["cpu_placement"] = pl.record
        if not o.light:
            meta["files"]["pacing"] = None
        atomic_write_text(stage / CAPTURE_FILE, json.dumps(meta, indent=2, default=str) + "\n")
        repro = (f"mystique capture {target_name} -o OUT --config {o.config} --mode {o.mode} --device {o.device} "
                 f"--dtype {o.dtype} --steps {o.steps} --warmup {o.warmup} --seed {o.seed}"
                 + (f" --cpu-affinity {o.cpu_affinity}" if o.cpu_affinity != "none" else ""))
        subject = f"{target_name}/{o.config}/{o.mode}" if described["kind"] == "workload" else target_name
        res = Results(ctx, "capture")
        _add_rows(res, subject, meta["dtype"] or "", timing, counts, o, f"; reproduce: {repro}")
        res.add("cpu_placement", subject, "main_cpu", pl.record["main_cpu"] if pl.record["applied"] else None,
                status="info", dtype=meta["dtype"] or "",
                detail=f"the timed steps: {placement_words(pl.record)}; allowed CPUs "
                       f"{pl.record['allowed_cpus'] or 'unknown'}; reproduce: {repro}")
        write_csv(res.frame(), stage / "results.csv")
    progress.note(f"wrote {out_dir} ({counts['nodes']} ET nodes, {counts['aten_ops']} aten ops)")
    return Path(out_dir)


def _add_rows(res: Results, subject: str, dt: str, timing: dict[str, Any], counts: dict[str, Any],
              o: CaptureOptions, tail: str) -> None:
    """The capture suite's rows, each detail ending with ``tail`` (the reproduce command)."""
    res.add("uninstrumented_step_time", subject, "median_ms", timing["median_ms"], unit="ms", status="info",
            dtype=dt, detail=f"{o.steps} steps after {o.warmup} warm-up; IQR {timing['iqr_ms']:.3f} ms; "
                             f"seed {o.seed}{tail}")
    # A measurement that flags, not a check: the replay's verdict comes from paired rounds against the
    # rebuilt step (mystique.replay.fidelity); a recorded ratio is never a verdict. capture.json says so too.
    res.add("original_step_spread", subject, "iqr_over_median", timing["spread"], threshold=STEP_SPREAD_MAX,
            dtype=dt, status="info",
            detail=("TOO NOISY to be a reference: " if timing["too_noisy"] else "a usable reference: ")
            + timing["reason"] + f"; a reference needs at most {STEP_SPREAD_MAX:.0%}{tail}")
    ok = counts["aten_ops"] > 0
    res.add("trace_recorded", subject, "aten_ops", counts["aten_ops"], status="pass" if ok else "fail",
            dtype=dt, threshold=1,
            detail=f"ET schema {counts['schema']}, {counts['nodes']} nodes" + ("" if ok else "; no aten op recorded")
            + tail)
