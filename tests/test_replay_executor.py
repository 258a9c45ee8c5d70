"""The replay executor on hand-written plans: schemas, argument encoding, aliasing, in-place and
out= ops, foreach ops, no-ops, collectives, device remapping, memory refusal, fallbacks."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mystique.replay import runtime as ex
from mystique.replay.runtime import executor as executor_module


class PlanMaker:
    """Builds small plans by hand: storages, tensors and ops in the executor's JSON format."""

    def __init__(self, original_device: str = "cpu"):
        self.storages: list[dict] = []
        self.tensors: list[dict] = []
        self.ops: list[dict] = []
        self.original_device = original_device

    def storage(self, nbytes: int, dtype: str = "float32", device: str | None = None, recipe=None,
                external: bool = True, anchor=None) -> int:
        sid = len(self.storages)
        self.storages.append({"id": sid, "nbytes": nbytes, "dtype": dtype, "device": device or self.original_device,
                              "external": external, "anchor": anchor, "recipe": recipe or {"kind": "randn"}})
        return sid

    def tensor(self, sid: int, shape, strides=None, offset: int = 0, dtype: str = "float32",
               source: str = "external", device: str | None = None) -> int:
        tid = len(self.tensors)
        self.tensors.append({"id": tid, "storage": sid, "offset": offset, "shape": list(shape),
                             "strides": list(strides) if strides is not None else ex.contiguous_strides(shape),
                             "dtype": dtype, "device": device or self.original_device, "source": source})
        return tid

    def out(self, shape, dtype: str = "float32", device: str | None = None) -> int:
        """A tensor produced by an op into a new storage."""
        n = math.prod(shape) if shape else 1
        sid = self.storage(max(n, 1) * torch.empty((), dtype=getattr(torch, dtype)).element_size(), dtype,
                           device, external=False)
        tid = self.tensor(sid, shape, dtype=dtype, source="output", device=device)
        self.storages[sid]["anchor"] = tid
        return tid

    def op(self, name: str, overload: str, args, kwargs=None, outputs=(), action: str = "call", reason: str = ""):
        self.ops.append({"index": len(self.ops), "node_id": len(self.ops) + 1, "rf_id": None, "name": name,
                         "op": f"{name}.{overload}", "schema": "", "action": action, "reason": reason,
                         "args": args, "kwargs": kwargs or {}, "outputs": list(outputs), "orig_us": None,
                         "scope": ""})

    def plan(self) -> dict:
        return {"format": ex.PLAN_FORMAT, "version": ex.PLAN_VERSION,
                "metadata": {"original_device": self.original_device},
                "storages": self.storages, "tensors": self.tensors,
                "inputs": [t["id"] for t in self.tensors if t["source"] == "external"], "ops": self.ops}


def T(tid: int) -> dict:
    return {"t": tid}


# ---------------------------------------------------------------------------------------------
# schemas


def test_parse_schema_reads_positional_kwarg_only_optional_and_list_arguments():
    s = ex.parse_schema("aten::addmm.out(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, "
                        "Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)")
    assert (s.namespace, s.name, s.overload) == ("aten", "addmm", "out")
    assert [a.name for a in s.args] == ["self", "mat1", "mat2", "beta", "alpha", "out"]
    assert [a.kwarg_only for a in s.args] == [False, False, False, True, True, True]
    assert s.args[5].mutable and s.args[5].base_type == "Tensor"
    e = ex.parse_schema("aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor")
    assert e.overload == "Tensor" and e.args[1].base_type == "Tensor[]" and e.args[1].is_list
    d = ex.parse_schema('aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, '
                        'Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor')
    assert d.args[1].optional and d.args[1].default == "None" and d.args[0].base_type == "SymInt[]"
    assert ex.parse_schema("aten::relu(Tensor self) -> Tensor").overload == "default"
    q = ex.parse_schema('aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor')
    assert q.args[2].type == "str?"
    with pytest.raises(ValueError):
        ex.parse_schema("not a schema")


