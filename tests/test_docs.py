"""The user docs stay true: README and docs/design.md name what exists, figures come from results.

docs/figures.md is generated from the committed docs/results/*/results.csv by docs/figures.py, so
it cannot drift from them; the README states targets and methods, never one host's figures.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from mystique.cli import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
FIGURES = ROOT / "docs" / "figures.py"
MAX_README_LINES = 250

# What a per-host figure looks like in prose: a date, a clock rate, a CPU or GPU model, a time "on"
# a host or "wall", a signed percentage, a measured interval, a cache size.
PER_HOST = [
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    re.compile(r"\b\d+(\.\d+)?\s?[GM]Hz\b"),
    re.compile(r"\b(EPYC|Xeon|Ryzen|Zen ?\d|Core i[3579]|Graviton|Neoverse|H100|H200|A100|V100|MI[23]\d\d)\b"),
    re.compile(r"\d(\.\d+)?\s?(ns|us|µs|ms|s|min)\s+(on|wall)\b"),
    re.compile(r"(?<![\w=<>])[+-]\d+(\.\d+)?\s?%"),
    re.compile(r"\[\d+(\.\d+)?,\s*\d+(\.\d+)?\]"),
    re.compile(r"\b\d+\s?[KM]B L[123]\b"),
]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES})"


def test_readme_has_no_per_host_figures():
    bad = [f"{i}: {line.strip()}" for i, line in enumerate(README.read_text().splitlines(), 1)
           if any(p.search(line) for p in PER_HOST)]
    assert not bad, "per-host figures belong in docs/figures.md (docs/results/), not the README:\n" + "\n".join(bad)


def test_readme_starts_with_the_two_setup_commands():
    first = _blocks(README.read_text(), "bash")[0].splitlines()
    assert first[0].endswith(".venv/bin/mystique demo -o demo-out")
    assert first[1].endswith(".venv/bin/python -m pytest -n auto")  # pytest-xdist: a worker per core, up to 4
    ci = (ROOT / ".ci" / "run").read_text()
    assert first[1] in ci, ".ci/run runs the README's test command verbatim"


def test_readme_links_the_docs():
    text = README.read_text()
    assert "docs/design.md" in text and "docs/figures.md" in text
    assert DESIGN.is_file()


def _command(tokens: list[str]) -> tuple[click.Command, list[str]] | None:
    """The click command a README line runs (after the word ``mystique``), and its option words."""
    if "mystique" not in tokens:
        return None
    words = tokens[tokens.index("mystique") + 1:]
    cmd: click.Command = cli
    while isinstance(cmd, click.Group) and words and not words[0].startswith("-"):
        assert words[0] in cmd.commands, f"no command {words[0]!r}"
        cmd, words = cmd.commands[words[0]], words[1:]
    return cmd, [w.split("=")[0] for w in words if w.startswith("-")]


def _options(cmd: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for p in cmd.params:
        names.update(p.opts)
        names.update(p.secondary_opts)
    return names


def test_readme_commands_and_options_exist():
    """Every `mystique ...` line of the README names a real command and real options."""
    for block in _blocks(README.read_text(), "bash")[1:]:
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            found = _command(shlex.split(line))
            if found is None:
                continue
            cmd, opts = found
            unknown = [o for o in opts if o not in _options(cmd)]
            assert not unknown, f"{line}: {cmd.name} has no option {unknown}"


def test_readme_python_imports_exist():
    for block in _blocks(README.read_text(), "python"):
        for module, names in re.findall(r"^from (\S+) import (.+)$", block, flags=re.M):
            mod = importlib.import_module(module)
            for name in (n.strip() for n in names.split(",")):
                assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"{module}.{name}"


@pytest.mark.parametrize("path", ["mystique", "workloads", "validators", "reports", "tests"])
def test_code_points_to_docs_design(path: str):
    old = "DESIGN" + ".md"
    stale = [str(p.relative_to(ROOT)) for p in (ROOT / path).rglob("*.py") if old in p.read_text()]
    assert not stale, f"{old} is docs/design.md now: {stale}"


def test_figures_page_is_generated_from_the_committed_results():
    run = subprocess.run([sys.executable, str(FIGURES), "--check"], cwd=ROOT, capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert list((ROOT / "docs" / "results").glob("*/results.csv")), "no committed results under docs/results"


def test_readme_soft_error_building_blocks_exist():
    from mystique.validators import soft_errors

    text = README.read_text()
    para = text[text.index("`mystique.validators.soft_errors` building blocks:"):]
    para = para[:para.index("\n\n")].split("Integer checksums")[0]
    names = {m.group(1) for m in re.finditer(r"`([A-Za-z_]\w*)(\([^`]*\))?`", para)}
    missing = sorted(n for n in names if not hasattr(soft_errors, n))
    assert not missing, f"the README names soft_errors.{missing}"


def test_design_cli_synopsis_names_real_options():
    """docs/design.md's CLI block: each line's options exist on the command it lists them under."""
    text = DESIGN.read_text()
    block = _blocks(text[text.index("## CLI"):], "")[0]
    cmd: click.Command = cli
    for line in block.splitlines():
        if line.startswith("mystique "):
            cmd, words = cli, line.split()[1:]
            while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
                cmd, words = cmd.commands[words[0]], words[1:]
        synopsis = line.split("   ")[0] if line.startswith("mystique ") else line
        opts = re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", synopsis)
        unknown = [o for o in opts if o not in _options(cmd) | _options(cli)]
        assert not unknown, f"docs/design.md: {line.strip()}: {cmd.name} has no option {unknown}"


def _figures_module():
    spec = importlib.util.spec_from_file_location("figures_under_test", FIGURES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_figures_keep_a_run_made_elsewhere_and_count_its_sample_rows(tmp_path, monkeypatch):
    """A GPU machine's run (.ci/gpu-check writes meta.json beside results.csv) is kept like a local one;
    its clock samples stay in the results.csv and are counted, not listed, on the page."""
    figures = _figures_module()
    monkeypatch.setattr(figures, "RESULTS", tmp_path / "results")
    run = tmp_path / "run"
    run.mkdir()
    base = {"run_id": "r1", "started_at": "2026-11-27T07:00:00+00:00", "host": "gpu-host", "device": "cuda",
            "device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.11.0", "suite": "performance",
            "subject": "bert/small/infer", "dtype": "float32", "unit": "", "threshold": None}
    rows = [{**base, "check": "step_time", "metric": "median_ms", "value": 1.4, "status": "info", "detail": "d"}]
    rows += [{**base, "check": "clock_trace", "metric": "sm_clock_mhz", "value": 1980.0 - i, "status": "info",
              "detail": f"t={i} s; NVML"} for i in range(5)]
    import pandas as pd

    pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    with pytest.raises(SystemExit, match="meta.json"):
        figures.keep("h100_perf", run, "", "")
    (run / "meta.json").write_text('{"command": "mystique validate performance --device cuda -o OUT", '
                                   '"exit_code": 0, "wall_s": 89.0, "cpus": 16}')
    dest = figures.keep("h100_perf", run, "the first H100's figures", "nothing else ran")
    assert (dest / "results.csv").read_bytes() == (run / "results.csv").read_bytes()
    text = figures.page(tmp_path / "results")
    assert "NVIDIA H100 80GB HBM3, 16 CPUs" in text and "the first H100's figures" in text
    assert "5 sample rows (clock_trace" in text and "| clock_trace |" not in text and "| step_time |" in text
