"""The ``results.csv`` rows of a replay (suite ``replay``): coverage, step time and ratio, per-op
time error, synthetic outputs and peak memory. Every row's detail ends with ``reproduce: <command>``."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch

from ..placement import placement_words
from ..results import Results, RunContext
from .boundness import BASIS_TEXT, BUSY_DEVICE, BUSY_HOST
from .fidelity import RATIO_HIGH, RATIO_LOW, op_reference, original_op_us, original_step
from .plan import Plan
from .runtime import Executor
from .summary import original_ops_total, transformed

#: the largest share of replayed ops whose results may be synthetic before ``replay_output_fallbacks``
#: fails: each one replaces an op's work by a made-up tensor, so past 1% of the ops the replay's time
#: is no longer the captured work's (no-ops are counted apart: they were recorded as doing no work)
FALLBACK_SHARE_MAX = 0.01
#: which side of its threshold a checked row's value must lie on to pass (``band``: within
#: RATIO_LOW-RATIO_HIGH); a row never reads pass with its value on the wrong side
ROW_DIRECTIONS = {"replay_coverage": "min", "replay_coverage_by_time": "min", "replay_output_fallbacks": "max",
                  "replay_step_time_ratio": "band", "replay_routing_reproduced": "min"}


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


def results(summary: dict[str, Any], e: Executor, plan: Plan, device: str, subject: str,
            target: Any, iters: int, warmup: int, seed: int, reproduce: str | None = None) -> Any:
    """The replay's results DataFrame from its ``summary`` (see :func:`summary.summarize`) and executor."""
    res = _Rows(Results(RunContext.for_target(target), "replay"),
                reproduce or reproduce_command("BENCH", device, seed, iters=iters, warmup=warmup))
    floats = Counter(t["dtype"] for t in plan.tensors if t["dtype"] in ("float32", "float16", "bfloat16", "float64"))
    dtype = floats.most_common(1)[0][0] if floats else ""
    c = e.counts()
    _coverage_rows(res, summary, c, plan, subject, dtype, e.status)
    if summary["ratio_kind"] == "paired":
        _paired_rows(res, summary, plan, device, subject, dtype, seed)
    else:
        _recorded_rows(res, summary, plan, device, subject, target, dtype, iters, warmup, seed)
    _bound_rows(res, summary, device, subject, dtype)
    placement_row(res, (summary.get("timing") or {}).get("cpu_placement"), subject)
    _op_error_rows(res, summary, plan, device, subject, dtype)
    routing_rows(res, summary.get("routing"), subject)
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


def routing_rows(res: Any, routing: dict[str, Any] | None, subject: str) -> None:
    """``replay_routing_reproduced`` (the share of pinned grouped GEMMs whose replayed tokens per expert
    equal the planned ones; pass only at 1: routing is integers, reproduced exactly or not) and
    ``replay_max_load_ratio`` (info: the largest planned load over the recorded one, summed over the
    sites), for a plan with routing pins (summary.json ``routing``)."""
    if not routing or not routing.get("sites"):
        return
    sites = routing["tokens_per_expert"]
    same = sum(1 for s in sites if s["replayed"] == s["planned"])
    share = same / len(sites)
    res.add("replay_routing_reproduced", subject, "share", share, threshold=1.0,
            status="pass" if share >= 1.0 else "fail",
            detail=f"{same} of {len(sites)} grouped GEMM(s) were given the planned tokens per expert "
                   f"(routing {routing['transform']}; planned equals recorded: {routing['planned_equals_recorded']}); "
                   "read back from the pinned inputs after the timed iterations")
    if routing.get("max_load_ratio") is not None:
        res.add("replay_max_load_ratio", subject, "ratio", float(routing["max_load_ratio"]), status="info",
                detail="sum over grouped GEMMs of the largest planned expert load / the largest recorded one")


def placement_row(res: Any, record: dict[str, Any] | None, subject: str) -> None:
    """``cpu_placement`` (info): the CPU the timing (main) thread ran on (value; empty when not pinned) and
    where the other threads ran (``timing.cpu_placement``, :mod:`mystique.placement`)."""
    if not record:
        return
    res.add("cpu_placement", subject, "main_cpu", record.get("main_cpu") if record.get("applied") else None,
            status="info", detail=f"{placement_words(record)}; --cpu-affinity {record.get('asked')}; allowed CPUs "
            f"{record.get('allowed_cpus') or 'unknown'}"
            + (f"; device-local CPUs {record['near_device']}" if record.get("near_device") else ""))


def compute_time_share(plan: Plan, status: list[Any]) -> float | None:
    """The replayed share of the original time of the compute ops (every op but skipped collectives),
    over the ops whose original time is known; None when none is."""
    known = [(t, st.state != "skipped") for op, st in zip(plan.ops, status)
             if not (st.state == "skipped" and getattr(st, "reason", "") == "collective")
             and (t := original_op_us(plan, op)) is not None]
    total = sum(t for t, _ in known)
    return sum(t for t, ok in known if ok) / total if total > 0 else None


