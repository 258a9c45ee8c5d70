"""Packaging contracts: the namespace mapping, the console script and cheap imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mystique

REPO = Path(__file__).resolve().parents[1]


def test_validators_resolve_to_this_repository_folder():
    import mystique.reports
    import mystique.validators
    import mystique.workloads

    assert Path(mystique.validators.__file__).resolve().parent == REPO / "validators"
    assert Path(mystique.workloads.__file__).resolve().parent == REPO / "workloads"
    assert Path(mystique.reports.__file__).resolve().parent == REPO / "reports"
    assert Path(mystique.__file__).resolve().parent == REPO / "mystique"


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_help_does_not_import_torch():
    mods = _modules_after("from mystique.cli import cli\nfrom click.testing import CliRunner\n"
                          "assert CliRunner().invoke(cli, ['--help']).exit_code == 0")
    assert "torch" not in mods


def test_results_and_reports_do_not_import_torch():
    mods = _modules_after("import mystique.results, mystique.reports, mystique.io")
    assert "torch" not in mods


def test_console_script_help_lists_exit_codes():
    exe = Path(sys.executable).with_name("mystique")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for code in ("0", "1", "2", "3"):
        assert f"  {code}  " in out
    assert "capture" in out and "workloads" in out and "faults" in out


def test_version():
    assert mystique.__version__
