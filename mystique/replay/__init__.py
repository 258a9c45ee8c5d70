"""Replay execution traces with synthetic data, and generate standalone benchmarks from them.

Public API:

- :func:`build_plan` (trace -> :class:`Plan`), :func:`plan_from_path` (any input -> plan);
- :class:`Executor` (runs a plan on a device; torch + stdlib only, embedded in ``benchmark.py``);
- :func:`replay` (``mystique replay``: ops.csv, summary.json, results.csv);
- :func:`generate` (``mystique generate``: benchmark.json, benchmark.py).
"""

from .executor import Executor, InsufficientMemory, ReplayError, parse_schema
from .generate import generate
from .plan import Plan, build_plan, normalise, plan_from_path
from .run import replay

__all__ = ["Executor", "InsufficientMemory", "Plan", "ReplayError", "build_plan", "generate", "normalise",
           "parse_schema", "plan_from_path", "replay"]
