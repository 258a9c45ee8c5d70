"""FBGEMM (``pip install -e '.[fbgemm]'``, ``fbgemm-gpu-cpu`` paired with torch): replay of the
``fbgemm::`` ops of DLRM traces with valid, consistent table data, the DLRM workload on FBGEMM's
TBE, and checked FBGEMM lookups (soft errors). Tests that run FBGEMM's kernels skip without it
(:func:`_need_fbgemm`); the data recipes, the argument mapping and the skip rows are tested either way."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors.abft.fbgemm import fbgemm_available

from mystique.replay import runtime as ex
from mystique.replay.plan import build_plan
from mystique.replay.recipes_fbgemm import TBE_MAX_ROWS, _widths
from mystique.replay.runtime.substitutes import _legacy_tbe_args
from mystique.trace import load_trace

DATA = Path(__file__).parent / "data" / "traces"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
PARAM_RANK0 = DATA / "dlrm_eg_0.json.gz"


def _need_fbgemm() -> None:
    """Skip unless FBGEMM imports (absent, or a release built for another torch)."""
    if not fbgemm_available():
        pytest.skip("FBGEMM is not installed or does not load with this torch (pip install -e '.[fbgemm]')")


# -- recipes and storage kinds (no FBGEMM needed) ------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 8), st.data())
def test_table_widths_add_up_to_total_d_and_none_exceeds_max_d(max_d, tables, data):
    total_d = data.draw(st.integers(tables, tables * max_d))
    widths = _widths(total_d, max_d, tables)
    assert len(widths) == tables and sum(widths) == total_d
    assert all(1 <= w <= max_d for w in widths)


@given(st.integers(1, 300), st.integers(0, 5000))
def test_lengths_recipe_gives_non_negative_lengths_summing_to_the_values(n, total):
    buf = torch.empty(n, dtype=torch.int32)
    ex.fill_storage(buf, {"kind": "lengths", "total": total})
    assert int(buf.min()) >= 0 and int(buf.sum()) == total


def test_randperm_and_values_recipes():
    buf = torch.empty(26, dtype=torch.int32)
    ex.fill_storage(buf, {"kind": "randperm"})
    assert sorted(buf.tolist()) == list(range(26))
    big = torch.empty((1 << 22) + 5, dtype=torch.int64)  # larger than the random tile: never tiled
    ex.fill_storage(big, {"kind": "values", "values": [0, 16, 32]})
    assert big[:6].tolist() == [0, 16, 32, 0, 16, 32] and big[-1].item() == [0, 16, 32][((1 << 22) + 4) % 3]


def test_legacy_lookup_arguments_map_onto_the_host_lookup():
    t = {k: torch.full((k,), k) for k in range(1, 40)}
    empty = torch.empty(0)
    legacy = (empty, t[1], empty, empty, t[4], t[5], t[6], 48, 16, t[9], 26, t[11], t[12], 0, None, None,
              empty, False, 1.0, True, t[20], empty, t[22], t[23], 0.0, 0.005, 0)
    mapped = _legacy_tbe_args(legacy)
    assert mapped[0] is t[1] and mapped[1:6] == [t[4], t[5], t[6], 48, 16]
    assert mapped[6:15] == [t[9], 26, t[11], t[12], 0, None, None, False, 1.0]
    assert mapped[15] is True and mapped[16:19] == [t[20], t[22], t[23]] and mapped[19:] == [0.0, 0.005, 0]
    uvm = (empty, empty, t[2], *legacy[3:20], empty, t[21], t[22], t[23], 0.0, 0.005, 0)  # uvm-placed tables
    assert _legacy_tbe_args(uvm)[0] is t[2] and _legacy_tbe_args(uvm)[16] is t[21]


@pytest.fixture(scope="module")
def param_rank0_plan():
    if not PARAM_RANK0.exists():
        pytest.skip(f"{PARAM_RANK0} absent")
    return build_plan(load_trace(PARAM_RANK0))


def _arg(plan, op, k):
    enc = op["args"][k]
    return plan.tensors[enc["t"]], plan.storages[plan.tensors[enc["t"]]["storage"]]["recipe"]


def test_param_dlrm_lookup_metadata_is_one_consistent_layout(param_rank0_plan):
    plan = param_rank0_plan
    op = next(o for o in plan.ops if o["name"] == "fbgemm::split_embedding_codegen_lookup_adagrad_function")
    weights, _ = _arg(plan, op, 1)
    total_d, tables = op["args"][7], 3
    rows = TBE_MAX_ROWS  # the trace's 40 M rows per table are shrunk to what one host holds
    assert weights["shape"] == [rows * total_d]
    assert _arg(plan, op, 5)[1]["values"] == [0, rows * 16, rows * 32]  # weights_offsets
    assert _arg(plan, op, 6)[1]["values"] == [0, 16, 32, 48]  # D_offsets, total_D 48
    assert _arg(plan, op, 9)[1]["values"] == [rows * t for t in range(tables + 1)]  # hash_size_cumsum
    assert _arg(plan, op, 20)[0]["shape"] == weights["shape"]  # adagrad's state: one per element
    assert _arg(plan, op, 23)[1]["values"] == _arg(plan, op, 5)[1]["values"]
    indices = _arg(plan, op, 11)[1]
    assert (indices["low"], indices["high"]) == (0, rows) and indices["zipf"] > 0
    check = next(o for o in plan.ops if o["name"] == "fbgemm::bounds_check_indices")
    assert _arg(plan, check, 0)[1]["values"] == [rows]  # rows_per_table of the same tables


def test_param_dlrm_permute_gets_a_permutation_and_lengths_of_its_values(param_rank0_plan):
    plan = param_rank0_plan
    op = next(o for o in plan.ops if o["name"] == "fbgemm::permute_2D_sparse_data")
    assert _arg(plan, op, 0)[1] == {"kind": "randperm"}
    lengths = _arg(plan, op, 1)[1]
    assert lengths["kind"] == "lengths" and lengths["total"] == math.prod(_arg(plan, op, 2)[0]["shape"])


# -- FBGEMM's kernels ---------------------------------------------------------------------------


def test_param_dlrm_rank_replays_every_fbgemm_op_and_no_bounds_check_repairs(param_rank0_plan):
    _need_fbgemm()
    plan = param_rank0_plan
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    c = e.counts()
    assert not [n for n in c["skipped"] if n.startswith("fbgemm::")], c["reasons"]
    assert set(c["skipped"]) <= {"record_param_comms", "c10d::alltoall_base_", "c10d::allreduce_"}
    check = next(o for o in plan.ops if o["name"] == "fbgemm::bounds_check_indices")
    warning = check["args"][4]["t"]
    assert e._external[warning].item() == 0  # the check found nothing to repair in the replayed data


def test_legacy_adagrad_lookup_pools_rows_and_updates_them_like_fbgemm():
    _need_fbgemm()
    from mystique.replay.runtime.substitutes import legacy_substitute

    lookup = legacy_substitute("fbgemm::split_embedding_codegen_lookup_adagrad_function")
    assert lookup is not None
    g = torch.Generator().manual_seed(0)
    rows, dims, batch = 10, [4, 8], 3
    w = torch.randn(rows * sum(dims), generator=g)
    mom = torch.zeros_like(w)
    wo = torch.tensor([0, rows * dims[0]], dtype=torch.int64)
    d_off = torch.tensor([0, 4, 12], dtype=torch.int32)
    hcs = torch.tensor([0, rows, 2 * rows], dtype=torch.int64)
    indices = torch.randint(0, rows, (12,), generator=g)
    offsets = torch.tensor([0, 2, 4, 6, 8, 10, 12], dtype=torch.int64)
    place = torch.full((2,), 3, dtype=torch.int32)
    empty = torch.empty(0)
    out = lookup(empty, w, empty, empty, place, wo, d_off, 12, 8, hcs, 5, indices, offsets, 0, None, None,
                 empty.int(), False, 1.0, False, mom, empty, place, wo.clone(), 1e-8, 0.01, 0)
    assert out.shape == (batch, 12)
    for t, d in enumerate(dims):
        table = w[int(wo[t]):int(wo[t]) + rows * d].view(rows, d)
        ref = torch.nn.functional.embedding_bag(indices[6 * t:6 * t + 6], table, offsets[:3], mode="sum")
        torch.testing.assert_close(out[:, int(d_off[t]):int(d_off[t + 1])], ref)  # fp32 sums of 2 rows


@pytest.mark.slow
def test_param_dlrm_8_ranks_replay_every_collective_and_every_fbgemm_op(tmp_path, cli_run, capfd):
    _need_fbgemm()
    src = SHARED / "param__dlrm_pytorch_et.tar.gz"
    if not src.exists():
        pytest.skip(f"{src} is absent")
    members = [f"dlrm_pytorch_et/dlrm_eg_{rank}.json" for rank in range(8)]
    with tarfile.open(src) as tf:
        for m in members:
            tf.extract(m, tmp_path, filter="data")
    args = ["-q", "replay", str(tmp_path / "dlrm_pytorch_et"), "-o", str(tmp_path / "out"), "--iters", "2",
            "--warmup", "1", "--timeout", "300"]
    code, _stdout, stderr = cli_run(*args)
    assert code == 0, stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["coverage"] == 1.0 and summary["ops_skipped"] == {}
    assert summary["collectives"]["total"] == summary["collectives"]["replayed"] == 64
    assert "EmbeddingBoundsCheck" not in capfd.readouterr().err  # no rank's bounds check repaired its data


# -- the DLRM workload on FBGEMM's TBE ----------------------------------------------------------


def _steps(config: str, mode: str, seed: int = 3):
    from mystique.workloads import make_step

    _need_fbgemm()
    return make_step("dlrm", "debug", mode, seed=seed), make_step("dlrm", config, mode, seed=seed)


def test_fbgemm_dlrm_infers_the_same_clicks_as_the_embedding_bag_dlrm():
    bags, tbe = _steps("debug-fbgemm", "infer")
    # the same fp32 rows summed per bag (FBGEMM may add them in another order): within 1e-6
    torch.testing.assert_close(tbe.fn(), bags.fn(), rtol=1e-6, atol=1e-6)


def test_fbgemm_dlrm_trains_like_the_embedding_bag_dlrm_with_its_fused_sgd():
    bags, tbe = _steps("debug-fbgemm", "train")
    assert all(".emb_l." not in f".{n}" for g in tbe.optimizer.param_groups for n in g.get("names", []))
    assert sum(p.numel() for g in tbe.optimizer.param_groups for p in g["params"]) < sum(
        p.numel() for g in bags.optimizer.param_groups for p in g["params"])  # the tables are FBGEMM's
    before = [t.clone() for t in tbe.model.emb_l.tbe.split_embedding_weights()]
    for _ in range(3):
        torch.testing.assert_close(tbe.fn(), bags.fn(), rtol=1e-6, atol=1e-6)
    assert all(not torch.equal(b, t) for b, t in zip(before, tbe.model.emb_l.tbe.split_embedding_weights()))
    # SGD (lr 0.1) on the touched rows, fused into FBGEMM's backward vs torch's SGD on dense gradients:
    # the same fp32 updates, summed in another order, after 3 steps
    for bag, table in zip(bags.model.emb_l, tbe.model.emb_l.tbe.split_embedding_weights()):
        torch.testing.assert_close(table, bag.weight.detach(), rtol=0, atol=1e-6)


def test_int8_rowwise_quantization_error_is_within_its_derived_bound():
    from mystique.workloads.dlrm_fbgemm import dequantize_rows_int8, quantize_rows_int8

    g = torch.Generator().manual_seed(1)
    table = torch.randn(500, 16, generator=g) * torch.rand(500, 1, generator=g) * 3
    codes, sb = quantize_rows_int8(table)
    err = (dequantize_rows_int8(codes, sb) - table).abs()
    lo, hi = table.min(1, keepdim=True).values, table.max(1, keepdim=True).values
    scale = sb[:, :1].float()
    # half a step of the fp16 scale, plus the fp16 rounding (2^-11 relative) of the bias (|lo|) and of
    # the scale over the 255 steps of a row; fp32 arithmetic adds ~1e-7 relative
    bound = 0.5 * scale + 2.0 ** -11 * (lo.abs() + (hi - lo)) + 1e-6 * (lo.abs() + hi.abs())
    assert bool((err <= bound).all()), float((err - bound).max())


def test_int8_fbgemm_dlrm_pools_the_dequantized_rows():
    from mystique.workloads.dlrm_fbgemm import dequantize_rows_int8, quantize_rows_int8

    bags, tbe = _steps("debug-fbgemm-int8", "infer")
    ind, off = tbe.batch["indices"].long(), tbe.batch["offsets"].long()
    batch = bags.batch["offsets"].shape[1]
    got = tbe.model.emb_l(tbe.batch["indices"], tbe.batch["offsets"])
    n = bags.batch["indices"].shape[1]
    for t, bag in enumerate(bags.model.emb_l):
        table = dequantize_rows_int8(*quantize_rows_int8(bag.weight))
        bag_starts = off[t * batch:(t + 1) * batch] - t * n
        ref = torch.nn.functional.embedding_bag(ind[t * n:(t + 1) * n], table, bag_starts, mode="sum")
        torch.testing.assert_close(got[t], ref, rtol=1e-5, atol=1e-5)  # fp32 sums of the same dequantized rows


@pytest.mark.parametrize("config,mode", [("debug-fbgemm", "train"), ("debug-fbgemm", "infer"),
                                         ("debug-fbgemm-int8", "infer")])
def test_captured_fbgemm_dlrm_replays_every_op_with_valid_table_data(tmp_path, config, mode):
    from test_replay_plan import capture_et

    _bags, step = _steps(config, mode)
    plan = build_plan(load_trace(capture_et(tmp_path / "et.json", step.fn)))
    names = {op["name"] for op in plan.ops}
    lookup = ("fbgemm::split_embedding_codegen_lookup_sgd_function_pt2" if mode == "train"
              else "fbgemm::int_nbit_split_embedding_codegen_lookup_function")
    assert {lookup, "fbgemm::bounds_check_indices"} <= names
    e = ex.Executor(plan.data, "cpu")
    e.probe()
    e.run_iteration()
    c = e.counts()
    assert c["skipped"] == {} and c["replayed"] == c["total"] == len(plan.ops)
    check = next(o for o in plan.ops if o["name"] == "fbgemm::bounds_check_indices")
    assert e._external[check["args"][4]["t"]].item() == 0  # nothing out of bounds to repair


# -- soft errors: checked FBGEMM lookups ----------------------------------------------------------


def test_checked_fbgemm_lookups_pass_clean_and_catch_a_flipped_code_bit():
    _need_fbgemm()
    from mystique.validators import soft_errors

    from mystique.targets import Target

    df = soft_errors.run(Target("cpu"), groups=["abft_fbgemm"])
    checks = df[df.metric.isin(["clean_alarm", "injected_detected"])]
    tables = checks[checks.subject.str.startswith("fbgemm_")]
    assert len(tables) == 8 and (checks.status == "pass").all(), checks.detail.tolist()  # 8/4-bit x sum/mean
    # and the table-batched modules (training fp32, inference 8-bit) under CheckedTBE
    assert sorted(checks[checks.subject.str.startswith("tbe_")].subject) == ["tbe_fp32_sum"] * 2 + ["tbe_int8_sum"] * 2
    torch_mean = df[df.subject == "torch_8bit_mean"].iloc[0]
    assert torch_mean.status == "info" and "FBGEMM's MEAN lookup" in torch_mean.detail


#: what a hypothesis example flips in a looked-up row: the top bit of code byte 0, or bit 14 (the top exponent
#: bit) of the fp16 scale or bias (byte 1 or 3 of the row's scale_shift, little-endian)
_FLIPS = {"code": (None, 0, 0x80), "scale": ("sb", 1, 0x40), "bias": ("sb", 3, 0x40)}


@examples(30)
@given(st.sampled_from((8, 4)), st.sampled_from(("sum", "mean")), st.sampled_from((8, 16, 24, 64)),
       st.lists(st.integers(0, 7), min_size=1, max_size=12), st.sampled_from(sorted(_FLIPS)), st.data())
def test_the_compiled_fbgemm_check_decides_as_the_torch_path_clean_and_with_a_flipped_row(bits, mode, d, lengths,
                                                                                          flip, data):
    """The compiled check of a checked FBGEMM lookup (one kernel over the int32 indices FBGEMM was given)
    against the torch path (``_kernels.disabled()``): no alarm on a clean lookup, and a flipped code, scale
    or bias bit of a looked-up row raises the alarm in the bag that looked it up, with the same bags."""
    _need_fbgemm()
    from mystique.validators.soft_errors import _kernels
    from mystique.validators.soft_errors.abft.fbgemm import FbgemmTable, checked_fbgemm_embedding_bag

    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    rows = data.draw(st.integers(1, 40), label="rows")
    table = FbgemmTable.from_float(torch.randn(rows, d, generator=g) * 3, bits, mode)
    n = sum(lengths)
    idx = torch.randint(0, rows, (n,), generator=g, dtype=data.draw(st.sampled_from((torch.int64, torch.int32))))
    off = torch.tensor([0, *lengths[:-1]]).cumsum(0).to(idx.dtype)

    def both() -> tuple:
        out, rep = checked_fbgemm_embedding_bag(table, idx, off)
        with _kernels.disabled():
            _, ref_rep = checked_fbgemm_embedding_bag(table, idx, off)
        return out, rep, ref_rep

    out, rep, ref_rep = both()
    assert not rep.alarm and not ref_rep.alarm and rep.checked, (rep.describe(), ref_rep.describe())
    assert out.shape == (len(lengths), d)
    if not n:
        return
    pos = data.draw(st.integers(0, n - 1), label="position")
    bag = int((off <= pos).nonzero().max())  # the last bag starting at or before pos: the one holding it
    packed, sb = table.tbe.split_embedding_weights(split_scale_shifts=True)[0]
    which, byte, mask = _FLIPS[flip]
    (sb if which else packed)[int(idx[pos]), byte] ^= mask
    _, rep, ref_rep = both()
    assert rep.alarm and bag in rep.rows, (flip, bag, rep.describe())
    assert rep.rows == ref_rep.rows, (rep.describe(), ref_rep.describe())


def test_a_checked_fbgemm_lookup_is_one_compiled_call_over_the_indices_fbgemm_was_given(monkeypatch):
    # the check after FBGEMM's lookup: one kernel (gather, sums, verdict) reading the int32 indices and offsets
    # FBGEMM took (no int64 copy of its own), and no torch pass of the reference
    _need_fbgemm()
    from mystique.validators.soft_errors import _kernels
    from mystique.validators.soft_errors.abft import bag_verdict
    from mystique.validators.soft_errors.abft.fbgemm import FbgemmTable, checked_fbgemm_embedding_bag

    if not _kernels.available():
        pytest.skip("the compiled kernels are turned off")
    g = torch.Generator().manual_seed(5)
    table = FbgemmTable.from_float(torch.randn(50, 16, generator=g), 8, "sum")
    idx, off = torch.randint(0, 50, (40,), generator=g), torch.arange(0, 40, 8)
    calls = []
    real = _kernels.raw
    monkeypatch.setattr(bag_verdict, "raw", lambda name: calls.append(name) or (
        lambda *a: calls.append(a[3].dtype) or real(name)(*a)))
    monkeypatch.setattr(bag_verdict, "_pooled", lambda *a, **k: pytest.fail("the torch path ran"))
    out, rep = checked_fbgemm_embedding_bag(table, idx, off)
    assert not rep.alarm and calls == ["bag_verdict", np.int32], calls
    assert torch.equal(out, table.lookup(idx, off))


def test_fbgemm_overhead_rows_come_from_paired_rounds_with_an_interval():
    _need_fbgemm()
    from mystique.validators import soft_errors

    from mystique.targets import Target

    df = soft_errors.run(Target("cpu"), groups=["overhead_fbgemm"], overhead_tables=((2000, 16, 64, 4),),
                         overhead_reps=1)
    rows = df[df.metric == "abft_overhead"]
    assert sorted(rows.subject) == ["fbgemm_4bit_2000x16_b64_l4", "fbgemm_4bit_mean_2000x16_b64_l4",
                                    "fbgemm_8bit_2000x16_b64_l4", "fbgemm_8bit_mean_2000x16_b64_l4"]
    assert all("95% interval" in d for d in rows.detail) and set(rows.status) <= {"pass", "fail", "inconclusive"}


def test_without_fbgemm_the_fbgemm_groups_say_they_skip(monkeypatch):
    from mystique.validators import soft_errors
    from mystique.validators.soft_errors.checks import abft_fbgemm

    from mystique.targets import Target

    monkeypatch.setattr(abft_fbgemm, "fbgemm_available", lambda: False)
    df = soft_errors.run(Target("cpu"), groups=["abft_fbgemm", "overhead_fbgemm"])
    assert list(df.status) == ["skip", "skip"] and all("not installed" in d for d in df.detail)