def test_every_registered_aten_schema_parses_to_its_own_argument_names():
    names = ["addmm", "empty", "index", "_foreach_add_", "embedding_bag", "convolution_backward", "split"]
    for n in names:
        for text in ex.overload_schemas(f"aten::{n}"):
            sch = ex.parse_schema(text)
            op = ex.resolve_overload(sch.qualified)
            if ex.policy_refusal(sch.qualified):  # aten::index.str: no tensor semantics, never resolved
                assert op is None, text
                op = ex.resolve_overload(sch.qualified, [sch.qualified])
            assert op is not None, text
            assert [a.name for a in sch.args] == [a.name for a in op._schema.arguments], text


# ---------------------------------------------------------------------------------------------
# argument encoding


_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16]),
    st.sampled_from([torch.strided, torch.sparse_coo]),
    st.sampled_from([torch.contiguous_format, torch.channels_last, torch.preserve_format]),
    st.sampled_from([torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 3)]),
    st.integers(0, 10_000).map(ex.TensorSlot),
)
_values = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@given(_values)
@examples(200)
def test_encode_json_decode_round_trips_every_argument_kind(value):
    text = json.dumps(ex.encode_value(value), allow_nan=False)
    assert _same(ex.decode_value(json.loads(text)), value)


# ---------------------------------------------------------------------------------------------
# storage aliasing


@st.composite
def _views(draw):
    """Storages (sizes in elements) and strided views into them that stay in bounds."""
    n_storages = draw(st.integers(1, 3))
    sizes = [draw(st.integers(1, 64)) for _ in range(n_storages)]
    views = []
    for _ in range(draw(st.integers(1, 6))):
        s = draw(st.integers(0, n_storages - 1))
        ndim = draw(st.integers(0, 3))
        shape = [draw(st.integers(1, 4)) for _ in range(ndim)]
        strides = [draw(st.integers(0, 5)) for _ in range(ndim)]
        span = sum((a - 1) * b for a, b in zip(shape, strides)) + 1
        if span > sizes[s]:
            sizes[s] = span
        offset = draw(st.integers(0, sizes[s] - span))
        views.append((s, shape, strides, offset))
    return sizes, views


@given(_views())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_materialised_views_share_storage_exactly_as_recorded(spec):
    sizes, views = spec
    pm = PlanMaker()
    sids = [pm.storage(n * 4) for n in sizes]
    tids = [pm.tensor(sids[s], shape, strides, offset) for s, shape, strides, offset in views]
    for t in tids:
        pm.op("aten::alias", "default", [T(t)], outputs=[])
    e = ex.Executor(pm.plan(), "cpu")
    e.prepare()
    mats = [e._external[t] for t in tids]
    for (_s, shape, strides, offset), m in zip(views, mats):
        assert list(m.shape) == shape and list(m.stride()) == strides and m.storage_offset() == offset
    for i, (si, *_r) in enumerate(views):
        for j, (sj, *_q) in enumerate(views):
            same = mats[i].untyped_storage().data_ptr() == mats[j].untyped_storage().data_ptr()
            assert same == (si == sj), (i, j)
    # a write through one view is seen through every view of the same storage element
    for (s, _shape, _strides, offset), m in zip(views, mats):
        m.fill_(7.0)
        for (s2, _sh2, _st2, _o2), m2 in zip(views, mats):
            if s2 == s:
                base = torch.empty(0).set_(m2.untyped_storage(), 0, (sizes[s],), (1,))
                assert base[offset].item() == 7.0


def test_views_of_one_storage_with_different_dtypes_alias_bytes():
    pm = PlanMaker()
    s = pm.storage(64, "float32")
    a = pm.tensor(s, [16], dtype="float32")
    b = pm.tensor(s, [8], dtype="int64", offset=2)
    pm.op("aten::alias", "default", [T(a)])
    pm.op("aten::alias", "default", [T(b)])
    e = ex.Executor(pm.plan(), "cpu")
    e.prepare()
    ta, tb = e._external[a], e._external[b]
    assert tb.dtype == torch.int64 and tb.storage_offset() == 2
    assert tb.data_ptr() - ta.data_ptr() == 16


# ---------------------------------------------------------------------------------------------
# ops


