"""Capture: built-in workloads and user step functions into trace dirs (docs/design.md)."""

from __future__ import annotations

import gzip
import json

import pytest

from mystique import results
from mystique.capture import capture


def _et(path):
    with gzip.open(path / "trace.json.gz", "rt") as fh:
        return json.load(fh)


def _op_names(et) -> set[str]:
    return {n["name"] for n in et["nodes"]}


def test_user_step_capture_writes_the_trace_dir(tmp_path):
    out = capture("user_steps:tiny_mlp", tmp_path / "t", steps=3, warmup=1)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["capture.json", "kineto.json.gz",
                                                                             "pacing.json.gz", "results.csv",
                                                                             "trace.json.gz"]
    meta = json.loads((out / "capture.json").read_text())
    assert meta["kind"] == "user" and meta["target"] == "user_steps:tiny_mlp"
    st = meta["step_time"]
    assert st["iterations"] == 3 and st["warmup"] == 1 and st["median_ms"] > 0
    assert st["min_ms"] <= st["median_ms"] <= st["max_ms"]
    et = _et(out)
    names = _op_names(et)
    assert {"aten::addmm", "aten::gelu", "aten::gelu_backward", "aten::mm"} <= names
    assert any(n.startswith("aten::_foreach_") for n in names), "AdamW(foreach) ops must be in the step"
    steps = [n for n in et["nodes"] if n["name"].startswith("ProfilerStep#")]
    assert len(steps) == 1, "exactly one recorded step"
    # Kineto events link to ET nodes by record-function id
    with gzip.open(out / "kineto.json.gz", "rt") as fh:
        kin = json.load(fh)
    kin_rf = {e["args"]["Record function id"] for e in kin["traceEvents"]
              if e.get("cat") == "cpu_op" and "Record function id" in e.get("args", {})}
    et_rf = {a["value"] for n in et["nodes"] for a in n.get("attrs", []) if a["name"] == "rf_id"}
    assert len(kin_rf & et_rf) > 10
    df = results.read_csv(out / "results.csv")
    assert set(df["check"]) == {"uninstrumented_step_time", "original_step_spread", "trace_recorded", "cpu_placement"}
    status = dict(zip(df["check"], df["status"]))
    assert status == {"uninstrumented_step_time": "info", "original_step_spread": "info",
                      "trace_recorded": "pass", "cpu_placement": "info"}  # a time and its spread are measurements
    assert meta["cpu_placement"]["policy"] == "none"  # where the timed steps ran: as launched, by default
    flagged = df.set_index("check").loc["original_step_spread", "detail"].startswith("TOO NOISY")
    assert flagged == st["too_noisy"]  # the row agrees with capture.json
    cmd = "reproduce: mystique capture user_steps:tiny_mlp -o OUT --config debug --mode train --device cpu"
    assert all(cmd in d and d.endswith("--steps 3 --warmup 1 --seed 0") for d in df["detail"])


def test_a_capture_without_the_light_profile_writes_no_pacing_and_still_generates(tmp_path, cli_run):
    out = capture("user_steps:tiny_mlp", tmp_path / "t", steps=1, warmup=0, light=False)
    assert not (out / "pacing.json.gz").exists() and (out / "kineto.json.gz").exists()
    meta = json.loads((out / "capture.json").read_text())
    assert meta["files"]["pacing"] is None and meta["light_reference"] is None
    assert meta["profiler_event_cost"] is None
    rc, _, err = cli_run("-q", "generate", str(out), "-o", str(tmp_path / "b"))
    assert rc == 0, err


def test_correctness_reference_captures_skip_the_light_profile(tmp_path, monkeypatch):
    from validators.correctness import benchmarks

    monkeypatch.setattr(benchmarks, "_MEMO", {})  # (this process's memo would skip the capture)
    benchmarks.references("quick", tmp_path, workloads=("dlrm",), config="debug")
    traces = list(tmp_path.glob("*/trace"))
    assert traces and all((t / "trace.json.gz").exists() and not (t / "pacing.json.gz").exists() for t in traces)


