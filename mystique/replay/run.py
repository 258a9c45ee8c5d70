"""``mystique replay``: run a benchmark (or a trace) and measure how close the replay is.

Writes ``OUT_DIR/ops.csv``, ``OUT_DIR/summary.json`` (keys and types as DESIGN.md defines, and the
timing statistics beside them) and ``OUT_DIR/results.csv`` (suite ``replay``). Where the captured
step can be rebuilt here, the replay is timed side by side with it (paired ABBA rounds, see
:mod:`mystique.replay.fidelity`); otherwise against what the trace recorded, labelled as such.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import EnvironmentUnsupported, UsageError
from ..io import atomic_write_text, check_output_dir, staged_output_dir
from ..progress import Progress
from ..timing import Paired, loadavg
from . import executor as ex
from . import fidelity as fid
from .fidelity import RATIO_HIGH, RATIO_LOW
from .plan import Plan, plan_from_path

OPS_COLUMNS = ["index", "name", "overload", "input_shapes", "input_dtypes", "original_us", "replay_us",
               "status", "reason", "original_device_us", "time_error"]
#: DESIGN.md's summary.json keys, in order
DESIGN_SUMMARY_KEYS = ("ops_total", "ops_replayed", "ops_skipped", "coverage", "coverage_by_time",
                       "original_step_ms", "replay_step_ms", "ratio")
#: every summary.json key: DESIGN.md's, then the interval and the timing statistics
SUMMARY_KEYS = DESIGN_SUMMARY_KEYS + (
    "ratio_kind", "ratio_low", "ratio_high", "half_width", "verdict", "original_step_source",
    "recorded_original_step_ms", "recorded_ratio", "cross_device", "timing", "op_error", "lacks")
DEFAULT_HALF_WIDTH = 0.025
DEFAULT_TIME_CAP_S = 60.0
#: the largest share of replayed ops whose results may be synthetic before ``replay_output_fallbacks``
#: fails: each one replaces an op's work by a made-up tensor, so past 1% of the ops the replay's time
#: is no longer the captured work's (no-ops are counted apart: they were recorded as doing no work)
FALLBACK_SHARE_MAX = 0.01
#: which side of its threshold a checked row's value must lie on to pass (``band``: within
#: RATIO_LOW-RATIO_HIGH); a row never reads pass with its value on the wrong side
ROW_DIRECTIONS = {"replay_coverage": "min", "replay_output_fallbacks": "max", "replay_step_time_ratio": "band"}
__all__ = ["OPS_COLUMNS", "RATIO_HIGH", "RATIO_LOW", "SUMMARY_KEYS", "make_executor", "replay", "summarize"]


def make_executor(plan: Plan, device: str, seed: int = 0, pacing: str = "none",
                  allow_ops: Sequence[str] = ()) -> ex.Executor:
    """An executor for ``plan`` on ``device`` with ``pacing`` (``none`` | ``recorded``), memory checked
    (EnvironmentUnsupported when the device cannot hold the plan's tensors); ``allow_ops``: patterns of
    operators outside ``executor.ALLOWED_OP_NAMESPACES`` it may call (``--allow-ops``)."""
    import torch

    try:
        e = ex.Executor(plan.data, device, seed=seed, pacing=pacing, allow_ops=allow_ops)
        e.prepare()
    except (ex.InsufficientMemory, MemoryError, torch.OutOfMemoryError) as exc:
        raise EnvironmentUnsupported(str(exc) or "out of memory") from exc
    except ex.ReplayError as exc:
        raise UsageError(str(exc)) from exc
    except RuntimeError as exc:
        if "alloc_cpu" in str(exc) or ("alloc" in str(exc).lower() and "memory" in str(exc).lower()):
            raise EnvironmentUnsupported(f"the plan's tensors do not fit on {device}: {str(exc).splitlines()[0]}") from exc
        raise
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


def summarize(plan: Plan, e: ex.Executor, step_times_s: list[float], device: str, *,
              paired: Paired | None = None, timing: dict[str, Any] | None = None,
              op_error: dict[str, Any] | None = None, device_name: str | None = None) -> dict[str, Any]:
    """``summary.json`` of a replay (see DESIGN.md): counts, coverage, step times and their ratio.

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
    """
    c = e.counts()
    total = c["total"]
    replayed = c["replayed"]
    orig_total = original_ops_total(plan)
    coverage = replayed / orig_total if orig_total else 1.0
    known = [(t, st.state != "skipped") for op, st in zip(plan.ops, e.status)
             if (t := fid.original_op_us(plan, op)) is not None]
    tot_t = sum(t for t, _ in known)
    coverage_by_time = (sum(t for t, ok in known if ok) / tot_t) if known and tot_t > 0 else coverage
    rec_ms, rec_source = fid.recorded_original(plan)
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
        verdict = fid.ratio_verdict(lo, hi)
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
        "timing": timing or {},
        "op_error": op_error or {},
        "lacks": fid.lacks(plan),
    }


def original_ops_total(plan: Plan) -> int:
    """The op count of the trace the plan came from (before ``--keep``/``--drop``), at least the plan's."""
    n = plan.metadata.get("original_ops_total")
    return max(int(n), len(plan.ops)) if isinstance(n, int) else len(plan.ops)


def transformed(plan: Plan) -> str | None:
    """What changed the plan from the captured step (``"filtered, rescaled"``...), or None."""
    words = {"filter": "filtered", "batch_scale": "rescaled", "dtype": "retyped"}  # obfuscation keeps the work
    orig_dtype = (fid.original_step(plan) or {}).get("dtype")
    done = [w for t in plan.metadata.get("transforms") or [] if isinstance(t, dict)
            for k, w in words.items() if k in t and not (k == "dtype" and t[k] == orig_dtype)]
    return ", ".join(dict.fromkeys(done)) or None


def _f(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def same_device_kind(plan: Plan, device: str) -> bool:
    """Whether the original step was timed on the same kind of device as ``device``."""
    orig = str(plan.metadata.get("original_device") or "cpu").split(":")[0]
    return orig == str(device).split(":")[0]


def ops_csv_text(plan: Plan, e: ex.Executor, op_times_s: list[float], device: str | None = None) -> str:
    """ops.csv: one row per op of the plan, columns :data:`OPS_COLUMNS` (times in us, empty if unknown).

    ``original_us`` is the op's recorded host (CPU) time, ``original_device_us`` the recorded time of
    the kernels it launched (accelerator traces); ``time_error`` is ``replay / original - 1`` against
    the one of them :func:`fidelity.op_reference` picks (empty when either is unknown, or when the
    replay ran on another kind of device than recorded: ``device``)."""
    same = fid.comparable(plan, device)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OPS_COLUMNS)
    for op, st in zip(plan.ops, e.status):
        shapes, dtypes = _input_meta(plan, op)
        t = op_times_s[op["index"]] if op["index"] < len(op_times_s) else math.nan
        orig = op.get("orig_us")
        dev = op.get("orig_device_us")
        ref = fid.original_op_us(plan, op)
        err = (t * 1e6 / ref - 1.0) if same and ref and math.isfinite(t) and t > 0 and st.state == "replayed" \
            else None
        w.writerow([
            op["index"], op["name"], op.get("op", ""), shapes, dtypes,
            f"{orig:.3f}" if isinstance(orig, (int, float)) else "",
            f"{t * 1e6:.3f}" if not math.isnan(t) else "",
            st.state, st.reason or (f"{st.fallbacks} result(s) replaced by synthetic tensors (shape or dtype "
                                    f"differed from the trace)" if st.fallbacks else ""),
            f"{dev:.3f}" if isinstance(dev, (int, float)) else "",
            f"{err:.4f}" if err is not None else "",
        ])
    return buf.getvalue()


def reproduce_command(source: Any, device: str, seed: int, **opts: Any) -> str:
    """The ``mystique replay`` command line that reruns this replay (options that differ from the defaults)."""
    cmd = f"mystique replay {source} -o OUT --device {device} --seed {seed}"
    for k, v in opts.items():
        for one in (v if isinstance(v, (list, tuple)) else [v]):
            if one is not None:
                cmd += f" --{k.replace('_', '-')} {one}"
    return cmd


class _Rows:
    """Results whose every row's detail ends with ``reproduce: <command>``."""

    def __init__(self, res: Any, command: str):
        self.res, self.command = res, command

    def add(self, *args: Any, detail: str = "", **kw: Any) -> None:
        self.res.add(*args, detail=(f"{detail}; " if detail else "") + f"reproduce: {self.command}", **kw)

    def frame(self) -> Any:
        return self.res.frame()


def _results(summary: dict[str, Any], e: ex.Executor, plan: Plan, device: str, subject: str,
             target: Any, iters: int, warmup: int, seed: int, reproduce: str | None = None):
    from ..results import Results, RunContext

    res = _Rows(Results(RunContext.for_target(target), "replay"),
                reproduce or reproduce_command("BENCH", device, seed, iters=iters, warmup=warmup))
    c = e.counts()
    floats = Counter(t["dtype"] for t in plan.tensors if t["dtype"] in ("float32", "float16", "bfloat16", "float64"))
    dtype = floats.most_common(1)[0][0] if floats else ""
    collectives = sum(n for name, n in c["skipped"].items() if c["reasons"].get(name) == "collective")
    orig_total = original_ops_total(plan)
    dropped = orig_total - c["total"]  # removed by generate --keep/--drop: not replayed either
    compute_total = orig_total - collectives
    compute_cov = c["replayed"] / compute_total if compute_total else 1.0
    missing = {k: v for k, v in c["skipped"].items() if c["reasons"].get(k) != "collective"}
    detail = "; ".join(f"{k} x{v}: {c['reasons'].get(k, '')}" for k, v in sorted(missing.items()))
    # the value shown is the one checked (compute ops: skipped collectives are no failure), so a
    # value below the threshold never reads pass
    res.add("replay_coverage", subject, "coverage", compute_cov, threshold=1.0, dtype=dtype,
            status="pass" if compute_cov >= 1.0 else "fail",
            detail=(f"compute ops replayed {c['replayed']}/{compute_total} of the original trace's ops "
                    f"(pass at 1.0: every compute op replayed); all ops {c['replayed']}/{orig_total} "
                    f"({summary['coverage']:.3f})"
                    + (f", of which {c['noop']} no-op(s) (recorded as no work)" if c.get("noop") else "")
                    + (f"; {collectives} collectives skipped" if collectives else "")
                    + (f"; {dropped} op(s) removed by generate ({transformed(plan)}): not replayed" if dropped else "")
                    + (f"; not replayed: {detail}" if detail else "")))
    ref = fid.op_reference(plan)
    by_time_detail = (f"weighted by original (Kineto) {ref} op times" if plan.metadata.get("original_op_times")
                      else "no original op times (no Kineto trace): every op weighs the same")
    if dropped:  # the filtered plan no longer holds the removed ops' times: no claim over the original
        res.add("replay_coverage_by_time", subject, "coverage_by_time", summary["coverage_by_time"], dtype=dtype,
                status="info", detail=f"over the {c['total']} ops the {transformed(plan)} plan kept, not the "
                f"original's {orig_total}: no verdict; {by_time_detail}")
    else:
        res.add("replay_coverage_by_time", subject, "coverage_by_time", summary["coverage_by_time"], dtype=dtype,
                status="pass" if summary["coverage_by_time"] >= 1.0 or compute_cov >= 1.0 else "fail",
                detail=by_time_detail)
    t = summary["timing"]
    threads = _threads_note(plan, device)
    if summary["ratio_kind"] == "paired" and str(device).split(":")[0] == "cpu":
        orig = plan.metadata.get("original_threads")
        threads = (f"{t['threads']} CPU threads" + (f" (captured with {orig})" if orig else "")
                   + (f", {t['threads_reason']}" if t.get("threads_reason") and t["threads"] != t.get(
                       "threads_captured") else "") + "; ")
    lacking = "; ".join(summary["lacks"])
    if summary["ratio_kind"] == "paired":
        how = (f"median of {t['rounds']} paired rounds ({t['order']}, alternating with the original step in this "
               f"process) after {t['warmup_rounds']} warm-up rounds ({t['warmup_s']:.1f} s"
               f"{'' if t['warmup_settled'] else ', not settled: time cap'}); clock {t['clock']}; "
               f"pacing {t['pacing']}; {threads}seed {seed}")
        res.add("replay_step_time", subject, "median_ms", summary["replay_step_ms"], unit="ms", status="info",
                dtype=dtype, detail=how)
        spec = fid.original_step(plan) or {}
        res.add("original_step_time", subject, "median_ms", summary["original_step_ms"], unit="ms", status="info",
                dtype=dtype, detail=f"the captured step ({spec.get('target')}) rebuilt here, same seed; {how}")
        lo, hi, ratio = summary["ratio_low"], summary["ratio_high"], summary["ratio"]
        verdict = summary["verdict"]
        edge = RATIO_HIGH if (hi if hi is not None else ratio) > 1 else RATIO_LOW
        hw = summary["half_width"]
        load = t.get("loadavg_end") or t.get("loadavg_start")
        detail = (f"paired median replay/original of {t['rounds']} rounds, 95% interval "
                  f"[{_fmt(lo)}, {_fmt(hi)}] (half-width {_pct(hw)}, target {_pct(t['half_width_target'])}; stopped "
                  f"on {t['stop']}); pass when the interval lies within {RATIO_LOW:.2f}-{RATIO_HIGH:.2f}, fail when "
                  f"outside"
                  + {"pass": ": it lies within", "fail": ": it lies outside",
                     "inconclusive": ": it straddles an edge, inconclusive (more rounds with --time-cap, or a quieter "
                                     "host, may decide)"}.get(str(verdict), "")
                  + (f"; load average {load[0]:.2f}" if load else "") + f"; seed {seed}")
        res.add("replay_step_time_ratio", subject, "ratio", ratio, threshold=edge, dtype=dtype, status=verdict,
                detail=detail)
        res.add("replay_step_time_ratio", subject, "ratio_ci_low", lo, dtype=dtype, status="info",
                detail="95% interval of the median paired ratio (order statistics), lower bound")
        res.add("replay_step_time_ratio", subject, "ratio_ci_high", hi, dtype=dtype, status="info",
                detail="95% interval of the median paired ratio (order statistics), upper bound")
    else:
        res.add("replay_step_time", subject, "median_ms", summary["replay_step_ms"], unit="ms", status="info",
                dtype=dtype, detail=f"median of {iters} whole iterations after {warmup} warm-up; {threads}seed {seed}"
                + (f"; not paired: {t.get('why_not_paired')}" if t.get("why_not_paired") else ""))
        ratio = summary["ratio"]
        why_np = t.get("why_not_paired") or ""
        changed = transformed(plan)
        if ratio is None:
            if changed and summary["original_step_ms"] is not None:
                why = (f"not comparable: the plan was {changed} by generate, so it is not the captured step "
                       f"(replay {summary['replay_step_ms']:.3f} ms, recorded original "
                       f"{summary['original_step_ms']:.3f} ms)")
            elif summary["original_step_ms"] is None:
                why = "no recorded original step time"
            else:
                why = (f"cross-device comparison: original timed on {plan.metadata.get('original_device')}, "
                       f"replayed on {device}: no fidelity claimed")
            res.add("replay_step_time_ratio", subject, "ratio", None, threshold=None, status="skip", dtype=dtype,
                    detail=why + (f"; not paired: {why_np}" if why_np else "") + (f"; lacks: {lacking}" if lacking else ""))
        else:
            cross = (f"cross-device comparison: captured on {plan.metadata.get('captured_on')}, replayed on "
                     f"{RunContext.for_target(target).device_name}: no fidelity claimed; " if summary["cross_device"]
                     else "")
            res.add("replay_step_time_ratio", subject, "ratio", ratio, dtype=dtype, status="info",
                    detail=cross + f"recorded (not paired): replay {summary['replay_step_ms']:.3f} ms / "
                           f"{summary['original_step_source']} {summary['original_step_ms']:.3f} ms, measured at "
                           f"different times: a measurement, no verdict"
                           + (f"; not paired: {why_np}" if why_np else "") + f"; seed {seed}")
    oe = summary["op_error"]
    if oe.get("ops_compared"):
        ref_words = f"recorded Kineto {oe['reference']} time (profiled)"
        res.add("replay_op_time_error", subject, "median_abs_error", oe["median_abs_error"], dtype=dtype,
                status="info", detail=f"|replay/original - 1| per op over {oe['ops_compared']} ops against the "
                f"{ref_words}; 90th percentile {oe['p90_abs_error']:.3f}; per-op table in ops.csv")
        for row in oe["by_op_type"]:
            res.add("replay_op_time_error", f"{subject}/{row['op']}", "median_abs_error", row["median_abs_error"],
                    dtype=dtype, status="info",
                    detail=f"{row['n']} op(s); 90th percentile {row['p90_abs_error']:.3f}; recorded "
                           f"{row['original_us']:.1f} us, replayed {row['replay_us']:.1f} us in all")
    else:
        why = [f"cross-device: recorded on {plan.metadata.get('original_device')}, replayed on {device}"
               ] if oe.get("cross_device") else []
        why += summary["lacks"]
        res.add("replay_op_time_error", subject, "median_abs_error", None, dtype=dtype, status="skip",
                detail="no per-op comparison: " + ("; ".join(why) or "no op with a recorded and a replayed time"))
    # ops with a synthetic result, plus views the executor had to synthesise (each one substitution)
    subst = sum(1 for st in e.status if st.fallbacks) + int(getattr(e, "_fallbacks", 0))
    replayed = c["replayed"]
    share = subst / replayed if replayed else 0.0
    res.add("replay_output_fallbacks", subject, "share", share, threshold=FALLBACK_SHARE_MAX, dtype=dtype,
            status="pass" if share <= FALLBACK_SHARE_MAX else "fail",
            detail=f"{subst} of {replayed} replayed op(s) had results replaced by synthetic tensors (shape or dtype "
                   f"disagreed with the trace; {c['fallbacks']} result(s) in all); {c.get('noop', 0)} no-op(s) "
                   f"counted apart; pass at most {FALLBACK_SHARE_MAX:.0%} of the replayed ops, since each "
                   f"fallback replaces an op's work by a synthetic output")
    res.add("replay_peak_memory", subject, "bytes", e.peak_bytes(), unit="B", status="info",
            detail="late-allocation / early-free schedule of the plan")
    return res.frame()


def _fmt(v: float | None) -> str:
    return f"{v:.3f}" if v is not None else "n/a"


def _pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None and math.isfinite(v) else "n/a"


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
    timing: str = "auto",
    half_width: float = DEFAULT_HALF_WIDTH,
    time_cap: float = DEFAULT_TIME_CAP_S,
    pacing: str = "none",
    allow_ops: Sequence[str] = (),
) -> tuple[dict[str, Any], Any]:
    """Replay a benchmark dir / ``benchmark.json`` / trace dir / ET file on ``device``.

    Runs one untimed probe iteration, then times the replay:

    - ``timing="auto"`` (default) or ``"paired"``: where the captured step can be rebuilt here
      (:func:`fidelity.rebuild_original`), the replay and the original alternate in paired ABBA
      rounds after a warm-up until stable (at least ``warmup`` rounds), at least ``iters`` rounds,
      until the 95% interval of the median ratio has a relative half-width of at most
      ``half_width`` or ``time_cap`` seconds are spent. ``"paired"`` fails (UsageError) where that
      is impossible; ``"auto"`` then falls back to recorded timing and says why.
    - ``timing="recorded"``: ``warmup`` untimed iterations, ``iters`` whole iterations timed with one
      synchronisation each, compared with the recorded original (a measurement, no verdict).

    Then ``op_iters`` (default ``min(iters, 3)``) per-op timed passes for ops.csv. On the CPU both
    sides run with the captured step's thread count (``threads``: see
    :func:`executor.replay_threads`; torch's setting is restored afterwards). ``pacing`` goes to the
    executor (``none``: ops back to back), as do ``allow_ops`` (with the plan builder: fnmatch patterns of
    operators outside ``executor.ALLOWED_OP_NAMESPACES`` to call, else skipped). Returns ``(summary, results DataFrame)`` and writes ops.csv,
    summary.json and results.csv into ``out_dir``.
    """
    import torch

    from ..targets import make_target

    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    if threads is not None and threads < 0:
        raise UsageError("--threads must be at least 0")
    if timing not in fid.TIMINGS:
        raise UsageError(f"unknown timing {timing!r}; expected one of {', '.join(fid.TIMINGS)}")
    if pacing not in fid.PACINGS:
        raise UsageError(f"unknown pacing {pacing!r}; expected one of {', '.join(fid.PACINGS)}")
    if not (half_width > 0 and time_cap > 0):
        raise UsageError("--half-width and --time-cap must be positive")
    check_output_dir(out_dir, force)
    target = make_target(device)
    prog = Progress("replay")
    prog.note(f"reading {source}")
    plan, kind = plan_from_path(source, iteration, allow_ops)
    n = ex.replay_threads(plan.data, torch.device(target.device), threads)
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        return _replay(plan, kind, source, out_dir, target, prog, iters=iters, warmup=warmup, force=force,
                       op_iters=op_iters, seed=seed, timing=timing, half_width=half_width, time_cap=time_cap,
                       pacing=pacing, threads_asked=threads, allow_ops=allow_ops)
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
            seed: int, timing: str = "auto", half_width: float = DEFAULT_HALF_WIDTH,
            time_cap: float = DEFAULT_TIME_CAP_S, pacing: str = "none",
            threads_asked: int | None = None, allow_ops: Sequence[str] = ()) -> tuple[dict[str, Any], Any]:
    import torch

    from ..results import write_csv

    subject = subject_of(plan, source, kind)
    n_ext = len(plan.data.get("inputs", []))
    e = make_executor(plan, target.device, seed=seed, pacing=pacing, allow_ops=allow_ops)
    prog.note(f"{len(plan.ops)} ops, {n_ext} input tensors materialised; peak memory "
              f"{e.peak_bytes() / 2**20:.1f} MiB; probing")
    e.probe()
    c = e.counts()
    prog.note(f"probe: {c['replayed']}/{c['total']} ops replayed, {sum(c['skipped'].values())} skipped")
    load0 = loadavg()
    gpu0 = fid.gpu_clocks(target.device)
    original, why = fid.rebuild_original(plan, target.device, timing)
    paired: Paired | None = None
    step_times: list[float] = []
    paired_threads = torch.get_num_threads()
    threads_note: dict[str, Any] = {}
    if original is not None:
        spec = fid.original_step(plan) or {}
        prog.note(f"paired timing: the replay alternates with {spec.get('target')} rebuilt here (ABBA rounds, "
                  f"until the 95% interval is within {half_width:.1%} or {time_cap:g} s)")
        set_threads = torch.get_num_threads()
        threads_note = fid.busy_host_threads(target, threads_asked, prog.note)
        try:
            paired = fid.measure_paired(e, original, target.device, half_width=half_width, time_cap_s=time_cap,
                                        min_rounds=iters, min_warmup=warmup, progress=prog.note,
                                        threads_note=threads_note or None)
        except Exception as exc:  # noqa: BLE001 - the user's step failed: fall back, saying why
            if timing == "paired":
                raise UsageError(f"--timing paired: the original step failed: {type(exc).__name__}: {exc}") from exc
            why = f"the original step failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            paired = None
        finally:
            paired_threads = torch.get_num_threads()
            if paired_threads != set_threads:
                torch.set_num_threads(set_threads)  # the per-op passes run with the captured setting
        original = None  # free the original's model before the per-op passes
        if paired is not None:
            step_times = [ms / 1e3 for ms in paired.a_ms]
            lo, hi = paired.interval
            prog.note(f"paired: {paired.rounds} rounds, ratio {paired.ratio:.3f} [{lo:.3f}, {hi:.3f}] "
                      f"({paired.stop})")
    if paired is None:
        prog.note(f"recorded timing ({why})")
        for i in range(warmup):
            e.run_iteration()
            prog.note(f"warm-up {i + 1}/{warmup}")
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
    stats = fid.timing_stats(paired, why=why, step_times_s=step_times, iters=iters, warmup=warmup, pacing=pacing,
                             device=target.device,
                             threads=paired_threads if paired is not None else torch.get_num_threads(),
                             load_start=load0, gpu_before=gpu0)
    if paired is not None:
        stats.update(threads_note)
    summary = summarize(plan, e, step_times, target.device, paired=paired, timing=stats,
                        op_error=fid.op_errors(plan, e, op_times, device=target.device),
                        device_name=target.info().name)
    df = _results(summary, e, plan, target.device, subject, target, iters, warmup, seed,
                  reproduce=reproduce_command(source, target.device, seed, iters=iters, warmup=warmup,
                                              timing=timing if timing != "auto" else None,
                                              pacing=pacing if pacing != "none" else None,
                                              threads=threads_asked,
                                              half_width=half_width if half_width != DEFAULT_HALF_WIDTH else None,
                                              time_cap=time_cap if time_cap != DEFAULT_TIME_CAP_S else None,
                                              allow_ops=list(allow_ops)))
    with staged_output_dir(out_dir, force) as stage:
        atomic_write_text(stage / "ops.csv", ops_csv_text(plan, e, op_times, target.device))
        atomic_write_text(stage / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
        write_csv(df, stage / "results.csv")
    ratio = summary["ratio"]
    prog.note(f"replay step {summary['replay_step_ms']:.3f} ms"
              + (f", original {summary['original_step_ms']:.3f} ms, ratio {ratio:.3f} ({summary['ratio_kind']})"
                 if ratio is not None else ""))
    return summary, df