def test_in_place_op_mutates_every_aliased_view():
    pm = PlanMaker()
    s = pm.storage(8 * 4, recipe={"kind": "zeros"})
    whole = pm.tensor(s, [8])
    half = pm.tensor(s, [4], offset=4)
    pm.op("aten::add_", "Tensor", [T(half), T(half)], {"alpha": 1}, outputs=[T(half)])
    pm.op("aten::fill_", "Scalar", [T(half), 3.0], outputs=[T(half)])
    out = pm.out([8])
    pm.op("aten::clone", "default", [T(whole)], outputs=[T(out)])
    pm.op("aten::sum", "default", [T(out)], outputs=[])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()
    w = e._external[whole]
    assert w[:4].tolist() == [0.0] * 4 and w[4:].tolist() == [3.0] * 4
    assert all(s.state == "replayed" for s in e.status)


def test_out_variant_writes_into_the_recorded_output_view():
    pm = PlanMaker()
    a = pm.tensor(pm.storage(4 * 4, recipe={"kind": "ones"}), [2, 2])
    buf = pm.storage(8 * 4, recipe={"kind": "zeros"})
    dest = pm.tensor(buf, [2, 2], offset=4)
    pm.op("aten::mm", "out", [T(a), T(a)], {"out": T(dest)}, outputs=[T(dest)])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()
    assert e.status[0].state == "replayed"
    base = torch.empty(0).set_(e._external[dest].untyped_storage(), 0, (8,), (1,))
    assert base.tolist() == [0, 0, 0, 0, 2, 2, 2, 2]


def test_foreach_add_updates_each_tensor_of_the_list():
    pm = PlanMaker()
    ts = [pm.tensor(pm.storage(3 * 4, recipe={"kind": "zeros"}), [3]) for _ in range(3)]
    pm.op("aten::_foreach_add_", "Scalar", [[T(t) for t in ts], 2.0], outputs=[])
    outs = [pm.out([3]) for _ in range(3)]
    pm.op("aten::_foreach_mul", "Scalar", [[T(t) for t in ts], 3.0], outputs=[[T(o) for o in outs]])
    cat = pm.out([9])
    pm.op("aten::cat", "default", [[T(o) for o in outs], 0], outputs=[T(cat)])
    pm.op("aten::sum", "default", [T(cat)])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()
    assert [s.state for s in e.status] == ["replayed"] * 4
    assert all(e._external[t].tolist() == [2.0, 2.0, 2.0] for t in ts)
    assert e.counts()["fallbacks"] == 0


def test_record_stream_is_a_noop_and_collectives_are_skipped_and_counted():
    pm = PlanMaker("cuda:0")
    x = pm.tensor(pm.storage(16), [4])
    y = pm.out([4])
    pm.op("aten::record_stream", "default", [T(x), None], action="noop", reason="profiler/stream bookkeeping")
    pm.op("c10d::allreduce_", "default", [[T(x)]], outputs=[[T(x)]], action="skip", reason="collective")
    pm.op("record_param_comms", "record_param_comms", [[T(x)], 1, "allreduce"], outputs=[T(y)],
          action="skip", reason="collective")
    z = pm.out([4])
    pm.op("aten::add", "Tensor", [T(y), T(x)], {"alpha": 1}, outputs=[T(z)])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()
    c = e.counts()
    assert c["total"] == 4 and c["replayed"] == 2 and c["noop"] == 1
    assert c["skipped"] == {"c10d::allreduce_": 1, "record_param_comms": 1}
    assert c["reasons"]["record_param_comms"] == "collective"
    assert e.status[3].state == "replayed"  # consumed a synthetic stand-in for the collective's output


def test_unavailable_custom_op_and_failing_op_are_skipped_with_reasons():
    pm = PlanMaker()
    x = pm.tensor(pm.storage(16), [4])
    y = pm.out([4])
    pm.op("fbgemm::no_such_op", "default", [T(x)], outputs=[T(y)])
    bad = pm.out([4])
    pm.op("aten::mm", "default", [T(x), T(x)], outputs=[T(bad)])  # 1-D mm raises
    z = pm.out([4])
    pm.op("aten::add", "Tensor", [T(y), T(bad)], {"alpha": 1}, outputs=[T(z)])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()
    c = e.counts()
    assert c["reasons"]["fbgemm::no_such_op"] == "custom op unavailable"
    assert c["reasons"]["aten::mm"].startswith("error: RuntimeError")
    assert e.status[2].state == "replayed"


