"""The correctness validator under an emulated CUDA device (issue 17, cause 5).

A healthy H100 returned ``embedding_bag``'s ``offset2bag`` with one entry per index where the CPU
returns an empty tensor, and every DLRM run reported 18 false failures. :mod:`mystique.emulation.embedding_bag`
reproduces CUDA's auxiliary outputs; :mod:`mystique.validators.correctness.semantics` is the one
table of outputs whose contents are backend-specific. Here: the emulation matches a port of CUDA's
kernels and keeps training bit-identical, the validator passes DLRM under it, and corrupting an
output with defined semantics (``embedding_bag``'s output 0, or any output the table does not
exclude) is still caught at the corrupted op.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mystique.validators import correctness
from mystique.validators.correctness import benchmarks, engine, semantics
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.emulation import embedding_bag as eb
from mystique.emulation.mode import EmulationMode
from mystique.targets import Target, make_target

A = torch.ops.aten


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


def _bad(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"].isin(("fail", "error"))]


def _rows(df: pd.DataFrame, check: str) -> pd.DataFrame:
    return df[df["check"] == check].set_index("subject")


# ----------------------------------------------------------------------------------------------
# The emulation against a port of CUDA's forward kernels


def _cuda_kernels(weight, indices, offsets, mode, include_last_offset, padding_idx):
    """EmbeddingBag_updateOutputKernel_sum_mean / _max of cuda/EmbeddingBag.cu, one thread per
    (bag, feature), accumulating in float32 (acc_type of float, half and bfloat16) and rounding once:
    (output, offset2bag, bag_size, max_indices); memory the kernels leave unwritten is 0."""
    idx, off = indices.tolist(), offsets.tolist()
    n, m, d = len(idx), len(off), weight.size(1)
    nbags = m - 1 if include_last_offset else m
    w = weight.float().numpy()
    out = np.zeros((max(nbags, 0), d), dtype=np.float32)
    offset2bag, bag_size = [0] * n, [0] * m
    max_indices = [[0] * d for _ in range(max(nbags, 0))]
    for bag in range(nbags):
        begin = 0 if bag == 0 else off[bag]
        end = off[bag + 1] if bag < nbags - 1 else n
        for f in range(d):
            acc, best, word, size = np.float32(0), np.float32(0), -1, 0
            for e in range(begin, end):
                pad = idx[e] == padding_idx
                value = np.float32(0) if (pad and mode != 2) else w[idx[e], f]
                if mode == 2:
                    if size == 0 or value > best:
                        best = best if pad else value
                        word = word if pad else idx[e]
                else:
                    acc = np.float32(acc + value)
                size += 0 if pad else 1
                if f == 0:
                    offset2bag[e] = bag
            if mode == 1 and size:
                acc = np.float32(acc / np.float32(size))
            bag_size[bag] = size
            max_indices[bag][f] = word
            out[bag, f] = best if mode == 2 else acc
    dt = torch.promote_types(indices.dtype, offsets.dtype)
    mi = torch.tensor(max_indices, dtype=dt).reshape(max(nbags, 0), d) if mode == 2 else torch.empty(0, dtype=dt)
    return (torch.from_numpy(out).to(weight.dtype), torch.tensor(offset2bag, dtype=dt), torch.tensor(bag_size, dtype=dt),
            mi)


@pytest.mark.parametrize("op", ["_embedding_bag", "_embedding_bag_forward_only"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 3])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_emulated_embedding_bag_returns_what_cudas_kernels_return(op, mode, padding_idx, include_last_offset, dtype):
    g = torch.Generator().manual_seed(mode * 7 + padding_idx + 11 * include_last_offset)
    weight = torch.randn(12, 5, generator=g).to(dtype)
    indices = torch.randint(0, 12, (23,), generator=g)
    indices[[5, 6]] = 3  # bag 3 (indices 4..7) also holds padding rows, bag 4 (8..9) padding only
    indices[8:10] = 3
    offsets = torch.tensor([0, 2, 2, 4, 8, 10, 17], dtype=torch.int32)  # bag 1 empty; int32 offsets are promoted
    if include_last_offset:  # CSR: the last offset is the number of indices (the same 7 bags)
        offsets = torch.cat([offsets, torch.tensor([23], dtype=torch.int32)])
    fn = getattr(A, op)
    host = fn(weight, indices, offsets, False, mode, False, None, include_last_offset, padding_idx)
    with EmulationMode("cuda", eb.DIFFERENCES):
        emu = fn(weight, indices, offsets, False, mode, False, None, include_last_offset, padding_idx)
    cuda = _cuda_kernels(weight, indices, offsets, mode, include_last_offset, padding_idx)
    assert torch.equal(emu[0], cuda[0]) and emu[0].dtype == host[0].dtype == dtype
    if dtype == torch.float32 or mode == 2:  # the host's bits: both sum each bag in index order in float32
        assert torch.equal(emu[0], host[0])
    else:  # rounded once in bfloat16: within an ulp of the host's
        assert torch.allclose(emu[0].float(), host[0].float(), rtol=2 ** -7, atol=2 ** -7)
    for j in (1, 2, 3):
        assert emu[j].dtype == cuda[j].dtype == torch.int64, j
        assert emu[j].shape == cuda[j].shape and torch.equal(emu[j], cuda[j]), (j, emu[j], cuda[j])
    assert any(emu[j].shape != host[j].shape or not torch.equal(emu[j], host[j]) for j in (1, 2, 3))


def test_emulated_embedding_bag_out_variant_and_odd_calls():
    weight, indices, offsets = torch.randn(6, 3), torch.tensor([0, 5, 2, 2]), torch.tensor([0, 1, 1])
    outs = [torch.empty(0), *(torch.empty(0, dtype=torch.int64) for _ in range(3))]
    with EmulationMode("cuda", eb.DIFFERENCES):
        res = A._embedding_bag.out(weight, indices, offsets, False, 2, out0=outs[0], out1=outs[1], out2=outs[2],
                                   out3=outs[3])
        two_d = A._embedding_bag(weight, indices.view(2, 2), torch.tensor([0, 2]), False, 0)
    cuda = _cuda_kernels(weight, indices, offsets, 2, False, -1)
    assert all(r is o for r, o in zip(res, outs))
    assert all(torch.equal(o, c) for o, c in zip(outs, cuda))
    assert torch.equal(outs[3][1], torch.tensor([-1, -1, -1]))  # the empty bag
    host = A._embedding_bag(weight, indices.view(2, 2), torch.tensor([0, 2]), False, 0)
    assert all(torch.equal(a, b) for a, b in zip(two_d, host))  # 2-d indices: left to the host


# ----------------------------------------------------------------------------------------------
# Training under the emulation: the CPU's backward kernels accept CUDA's auxiliary outputs


def _grads(model: torch.nn.Module, loss_fn, emulate: bool) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    if emulate:
        with EmulationMode("cuda", eb.DIFFERENCES):
            loss_fn(model).backward()
    else:
        loss_fn(model).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def test_dlrm_train_step_under_emulation_gives_the_hosts_gradients():
    from mystique import workloads

    mod = workloads.get("dlrm")
    cfg = mod.CONFIGS["debug"]
    model = mod.build_model(cfg, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    batch = mod.make_batch(cfg, device=torch.device("cpu"), seed=0)
    host = _grads(model, lambda m: mod.loss(m, batch), emulate=False)
    emu = _grads(model, lambda m: mod.loss(m, batch), emulate=True)
    assert set(host) == set(emu) and any("emb_l" in k for k in host)
    for k in host:
        assert torch.equal(host[k], emu[k]), k
    # the emulation was in force: the same call returns CUDA's offset2bag there
    w, i, o = model.emb_l[0].weight.detach(), batch["indices"][0], batch["offsets"][0]
    with EmulationMode("cuda", eb.DIFFERENCES):
        aux = A.embedding_bag.padding_idx(w, i, o, False, 0, False, None, False, None)
    assert aux[1].shape == i.shape and A.embedding_bag.padding_idx(w, i, o, False, 0, False, None, False, None)[1].numel() == 0


@pytest.mark.parametrize("mode", ["mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_mean_and_max_bags_with_padding_train_identically_under_emulation(mode, include_last_offset):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 4, mode=mode, padding_idx=2, include_last_offset=include_last_offset)
    indices = torch.tensor([1, 2, 2, 7, 2, 4, 4, 9, 0, 3])
    offsets = torch.tensor([0, 3, 3, 5, 8, 10] if include_last_offset else [0, 3, 3, 5, 8])
    host = _grads(bag, lambda m: (m(indices, offsets) ** 2).sum(), emulate=False)
    emu = _grads(bag, lambda m: (m(indices, offsets) ** 2).sum(), emulate=True)
    assert torch.equal(host["weight"], emu["weight"]) and host["weight"].abs().sum() > 0


# ----------------------------------------------------------------------------------------------
# The validator on DLRM under emulated CUDA


def test_dlrm_under_emulated_cuda_reports_no_false_failure(tmp_path):
    target = make_target("cpu", None, "cuda")
    # the emulation is in force on the target: CUDA's offset2bag, unlike the CPU reference's
    w, i, o = torch.randn(100, 8), torch.randint(0, 100, (48,)), torch.arange(0, 48, 3)
    with target.active():
        assert A.embedding_bag.padding_idx(w, i, o, False, 0, False, None, False, None)[1].shape == (48,)
    df = correctness.run(target, seed=0, workloads="dlrm", out_dir=tmp_path)
    assert _bad(df).empty, _bad(df)[["check", "subject", "detail"]].to_string()
    table = pd.read_csv(tmp_path / "correctness_ops" / "dlrm-debug-train.csv")
    bags = table[table["name"] == "aten::embedding_bag"]
    assert len(bags) == 4 and (bags["status"] == "pass").all()
    assert bags["reason"].str.startswith("outputs 1-3 of aten::embedding_bag not compared").all()
    first = _rows(df, "first_divergent_op")
    assert set(first.index) == {"dlrm/debug/infer", "dlrm/debug/infer/bfloat16", "dlrm/debug/train"}
    assert (first["status"] == "pass").all()
    compared = _rows(df, "ops_compared")
    assert (compared["status"] == "info").all()  # a measurement, not a check
    assert compared["detail"].str.contains("outputs 1-3 of aten::embedding_bag not compared").all()
    rows = df[df["subject"].str.endswith(":aten::embedding_bag")]
    assert len(rows) and rows["detail"].str.contains(
        "outputs 1-3 of aten::embedding_bag not compared: offset2bag/bag_size/max_indices are backend-specific").all()


class _CorruptOutput(TorchDispatchMode):
    """Adds 1 to every element of output ``j`` of every call of ``ops`` (an index output: ``(i + 1) % 4``,
    another row or window position), on top of the emulated device's kernels."""

    ops: frozenset[str] = frozenset()
    j = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in self.ops:
            return out
        res = list(out)
        bad = res[self.j]
        res[self.j] = bad + 1.0 if bad.dtype.is_floating_point else (bad + 1) % 4
        return tuple(res)