def test_the_captured_step_is_rebuilt_from_what_the_plan_keeps_of_capture_json(tmp_path):
    import torch

    from mystique.capture import rebuild_step
    from mystique.errors import UsageError
    from mystique.replay.plan import capture_original_step, plan_from_path

    out = capture("dlrm", tmp_path / "d", config="debug", mode="infer", steps=1, warmup=0, seed=3)
    meta = json.loads((out / "capture.json").read_text())
    spec = capture_original_step(meta)
    assert spec == {"target": "dlrm", "kind": "workload", "config": "debug", "mode": "infer", "dtype": "float32",
                    "seed": 3, "device": "cpu", "threads": meta["threads"]}
    plan, _ = plan_from_path(out)
    assert plan.metadata["original_step"] == spec
    assert plan.metadata["original_step_span_ms"] > 0  # the Kineto ProfilerStep span
    # the same seed gives the same weights and batch: the rebuilt step computes what the captured one did
    from mystique.workloads import make_step

    ref = make_step("dlrm", "debug", "infer", seed=3).fn()
    got = rebuild_step(spec, "cpu")()
    torch.testing.assert_close(got, ref)
    user_spec = {"target": "user_steps:tiny_mlp", "kind": "user", "config": None, "mode": None, "dtype": None,
                 "seed": 0}
    user = rebuild_step(user_spec, "cpu", "user_steps:tiny_mlp")  # the user names it (replay --original)
    assert isinstance(user(), float)
    # a step that only the plan names is data: never imported
    from mystique.capture import StepNotImported

    with pytest.raises(StepNotImported, match="pass --original user_steps:tiny_mlp"):
        rebuild_step(user_spec, "cpu")
    # a multi-rank capture's step needs its process group: not described for rebuilding
    assert capture_original_step({**meta, "distributed": {"rank": 0}}) is None
    assert capture_original_step(None) is None and capture_original_step({"kind": "user"}) is None
    with pytest.raises(UsageError):
        rebuild_step({"target": "no_such_module_xyz:step", "kind": "user"}, "cpu", "no_such_module_xyz:step")


def test_integral_tensor_ranges_are_recorded(tmp_path):
    out = capture("user_steps:tiny_mlp", tmp_path / "t", steps=1, warmup=0)
    et = _et(out)
    ranges = [a["value"] for n in et["nodes"] for a in n.get("attrs", [])
              if a["name"] == "tensor_range" and a["value"]]
    assert ranges, "ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE must be on"


def test_transformers_model_captures_as_a_user_step(tmp_path):
    pytest.importorskip("transformers")
    out = capture("user_steps:hf_gpt2_train", tmp_path / "t", steps=2, warmup=1)
    names = _op_names(_et(out))
    assert "aten::embedding" in names and "aten::addmm" in names
    assert any("softmax" in n or "scaled_dot_product" in n for n in names)


@pytest.mark.parametrize("workload", ["llama", "dlrm", "bert"])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_builtin_workloads_capture_their_compute_ops(tmp_path, cli_run, workload, mode):
    rc, out, err = cli_run("capture", workload, "-c", "debug", "--mode", mode, "-o", str(tmp_path / "t"),
                           "--steps", "2", "--warmup", "1")
    assert rc == 0, err
    meta = json.loads((tmp_path / "t" / "capture.json").read_text())
    assert meta["workload"] == workload and meta["mode"] == mode and meta["config"] == "debug"
    assert meta["step_time"]["median_ms"] > 0
    names = _op_names(_et(tmp_path / "t"))
    expected = {
        "llama": {"aten::scaled_dot_product_attention", "aten::mm"},
        "dlrm": {"aten::embedding_bag", "aten::bmm", "aten::addmm"},
        "bert": {"aten::native_layer_norm", "aten::gelu", "aten::addmm"},
    }[workload]
    assert expected <= names, expected - names
    if workload == "llama":
        assert {"aten::rsqrt", "aten::mean"} <= names or "aten::rms_norm" in names or "aten::_fused_rms_norm" in names
    if mode == "train":
        assert any(n.startswith("aten::_foreach_") or n in ("aten::add_", "aten::addcmul_") for n in names)
        assert any("backward" in n.lower() for n in names)
    else:
        assert not any("backward" in n.lower() for n in names)


