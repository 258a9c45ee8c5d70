"""``mystique replay BENCH --against BASE``: one benchmark timed against another of the same capture.

Two benchmarks that differ only in their routing (``generate --routing``) run the same ops on the same
shapes except for their grouped GEMMs' group sizes. Here:

1. the prediction (:mod:`.routing_cost`): the pinned grouped GEMMs whose loads move, on the step's
   operand layouts, one pass with each routing's loads from cold caches, a pair of passes (ABBA over
   the rounds) after each measured round of 2., so that the prediction and the measurement see one state
   of the host (issue 34: timed in a phase of their own before the rounds, the same passes read -6.4 ms
   on a quiet host and -8.8 to -12.5 ms beside other processes, while the grouped GEMMs inside the step
   moved -7.6 to -9.2 ms): the median pass difference is the predicted change of the step (seconds),
   with its 95% interval;
2. the benchmarks are timed in rotated rounds in this process (:mod:`.against_rounds`):
   ``EXECUTORS`` executors of each plan, rotated so that no one executor's placement in memory biases
   the median, and a *null*, as many more executors of BASE in the same rounds; after every round the
   state the round's executors changed is put back, untimed (:class:`StateRestore`): the median ratios
   BENCH / BASE and NULL / BASE with their 95% intervals;
3. rows (suite ``replay``): ``routing_skew_predicted_ratio`` (info: 1 + predicted change / BASE's median
   step, with the interval the paired rounds give), ``routing_skew_measured_ratio`` (info),
   ``routing_skew_null_ratio`` (info: the floor, what two sets of executors of one plan read here now)
   and the check ``routing_skew_prediction_error``: measured - predicted ratio, its interval the
   measured one widened by the floor ``f`` (the null interval's farther end from 1) less the predicted
   one: ``[m_lo - f - p_hi, m_hi + f - p_lo]``; verdict :func:`routing_cost.verdict` of the predicted
   interval against the widened measured one (fail when disjoint: the step moved otherwise than its
   expert loads predict, by more than the measurement, the model and two executors of one plan can
   differ; inconclusive when a predicted change is not resolved beyond the floor). A side whose
   replayed loads are not its planned ones makes the check an ``error``; so does a state holding inf,
   NaN or subnormal values after the rounds (the check ``routing_skew_special_values``, fail when any:
   :func:`special_fraction`), whose arithmetic costs a CPU by how many there are, not by the loads. ``routing_skew.json`` keeps
   the sites, the prediction's paired rounds and the rounds.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import torch

from ..errors import UsageError
from ..io import atomic_write_text, check_output_dir, show, staged_output_dir
from ..progress import Progress
from ..results import Results, RunContext, write_csv
from ..targets import make_target
from . import routing_cost
from .against_rounds import _pick, floor_of, rotated_rounds
from .fidelity import busy_host_threads, device_sync
from .pins import routing_summary
from .plan import plan_from_path
from .run import make_executor, subject_of
from .runtime import replay_threads, steady_host_allocator

#: executors per stream (BENCH, BASE, NULL): each stream takes its next one every round, each an equal share
EXECUTORS = 2


def replay_against(source: str | os.PathLike, base: str | os.PathLike, out_dir: str | os.PathLike, *,
                   device: str = "cpu", seed: int = 0, iters: int = 10, half_width: float = 0.025,
                   time_cap: float = 60.0, threads: int | None = None, allow_ops: tuple[str, ...] = (),
                   force: bool = False) -> tuple[dict[str, Any], Any]:
    """See the module docstring. Returns ``(summary, results DataFrame)``."""
    if not (half_width > 0 and time_cap > 0) or iters < 1:
        raise UsageError("--half-width and --time-cap must be positive and --iters at least 1")
    check_output_dir(out_dir, force)
    target = make_target(device)
    prog = Progress("replay")
    cand, kind = plan_from_path(source, None, allow_ops)
    basep, bkind = plan_from_path(base, None, allow_ops)
    if "benchmark" not in (kind, bkind) and kind != bkind:
        raise UsageError("--against takes two benchmarks (or traces) of one capture")
    try:
        ss = routing_cost.sites(cand, basep)
    except (ValueError, KeyError, IndexError) as exc:
        raise UsageError(f"--against {show(base)}: {exc}") from exc
    if not ss:
        raise UsageError(f"--against compares routings: {show(source)} has no pinned grouped GEMM (a mixture of "
                         "experts' capture, generated with --routing)")
    dev = torch.device(target.device)
    n = replay_threads(cand.data, dev, threads)
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    sync = device_sync(dev)
    try:
        threads_note = busy_host_threads(target, threads, prog.note)  # the prediction and the rounds alike
        with steady_host_allocator() if dev.type == "cpu" else contextlib.nullcontext():
            moved = [x for x in ss if x.moved]
            flush, flush_bytes = routing_cost.cache_flusher(target.device)
            passes = routing_cost.PairedPasses(ss, target.device, sync=sync, flush=flush)
            passes.warm()
            paired = routing_cost.Paired(stop="with the measured rounds")
            prog.note(f"timing the two benchmarks and a null in rotated rounds ({EXECUTORS} executors each), and "
                      f"in every round the prediction: the {len(moved)} of {len(ss)} grouped GEMMs that move, with "
                      "each routing's loads")
            plans = (cand, basep, basep)
            execs = [[make_executor(pl, target.device, seed=seed, allow_ops=allow_ops) for _ in range(EXECUTORS)]
                     for pl in plans]
            states = [[StateRestore(e) for e in stream] for stream in execs]
            for e in (e for stream in execs for e in stream):
                e.run_iteration(probe=True)
            for st in (st for stream in states for st in stream):
                st()

            def restore(r: int) -> None:  # (the executors round r ran: rotated_rounds' own pick)
                for i, stream in enumerate(states):
                    stream[_pick(r, i, EXECUTORS)]()

            p = rotated_rounds([[e.run_iteration for e in stream] for stream in execs], sync=sync,
                               half_width=half_width, time_cap_s=time_cap, min_rounds=iters, progress=prog.note,
                               each_round=lambda n: passes.round(n, paired) if moved else None, after_round=restore)
            restored = max(st.bytes for stream in states for st in stream)
            pred = routing_cost.predict(ss, paired)
            prog.note(f"predicted change {pred.delta_s * 1e3:+.3f} ms [{pred.low_s * 1e3:+.3f}, "
                      f"{pred.high_s * 1e3:+.3f}]")
            routes = [routing_summary(pl, e) for pl, stream in zip(plans, execs) for e in stream]
            used_threads = torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
    subject = f"{subject_of(cand, source, kind)} [{cand.metadata.get('routing') or 'recorded'} vs " \
              f"{basep.metadata.get('routing') or 'recorded'}]"
    info = target.info()
    res = Results(RunContext(device=target.label, device_name=info.name, torch_version=torch.__version__), "replay")
    repro = (f"mystique replay {show(source)} --against {show(base)} -o OUT --device {device} --seed {seed}"
             + (f" --threads {threads}" if threads is not None else ""))
    replayed_ok = all(r is not None and r["replayed_equals_planned"] for r in routes)
    special = tuple(max(special_fraction(e) for e in stream) for stream in execs[:2])
    summary = rows(res, subject, pred, p.base_median_s(), *p.ratio("bench"), null=p.ratio("null"), rounds=p.rounds,
                   threads=used_threads, load=(p.loadavg_start, p.loadavg_end), flush_bytes=flush_bytes,
                   restored_bytes=restored,
                   replayed_ok=replayed_ok, repro=repro, special=special)
    summary.update(source=show(source), against=show(base), sites=[s.__dict__ for s in ss],
                   prediction_rounds={"stop": paired.stop, "candidate_ms": [t * 1e3 for t in paired.candidate_s],
                                      "base_ms": [t * 1e3 for t in paired.base_s]},
                   timing={**p.summary(), **threads_note}, routing=routes[::EXECUTORS])
    with staged_output_dir(out_dir, force) as stage:
        write_csv(res.frame(), stage / "results.csv")
        atomic_write_text(stage / "routing_skew.json", json.dumps(summary, indent=1, default=str) + "\n")
    return summary, res.frame()


def rows(res: Results, subject: str, pred: routing_cost.Prediction, base_s: float, ratio: float, low: float,
         high: float, *, null: tuple[float, float, float], rounds: int, threads: int | None, load: Any,
         replayed_ok: bool, repro: str, flush_bytes: int = 0,
         special: tuple[float, float] = (0.0, 0.0), restored_bytes: int = 0) -> dict[str, Any]:
    """The four rows (module docstring) from the prediction, the measured ratio and the null's; the summary's figures."""
    pr, plo, phi = pred.ratio(base_s)
    res.add("routing_skew_predicted_ratio", subject, "ratio", pr, low=plo, high=phi, status="info",
            detail=f"predicted change {pred.delta_s * 1e3:+.3f} ms, 95% interval [{pred.low_s * 1e3:+.3f}, "
                   f"{pred.high_s * 1e3:+.3f}] ms: the median over {pred.rounds} paired ABBA rounds of one pass of the "
                   f"{pred.sites} grouped GEMMs whose loads move ({pred.groups} expert groups) with the benchmark's "
                   f"loads less one with the base's, on the step's operand shapes, strides and dtype, {threads} "
                   f"thread(s), {_cold(flush_bytes)} (the grouped GEMMs' offsets are the only routing-dependent inputs of the replayed "
                   f"step); over the base benchmark's median step {base_s * 1e3:.3f} ms; one pair of passes after "
                   "each measured round, so that the prediction and the measurement see one state of the host")
    how = (f"{rounds} rounds in this process, {EXECUTORS} executors of each plan rotated (each stream its next every round) and the "
           f"three streams in every order in turn; "
           + (f"after each step the {restored_bytes / 2**20:.0f} MiB of state it changed put back, untimed (StateRestore); "
              if restored_bytes else "no state changed by a step (none put back); ")
           + f"load average {load[0]} -> {load[1]}")
    res.add("routing_skew_measured_ratio", subject, "ratio", ratio, low=low, high=high, status="info",
            detail=f"median ratio benchmark / base of {how}; 95% interval [{low:.4f}, {high:.4f}]")
    nr, nlo, nhi = null
    f = floor_of(nlo, nhi)
    res.add("routing_skew_null_ratio", subject, "ratio", nr, low=nlo, high=nhi, status="info",
            detail=f"the floor: median ratio of {EXECUTORS} more executors of the base plan / the base's, timed in the "
                   f"same rounds; 95% interval [{nlo:.4f}, {nhi:.4f}], floor {f:.4f} (its farther end from 1: what "
                   "two sets of executors of one plan, differing only in where their tensors sit, read here now)")
    wlo, whi = low - f, high + f
    err, elo, ehi = ratio - pr, wlo - phi, whi - plo
    sx = max(special)
    res.add("routing_skew_special_values", subject, "fraction", sx, threshold=0.0,
            status="fail" if sx > 0 else "pass",
            detail=f"inf, NaN or subnormal elements among the floating state tensors (parameters, gradients, "
                   f"optimizer moments: the plan's external tensors) after the rounds: {special[0]:.2%} of the "
                   f"benchmark's, {special[1]:.2%} of the base's (the largest over each plan's executors); fail when "
                   "any: a CPU's arithmetic on them takes microcode assists, so the step's time then follows how many "
                   "there are, which the routing changes (issue 34, train small-128e skewed:2 against uniform: the "
                   "replayed step's in-place updates drive Adam's second moments to inf, 99% of a uniform expert "
                   "tensor against 30% of a skewed one whose idle experts get no gradient; their sqrt took 17.2 "
                   "against 5.7 ms) and a real step's values do not")
    status = routing_cost.verdict(plo, phi, low, high, f) if replayed_ok and not sx else "error"
    why = ("" if replayed_ok else "a side's replayed tokens per expert differ from its planned ones: the comparison "
           "is not the one planned; ")
    why += ("" if not sx else f"the replayed state holds inf, NaN or subnormal values ({sx:.2%}, "
            "routing_skew_special_values): the step's time follows them as well as the loads; ")
    res.add("routing_skew_prediction_error", subject, "ratio_difference", err, low=elo, high=ehi, threshold=0.0,
            status=status,
            detail=f"{why}measured - predicted ratio {err:+.4f}, interval [{elo:+.4f}, {ehi:+.4f}] (measured "
                   f"[{low:.4f}, {high:.4f}] widened by the floor {f:.4f} to [{wlo:.4f}, {whi:.4f}], against predicted "
                   f"[{plo:.4f}, {phi:.4f}]); fail when the predicted and the widened measured intervals are disjoint "
                   "(the step moved otherwise than its expert loads predict, beyond the measurement's and the model's "
                   "95% uncertainty and the offset two executors of one plan show in the same rounds: the floor is "
                   "added linearly, as an offset the rotation may not have averaged out, and nothing else is added); "
                   "pass when the direction is confirmed (the widened measured interval excludes 1 on the side the "
                   "predicted interval does) and the amount is (the measured interval lies inside the predicted one "
                   f"widened by the floor, [{plo - f:.4f}, {phi + f:.4f}]), or no load moved and the widened interval "
                   "holds 1; else inconclusive (a change smaller than the floor, a measurement too wide to place, or "
                   "a prediction that does not say which way); the model leaves out the other ops between two grouped "
                   "GEMMs (their change, measured in the step, is within the measurement's resolution)"
                   + ("" if status == "pass" else f"; reproduce: {repro}"))
    return {"predicted_ratio": pr, "predicted_low": plo, "predicted_high": phi, "predicted_delta_ms": pred.delta_s * 1e3,
            "predicted_low_ms": pred.low_s * 1e3,
            "predicted_high_ms": pred.high_s * 1e3, "base_step_ms": base_s * 1e3, "measured_ratio": ratio,
            "measured_low": low, "measured_high": high, "null_ratio": nr, "null_low": nlo, "null_high": nhi,
            "floor": f, "rounds": rounds, "verdict": status, "threads": threads, "flush_bytes": flush_bytes,
            "special_fraction": list(special), "restored_bytes": restored_bytes}


class StateRestore:
    """Puts back the floating external tensors (inputs and state: parameters, gradients, optimizer moments)
    of one executor that its step changes, as they were when this was made (before the probe): calling it
    after each of the executor's timed steps, untimed, makes every timed step run the captured step on the
    plan's state, as a real step runs on a state the previous steps kept in range. Without it a replayed
    training step re-applies its in-place updates to its own results, and the state drifts (issue 34:
    Llama 4 small-128e train, Adam's second moments overflow to inf within 15 iterations, by how much
    depending on the routing; :func:`special_fraction`). The first call keeps only the tensors that changed
    (an inference step changes none: nothing is copied); ``bytes`` is what each call copies."""

    def __init__(self, executor: Any) -> None:
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.checked = False
        for t in _floating_external(executor):
            self.pairs.append((t, t.detach().clone()))

    @property
    def bytes(self) -> int:
        return sum(s.numel() * s.element_size() for _, s in self.pairs)

    def __call__(self) -> None:
        with torch.no_grad():
            if not self.checked:  # NaN != NaN: a tensor that became NaN counts as changed
                self.pairs = [(t, s) for t, s in self.pairs if not torch.equal(t, s)]
                self.checked = True
            for t, s in self.pairs:
                t.copy_(s)


def _floating_external(executor: Any) -> list[torch.Tensor]:
    """``executor``'s floating external tensors, each storage view once."""
    seen, out = set(), []
    for t in getattr(executor, "_external", {}).values():
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
            continue
        key = (t.data_ptr(), t.numel(), t.stride())
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def special_fraction(executor: Any) -> float:
    """The fraction of the elements of ``executor``'s floating external tensors (its plan's inputs and state:
    parameters, gradients, optimizer moments, which the replayed step updates in place) that are inf, NaN or
    subnormal; each storage counted once."""
    bad = total = 0
    for t in _floating_external(executor):
        x = t.detach()
        tiny = torch.finfo(x.dtype).tiny
        bad += int((~torch.isfinite(x)).sum()) + int(((x != 0) & (x.abs() < tiny)).sum())
        total += x.numel()
    return bad / total if total else 0.0


def _cold(flush_bytes: int) -> str:
    """How the prediction's passes started (routing_cost.cache_flusher)."""
    if flush_bytes:
        return (f"each pass from cold caches as in the step ({flush_bytes / 2**20:.0f} MiB read and written "
                "before it, untimed)")
    return "the passes back to back (the last-level cache's size unknown: none flushed)"


__all__ = ["replay_against", "rows"]