def test_data_dependent_ops_run_and_disagreeing_results_fall_back_to_synthetic_tensors():
    pm = PlanMaker()
    x = pm.tensor(pm.storage(16 * 4, recipe={"kind": "randn"}), [16])
    nz = pm.out([3, 1], dtype="int64")  # the trace saw 3 non-zeros; synthetic data has ~16
    pm.op("aten::nonzero", "default", [T(x)], outputs=[T(nz)])
    s = pm.out([], dtype="int64")
    pm.op("aten::sum", "default", [T(nz)], outputs=[T(s)])
    pm.op("aten::item", "default", [T(s)], outputs=[None])
    pm.op("aten::_local_scalar_dense", "default", [T(s)], outputs=[None])
    u = pm.out([5])
    pm.op("aten::unique_dim", "default", [T(x), 0, True, False, False], outputs=[T(u), None, None])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()
    assert all(st.state == "replayed" for st in e.status)
    assert e.counts()["fallbacks"] >= 1


def test_trace_on_cuda_replays_on_cpu_with_device_arguments_remapped():
    pm = PlanMaker("cuda:0")
    x = pm.tensor(pm.storage(16, device="cuda:0"), [4], device="cuda:0")
    e1 = pm.out([2, 2], device="cuda:0")
    pm.op("aten::empty", "memory_format", [[2, 2]],
          {"dtype": {"dtype": "float32"}, "layout": {"layout": "strided"}, "device": {"device": "cuda:0"},
           "pin_memory": False, "memory_format": None}, outputs=[T(e1)])
    c = pm.out([4], device="cpu")
    pm.op("aten::to", "device", [T(x), {"device": "cpu"}, {"dtype": "float32"}, False, False, None], outputs=[T(c)])
    pm.op("aten::pin_memory", "default", [T(c), None], outputs=[T(c)])
    e = ex.Executor(pm.plan(), "cpu")
    assert e.map_device("cuda:0") == torch.device("cpu") and e.map_device("cuda:1") == torch.device("cpu")
    e.probe()
    assert [s.state for s in e.status] == ["replayed"] * 3
    assert e._external[x].device.type == "cpu"


def test_cpu_trace_maps_to_the_replay_device_and_cpu_stays_cpu_for_accelerator_traces():
    e = ex.Executor(PlanMaker("cpu").plan(), "meta")
    assert e.map_device("cpu") == torch.device("meta")
    g = ex.Executor(PlanMaker("cuda:0").plan(), "cpu")
    assert g.map_device("cpu") == torch.device("cpu")


def test_plan_whose_peak_exceeds_available_memory_is_refused_before_running():
    pm = PlanMaker()
    x = pm.tensor(pm.storage(1 << 50), [1 << 48])  # a PiB
    pm.op("aten::relu", "default", [T(x)])
    e = ex.Executor(pm.plan(), "cpu")
    assert e.peak_bytes() == 1 << 50
    with pytest.raises(ex.InsufficientMemory) as info:
        e.prepare()
    assert "GiB" in str(info.value) and not e._external


def test_schedule_frees_produced_storages_after_last_use():
    pm = PlanMaker()
    x = pm.tensor(pm.storage(400), [100])
    a = pm.out([100])
    pm.op("aten::relu", "default", [T(x)], outputs=[T(a)])
    b = pm.out([100])
    pm.op("aten::relu", "default", [T(a)], outputs=[T(b)])  # a is dead after this op
    c = pm.out([100])
    pm.op("aten::relu", "default", [T(b)], outputs=[T(c)])
    s = ex.schedule(pm.plan())
    assert s["external_bytes"] == 400
    assert s["peak_bytes"] == 400 + 800  # never all three intermediates at once
    e = ex.Executor(pm.plan(), "cpu")
    e.prepare()
    assert e._compiled[1].free == [a] and e._compiled[2].free == [b, c]