@pytest.mark.parametrize(
    "args, message",
    [
        (["capture", "gpt5", "-o", "{out}"], "unknown capture target"),
        (["capture", "llama", "-c", "huge", "-o", "{out}"], "huge"),
        (["capture", "llama", "--mode", "eval", "-o", "{out}"], "eval"),
        (["capture", "llama", "--device", "tpu9", "-o", "{out}"], "unknown device"),
        (["capture", "no_such_pkg_xyz.mod:fn", "-o", "{out}"], "cannot import"),
        (["capture", "user_steps:missing", "-o", "{out}"], "no callable"),
        (["capture", "user_steps:not_a_step", "-o", "{out}"], "must return a callable"),
        (["capture", "llama", "-o", "/proc/mystique-out"], "cannot write"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, cli_run, args, message):
    out = tmp_path / "out"
    rc, stdout, stderr = cli_run(*[a.replace("{out}", str(out)) for a in args])
    assert rc == 2
    lines = [ln for ln in stderr.splitlines() if ln.startswith(("mystique: error", "Error", "Usage"))]
    assert any(message in ln for ln in stderr.splitlines()), stderr
    assert "Traceback" not in stderr
    assert lines
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_too_large_config_exits_3_naming_memory(tmp_path, cli_run):
    rc, _, stderr = cli_run("capture", "llama", "-c", "llama3-405b", "-o", str(tmp_path / "o"))
    assert rc == 3
    assert "mystique: error:" in stderr and "B" in stderr.split("error:")[1]
    assert not (tmp_path / "o").exists()


def test_existing_output_is_kept_without_force(tmp_path, cli_run):
    out = tmp_path / "o"
    out.mkdir()
    (out / "trace.json.gz").write_text("user's own")
    rc, _, stderr = cli_run("capture", "user_steps:tiny_mlp", "-o", str(out))
    assert rc == 2 and "--force" in stderr
    assert (out / "trace.json.gz").read_text() == "user's own"


def test_a_step_time_too_noisy_to_be_a_reference_is_flagged(tmp_path, monkeypatch):
    """Issue 19.6: an original step time whose IQR is over 10% of its median is no reference."""
    import mystique.capture as cap

    times = iter([1.0, 1.0, 1.5, 1.0, 2.0, 1.0] * 10)
    clock = [0.0]

    def fake_counter():
        return clock[0]

    def step():
        clock[0] += next(times) / 1e3

    monkeypatch.setattr(cap.time, "perf_counter", fake_counter)

    class T:
        def synchronize(self):
            pass

    noisy = cap.time_step(step, T(), warmup=0, iters=6)
    assert noisy["too_noisy"] is True and noisy["spread"] > cap.STEP_SPREAD_MAX == 0.10
    assert "over 10%" in noisy["reason"] and "±10% band" in noisy["reason"]
    quiet = cap.step_spread(10.0, 0.5, 5)
    assert quiet["too_noisy"] is False and quiet["spread"] == 0.05
    assert cap.step_spread(10.0, 1.0, 5)["too_noisy"] is False  # at the limit: still a reference
    monkeypatch.undo()
    real = cap.time_step
    monkeypatch.setattr(cap, "time_step", lambda *a, **k: {**real(*a, **k), **cap.step_spread(1.0, 0.5, 3)})
    out = capture("user_steps:tiny_mlp", tmp_path / "t", steps=3, warmup=0)
    meta = json.loads((out / "capture.json").read_text())
    assert meta["step_time"]["too_noisy"] is True and "over 10%" in meta["step_time"]["reason"]
    row = results.read_csv(out / "results.csv").set_index("check").loc["original_step_spread"]
    assert row["status"] == "info" and row["threshold"] == 0.10 and row["value"] == 0.5
    assert row["detail"].startswith("TOO NOISY to be a reference") and "at most 10%" in row["detail"]