def _fault(ops: set[str], j: int) -> type:
    return type("Fault", (_CorruptOutput,), {"ops": frozenset(ops), "j": j})


def test_a_wrong_embedding_bag_output_0_is_still_caught(tmp_path):
    target = Target("cpu", _fault(eb.OPS, 0), "eb_out0", "cuda")
    df = correctness.run(target, seed=0, groups=["operator_replay"], workloads="dlrm")
    first = _rows(df, "first_divergent_op")
    assert (first["status"] == "fail").all() and len(first) == 3
    for subject, row in first.iterrows():
        _w, _c, mode, *dtype = subject.split("/")
        plan = benchmarks.reference("dlrm", "debug", mode, dtype[0] if dtype else "float32", tmp_path).plan
        idx = next(op["index"] for op in plan["ops"] if op["name"] == "aten::embedding_bag")
        assert int(row["value"]) == idx
        assert f"op {idx} aten::embedding_bag" in row["detail"] and ": output 0 " in row["detail"]
    worst = df[(df["check"] == "op_error_vs_fp64") & (df["status"] == "fail")]
    assert len(worst) and worst["subject"].str.endswith(":aten::embedding_bag").all()


# ----------------------------------------------------------------------------------------------
# A benchmark of multi-output operators called directly (recorded at the top level)


