"""An untrusted trace stays data: plans (benchmark.json), traces and capture folders never import
code, open files or run operators outside the replay's operator policy.

The policy (mystique.replay.runtime.policy) is derived from torch's operator schemas; the first test
enumerates every schema this torch registers and shows what each rule refuses. Each hostile plan
below names a real target (a file, the process's generator, stdout) and the tests check that the
refusal is one line naming the operator, exit 2, and that the target was never touched."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from mystique.errors import UsageError
from mystique.replay import runtime as ex
from mystique.replay.generate import benchmark_py
from mystique.replay.plan import Plan, build_plan
from mystique.replay.runtime.policy import POLICY_RULES, schema_refusal
from mystique.trace import load_trace

# ------------------------------------------------------------------------------------------------
# the policy over torch's schemas


def _qualified(s) -> str:
    return s.name + (f".{s.overload_name}" if s.overload_name else ".default")


def _caught_by_rule() -> dict[str, set[str]]:
    caught: dict[str, set[str]] = defaultdict(set)
    for s in torch._C._jit_get_all_schemas():
        for name, rule in POLICY_RULES:
            if rule(s):
                caught[name].add(_qualified(s))
    return caught


# ordinary operators of the reference workloads (llama, dlrm, bert) and of the test traces
ORDINARY = (
    "aten::mm.default", "aten::addmm.default", "aten::bmm.default", "aten::linear.default",
    "aten::embedding.default", "aten::embedding_bag.padding_idx", "aten::_embedding_bag.default",
    "aten::layer_norm.default", "aten::native_layer_norm.default", "aten::softmax.int", "aten::_softmax.default",
    "aten::copy_.default", "aten::fill_.Scalar", "aten::empty.memory_format", "aten::empty_strided.default",
    "aten::normal_.default", "aten::uniform_.default", "aten::bernoulli_.float", "aten::native_dropout.default",
    "aten::scaled_dot_product_attention.default", "aten::_foreach_add_.List", "aten::index_put_.default",
    "aten::_local_scalar_dense.default", "aten::promote_types.default", "aten::set_.source_Tensor",
    "aten::record_stream.default", "aten::to.dtype", "aten::add.Tensor",
)


def test_every_torch_schema_is_judged_by_the_rules_and_ordinary_ops_stay_allowed(capsys):
    caught = _caught_by_rule()
    assert {"aten::from_file.default", "aten::from_file.out", "aten::save.default"} <= caught["file"]
    assert {"aten::from_file.default", "aten::from_file.out"} <= caught["shared_memory"]
    assert {"aten::manual_seed.default", "aten::manual_seed.generator", "aten::seed.default",
            "aten::set_grad_enabled.default", "aten::_cufft_set_plan_cache_max_size.default"} <= caught["process_state"]
    assert {"aten::_print.default", "aten::warn.default", "aten::_set_item.str", "aten::format.default",
            "aten::Generator.default"} <= caught["no_tensor"]
    refused = set().union(*caught.values())
    assert not refused & set(ORDINARY), sorted(refused & set(ORDINARY))
    aten = {_qualified(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")}
    assert len(refused & aten) < len(aten) / 10  # the rules catch a few, not the operator set
    with capsys.disabled():  # what each rule refuses in this torch, for the record
        total = len(torch._C._jit_get_all_schemas())
        print(f"\n{total} schemas in torch {torch.__version__}; refused: {len(refused)}; "
              + ", ".join(f"{k}: {len(v)}" for k, v in caught.items()))


@pytest.mark.parametrize("schema, rule", [
    ("mylib::save_to(Tensor t, str path) -> ()", "file"),
    ("mylib::dump(Tensor t, str? f=None) -> Tensor", "file"),
    ("mylib::read_filename(Tensor t) -> Tensor", "file"),
    ("mylib::_share_memory_(Tensor(a!) self) -> Tensor(a!)", "shared_memory"),
    ("mylib::open_shm(Tensor t, int shm) -> Tensor", "shared_memory"),
    ("mylib::set_num_threads(int n) -> ()", "process_state"),
    ("mylib::set_deterministic(Tensor t, bool b) -> ()", "process_state"),
    ("mylib::reseed(Tensor t, Generator(a!) g) -> Tensor", "process_state"),
    ("mylib::hello(str s) -> str", "no_tensor"),
])
def test_each_rule_reads_the_schema_not_a_list_of_names(schema, rule):
    parsed = torch._C._jit_get_all_schemas()[0].__class__  # torch.FunctionSchema
    s = torch._C.parse_schema(schema)
    assert isinstance(s, parsed)
    assert [name for name, r in POLICY_RULES if r(s)][0] == rule
    assert schema_refusal(schema)
    # the same shapes without what makes them hostile are allowed
    assert schema_refusal("mylib::scale(Tensor t, str mode, Generator? generator=None) -> Tensor") == ""
    assert schema_refusal("mylib::set_rows_(Tensor(a!) self, Tensor src) -> Tensor(a!)") == ""
    assert schema_refusal("mylib::widen(ScalarType a, ScalarType b) -> ScalarType") == ""


@pytest.mark.parametrize("workload", ["llama", "dlrm", "bert"])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_the_reference_workloads_traces_build_and_their_ops_are_allowed(workload, mode, tmp_path):
    from mystique.workloads import make_step
    from test_replay_plan import capture_et

    step = make_step(workload, "debug", mode, seed=0)
    plan = build_plan(load_trace(capture_et(tmp_path / "et.json", step.fn)))  # UsageError if refused
    called = {op["op"] for op in plan.ops if op["action"] == "call"}
    assert called and not [q for q in called if ex.policy_refusal(q)]


def test_the_test_traces_build_under_the_policy():
    for p in sorted((Path(__file__).parent / "data" / "traces").glob("*.json*")):
        build_plan(load_trace(p))  # a refused operator would raise UsageError


# ------------------------------------------------------------------------------------------------
# hostile plans and traces


def _plan(ops: list[tuple[str, list, dict]], tensors: int = 1, dtype: str = "uint8", numel: int = 8,
          metadata: dict | None = None) -> dict:
    """A plan calling ``ops`` (qualified name, args, kwargs); tensor i is op i's output."""
    storages = [{"id": i, "nbytes": numel, "dtype": dtype, "device": "cpu", "external": False, "anchor": i,
                 "recipe": None} for i in range(tensors)]
    ts = [{"id": i, "storage": i, "offset": 0, "shape": [numel], "strides": [1], "dtype": dtype, "device": "cpu",
           "source": "output"} for i in range(tensors)]
    out = []
    for i, (op, args, kwargs) in enumerate(ops):
        out.append({"index": i, "node_id": i + 1, "rf_id": None, "name": op.rsplit(".", 1)[0], "op": op,
                    "schema": "", "action": "call", "reason": "", "args": args, "kwargs": kwargs,
                    "outputs": [{"t": min(i, tensors - 1)}], "orig_us": None, "scope": ""})
    return {"format": ex.PLAN_FORMAT, "version": ex.PLAN_VERSION,
            "metadata": {"original_device": "cpu", **(metadata or {})},
            "storages": storages, "tensors": ts, "inputs": [], "ops": out}


