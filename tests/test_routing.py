"""Replay with data-dependent routing (issue 34): a capture keeps the group offsets of grouped GEMMs
(tokens per expert, per layer and step) in ``values.json``, the plan pins them into the ops that read
them, the replay gives those ops exactly the recorded values, and ``generate --routing`` transforms
them (uniform, Zipf-skewed) keeping each layer's total."""

from __future__ import annotations

import copy
import json

import pytest

from mystique.replay import pins
from mystique.replay.plan import Plan, plan_from_path
from mystique.replay.plan_check import plan_problem
from mystique.replay.runtime.executor import Executor
from mystique.trace.values import VALUES_FILE, read_values


@pytest.fixture(scope="module")
def moe_capture(tmp_path_factory):
    """A capture folder of one Llama 4 debug training step (grouped expert GEMMs on this CPU)."""
    from mystique.capture import capture

    out = tmp_path_factory.mktemp("moe") / "cap"
    capture("llama4", out, config="debug", mode="train", steps=1, warmup=0)
    return out


@pytest.fixture(scope="module")
def moe_plan(moe_capture):
    """The plan of that capture (built once; tests copy it)."""
    return plan_from_path(moe_capture)[0]


def test_capture_keeps_tokens_per_expert_and_the_plan_pins_them(moe_capture, moe_plan):
    values = read_values(moe_capture)
    offs = [e for inputs in values.values() for e in inputs.values() if len(e["shape"]) == 1 and e["dtype"] == "int32"]
    # debug: 1 MoE layer, 2 grouped GEMMs forward and 4 backward (data and weight gradients)
    assert len(offs) == 6 and all(e["values"][-1] == 32 for e in offs)  # 2 x 16 tokens, top-1
    plan = moe_plan
    routing = [p for p in plan.metadata["pins"] if pins.is_routing(p)]
    assert len(routing) == 6 and plan.metadata["routing"] == "recorded" and not plan_problem(plan.data)
    gm = [op for op in plan.ops if op["name"] == "aten::_grouped_mm"]
    assert {op["args"][2]["t"] for op in gm} == {p["tensor"] for p in routing}  # every offs reads its pin


def test_replay_gives_the_ops_the_recorded_loads_and_the_check_can_fail(moe_plan):
    plan = Plan(copy.deepcopy(moe_plan.data))
    e = Executor(plan.data, "cpu")
    e.run_iteration()
    e.run_iteration()
    s = pins.routing_summary(plan, e)
    assert s["sites"] == 6 and s["replayed_equals_planned"] and s["planned_equals_recorded"]
    site = s["tokens_per_expert"][0]
    assert site["replayed"] == site["recorded"] and sum(site["recorded"]) == 32
    # an op that wrote into a pinned input would change what later ops read: the summary says so
    e._external[next(p["tensor"] for p in plan.metadata["pins"] if pins.is_routing(p))].add_(1)
    bad = pins.routing_summary(plan, e)
    assert not bad["replayed_equals_planned"]
    rows = _routing_rows(s)
    assert rows.loc[rows.check == "replay_routing_reproduced", "status"].tolist() == ["pass"]
    rows = _routing_rows(bad)
    row = rows[rows.check == "replay_routing_reproduced"].iloc[0]
    assert row.status == "fail" and row.value == pytest.approx(5 / 6)


def _routing_rows(routing):
    from mystique.replay.result_rows import routing_rows
    from mystique.results import Results, RunContext

    res = Results(RunContext(device="cpu", device_name="cpu", torch_version="x"), "replay")
    routing_rows(res, routing, "llama4/debug/train")
    return res.frame()