def _coverage_rows(res: _Rows, summary: dict[str, Any], c: dict[str, Any], plan: Plan, subject: str,
                   dtype: str, e_status: list[Any] | None = None) -> None:
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
    ref = op_reference(plan)
    by_time_detail = (f"weighted by original (Kineto) {ref} op times" if plan.metadata.get("original_op_times")
                      else "no original op times (no Kineto trace): every op weighs the same")
    if dropped:  # the filtered plan no longer holds the removed ops' times: no claim over the original
        res.add("replay_coverage_by_time", subject, "coverage_by_time", summary["coverage_by_time"], dtype=dtype,
                status="info", detail=f"over the {c['total']} ops the {transformed(plan)} plan kept, not the "
                f"original's {orig_total}: no verdict; {by_time_detail}")
    else:  # judged on its own value: the compute ops' share of the original time, as replay_coverage's count
        share = compute_time_share(plan, e_status) if e_status is not None else None
        by_time = compute_cov if share is None else share
        res.add("replay_coverage_by_time", subject, "coverage_by_time", by_time, threshold=1.0, dtype=dtype,
                status="pass" if by_time >= 1.0 else "fail",
                detail=f"compute ops replayed {by_time:.3f} of the original time (pass at 1.0; skipped collectives "
                       f"are the multi-rank replay's, as in replay_coverage); all ops {summary['coverage_by_time']:.3f}; "
                       + by_time_detail)


def _paired_rows(res: _Rows, summary: dict[str, Any], plan: Plan, device: str, subject: str, dtype: str,
                 seed: int) -> None:
    t = summary["timing"]
    threads = _threads_note(plan, device)
    if str(device).split(":")[0] == "cpu":
        orig = plan.metadata.get("original_threads")
        threads = (f"{t['threads']} CPU threads" + (f" (captured with {orig})" if orig else "")
                   + (f", {t['threads_reason']}" if t.get("threads_reason") and t["threads"] != t.get(
                       "threads_captured") else "") + "; ")
    how = (f"median of {t['rounds']} paired rounds ({t['order']}, alternating with the original step in this "
           f"process) after {t['warmup_rounds']} warm-up rounds ({t['warmup_s']:.1f} s"
           f"{'' if t['warmup_settled'] else ', not settled: time cap'}); clock {t['clock']}; "
           f"pacing {t['pacing']}; {threads}{_path_note(t)}seed {seed}")
    res.add("replay_step_time", subject, "median_ms", summary["replay_step_ms"], unit="ms", status="info",
            dtype=dtype, detail=how)
    spec = original_step(plan) or {}
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
              + (f"; load average {load[0]:.2f}" if load else "") + _basis_note(summary) + f"; seed {seed}")
    res.add("replay_step_time_ratio", subject, "ratio", ratio, threshold=edge, dtype=dtype, status=verdict,
            low=lo, high=hi, detail=detail)
    res.add("replay_step_time_ratio", subject, "ratio_ci_low", lo, dtype=dtype, status="info",
            detail="95% interval of the median paired ratio (order statistics), lower bound")
    res.add("replay_step_time_ratio", subject, "ratio_ci_high", hi, dtype=dtype, status="info",
            detail="95% interval of the median paired ratio (order statistics), upper bound")


def _recorded_rows(res: _Rows, summary: dict[str, Any], plan: Plan, device: str, subject: str, target: Any,
                   dtype: str, iters: int, warmup: int, seed: int) -> None:
    t = summary["timing"]
    why_np = t.get("why_not_paired") or ""
    res.add("replay_step_time", subject, "median_ms", summary["replay_step_ms"], unit="ms", status="info",
            dtype=dtype, detail=f"median of {iters} whole iterations after {warmup} warm-up; "
            f"{_threads_note(plan, device)}seed {seed}" + (f"; not paired: {why_np}" if why_np else ""))
    ratio = summary["ratio"]
    if ratio is not None:
        cross = (f"cross-device comparison: captured on {plan.metadata.get('captured_on')}, replayed on "
                 f"{RunContext.for_target(target).device_name}: no fidelity claimed; " if summary["cross_device"]
                 else "")
        res.add("replay_step_time_ratio", subject, "ratio", ratio, dtype=dtype, status="info",
                detail=cross + f"recorded (not paired): replay {summary['replay_step_ms']:.3f} ms / "
                       f"{summary['original_step_source']} {summary['original_step_ms']:.3f} ms, measured at "
                       f"different times: a measurement, no verdict"
                       + (f"; not paired: {why_np}" if why_np else "") + f"; seed {seed}")
        return
    changed = transformed(plan)
    if changed and summary["original_step_ms"] is not None:
        why = (f"not comparable: the plan was {changed} by generate, so it is not the captured step "
               f"(replay {summary['replay_step_ms']:.3f} ms, recorded original "
               f"{summary['original_step_ms']:.3f} ms)")
    elif summary["original_step_ms"] is None:
        why = "no recorded original step time"
    else:
        why = (f"cross-device comparison: original timed on {plan.metadata.get('original_device')}, "
               f"replayed on {device}: no fidelity claimed")
    lacking = "; ".join(summary["lacks"])
    res.add("replay_step_time_ratio", subject, "ratio", None, threshold=None, status="skip", dtype=dtype,
            detail=why + (f"; not paired: {why_np}" if why_np else "") + (f"; lacks: {lacking}" if lacking else ""))


