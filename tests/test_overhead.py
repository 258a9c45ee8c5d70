"""`mystique overhead`: the executor's per-op dispatch cost against eager PyTorch, and the plan
facts it relies on (host gaps recorded per op, autograd recorded only where a node was made).

No timing outcome is asserted (timed unit tests are not used): the rows' structure and the exit
code that follows the row's verdict."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from mystique.replay import overhead as ov
from mystique.replay import runtime as ex


def test_overhead_command_writes_the_ratio_row_and_exits_per_its_verdict(cli_run, tmp_path):
    out = tmp_path / "ov"
    code, stdout, _err = cli_run("-q", "overhead", "-o", str(out), "--ops", "12", "--steps", "add,mix",
                                 "--time-cap", "0.05", "--half-width", "0.5")
    df = pd.read_csv(out / "results.csv")
    rows = df[(df["check"] == "dispatch_overhead_ratio") & (df["metric"] == "ratio")]
    assert list(rows["subject"]) == ["add x12", "mix x12"]
    assert set(rows["status"]) <= {"pass", "fail", "inconclusive"}
    assert (rows["threshold"] == 1.0).all() and (rows["value"] > 0).all() and (rows["suite"] == "replay").all()
    for subject in rows["subject"]:
        sub = df[df["subject"] == subject]
        lo = float(sub[sub["metric"] == "ratio_low"]["value"].iloc[0])
        hi = float(sub[sub["metric"] == "ratio_high"]["value"].iloc[0])
        r = float(sub[sub["metric"] == "ratio"]["value"].iloc[0])
        assert lo <= r <= hi
        status = sub[sub["metric"] == "ratio"]["status"].iloc[0]
        assert status == ("pass" if hi <= 1.0 else "fail" if lo > 1.0 else "inconclusive")
        assert set(sub[sub["metric"] != "ratio"]["status"]) == {"info"}
        assert {"replay_time_per_op", "eager_time_per_op"} <= set(sub["check"])
    statuses = set(rows["status"])  # this host's verdicts: the exit code follows them (4: only undecided)
    assert code == (0 if statuses == {"pass"} else 1 if "fail" in statuses else 4)
    stats = json.loads((out / "overhead.json").read_text())
    assert set(stats) == {"add x12", "mix x12"}
    for s in stats.values():
        assert s["pacing"] == "none" and s["rounds"] == len(s["a_ms"]) == len(s["b_ms"]) >= 6
        assert s["replayed"] == s["ops"] == 12
    assert "replay/eager" in stdout


def test_overhead_command_refuses_an_unknown_step(cli_run, tmp_path):
    code, _out, err = cli_run("overhead", "-o", str(tmp_path / "ov"), "--steps", "add,bogus")
    assert code == 2 and "unknown step 'bogus'" in err
    assert not (tmp_path / "ov").exists()


def test_small_steps_have_the_requested_number_of_top_level_ops(tmp_path):
    for kind in ("add", "mix"):
        step = ov.small_ops_step(kind, 13)
        step()
        plan = ov.plan_of_step(step, "cpu", tmp_path / kind)
        assert len(plan.ops) == 13
        names = {op["name"] for op in plan.ops}
        assert names == ({"aten::add"} if kind == "add" else {"aten::add", "aten::mul", "aten::view", "aten::linear"})


def test_plan_records_host_gaps_and_autograd_only_where_a_node_was_made(tmp_path):
    w = torch.randn(4, requires_grad=True)
    a, b = torch.randn(4), torch.randn(4)

    def step():
        x = a
        for _ in range(5):
            x = torch.add(x, b)  # grad mode on, nothing requires grad: no autograd node
        y = torch.mul(x, w)  # makes a MulBackward node
        return torch.add(y, b)

    plan = ov.plan_of_step(step, "cpu", tmp_path / "cap")
    ops = plan.ops
    assert [op["name"] for op in ops] == ["aten::add"] * 5 + ["aten::mul", "aten::add"]
    assert [op["grad"] for op in ops[:6]] == [False] * 5 + [True]
    assert ops[0]["gap_us"] is None  # no previous op
    assert all(isinstance(op["gap_us"], float) and op["gap_us"] >= 0 for op in ops[1:])
    e = ex.Executor(plan.data, "cpu", pacing="recorded")
    assert e.paced_ops == sum(1 for op in ops if op["gap_us"]) and e.pacing_gap_us == pytest.approx(
        sum(op["gap_us"] or 0 for op in ops))
    e.probe()
    e.run_iteration()
    assert all(st.state == "replayed" for st in e.status)
