"""`mystique replay` end to end: inputs it accepts, the files it writes, and bad input."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from mystique.replay.run import OPS_COLUMNS, SUMMARY_KEYS

DATA = Path(__file__).parent / "data" / "traces"


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    """A Mystique trace dir (trace.json.gz, kineto.json.gz, capture.json) of a tiny training step."""
    from mystique.capture import capture

    out = tmp_path_factory.mktemp("cap") / "tiny"
    capture("user_steps:tiny_mlp", out, steps=5, warmup=1)
    return out


def test_replay_of_a_trace_dir_writes_summary_ops_and_results(trace_dir, tmp_path, cli_run):
    out = tmp_path / "r"
    code, stdout, _ = cli_run("-q", "replay", str(trace_dir), "-o", str(out), "--iters", "3", "--warmup", "1")
    assert "ops replayed" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert tuple(summary) == SUMMARY_KEYS
    types = {"ops_total": int, "ops_replayed": int, "ops_skipped": dict, "coverage": float,
             "coverage_by_time": float, "original_step_ms": float, "replay_step_ms": float, "ratio": float}
    for k, t in types.items():
        assert type(summary[k]) is t, (k, summary[k])
    assert summary["ops_skipped"] == {} and summary["coverage"] == 1.0 and summary["coverage_by_time"] == 1.0
    cap = json.loads((trace_dir / "capture.json").read_text())
    assert summary["original_step_ms"] == pytest.approx(cap["step_time"]["median_ms"])
    assert summary["ratio"] == pytest.approx(summary["replay_step_ms"] / summary["original_step_ms"])
    rows = list(csv.DictReader((out / "ops.csv").open()))
    assert list(rows[0]) == OPS_COLUMNS and len(rows) == summary["ops_total"]
    assert all(r["replay_us"] and float(r["replay_us"]) > 0 for r in rows)
    assert sum(1 for r in rows if r["original_us"]) > len(rows) // 2  # Kineto times joined by rf_id
    from mystique.results import read_csv

    df = read_csv(out / "results.csv")
    assert set(df["suite"]) == {"replay"}
    assert set(df["subject"]) == {"user_steps:tiny_mlp"}  # what capture.json says was captured
    checks = dict(zip(df["check"], df["status"]))
    assert checks["replay_coverage"] == "pass"
    assert checks["replay_step_time_ratio"] in ("pass", "fail")
    ratio_row = df[df["check"] == "replay_step_time_ratio"].iloc[0]
    assert ratio_row["value"] == pytest.approx(summary["ratio"])
    assert code == (0 if 0.9 <= summary["ratio"] <= 1.1 else 1)


def test_replay_of_a_raw_et_file_has_no_original_time_and_skips_the_ratio(tmp_path, cli_run):
    out = tmp_path / "r"
    code, _, _ = cli_run("-q", "replay", str(DATA / "resnet_1gpu_trimmed.json.gz"), "-o", str(out), "--iters", "1",
                         "--warmup", "0")
    assert code == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["original_step_ms"] is None and s["ratio"] is None and isinstance(s["replay_step_ms"], float)
    assert s["ops_skipped"].get("c10d::broadcast_") == 2  # collectives: counted, not fatal
    assert s["ops_replayed"] + sum(s["ops_skipped"].values()) == s["ops_total"]
    assert math.isclose(s["coverage"], s["ops_replayed"] / s["ops_total"])
    from mystique.results import read_csv

    df = read_csv(out / "results.csv")
    assert df.set_index("check").loc["replay_step_time_ratio", "status"] == "skip"
    assert set(df["subject"]) == {"resnet_1gpu_trimmed.json.gz"}  # a bare ET file: its name
    assert df.set_index("check").loc["replay_coverage", "status"] == "pass"


def test_collectives_and_unavailable_custom_ops_fail_coverage_only_for_compute_ops(tmp_path, cli_run):
    out = tmp_path / "r"
    code, _, _ = cli_run("-q", "replay", str(DATA / "dlrm_eg_0.json.gz"), "-o", str(out), "--iters", "1",
                         "--warmup", "0")
    s = json.loads((out / "summary.json").read_text())
    assert s["ops_skipped"]["record_param_comms"] == 5
    assert s["ops_skipped"]["fbgemm::bounds_check_indices"] == 1
    from mystique.results import read_csv

    row = read_csv(out / "results.csv").set_index("check").loc["replay_coverage"]
    assert row["status"] == "fail" and "custom op unavailable" in row["detail"]
    assert code == 1


@pytest.mark.parametrize("args,needle", [
    (["/no/such/trace.json"], "does not exist"),
    (["{bad}"], "not a"),
    (["{data}/pt2_et.json", "--iteration", "7"], "no ProfilerStep#7"),
])
def test_bad_inputs_exit_2_with_one_line(args, needle, tmp_path, capsys):
    from mystique.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    args = [a.format(bad=bad, data=DATA) for a in args]
    code = main(["-q", "replay", *args, "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mystique: error:") and needle in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_non_empty_output_needs_force_and_memory_refusal_exits_3(tmp_path, capsys):
    from mystique.cli import main
    from mystique.replay import executor as ex
    from mystique.replay.plan import Plan

    out = tmp_path / "o"
    out.mkdir()
    (out / "x").write_text("keep")
    assert main(["-q", "replay", str(DATA / "pt2_et.json"), "-o", str(out)]) == 2
    plan = {"format": ex.PLAN_FORMAT, "version": 1, "metadata": {"original_device": "cpu"},
            "storages": [{"id": 0, "nbytes": 1 << 50, "dtype": "float32", "device": "cpu", "external": True,
                          "anchor": None, "recipe": {"kind": "randn"}}],
            "tensors": [{"id": 0, "storage": 0, "offset": 0, "shape": [1 << 48], "strides": [1], "dtype": "float32",
                         "device": "cpu", "source": "external"}],
            "inputs": [0],
            "ops": [{"index": 0, "name": "aten::relu", "op": "aten::relu.default", "action": "call", "reason": "",
                     "args": [{"t": 0}], "kwargs": {}, "outputs": [], "orig_us": None}]}
    bench = tmp_path / "b"
    bench.mkdir()
    Plan(plan).save(bench / "benchmark.json")
    capsys.readouterr()
    assert main(["-q", "replay", str(bench), "-o", str(tmp_path / "o2")]) == 3
    assert "GiB" in capsys.readouterr().err
    assert torch.get_num_threads() >= 1


def test_malformed_benchmark_plan_is_bad_input(tmp_path, capsys):
    from mystique.cli import main

    bench = tmp_path / "b"
    bench.mkdir()
    (bench / "benchmark.json").write_text(json.dumps(
        {"format": "mystique-benchmark", "version": 1, "metadata": {}, "storages": [], "ops": [],
         "tensors": [{"id": 0}]}))
    assert main(["-q", "replay", str(bench), "-o", str(tmp_path / "o")]) == 2
    assert "malformed benchmark plan" in capsys.readouterr().err
    (bench / "benchmark.json").write_text(json.dumps({"format": "mystique-benchmark", "version": 7}))
    assert main(["-q", "replay", str(bench), "-o", str(tmp_path / "o")]) == 2
    assert "version 7 is not supported" in capsys.readouterr().err


def test_coverage_by_time_weighs_ops_by_their_original_time_and_ratio_needs_the_same_device():
    from test_replay_executor import PlanMaker, T

    from mystique.replay import executor as ex
    from mystique.replay.plan import Plan
    from mystique.replay.run import summarize

    pm = PlanMaker("cuda:0")
    x = pm.tensor(pm.storage(16), [4])
    y = pm.out([4])
    pm.op("aten::relu", "default", [T(x)], outputs=[T(y)])
    pm.op("c10d::allreduce_", "default", [[T(y)]], outputs=[[T(y)]], action="skip", reason="collective")
    pm.ops[0]["orig_us"], pm.ops[1]["orig_us"] = 10.0, 30.0
    data = pm.plan()
    data["metadata"]["original_step_ms"] = 2.0
    plan = Plan(data)
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    s = summarize(plan, e, [0.001, 0.003, 0.002], "cpu")
    assert s["coverage"] == 0.5 and s["coverage_by_time"] == pytest.approx(0.25)
    assert s["replay_step_ms"] == pytest.approx(2.0) and s["original_step_ms"] == 2.0
    assert s["ratio"] is None  # timed on cuda, replayed on cpu: no ratio
    data["metadata"]["original_device"] = "cpu"
    assert summarize(plan, e, [0.003], "cpu")["ratio"] == pytest.approx(1.5)


def test_benchmark_generated_from_a_trace_dir_keeps_the_original_step_time(trace_dir, tmp_path, cli_run):
    bench = tmp_path / "bench"
    assert cli_run("-q", "generate", str(trace_dir), "-o", str(bench))[0] == 0
    plan = json.loads((bench / "benchmark.json").read_text())
    cap = json.loads((trace_dir / "capture.json").read_text())
    assert plan["metadata"]["original_step_ms"] == pytest.approx(cap["step_time"]["median_ms"])
    assert plan["metadata"]["original_op_times"] is True
    assert sum(1 for op in plan["ops"] if op["orig_us"] is not None) > len(plan["ops"]) // 2
    cli_run("-q", "replay", str(bench / "benchmark.json"), "-o", str(tmp_path / "r"), "--iters", "2", "--warmup", "0")
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["original_step_ms"] == pytest.approx(cap["step_time"]["median_ms"]) and isinstance(s["ratio"], float)
    from mystique.results import read_csv

    assert set(read_csv(tmp_path / "r" / "results.csv")["subject"]) == {"user_steps:tiny_mlp"}
    # an obfuscated benchmark does not name the workload: its rows name the benchmark folder
    hidden = tmp_path / "hidden_bench"
    assert cli_run("-q", "generate", str(trace_dir), "-o", str(hidden), "--obfuscate")[0] == 0
    assert json.loads((hidden / "benchmark.json").read_text())["metadata"]["subject"] is None
    cli_run("-q", "replay", str(hidden), "-o", str(tmp_path / "r2"), "--iters", "1", "--warmup", "0")
    assert set(read_csv(tmp_path / "r2" / "results.csv")["subject"]) == {"hidden_bench"}


def test_subject_names_the_capture_else_the_folder_or_file(tmp_path):
    from mystique.replay.plan import Plan, capture_subject
    from mystique.replay.run import subject_of

    assert capture_subject({"workload": "llama", "config": "small", "mode": "train"}) == "llama/small/train"
    assert capture_subject({"kind": "user", "function": "pkg.mod:step", "config": None}) == "pkg.mod:step"
    assert capture_subject({"target": "pkg.mod:fn"}) == "pkg.mod:fn" and capture_subject(None) is None
    plan = Plan({"metadata": {"subject": None}})
    (tmp_path / "my_trace").mkdir()
    (tmp_path / "bench7").mkdir()
    assert subject_of(plan, tmp_path / "my_trace", "trace") == "my_trace"
    assert subject_of(plan, tmp_path / "my_trace" / "trace.json.gz", "trace") == "my_trace"
    assert subject_of(plan, tmp_path / "bench7" / "benchmark.json", "benchmark") == "bench7"
    assert subject_of(plan, tmp_path / "gpt2_et.json", "trace") == "gpt2_et.json"
    assert subject_of(Plan({"metadata": {"subject": "bert/small/infer"}}), tmp_path / "bench7", "benchmark") \
        == "bert/small/infer"


def test_cpu_replays_use_the_captured_thread_count_capped_at_the_cores_available():
    import os

    from mystique.replay import executor as ex

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cores = len(os.sched_getaffinity(0))
    plan = {"metadata": {"original_threads": 1}}
    assert ex.replay_threads(plan, cpu) == 1
    assert ex.replay_threads({"metadata": {"original_threads": 10_000}}, cpu) == cores
    assert ex.replay_threads(plan, cpu, 3) == 3  # asked for: wins
    assert ex.replay_threads(plan, cpu, 0) is None  # 0: torch's own setting
    assert ex.replay_threads(plan, cuda) is None and ex.replay_threads({"metadata": {}}, cpu) is None


def test_replay_runs_with_the_plan_threads_and_restores_torch_setting(trace_dir, tmp_path, monkeypatch):
    from mystique.replay import executor as ex
    from mystique.replay.run import replay

    seen = []
    real = ex.Executor.time_iterations

    def spy(self, *a, **k):
        seen.append(torch.get_num_threads())
        return real(self, *a, **k)

    monkeypatch.setattr(ex.Executor, "time_iterations", spy)
    before = torch.get_num_threads()
    bench = tmp_path / "b"
    from mystique.replay.generate import generate

    plan = generate(str(trace_dir), str(bench))
    data = json.loads((bench / "benchmark.json").read_text())
    data["metadata"]["original_threads"] = 1
    (bench / "benchmark.json").write_text(json.dumps(data))
    assert plan.metadata["original_threads"] == json.loads((trace_dir / "capture.json").read_text())["threads"]
    _summary, df = replay(bench, tmp_path / "r", iters=2, warmup=0, op_iters=1)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before
    detail = df.set_index("check").loc["replay_step_time", "detail"]
    assert "1 CPU threads (captured with 1)" in detail