def test_whole_iteration_and_per_op_timings_have_the_expected_shape():
    pm = PlanMaker()
    x = pm.tensor(pm.storage(64 * 64 * 4), [64, 64])
    y = pm.out([64, 64])
    pm.op("aten::mm", "default", [T(x), T(x)], outputs=[T(y)])
    pm.op("aten::record_stream", "default", [T(x), None], action="noop")
    e = ex.Executor(pm.plan(), "cpu")
    it = e.time_iterations(3, warmup=1)
    ops = e.time_ops(2)
    assert len(it) == 3 and all(t > 0 for t in it)
    assert len(ops) == 2 and ops[0] > 0 and math.isnan(ops[1])


def test_bad_plans_are_rejected():
    with pytest.raises(ex.ReplayError):
        ex.check_plan({"format": "something"})
    with pytest.raises(ex.ReplayError, match="version"):
        ex.check_plan({"format": ex.PLAN_FORMAT, "version": 99})


def test_ops_recorded_with_autograd_run_with_grad_and_fall_back_without_it():
    pm = PlanMaker()
    w = pm.tensor(pm.storage(16, recipe={"kind": "ones"}), [4])
    y = pm.out([4])
    pm.op("aten::mul", "Tensor", [T(w), T(w)], outputs=[T(y)])
    pm.ops[-1]["grad"] = True
    pm.op("aten::add_", "Tensor", [T(w), T(w)], {"alpha": 1}, outputs=[T(w)])  # a leaf that requires grad
    pm.ops[-1]["grad"] = True
    s = pm.out([])
    pm.op("aten::sum", "default", [T(y)], outputs=[T(s)])
    e = ex.Executor(pm.plan(), "cpu")
    e.prepare()
    seen = {}
    for c in e._compiled:
        def spy(v, _call=c.call, _i=c.index):
            res = _call(v)
            seen[_i] = (getattr(res, "requires_grad", None), torch.is_grad_enabled())
            return res

        c.call = spy
    e.probe()
    assert seen[0] == (True, True)  # recorded an autograd node, like the captured forward op
    assert seen[1][1] is False and e.status[1].state == "replayed"  # retried without autograd
    assert seen[2][1] is False and torch.is_grad_enabled()  # the caller's grad mode is restored
    assert e._external[w].tolist() == [2.0] * 4


def test_compiled_calls_pass_keyword_named_arguments_and_read_the_value_table():
    fn = ex.resolve_overload("aten::random_.from")
    call = ex.make_call(fn, [ex.TensorSlot(1)], {"from": 2, "to": 5, "generator": None})
    v = [None, torch.zeros(1000)]
    out = call(v)
    assert out is v[1] and 2 <= float(out.min()) and float(out.max()) < 5
    cat = ex.make_call(ex.resolve_overload("aten::cat.default"), [[ex.TensorSlot(0), ex.TensorSlot(1)]], {"dim": 0})
    assert cat([torch.ones(2), torch.zeros(3)]).tolist() == [1, 1, 0, 0, 0]


@given(low=st.integers(-1000, 10_000), size=st.integers(1, 500_000), n=st.integers(1, 3000),
       zipf=st.sampled_from([None, 0.8, 1.0, 1.05, 1.5]))
@examples(60)
def test_integer_draws_stay_in_their_range_skewed_or_not(low, size, n, zipf):
    vals = ex.draw_ints(low, low + size, n, torch.device("cpu"), zipf)
    assert vals.dtype == torch.int64 and vals.numel() == n
    assert int(vals.min()) >= low and int(vals.max()) < low + size


def test_zipf_recipe_concentrates_draws_on_few_scattered_values_like_real_categorical_data():
    buf = torch.empty(40_000, dtype=torch.int64)
    ex.fill_storage(buf, {"kind": "randint", "low": 0, "high": 100_000, "zipf": 1.05})
    counts = torch.bincount(buf, minlength=100_000).sort(descending=True).values
    assert int(counts[:1000].sum()) > 0.4 * buf.numel()  # 1% of the rows take > 40% of the lookups
    hot = torch.bincount(buf, minlength=100_000).argsort(descending=True)[:20]
    assert int((hot[1:] - hot[:-1]).abs().min()) > 1  # the popular rows are not neighbours
    flat = torch.empty(40_000, dtype=torch.int64)
    ex.fill_storage(flat, {"kind": "randint", "low": 0, "high": 100_000})
    assert int(torch.bincount(flat).sort(descending=True).values[:1000].sum()) < 0.1 * flat.numel()
    # per-view segments (one embedding table per row of a (T, N) index tensor) are skewed too
    seg = torch.empty(2 * 5000, dtype=torch.int64)
    ex.fill_storage(seg, {"kind": "randint", "low": 0, "high": 50, "zipf": 1.05,
                          "segments": [[0, 5000, 1, 0, 50_000], [5000, 5000, 1, 0, 7]]})
    assert int(seg[:5000].max()) < 50_000 and int(seg[5000:].max()) < 7
    assert torch.unique(seg[:5000]).numel() < 0.6 * 5000


