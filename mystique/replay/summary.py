"""What a replay measured: ``summary.json`` (:func:`summarize`, keys :data:`SUMMARY_KEYS`) and
``ops.csv`` (:func:`ops_csv_text`, columns :data:`OPS_COLUMNS`)."""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any

from ..io import csv_text
from ..timing import Paired
from .boundness import BASIS_TEXT, Bound, basis_paired
from .fidelity import comparable, lacks, original_op_us, original_step, ratio_verdict, recorded_original
from .pins import routing_summary
from .plan import Plan
from .runtime import Executor

OPS_COLUMNS = ["index", "name", "overload", "input_shapes", "input_dtypes", "original_us", "replay_us",
               "status", "reason", "original_device_us", "time_error"]
#: the summary.json keys docs/design.md defines, in order
DESIGN_SUMMARY_KEYS = ("ops_total", "ops_replayed", "ops_skipped", "coverage", "coverage_by_time",
                       "original_step_ms", "replay_step_ms", "ratio")
#: every summary.json key: docs/design.md's, then the interval and the timing statistics
SUMMARY_KEYS = DESIGN_SUMMARY_KEYS + (
    "ratio_kind", "ratio_low", "ratio_high", "half_width", "verdict", "original_step_source",
    "recorded_original_step_ms", "recorded_ratio", "cross_device", "timing", "op_error", "lacks",
    "device_busy", "original_device_busy", "bound_by", "routing")


def _input_meta(plan: Plan, op: dict[str, Any]) -> tuple[str, str]:
    tensors = plan.data["tensors"]
    shapes, dtypes = [], []

    def walk(enc: Any) -> tuple[Any, Any]:
        if isinstance(enc, dict) and "t" in enc:
            t = tensors[enc["t"]]
            return t["shape"], t["dtype"]
        if isinstance(enc, list) and any(isinstance(e, (dict, list)) for e in enc):
            pairs = [walk(e) for e in enc]
            return [p[0] for p in pairs], [p[1] for p in pairs]
        return [], ""

    for enc in list(op.get("args", [])) + list(op.get("kwargs", {}).values()):
        s, d = walk(enc)
        shapes.append(s)
        dtypes.append(d)
    return json.dumps(shapes, separators=(",", ":")), json.dumps(dtypes, separators=(",", ":"))


def summarize(plan: Plan, e: Executor, step_times_s: list[float], device: str, *,
              paired: Paired | None = None, timing: dict[str, Any] | None = None,
              op_error: dict[str, Any] | None = None, device_name: str | None = None,
              bound: Bound | None = None) -> dict[str, Any]:
    """``summary.json`` of a replay (see docs/design.md): counts, coverage, step times and their ratio.

    ``coverage_by_time`` weighs each op by its original (Kineto) time over the ops whose time
    is known (device time for an accelerator original where Kineto has kernels, else host time);
    without any known time every op weighs the same (it then equals ``coverage``).

    With ``paired`` (the original step alternated with the replay in this process) ``ratio`` is the
    median paired ratio, ``ratio_low``/``ratio_high`` its 95% interval, ``original_step_ms`` and
    ``replay_step_ms`` the paired medians, ``ratio_kind`` ``"paired"`` and ``verdict`` the interval's
    against the band. Without, ``ratio`` is ``replay_step_ms`` over the recorded original
    (``ratio_kind`` ``"recorded"``, no interval, no verdict), null when the original step time is
    unknown or was measured on another kind of device than the replay's; ``cross_device`` says
    when the recorded original ran on another device model. ``recorded_*`` keep the recorded
    figures in either case.

    ``bound`` (:class:`.boundness.Bound`): what the step is bound by (``device_busy``,
    ``original_device_busy``, ``bound_by``); a paired ratio is then taken on its basis (a host-bound
    step's host timeline, else device time), which ``timing["basis"]`` names. Without it the paired
    ratio is on the rounds' own clock, as before, and the step is said to be host-bound on the CPU.
    """
    timing = dict(timing or {})
    paths = getattr(e, "path_counts", None)
    if paths is not None:  # which path the timed whole iterations took (issue 33: one per process?)
        timing["replay_path"] = {**paths, "compiled_failures": int(getattr(e, "_fast_failures", 0))}
    timing["cpu_affinity"] = _affinity()
    if bound is not None:
        timing.update(bound.timing())
        if paired is not None and paired.rounds:
            paired = basis_paired(paired, bound.basis)
            timing["ratios"] = paired.ratios
            timing["basis_text"] = BASIS_TEXT[bound.basis]
    c = e.counts()
    total = c["total"]
    replayed = c["replayed"]
    orig_total = original_ops_total(plan)
    coverage = replayed / orig_total if orig_total else 1.0
    known = [(t, st.state != "skipped") for op, st in zip(plan.ops, e.status)
             if (t := original_op_us(plan, op)) is not None]
    tot_t = sum(t for t, _ in known)
    coverage_by_time = (sum(t for t, ok in known if ok) / tot_t) if known and tot_t > 0 else coverage
    rec_ms, rec_source = recorded_original(plan)
    replay_ms = statistics.median(step_times_s) * 1e3 if step_times_s else math.nan
    same_kind = same_device_kind(plan, device)
    captured_on = plan.metadata.get("captured_on")
    recorded_ratio = replay_ms / rec_ms if rec_ms and same_kind and math.isfinite(replay_ms) else None
    cross = (not same_kind) or bool(captured_on and device_name and captured_on != device_name)
    lo = hi = hw = None
    verdict = None
    if paired is not None and paired.rounds:
        ratio: float | None = paired.ratio
        lo, hi = paired.interval
        hw = paired.half_width
        original: float | None = paired.b_median_ms
        replay_ms = paired.a_median_ms
        kind: str | None = "paired"
        source: str | None = "paired: the captured step rebuilt and run in this process"
        verdict = ratio_verdict(lo, hi)
        cross = False  # both sides ran here
    else:
        ratio = None if transformed(plan) else recorded_ratio  # a filtered/rescaled plan is another workload
        original = rec_ms
        kind = "recorded" if ratio is not None else None
        source = rec_source
    return {
        "ops_total": int(total),
        "ops_replayed": int(replayed),
        "ops_skipped": {k: int(v) for k, v in sorted(c["skipped"].items())},
        "coverage": float(coverage),
        "coverage_by_time": float(coverage_by_time),
        "original_step_ms": _f(original),
        "replay_step_ms": float(replay_ms),
        "ratio": _f(ratio),
        "ratio_kind": kind,
        "ratio_low": _f(lo),
        "ratio_high": _f(hi),
        "half_width": _f(hw),
        "verdict": verdict,
        "original_step_source": source,
        "recorded_original_step_ms": _f(rec_ms),
        "recorded_ratio": _f(recorded_ratio),
        "cross_device": bool(cross),
        "timing": timing,
        "op_error": op_error or {},
        "lacks": lacks(plan),
        "device_busy": _f(bound.replay_busy) if bound else None,
        "original_device_busy": _f(bound.original_busy) if bound else None,
        "bound_by": bound.bound_by if bound else (None if _kind(device) != "cpu" else "host"),
        "routing": routing_summary(plan, e),  # recorded vs replayed tokens per expert (pins.py); null: none
    }


