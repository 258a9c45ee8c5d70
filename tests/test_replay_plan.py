"""Plans built from real execution traces: torch 2.13 captures of small models, and slices of the
shared third-party traces (GPT-2, ResNet, DLRM) replayed on the CPU."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
import torch

from mystique.replay import runtime as ex
from mystique.replay.classify import classify, match_schema
from mystique.replay.plan import build_plan
from mystique.trace import load_trace, replay_ops
from mystique.trace.model import Node

DATA = Path(__file__).parent / "data" / "traces"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def capture_et(path: Path, step, warm: int = 1) -> Path:
    """Record one call of ``step`` with torch's ExecutionTraceObserver (integral ranges on)."""
    from torch.profiler import ExecutionTraceObserver

    os.environ["ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE"] = "1"
    for _ in range(warm):
        step()
    et = ExecutionTraceObserver()
    et.register_callback(str(path))
    et.start()
    step()
    et.stop()
    et.unregister_callback()
    return path


class SparseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.bag = torch.nn.EmbeddingBag(30, 8, mode="sum")
        self.lin = torch.nn.Linear(16, 4)
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, ids, bag_ids, offsets):
        a = self.emb(ids).mean(1)
        b = self.bag(bag_ids, offsets)
        h = self.norm(self.lin(torch.cat([a, b], 1)))
        return torch.log(h.abs() + 1).sqrt().sum()


@pytest.fixture(scope="module")
def sparse_trace(tmp_path_factory):
    torch.manual_seed(0)
    model = SparseNet()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, 50, (6, 5))
    bag_ids = torch.randint(0, 30, (20,))
    offsets = torch.tensor([0, 3, 7, 12, 12, 18])

    def step():
        opt.zero_grad(set_to_none=True)
        model(ids, bag_ids, offsets).backward()
        opt.step()

    return load_trace(capture_et(tmp_path_factory.mktemp("et") / "sparse.json", step))


def test_captured_training_step_replays_every_op_with_its_real_results(sparse_trace):
    plan = build_plan(sparse_trace)
    names = {op["name"] for op in plan.ops}
    assert {"aten::embedding", "aten::embedding_bag", "aten::_foreach_add_"} <= names
    assert any("backward" in n for n in names)  # autograd ops are replayed as outermost ops
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    c = e.counts()
    assert c["skipped"] == {} and c["replayed"] == c["total"] == len(plan.ops)
    assert c["fallbacks"] == 0
    assert all(op["op"].count(".") == 1 and "::" in op["op"] for op in plan.ops)


def _storage_of(plan, pred):
    for op in plan.ops:
        if pred(op):
            return op
    raise AssertionError("op not found")


def test_index_and_offset_inputs_get_valid_data(sparse_trace):
    plan = build_plan(sparse_trace)
    e = ex.Executor(plan.data, "cpu", seed=3)
    e.prepare()
    emb = _storage_of(plan, lambda op: op["name"] == "aten::embedding")
    w, idx = emb["args"][0]["t"], emb["args"][1]["t"]
    assert plan.tensors[w]["shape"] == [50, 8]
    rec = plan.storages[plan.tensors[idx]["storage"]]["recipe"]
    assert rec["kind"] == "randint" and 0 <= rec["low"] and rec["high"] <= 50
    vals = e._external[idx]
    assert int(vals.min()) >= 0 and int(vals.max()) < 50
    bag = _storage_of(plan, lambda op: op["name"] == "aten::embedding_bag")
    bidx, boff = bag["args"][1]["t"], bag["args"][2]["t"]
    assert int(e._external[bidx].max()) < 30
    off = e._external[boff].tolist()
    assert off[0] == 0 and off == sorted(off) and off[-1] <= e._external[bidx].numel()
    assert plan.storages[plan.tensors[boff]["storage"]]["recipe"]["kind"] == "offsets"


