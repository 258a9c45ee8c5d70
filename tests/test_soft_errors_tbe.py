"""Checked FBGEMM table-batched EmbeddingBags (issue 32), on FBGEMM's CPU TBE (the same wrapper runs a CUDA
one unchanged): the training TBE (fp32 rows) and the inference TBE (8-bit and 4-bit row-wise rows), several
tables of different widths, a feature sharing a table, ragged and empty bags, sum and mean pooling, per-sample
weights. Clean forwards never alarm and return the module's own output; a flipped table row (one bit, under
the version counter, as a soft error) alarms in exactly the bags that surely see it (:func:`sure_alarms`) and
only in bags of features that read that table's row; checksums are cached per weight version. Skipped,
saying why, without ``fbgemm_gpu``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors.abft.bag_verdict import row_sums64, sure_alarms
from mystique.validators.soft_errors.abft.fbgemm import fbgemm_available

from mystique.errors import UsageError

pytestmark = pytest.mark.skipif(not fbgemm_available(), reason="FBGEMM is not installed or does not load "
                                                               "(pip install -e '.[fbgemm]')")

TABLES = ((40, 8), (25, 16), (60, 4))
FEATURES = (0, 1, 2, 1)  # feature 3 reads table 1 too


def _training(mode: str, seed: int):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in TABLES], feature_table_map=list(FEATURES),
        weights_precision=SparseType.FP32, pooling_mode={"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[mode],
        optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in tbe.split_embedding_weights():
            w.copy_(torch.randn(w.shape, generator=g) * torch.logspace(-2, 2, w.shape[0])[:, None])
    return tbe


def _inference(mode: str, bits: int):
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    kind = {8: SparseType.INT8, 4: SparseType.INT4}[bits]
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(f"t{i}", r, d, kind, EmbeddingLocation.HOST) for i, (r, d) in enumerate(TABLES)],
        feature_table_map=list(FEATURES), device="cpu", output_dtype=SparseType.FP32,
        pooling_mode={"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[mode])
    tbe.fill_random_weights()
    return tbe


def _batch(lengths: list[int], seed: int):
    """Bags of ``lengths`` for every feature (the same count per feature), indices within each feature's table."""
    g = torch.Generator().manual_seed(seed)
    idx, lens = [], []
    for f in range(len(FEATURES)):
        lens.append(lengths[f::len(FEATURES)] or [0])
    b = max(len(x) for x in lens)
    for f, t in enumerate(FEATURES):
        lens[f] = (lens[f] + [0] * b)[:b]
        idx.append(torch.randint(0, TABLES[t][0], (sum(lens[f]),), generator=g))
    flat = [n for ls in lens for n in ls]
    offsets = torch.tensor([0, *np.cumsum(flat).tolist()], dtype=torch.int64)
    return torch.cat(idx), offsets, b


def _make(kind: str, mode: str, seed: int):
    return _training(mode, seed) if kind == "fp32" else _inference(mode, 8 if kind == "int8" else 4)


KIND = st.sampled_from(("fp32", "int8", "int4"))
LENGTHS = st.lists(st.integers(0, 7), min_size=1, max_size=24)


@examples(8, deadline=None)
@given(kind=KIND, mode=st.sampled_from(("sum", "mean", "weighted")), lengths=LENGTHS, seed=st.integers(0, 2**16))
def test_clean_tbe_forwards_never_alarm_and_return_the_modules_output(kind, mode, lengths, seed):
    from mystique.validators.soft_errors.abft.tbe import CheckedTBE

    weighted = mode == "weighted"
    tbe = _make(kind, "sum" if weighted else mode, seed)
    idx, off, _ = _batch(lengths, seed)
    psw = torch.rand(idx.numel(), generator=torch.Generator().manual_seed(seed)) * 4 - 2 if weighted else None
    args = (idx, off) if psw is None else (idx, off, psw)
    out, rep = CheckedTBE(tbe)(*args)
    assert torch.equal(out, tbe(*args))
    assert not rep.alarm and rep.checked, rep.describe()


