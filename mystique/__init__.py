"""Mystique Suite: portable benchmarks from real PyTorch workloads, and accelerator qualification.

Importing the package is cheap: nothing here imports torch. The parts are
``mystique.trace`` (execution-trace model), ``mystique.capture``, ``mystique.replay``,
``mystique.targets``, ``mystique.results``, ``mystique.workloads``, ``mystique.validators``
and ``mystique.reports``.
"""

__version__ = "0.1.0"
