"""Numerics validator: every result of the device judged against an fp64 golden.

``run(target, level="quick", seed=0, groups=None, out_dir=None, **options)`` returns the results
rows (suite ``numerics``); ``groups(level)`` names the check groups, each runnable alone:

* ``conversions``: exhaustive fp32 -> bf16/fp16 round-to-nearest-even on the device (every pattern,
  every tie, both neighbours of every tie) and exact widening.
* ``special_values``: subnormals kept, overflow to inf, NaN propagation, signed zero.
* ``op_sweep``: GEMMs, convolution, softmax, norms, activations, reductions, attention (each SDPA
  backend the device has), embedding_bag and cross entropy in bf16/fp16/fp32 versus fp64 goldens
  (bounds in :mod:`.opsweep`).
* ``accumulation``: the accumulator precision of bf16/fp16 ``mm`` and ``sum`` and whether the
  summation order changes results (facts; a GEMM or sum accumulating in less than fp32 fails).
* ``model_deviation``: each reference workload's forward and training step under bf16/fp16
  autocast on the device versus fp64 on the CPU, per top-level block, and SDPA backends compared
  with the math backend.
* ``repeatability``: identical inputs give bit-identical results run after run.
* ``moe_router_flips``: Llama 4's router top-k under bf16/fp16 autocast versus fp64 on the same input:
  a flip that the rounding bound of the two scores cannot explain fails (:mod:`.moe`).

Options: ``dtypes`` (names or torch dtypes; default bf16, fp16, fp32), ``ops`` (restrict the op
sweep), ``benchmark`` (a benchmark dir whose GEMM shapes join the sweep), ``workloads`` (names for
``model_deviation``), ``repeats`` (runs per op in ``repeatability``).

Every golden is computed on the CPU outside ``target.active()``; only the operators of the device
under test run inside it.

Layout: one module per group (``conversions.py`` holds two) with a ``run_<group>(ctx: Ctx)``
function, listed in :data:`RUNNERS`; :class:`._ctx.Ctx` is the run's :class:`GroupContext` with
the dtypes and the row helpers; a new operator of the sweep is a ``Case`` in :mod:`.op_cases`,
judged by :mod:`.opsweep` with the bounds of :mod:`.bounds`; :mod:`._fp` holds the error metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from mystique import dtypes as dtype_names
from mystique.errors import UsageError
from mystique.progress import Progress
from mystique.results import Results, RunContext

from ..groups import run_groups, select_groups
from ._ctx import Ctx
from ._fp import SWEEP_DTYPES
from .accumulation import run_accumulation
from .conversions import run_conversions, run_special_values
from .model import run_model_deviation
from .moe import run_moe_router_flips
from .opsweep import run_op_sweep
from .repeat import run_repeatability

RUNNERS: dict[str, Callable[[Ctx], None]] = {
    "conversions": run_conversions, "special_values": run_special_values, "op_sweep": run_op_sweep,
    "accumulation": run_accumulation, "model_deviation": run_model_deviation, "repeatability": run_repeatability,
    "moe_router_flips": run_moe_router_flips,
}
GROUPS: tuple[str, ...] = tuple(RUNNERS)


def groups(level: str = "quick") -> list[str]:
    """The check groups run at ``level`` (every group runs at both levels; full uses bigger sizes)."""
    _check_level(level)
    return list(GROUPS)


def _check_level(level: str) -> None:
    if level not in ("quick", "full"):
        raise UsageError(f"unknown level {level!r}; expected quick or full")


def _parse_dtypes(dtypes: Any) -> tuple:
    if dtypes is None:
        return SWEEP_DTYPES
    if isinstance(dtypes, str):
        dtypes = [d for d in dtypes.split(",") if d.strip()]
    out = []
    for d in dtypes:
        dt = d if isinstance(d, torch.dtype) else dtype_names.from_name(d)
        if dt not in SWEEP_DTYPES:
            raise UsageError(f"unsupported dtype {d!r}; expected some of bfloat16, float16, float32")
        if dt not in out:
            out.append(dt)
    if not out:
        raise UsageError("no dtype given")
    return tuple(out)


def run(target: Any, *, level: str = "quick", seed: int = 0, groups: Iterable[str] | None = None,
        out_dir: Any = None, **options: Any):
    """Run the numerics checks on ``target``; return the results DataFrame (``mystique.results`` columns).

    ``groups`` selects check groups (None: all of ``groups(level)``; an empty selection is a
    UsageError); a group that raises becomes a ``group_error`` row (:mod:`mystique.validators.groups`).
    ``out_dir`` is accepted for the CLI contract (nothing extra is written). Raises UsageError for
    unknown groups, dtypes, ops or levels.
    """
    _check_level(level)
    chosen = select_groups("numerics", groups, GROUPS, GROUPS)
    dtypes = _parse_dtypes(options.pop("dtypes", None))
    if options.get("ops"):
        ops = options["ops"]
        options["ops"] = [o.strip() for o in (ops.split(",") if isinstance(ops, str) else ops) if o.strip()]
    res = Results(RunContext.for_target(target), "numerics")
    progress = Progress("numerics", total=len(chosen))
    ctx = Ctx(target=target, res=res, seed=int(seed), level=level, progress=progress, options=options,
              out_dir=out_dir, dtypes=dtypes)
    run_groups(RUNNERS, ctx, chosen)
    return res.frame()