def aux_ops():
    """Capture target: embedding_bag (max), max_pool2d_with_indices, native_layer_norm,
    native_batch_norm (training), sort, topk, each called as the aten op."""
    torch.manual_seed(0)
    w, idx = torch.randn(20, 6), torch.randint(0, 20, (30,))
    off = torch.tensor([0, 4, 4, 11, 20, 26])
    x = torch.randn(2, 3, 8, 8)
    ln_w, ln_b, bn_w, bn_b = torch.randn(8), torch.randn(8), torch.randn(3), torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    v = torch.randn(4, 9)

    def step():
        with torch.no_grad():
            e = A._embedding_bag(w, idx, off, False, 2, False, None, False, 3)
            p = A.max_pool2d_with_indices(x, [2, 2], [2, 2])
            n = A.native_layer_norm(x, [8], ln_w, ln_b, 1e-5)
            b = A.native_batch_norm(x, bn_w, bn_b, rm, rv, True, 0.1, 1e-5)
            s = A.sort(v, 1)
            t = A.topk(v, 3, 1)
            return sum(r[0].sum() for r in (e, p, n, b, s, t))

    return step


@pytest.fixture(scope="module")
def aux_bench(tmp_path_factory) -> Path:
    from mystique.capture import capture
    from mystique.progress import set_enabled
    from mystique.replay import generate

    set_enabled(False)
    root = tmp_path_factory.mktemp("aux")
    capture(f"{__name__}:aux_ops", root / "trace", steps=1, warmup=0)
    generate(str(root / "trace"), str(root / "aux_bench"), formats="json")
    set_enabled(True)
    return root / "aux_bench"


