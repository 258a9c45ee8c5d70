"""`mystique qualify`: pytest in process, outputs in OUT_DIR, the exit codes of docs/design.md."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from mystique.validators.qualify import pytest_args

from mystique.cli import main

FAKE = '''
from mystique.results import Results, RunContext

def groups(level):
    return ["good", "bad"]

def run(target, *, level, seed, groups, out_dir):
    r = Results(RunContext.for_target(target), "numerics")
    for g in groups:
        bad = g == "bad"
        r.add(f"{g}_check", "aten::mm", "max_abs_err", 1.0 if bad else 0.0, threshold=0.5,
              status="fail" if bad else "pass", detail=f"seed {seed}" if bad else "")
    return r.frame()
'''


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "qualfake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "numerics.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_passing_qualification_exits_0_and_writes_every_output(fake, capsys):
    out = fake / "q"
    rc = main(["qualify", "-o", str(out), "--validators", "qualfake.numerics", "-k", "good", "--seed", "3"])
    assert rc == 0
    assert {"results.csv", "junit.xml"} <= {p.name for p in out.iterdir()}
    df = pd.read_csv(out / "results.csv")
    assert list(df["check"]) == ["good_check"] and set(df["status"]) == {"pass"}
    assert ET.parse(out / "junit.xml").getroot().find(".//testcase").get("classname") == "mystique.numerics"
    printed = capsys.readouterr().out
    assert "mystique qualify: 1 checks, 0 failed" in printed
    assert not [p for p in fake.iterdir() if p.name.startswith(".q.")]  # no staging folder left behind
    # pytest's header and our summary name the folder the user gets, not the staging folder (only
    # pytest's own junitxml line names the file where it was written)
    assert f"results: {out / 'results.csv'}" in printed and f"report dir {out}" in printed
    assert not [ln for ln in printed.splitlines() if ".q." in ln and "generated xml file" not in ln]


def test_failing_check_exits_1_and_keeps_the_evidence(fake, capsys):
    out = fake / "q"
    rc = main(["qualify", "-o", str(out), "--validators", "qualfake.numerics"])
    assert rc == 1
    df = pd.read_csv(out / "results.csv")
    assert df.set_index("check").loc["bad_check", "status"] == "fail"
    text = capsys.readouterr().out
    assert "fail bad_check [aten::mm]: max_abs_err = 1 vs threshold 0.5 -- seed 0" in text


def test_usage_errors_exit_2_before_anything_runs(fake, capsys):
    assert main(["qualify", "-o", str(fake / "a"), "--device", "tpu0"]) == 2
    assert main(["qualify", "-o", str(fake / "b"), "--inject", "nosuchfault"]) == 2
    assert main(["qualify", "-o", str(fake / "c"), "--inject", "bitflip:rate=-1"]) == 2
    (fake / "full").mkdir()
    (fake / "full" / "keep.txt").write_text("x")
    assert main(["qualify", "-o", str(fake / "full"), "--validators", "qualfake.numerics"]) == 2
    err = capsys.readouterr().err
    assert err.count("mystique: error:") == 4 and "Traceback" not in err
    assert not (fake / "a").exists() and not (fake / "b").exists() and not (fake / "c").exists()


def test_no_runnable_validator_exits_3(fake, capsys):
    assert main(["qualify", "-o", str(fake / "q"), "--validators", "nosuch"]) == 3
    assert "no qualification check could run" in capsys.readouterr().err
    assert not (fake / "q").exists()


def test_keyword_matching_nothing_is_a_usage_error(fake, capsys):
    assert main(["qualify", "-o", str(fake / "q"), "--validators", "qualfake.numerics", "-k", "zzz"]) == 2
    assert "no qualification check matches -k 'zzz'" in capsys.readouterr().err


def test_absent_device_exits_3(fake, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["qualify", "-o", str(fake / "q"), "--device", "cuda"]) == 3
    assert "not available" in capsys.readouterr().err


def test_inner_session_is_isolated_from_the_callers_project(tmp_path):
    args = pytest_args(tmp_path, device="cpu", inject="wrong_gelu", level="full", seed=5)
    assert args[0] == str(tmp_path) and args[args.index("-c") + 1] == os.devnull
    assert "--noconftest" in args and "no:cacheprovider" in args and "no:unraisableexception" in args
    assert args[args.index("--mystique-inject") + 1] == "wrong_gelu"
    assert args[args.index("--junitxml") + 1] == str(tmp_path / "junit.xml")


# --- self-proof (issue 6): the real validators pass a healthy CPU and catch every built-in fault --

FAULTS = ["bitflip", "stuck_lane", "truncating_casts", "low_precision_accum", "subnormal_flush", "wrong_gelu",
          "nondeterministic_reduction"]


def _qualify(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MYSTIQUE_QUIET": "1"}
    return subprocess.run([sys.executable, "-m", "mystique", "qualify", "--level", "quick", "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_healthy_cpu_passes_quick_qualification(tmp_path, seed):
    done = _qualify(tmp_path / "q", "--seed", str(seed))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_every_builtin_fault_fails_quick_qualification(tmp_path, fault):
    done = _qualify(tmp_path / "q", "--inject", fault)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    df = pd.read_csv(tmp_path / "q" / "results.csv", keep_default_na=False)
    caught = df[df["status"].isin(["fail", "error"])]
    checks = set(caught["check"]) - {"validator_error"}
    assert checks, "only crashes, no check caught it"
    report = tmp_path / "q" / "report.html"
    if report.exists():
        assert any(check in report.read_text() for check in checks)