def test_log_and_sqrt_inputs_that_are_external_get_positive_data():
    def node(i, name, schema, inputs, outputs):
        return Node(id=i, name=name, parent=None, inputs=inputs, outputs=outputs, op_schema=schema)

    from mystique.trace.model import Arg, TensorRef

    def tref(tid, sid, shape):
        return TensorRef(tid, sid, 0, 4, 4, "cpu", tuple(shape), None, "float32")

    n = [node(1, "aten::sqrt", "aten::sqrt(Tensor self) -> Tensor",
              [Arg("Tensor", tref(10, 20, [4]), "Tensor(float)")], [Arg("Tensor", tref(11, 21, [4]), "Tensor(float)")]),
         node(2, "aten::log", "aten::log(Tensor self) -> Tensor",
              [Arg("Tensor", tref(12, 22, [4]), "Tensor(float)")], [Arg("Tensor", tref(13, 23, [4]), "Tensor(float)")])]
    from mystique.trace.model import Trace

    tr = Trace(schema="1.1.1-chakra.0.0.4", nodes={x.id: x for x in n}, root_id=1)
    plan = build_plan(tr, nodes=n)
    kinds = [plan.storages[plan.tensors[op["args"][0]["t"]]["storage"]]["recipe"]["kind"] for op in plan.ops]
    assert kinds == ["uniform_pos", "uniform_pos"]
    e = ex.Executor(plan.data, "cpu")
    e.prepare()
    assert all(float(t.min()) > 0 for t in e._external.values())


def test_reused_trace_ids_become_distinct_plan_tensors_and_views_share_a_storage(sparse_trace):
    plan = build_plan(sparse_trace)
    ids = [t["trace_id"] for t in plan.tensors]
    assert len(set(ids)) < len(ids)  # the observer reused ids: the plan keeps them apart
    for t in plan.tensors:
        st = plan.storages[t["storage"]]
        assert t["source"] in ("external", "output", "derived")
        if t["source"] == "external":
            assert st["external"]
    views = [op for op in plan.ops if op["name"] in ("aten::t", "aten::view", "aten::reshape")]
    assert views
    for op in views:
        src, out = op["args"][0]["t"], op["outputs"][0]["t"]
        assert plan.tensors[src]["storage"] == plan.tensors[out]["storage"]


def test_classify_separates_calls_noops_collectives_and_labels():
    def n(name, schema="", backend=""):
        return Node(id=1, name=name, parent=None, op_schema=schema, kernel_backend=backend)

    assert classify(n("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor"))[0] == "call"
    assert classify(n("aten::record_stream"))[0] == "noop"
    assert classify(n("record_param_comms")) == ("skip", "collective")
    assert classify(n("c10d::allreduce_")) == ("skip", "collective")
    assert classify(n("nccl:all_reduce")) == ("skip", "collective")
    assert classify(n("triton_poi_fused_0", backend="triton"))[0] == "skip"


def test_schema_is_matched_from_the_registry_when_the_trace_has_none():
    from mystique.trace.model import Arg, TensorRef

    t = TensorRef(1, 2, 0, 4, 4, "cpu", (2, 2), None, "float32")
    s = match_schema("aten::add", [Arg("Tensor", t, "Tensor(float)"), Arg("Tensor", t, "Tensor(float)"),
                                   Arg("Int", 1, "Int")])
    assert s is not None and s.startswith("aten::add.Tensor(")
    assert match_schema("aten::no_such_op", []) is None


# ---------------------------------------------------------------------------------------------
# the shared third-party traces: slices on the CPU (fast), whole iterations (slow)


def _replay_slice(path: Path, n: int) -> tuple[dict, ex.Executor]:
    tr = load_trace(path)
    plan = build_plan(tr, nodes=replay_ops(tr)[:n])
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    return plan, e


def _missing(e: ex.Executor) -> dict:
    c = e.counts()
    return {k: v for k, v in c["skipped"].items()
            if c["reasons"][k] not in ("collective", "custom op unavailable", "compiled kernel (triton)")}


@pytest.mark.parametrize("name,n", [("hf_GPT2_trimmed.json.gz", 200), ("resnet_1gpu_trimmed.json.gz", 200),
                                    ("dlrm_eg_0.json.gz", 200), ("1.0.2-chakra.0.0.4.json.gz", 200),
                                    ("pt2_et.json", 200)])
def test_slice_of_each_shared_trace_replays_on_cpu(name, n):
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} absent")
    plan, e = _replay_slice(path, n)
    assert plan.metadata["original_device"].startswith("cuda")
    assert _missing(e) == {}, e.counts()["reasons"]
    c = e.counts()
    assert c["total"] == len(plan.ops) > 0


