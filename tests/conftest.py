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
    """CI runs a fixed example sequence (a red build must reproduce); local runs explore."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_hypothesis_profiles()
