"""Replay execution traces with synthetic data, and generate standalone benchmarks from them.

The path of a trace: :mod:`.plan` (trace -> plan: :mod:`.classify`, :mod:`.builder`,
:mod:`.recipes`), :mod:`.runtime` (the plan format and the :class:`Executor` that runs it; standalone,
embedded in ``benchmark.py``), :mod:`.run` (``mystique replay``: :mod:`.fidelity`, :mod:`.summary`,
:mod:`.result_rows`) and :mod:`.generate` (``mystique generate``). Public API:

- :func:`build_plan` (trace -> :class:`Plan`), :func:`plan_from_path` (any input -> plan);
- :class:`Executor` (runs a plan on a device);
- :func:`replay` (``mystique replay``: ops.csv, summary.json, results.csv);
- :func:`generate` (``mystique generate``: benchmark.json, benchmark.py).
"""

from .generate import generate
from .plan import Plan, build_plan, normalise, plan_from_path
from .run import replay
from .runtime import Executor, InsufficientMemory, ReplayError, parse_schema

__all__ = ["Executor", "InsufficientMemory", "Plan", "ReplayError", "build_plan", "generate", "normalise",
           "parse_schema", "plan_from_path", "replay"]