def test_cpu_replay_primes_the_host_allocator_with_the_largest_storage_first(monkeypatch):
    """A fresh replay process frees one block as large as the plan's largest storage before it runs,
    so that glibc recycles large intermediates from its heap as the captured (long-lived) process
    did, instead of faulting their pages in every iteration."""
    calls = []
    monkeypatch.setattr(executor_module, "prime_host_allocator", lambda n: calls.append(n))
    pm = PlanMaker()
    x = pm.tensor(pm.storage(4 * 1000), [1000])
    y = pm.out([3000])
    pm.op("aten::repeat", "default", [T(x), [3]], outputs=[T(y)])
    ex.Executor(pm.plan(), "cpu").prepare()
    assert calls == [12_000]
    ex.Executor(pm.plan(), "meta").prepare()
    assert calls == [12_000]  # not for the meta device (nor accelerators)
    monkeypatch.undo()
    ex.prime_host_allocator(64 << 20)  # capped below glibc's 32 MiB limit: allocates and frees, no error


# ---------------------------------------------------------------------------------------------
# the compiled iteration, Python bindings and pacing


class _Dispatched:
    """Records every operator that reaches the dispatcher's Python key, with its arguments' metadata."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        calls = self.calls = []

        def key(v):
            if isinstance(v, torch.Tensor):
                return ("T", tuple(v.shape), tuple(v.stride()), v.dtype, v.requires_grad)
            if isinstance(v, (list, tuple)):
                return tuple(key(e) for e in v)
            return repr(v)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                calls.append((str(func), key(list(args)), key(kwargs), torch.is_grad_enabled()))
                return func(*args, **kwargs)

        self.mode = Mode()


def _mixed_plan() -> dict:
    """In-place ops on aliased views, out=, foreach, a tuple result, a data-dependent shape, a
    derived view of a produced storage, an op with autograd, a no-op, a skip and a failing op."""
    pm = PlanMaker()
    s = pm.storage(8 * 4, recipe={"kind": "ones"})
    whole = pm.tensor(s, [8])
    half = pm.tensor(s, [4], offset=4)
    pm.op("aten::add_", "Tensor", [T(half), T(half)], {"alpha": 1}, outputs=[T(half)])
    a = pm.tensor(pm.storage(4 * 4, recipe={"kind": "ones"}), [2, 2])
    dest = pm.tensor(pm.storage(4 * 4, recipe={"kind": "zeros"}), [2, 2])
    pm.op("aten::mm", "out", [T(a), T(a)], {"out": T(dest)}, outputs=[T(dest)])
    ts = [pm.tensor(pm.storage(3 * 4, recipe={"kind": "zeros"}), [3]) for _ in range(2)]
    pm.op("aten::_foreach_add_", "Scalar", [[T(t) for t in ts], 2.0], outputs=[])
    outs = [pm.out([3]) for _ in range(2)]
    pm.op("aten::_foreach_mul", "Scalar", [[T(t) for t in ts], 3.0], outputs=[[T(o) for o in outs]])
    cat = pm.out([6])
    pm.op("aten::cat", "default", [[T(o) for o in outs], 0], outputs=[T(cat)])
    vals, idx = pm.out([2]), pm.out([2], dtype="int64")
    pm.op("aten::max", "dim", [T(dest), 1, False], outputs=[T(vals), T(idx)])
    nz = pm.out([3, 1], dtype="int64")  # recorded 3 non-zeros: the result disagrees, a synthetic stand-in
    pm.op("aten::nonzero", "default", [T(whole)], outputs=[T(nz)])
    p = pm.out([8])
    pm.op("aten::clone", "default", [T(whole)], outputs=[T(p)])
    dv = pm.tensor(pm.tensors[p]["storage"], [4], offset=4, source="derived")
    r = pm.out([4])
    pm.op("aten::relu", "default", [T(dv)], outputs=[T(r)])
    g = pm.out([4])
    pm.op("aten::mul", "Tensor", [T(half), T(r)], outputs=[T(g)])
    pm.ops[-1]["grad"] = True
    pm.op("aten::record_stream", "default", [T(g), None], action="noop")
    y = pm.out([4])
    pm.op("fbgemm::no_such_op", "default", [T(g)], outputs=[T(y)])
    bad = pm.out([4])
    pm.op("aten::mm", "default", [T(r), T(r)], outputs=[T(bad)])  # 1-D mm raises: skipped
    z = pm.out([4])
    pm.op("aten::add", "Tensor", [T(y), T(bad)], {"alpha": 1}, outputs=[T(z)])
    pm.op("aten::sum", "default", [T(z)], outputs=[])
    pm.op("aten::sum", "default", [T(cat)], outputs=[])
    pm.op("aten::sum", "default", [T(vals)], outputs=[])
    pm.op("aten::sum", "default", [T(nz)], outputs=[])
    pm.op("aten::sum", "default", [T(p)], outputs=[])
    return pm.plan()


def test_compiled_iteration_dispatches_exactly_what_the_per_op_loop_does():
    runs = {}
    for fast in (False, True):
        torch.manual_seed(0)
        e = ex.Executor(_mixed_plan(), "cpu", seed=0)
        e.fast = fast
        e.probe()
        rec = _Dispatched()
        with rec.mode:
            e.run_iteration()
        e.run_iteration()
        runs[fast] = (e, rec.calls)
    (slow, slow_calls), (fast, fast_calls) = runs[False], runs[True]
    assert fast._fast_fn is not None and fast._fast_failures == 0 and slow._fast_fn is None
    assert fast_calls == slow_calls and len(fast_calls) >= 15  # same ops, same shapes, strides, grad modes
    assert [(s.state, s.reason) for s in fast.status] == [(s.state, s.reason) for s in slow.status]
    assert [s.state for s in fast.status].count("skipped") == 2
    for tid, t in slow._external.items():  # in-place updates of the inputs (aliased views included)
        assert torch.equal(fast._external[tid], t), tid
    kinds = {fast.plan["ops"][c.index]["op"]: c.fast for c in fast._compiled}
    assert kinds["aten::_foreach_mul.Scalar"] == "unpack" and kinds["aten::max.dim"] == "unpack"
    assert kinds["aten::nonzero.default"] == "checked" and kinds["aten::clone.default"] == "single"


def test_ops_call_the_python_binding_only_where_it_dispatches_the_recorded_overload():
    def meta(tid):
        return torch.empty(4, device="meta")

    S = ex.TensorSlot
    assert ex.python_binding(torch.ops.aten.add.Tensor, [S(0), S(1)], {"alpha": 1}, meta) is torch.add
    assert ex.python_binding(torch.ops.aten.view.default, [S(0), [2, 2]], {}, meta) is torch._C.TensorBase.view
    # torch.add(x, 2.0) would call add.Tensor with a wrapped number, not the recorded add.Scalar
    assert ex.python_binding(torch.ops.aten.add.Scalar, [S(0), 2.0], {"alpha": 1}, meta) is None
    # the binding returns the list, the overload returns nothing: not the same call
    assert ex.python_binding(torch.ops.aten._foreach_add_.Scalar, [[S(0), S(1)], 1.0], {}, meta) is None
    assert ex.python_binding(torch.ops.aten.nonzero.default, [S(0)], {}, meta) is None  # no meta kernel
    pm = PlanMaker()
    x = pm.tensor(pm.storage(16), [4])
    y = pm.out([4])
    pm.op("aten::add", "Tensor", [T(x), T(x)], {"alpha": 1}, outputs=[T(y)])
    e = ex.Executor(pm.plan(), "cpu")
    e.prepare()
    assert e._compiled[0].direct is torch.add


def test_an_op_failing_in_a_compiled_iteration_reruns_it_through_the_per_op_loop():
    pm = PlanMaker()
    x = pm.tensor(pm.storage(16, recipe={"kind": "zeros"}), [4])
    pm.op("aten::add_", "Scalar", [T(x), 1.0], {"alpha": 1}, outputs=[T(x)])
    e = ex.Executor(pm.plan(), "cpu")
    e.probe()

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    e._compiled[0].direct = boom  # only the compiled iteration calls it
    e.run_iteration()
    assert e._fast_failures == 1 and e._fast_fn is None
    assert e._external[x].tolist() == [2.0] * 4  # the probe and the rerun, once each
    assert e.status[0].state == "replayed"


def _gapped_plan(gaps_us) -> dict:
    pm = PlanMaker()
    x = pm.tensor(pm.storage(16), [4])
    prev = x
    for g in gaps_us:
        y = pm.out([4])
        pm.op("aten::add", "Tensor", [T(prev), T(x)], {"alpha": 1}, outputs=[T(y)])
        pm.ops[-1]["gap_us"] = g
        prev = y
    pm.op("aten::sum", "default", [T(prev)], outputs=[])
    return pm.plan()


def test_recorded_pacing_waits_at_least_the_recorded_gaps_before_each_op():
    import time

    gaps = [None] + [2000.0] * 10  # 20 ms of recorded host gaps; the first op has none
    e = ex.Executor(_gapped_plan(gaps), "cpu", pacing="recorded")
    assert e.pacing == "recorded" and e.paced_ops == 10 and e.pacing_gap_us == 20_000.0
    for _ in range(2):  # the probe (per-op loop), then the compiled iteration
        t0 = time.perf_counter()
        e.run_iteration()
        assert time.perf_counter() - t0 >= 0.020
    assert e._fast_fn is not None and "_clock()" in e.iteration_source()[0]
    t0 = time.perf_counter()
    e.time_iterations(1)
    assert time.perf_counter() - t0 >= 0.020
    plain = ex.Executor(_gapped_plan(gaps), "cpu")  # pacing "none": the gaps are not waited for
    assert plain.pacing == "none" and plain.paced_ops == 0 and plain.pacing_gap_us == 0.0
    plain.probe()
    plain.run_iteration()
    assert "_clock()" not in plain.iteration_source()[0]
    no_gaps = ex.Executor(_gapped_plan([None, -5.0, float("nan")]), "cpu", pacing="recorded")
    assert no_gaps.pacing == "recorded" and no_gaps.paced_ops == 0 and no_gaps.pacing_gap_us == 0.0


def test_unknown_pacing_is_refused_with_the_choices():
    with pytest.raises(ex.ReplayError, match="unknown pacing 'fast'.*none, recorded"):
        ex.Executor(_gapped_plan([None]), "cpu", pacing="fast")
    with pytest.raises(ValueError):
        ex.Executor(_gapped_plan([None]), "cpu", pacing="")


def test_steady_host_allocator_serves_large_blocks_without_fresh_page_faults():
    """Inside its scope, freeing and reallocating a 64 MiB host tensor touches no new pages: the block
    comes back from a heap that is never trimmed instead of a fresh mmap (glibc; elsewhere it says None)."""
    import resource
    import subprocess
    import sys

    code = (
        "import resource, torch\n"
        "from mystique.replay.runtime import steady_host_allocator\n"
        "import sys\n"
        "scope = steady_host_allocator() if sys.argv[1] == '1' else None\n"
        "said = scope.__enter__() if scope is not None else 'off'\n"
        "def faults():\n"
        "    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(5):\n"
        "        t = torch.empty(64 << 20, dtype=torch.uint8); t.fill_(1); del t\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0\n"
        "faults()\n"
        "print(said is not None, faults())\n"
    )
    del resource
    runs = {}
    for on in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", code, on], capture_output=True, text=True, check=True)
        ok, n = out.stdout.split()
        runs[on] = (ok == "True", int(n))
    if not runs["1"][0]:
        pytest.skip("this C library has no glibc mallopt")
    pages = 5 * (64 << 20) // 4096
    assert runs["0"][1] > pages // 2  # the default: a fresh mmap, faulted in, each time
    assert runs["1"][1] < pages // 100  # steady: the same heap pages again