def _from_file_plan(victim: Path) -> dict:
    """aten::from_file(victim, shared=True, 8) then fill_(65): writes 8 bytes into ``victim``."""
    return _plan([("aten::from_file.default", [str(victim), True, 8], {"dtype": {"dtype": "uint8"}}),
                  ("aten::fill_.Scalar", [{"t": 0}, 65], {})])


def _bench(folder: Path, plan: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchmark.json").write_text(json.dumps(plan))
    return folder


def _one_line_refusal(err: str, op: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("mystique: error:")]
    assert len(lines) == 1 and op in lines[0] and "refused" in lines[0], err
    assert "Traceback" not in err


def test_the_from_file_plan_really_writes_when_allowed_explicitly(tmp_path):
    """The attack is real: only --allow-ops (the user's explicit choice) lets the plan write."""
    victim = tmp_path / "victim"
    with pytest.raises(ex.RefusedOperator, match=r"aten::from_file\.default refused: it takes a file name"):
        ex.Executor(_from_file_plan(victim), "cpu")
    assert not victim.exists()
    e = ex.Executor(_from_file_plan(victim), "cpu", allow_ops=["aten::from_file"])
    e.prepare()
    e.run_iteration()
    assert victim.read_bytes() == b"A" * 8


@pytest.mark.parametrize("command", [["replay"], ["generate"], ["export-onnx"],
                                     ["validate", "correctness", "--emulate", "cuda", "--benchmark"]])
def test_a_from_file_plan_exits_2_naming_the_op_and_writes_nothing(tmp_path, cli_run, command):
    victim = tmp_path / "victim"
    bench = _bench(tmp_path / "b", _from_file_plan(victim))
    code, _, err = cli_run("-q", *command, str(bench), "-o", str(tmp_path / "out"))
    assert code == 2
    _one_line_refusal(err, "aten::from_file.default")
    assert "--allow-ops 'aten::from_file'" in err
    assert not victim.exists() and not (tmp_path / "out").exists()


def test_the_standalone_benchmark_py_refuses_a_from_file_plan(tmp_path):
    victim = tmp_path / "victim"
    bench = _bench(tmp_path / "b", _from_file_plan(victim))
    benign = Plan(_plan([("aten::fill_.Scalar", [{"t": 0}, 1], {})]))
    (bench / "benchmark.py").write_text(benchmark_py(benign))
    p = subprocess.run([sys.executable, str(bench / "benchmark.py"), "--iters", "1", "--warmup", "0"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "aten::from_file.default refused" in err[0] and "Traceback" not in p.stderr
    assert not victim.exists()


def test_a_process_state_op_is_refused_and_the_generator_is_untouched(tmp_path, cli_run):
    torch.manual_seed(99)
    state = torch.get_rng_state()
    bench = _bench(tmp_path / "b", _plan([("aten::manual_seed.default", [1234], {}),
                                          ("aten::fill_.Scalar", [{"t": 0}, 1], {})]))
    code, _, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "out"))
    assert code == 2
    _one_line_refusal(err, "aten::manual_seed.default")
    assert "sets process-wide state" in err
    assert torch.equal(torch.get_rng_state(), state) and not (tmp_path / "out").exists()


def test_an_op_without_tensor_semantics_is_refused_and_prints_nothing(tmp_path, cli_run, capfd):
    bench = _bench(tmp_path / "b", _plan([("aten::_print.default", ["HOSTILE-PLAN-WAS-HERE"], {})]))
    code, out, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "out"))
    assert code == 2
    _one_line_refusal(err, "aten::_print.default")
    assert "no tensor semantics" in err
    assert "HOSTILE-PLAN-WAS-HERE" not in out + capfd.readouterr().out


