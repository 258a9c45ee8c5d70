"""``mystique replay``: run a benchmark (or a trace) and measure how close the replay is.

Writes ``OUT_DIR/ops.csv``, ``OUT_DIR/summary.json`` (keys and types as DESIGN.md defines) and
``OUT_DIR/results.csv`` (suite ``replay``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import EnvironmentUnsupported, UsageError
from ..io import atomic_write_text, check_output_dir, staged_output_dir
from ..progress import Progress
from . import executor as ex
from .plan import Plan, plan_from_path

OPS_COLUMNS = ["index", "name", "overload", "input_shapes", "input_dtypes", "original_us", "replay_us",
               "status", "reason"]
SUMMARY_KEYS = ("ops_total", "ops_replayed", "ops_skipped", "coverage", "coverage_by_time",
                "original_step_ms", "replay_step_ms", "ratio")
RATIO_LOW, RATIO_HIGH = 0.90, 1.10


def make_executor(plan: Plan, device: str, seed: int = 0) -> ex.Executor:
    """An executor for ``plan`` on ``device``, memory checked (EnvironmentUnsupported if short)."""
    try:
        e = ex.Executor(plan.data, device, seed=seed)
        e.prepare()
    except ex.InsufficientMemory as exc:
        raise EnvironmentUnsupported(str(exc)) from exc
    except ex.ReplayError as exc:
        raise UsageError(str(exc)) from exc
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UsageError(f"malformed benchmark plan: {type(exc).__name__}: {exc}") from exc
    return e


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


def summarize(plan: Plan, e: ex.Executor, step_times_s: list[float], device: str) -> dict[str, Any]:
    """``summary.json`` of a replay (see DESIGN.md): counts, coverage, step times and their ratio.

    ``coverage_by_time`` weighs each op by its original (Kineto) time over the ops whose time
    is known; without any known time every op weighs the same (it then equals ``coverage``).
    ``ratio`` is null when the original step time is unknown or was measured on another kind of
    device than the replay's.
    """
    c = e.counts()
    total = c["total"]
    replayed = c["replayed"]
    coverage = replayed / total if total else 1.0
    known = [(op.get("orig_us"), st.state != "skipped") for op, st in zip(plan.ops, e.status)
             if isinstance(op.get("orig_us"), (int, float)) and op["orig_us"] >= 0]
    tot_t = sum(t for t, _ in known)
    coverage_by_time = (sum(t for t, ok in known if ok) / tot_t) if known and tot_t > 0 else coverage
    original = plan.metadata.get("original_step_ms")
    replay_ms = statistics.median(step_times_s) * 1e3 if step_times_s else math.nan
    ratio = None
    if isinstance(original, (int, float)) and original > 0 and same_device_kind(plan, device):
        ratio = replay_ms / float(original)
    return {
        "ops_total": int(total),
        "ops_replayed": int(replayed),
        "ops_skipped": {k: int(v) for k, v in sorted(c["skipped"].items())},
        "coverage": float(coverage),
        "coverage_by_time": float(coverage_by_time),
        "original_step_ms": float(original) if isinstance(original, (int, float)) else None,
        "replay_step_ms": float(replay_ms),
        "ratio": float(ratio) if ratio is not None else None,
    }


def same_device_kind(plan: Plan, device: str) -> bool:
    """Whether the original step was timed on the same kind of device as ``device``."""
    orig = str(plan.metadata.get("original_device") or "cpu").split(":")[0]
    return orig == str(device).split(":")[0]


def ops_csv_text(plan: Plan, e: ex.Executor, op_times_s: list[float]) -> str:
    """ops.csv: one row per op of the plan, columns :data:`OPS_COLUMNS` (times in us, empty if unknown)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OPS_COLUMNS)
    for op, st in zip(plan.ops, e.status):
        shapes, dtypes = _input_meta(plan, op)
        t = op_times_s[op["index"]] if op["index"] < len(op_times_s) else math.nan
        orig = op.get("orig_us")
        w.writerow([
            op["index"], op["name"], op.get("op", ""), shapes, dtypes,
            f"{orig:.3f}" if isinstance(orig, (int, float)) else "",
            f"{t * 1e6:.3f}" if not math.isnan(t) else "",
            st.state, st.reason or (f"{st.fallbacks} result(s) replaced by synthetic tensors (shape or dtype "
                                    f"differed from the trace)" if st.fallbacks else ""),
        ])
    return buf.getvalue()


