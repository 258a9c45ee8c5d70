"""The validators' one front door: group selection, the error policy, CLI choices and workload names
(validators/groups.py). Every group function is replaced by a fake here: nothing is measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from mystique.validators import correctness, numerics, onnx_runtime, performance, soft_errors
from mystique.validators.soft_errors import runner as soft_runner

from mystique import workloads
from mystique.cli import cli
from mystique.errors import EnvironmentUnsupported, UsageError
from mystique.results import read_csv
from mystique.targets import Target

REPO = Path(__file__).resolve().parents[1]
SUITES = {"numerics": numerics, "soft_errors": soft_errors, "correctness": correctness,
          "performance": performance}
COMMANDS = {"numerics": "numerics", "soft_errors": "soft-errors", "correctness": "correctness",
            "performance": "performance"}


def _fake_all(monkeypatch: pytest.MonkeyPatch, module, ran: list[str], behaviour: dict | None = None) -> None:
    """Replace every group of ``module`` by a fake that records its name and adds one row (or raises
    what ``behaviour`` says for that group)."""
    behaviour = behaviour or {}

    def fake(name: str):
        def run_group(ctx) -> None:
            ran.append(name)
            if name in behaviour:
                raise behaviour[name]
            ctx.res.add("fake_check", name, "value", 1.0, status="pass", threshold=1.0)
        return run_group

    for name in list(module.RUNNERS):
        monkeypatch.setitem(module.RUNNERS, name, fake(name))


@pytest.fixture(params=sorted(SUITES))
def suite(request):
    return request.param


def test_no_group_selection_runs_the_levels_default_groups_in_order(suite, monkeypatch, tmp_path):
    ran: list[str] = []
    _fake_all(monkeypatch, SUITES[suite], ran)
    df = SUITES[suite].run(Target("cpu"), level="quick", groups=None, out_dir=tmp_path)
    assert ran == SUITES[suite].groups("quick")
    assert list(df["subject"]) == ran


def test_an_empty_group_selection_is_a_usage_error_in_every_suite(suite, monkeypatch):
    ran: list[str] = []
    _fake_all(monkeypatch, SUITES[suite], ran)
    for empty in ([], ()):
        with pytest.raises(UsageError, match="no .*group given"):
            SUITES[suite].run(Target("cpu"), groups=empty)
    with pytest.raises(UsageError, match="unknown .*group.*nope"):
        SUITES[suite].run(Target("cpu"), groups=["nope"])
    assert ran == []


def test_a_group_that_raises_becomes_an_error_row_and_the_next_group_runs(suite, monkeypatch, tmp_path):
    module = SUITES[suite]
    first, second, *rest = module.groups("quick")
    ran: list[str] = []
    _fake_all(monkeypatch, module, ran, {first: RuntimeError("boom\nsecond line"),
                                         second: EnvironmentUnsupported("no such device here")})
    df = module.run(Target("cpu"), groups=[first, second, *rest], seed=7, out_dir=tmp_path)
    assert ran == [first, second, *rest]
    err = df[df["check"] == "group_error"].iloc[0]
    assert (err["subject"], err["status"]) == (first, "error")
    assert err["detail"].startswith("RuntimeError: boom (seed=7, level=quick)")
    assert "second line" not in err["detail"]
    skip = df[df["check"] == "group_skipped"].iloc[0]
    assert (skip["subject"], skip["status"]) == (second, "skip") and "no such device here" in skip["detail"]
    assert list(df.loc[df["check"] == "fake_check", "subject"]) == rest


def test_a_usage_error_in_a_group_ends_the_run(suite, monkeypatch, tmp_path):
    module = SUITES[suite]
    ran: list[str] = []
    _fake_all(monkeypatch, module, ran, {module.groups("quick")[0]: UsageError("bad option")})
    with pytest.raises(UsageError, match="bad option"):
        module.run(Target("cpu"), out_dir=tmp_path)
    assert len(ran) == 1


def test_a_group_that_adds_no_row_says_so(monkeypatch):
    monkeypatch.setitem(numerics.RUNNERS, "conversions", lambda ctx: None)
    df = numerics.run(Target("cpu"), groups=["conversions"])
    assert list(zip(df["check"], df["subject"], df["status"])) == [("group_skipped", "conversions", "skip")]
    assert "nothing to check" in df["detail"].iloc[0]


def _group_param(command: str):
    cmd = cli.commands["validate"].commands[command]
    return next(p for p in cmd.params if p.name == "groups")


def test_every_suites_cli_group_choices_are_its_runners_keys(suite):
    assert tuple(_group_param(COMMANDS[suite]).type.choices) == tuple(SUITES[suite].RUNNERS)
    assert set(SUITES[suite].groups("quick")) <= set(SUITES[suite].RUNNERS)
    assert set(SUITES[suite].groups("full")) <= set(SUITES[suite].RUNNERS)


def test_cli_error_row_names_the_command_that_reproduces_it(monkeypatch, tmp_path):
    ran: list[str] = []
    _fake_all(monkeypatch, numerics, ran, {"op_sweep": ValueError("broken sweep")})
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["-q", "validate", "numerics", "-o", str(out), "--group", "op_sweep",
                                   "--group", "repeatability", "--seed", "3"], prog_name="mystique")
    assert res.exit_code == 1, res.output
    df = read_csv(out / "results.csv")
    err = df[df["check"] == "group_error"].iloc[0]
    assert err["subject"] == "op_sweep" and "ValueError: broken sweep" in err["detail"]
    assert "reproduce: mystique validate numerics --seed 3 --group op_sweep --group repeatability -o OUT" \
        in err["detail"]
    assert ran == ["op_sweep", "repeatability"]


def test_cli_refuses_a_group_its_validator_does_not_have(tmp_path):
    res = CliRunner().invoke(cli, ["validate", "performance", "-o", str(tmp_path / "o"),
                                   "--group", "op_sweep"])
    assert res.exit_code == 2 and "op_sweep" in res.output


def test_onnx_a_workload_that_raises_becomes_an_error_row_and_the_next_runs(monkeypatch, tmp_path):
    ran: list[str] = []

    def workload(self, name, *args, **kwargs):
        ran.append(name)
        if name == "llama":
            raise RuntimeError("export exploded")
        self.res.add("onnx_export", name, "export_seconds", 0.0, status="pass", unit="s")

    monkeypatch.setattr(onnx_runtime._Run, "workload", workload)
    df = onnx_runtime.run(Target("cpu"), workloads=("llama", "bert"), out_dir=tmp_path)
    assert ran == ["llama", "bert"]
    err = df[df["check"] == "group_error"].iloc[0]
    assert err["subject"] == "llama" and err["detail"].startswith("RuntimeError: export exploded (seed=0)")
    assert list(df.loc[df["check"] == "onnx_export", "subject"]) == ["bert"]
    with pytest.raises(UsageError, match="no workload or benchmark"):
        onnx_runtime.run(Target("cpu"), workloads=())


def test_workload_defaults_and_choices_are_the_registry():
    reg = workloads.WORKLOADS
    assert reg == workloads.REGISTERED == ("llama", "dlrm", "bert", "llama4")  # every registered one, llama4 too
    assert sorted(workloads.REGISTERED) == workloads.names()
    assert soft_runner.LEVELS["quick"]["workloads"] == soft_runner.LEVELS["full"]["workloads"] == reg
    assert onnx_runtime.run.__kwdefaults__["workloads"] == reg
    onnx_cmd = cli.commands["validate"].commands["onnx"]
    assert tuple(next(p for p in onnx_cmd.params if p.name == "workloads").type.choices) == reg
    for module in (soft_errors, correctness, performance):
        with pytest.raises(UsageError, match="unknown workload.*nope.*expected some of llama, dlrm, bert, llama4"):
            module.run(Target("cpu"), groups=[module.groups("quick")[0]], workloads="nope")


def test_no_source_outside_the_registry_spells_out_the_workload_names():
    """A list of two or more workload names written out (a tuple, a list, a default) drifts from the
    registry when a workload is added: every one is ``mystique.workloads.WORKLOADS``."""
    name = r"""["'](?:llama|dlrm|bert)["']"""
    spelled = re.compile(rf"{name}\s*,\s*{name}")
    found = []
    for folder in ("mystique", "validators", "reports"):
        for path in (REPO / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if spelled.search(line):
                    found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