def test_a_save_plan_is_refused_and_no_file_is_written(tmp_path, cli_run):
    victim = tmp_path / "saved.pt"
    bench = _bench(tmp_path / "b", _plan([("aten::fill_.Scalar", [{"t": 0}, 1], {}),
                                          ("aten::save.default", [{"t": 0}, str(victim)], {})]))
    code, _, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "out"))
    assert code == 2
    _one_line_refusal(err, "aten::save.default")
    assert not victim.exists()


def test_allow_ops_widens_the_policy_explicitly(tmp_path):
    plan = _plan([("aten::_print.default", ["x"], {})])
    assert ex.plan_refusal(plan["ops"]).startswith("op 0: operator aten::_print.default refused")
    assert ex.plan_refusal(plan["ops"], ["aten::_print"]) == ""
    assert ex.plan_refusal(plan["ops"], ["aten::_print.default"]) == ""
    assert ex.resolve_overload("aten::_print.default") is None  # never resolved while refused
    assert ex.resolve_overload("aten::_print.default", ["aten::_print"]) is torch.ops.aten._print.default
    assert ex.resolve_overload("aten::mm.default") is torch.ops.aten.mm.default


def _from_file_trace(victim: Path) -> dict:
    """An execution trace whose one op is aten::from_file(victim, shared=True, 8), then fill_."""
    attrs = [{"name": "rf_id", "type": "uint64", "value": 0}]

    def node(nid, name, parent, inputs, outputs, schema=""):
        return {"id": nid, "name": name, "ctrl_deps": parent, "inputs": inputs, "outputs": outputs,
                "attrs": attrs + [{"name": "op_schema", "type": "string", "value": schema}]}

    t = [10, 11, 0, 8, 1, "cpu"]
    schema = str(torch.ops.aten.from_file.default._schema)
    return {"schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "2026-01-01 00:00:00", "start_ts": 5, "finish_ts": 9,
            "nodes": [
                node(1, "[pytorch|profiler|execution_trace|process]", 1, _vals(), _vals()),
                node(2, "[pytorch|profiler|execution_trace|thread]", 1, _vals(), _vals()),
                node(3, "aten::from_file", 2,
                     _vals([str(victim), True, 8, 0, None, "cpu", None], ["String", "Bool", "Int", "Int", "None",
                                                                          "Device", "None"]),
                     _vals([t], ["Tensor(unsigned char)"], [[8]], [[1]]), schema),
                node(4, "aten::fill_", 2, _vals([t, 65], ["Tensor(unsigned char)", "Int"], [[8], []], [[1], []]),
                     _vals([t], ["Tensor(unsigned char)"], [[8]], [[1]]),
                     str(torch.ops.aten.fill_.Scalar._schema)),
            ]}