def _results(summary: dict[str, Any], e: ex.Executor, plan: Plan, device: str, subject: str,
             target: Any, iters: int, warmup: int, seed: int):
    from ..results import Results, RunContext

    res = Results(RunContext.for_target(target), "replay")
    c = e.counts()
    floats = Counter(t["dtype"] for t in plan.tensors if t["dtype"] in ("float32", "float16", "bfloat16", "float64"))
    dtype = floats.most_common(1)[0][0] if floats else ""
    collectives = sum(n for name, n in c["skipped"].items() if c["reasons"].get(name) == "collective")
    compute_total = c["total"] - collectives
    compute_cov = c["replayed"] / compute_total if compute_total else 1.0
    missing = {k: v for k, v in c["skipped"].items() if c["reasons"].get(k) != "collective"}
    detail = "; ".join(f"{k} x{v}: {c['reasons'].get(k, '')}" for k, v in sorted(missing.items()))
    res.add("replay_coverage", subject, "coverage", summary["coverage"], threshold=1.0, dtype=dtype,
            status="pass" if compute_cov >= 1.0 else "fail",
            detail=(f"compute ops replayed {c['replayed']}/{compute_total}"
                    + (f"; {collectives} collectives skipped" if collectives else "")
                    + (f"; not replayed: {detail}" if detail else "")))
    res.add("replay_coverage_by_time", subject, "coverage_by_time", summary["coverage_by_time"], dtype=dtype,
            status="pass" if summary["coverage_by_time"] >= 1.0 or compute_cov >= 1.0 else "fail",
            detail="weighted by original op times" if plan.metadata.get("original_op_times")
            else "no original op times: every op weighs the same")
    res.add("replay_step_time", subject, "median_ms", summary["replay_step_ms"], unit="ms", status="pass", dtype=dtype,
            detail=f"median of {iters} whole iterations after {warmup} warm-up; {_threads_note(plan, device)}seed {seed}")
    ratio = summary["ratio"]
    if ratio is None:
        why = ("original step time unknown" if summary["original_step_ms"] is None else
               f"original timed on {plan.metadata.get('original_device')}, replayed on {device}")
        res.add("replay_step_time_ratio", subject, "ratio", None, threshold=None, status="skip", dtype=dtype,
                detail=why)
    else:
        ok = RATIO_LOW <= ratio <= RATIO_HIGH
        res.add("replay_step_time_ratio", subject, "ratio", ratio, threshold=RATIO_HIGH if ratio > 1 else RATIO_LOW, dtype=dtype,
                status="pass" if ok else "fail",
                detail=f"replay {summary['replay_step_ms']:.3f} ms / original {summary['original_step_ms']:.3f} ms; "
                       f"pass within {RATIO_LOW:.2f}-{RATIO_HIGH:.2f}; seed {seed}")
    res.add("replay_output_fallbacks", subject, "count", c["fallbacks"],
            status="pass", detail="op results whose shape or dtype disagreed with the trace, replaced by synthetic tensors")
    res.add("replay_peak_memory", subject, "bytes", e.peak_bytes(), unit="B", status="pass",
            detail="late-allocation / early-free schedule of the plan")
    return res.frame()


def _threads_note(plan: Plan, device: str) -> str:
    if str(device).split(":")[0] != "cpu":
        return ""
    import torch

    orig = plan.metadata.get("original_threads")
    return f"{torch.get_num_threads()} CPU threads" + (f" (captured with {orig})" if orig else "") + "; "