def _index_of(bench: Path, op: str) -> int:
    return next(o["index"] for o in benchmarks.load(bench).plan["ops"] if o["op"].split(".")[0] == f"aten::{op}")


def test_aux_ops_pass_under_emulation_and_name_their_rules(aux_bench):
    df = correctness.run(make_target("cpu", None, "cuda"), benchmark=aux_bench, groups=["operator_replay",
                                                                                      "repeatability"])
    assert _bad(df).empty, _bad(df)[["check", "subject", "detail"]].to_string()
    table = engine.lockstep(benchmarks.load(aux_bench).plan, make_target("cpu", None, "cuda"), "cpu", 0)
    notes = {r.name: r.excluded for r in table if r.excluded}
    assert "outputs 1-2 of aten::_embedding_bag not compared" in notes["aten::_embedding_bag"]
    assert "output 3 of aten::_embedding_bag compared by the input values selected: max_indices" \
        in notes["aten::_embedding_bag"]  # mode max: the argmax rows are compared
    assert "outputs 1-2 of aten::native_layer_norm compared in the reference's dtype: mean/rstd" \
        in notes["aten::native_layer_norm"]
    assert "save_mean/save_invstd" in notes["aten::native_batch_norm"]
    assert "output 1 of aten::max_pool2d_with_indices compared by the input values selected" \
        in notes["aten::max_pool2d_with_indices"]
    assert {r.outputs_compared for r in table if r.name == "aten::native_layer_norm"} == {3}
    assert {r.outputs_compared for r in table if r.name == "aten::_embedding_bag"} == {2}


@pytest.mark.parametrize("op,j", [("_embedding_bag", 0), ("_embedding_bag", 3), ("max_pool2d_with_indices", 1),
                                  ("native_layer_norm", 2), ("native_batch_norm", 1), ("sort", 1), ("topk", 1)])
