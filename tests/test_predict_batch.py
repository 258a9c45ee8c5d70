"""The batch size behind `predict --batch-scale` / `generate --batch-scale` (issue #35), read where the
step consumes its data inputs: DLRM's tables stacked as (T, N) ids and (T, B) offsets, read table by
table, made the batch the table count T (8 for dlrm small, batch 4096), so batch x2 measured an almost
unchanged step."""

from __future__ import annotations

import math

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.replay.batch_infer import DataInput, data_inputs, infer_batch, rescaled_data_shape
from mystique.replay.batch_scale import rebased_offset, rescale_batch
from mystique.replay.runtime import contiguous_strides

# --- pieces -------------------------------------------------------------------------------------------


def test_bag_ids_scale_their_length_and_keep_their_loop_dim():
    ids = DataInput({"shape": [4, 48], "dtype": "int64"}, loop=1, ids=True)
    assert ids.batch_dim is None  # 48 ids are 16 bags of 3: not the batch
    assert rescaled_data_shape(ids, 16, 32) == [4, 96]
    offsets = DataInput({"shape": [16, 16], "dtype": "int64"}, loop=1)  # 16 tables of 16 bags
    assert offsets.batch_dim == 16 and rescaled_data_shape(offsets, 16, 32) == [16, 32]  # the tables stay
    last = DataInput({"shape": [17], "dtype": "int64"}, last_offset=True)
    assert last.batch_dim == 16 and rescaled_data_shape(last, 16, 32) == [33]


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.integers(2, 3), st.data())
@examples(60)
def test_a_view_into_a_rescaled_tensor_starts_at_the_same_element(shape, k, data):
    """Law: a view that started at element (i0, i1, ...) of a dense base starts at that element of the
    base rescaled along any one dim."""
    dim = data.draw(st.integers(0, len(shape) - 1))
    idx = [data.draw(st.integers(0, d - 1)) for d in shape]
    new_shape = [d * k if i == dim else d for i, d in enumerate(shape)]
    old_s, new_s = contiguous_strides(shape), contiguous_strides(new_shape)
    at = sum(i * s for i, s in zip(idx, old_s))
    assert rebased_offset(at + 7, 7, shape, old_s, new_s) == 7 + sum(i * s for i, s in zip(idx, new_s))


def test_a_start_outside_the_base_is_not_rebased():
    assert rebased_offset(3, 5, [2, 3], [3, 1], [6, 1]) is None
    assert rebased_offset(5 + 6, 5, [2, 3], [3, 1], [6, 1]) is None  # past its last element


# --- a DLRM training step -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    """dlrm debug, train: batch 16, 4 tables, 3 ids per bag (dense (16, 13), indices (4, 48), offsets (4, 16))."""
    from mystique.capture import capture
    from mystique.replay.plan import plan_from_path

    out = capture("dlrm", tmp_path_factory.mktemp("dlrm") / "cap", config="debug", mode="train", steps=1, warmup=0)
    return plan_from_path(out)[0]


def test_dlrm_batch_is_its_bags_not_its_tables(dlrm):
    assert infer_batch(dlrm) == 16  # was 4: the stacked tables' leading dim
    dense = [d for d in data_inputs(dlrm) if d.t["dtype"] == "float32" and d.t["shape"] == [16, 13]]
    assert dense  # read first by aten::to (its own dtype: returns itself), which does not write it


