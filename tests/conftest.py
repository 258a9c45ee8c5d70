"""Shared fixtures. `tests/` is on sys.path (pytest prepend import mode), so helper modules
such as ``user_steps`` can be named as ``package.module:function`` capture targets."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


@pytest.fixture
def cli_run():
    """Run the CLI in-process with click's CliRunner: returns (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from mystique.cli import cli

    def _run(*args: str):
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    return _run


class FakeClock:
    """A clock that moves only when told: timing logic tested on known series, not on the host's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock(monkeypatch):
    """The performance validator's timed calls on a :class:`FakeClock` with no run-queue waits: a
    timed function advances the clock by the seconds it "takes"."""
    from mystique.validators.performance import timed

    clock = FakeClock()
    monkeypatch.setattr(timed, "clock", clock)
    return clock


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` run on a machine with a CUDA device and skip, saying why, elsewhere."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    why = pytest.mark.skip(reason=f"needs a CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(why)


def _hypothesis_profiles() -> None:
    """Two Hypothesis profiles (tests/hyp.py):

    * ``default``: a fixed example sequence (derandomized), no example database and no deadline or
      too-slow health check, so a run's verdict depends neither on earlier runs nor on how busy the
      host is; every case ever found failing stands as an explicit ``@example``.
    * ``fuzz`` (``MYSTIQUE_HYPOTHESIS=fuzz``): random seeds and ten times the examples
      (``hyp.examples``); ``pytest -m slow`` runs the property tests under it. A failure it finds
      becomes an ``@example`` of its test.
    """
    from hyp import FUZZ
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow]
    settings.register_profile("default", derandomize=True, database=None, deadline=None, print_blob=True,
                              suppress_health_check=quiet)
    settings.register_profile("fuzz", derandomize=False, database=None, deadline=None, print_blob=True,
                              max_examples=1000, suppress_health_check=quiet)
    settings.load_profile("fuzz" if FUZZ else "default")


_hypothesis_profiles()


def _triton_stdlib_interpreted() -> None:
    """Triton's interpreter works only where ``TRITON_INTERPRET=1`` was set when ``triton`` was first
    imported: its standard library (``tl.zeros``, ``tl.sum``, ...) is decorated then, as interpreted or as
    compiled functions, and an interpreted kernel calls them. torch imports triton as a side effect (its
    ``_dynamo``, e.g. the first time a TorchDispatchMode runs), so without this the interpreter tests of
    ``tests/test_soft_errors_triton.py`` failed whenever a fault-injection test had run before them in the
    same process ("Cannot call @triton.jit'd outside of the scope of a kernel").

    Where no CUDA device is present (nothing compiled could run anyway), import triton here with the flag
    set, then restore the flag: the product's CPU paths still take torch unless a test sets it.
    ``MYSTIQUE_TRITON_STDLIB=compiled`` leaves triton alone (the sm_90 compile test's own process)."""
    import importlib.util
    import os
    import sys

    if "triton" in sys.modules or os.environ.get("MYSTIQUE_TRITON_STDLIB") == "compiled":
        return
    if importlib.util.find_spec("triton") is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


_triton_stdlib_interpreted()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker per CPU this process may run on, at most 4 (each worker imports torch and
    builds its own session fixtures: more workers cost memory and repeated set-up, and the default run
    has too few long tests to keep more busy); one worker for a selection with ``slow`` tests."""
    import os

    marks = (config.option.markexpr or "").replace(" ", "")
    if "slow" in marks and marks != "notslow":
        return 1  # the slow selection holds timing benchmarks: run side by side, they would disturb each other
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _share_the_cores(config: pytest.Config) -> None:
    """An xdist worker takes its share of the CPUs for torch's intra-op threads (and, through
    ``OMP_NUM_THREADS``, for the CLI subprocesses it starts): two workers each running torch on every
    core oversubscribe them, and OpenMP's spinning threads then slow both (2 cores, 2 workers: the default
    run took 303 s with torch's default threads, 119 s with one each). The serial run keeps torch's default."""
    import os

    if getattr(config, "workerinput", None) is None:
        return
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = max(1, cpus // max(workers, 1))
    torch.set_num_threads(share)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(share))


# --- issue #30, every check can fail: note the results rows the product writes during each test
# (tests/check_recorder.py) and hold the session to tests/check_reproducers.py at its end ---
def pytest_configure(config: pytest.Config) -> None:
    import check_recorder

    _share_the_cores(config)

    check_recorder.register(config)
