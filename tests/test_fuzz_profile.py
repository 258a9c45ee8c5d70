"""The property tests under the ``fuzz`` Hypothesis profile (random seeds, 10x the examples): run with
``pytest -m slow``. A failure found here becomes an ``@example`` of the failing test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

# pure-logic property tests: laws of the results schema, bit flips, rates, intervals, tolerances,
# the timing guard and the trace types, which random seeds explore beyond the default's fixed sequence
FILES = ("test_results.py", "test_rate_verdicts.py", "test_trace_types.py", "test_host_contention.py",
         "test_correctness_tolerance.py", "test_fault_modes.py", "test_timing.py", "test_fleet_campaign.py")


@pytest.mark.slow
def test_the_property_tests_hold_under_random_seeds_and_ten_times_the_examples():
    env = {**os.environ, "MYSTIQUE_HYPOTHESIS": "fuzz"}
    files = [str(REPO / "tests" / f) for f in FILES if (REPO / "tests" / f).exists()]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *files],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_fuzz_profile_is_chosen_by_the_environment():
    """Under MYSTIQUE_HYPOTHESIS=fuzz the examples are ten times the default's and the seeds random."""
    code = ("import conftest, hyp; from hypothesis import settings; s = hyp.examples(7); "
            "print(s.max_examples, settings.default.derandomize)")
    for value, expected in (("", "7 True"), ("fuzz", "70 False")):
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO / "tests", capture_output=True, text=True,
                             env={**os.environ, "MYSTIQUE_HYPOTHESIS": value}, timeout=120, check=True)
        assert out.stdout.split()[-2:] == expected.split(), out.stdout