def _path_note(t: dict[str, Any]) -> str:
    """'replay path: 120 compiled, 0 per-op iterations; ' from timing.replay_path, or ''."""
    p = t.get("replay_path")
    if not p:
        return ""
    return (f"replay path: {p.get('compiled', 0)} compiled, {p.get('per_op', 0)} per-op iterations"
            + (f" ({p['compiled_failures']} compiled failures)" if p.get("compiled_failures") else "") + "; ")


def _basis_note(summary: dict[str, Any]) -> str:
    """'; judged on the host timeline ...: the step is host-bound (...)' for a ratio's detail."""
    basis = (summary.get("timing") or {}).get("basis")
    if not basis:
        return ""
    return f"; judged on the {BASIS_TEXT.get(basis, basis)}: the step is {summary.get('bound_by')}-bound"


def _bound_rows(res: _Rows, summary: dict[str, Any], device: str, subject: str, dtype: str) -> None:
    """``replay_device_busy`` (and ``original_device_busy``) measurements: what the step is bound by."""
    bound = summary.get("bound_by")
    if bound is None:
        return
    rule = (f"device-bound at busy >= {BUSY_DEVICE:.1f}, host-bound at <= {BUSY_HOST:.1f}, mixed between; "
            f"bound by {bound} (judged on the original's fraction where paired)")
    how = (summary.get("timing") or {}).get("busy_how") or "unknown"
    if summary.get("device_busy") is None:
        why = ("the host runs the step on the CPU" if str(device).split(":")[0] == "cpu"
               else f"not measured: {how}")
        res.add("replay_device_busy", subject, "busy_fraction", None, status="info", dtype=dtype,
                detail=f"n/a: {why}; bound by {bound}")
        return
    res.add("replay_device_busy", subject, "busy_fraction", summary.get("device_busy"), status="info", dtype=dtype,
            detail=f"the device's busy fraction during the replay step ({how}); {rule}")
    if summary.get("original_device_busy") is not None:
        res.add("original_device_busy", subject, "busy_fraction", summary["original_device_busy"], status="info",
                dtype=dtype, detail=f"the device's busy fraction during the original step ({how}); {rule}")


def _op_error_rows(res: _Rows, summary: dict[str, Any], plan: Plan, device: str, subject: str, dtype: str) -> None:
    oe = summary["op_error"]
    if not oe.get("ops_compared"):
        why = [f"cross-device: recorded on {plan.metadata.get('original_device')}, replayed on {device}"
               ] if oe.get("cross_device") else []
        why += summary["lacks"]
        res.add("replay_op_time_error", subject, "median_abs_error", None, dtype=dtype, status="skip",
                detail="no per-op comparison: " + ("; ".join(why) or "no op with a recorded and a replayed time"))
        return
    ref_words = f"recorded Kineto {oe['reference']} time (profiled)"
    res.add("replay_op_time_error", subject, "median_abs_error", oe["median_abs_error"], dtype=dtype,
            status="info", detail=f"|replay/original - 1| per op over {oe['ops_compared']} ops against the "
            f"{ref_words}; 90th percentile {oe['p90_abs_error']:.3f}; per-op table in ops.csv")
    for row in oe["by_op_type"]:
        res.add("replay_op_time_error", f"{subject}/{row['op']}", "median_abs_error", row["median_abs_error"],
                dtype=dtype, status="info",
                detail=f"{row['n']} op(s); 90th percentile {row['p90_abs_error']:.3f}; recorded "
                       f"{row['original_us']:.1f} us, replayed {row['replay_us']:.1f} us in all")


def _fmt(v: float | None) -> str:
    return f"{v:.3f}" if v is not None else "n/a"


def _pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None and math.isfinite(v) else "n/a"


def _threads_note(plan: Plan, device: str) -> str:
    if str(device).split(":")[0] != "cpu":
        return ""
    orig = plan.metadata.get("original_threads")
    return f"{torch.get_num_threads()} CPU threads" + (f" (captured with {orig})" if orig else "") + "; "