def test_dlrm_batch_x2_doubles_bags_ids_and_gemm_work_and_replays(dlrm):
    from mystique.predict.opmodel import op_work
    from mystique.replay.runtime import Executor

    big = rescale_batch(dlrm, 2.0)
    assert big.metadata["batch_size"] == 32
    old = {t["id"]: t for t in dlrm.tensors}
    ext = {tuple(old[t["id"]]["shape"]): t["shape"] for t in big.tensors if t["source"] == "external"}
    assert ext[(16, 13)] == [32, 13] and ext[(4, 48)] == [4, 96] and ext[(4, 16)] == [4, 32]
    # each table's offsets view starts at its table's row of the rescaled (4, 32) offsets
    bags = [op for op in big.ops if op["name"] == "aten::embedding_bag"]
    tensors = {t["id"]: t for t in big.tensors}
    starts = sorted(tensors[op["args"][2]["t"]]["offset"] for op in bags)
    assert starts == [0, 32, 64, 96]
    # each table's ids: twice as many, drawn below its own table's rows where the rescaled view now lies
    ids = next(s for s in big.storages if s["id"] == tensors[bags[0]["args"][1]["t"]]["storage"])
    assert [seg for seg in ids["recipe"]["segments"] if seg[1] == 96] == [
        [0, 96, 1, 0, 100], [96, 96, 1, 0, 1000], [192, 96, 1, 0, 50], [288, 96, 1, 0, 7]]
    # twice the batch is twice the GEMM work (every mm's M, or the dim it contracts, is the batch)
    mms = ("aten::mm", "aten::addmm", "aten::bmm")
    flops = [sum(op_work(op, {t["id"]: t for t in p.tensors}).flops for op in p.ops if op["name"] in mms)
             for p in (dlrm, big)]
    assert flops[0] > 0 and math.isclose(flops[1], 2 * flops[0], rel_tol=1e-9)
    e = Executor(big.data, "cpu")
    e.run_iteration(probe=True)
    assert [s.name for s in e.status if s.state == "skipped"] == []
    assert [tensors[op["outputs"][0]["t"]]["shape"] for op in bags] == [[32, 8]] * 4  # 32 bags of each table


# --- what a memory-bound op's time scales with ------------------------------------------------------------


def _op(name, ins, outs, shapes):
    tensors = {i: {"shape": s, "dtype": "float32"} for i, s in shapes.items()}
    return {"name": name, "args": [{"t": i} for i in ins], "kwargs": {}, "outputs": [{"t": i} for i in outs]}, tensors


def _scaled_time(name, ins, outs, before, after, t=100.0):
    from mystique.predict.opmodel import Work
    from mystique.predict.whatif import _numel, op_time

    op0, t0 = _op(name, ins, outs, before)
    op1, t1 = _op(name, ins, outs, after)
    w = Work(0.0, 0.0, "float32")
    return op_time(t, 0.0, "memory", w, w, _numel(op0, t0), _numel(op1, t1), None, None)


def test_a_reduction_over_the_batch_takes_twice_as_long_for_twice_the_batch():
    """A bias gradient (sum of [B, 512] into [512]) reads the batch: its work doubles (it was read off its
    output alone, unchanged, so dlrm train's batch x2 was predicted short)."""
    assert _scaled_time("aten::sum", [0], [1], {0: [4096, 512], 1: [512]}, {0: [8192, 512], 1: [512]}) == \
        pytest.approx(200.0, rel=2e-3)


def test_a_lookup_is_the_rows_it_gathers_not_its_table():
    """An embedding bag of a 10^6-row table: twice the bags and ids gather twice the rows."""
    before = {0: [10**6, 64], 1: [32768], 2: [4096], 3: [4096, 64]}
    after = {0: [10**6, 64], 1: [65536], 2: [8192], 3: [8192, 64]}
    assert _scaled_time("aten::embedding_bag", [0, 1, 2], [3], before, after) == pytest.approx(200.0)


def test_a_bag_backward_scales_its_ids_and_gradient_rows_not_the_table_it_fills():
    """The dense gradient of a 1000-row table (filled whatever the batch) beside 8 ids per bag: between 1x
    and 2x, nearer 2x the smaller the table (measured here on torch 2.13, 1 thread: 1000 rows x1.78,
    200,000 rows x1.08 for batch 4096 -> 8192)."""
    small = _scaled_time("aten::_embedding_bag_backward", [0, 1, 2], [3],
                         {0: [4096, 64], 1: [32768], 2: [4096], 3: [1000, 64]},
                         {0: [8192, 64], 1: [65536], 2: [8192], 3: [1000, 64]})
    big = _scaled_time("aten::_embedding_bag_backward", [0, 1, 2], [3],
                       {0: [4096, 64], 1: [32768], 2: [4096], 3: [200_000, 64]},
                       {0: [8192, 64], 1: [65536], 2: [8192], 3: [200_000, 64]})
    # each id adds a row of 64 into the gradient: ids x 64 plus the table's gradient it fills
    assert small == pytest.approx(100.0 * (65536 * 64 + 64_000) / (32768 * 64 + 64_000))
    assert big == pytest.approx(100.0 * (65536 * 64 + 12_800_000) / (32768 * 64 + 12_800_000))
    assert 100.0 < big < 125.0 and 180.0 < small < 200.0
