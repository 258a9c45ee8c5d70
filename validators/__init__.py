"""Validators of the device under test: numerics, soft errors, correctness.

Each validator module exposes ``run(target: Target, **options) -> pandas.DataFrame`` with rows in
the results schema (``mystique.results``).
"""