def test_a_wrong_output_the_table_does_not_exclude_is_caught(aux_bench, op, j):
    df = correctness.run(Target("cpu", _fault({op}, j), f"bad_{op}_{j}", "cuda"), benchmark=aux_bench,
                         groups=["operator_replay"])
    first = _rows(df, "first_divergent_op").loc["aux_bench"]
    idx = _index_of(aux_bench, op)
    assert first["status"] == "fail" and int(first["value"]) == idx, first["detail"]
    assert f"output {j} " in first["detail"] and "1 of " in first["detail"]  # that op alone


def test_a_changed_excluded_output_is_not_reported(aux_bench):
    df = correctness.run(Target("cpu", _fault({"_embedding_bag"}, 1), "bag_o2b", "cuda"), benchmark=aux_bench,
                         groups=["operator_replay"])
    assert _rows(df, "first_divergent_op").loc["aux_bench", "status"] == "pass"


class _Drifting(TorchDispatchMode):
    """Output ``j`` of ``_embedding_bag`` changes from call to call (like memory a kernel leaves unwritten)."""

    j = 1
    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ != "_embedding_bag":
            return out
        type(self).calls += 1
        res = list(out)
        res[self.j] = res[self.j] + type(self).calls
        return tuple(res)


@pytest.mark.parametrize("j,differs", [(1, False), (2, False), (0, True)])
def test_repeatability_ignores_excluded_outputs_only(aux_bench, j, differs):
    mode = type("Drift", (_Drifting,), {"j": j, "calls": 0})
    df = correctness.run(Target("cpu", mode, f"drift{j}", "cuda"), benchmark=aux_bench, groups=["repeatability"],
                         workloads="dlrm")
    row = _rows(df, "replay_repeatability").loc["aux_bench"]
    assert mode.calls >= 2 and (row["status"] == "fail") == differs, row["detail"]
    if differs:
        assert f"op {_index_of(aux_bench, '_embedding_bag')} aten::_embedding_bag" in row["detail"]


# ----------------------------------------------------------------------------------------------
# The rules themselves


def test_ties_pass_and_wrong_indices_fail_when_compared_by_selected_values():
    x = torch.tensor([[[[1.0, 3.0], [3.0, 0.0]]]])  # one 2x2 window, maximum 3 at positions 1 and 2
    out, first = A.max_pool2d_with_indices(x, [2, 2], [2, 2])
    plan = semantics.output_plan("aten::max_pool2d_with_indices.default", engine.op_spec(
        {"index": 0, "op": "aten::max_pool2d_with_indices.default"}).schema, (out, first), (), [x, [2, 2], [2, 2]], {})
    assert first.item() == 1
    t, r = plan.prepare(1, torch.tensor([[[[2]]]]), first)
    assert torch.equal(t, r)  # the other maximum
    for wrong in (0, 3, 4, -1):  # another value, or out of range
        t, r = plan.prepare(1, torch.tensor([[[[wrong]]]]), first)
        assert not torch.equal(t, r), wrong


def test_embedding_bag_max_indices_of_empty_bags_are_not_compared():
    weight = torch.randn(6, 2)
    indices, offsets = torch.tensor([1, 4, 4, 2]), torch.tensor([0, 2, 2, 3])
    cpu = A._embedding_bag(weight, indices, offsets, False, 2, False, None, False, 2)  # bag 3 holds padding only
    with EmulationMode("cuda", eb.DIFFERENCES):
        cuda = A._embedding_bag(weight, indices, offsets, False, 2, False, None, False, 2)
    assert not torch.equal(cpu[3], cuda[3])  # 0 vs -1 in bags 1 and 3
    schema = engine.op_spec({"index": 0, "op": "aten::_embedding_bag.default"}).schema
    args = [weight, indices, offsets, False, 2, False, None, False, 2]
    plan = semantics.output_plan("aten::_embedding_bag.default", schema, cpu, (), args, {})
    assert [plan.excluded(j) for j in range(4)] == [False, True, True, False]
    t, r = plan.prepare(3, cuda[3], cpu[3])
    assert torch.equal(t, r)
    wrong = cuda[3].clone()
    wrong[0, 0] = 3  # row 3 is not in bag 0
    t, r = plan.prepare(3, wrong, cpu[3])
    assert not torch.equal(t, r)
    summed = semantics.output_plan("aten::_embedding_bag.default", schema, cpu, (), [*args[:4], 0, *args[5:]], {})
    assert [summed.excluded(j) for j in range(4)] == [False, True, True, True]