def _vals(values=None, types=None, shapes=None, strides=None) -> dict:
    values = values or []
    return {"values": values, "types": types or [], "shapes": shapes or [[] for _ in values],
            "strides": strides or [[] for _ in values]}


@pytest.mark.parametrize("command", ["generate", "replay"])
def test_a_from_file_trace_exits_2_naming_the_op_and_writes_nothing(tmp_path, cli_run, command):
    victim = tmp_path / "victim"
    trace = tmp_path / "hostile.json"
    trace.write_text(json.dumps(_from_file_trace(victim)))
    code, _, err = cli_run("-q", command, str(trace), "-o", str(tmp_path / "out"))
    assert code == 2
    _one_line_refusal(err, "aten::from_file.default")
    assert "trace node 3" in err
    assert not victim.exists() and not (tmp_path / "out").exists()
    # allowed explicitly, the same trace builds (the refusal is the policy, not a malformed trace)
    assert build_plan(load_trace(trace), allow_ops=["aten::from_file"]).ops[0]["op"] == "aten::from_file.default"


# ------------------------------------------------------------------------------------------------
# no code from data: the original step a plan names


@pytest.fixture
def marker_module(tmp_path, monkeypatch) -> tuple[str, Path]:
    """A module that writes a marker file when imported and when its factory is called."""
    marker = tmp_path / "marker"
    name = "mystique_hostile_step_mod"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{name}.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('imported')\n"
        "def make():\n"
        f"    Path({str(marker)!r}).write_text('called')\n"
        "    return lambda: None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield f"{name}:make", marker
    sys.modules.pop(name, None)


def _benign_with_original(target: str) -> dict:
    spec = {"target": target, "kind": "user", "config": None, "mode": None, "dtype": "float32", "seed": 0,
            "device": "cpu", "threads": 1}
    return _plan([("aten::fill_.Scalar", [{"t": 0}, 1], {})], dtype="float32",
                 metadata={"original_step": spec, "original_step_ms": 1.0})


