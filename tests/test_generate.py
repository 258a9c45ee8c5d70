"""`mystique generate`: benchmark.json + standalone benchmark.py, and the plan transformations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mystique.errors import UsageError
from mystique.replay import executor as ex
from mystique.replay.generate import infer_batch, rescale_batch
from mystique.replay.plan import Plan, build_plan
from mystique.trace import load_trace

DATA = Path(__file__).parent / "data" / "traces"
SECRET = "SecretTowerBlock"


def _capture(path: Path, step) -> Path:
    import os

    from torch.profiler import ExecutionTraceObserver, record_function

    os.environ["ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE"] = "1"
    step(record_function)
    et = ExecutionTraceObserver()
    et.register_callback(str(path))
    et.start()
    with record_function("ProfilerStep#1"):
        step(record_function)
    et.stop()
    et.unregister_callback()
    return path


class Tower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(40, 12)
        self.l1 = torch.nn.Linear(12, 24)
        self.l2 = torch.nn.Linear(24, 5)

    def forward(self, ids, rf):
        with rf(f"## {SECRET} ##"):
            h = self.emb(ids)  # [B, T, 12]
            b, t, d = h.shape
            h = torch.relu(self.l1(h.reshape(b * t, d)))
            return self.l2(h).view(b, t, 5).sum()


@pytest.fixture(scope="module")
def tower_trace(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = Tower()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    ids = torch.randint(0, 40, (6, 7))

    def step(rf):
        opt.zero_grad(set_to_none=True)
        model(ids, rf).backward()
        opt.step()

    return _capture(tmp_path_factory.mktemp("et") / "tower.json", step)


def test_generate_writes_a_plan_and_a_standalone_program_that_runs(tower_trace, tmp_path, cli_run):
    out = tmp_path / "bench"
    code, stdout, _ = cli_run("-q", "generate", str(tower_trace), "-o", str(out))
    assert code == 0 and "written" in stdout
    plan = json.loads((out / "benchmark.json").read_text())
    assert plan["format"] == "mystique-benchmark" and plan["version"] == 1
    src = (out / "benchmark.py").read_text()
    assert "import mystique" not in src and "from mystique" not in src
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for f in ("benchmark.json", "benchmark.py"):
        (moved / f).write_bytes((out / f).read_bytes())
    proc = subprocess.run([sys.executable, str(moved / "benchmark.py"), "--iters", "2", "--warmup", "0"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines if ln.startswith("iteration")] == ["iteration 0", "iteration 1"]
    assert lines[-1].startswith("median:") and lines[-1].endswith(" ms")
    assert "0 skipped" in lines[0]


def test_benchmark_py_reports_bad_plan_and_absent_device(tower_trace, tmp_path, cli_run):
    out = tmp_path / "bench"
    cli_run("-q", "generate", str(tower_trace), "-o", str(out))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p = subprocess.run([sys.executable, str(out / "benchmark.py"), "--plan", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "not a Mystique benchmark plan" in p.stderr
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, str(out / "benchmark.py"), "--device", "cuda"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 3 and "not available" in p.stderr


def test_replay_of_the_generated_benchmark_replays_every_op(tower_trace, tmp_path, cli_run):
    out = tmp_path / "bench"
    cli_run("-q", "generate", str(tower_trace), "-o", str(out))
    code, _, _ = cli_run("-q", "replay", str(out), "-o", str(tmp_path / "r"), "--iters", "2", "--warmup", "0")
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert code == 0 and s["coverage"] == 1.0 and s["ops_skipped"] == {}


def test_batch_rescale_doubles_the_batch_dim_consistently(tower_trace):
    plan = build_plan(load_trace(tower_trace))
    assert infer_batch(plan) == 6
    big = rescale_batch(plan, 2.0)
    assert big.metadata["batch_size"] == 12
    ids_old = [t for t in plan.tensors if t["source"] == "external" and t["dtype"] == "int64"]
    ids_new = [big.tensors[t["id"]] for t in ids_old]
    assert [t["shape"] for t in ids_new] == [[12, 7]]
    reshape = next(op for op in big.ops if op["name"] in ("aten::reshape", "aten::view") and 84 in op["args"][1])
    assert reshape["args"][1] == [84, 12]  # b * t rescaled as a product
    weights = [t for t in plan.tensors if t["source"] == "external" and t["shape"] in ([24, 12], [5, 24])]
    assert all(big.tensors[t["id"]]["shape"] == t["shape"] for t in weights)
    e = ex.Executor(big.data, "cpu")
    e.probe()
    c = e.counts()
    assert c["skipped"] == {} and c["fallbacks"] == 0
    outs = [t for t in big.tensors if t["source"] == "output" and t["shape"] and t["shape"][0] in (84, 12)]
    assert outs  # intermediate results carry the new batch too
    assert e.peak_bytes() > ex.Executor(plan.data, "cpu").peak_bytes()


def test_batch_rescale_refuses_ambiguous_or_unit_batches(tower_trace):
    plan = build_plan(load_trace(tower_trace))
    with pytest.raises(UsageError, match="positive"):
        rescale_batch(plan, -1.0)
    ambiguous = Plan(json.loads(json.dumps(plan.data)))
    w = next(t for t in ambiguous.tensors if t["source"] == "external" and t["shape"] == [24, 12])
    w["shape"] = [24, 6]
    w["strides"] = [6, 1]
    with pytest.raises(UsageError, match="ambiguous"):
        rescale_batch(ambiguous, 2.0)
    gpt = build_plan(load_trace(DATA / "hf_GPT2_trimmed.json.gz"))
    with pytest.raises(UsageError, match="batch size is 1"):
        rescale_batch(gpt, 2.0)


def test_obfuscation_leaves_no_module_names(tower_trace, tmp_path, cli_run):
    plain = tmp_path / "plain"
    cli_run("-q", "generate", str(tower_trace), "-o", str(plain))
    assert SECRET in (plain / "benchmark.json").read_text()  # the scope is kept by default
    out = tmp_path / "obf"
    code, _, _ = cli_run("-q", "generate", str(tower_trace), "-o", str(out), "--obfuscate")
    assert code == 0
    text = (out / "benchmark.json").read_text() + (out / "benchmark.py").read_text()
    for leak in (SECRET, "tower.json", "##"):
        assert leak not in text
    plan = json.loads((out / "benchmark.json").read_text())
    assert {op["name"] for op in plan["ops"]} >= {"aten::embedding", "aten::linear"}


def test_keep_drop_dtype_and_device_transformations(tower_trace, tmp_path, cli_run):
    out = tmp_path / "k"
    assert cli_run("-q", "generate", str(tower_trace), "-o", str(out), "--drop", "^aten::_foreach",
                   "--dtype", "bfloat16", "--device", "cpu")[0] == 0
    plan = json.loads((out / "benchmark.json").read_text())
    assert not any(op["name"].startswith("aten::_foreach") for op in plan["ops"])
    assert {t["dtype"] for t in plan["tensors"]} <= {"bfloat16", "int64", "bool"}
    assert plan["metadata"]["default_device"] == "cpu"
    e = ex.Executor(plan, "cpu")
    e.probe()
    assert e.counts()["skipped"] == {}
    kept = tmp_path / "kk"
    assert cli_run("-q", "generate", str(tower_trace), "-o", str(kept), "--keep", "linear|addmm")[0] == 0
    plan = json.loads((kept / "benchmark.json").read_text())
    assert plan["ops"] and all("linear" in op["name"] or "addmm" in op["name"] for op in plan["ops"])
    assert all(t["source"] in ("external", "output", "derived", "unused") for t in plan["tensors"])
    e = ex.Executor(plan, "cpu")
    e.probe()
    assert e.counts()["skipped"] == {}


@pytest.mark.parametrize("args,code,needle", [
    (["--keep", "("], 2, "not a valid regular expression"),
    (["--drop", "[a-"], 2, "not a valid regular expression"),
    (["--format", "json,xml"], 2, "unknown format"),
    (["--format", ","], 2, "--format names no format"),  # onnx itself: tests/test_generate_onnx.py
    (["--iteration", "99"], 2, "no ProfilerStep#99"),
    (["--batch-scale", "0"], 2, "--batch-scale must be a positive number"),
    (["--keep", "zzz"], 2, "removed every operator"),
])
def test_bad_generate_requests(tower_trace, tmp_path, capsys, args, code, needle):
    from mystique.cli import main

    rc = main(["-q", "generate", str(tower_trace), "-o", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == code and needle in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_generate_refuses_missing_files_and_non_traces(tmp_path, capsys):
    from mystique.cli import main

    assert main(["-q", "generate", str(tmp_path / "nope.json"), "-o", str(tmp_path / "o")]) == 2
    (tmp_path / "x.json").write_text("[1, 2]")
    assert main(["-q", "generate", str(tmp_path / "x.json"), "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.count("mystique: error:") == 2
