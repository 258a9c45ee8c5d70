"""The executor's per-op dispatch cost against eager PyTorch calling the same ops.

A step of many small ops (``torch.add`` calls on tiny tensors, or a mix typical of small steps:
add, mul, views and linear layers on small tensors) is bound by the host:
its time is what Python and the dispatcher spend per op. :func:`dispatch_overhead` records such a
step as the capture does (Execution Trace observer and Kineto together), builds its replay plan
as ``mystique replay`` would, and times :meth:`Executor.run_iteration` against the eager step
side by side in one process (:func:`mystique.timing.paired_rounds`: ABBA rounds after a warm-up
until stable, the median paired ratio replay / eager with its 95% interval).

The check ``dispatch_overhead_ratio`` passes when the interval's upper end is at most 1.0 (the
replay pays at most eager's cost per op), fails when its lower end is above 1.0, and is
inconclusive otherwise. ``mystique overhead -o OUT`` writes the rows to ``OUT/results.csv`` and
the paired-round statistics to ``OUT/overhead.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import mystique.replay.runtime as ex

from .. import timing
from ..capture import KINETO_FILE, TRACE_FILE, record_step
from ..errors import UsageError
from ..io import staged_output_dir
from ..results import Results, RunContext, write_csv
from ..targets import Target, check_device, synchronize
from .plan import plan_from_path

STEPS: dict[str, str] = {
    "add": "torch.add on 4-element tensors (the evidence's host-bound step)",
    "mix": "add, mul, view and linear on small tensors",
}
BAND = (0.0, 1.0)  # replay / eager: at most eager's cost


def small_ops_step(kind: str = "add", n_ops: int = 500, device: str = "cpu") -> Callable[[], Any]:
    """A step of ``n_ops`` small top-level operators (``kind``: see :data:`STEPS`) on ``device``."""

    if kind not in STEPS:
        raise UsageError(f"unknown step {kind!r}; expected one of {', '.join(STEPS)}")
    if n_ops < 1:
        raise UsageError("--ops must be at least 1")
    gen = torch.Generator().manual_seed(0)
    if kind == "add":
        a = torch.randn(4, generator=gen).to(device)
        b = torch.randn(4, generator=gen).to(device)

        def step():
            x = a
            for _ in range(n_ops):
                x = torch.add(x, b)
            return x

        return step

    x0 = torch.randn(2, 8, generator=gen).to(device)
    b = torch.randn(2, 8, generator=gen).to(device)
    w = torch.randn(8, 8, generator=gen).to(device) * 0.1
    bias = torch.randn(8, generator=gen).to(device)
    linear = torch.nn.functional.linear
    cycle = 5  # add, mul, view, view, linear
    rounds, rest = divmod(n_ops, cycle)

    def step():
        x = x0
        for _ in range(rounds):
            x = torch.add(x, b)
            x = torch.mul(x, 0.5)
            x = x.view(16)
            x = x.view(2, 8)
            x = linear(x, w, bias)
        for _ in range(rest):
            x = torch.add(x, b)
        return x

    return step


def plan_of_step(step: Callable[[], Any], device: str, work_dir: str | os.PathLike) -> Any:
    """Record ``step`` on ``device`` as ``mystique capture`` does and return its replay plan."""

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    record_step(step, Target(device), work / TRACE_FILE, work / KINETO_FILE)
    plan, _kind = plan_from_path(work)
    return plan


def measure(step: Callable[[], Any], plan: Any, device: str, *, half_width: float = 0.01,
            time_cap_s: float = 20.0, seed: int = 0, pacing: str = "none",
            progress: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """Time ``Executor.run_iteration`` of ``plan`` (a) against ``step`` (b) in paired rounds.

    Returns ``(paired, executor)``; ``paired.ratio`` is replay / eager.
    """

    e = ex.Executor(plan.data if hasattr(plan, "data") else plan, device, seed=seed, pacing=pacing)
    e.prepare()
    e.probe()
    paired = timing.paired_rounds(e.run_iteration, step, device=device, sync=lambda: synchronize(device),
                                  half_width=half_width, time_cap_s=time_cap_s, progress=progress)
    return paired, e


def dispatch_overhead(
    device: str = "cpu",
    n_ops: int = 500,
    *,
    steps: tuple[str, ...] | list[str] = ("add", "mix"),
    half_width: float = 0.01,
    time_cap_s: float = 20.0,
    seed: int = 0,
    results: Any = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Measure the executor's per-op cost against eager for each step kind in ``steps``.

    Returns ``(frame, stats)``: the results rows (``dispatch_overhead_ratio`` per step, with the
    interval bounds and per-op times as measurements) and, per step, the paired-round statistics.
    ``results``: a :class:`mystique.results.Results` to add the rows to (default: a new one).
    """


    device = check_device(device)
    for k in steps:
        if k not in STEPS:
            raise UsageError(f"unknown step {k!r}; expected one of {', '.join(STEPS)}")
    if not steps:
        raise UsageError("no step to measure")
    if time_cap_s <= 0 or not 0 < half_width < 1:
        raise UsageError("the time cap must be positive and the half-width in (0, 1)")
    target = Target(device)
    if results is None:
        results = Results(RunContext(device=device, device_name=target.info().name,
                                     torch_version=torch.__version__), "replay")
    stats: dict[str, Any] = {}
    for kind in steps:
        subject = f"{kind} x{n_ops}"
        step = small_ops_step(kind, n_ops, device)
        for _ in range(3):  # warm the eager step before it is recorded, as capture does
            step()
        with tempfile.TemporaryDirectory(prefix="mystique-overhead.") as tmp:
            plan = plan_of_step(step, device, tmp)
        if progress:
            progress(f"{subject}: plan of {len(plan.ops)} ops; timing replay vs eager")
        paired, e = measure(step, plan, device, half_width=half_width, time_cap_s=time_cap_s, seed=seed,
                            progress=progress)
        c = e.counts()
        lo, hi = paired.interval
        status = timing.verdict(lo, hi, *BAND)
        n_rep = max(c["replayed"], 1)
        skipped = sum(c["skipped"].values())
        detail = (f"median paired ratio replay/eager over {paired.rounds} rounds ({paired.stop}), 95% interval "
                  f"[{lo:.3f}, {hi:.3f}]; {STEPS[kind]}; {c['replayed']}/{c['total']} ops replayed"
                  + (f", {skipped} skipped" if skipped else "")
                  + (f", {c['fallbacks']} synthetic outputs" if c["fallbacks"] else "")
                  + f"; {torch.get_num_threads()} CPU threads; warm-up {paired.warmup_rounds} rounds"
                  + ("" if paired.warmup_settled else " (not settled)"))
        results.add("dispatch_overhead_ratio", subject, "ratio", paired.ratio, status=status, threshold=BAND[1],
                    low=lo, high=hi, detail=detail)
        results.add("dispatch_overhead_ratio", subject, "ratio_low", lo, status="info", detail="95% interval, lower end")
        results.add("dispatch_overhead_ratio", subject, "ratio_high", hi, status="info",
                    detail="95% interval, upper end")
        results.add("replay_time_per_op", subject, "median_us", paired.a_median_ms * 1e3 / n_rep, unit="us",
                    status="info", detail=f"executor.run_iteration median {paired.a_median_ms:.4f} ms / {n_rep} ops")
        results.add("eager_time_per_op", subject, "median_us", paired.b_median_ms * 1e3 / n_rep, unit="us",
                    status="info", detail=f"eager step median {paired.b_median_ms:.4f} ms / {n_rep} ops")
        stats[subject] = {"ops": c["total"], "replayed": c["replayed"], "skipped": c["skipped"],
                          "pacing": e.pacing, "verdict": status, **paired.summary()}
    return results.frame(), stats


def write_outputs(out_dir: str | os.PathLike, frame: Any, stats: dict[str, Any], force: bool = False) -> Path:
    """``OUT/results.csv`` and ``OUT/overhead.json``, written to a staging folder and renamed."""

    with staged_output_dir(out_dir, force) as stage:
        write_csv(frame, stage / "results.csv")
        (stage / "overhead.json").write_text(json.dumps(stats, indent=2, default=str) + "\n", encoding="utf-8")
    return Path(out_dir)