def test_dlrm_collectives_and_custom_ops_are_counted_not_fatal():
    path = DATA / "dlrm_eg_0.json.gz"
    if not path.exists():
        pytest.skip(f"{path} absent")
    tr = load_trace(path)
    plan = build_plan(tr)
    reasons = {op["name"]: op["reason"] for op in plan.ops if op["action"] == "skip"}
    assert reasons["record_param_comms"] == "collective"
    assert reasons.get("c10d::allreduce_") == "collective"
    fb = [op for op in plan.ops if op["name"] == "fbgemm::bounds_check_indices"]
    assert fb and fb[0]["op"] == "fbgemm::bounds_check_indices.default"


def _shared(archive: str, member: str, tmp_path_factory) -> Path:
    src = SHARED / archive
    if not src.exists():
        pytest.skip(f"{src} absent")
    out = tmp_path_factory.mktemp("shared")
    with tarfile.open(src) as tf:
        tf.extract(member, out, filter="data")
    return out / member


@pytest.mark.slow
@pytest.mark.parametrize("archive,member", [
    ("param__hf_GPT2_et.json.tar.gz", "hf_GPT2_et.json"),
    ("param__resnet_1gpu_et.json.tar.gz", "resnet_1gpu_et.json"),
    ("param__dlrm_pytorch_et.tar.gz", "dlrm_pytorch_et/dlrm_eg_0.json"),
])
def test_every_compute_op_of_the_full_shared_traces_replays_on_cpu(archive, member, tmp_path_factory):
    path = _shared(archive, member, tmp_path_factory)
    tr = load_trace(path)
    plan = build_plan(tr)
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    assert _missing(e) == {}, e.counts()["reasons"]


def _adamw_plan(tmp_path, widths, batch, **adamw):
    """The plan of one single-tensor AdamW training step of a small tanh MLP (``widths``: in, hidden, out)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(widths[0], widths[1]), torch.nn.Tanh(),
                                torch.nn.Linear(widths[1], widths[2]))
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **adamw)
    x = torch.randn(batch, widths[0])

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    return build_plan(load_trace(capture_et(tmp_path / "adamw.json", step)))


def test_single_tensor_adamw_replay_keeps_parameters_finite(tmp_path):
    """Wrapped Python numbers (betas, eps, bias corrections) arrive as 0-dim tensors with no value:
    their synthetic stand-ins must not turn the optimizer's arithmetic into NaN or inf."""
    plan = _adamw_plan(tmp_path, (8, 16, 3), 5)
    assert any(op["name"] == "aten::addcdiv_" for op in plan.ops)
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    for _ in range(3):
        e.run_iteration()
    floats = [t for t in e._external.values() if t.is_floating_point()]
    assert floats and all(bool(torch.isfinite(t).all()) for t in floats)
    assert e.counts()["skipped"] == {}


