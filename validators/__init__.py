"""Validators of the device under test, one folder (or module) each: ``numerics``, ``soft_errors``,
``correctness``, ``performance`` and ``onnx_runtime``; ``qualify`` and ``selftest`` run them together.

Each validator exposes ``run(target: Target, **options) -> pandas.DataFrame`` with rows in the
results schema (``mystique.results``); its check groups share the shape of :mod:`.groups`.
"""