def test_target_loads_keep_the_total_and_follow_the_law():
    assert pins.target_loads(4, 32, "uniform", None) == [8, 8, 8, 8]
    assert pins.target_loads(3, 10, "uniform", None) == [4, 3, 3]
    skew = pins.target_loads(8, 1000, "skewed", 1.0)
    assert sum(skew) == 1000 and skew == sorted(skew, reverse=True) and skew[0] == round(1000 / sum(1 / k for k in range(1, 9)))
    assert pins.parse_routing("skewed:1.5") == ("skewed", 1.5)
    for bad in ("skewed:0", "skewed:-1", "zipf", "skewed:"):
        with pytest.raises(ValueError, match="--routing must be one of"):
            pins.parse_routing(bad)


def test_generate_routing_transform_and_bad_values(moe_capture, tmp_path, cli_run, capsys):
    from mystique.cli import main

    code, _, _ = cli_run("-q", "generate", str(moe_capture), "-o", str(tmp_path / "b"), "--format", "json",
                         "--routing", "uniform")
    assert code == 0
    plan, _ = plan_from_path(tmp_path / "b")
    assert plan.metadata["routing"] == "uniform" and {"routing": "uniform"} in plan.metadata["transforms"]
    storages = {s["id"]: s for s in plan.data["storages"]}
    tensors = {t["id"]: t for t in plan.data["tensors"]}
    for p in plan.metadata["pins"]:
        if pins.is_routing(p):
            assert storages[tensors[p["tensor"]]["storage"]]["recipe"]["values"] == [8, 16, 24, 32]
    for args, needle in ((["--routing", "skewed:x"], "--routing must be one of"), ([], "records no routing")):
        src = moe_capture if args else tmp_path / "plain"
        if not args:
            src.mkdir()
            (src / "trace.json.gz").write_bytes((moe_capture / "trace.json.gz").read_bytes())
            args = ["--routing", "skewed:2"]
        code = main(["-q", "generate", str(src), "-o", str(tmp_path / "x"), *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_values_file_is_untrusted_data(tmp_path):
    good = {"dtype": "int32", "shape": [2], "values": [1, 3]}
    doc = {"format": "mystique-values", "version": 1,
           "nodes": {"7": {"2": good, "3": {"dtype": "int32", "shape": [2], "values": [1]},
                           "4": {"dtype": "float32", "shape": [1], "values": [1]},
                           "x": good}, "y": {"0": good}}}
    (tmp_path / VALUES_FILE).write_text(json.dumps(doc))
    assert read_values(tmp_path) == {7: {2: good}}
    (tmp_path / VALUES_FILE).write_text("{not json")
    assert read_values(tmp_path) == {}
    plan = {"format": "mystique-benchmark", "version": 1, "metadata": {}, "ops": [], "tensors": [],
            "storages": [{"id": 0, "nbytes": 8, "dtype": "int32", "recipe": {"kind": "values", "values": ["a"]}}]}
    assert "recipe" in plan_problem(plan)


def test_doc_lengths_transform_rewrites_the_pinned_document_ids():
    ids = [0] * 5 + [1] * 11
    data = {"metadata": {"pins": [], "transforms": []}, "ops": [],
            "storages": [{"id": k, "recipe": {"kind": "values", "values": ids}} for k in range(3)],
            "tensors": [{"id": 0, "storage": 0, "shape": [1, 16, 1]}, {"id": 1, "storage": 1, "shape": [1, 1, 16]},
                        {"id": 2, "storage": 2, "shape": [16, 1]}]}
    data["metadata"]["pins"] = [{"node_id": 1, "op": "aten::eq", "arg": a, "tensor": t, "recorded": ids}
                                for a, t in (("self", 0), ("other", 1), ("self", 2))]
    plan = Plan(data)
    assert pins.transform_doc_lengths(plan, "uniform:4-4") == 2  # the (16, 1) chunk positions are no documents
    new = [data["storages"][k]["recipe"]["values"] for k in range(3)]
    assert new[0] == new[1] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 and new[2] == ids
    assert pins._runs(new[0], 16) == [[4, 4, 4, 4]]
    for bad in ("uniform:9-3", "longtail:0:1", "zipf"):
        with pytest.raises(ValueError, match="--doc-lengths must be one of"):
            pins.parse_doc_lengths(bad)
