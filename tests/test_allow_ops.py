"""Operator allow-list: a trace names the operators a replay calls, so only the namespaces of torch
and of the known workload libraries are called unless the user passes ``--allow-ops PATTERN``.

``mystiquetest::boom`` is registered here with ``torch.library``; its kernel records each call, so
the tests see that a refused op is skipped with the reason and never called."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mystique.replay import runtime as ex
from mystique.replay.classify import match_schema
from mystique.replay.plan import build_plan
from mystique.trace import load_trace

CALLS: list[tuple[int, ...]] = []

_LIB = torch.library.Library("mystiquetest", "DEF")
_LIB.define("boom(Tensor x) -> Tensor")


def _boom(x: torch.Tensor) -> torch.Tensor:
    CALLS.append(tuple(x.shape))
    return x * 2


_LIB.impl("boom", _boom, "CompositeExplicitAutograd")

REFUSED = "namespace 'mystiquetest' not allowed (pass --allow-ops 'mystiquetest::*')"


@pytest.fixture(autouse=True)
def _no_calls():
    CALLS.clear()
    yield
    CALLS.clear()


def _plan() -> dict:
    """x -> aten::add(x, x) -> mystiquetest::boom -> aten::relu, by hand."""
    storages = [{"id": i, "nbytes": 32, "dtype": "float32", "device": "cpu", "external": i == 0,
                 "anchor": None if i == 0 else i, "recipe": {"kind": "randn"}} for i in range(4)]
    tensors = [{"id": i, "storage": i, "offset": 0, "shape": [2, 4], "strides": [4, 1], "dtype": "float32",
                "device": "cpu", "source": "external" if i == 0 else "output"} for i in range(4)]
    ops = []
    for i, (name, overload, args) in enumerate([("aten::add", "Tensor", [{"t": 0}, {"t": 0}]),
                                                ("mystiquetest::boom", "default", [{"t": 1}]),
                                                ("aten::relu", "default", [{"t": 2}])]):
        ops.append({"index": i, "node_id": i + 1, "rf_id": None, "name": name, "op": f"{name}.{overload}",
                    "schema": "", "action": "call", "reason": "", "args": args, "kwargs": {},
                    "outputs": [{"t": i + 1}], "orig_us": None, "scope": ""})
    return {"format": ex.PLAN_FORMAT, "version": ex.PLAN_VERSION, "metadata": {"original_device": "cpu"},
            "storages": storages, "tensors": tensors, "inputs": [0], "ops": ops}


def test_op_refusal_allows_the_default_namespaces_and_matching_patterns():
    for ok in ("aten::addmm.default", "prims::add", "c10d::allreduce_", "_c10d_functional::all_reduce",
               "fbgemm::bounds_check_indices", "torchvision::nms", "quantized::embedding_bag_byte_prepack"):
        assert ex.op_refusal(ok) == "", ok
    assert ex.op_refusal("mystiquetest::boom.default") == REFUSED
    assert ex.op_refusal("evil::rm_rf") == "namespace 'evil' not allowed (pass --allow-ops 'evil::*')"
    for pat in ("mystiquetest::*", "mystiquetest::boom", "mystiquetest::boom.default", "*::boom", "mystique*::b?om"):
        assert ex.op_refusal("mystiquetest::boom.default", [pat]) == "", pat
    assert ex.op_refusal("mystiquetest::boom.default", ["mystiquetest::other", "Mystiquetest::*"]) == REFUSED
    assert ex.op_refusal("not an operator") == ""  # no namespace: resolves to nothing anyway


def test_a_refused_op_is_never_resolved():
    assert ex.resolve_overload("mystiquetest::boom.default") is None
    assert ex.overload_schemas("mystiquetest::boom") == []
    assert ex.resolve_overload("mystiquetest::boom.default", ["mystiquetest::*"]) is torch.ops.mystiquetest.boom.default
    assert ex.overload_schemas("mystiquetest::boom", ["mystiquetest::boom"]) == ["mystiquetest::boom(Tensor x) -> Tensor"]
    assert ex.resolve_overload("aten::relu.default") is torch.ops.aten.relu.default


def test_executor_skips_an_op_of_a_namespace_not_allowed_without_calling_it():
    e = ex.Executor(_plan(), "cpu")
    e.prepare()
    e.run_iteration()
    e.time_iterations(2, 1)
    c = e.counts()
    assert c["skipped"] == {"mystiquetest::boom": 1} and c["reasons"]["mystiquetest::boom"] == REFUSED
    assert c["replayed"] == 2  # the aten ops around it are unaffected
    assert CALLS == []


def test_executor_calls_it_when_allowed():
    e = ex.Executor(_plan(), "cpu", allow_ops=["mystiquetest::*"])
    e.prepare()
    e.run_iteration()
    e.time_iterations(2, 1)
    c = e.counts()
    assert c["skipped"] == {} and c["replayed"] == 3
    assert CALLS and set(CALLS) == {(2, 4)}


def _capture(path: Path) -> Path:
    from test_replay_plan import capture_et

    x = torch.randn(3, 5)

    def step():
        return torch.ops.mystiquetest.boom(torch.add(x, 1)).relu()

    capture_et(path, step, warm=1)
    CALLS.clear()
    return path


@pytest.fixture
def et_file(tmp_path) -> Path:
    return _capture(tmp_path / "boom_et.json")


def _boom_ops(plan) -> list[dict]:
    return [op for op in plan.ops if op["name"] == "mystiquetest::boom"]


def test_plan_of_a_trace_skips_the_op_unless_allowed(et_file):
    tr = load_trace(et_file)
    plan = build_plan(tr)
    (op,) = _boom_ops(plan)
    assert op["action"] == "skip" and op["reason"] == REFUSED
    assert plan.metadata["skipped"]["mystiquetest::boom"] == {"count": 1, "reason": REFUSED}
    assert {o["name"] for o in plan.ops if o["action"] == "call"} >= {"aten::add", "aten::relu"}
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    assert e.counts()["skipped"] == {"mystiquetest::boom": 1} and CALLS == []

    allowed = build_plan(tr, allow_ops=["mystiquetest::*"])
    (op,) = _boom_ops(allowed)
    assert op["action"] == "call" and op["op"] == "mystiquetest::boom.default"
    assert "mystiquetest::boom" not in allowed.metadata["skipped"]
    # the plan allows it, the replay must too: a benchmark cannot allow an op by itself
    e = ex.Executor(allowed.data, "cpu")
    e.probe()
    assert e.counts()["reasons"] == {"mystiquetest::boom": REFUSED} and CALLS == []
    e = ex.Executor(allowed.data, "cpu", allow_ops=["mystiquetest::boom"])
    e.probe()
    assert e.counts()["skipped"] == {} and CALLS == [(3, 5)]


def test_match_schema_refuses_too():
    assert match_schema("mystiquetest::boom", []) is None


def test_cli_replay_counts_the_refused_op_as_skipped_and_allow_ops_runs_it(et_file, tmp_path, cli_run):
    out = tmp_path / "r"
    cli_run("-q", "replay", str(et_file), "-o", str(out), "--iters", "1", "--warmup", "0")
    s = json.loads((out / "summary.json").read_text())
    assert s["ops_skipped"] == {"mystiquetest::boom": 1}
    assert CALLS == []
    out2 = tmp_path / "r2"
    cli_run("-q", "replay", str(et_file), "-o", str(out2), "--iters", "1", "--warmup", "0",
            "--allow-ops", "other::*", "--allow-ops", "mystiquetest::*")
    s = json.loads((out2 / "summary.json").read_text())
    assert s["ops_skipped"] == {}
    assert CALLS


def test_generate_and_standalone_benchmark_apply_the_same_rule(et_file, tmp_path, cli_run, capsys):
    bench = tmp_path / "b"
    code, _, _ = cli_run("-q", "generate", str(et_file), "-o", str(bench), "--allow-ops", "mystiquetest::*")
    assert code == 0
    plan = json.loads((bench / "benchmark.json").read_text())
    assert [op["action"] for op in plan["ops"] if op["name"] == "mystiquetest::boom"] == ["call"]
    assert "--allow-ops" in (bench / "benchmark.py").read_text()
    # benchmark.py's main() is the executor's: refused without --allow-ops, run with it
    assert ex.main(["--plan", str(bench / "benchmark.json"), "--iters", "1", "--warmup", "0"]) == 0
    assert "1 skipped" in capsys.readouterr().out and CALLS == []
    assert ex.main(["--plan", str(bench / "benchmark.json"), "--iters", "1", "--warmup", "0",
                    "--allow-ops", "mystiquetest::*"]) == 0
    assert "0 skipped" in capsys.readouterr().out and CALLS

    plain = tmp_path / "p"
    cli_run("-q", "generate", str(et_file), "-o", str(plain))
    plan = json.loads((plain / "benchmark.json").read_text())
    assert [(op["action"], op["reason"]) for op in plan["ops"] if op["name"] == "mystiquetest::boom"] == [
        ("skip", REFUSED)]