def _table_values(tbe, kind: str, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the bytes/values tensor to flip in, ``(W 1, |W| 1)`` in fp64 as the module holds table ``t`` now)."""
    from mystique.validators.soft_errors.abft.tbe import int_row_checks

    if kind == "fp32":
        w = tbe.split_embedding_weights()[t]
        return w.data, row_sums64(w.detach())
    packed, ss = tbe.split_embedding_weights(split_scale_shifts=True)[t]
    c = int_row_checks(packed, ss, 8 if kind == "int8" else 4, TABLES[t][1])
    return packed.data, (c.rowsum[:, 0].double(), c.absum[:, 0].double())  # (only for the bag law below)


@examples(12, deadline=None)
@given(kind=KIND, mode=st.sampled_from(("sum", "mean")), lengths=LENGTHS, table=st.integers(0, 2),
       where=st.floats(0, 0.999), col=st.integers(0, 100), bit=st.integers(0, 31), seed=st.integers(0, 2**16))
def test_a_flipped_table_row_alarms_in_the_bags_that_read_it_and_nowhere_else(kind, mode, lengths, table, where,
                                                                             col, bit, seed):
    from mystique.validators.soft_errors.abft.tbe import FLOAT_EXTRA, CheckedTBE

    tbe = _make(kind, mode, seed)
    idx, off, b = _batch(lengths, seed)
    checked = CheckedTBE(tbe)
    checked(idx, off)  # the checksums, cached
    raw, before = _table_values(tbe, kind, table)
    row = int(where * raw.shape[0])
    if kind == "fp32":
        raw.view(torch.int32)[row, col % raw.shape[1]] ^= 1 << bit
    else:
        raw[row, col % raw.shape[1]] ^= 1 << (bit % 8)  # (a code byte, or a scale or bias byte)
    after = _table_values(tbe, kind, table)[1]
    out, rep = checked(idx, off)
    assert torch.equal(out, tbe(idx, off))
    bounds = off[::b].tolist()
    reads, sure = set(), set()
    for f, t in enumerate(FEATURES):
        if t != table:
            continue
        i_f, o_f = idx[bounds[f]:bounds[f + 1]], off[f * b:(f + 1) * b] - bounds[f]
        ends = [*o_f.tolist()[1:], i_f.numel()]
        reads |= {f * b + k for k, (s, e) in enumerate(zip(o_f.tolist(), ends, strict=True))
                  if row in i_f[s:e].tolist()}
        if kind == "fp32":  # (the 8-bit law's magnitudes are the dequantized rows': the int check is tested below)
            sure |= {f * b + int(k) for k in np.flatnonzero(sure_alarms(before, after, i_f, o_f, mode,
                                                                        TABLES[table][1], FLOAT_EXTRA))}
    assert sure <= set(rep.rows) or len(rep.rows) == 16, (sure, rep.describe())
    assert set(rep.rows) <= reads, rep.describe()


@pytest.mark.parametrize("kind", ["fp32", "int8", "int4"])
def test_an_exponent_or_scale_flip_alarms_in_every_bag_reading_the_row(kind):
    from mystique.validators.soft_errors.abft.tbe import CheckedTBE

    tbe = _make(kind, "sum", 3)
    idx, off, b = _batch([3, 2, 4, 1, 5, 2, 3, 3], 3)  # two bags per feature
    checked = CheckedTBE(tbe)
    checked(idx, off)
    row = int(idx[off[2 * b]])  # the first row feature 2 (table 2) reads
    if kind == "fp32":
        _table_values(tbe, kind, 2)[0].view(torch.int32)[row, 0] ^= 1 << 29  # an exponent bit
    else:
        ss = tbe.split_embedding_weights(split_scale_shifts=True)[2][1].data
        ss[row, 1] ^= 1 << 6  # the fp16 scale's exponent (its high byte)
    rep = checked(idx, off)[1]
    i_f = idx[off[2 * b]:off[3 * b]]
    ends = [*off[2 * b + 1:3 * b + 1].tolist()]
    want = [2 * b + k for k in range(b) if row in i_f[int(off[2 * b + k]) - int(off[2 * b]):ends[k] - int(off[2 * b])]
            .tolist()]
    assert rep.alarm and rep.rows == want, rep.describe()


def test_checksums_are_cached_per_weight_version():
    from mystique.validators.soft_errors.abft.tbe import CheckedTBE

    tbe = _make("fp32", "sum", 1)
    checked = CheckedTBE(tbe)
    first = checked.checks()
    assert checked.checks() is first
    with torch.no_grad():
        tbe.split_embedding_weights()[0].mul_(2.0)  # an update through torch: a new version
    again = checked.checks()
    assert again is not first and torch.equal(again[0].rowsum, 2.0 * first[0].rowsum)
    idx, off, _ = _batch([2, 3, 1, 4], 1)
    assert not checked(idx, off)[1].alarm



@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_a_fused_optimizers_update_refreshes_the_looked_up_rows_checksums_and_a_flip_still_alarms(mode):
    """FBGEMM's fused SGD writes the looked-up rows in the TBE's backward, past the version counter: the hook on
    that backward recomputes those rows' checksums (equal to a full recomputation afterwards), so training steps
    never alarm without refresh(); a soft error in a row the step did not write still alarms in its bags."""
    from mystique.validators.soft_errors.abft.tbe import CheckedTBE

    tbe = _make("fp32", mode, 3)
    checked = CheckedTBE(tbe)
    assert checked.fused_update()
    for step in range(3):
        idx, off, _ = _batch([2, 3, 1, 4, 0, 2, 5, 1], step)
        out, rep = checked(idx, off)
        assert not rep.alarm, f"step {step}: {rep.describe()}"
        before = [w.clone() for w in tbe.split_embedding_weights()]
        out.square().sum().backward()
        moved = [bool((a != b).any()) for a, b in zip(before, tbe.split_embedding_weights())]
        assert any(moved)  # (the fused update wrote rows, the version counter unmoved)
        cached = checked.checks()
        for c, w in zip(cached, tbe.split_embedding_weights()):
            rs, ab = row_sums64(w.detach())
            assert torch.equal(c.rowsum[:, 0], rs.float()) and torch.equal(c.absum[:, 0], ab.float())
    idx, off, b = _batch([2, 3, 1, 4, 0, 2, 5, 1], 7)
    row = int(idx[0])  # feature 0's first index: table 0
    with torch.no_grad():
        tbe.split_embedding_weights()[0].data.view(torch.int32)[row, 1] ^= 1 << 29  # past the counter (.data)
    rep = checked(idx, off)[1]
    first = int((off[1:b + 1] > 0).nonzero()[0])  # the first non-empty bag of feature 0 reads that row
    assert rep.alarm and first in rep.rows

def test_bad_tbe_arguments_are_refused_with_one_line():
    from mystique.validators.soft_errors.abft.tbe import CheckedTBE

    with pytest.raises(UsageError, match="CheckedTBE wraps"):
        CheckedTBE(torch.nn.Linear(2, 2))
    checked = CheckedTBE(_make("fp32", "mean", 0))
    with pytest.raises(UsageError, match="features x bags"):
        checked(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
    with pytest.raises(UsageError, match="sum pooling"):
        checked(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3, 4]), torch.ones(4))
