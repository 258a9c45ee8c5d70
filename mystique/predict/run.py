"""``mystique predict``: read a step, apply the what-ifs, simulate it, and (``--verify``) check the
prediction by running it here; writes ``OUT/results.csv`` (suite ``predict``) and ``OUT/prediction.json``.

Rows (all ``info`` but the error's check): ``predicted_step_time`` (ms; the detail says what was
predicted and from what), ``predicted_base_step_time`` (the step as captured, when a what-if changes
it), ``critical_path`` (ms of task time on the critical path) and one ``critical_path_class`` and one
``class_time`` row per operator class (metric: the class; time on the critical path, and summed task
time), ``predict_time`` (seconds the prediction took); with ``--verify``, ``measured_step_time`` (or
``measured_ratio`` for a transform) with its 95% interval and ``prediction_error``: predicted /
measured - 1, signed, its interval in ``low``/``high``, judged against :data:`BOUNDS`.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..io import atomic_write_text, check_output_dir, show, staged_output_dir
from ..progress import Progress
from ..results import Results, RunContext, write_csv
from .graph import Step, build_graph, load_step
from .sim import CLASSES, Simulated, critical_path_us, simulate
from .verify import (
    Measured,
    capture_measured,
    error_interval,
    error_verdict,
    measure_capture_step,
    measure_transform,
    replay_measured,
)
from .whatif import (
    Profile,
    apply_model,
    describe,
    parse_factors,
    read_profile,
    scale_classes,
    transformed_plan,
)

#: |prediction error| a verified prediction is held to, by kind. These are issue #35's declared targets
#: for one prediction: a capture's own step within 6% (the worst case allowed over the reference
#: captures; their median is held to 3% over the set, a figure, not a row), a transform's change within
#: 10%. A prediction passes when the 95% interval of its error lies within the bound, fails when it
#: lies wholly outside, and is undecided otherwise.
BOUNDS = {"self": 0.06, "transform": 0.10}


@dataclass(frozen=True)
class PredictOptions:
    ops_csv: str | None = None
    scale: str | None = None
    profile: str | None = None
    target_profile: str | None = None
    dtype: str | None = None
    batch_scale: float | None = None
    verify: bool = False
    original: str | None = None
    device: str = "cpu"
    seed: int = 0
    half_width: float = 0.02
    time_cap: float = 30.0
    iteration: int | None = None
    allow_ops: tuple[str, ...] = ()

    def check(self) -> None:
        if self.batch_scale is not None and not (math.isfinite(self.batch_scale) and self.batch_scale > 0):
            raise UsageError("--batch-scale must be a positive number")
        if not (self.half_width > 0 and self.time_cap > 0):
            raise UsageError("--half-width and --time-cap must be positive")
        if self.verify and (self.scale or self.target_profile):
            raise UsageError("--verify checks what this machine can run: a capture's own step, --dtype and "
                             "--batch-scale; --scale and --target-profile predict what it cannot")


def _subject(step: Step, source: str) -> str:
    from ..replay.capture_info import capture_subject

    return capture_subject(step.capture) or step.plan.metadata.get("subject") or Path(source).name or source


def _whatif_label(o: PredictOptions, factors: dict[str, float], target: Profile | None) -> str:
    parts = [f"{k}x{v:g}" for k, v in factors.items()]
    if o.dtype:
        parts.append(f"dtype={o.dtype}")
    if o.batch_scale not in (None, 1):
        parts.append(f"batch x{o.batch_scale:g}")
    if target is not None:
        parts.append(f"on {target.name}")
    return ", ".join(parts)


def predict(source: str | os.PathLike, out_dir: str | os.PathLike, *, force: bool = False,
            options: PredictOptions | None = None) -> tuple[dict[str, Any], Any]:
    """Predict (and with ``verify`` check) the step time of ``source``; see the module docstring."""
    o = options or PredictOptions()
    o.check()
    check_output_dir(out_dir, force)
    prog = Progress("predict")
    t0, c0 = time.perf_counter(), time.process_time()
    factors = parse_factors(o.scale)
    base_profile = read_profile(o.profile) if o.profile else None
    target = read_profile(o.target_profile) if o.target_profile else None
    if (o.dtype or target is not None) and base_profile is None:
        raise UsageError("--dtype and --target-profile need --profile: the throughput of the machine the step "
                         "was captured on (a `mystique validate performance` results.csv)")
    gc_was = gc.isenabled()
    gc.disable()  # reading builds many small objects and no cycles: collecting them halves the time of a large trace
    try:
        step = load_step(source, ops_csv=o.ops_csv, iteration=o.iteration, allow_ops=o.allow_ops)
    finally:
        if gc_was:
            gc.enable()
    prog.note(f"{len(step.ops)} ops from {step.times_from or 'the recorded times'}")
    base_sim = simulate(build_graph(step))
    new_plan = None
    predicted = step
    if o.dtype or o.batch_scale not in (None, 1) or target is not None:
        new_plan = transformed_plan(step, dtype=o.dtype, batch_scale=o.batch_scale, allow_ops=o.allow_ops)
        predicted = apply_model(step, new_plan, base_profile, target or base_profile)
    predicted = scale_classes(predicted, factors)
    graph = build_graph(predicted)
    sim = simulate(graph)
    elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    label = _whatif_label(o, factors, target)
    subject = _subject(step, str(source)) + (f" [{label}]" if label else "")
    prog.note(f"predicted step {sim.step_us / 1e3:.3f} ms ({len(graph.tasks)} tasks, {elapsed:.2f} s)")
    kind = "transform" if new_plan is not None else "self"
    checks: list[tuple[str, Measured | None, str]] = []
    if kind == "self" and not factors:
        recorded = capture_measured(step.capture)
        if recorded is not None:
            checks.append(("vs_capture", recorded, ""))
        replayed = replay_measured(o.ops_csv)
        if replayed is not None:
            checks.append(("vs_replay", replayed, ""))
    if o.verify:
        if new_plan is not None:
            prog.note("verifying: the transformed and untransformed benchmarks in paired rounds")
            checks.append(("vs_paired_replay", measure_transform(
                step.plan, new_plan, o.device, seed=o.seed, half_width=o.half_width, time_cap_s=o.time_cap,
                allow_ops=o.allow_ops, progress=prog.note), ""))
        else:
            prog.note("verifying: timing the captured step here")
            m, why = measure_capture_step(step, o.device, o.original, half_width=o.half_width,
                                          time_cap_s=o.time_cap, progress=prog.note)
            checks.append(("vs_rerun", m, why))
    ctx = _context(o.device)
    res = Results(ctx, "predict")
    summary = _rows(res, subject, step, sim, base_sim, graph, label, base_profile, target, elapsed, cpu_s)
    summary["verify"] = [_verify_rows(res, subject, summary["predicted_step_ms"], summary["base_step_ms"], metric, m, why,
                                      kind, str(source), o) for metric, m, why in checks]
    with staged_output_dir(out_dir, force) as stage:
        write_csv(res.frame(), stage / "results.csv")
        atomic_write_text(stage / "prediction.json", json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return summary, res.frame()


def _context(device: str) -> RunContext:
    import torch

    from ..targets import Target, check_device

    info = Target(check_device(device)).info()
    return RunContext(device=device, device_name=info.name, torch_version=torch.__version__)


def _finite(v: float) -> float | None:
    return v if isinstance(v, float) and math.isfinite(v) else None


def _rows(res: Results, subject: str, step: Step, sim: Simulated, base_sim: Simulated, graph, label: str,
          base_profile: Profile | None, target: Profile | None, elapsed: float, cpu_s: float) -> dict[str, Any]:
    ms = sim.step_us / 1e3
    how = (f"{len(step.ops)} ops, {len(graph.tasks)} tasks on {len(graph.lanes())} lanes "
           f"({', '.join(graph.lanes()[:4])}{', ...' if len(graph.lanes()) > 4 else ''}); times from "
           f"{step.times_from or 'the recorded times'}" + (f"; what-if: {label}" if label else "")
           + (f"; profile {describe(base_profile)}" if base_profile else "")
           + (f"; target {describe(target)}" if target else "")
           + (f"; {'; '.join(graph.notes)}" if graph.notes else ""))
    res.add("predicted_step_time", subject, "ms", ms, unit="ms", status="info", detail=how)
    if label:
        res.add("predicted_base_step_time", subject, "ms", base_sim.step_us / 1e3, unit="ms", status="info",
                detail="the step as captured, simulated with no what-if")
    res.add("critical_path", subject, "ms", critical_path_us(sim) / 1e3, unit="ms", status="info",
            detail=f"task time along the critical path ({len(sim.critical)} tasks); idle before it "
                   f"{sim.idle_us / 1e3:.3f} ms")
    crit, busy = sim.critical_by_class(graph), sim.busy_by_class(graph)
    for c in CLASSES:
        res.add("critical_path_class", subject, c, crit[c] / 1e3, unit="ms", status="info",
                detail=f"{c} time on the critical path ({crit[c] / sim.step_us:.1%} of the step)" if sim.step_us
                else f"{c} time on the critical path")
        res.add("class_time", subject, c, busy[c] / 1e3, unit="ms", status="info",
                detail=f"summed {c} task time, overlapped or not")
    res.add("predict_time", subject, "s", elapsed, unit="s", status="info",
            detail=f"wall time of reading the step, building its graph ({len(graph.tasks)} tasks) and simulating it "
                   f"(with the what-ifs) on this host; {cpu_s:.2f} s of CPU time")
    summary: dict[str, Any] = {
        "format": "mystique-prediction", "version": 1, "source": show(step.source), "subject": subject,
        "whatif": label or None, "times_from": step.times_from, "ops": len(step.ops), "tasks": len(graph.tasks),
        "lanes": graph.lanes(), "predicted_step_ms": ms, "base_step_ms": base_sim.step_us / 1e3,
        "critical_path_ms": critical_path_us(sim) / 1e3,
        "critical_by_class_ms": {c: crit[c] / 1e3 for c in CLASSES},
        "busy_by_class_ms": {c: busy[c] / 1e3 for c in CLASSES}, "predict_s": elapsed, "predict_cpu_s": cpu_s,
        "recorded_step_ms": (step.capture or {}).get("step_time", {}).get("median_ms") if step.capture else None,
        "notes": graph.notes, "verify": []}
    return summary


def _verify_rows(res: Results, subject: str, ms: float, base_ms: float, metric: str, m: Measured | None, why: str,
                 kind: str, source: str, o: PredictOptions) -> dict[str, Any]:
    repro = (f"mystique predict {source} --verify -o OUT"
             + (f" --dtype {o.dtype}" if o.dtype else "") + (f" --batch-scale {o.batch_scale:g}" if o.batch_scale else "")
             + (f" --profile {o.profile}" if o.profile else "") + (f" --original {o.original}" if o.original else ""))
    if m is None:
        res.add("prediction_error", subject, metric, None, status="skip", detail=f"not verified: {why}")
        return {"kind": kind, "against": metric, "measured": None, "why_not": why}
    bound = BOUNDS[kind]
    if kind == "transform":
        predicted = ms / base_ms if base_ms > 0 else math.nan
        res.add("measured_ratio", subject, metric, m.value, low=m.low, high=m.high, status="info", detail=m.how)
        res.add("predicted_ratio", subject, "ratio", predicted, status="info",
                detail=f"predicted transformed step {ms:.3f} ms / predicted untransformed {base_ms:.3f} ms")
        what = "the predicted change (transformed / untransformed step) against the measured paired ratio"
    else:
        predicted = ms
        res.add("measured_step_time", subject, metric, m.value, unit="ms", low=m.low, high=m.high,
                status="info", detail=m.how)
        what = m.what or ("the predicted step against the step the capture timed (uninstrumented, in the capturing process, "
                "just before it recorded the step)" if metric == "vs_capture" else
                "the step predicted from its replay's per-op times against that replay's whole iterations"
                if metric == "vs_replay" else
                "the predicted step against the step timed here now (the host's speed may have moved since the capture)")
    err, lo, hi = error_interval(predicted, m)
    status = error_verdict(lo, hi, bound)
    res.add("prediction_error", subject, metric, err, threshold=bound, low=_finite(lo), high=_finite(hi),
            status=status,
            detail=f"{what}: predicted / measured - 1 = {err:+.2%}, 95% interval [{lo:+.2%}, {hi:+.2%}]; pass when the "
                   f"interval lies within ±{bound:.0%} (issue #35's target for one {kind} prediction), fail when "
                   f"outside" + ("" if status == "pass" else f"; reproduce: {repro}"))
    return {"kind": kind, "against": metric, "predicted": predicted, "measured": m.value, "low": m.low, "high": m.high,
            "error": _finite(err), "error_low": _finite(lo), "error_high": _finite(hi), "bound": bound,
            "verdict": status, "how": m.how, "samples": m.samples}


__all__ = ["BOUNDS", "PredictOptions", "predict"]
