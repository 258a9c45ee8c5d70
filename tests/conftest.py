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


# --- issue #30, every check can fail: note the results rows the product writes during each test
# (tests/check_recorder.py) and hold the session to tests/check_reproducers.py at its end ---
def pytest_configure(config: pytest.Config) -> None:
    import check_recorder

    check_recorder.register(config)