def test_saved_statistics_are_compared_in_the_references_dtype_in_training_only():
    x = torch.randn(4, 3, 5, dtype=torch.bfloat16)
    w, b = torch.ones(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)
    spec = engine.op_spec({"index": 0, "op": "aten::native_batch_norm.default"})
    for training, excluded in ((True, False), (False, True)):
        args = [x, w, b, torch.zeros(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16), training, 0.1, 1e-5]
        res = A.native_batch_norm(*args)
        plan = semantics.output_plan(spec.qualified, spec.schema, res, spec.mutated, args, {})
        assert [plan.excluded(j) for j in range(len(plan.rules))][:3] == [False, excluded, excluded]
    args = [x, w, b, torch.zeros(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16), True, 0.1, 1e-5]
    res = A.native_batch_norm(*args)
    plan = semantics.output_plan(spec.qualified, spec.schema, res, spec.mutated, args, {})
    cuda_style = res[1].float()  # CUDA keeps batch statistics in float32 for half inputs
    t, r = plan.prepare(1, cuda_style, res[1])
    assert t.dtype == r.dtype == torch.bfloat16 and torch.equal(t, r)
    ln = engine.op_spec({"index": 0, "op": "aten::native_layer_norm.default"})
    plan = semantics.output_plan(ln.qualified, ln.schema, A.native_layer_norm(x, [5], None, None, 1e-5), (),
                                 [x, [5], None, None, 1e-5], {})
    assert plan.rule(2).action == semantics.REFERENCE_DTYPE and plan.rule(0) is None


def test_dropout_draws_nothing_with_p_0_or_in_eval():
    assert engine.classify("aten::dropout.default", {"p": 0.1, "train": True}) == "random op"
    assert engine.classify("aten::dropout.default", {"p": 0.0, "train": True}) is None
    assert engine.classify("aten::native_dropout.default", {"p": 0.5, "train": False}) is None
    assert engine.classify("aten::native_dropout.default", {"p": 0.5, "train": None}) == "random op"
    assert engine.classify("aten::bernoulli_.float", {"p": 0.0}) == "random op"
    assert engine.classify("aten::dropout.default") == "random op"  # arguments unknown: a draw


def test_the_table_is_the_single_source_and_every_rule_has_a_reason():
    seen: set[str] = set()
    for e in semantics.TABLE:
        assert e.ops and e.source and not (e.ops & seen), e.ops
        seen |= e.ops
        for op in e.ops:
            packet = getattr(A, op, None)
            assert packet is not None, op
            n_returns = max(len(getattr(packet, o)._schema.returns) for o in packet.overloads())
            for r in e.rules:
                assert max(r.outputs) < n_returns, (op, r.outputs)
        for r in e.rules:
            assert r.action in semantics.ACTIONS and len(r.reason) > 20, r
            assert len(r.names) == len(r.outputs) and len(set(r.outputs)) == len(r.outputs), r
            assert 0 not in r.outputs or r.action == semantics.SELECTED, r  # a result is never excluded
            assert (r.select is not None) == (r.action == semantics.SELECTED), r
            assert (r.when is None) == (not r.condition), r
    # no other list of operators in the validator: no string literal of another module names an op of
    # the table or a dropout (the engine and the repeatability check ask semantics)
    names = seen | semantics.DROPOUTS
    root = Path(correctness.__file__).parent
    for path in root.glob("*.py"):
        if path.name == "semantics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, (path.name, node.value)
    assert engine.RANDOM_OPS is semantics.RANDOM_OPS
