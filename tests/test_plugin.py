"""The pytest plugin: inert without --mystique-device; with it, one item per (validator, group)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
import torch  # noqa: F401

import mystique.faults  # noqa: F401
import mystique.results  # noqa: F401
import mystique.targets  # noqa: F401
from mystique import reports  # noqa: F401

# The inner sessions run in this process (pytester.runpytest), and pytester drops the modules a
# session imported when it ends; torch and what imports it are imported here, once, because a
# C extension imported a second time crashes the process.
pytest_plugins = ["pytester"]

# A stand-in validator with the contract: groups alpha (passes) and beta (fails) at every level,
# gamma only at level full, quiet (every check skipped) and boom (raises).
FAKE_VALIDATOR = '''
from mystique.results import Results, RunContext

def groups(level):
    return ["alpha", "beta", "quiet", "boom"] + (["gamma"] if level == "full" else [])

def run(target, *, level, seed, groups, out_dir):
    r = Results(RunContext.for_target(target), "numerics")
    for g in groups:
        if g == "boom":
            raise RuntimeError("validator crashed on purpose")
        if g == "quiet":
            r.add("quiet_check", "mm", "x", None, status="skip", detail="nothing to do here")
            continue
        bad = g == "beta"
        r.add(f"{g}_error_vs_fp64", "aten::mm", "max_rel_err", 0.5 if bad else 1e-4, threshold=0.01,
              status="fail" if bad else "pass", dtype="bfloat16",
              detail=f"seed {seed}, shape 64x64 (device {target.label})" if bad else "")
    return r.frame()
'''
NO_CONTRACT = "GROUPS = ['a']\n"
# Groups without a failure: measure (only measurements), idle (a measurement and a skip), mixed (a
# measurement and a passed check).
MEASURES = '''
from mystique.results import Results, RunContext

def groups(level):
    return ["measure", "idle", "mixed"]

def run(target, *, level, seed, groups, out_dir):
    r = Results(RunContext.for_target(target), "performance")
    for g in groups:
        r.add(f"{g}_time", "mm", "ms", 1.5, status="info", unit="ms")
        if g == "idle":
            r.add("idle_check", "mm", "x", None, status="skip", detail="no device to compare with")
        if g == "mixed":
            r.add("mixed_check", "mm", "x", 0.1, threshold=1, status="pass")
    return r.frame()
'''


@pytest.fixture
def qual(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(**{"fakepkg/__init__.py": "", "fakepkg/numerics.py": FAKE_VALIDATOR,
                           "fakepkg/nocontract.py": NO_CONTRACT, "fakepkg/measures.py": MEASURES})
    pytester.syspathinsert()
    pytester.makepyfile(test_user="def test_user():\n    pass\n")
    return pytester


def enable(*extra: str, validators: str = "fakepkg.numerics") -> list[str]:
    return ["-p", "no:cacheprovider", "--mystique-device", "cpu", "--mystique-validators", validators, *extra]


def test_importing_the_plugin_does_not_import_torch():
    code = ("import sys, mystique.validators.pytest_plugin as p; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(p.DEFAULT_VALIDATORS)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_inert_without_the_device_option(qual):
    result = qual.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*collected 1 item*"])
    result.stdout.no_fnmatch_line("mystique*")
    result.stdout.no_fnmatch_line("*mystique::*")


def test_markers_are_registered_even_when_inert(qual):
    result = qual.runpytest("-p", "no:cacheprovider", "--markers")
    for marker in ("numerics", "soft_errors", "correctness", "slow"):
        result.stdout.fnmatch_lines([f"@pytest.mark.{marker}:*"])


def test_one_item_per_group_beside_the_users_tests(qual):
    result = qual.runpytest(*enable("--collect-only", "-q"))
    result.stdout.fnmatch_lines(["test_user.py::test_user", "mystique::numerics::alpha", "mystique::numerics::beta",
                                 "mystique::numerics::quiet", "mystique::numerics::boom"])
    result.stdout.no_fnmatch_line("*gamma*")


def test_header_shows_device_level_and_seed(qual):
    result = qual.runpytest(*enable("--collect-only", "--mystique-seed", "42"))
    result.stdout.fnmatch_lines(["mystique: device cpu (*), torch *", "mystique: level quick, seed 42, *"])


def test_failing_group_fails_with_its_rows_and_crash_is_an_error_row(qual):
    result = qual.runpytest(*enable("--mystique-seed", "7", "-rs"))
    result.assert_outcomes(passed=2, failed=2, skipped=1)
    result.stdout.fnmatch_lines([
        "*1 of 1 checks of fakepkg.numerics::beta failed on cpu (seed 7):",
        "*fail beta_error_vs_fp64 [[]aten::mm, bfloat16[]]: max_rel_err = 0.5 vs threshold 0.01 -- seed 7, "
        "shape 64x64 (device cpu); reproduce: mystique qualify --device cpu --level quick --seed 7 "
        "--validators fakepkg.numerics -k beta -o OUT",
    ])
    result.stdout.fnmatch_lines(["*RuntimeError: validator crashed on purpose*"])
    result.stdout.fnmatch_lines(["SKIPPED*nothing to do here*"])


def test_markers_and_keywords_select(qual):
    result = qual.runpytest(*enable("-m", "numerics and not slow", "-k", "alpha or quiet"))
    result.assert_outcomes(passed=1, skipped=1)
    result = qual.runpytest(*enable("-m", "not numerics"))
    result.assert_outcomes(passed=1)  # only the user's own test


def test_level_full_adds_slow_groups(qual):
    result = qual.runpytest(*enable("--mystique-level", "full", "-m", "slow"))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*mystique: level full*"])


def test_unavailable_validators_are_skipped_with_the_reason(qual):
    result = qual.runpytest(*enable("-rs", "-k", "not boom", validators="fakepkg.numerics,nosuch,fakepkg.nocontract"))
    result.assert_outcomes(passed=2, failed=1, skipped=3)
    result.stdout.fnmatch_lines(["*validator nosuch is not installed*",
                                 "*validator fakepkg.nocontract lacks the contract*"])


def test_junit_xml_and_report_dir(qual):
    report = qual.path / "rep"
    result = qual.runpytest(*enable("--junitxml", str(qual.path / "j.xml"), "--mystique-report-dir", str(report)))
    result.assert_outcomes(passed=2, failed=2, skipped=1)
    cases = {c.get("name"): c for c in ET.parse(qual.path / "j.xml").getroot().iter("testcase")}
    assert cases["beta"].get("classname") == "mystique.numerics"
    assert "max_rel_err = 0.5" in cases["beta"].find("failure").get("message")
    props = {p.get("name"): p.get("value") for p in cases["alpha"].iter("property")}
    assert props["device"] == "cpu" and props["checks"] == "1"
    df = pd.read_csv(report / "results.csv")
    assert sorted(df["check"]) == ["alpha_error_vs_fp64", "beta_error_vs_fp64", "quiet_check", "validator_error"]
    assert df["run_id"].nunique() == 1
    assert set(df.loc[df["check"] == "validator_error", "status"]) == {"error"}
    result.stdout.fnmatch_lines(["*mystique qualification*", f"results: {report / 'results.csv'}"])
    if (report / "report.html").exists():  # the reports package renders it where present
        result.stdout.fnmatch_lines([f"report:  {report / 'report.html'}"])
    else:
        result.stdout.fnmatch_lines(["report.html not written*"])


def test_report_dir_is_rewritten_on_a_second_run_only_with_force(qual):
    report = qual.path / "rep"
    qual.runpytest(*enable("-k", "alpha", "--mystique-report-dir", str(report)))
    assert len(pd.read_csv(report / "results.csv")) == 1
    (report / "notes.txt").write_text("mine")
    result = qual.runpytest(*enable("-k", "alpha or beta", "--mystique-report-dir", str(report)))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mystique-report-dir*is not empty; pass --mystique-force*"])
    assert len(pd.read_csv(report / "results.csv")) == 1  # untouched
    qual.runpytest(*enable("-k", "alpha or beta", "--mystique-report-dir", str(report), "--mystique-force"))
    assert len(pd.read_csv(report / "results.csv")) == 2
    assert (report / "notes.txt").read_text() == "mine"


def test_an_existing_users_results_csv_is_not_overwritten_without_force(qual):
    report = qual.path / "rep"
    report.mkdir()
    (report / "results.csv").write_text("my own results\n")
    result = qual.runpytest(*enable("-k", "alpha", "--mystique-report-dir", str(report)))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (report / "results.csv").read_text() == "my own results\n"
    assert not (report / "report.html").exists()


def test_an_empty_report_dir_is_accepted_as_qualify_passes_it(qual):
    report = qual.path / "stage"
    report.mkdir()
    result = qual.runpytest(*enable("-k", "alpha", "--mystique-report-dir", str(report),
                                    "--junitxml", str(report / "junit.xml")))
    result.assert_outcomes(passed=1)
    assert len(pd.read_csv(report / "results.csv")) == 1


def test_bad_inject_is_a_usage_error(qual):
    result = qual.runpytest(*enable("--mystique-inject", "bitflip:rate=7"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bitflip: rate=7.0 is not a probability*"])


def test_injected_fault_reaches_the_validator(qual):
    result = qual.runpytest(*enable("--mystique-inject", "wrong_gelu", "-k", "beta"))
    result.stdout.fnmatch_lines(["*mystique: device cpu+wrong_gelu*", "*(device cpu+wrong_gelu)*"])


def test_a_group_with_no_check_row_is_skipped_not_passed(qual):
    """A group whose rows are all measurements (or measurements and skips) checked nothing: JUnit
    must not show it as passed."""
    result = qual.runpytest(*enable("-rs", "--junitxml", str(qual.path / "j.xml"), validators="fakepkg.measures"))
    result.assert_outcomes(passed=2, skipped=2)  # the user's test and mixed
    cases = {c.get("name"): c for c in ET.parse(qual.path / "j.xml").getroot().iter("testcase")}
    assert cases["measure"].find("skipped") is not None and cases["idle"].find("skipped") is not None
    assert cases["mixed"].find("skipped") is None and cases["mixed"].find("failure") is None
    assert cases["measure"].find("skipped").get("message").startswith("only measurements")
    assert "nothing checked" in cases["idle"].find("skipped").get("message")
    result.stdout.fnmatch_lines(["SKIPPED*only measurements*", "SKIPPED*nothing checked*no device to compare with*"])
