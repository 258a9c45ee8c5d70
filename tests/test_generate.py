"""`mystique generate`: benchmark.json + standalone benchmark.py, and the plan transformations."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mystique.errors import UsageError
from mystique.replay import runtime as ex
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


def test_the_runtime_concatenates_into_one_module_without_clashing_names():
    """benchmark.py is hostinfo + the runtime's modules in one namespace: every module of the package is
    in it, in dependency order, and no top-level name is defined by two of them (a later definition
    would silently replace an earlier one)."""
    import ast

    from mystique.replay.generate import runtime_source

    folder = Path(ex.__file__).parent
    assert sorted(ex.MODULES) == sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    seen: dict[str, str] = {}
    for module in ex.MODULES:
        for node in ast.parse((folder / f"{module}.py").read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                assert ex.MODULES.index(node.module) < ex.MODULES.index(module), (module, node.module)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                assert seen.setdefault(node.name, module) == module, (node.name, module, seen[node.name])
    tree = ast.parse(runtime_source())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.level or "mystique" in (n.module or ""))]


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
    # the trace's op count before the filter stays, for coverage against the original (issue 19.1)
    meta = plan["metadata"]
    assert meta["original_ops_total"] > meta["ops_total"] == len(plan["ops"])
    assert meta["transforms"] == [{"filter": {"keep": "linear|addmm", "drop": None,
                                              "ops_before": meta["original_ops_total"], "ops_after": len(plan["ops"])}}]
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


# --- issue 19: strings from a trace are data, never code; bad tensors never reach a benchmark ------

HOSTILE = ['a\nimport os; os.system("echo pwned")\n#', 'q"uote\'s', 'x"""y', "back\\slash\\", "cr\rlf\r\n",
           "sep\u2028par\u2029", "nul\x00", "tab\tff\x0c", '\'\'\'; raise SystemExit(9) #']


def _standard_program() -> str:
    import ast

    from mystique.replay.generate import benchmark_py

    return ast.dump(ast.parse(benchmark_py(Plan({"metadata": {"source": "trace.json"}, "ops": []}))))


@pytest.mark.parametrize("name", [h for h in HOSTILE if "\x00" not in h])
def test_a_hostile_trace_file_name_cannot_inject_code_into_benchmark_py(tower_trace, tmp_path, cli_run, name):
    import ast

    src_path = tmp_path / f"{name}.json"
    src_path.write_bytes(tower_trace.read_bytes())
    out = tmp_path / "bench"
    code, _, err = cli_run("-q", "generate", str(src_path), "-o", str(out))
    assert code == 0, err
    src = (out / "benchmark.py").read_text(encoding="utf-8")
    compile(src, "benchmark.py", "exec")
    assert ast.dump(ast.parse(src)) == _standard_program()  # the same program, whatever the name
    assert "pwned" not in src.split("\n", 4)[3] or src.split("\n", 4)[3].startswith("# Generated from '")
    assert json.loads((out / "benchmark.json").read_text())["metadata"]["source"] == f"{name}.json"


def test_hostile_strings_inside_a_trace_stay_data(tower_trace, tmp_path, cli_run):
    """Node names, scopes, schemas and string arguments with newlines, quotes, triple quotes and
    backslashes: benchmark.py is still the standard program, and benchmark.json holds them verbatim."""
    import ast

    doc = json.loads(tower_trace.read_text())
    for i, node in enumerate(doc["nodes"]):
        if node["name"].startswith("## "):
            node["name"] = "## " + "".join(HOSTILE) + " ##"
        elif not node["name"].startswith(("aten::", "[pytorch", "ProfilerStep")):
            node["name"] = HOSTILE[i % len(HOSTILE)]
    doc["extra"] = HOSTILE
    src_path = tmp_path / 'tr"""ace\n.json'
    src_path.write_text(json.dumps(doc))
    out = tmp_path / "bench"
    code, _, err = cli_run("-q", "generate", str(src_path), "-o", str(out))
    assert code == 0, err
    src = (out / "benchmark.py").read_text(encoding="utf-8")
    assert ast.dump(ast.parse(src)) == _standard_program()
    plan = json.loads((out / "benchmark.json").read_text())
    assert any("".join(HOSTILE) in op["scope"] for op in plan["ops"])