def replay(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    device: str = "cpu",
    iters: int = 10,
    warmup: int = 3,
    iteration: int | None = None,
    force: bool = False,
    op_iters: int | None = None,
    seed: int = 0,
    threads: int | None = None,
) -> tuple[dict[str, Any], Any]:
    """Replay a benchmark dir / ``benchmark.json`` / trace dir / ET file on ``device``.

    Runs one untimed probe iteration, ``warmup`` untimed ones, ``iters`` whole iterations timed
    with one synchronisation each (their median is ``replay_step_ms``), then ``op_iters``
    (default ``min(iters, 3)``) per-op timed passes for ops.csv. On the CPU it runs with the
    captured step's thread count (``threads``: see :func:`executor.replay_threads`; torch's setting
    is restored afterwards). Returns ``(summary, results DataFrame)`` and writes ops.csv,
    summary.json and results.csv into ``out_dir``.
    """
    import torch

    from ..targets import make_target

    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    if threads is not None and threads < 0:
        raise UsageError("--threads must be at least 0")
    check_output_dir(out_dir, force)
    target = make_target(device)
    prog = Progress("replay")
    prog.note(f"reading {source}")
    plan, kind = plan_from_path(source, iteration)
    n = ex.replay_threads(plan.data, torch.device(target.device), threads)
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        return _replay(plan, kind, source, out_dir, target, prog, iters=iters, warmup=warmup, force=force,
                       op_iters=op_iters, seed=seed)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def subject_of(plan: Plan, source: str | os.PathLike, kind: str) -> str:
    """The ``subject`` of a replay's result rows.

    The captured workload (``llama/small/train``, or the user's ``package.module:function``) when
    the plan knows it (from ``capture.json``); else the benchmark folder's name for a benchmark,
    the trace folder's name for a trace dir, and the file name for a bare ET file.
    """
    named = plan.metadata.get("subject")
    if isinstance(named, str) and named:
        return named
    p = Path(source)
    if p.is_dir():
        return p.resolve().name or str(source)
    if kind == "benchmark" or p.name in ("trace.json", "trace.json.gz"):
        return p.resolve().parent.name or p.name
    return p.name or str(source)


def _replay(plan: Plan, kind: str, source: str | os.PathLike, out_dir: str | os.PathLike, target: Any,
            prog: Progress, *, iters: int, warmup: int, force: bool, op_iters: int | None,
            seed: int) -> tuple[dict[str, Any], Any]:
    from ..results import write_csv

    subject = subject_of(plan, source, kind)
    n_ext = len(plan.data.get("inputs", []))
    e = make_executor(plan, target.device, seed=seed)
    prog.note(f"{len(plan.ops)} ops, {n_ext} input tensors materialised; peak memory "
              f"{e.peak_bytes() / 2**20:.1f} MiB; probing")
    e.probe()
    c = e.counts()
    prog.note(f"probe: {c['replayed']}/{c['total']} ops replayed, {sum(c['skipped'].values())} skipped")
    for i in range(warmup):
        e.run_iteration()
        prog.note(f"warm-up {i + 1}/{warmup}")
    step_times = []
    for i in range(iters):
        step_times.extend(e.time_iterations(1, 0))
        prog.note(f"iteration {i + 1}/{iters}: {step_times[-1] * 1e3:.3f} ms")
    n_op = op_iters if op_iters is not None else min(iters, 3)
    runs = []
    for i in range(max(1, n_op)):
        runs.append(e.run_iteration(per_op=True))
        prog.note(f"per-op pass {i + 1}/{n_op}")
    op_times = [statistics.median(xs) if (xs := [r[j] for r in runs if not math.isnan(r[j])]) else math.nan
                for j in range(len(plan.ops))]
    summary = summarize(plan, e, step_times, target.device)
    df = _results(summary, e, plan, target.device, subject, target, iters, warmup, seed)
    with staged_output_dir(out_dir, force) as stage:
        atomic_write_text(stage / "ops.csv", ops_csv_text(plan, e, op_times))
        atomic_write_text(stage / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
        write_csv(df, stage / "results.csv")
    ratio = summary["ratio"]
    prog.note(f"replay step {summary['replay_step_ms']:.3f} ms"
              + (f", original {summary['original_step_ms']:.3f} ms, ratio {ratio:.3f}" if ratio is not None else ""))
    return summary, df
