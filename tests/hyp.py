"""Example counts of the property tests under the two Hypothesis profiles (tests/conftest.py)."""

from __future__ import annotations

import os

from hypothesis import settings

#: ``MYSTIQUE_HYPOTHESIS=fuzz``: random seeds and ``FUZZ_FACTOR`` x the examples of the default run
FUZZ = os.environ.get("MYSTIQUE_HYPOTHESIS", "") == "fuzz"
FUZZ_FACTOR = 10


def examples(n: int, **kwargs) -> settings:
    """``@settings`` with ``n`` examples in the default run and ``FUZZ_FACTOR`` x ``n`` under fuzz."""
    return settings(max_examples=n * (FUZZ_FACTOR if FUZZ else 1), **kwargs)
