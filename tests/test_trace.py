"""Execution-trace model: loading every schema variant, the call tree, iterations, the operators
to replay, statistics, data dependencies, and traces torch itself writes (with Kineto join)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from mystique.trace import (
    OP_STATS_COLUMNS,
    TensorRef,
    Trace,
    data_dependencies,
    iteration_spans,
    iterations,
    load_kineto,
    load_trace,
    op_stats,
    producers,
    read_kineto,
    replay_ops,
    select_iteration,
    tensors,
)
from mystique.trace.loader import parse_trace_document
from mystique.trace.writer import trace_to_document

DATA = Path(__file__).parent / "data" / "traces"
SMALL = {
    "pt2": DATA / "pt2_et.json",
    "chakra102": DATA / "1.0.2-chakra.0.0.4.json.gz",
    "dlrm101": DATA / "dlrm_eg_0.json.gz",
    "gpt2_110": DATA / "hf_GPT2_trimmed.json.gz",
    "resnet111": DATA / "resnet_1gpu_trimmed.json.gz",
}
_CACHE: dict[str, Trace] = {}


def small(key: str) -> Trace:
    if key not in _CACHE:
        _CACHE[key] = load_trace(SMALL[key])
    return _CACHE[key]


def all_args(trace: Trace):
    for node in trace.nodes.values():
        yield from node.inputs
        yield from node.outputs


# ------------------------------------------------------------------------------ per schema


@pytest.mark.parametrize(
    ("key", "schema", "count"),
    [
        ("pt2", "1.1.1-chakra.0.0.4", 20),
        ("chakra102", "1.0.2-chakra.0.0.4", 263),
        ("dlrm101", "1.0.1", 1675),
        ("gpt2_110", "1.1.0-chakra.0.0.4", 251),
        ("resnet111", "1.1.1-chakra.0.0.4", 622),
    ],
)
def test_each_schema_loads_every_node(key, schema, count):
    tr = small(key)
    assert tr.schema == schema
    assert len(tr.nodes) == count
    assert tr.source.endswith(SMALL[key].name)
    assert tr.root.name.startswith("[pytorch|profiler|execution_")
    assert tr.root.parent is None
    assert tr.pid is not None and tr.start_ts is not None


@pytest.mark.parametrize("key", sorted(SMALL))
def test_call_tree_is_consistent_and_in_id_order(key):
    tr = small(key)
    seen = [n.id for n in tr.preorder()]
    assert sorted(seen) == sorted(tr.nodes), "every node is reachable from the root exactly once"
    for node in tr.nodes.values():
        assert node.children == sorted(node.children)
        for c in node.children:
            assert tr.nodes[c].parent == node.id
            assert c > node.id, "a child starts after its parent: ids are handed out at op start"
        if node.parent is not None:
            assert node.id in tr.nodes[node.parent].children


def test_file_order_is_post_order_not_id_order():
    raw = json.loads(gzip.decompress(SMALL["dlrm101"].read_bytes()))
    ids = [n["id"] for n in raw["nodes"]]
    assert ids != sorted(ids)
    pos = {i: k for k, i in enumerate(ids)}
    tr = small("dlrm101")
    later = sum(1 for n in tr.nodes.values() if n.parent is not None and pos[n.parent] > pos[n.id])
    assert later / len(ids) > 0.9, "most parents are written after their children (on exit)"


def test_flat_101_fields():
    tr = small("dlrm101")
    node = next(n for n in tr.nodes.values() if n.name == "aten::view" and n.rf_id == 5)
    assert node.parent == 4 and node.seq_id == 440 and node.tid == 1 and node.scope == 0
    assert node.op_schema.startswith("aten::view(Tensor(a) self")
    t = node.inputs[0].value
    assert t == TensorRef(9, 6, 0, 48, 4, "cuda:0", (48,), None, "float32")
    size = node.inputs[1]
    assert size.kind == "GenericList" and [a.value for a in size.value] == [-1, 16]
    assert node.outputs[0].value.shape == (3, 16)
    assert node.attrs["fw_tid"] == 0
    thread = tr.nodes[2]
    assert thread.name == "[pytorch|profiler|execution_graph|thread]" and thread.parent == tr.root_id
    assert any(n.name == "fbgemm::bounds_check_indices" and n.is_op for n in tr.nodes.values())


def test_every_dtype_in_the_real_traces_is_mapped():
    found = {}
    for key in SMALL:
        for t in tensors(all_args(small(key))):
            found[t.dtype] = found.get(t.dtype, 0) + 1
    assert "unknown" not in found
    assert {"float32", "float64", "int32", "int64", "uint8", "bool", "undefined"} <= set(found)


def test_nested_lists_and_tuples_become_arg_lists():
    tr = small("chakra102")
    gl = [a for a in all_args(tr) if a.type == "GenericList[GenericList[Tensor(float),Tensor(float)]]"]
    assert gl
    inner = gl[0].value[0]
    assert inner.kind == "GenericList" and all(isinstance(x.value, TensorRef) for x in inner.value)
    tr = small("resnet111")
    tup = [a for a in all_args(tr) if a.type == "Tuple[String,String]"]
    assert tup and [x.value for x in tup[0].value] == ["0", "default_pg"]
    nones = [a for a in all_args(tr) if a.kind == "None"]
    assert nones and all(a.value is None for a in nones)


def test_strides_recorded_only_from_1_1_1():
    assert all(t.strides is None for t in tensors(all_args(small("gpt2_110"))))
    ts = tensors(all_args(small("resnet111")))
    assert ts and all(t.strides is not None for t in ts)
    mm = next(n for n in small("pt2").nodes.values() if n.name == "aten::mm")
    assert mm.inputs[0].value.strides == (4, 1)


def test_pt2_triton_kernel_node():
    tr = small("pt2")
    k = next(n for n in tr.nodes.values() if n.kernel_backend)
    assert k.kernel_backend == "triton" and k.name.startswith("triton_poi_fused")
    assert k.kernel_file.endswith(".py") and k.is_op and not k.op_schema
    # the observer wrote one stride entry fewer than values (none for the trailing Int)
    assert [a.kind for a in k.inputs][-2:] == ["Int", "Int"]
    assert k.inputs[0].value.strides == (4, 1)


def test_comms_attributes_are_kept():
    tr = small("resnet111")
    rpc = [n for n in tr.nodes.values() if n.name == "record_param_comms" and "collective_name" in n.attrs]
    assert rpc
    assert all(n.is_op for n in rpc)
    assert {"in_msg_nelems", "out_msg_nelems", "pg_size", "dtype"} <= set(rpc[0].attrs)


# ------------------------------------------------------------------------ iterations and ops


def test_iterations_are_the_profiler_steps_in_order():
    assert [n.name for n in iterations(small("pt2"))] == ["ProfilerStep#5", "ProfilerStep#6"]
    assert [n.name for n in iterations(small("resnet111"))] == [f"ProfilerStep#{i}" for i in (6, 7, 8)]
    assert iterations(small("dlrm101")) == []
    spans = iteration_spans(small("gpt2_110"))
    assert [(s.step, s.complete) for s in spans] == [(0, True), (1, False)]
    assert spans[0].end_id == spans[1].node.id


def test_default_iteration_is_the_last_complete_one():
    assert select_iteration(small("pt2")).step == 5
    assert select_iteration(small("resnet111")).step == 7
    assert select_iteration(small("gpt2_110")).step == 0
    assert select_iteration(small("dlrm101")) is None


def test_unknown_iteration_names_the_recorded_steps():
    from mystique.errors import UsageError

    with pytest.raises(UsageError, match=r"no ProfilerStep#3; recorded steps: 5, 6"):
        replay_ops(small("pt2"), 3)


def test_pt2_replays_mm_and_the_triton_kernel_per_step():
    tr = small("pt2")
    assert [n.name for n in replay_ops(tr)] == ["aten::mm", "triton_poi_fused_add_cos_neg_sin_0"]
    step6 = replay_ops(tr, 6)
    assert [n.name for n in step6] == ["aten::mm", "triton_poi_fused_add_cos_neg_sin_0"]
    assert step6[0].id > iterations(tr)[1].id


@pytest.mark.parametrize("key", sorted(SMALL))
def test_replay_ops_are_outermost_ops_in_execution_order(key):
    tr = small(key)
    ops = replay_ops(tr)
    assert ops
    ids = [n.id for n in ops]
    assert ids == sorted(ids)
    chosen = set(ids)
    it = select_iteration(tr)
    for n in ops:
        assert n.is_op
        assert not any(a.id in chosen or a.is_op for a in tr.ancestors(n.id)), "no op inside another op"
        if it is not None:
            assert it.contains(n.id)
    # every op of the span is either chosen or inside a chosen op
    for n in tr.nodes.values():
        if n.is_op and (it is None or it.contains(n.id)) and n.id not in chosen:
            assert any(a.id in chosen for a in tr.ancestors(n.id))


def test_backward_thread_ops_belong_to_the_iteration():
    tr = small("gpt2_110")
    ops = replay_ops(tr)
    thread_ids = {n.tid for n in ops}
    assert thread_ids == {1, 2}, "forward/optimizer on tid 1 and the autograd thread's ops on tid 2"
    step0 = iterations(tr)[0]
    assert any(n.id not in {x.id for x in tr.preorder(step0.id)} for n in ops)


def test_labels_are_descended_not_replayed():
    tr = small("dlrm101")
    names = {n.name for n in replay_ops(tr)}
    for label in ("## forward ##", "Optimizer.step#Adagrad.step", "AddmmBackward0",
                  "autograd::engine::evaluate_function: AddmmBackward0", "torch::autograd::AccumulateGrad",
                  "detach_", "nccl:all_to_all"):
        assert label not in names
    assert {"aten::linear", "c10d::alltoall_base_", "fbgemm::bounds_check_indices", "record_param_comms"} <= names


def test_whole_trace_when_no_steps():
    tr = small("chakra102")
    ops = replay_ops(tr)
    assert len(ops) == 90
    assert {n.name for n in ops} >= {"c10d::allgather_", "record_param_comms", "aten::empty"}


# ---------------------------------------------------------------------- stats and data deps


def test_op_stats_counts_without_kineto():
    df = op_stats(small("gpt2_110"))
    assert list(df.columns) == OP_STATS_COLUMNS
    ops = replay_ops(small("gpt2_110"))
    assert int(df["count"].sum()) == len(ops)
    assert df["total_time_us"].isna().all() and df["device_time_us"].isna().all()
    mm = df[df["name"] == "aten::mm"]
    assert mm.iloc[0]["op_schema"].startswith("aten::mm(")
    assert list(df["count"]) == sorted(df["count"], reverse=True)


def test_op_stats_with_times_sums_by_rf_id():
    tr = small("pt2")
    ops = replay_ops(tr)
    times = {ops[0].rf_id: 10.0, ops[1].rf_id: 2.5}
    df = op_stats(tr, kineto=times).set_index("name")
    assert df.loc["aten::mm", "total_time_us"] == 10.0
    assert df.loc["triton_poi_fused_add_cos_neg_sin_0", "mean_time_us"] == 2.5
    assert list(df.index) == ["aten::mm", "triton_poi_fused_add_cos_neg_sin_0"]


def test_producers_and_data_dependencies():
    tr = small("gpt2_110")
    ops = replay_ops(tr)
    made = producers(tr, ops)
    assert made
    for tid, node in made.items():
        assert tid in {t.tensor_id for t in tensors(node.outputs)}
        assert tid not in {t.tensor_id for t in tensors(node.inputs)}
    deps = data_dependencies(tr, ops)
    assert set(deps) == {n.id for n in ops}
    assert any(deps.values())
    for nid, earlier in deps.items():
        assert all(e < nid for e in earlier)
        node = tr.nodes[nid]
        for e in earlier:
            outs = {t.tensor_id for t in tensors(tr.nodes[e].outputs)}
            assert outs & {t.tensor_id for t in tensors(node.inputs)}


# ------------------------------------------------------------------------- file handling


def test_trace_folder_and_gzip_and_plain(tmp_path):
    raw = gzip.decompress(SMALL["chakra102"].read_bytes())
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "trace.json").write_bytes(raw)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trace.json.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "plain.json").write_bytes(raw)
    (tmp_path / "gz_without_suffix.json").write_bytes(gzip.compress(raw))
    loaded = [load_trace(tmp_path / p) for p in ("a", "b", "plain.json", "gz_without_suffix.json")]
    assert all(t.nodes == loaded[0].nodes for t in loaded)
    assert loaded[0].source.endswith("a/trace.json") and loaded[1].source.endswith("trace.json.gz")


@pytest.mark.parametrize("key", sorted(SMALL))
def test_write_then_parse_gives_the_same_model(key):
    tr = small(key)
    again = parse_trace_document(json.loads(json.dumps(trace_to_document(tr))), source=tr.source)
    assert again.nodes == tr.nodes and again.root_id == tr.root_id


# -------------------------------------------------------------- traces torch 2.13 writes


def _capture(out: Path, with_kineto: bool) -> None:
    import torch
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    et = ExecutionTraceObserver().register_callback(str(out / "trace.json"))
    a = torch.randn(4, 3, requires_grad=True)
    idx = torch.tensor([0, 2, 1])
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=et) as prof:
        for i in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                y = (a @ a.t()).relu().sum()
                y.backward()
                torch.index_select(a.to(torch.bfloat16), 0, idx)
                torch.cat([idx, idx]).to(torch.int8)
    if with_kineto:
        prof.export_chrome_trace(str(out / "kineto.json"))
        data = (out / "kineto.json").read_bytes()
        (out / "kineto.json.gz").write_bytes(gzip.compress(data))
        (out / "kineto.json").unlink()


@pytest.fixture(scope="module")
def torch_traces(tmp_path_factory):
    """Two trace folders captured here: 'plain' (with kineto.json.gz) and 'ranged' (tensor_range)."""
    pytest.importorskip("torch")
    mp = pytest.MonkeyPatch()
    base = tmp_path_factory.mktemp("torch_et")
    (base / "plain").mkdir()
    (base / "ranged").mkdir()
    try:
        mp.delenv("ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE", raising=False)
        _capture(base / "plain", with_kineto=True)
        mp.setenv("ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE", "1")
        _capture(base / "ranged", with_kineto=False)
    finally:
        mp.undo()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_torch_writes_a_schema_we_parse(torch_traces):
    tr = load_trace(torch_traces / "plain")
    assert tr.schema.startswith("1.1.1-chakra")
    assert [n.name for n in iterations(tr)] == ["ProfilerStep#0", "ProfilerStep#1"]
    names = [n.name for n in replay_ops(tr)]
    assert "aten::matmul" in names and "aten::index_select" in names and "aten::cat" in names
    ops = replay_ops(tr)
    fwd_mm = [n for n in tr.nodes.values() if n.name == "aten::mm" and tr.nodes[n.parent].name == "aten::matmul"]
    assert fwd_mm and not {n.id for n in fwd_mm} & {n.id for n in ops}, "mm inside matmul is not replayed"
    bwd_mm = [n for n in ops if n.name == "aten::mm"]
    assert bwd_mm and all(any(a.name == "MmBackward0" for a in tr.ancestors(n.id)) for n in bwd_mm)
    bf16 = [t for t in tensors(all_args(tr)) if t.dtype == "bfloat16"]
    assert bf16 and all(t.itemsize == 2 for t in bf16)
    assert {"int8", "int64", "float32"} <= {t.dtype for t in tensors(all_args(tr))}
    assert all(t.value_range is None for t in tensors(all_args(tr)))


def test_tensor_range_keys_count_input_tensors(torch_traces):
    tr = load_trace(torch_traces / "ranged")
    sel = next(n for n in tr.nodes.values() if n.name == "aten::index_select")
    assert sel.attrs["tensor_range"] == '{"1":[0,2]}'
    # inputs: bf16 self (tensor 0), Int dim, int64 index (tensor 1): the range lands on index
    assert sel.inputs[0].value.value_range is None
    assert sel.inputs[2].value.value_range == (0, 2)
    cat = next(n for n in tr.nodes.values() if n.name == "aten::cat")
    listed = cat.inputs[0].value
    assert [x.value.value_range for x in listed] == [(0, 2), (0, 2)]


def test_kineto_join_by_rf_id(torch_traces):
    tr = load_trace(torch_traces / "plain")
    times = load_kineto(torch_traces / "plain" / "kineto.json.gz")
    assert times and all(v >= 0 for v in times.values())
    by_rf = {n.rf_id: n for n in tr.nodes.values() if n.rf_id}
    kt = read_kineto(torch_traces / "plain")
    joined = [rf for rf in kt.names if rf in by_rf]
    assert len(joined) == len(kt.names)
    assert all(kt.names[rf] == by_rf[rf].name for rf in joined)
    assert kt.device_us == {}
    df = op_stats(tr, kineto=torch_traces / "plain")
    assert df["total_time_us"].notna().all()
    matmul = df.set_index("name").loc["aten::matmul"]
    assert matmul["count"] == 1 and matmul["total_time_us"] > 0


def test_kineto_device_time_links_by_external_id_correlation_and_launch_time(tmp_path):
    """GPU kernels attach to the op that launched them: by their own External id, through the
    runtime event sharing their correlation id, or by the launch time inside a CPU op's span."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0,
         "args": {"External id": 10, "Record function id": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 50.0,
         "args": {"External id": 11, "Record function id": 8}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 200.0, "dur": 20.0,
         "args": {"External id": 12, "Record function id": 9}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20.0,
         "dur": 2.0, "args": {"correlation": 500, "External id": 11}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 205.0,
         "dur": 2.0, "args": {"correlation": 501}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 30.0, "dur": 40.0,
         "args": {"correlation": 500, "External id": 11}},
        {"ph": "X", "cat": "kernel", "name": "gemm_tail", "pid": 0, "tid": 7, "ts": 71.0, "dur": 4.0,
         "args": {"correlation": 500}},
        {"ph": "X", "cat": "kernel", "name": "relu_k", "pid": 0, "tid": 7, "ts": 210.0, "dur": 3.0,
         "args": {"correlation": 501}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "pid": 0, "tid": 7, "ts": 300.0, "dur": 5.0,
         "args": {"correlation": 999}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "x", "ts": 1.0},
    ]
    p = tmp_path / "kineto.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    kt = read_kineto(tmp_path)
    assert kt.cpu_us == {7: 100.0, 8: 50.0, 9: 20.0}
    assert kt.device_us == {8: 44.0, 9: 3.0}
    assert kt.unlinked_device_events == 1
    assert load_kineto(p) == kt.cpu_us

    # op_stats rolls device time up from nested ops to the replayed (outermost) op
    doc = {"schema": "1.1.1-chakra.0.0.4", "nodes": [
        {"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1, "attrs": []},
        {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1, "attrs": []},
        {"id": 3, "name": "aten::linear", "ctrl_deps": 2, "attrs": [{"name": "rf_id", "type": "uint64", "value": 7}]},
        {"id": 4, "name": "aten::addmm", "ctrl_deps": 3, "attrs": [{"name": "rf_id", "type": "uint64", "value": 8}]},
        {"id": 5, "name": "aten::relu", "ctrl_deps": 2, "attrs": [{"name": "rf_id", "type": "uint64", "value": 9}]},
    ]}
    tr = parse_trace_document(doc)
    df = op_stats(tr, kineto=kt).set_index("name")
    assert list(df.index) == ["aten::linear", "aten::relu"]
    assert df.loc["aten::linear", "total_time_us"] == 100.0 and df.loc["aten::linear", "device_time_us"] == 44.0
    assert df.loc["aten::relu", "device_time_us"] == 3.0
    nested = op_stats(tr, kineto=kt, outermost=False).set_index("name")
    assert nested.loc["aten::addmm", "count"] == 1


@pytest.mark.parametrize(
    ("name", "schema", "backend", "is_op"),
    [
        ("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor", "", True),
        ("aten::mm", "", "", True),
        ("fbgemm::bounds_check_indices", "", "", True),
        ("c10d::allreduce_", "", "", True),
        ("record_param_comms", "", "", True),
        ("triton_poi_fused_add_0", "", "triton", True),
        ("## forward ##", "", "", False),
        ("ProfilerStep#3", "", "", False),
        ("Optimizer.step#Adam.step", "", "", False),
        ("[pytorch|profiler|execution_trace|thread]", "", "", False),
        ("autograd::engine::evaluate_function: MmBackward0", "", "", False),
        ("torch::autograd::AccumulateGrad", "", "", False),
        ("torch::distributed::reducer::mul_out", "", "", False),
        ("torch.distributed.ddp.reducer::copy_bucket_to_grad", "", "", False),
        ("MmBackward0", "", "", False),
        ("nccl:all_reduce", "", "", False),
        ("detach_", "", "", False),
        ("DistributedDataParallel.forward", "", "", False),
    ],
)
def test_op_or_label(name, schema, backend, is_op):
    from mystique.trace import Node

    node = Node(id=5, name=name, parent=1, op_schema=schema, kernel_backend=backend)
    assert node.is_op is is_op
    assert node.is_label is (not is_op)


@pytest.mark.parametrize("name", ["kineto.json.gz", "kineto.json"])
def test_a_profile_exported_by_capture_reads_back_the_same_with_no_file_left_beside_it(tmp_path, name):
    import torch

    from mystique.trace.files import export_chrome_trace
    from mystique.trace.kineto import read_kineto

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("ProfilerStep#3"):
            torch.ones(8).add(1)
    export_chrome_trace(prof, tmp_path / name)
    assert [p.name for p in tmp_path.iterdir()] == [name]
    if name.endswith(".gz"):
        with gzip.open(tmp_path / name, "rb") as f:
            assert json.load(f)["traceEvents"]
    times = read_kineto(tmp_path / name)
    assert list(times.steps_us) == [3] and times.steps_us[3] > 0