def test_a_step_named_by_a_plan_is_never_imported(tmp_path, cli_run, marker_module, monkeypatch):
    target, marker = marker_module
    monkeypatch.setattr("mystique.progress._ENABLED", True)  # an earlier -q in this process turned it off
    bench = _bench(tmp_path / "b", _benign_with_original(target))
    code, _, err = cli_run("replay", str(bench), "-o", str(tmp_path / "out"), "--iters", "1", "--warmup", "0")
    assert code in (0, 1, 4), err  # ran, not refused
    assert not marker.exists() and target.split(":")[0] not in sys.modules
    why = json.loads((tmp_path / "out" / "summary.json").read_text())["timing"]["why_not_paired"]
    assert f"original step {target} named by the capture is not imported" in why
    assert f"pass --original {target}" in why and f"pass --original {target}" in err  # the progress line
    # asking for paired timing does not import it either: one line, exit 2
    code, _, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "o2"), "--timing", "paired")
    assert code == 2 and f"pass --original {target}" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "o2").exists()


def test_os_getpid_named_by_a_plan_is_not_called(tmp_path, cli_run, monkeypatch):
    import os

    from mystique.replay import fidelity

    calls = []
    monkeypatch.setattr(os, "getpid", lambda: calls.append(1) or 1)
    step, why = fidelity.rebuild_original(Plan(_benign_with_original("os:getpid")), "cpu", "auto")
    assert step is None and "pass --original os:getpid" in why and calls == []


def test_the_step_the_user_names_with_original_is_imported(tmp_path, marker_module):
    from mystique.replay import fidelity

    target, marker = marker_module
    plan = Plan(_benign_with_original(target))
    step, why = fidelity.rebuild_original(plan, "cpu", "auto", original=target)
    assert step is not None and why == "" and marker.read_text() == "called"
    # a built-in workload is rebuilt from the registry by its name, with no --original
    spec = {"target": "dlrm", "kind": "workload", "config": "debug", "mode": "infer", "dtype": "float32",
            "seed": 0, "device": "cpu"}
    step, why = fidelity.rebuild_original(Plan({**plan.data, "metadata": {"original_step": spec}}), "cpu", "auto")
    assert step is not None and why == ""
    spec["config"] = "no-such-config"
    step, why = fidelity.rebuild_original(Plan({**plan.data, "metadata": {"original_step": spec}}), "cpu", "auto")
    assert step is None and "cannot rebuild dlrm" in why


def test_original_must_name_a_step(tmp_path, cli_run):
    bench = _bench(tmp_path / "b", _plan([("aten::fill_.Scalar", [{"t": 0}, 1], {})]))
    code, _, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "out"), "--original", "not a step")
    assert code == 2 and "--original not a step: expected package.module:function" in err


# ------------------------------------------------------------------------------------------------
# size cap


def test_an_oversized_benchmark_json_exits_2(tmp_path, cli_run, monkeypatch):
    bench = _bench(tmp_path / "b", _plan([("aten::fill_.Scalar", [{"t": 0}, 1], {})]))
    size = (bench / "benchmark.json").stat().st_size
    monkeypatch.setenv("MYSTIQUE_MAX_TRACE_BYTES", str(size - 1))
    code, _, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "out"))
    assert code == 2 and f"is larger than {size - 1} bytes" in err and "MYSTIQUE_MAX_TRACE_BYTES" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert ex.main(["--plan", str(bench / "benchmark.json")]) == 2  # the standalone runtime too
    from mystique.validators.numerics.benchmark_shapes import benchmark_gemm_shapes

    with pytest.raises(UsageError, match="is larger than"):  # validate numerics --benchmark
        benchmark_gemm_shapes(bench, full=False)
    monkeypatch.setenv("MYSTIQUE_MAX_TRACE_BYTES", str(size))
    assert ex.load_plan(bench / "benchmark.json")["ops"]
    monkeypatch.setenv("MYSTIQUE_MAX_TRACE_BYTES", "lots")
    code, _, err = cli_run("-q", "replay", str(bench), "-o", str(tmp_path / "out"))
    assert code == 2 and "MYSTIQUE_MAX_TRACE_BYTES='lots' is not a positive size" in err
