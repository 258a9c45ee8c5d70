"""The standalone entry point of ``benchmark.py``: run a plan and print per-iteration times."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

import torch

from .executor import PACINGS, Executor
from .format import InsufficientMemory, ReplayError, load_plan
from .schemas import ALLOWED_OP_NAMESPACES, plan_refusal
from .storage import replay_threads


def main(argv: Sequence[str] | None = None, default_plan: str | None = None) -> int:
    """Run a plan: ``--plan PATH --device DEV --iters N --warmup N [--pacing recorded]``; prints
    per-iteration times.

    Exit codes: 0 ran, 2 bad input, 3 the device cannot do it.
    """
    ap = argparse.ArgumentParser(description="Replay a Mystique benchmark plan with synthetic data.")
    ap.add_argument("--plan", default=default_plan, help="benchmark.json (default: the one beside this file)")
    ap.add_argument("--device", default=None, help="torch device: cpu, cuda, cuda:1, ... (default: the plan's)")
    ap.add_argument("--iters", type=int, default=10, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up iterations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads (default on cpu: those of the captured step; 0: torch's default)")
    ap.add_argument("--pacing", choices=PACINGS, default="none",
                    help="none: ops back to back; recorded: wait the captured step's host gaps between ops")
    ap.add_argument("--allow-ops", dest="allow_ops", action="append", default=[], metavar="PATTERN",
                    help="also call the operators matching PATTERN (fnmatch on ns::name, e.g. 'mylib::*'; "
                    "repeatable); outside the namespaces " + ", ".join(ALLOWED_OP_NAMESPACES) + " others are skipped, and "
                    "a plan calling an operator that touches files, shared memory or process state, or has no "
                    "tensor semantics, is refused")
    ns = ap.parse_args(argv)
    if not ns.plan:
        print("error: no plan given (--plan)", file=sys.stderr)
        return 2
    if ns.iters < 1 or ns.warmup < 0 or (ns.threads is not None and ns.threads < 0):
        print("error: --iters must be >= 1, --warmup >= 0 and --threads >= 0", file=sys.stderr)
        return 2
    try:
        plan = load_plan(ns.plan)
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    refused = plan_refusal(plan["ops"], ns.allow_ops)  # before anything runs: a plan is data
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    name = ns.device or plan["metadata"].get("default_device") or "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        print(f"error: bad device {name!r}: {exc}", file=sys.stderr)
        return 2
    backend = getattr(torch, dev.type, None)
    if dev.type not in ("cpu", "meta") and not (backend is not None and backend.is_available()):
        print(f"error: device {name} is not available", file=sys.stderr)
        return 3
    threads = replay_threads(plan, dev, ns.threads)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        ex = Executor(plan, dev, seed=ns.seed, pacing=ns.pacing, allow_ops=ns.allow_ops)
        ex.prepare()
    except InsufficientMemory as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        print(f"error: malformed benchmark plan: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    times = ex.time_iterations(ns.iters, ns.warmup)
    c = ex.counts()
    print(f"ops: {c['total']} total, {c['replayed']} replayed, {sum(c['skipped'].values())} skipped; "
          f"{torch.get_num_threads()} CPU threads; pacing {ex.pacing}"
          + (f" ({ex.paced_ops} recorded gaps, {ex.pacing_gap_us / 1e3:.3f} ms an iteration)" if ex.paced_ops else ""))
    for i, t in enumerate(times):
        print(f"iteration {i}: {t * 1e3:.3f} ms")
    print(f"median: {statistics.median(times) * 1e3:.3f} ms")
    return 0