@pytest.mark.parametrize("field, value, needle", [
    ("shape", [-3, 12], "expected non-negative 64-bit integers"),
    ("shape", [2**64, 1], "expected non-negative 64-bit integers"),
    ("offset", -5, "offset is -5"),
    ("numel", -1, "numel is -1"),
    ("itemsize", 4096, "itemsize is 4096 bytes"),
    ("strides", [-1, 1], "expected non-negative 64-bit integers"),
])
def test_negative_sizes_and_offsets_are_refused_not_written_into_a_benchmark(tower_trace, tmp_path, capsys,
                                                                             field, value, needle):
    from mystique.cli import main

    doc = json.loads(tower_trace.read_text())
    node = next(n for n in doc["nodes"] if n["name"] == "aten::linear")
    ins = node["inputs"]
    k = next(i for i, t in enumerate(ins["types"]) if t.startswith("Tensor("))
    if field in ("shape", "strides"):
        ins["shapes" if field == "shape" else "strides"][k] = value
    else:
        ins["values"][k][{"offset": 2, "numel": 3, "itemsize": 4}[field]] = value
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(doc))
    rc = main(["-q", "generate", str(p), "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err and "internal error" not in err, err
    assert not (tmp_path / "o").exists()


class Bags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="sum")
        self.out = torch.nn.Linear(8, 1)

    def forward(self, labels, idx, offsets):  # B bags of a flat index list, and B labels
        return (self.out(self.bag(idx, offsets)) * self.bag.weight[labels, :1]).sum()


def test_batch_rescale_of_embedding_bags_rescales_their_offsets(tmp_path, cli_run):
    """Found by the fuzz campaign: every --batch-scale of a plan with an embedding bag failed with
    "internal error: KeyError: 'total'" (the offsets recipe holds per-view segments)."""
    torch.manual_seed(0)
    model = Bags()
    labels = torch.randint(0, 50, (6,))
    idx = torch.randint(0, 50, (6 * 3,))
    offsets = torch.arange(0, 18, 3)

    def step(rf):
        model.zero_grad(set_to_none=True)
        model(labels, idx, offsets).backward()

    trace = _capture(tmp_path / "bags.json", step)
    out = tmp_path / "big"
    code, _, err = cli_run("-q", "generate", str(trace), "-o", str(out), "--batch-scale", "2")
    assert code == 0, err
    plan = json.loads((out / "benchmark.json").read_text())
    assert plan["metadata"]["batch_size"] == 12
    recipes = [s["recipe"] for s in plan["storages"] if (s.get("recipe") or {}).get("kind") == "offsets"]
    bag = next(op for op in plan["ops"] if op["name"] == "aten::embedding_bag")
    n_idx = math.prod(plan["tensors"][bag["args"][1]["t"]]["shape"])
    assert recipes and all(seg[1] == 12 and seg[3] == n_idx for r in recipes for seg in r["segments"])
    e = ex.Executor(plan, "cpu")
    e.probe()
    assert e.counts()["skipped"] == {}


@pytest.mark.parametrize("device", ["cuda:-1", "npu:0", "CUDA:0", "cuda:0\n", ""])
def test_tensor_device_strings_torch_cannot_parse_do_not_break_generate(tower_trace, tmp_path, cli_run, device):
    """Found by the fuzz campaign: a tensor recorded on ``cuda:-1`` became the plan's original device and
    generate failed with "internal error: RuntimeError: Invalid device string"."""
    doc = json.loads(tower_trace.read_text())
    for node in doc["nodes"]:
        for t in node["inputs"]["values"] + node["outputs"]["values"]:
            if isinstance(t, list) and len(t) == 6 and isinstance(t[5], str):
                t[5] = device
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(doc))
    code, _, err = cli_run("-q", "generate", str(p), "-o", str(tmp_path / "o"))
    assert code == 0, err
    plan = json.loads((tmp_path / "o" / "benchmark.json").read_text())
    assert plan["metadata"]["original_device"] == "cpu"
    e = ex.Executor(plan, "cpu")
    e.probe()
    assert e.counts()["skipped"] == {}


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"step_time": {"median_ms": ' + "9" * 5000 + "}}",
                                  "\xff\xfe not json", '{"threads": [' + "[" * 990 + "]" * 990 + "]}"])