def _affinity() -> int | None:
    """How many CPUs this process may run on (None where the OS does not say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _kind(device: str) -> str:
    return str(device).split(":")[0]


def original_ops_total(plan: Plan) -> int:
    """The op count of the trace the plan came from (before ``--keep``/``--drop``), at least the plan's."""
    n = plan.metadata.get("original_ops_total")
    return max(int(n), len(plan.ops)) if isinstance(n, int) else len(plan.ops)


def transformed(plan: Plan) -> str | None:
    """What changed the plan from the captured step (``"filtered, rescaled"``...), or None."""
    words = {"filter": "filtered", "batch_scale": "rescaled", "dtype": "retyped"}  # obfuscation keeps the work
    orig_dtype = (original_step(plan) or {}).get("dtype")
    done = [w for t in plan.metadata.get("transforms") or [] if isinstance(t, dict)
            for k, w in words.items() if k in t and not (k == "dtype" and t[k] == orig_dtype)]
    return ", ".join(dict.fromkeys(done)) or None


def _f(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def same_device_kind(plan: Plan, device: str) -> bool:
    """Whether the original step was timed on the same kind of device as ``device``."""
    orig = str(plan.metadata.get("original_device") or "cpu").split(":")[0]
    return orig == str(device).split(":")[0]


def ops_csv_text(plan: Plan, e: Executor, op_times_s: list[float], device: str | None = None) -> str:
    """ops.csv: one row per op of the plan, columns :data:`OPS_COLUMNS` (times in us, empty if unknown).

    ``original_us`` is the op's recorded host (CPU) time, ``original_device_us`` the recorded time of
    the kernels it launched (accelerator traces); ``time_error`` is ``replay / original - 1`` against
    the one of them :func:`fidelity.op_reference` picks (empty when either is unknown, or when the
    replay ran on another kind of device than recorded: ``device``)."""
    same = comparable(plan, device)
    return csv_text(OPS_COLUMNS, (_ops_row(plan, op, st, op_times_s, same) for op, st in zip(plan.ops, e.status)))


def _ops_row(plan: Plan, op: dict[str, Any], st: Any, op_times_s: list[float], same: bool) -> list[Any]:
    shapes, dtypes = _input_meta(plan, op)
    t = op_times_s[op["index"]] if op["index"] < len(op_times_s) else math.nan
    orig = op.get("orig_us")
    dev = op.get("orig_device_us")
    ref = original_op_us(plan, op)
    err = (t * 1e6 / ref - 1.0) if same and ref and math.isfinite(t) and t > 0 and st.state == "replayed" else None
    return [
        op["index"], op["name"], op.get("op", ""), shapes, dtypes,
        f"{orig:.3f}" if isinstance(orig, (int, float)) else "",
        f"{t * 1e6:.3f}" if not math.isnan(t) else "",
        st.state, st.reason or (f"{st.fallbacks} result(s) replaced by synthetic tensors (shape or dtype "
                                f"differed from the trace)" if st.fallbacks else ""),
        f"{dev:.3f}" if isinstance(dev, (int, float)) else "",
        f"{err:.4f}" if err is not None else "",
    ]
