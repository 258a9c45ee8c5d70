"""Packaging contracts: the namespace mapping, the console script and cheap imports."""

from __future__ import annotations

import json
import re
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
    from mystique.errors import EnvironmentUnsupported, UsageError

    lines = {m[1]: m[2] for m in re.finditer(r"^\s+([0-9])\s{2,}(\S.*)$", out, re.M)}
    assert set(lines) >= {"0", "1", "2", "3"}, out  # each exit code on its own line, with its meaning
    assert "passed" in lines["0"] and "failed" in lines["1"]
    assert "usage" in lines[str(UsageError.exit_code)] and "environment" in lines[str(EnvironmentUnsupported.exit_code)]
    assert "capture" in out and "workloads" in out and "faults" in out


def test_version_is_the_one_packaged_declared_and_printed():
    """``mystique.__version__``, the installed distribution's metadata, pyproject.toml and ``mystique --version``
    name one version (a stale ``__version__`` or an install of another checkout fails here)."""
    from importlib.metadata import version

    declared = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert declared, "pyproject.toml declares no static version"
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[.+-]?\w+)*", declared[1]), declared[1]
    assert mystique.__version__ == declared[1] == version("mystique-suite")
    exe = Path(sys.executable).with_name("mystique")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"mystique, version {declared[1]}"


def test_every_package_folder_is_listed_for_the_wheel():
    """A folder with an ``__init__.py`` that pyproject's ``packages`` omits is missing from a built wheel
    (an editable install hides it): each one is listed, under its installed name."""
    import tomllib

    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    roots = {folder: name for name, folder in tool["package-dir"].items()}
    found = set()
    for folder, name in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed, f"unlisted: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"


def test_each_workloads_module_imports_no_other_part_of_mystique():
    """``workloads`` needs only torch: importing any of its modules loads no ``mystique.*`` module but the
    package root and ``mystique.workloads.*`` (the standalone runtime and the validators build on
    workloads, never the other way). One interpreter, torch loaded first, each module's import diffed
    against what was loaded before it: a forbidden import shows in the diff of the first module that
    makes it (an interpreter per module cost a torch import each, 15 s of the default run)."""
    names = sorted(p.stem for p in (REPO / "workloads").glob("*.py") if p.stem != "__init__")
    assert {"base", "llama", "dlrm", "bert"} <= set(names)
    code = ("import importlib, json, sys, torch\nnew = {}\n"
            f"for name in {names!r}:\n"
            "    before = set(sys.modules)\n"
            "    importlib.import_module('mystique.workloads.' + name)\n"
            "    new[name] = sorted(set(sys.modules) - before)\n"
            "print(json.dumps(new))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = json.loads(out.stdout.strip().splitlines()[-1])
    loaded: set[str] = set()
    for name in names:
        loaded |= set(new[name])
        assert {"mystique.workloads", f"mystique.workloads.{name}"} <= loaded, name
        others = [m for m in new[name] if m.startswith("mystique.")
                  and m != "mystique.workloads" and not m.startswith("mystique.workloads.")]
        assert not others, (name, others)