def test_a_broken_capture_json_beside_a_trace_is_ignored(tower_trace, tmp_path, cli_run, text):
    """Found by the fuzz campaign: a deeply nested capture.json beside the trace ended generate with
    "internal error: RecursionError" (read_capture caught only JSONDecodeError)."""
    folder = tmp_path / "tdir"
    folder.mkdir()
    (folder / "trace.json").write_bytes(tower_trace.read_bytes())
    (folder / "capture.json").write_bytes(text.encode("latin-1"))
    code, _, err = cli_run("-q", "generate", str(folder), "-o", str(tmp_path / "o"))
    assert code == 0, err


def _mutate(plan: dict, path: tuple, value) -> dict:
    doc = json.loads(json.dumps(plan))
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value", [
    (("tensors", 0, "id"), 2**62),  # the executor sized an array by it (MemoryError)
    (("tensors", 1, "shape"), [1, 2**62]),  # overflowed torch's size arithmetic
    (("tensors", 1, "strides"), [2**62, 1]),
    (("tensors", 1, "shape"), [-1, 3]),
    (("tensors", 1, "dtype"), 7),
    (("tensors", 1, "source"), 1.5),
    (("tensors", 1, "storage"), 10**6),
    (("storages", 0, "nbytes"), 2**70),  # OverflowError: cannot fit 'int' into an index-sized integer
    (("storages", 0, "recipe"), 3),
    (("ops", 0, "op"), 3),  # AttributeError: 'int' object has no attribute 'split'
    (("ops", 0, "kwargs"), 2.5),
    (("ops", 0, "args"), [{"t": 10**9}]),
    (("ops", 0, "args"), [{"what": 1}]),
    (("ops", 0, "action"), "run"),
    (("ops",), {"0": 1}),
])
def test_a_malformed_benchmark_is_refused_in_one_line(tower_trace, tmp_path, capsys, path, value):
    """Found probing ``replay`` with mutated benchmark.json files: most of these ended in "internal error"
    (exit 1: MemoryError, size overflows, AttributeError), others in a message naming a Python exception, or
    ran on; ``Plan.load`` now checks the plan's structure and names the field (exit 2)."""
    from mystique.cli import main

    plan = build_plan(load_trace(tower_trace)).data
    bench = tmp_path / "b"
    bench.mkdir()
    (bench / "benchmark.json").write_text(json.dumps(_mutate(plan, path, value)))
    rc = main(["-q", "replay", str(bench), "-o", str(tmp_path / "r"), "--iters", "1", "--warmup", "0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("mystique: error: ") and err.count("\n") == 1 and "malformed benchmark plan" in err, err
    assert not (tmp_path / "r").exists()


def test_every_generated_plan_passes_the_load_checks(tower_trace, tmp_path):
    from mystique.replay.generate import retarget_dtype
    from mystique.replay.plan import plan_problem

    plan = build_plan(load_trace(tower_trace))
    assert plan_problem(plan.data) == ""
    assert plan_problem(rescale_batch(plan.copy(), 2.0).data) == ""
    assert plan_problem(retarget_dtype(plan.copy(), "bfloat16").data) == ""
    for f in DATA.iterdir():
        if f.name.endswith((".json", ".json.gz")):
            assert plan_problem(build_plan(load_trace(f)).data) == "", f.name