def test_wrapped_python_number_reusing_a_freed_storage_id_gets_a_storage_of_its_own():
    """The observer reuses a freed tensor's storage id for the next allocation at that address: a
    Python number the optimizer wraps into a 0-dim double (or long) tensor can name the storage of
    the float32 loss that backward freed. The plan must not read the number's bits out of the loss
    (nor out of an int64 step count): each clashing scalar is an external storage of its own dtype,
    standing in as 1 (neutral in the products it takes part in), and the replayed update stays finite."""
    from mystique.trace.model import Arg, TensorRef, Trace

    def tref(tid, sid, shape, dtype, itemsize=4):
        return TensorRef(tid, sid, 0, max(1, int(torch.tensor(shape).prod()) if shape else 1), itemsize, "cpu",
                         tuple(shape), None, dtype)

    def arg(t):
        return Arg("Tensor", t, f"Tensor({t.dtype})")

    x, w = tref(1, 100, [4], "float32"), tref(2, 101, [4], "float32")
    loss = tref(3, 52, [], "float32")
    step_inc = tref(4, 52, [], "int64", 8)  # `step += 1`: a wrapped long where the loss lived
    beta = tref(5, 52, [], "float64", 8)  # `exp_avg_sq.mul_(beta2)`: a wrapped double, same address
    steps = tref(6, 102, [], "float32")
    schema = {
        "sum": "aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",
        "add_": "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
        "mul_": "aten::mul_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)",
        "sqrt": "aten::sqrt(Tensor self) -> Tensor",
    }
    nodes = [
        Node(id=1, name="aten::sum", parent=None, inputs=[arg(x)], outputs=[arg(loss)], op_schema=schema["sum"]),
        Node(id=2, name="aten::add_", parent=None, inputs=[arg(steps), arg(step_inc), Arg("Int", 1, "Int")],
             outputs=[arg(steps)], op_schema=schema["add_"]),
        Node(id=3, name="aten::mul_", parent=None, inputs=[arg(w), arg(beta)], outputs=[arg(w)],
             op_schema=schema["mul_"]),
        Node(id=4, name="aten::sqrt", parent=None, inputs=[arg(w)], outputs=[arg(tref(7, 103, [4], "float32"))],
             op_schema=schema["sqrt"]),
        Node(id=5, name="aten::add_", parent=None, inputs=[arg(w), arg(loss), Arg("Int", 1, "Int")],
             outputs=[arg(w)], op_schema=schema["add_"]),
    ]
    tr = Trace(schema="1.1.1-chakra.0.0.4", nodes={n.id: n for n in nodes}, root_id=1)
    plan = build_plan(tr, nodes=nodes)
    tensors, storages = plan.tensors, plan.storages
    loss_t = plan.ops[0]["outputs"][0]["t"]
    inc_t, beta_t = plan.ops[1]["args"][1]["t"], plan.ops[2]["args"][1]["t"]
    sids = {tensors[t]["storage"] for t in (loss_t, inc_t, beta_t)}
    assert len(sids) == 3  # the loss, the long and the double: three storages
    for t, dt in ((inc_t, "int64"), (beta_t, "float64")):
        st = storages[tensors[t]["storage"]]
        assert st["external"] and st["dtype"] == dt and tensors[t]["source"] == "external"
    assert storages[tensors[beta_t]["storage"]]["recipe"]["kind"] == "ones"
    # the loss itself, still alive and of its own dtype, is read back from the op that made it
    assert plan.ops[4]["args"][1]["t"] == loss_t
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    for _ in range(5):
        e.run_iteration()
    assert e.counts()["fallbacks"] == 0
    assert all(bool(torch.isfinite(t).all()) for t in e._external.values() if t.is_floating_point())
    assert float(e._external[beta_t]) == 1.0


def test_embedding_bag_indices_are_zipf_skewed_and_token_ids_stay_uniform(sparse_trace):
    from mystique.replay.recipes import EMBEDDING_BAG_ZIPF

    plan = build_plan(sparse_trace)
    bag = _storage_of(plan, lambda op: op["name"] == "aten::embedding_bag")
    emb = _storage_of(plan, lambda op: op["name"] == "aten::embedding")
    recipe = lambda enc: plan.storages[plan.tensors[enc["t"]]["storage"]]["recipe"]  # noqa: E731
    r = recipe(bag["args"][1])
    assert r["kind"] == "randint" and r["zipf"] == EMBEDDING_BAG_ZIPF and 0 <= r["low"] < r["high"] <= 30
    assert "zipf" not in recipe(emb["args"][1])


def test_replayed_single_tensor_adamw_keeps_the_parameters_scale_over_many_iterations(tmp_path):
    """Stand-ins for the optimizer's lost Python numbers multiply persistent state every iteration:
    anything but a neutral value shrinks (or grows) the parameters geometrically until gradients are
    denormal and the replay's kernels slow down (or overflow)."""
    plan = _adamw_plan(tmp_path, (16, 32, 4), 8, weight_decay=0.1)
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    weights = [t for t in e._external.values() if t.dim() == 2 and t.is_floating_point() and t.requires_grad]
    assert weights
    before = [float(w.detach().std()) for w in weights]
    for _ in range(40):
        e.run_iteration()
    after = [float(w.detach().std()) for w in weights]
    assert all(0.5 * b < a < 2 * b for a, b in zip(after, before)), (before, after)
