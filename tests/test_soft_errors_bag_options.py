"""The checked EmbeddingBag's lookup options (issue 32): per-sample weights (sum pooling), a padding index and
offsets that include the last bag's end, on the CPU path (the fused compiled lookup, or torch's lookup and
its verdict where Numba is off), held to the properties of the plain lookup:

* a clean call never alarms and returns torch's own lookup with the same options, bitwise;
* a table flip the check must see (:func:`sure_alarms`, over the bags as torch reads them: padding left
  out, the weights applied) alarms in exactly those bags, and never in a bag that does not read the row
  (a padding entry reads nothing);
* max pooling, which no row checksum can verify, is refused with one clear line, as are bad options.

The checksum law of a bag b: ``sum_d out_bd = sum_{i in b, idx_i != p} w_i c[idx_i]`` (``c = W 1``; mean
divides by the entries left).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors import abft
from mystique.validators.soft_errors.abft.bag_verdict import row_sums64, sure_alarms
from mystique.validators.soft_errors.abft.embedding_bag import MAX_REFUSED, lookup_args, without_padding

from mystique.errors import UsageError


def _case(seed: int, rows: int, d: int, lengths: list[int], weighted: bool, pad: int | None, last: bool,
          tail: int):
    """Table, indices (``tail`` more past the last bag's end where ``last``), offsets (with the end where
    ``last``) and weights; the padding row is read by some bags where ``pad`` is given."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    idx = torch.randint(0, rows, (n + (tail if last else 0),), generator=g)
    if pad is not None and n:
        idx[torch.randint(0, n, (max(1, n // 3),), generator=g)] = pad % rows
    starts = [0, *np.cumsum(lengths)[:-1].tolist()]
    off = torch.tensor(starts + ([n] if last else []), dtype=torch.int64)
    w = torch.randn(rows, d, generator=g) * torch.logspace(-3, 3, rows)[:, None]
    psw = torch.randn(idx.numel(), generator=g) if weighted else None
    return w, idx, off, psw


def _torch(w, idx, off, mode, psw, pad, last):
    """torch's lookup with the same options. With offsets that include the end, the indices past it are cut
    first: torch 2.13's CPU lookup with a padding index pools them into the last bag (its documentation
    says the last offset ends the last bag, and without a padding index it does end it there)."""
    if last:
        end = int(off[-1])
        idx, off, psw = idx[:end], off[:-1], None if psw is None else psw[:end]
    return F.embedding_bag(idx, w, off, mode=mode, per_sample_weights=psw, padding_idx=pad)


def test_torchs_cpu_lookup_pools_indices_past_the_last_offset_with_a_padding_index():
    """Why :func:`_torch` cuts: the documented bags, and torch's own without a padding index, end at the last
    offset; with one (torch 2.13, CPU) the index past it is pooled too. If torch changes, this fails."""
    w, idx, off = torch.tensor([[1.0], [100.0], [10000.0]]), torch.tensor([2, 0, 1]), torch.tensor([0, 2])
    assert F.embedding_bag(idx, w, off, mode="sum", include_last_offset=True).item() == 10001.0
    assert F.embedding_bag(idx, w, off, mode="sum", include_last_offset=True, padding_idx=0).item() == 10100.0


OPTIONS = dict(rows=st.integers(1, 60), d=st.integers(1, 70),
               lengths=st.lists(st.integers(0, 9), min_size=1, max_size=12),
               mode=st.sampled_from(("sum", "mean", "weighted")), padded=st.booleans(),
               negative=st.booleans(), last=st.booleans(), tail=st.integers(0, 3), seed=st.integers(0, 2**16))


def options(mode, padded, negative, rows, seed):
    """``(weighted, pool, padding_idx)`` of a drawn case: "weighted" is sum pooling with per-sample weights;
    the padding index is drawn among the rows, negative (counted from the end) where asked."""
    weighted = mode == "weighted"
    return weighted, "sum" if weighted else mode, (seed % rows - (rows if negative else 0)) if padded else None


def padding_flip_cases(mode):
    """The fixed case beside padding (index 5) and past the last offset (include_last_offset): ``(w, flipped w,
    indices, offsets, pool, per-sample weights, bags that must alarm)`` for an exponent flip of row 3 (read by
    bags 0 and 2) and for one of the padding row 5 (no bag)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 16, generator=g)
    idx = torch.tensor([3, 1, 5, 5, 2, 3, 0, 3])  # bags [3 1 5] [5] [2 3 0]; the last 3 is past the end
    off = torch.tensor([0, 3, 4, 7])
    psw = torch.rand(8, generator=g) + 0.5 if mode == "weighted" else None
    pool = "sum" if mode == "weighted" else mode
    for row, want in ((3, [0, 2]), (5, [])):
        wf = w.clone()
        wf.view(torch.int32)[row, 4] ^= 1 << 29
        yield w, wf, idx, off, pool, psw, want


@examples(40)
@given(**OPTIONS)
def test_clean_lookups_with_options_never_alarm_and_are_torchs(rows, d, lengths, mode, padded, negative, last,
                                                               tail, seed):
    weighted, pool, pad = options(mode, padded, negative, rows, seed)
    w, idx, off, psw = _case(seed, rows, d, lengths, weighted, pad, last, tail)
    with torch.no_grad():
        out, rep = abft.checked_embedding_bag(abft.checked_table(w), idx, off, pool, per_sample_weights=psw,
                                              padding_idx=pad, include_last_offset=last)
    assert torch.equal(out, _torch(w, idx, off, pool, psw, pad, last))
    assert not rep.alarm and rep.checked, rep.describe()


def _reads(idx: torch.Tensor, off: torch.Tensor, row: int) -> set[int]:
    ends = [*off.tolist()[1:], idx.numel()]
    return {b for b, (s, e) in enumerate(zip(off.tolist(), ends, strict=True)) if row in idx[s:e].tolist()}


def check_flip(w, idx, off, pool, psw, pad, last, row, bit, col, run) -> None:
    """Flip ``bit`` of ``w[row, col]`` after the checksums: the bags that surely see it (over the bags as torch
    reads them) alarm, and only bags that read the row. ``run(table, flipped weight)`` -> report."""
    table = abft.checked_table(w)
    wf = w.clone()
    wf.view(torch.int32)[row, col] ^= 1 << bit
    rep = run(table, wf)
    i2, o2, p2, pd = lookup_args(idx, off, psw, pool, w.shape[0], pad, last)
    if pd is not None:
        i2, o2, p2 = without_padding(i2, o2, p2, pd)
    sure = np.flatnonzero(sure_alarms(row_sums64(w), row_sums64(wf), i2, o2, pool, w.shape[1],
                                      4.0 + (2.0 if p2 is not None else 0.0), per_sample_weights=p2))
    assert set(sure.tolist()) <= set(rep.rows), (sure, rep.describe())
    assert set(rep.rows) <= _reads(i2, o2, row), rep.describe()


def _cpu_run(idx, off, pool, psw, pad, last):
    def run(table, wf):
        table.weight = wf  # (the table's memory after the flip: its checksums are the clean ones)
        with torch.no_grad():
            return abft.checked_embedding_bag(table, idx, off, pool, per_sample_weights=psw, padding_idx=pad,
                                              include_last_offset=last)[1]
    return run


@examples(40)
@given(**OPTIONS, where=st.floats(0, 0.999), bit=st.integers(0, 31), col=st.integers(0, 100))
def test_significant_flips_alarm_exactly_where_torchs_bags_read_them(rows, d, lengths, mode, padded, negative,
                                                                    last, tail, seed, where, bit, col):
    weighted, pool, pad = options(mode, padded, negative, rows, seed)
    w, idx, off, psw = _case(seed, rows, d, lengths, weighted, pad, last, tail)
    check_flip(w, idx, off, pool, psw, pad, last, int(where * rows), bit, col % d,
               _cpu_run(idx, off, pool, psw, pad, last))


@pytest.mark.parametrize("mode", ["sum", "mean", "weighted"])
def test_an_exponent_flip_alarms_in_the_bags_that_read_the_row_and_not_through_padding(mode):
    """Row 3 read by bags 0 and 2 (bag 1 reads only the padding row 5 and row 3 past the last offset): an
    exponent flip of row 3 alarms in bags 0 and 2; one of the padding row alarms nowhere."""
    for w, wf, idx, off, pool, psw, want in padding_flip_cases(mode):
        table = abft.checked_table(w)
        table.weight = wf
        with torch.no_grad():
            out, rep = abft.checked_embedding_bag(table, idx, off, pool, per_sample_weights=psw, padding_idx=5,
                                                  include_last_offset=True)
        assert torch.equal(out, _torch(wf, idx, off, pool, psw, 5, True))
        assert rep.rows == want and rep.alarm == bool(want), rep.describe()


def test_max_pooling_is_refused_with_one_line_saying_why():
    table = abft.checked_table(torch.randn(5, 4))
    for fn, t in ((abft.checked_embedding_bag, table),
                  (abft.checked_quantized_embedding_bag, abft.QuantizedTable.from_float(torch.randn(5, 4)))):
        with pytest.raises(UsageError) as err:
            fn(t, torch.tensor([1, 2]), torch.tensor([0]), "max")
        assert MAX_REFUSED in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(mode="mean", per_sample_weights=torch.ones(4)), "sum pooling"),
    (dict(per_sample_weights=torch.ones(3)), "per-sample weights of shape"),
    (dict(padding_idx=5), "padding_idx 5 is outside"),
    (dict(padding_idx=-6), "padding_idx -6 is outside"),
    (dict(include_last_offset=True, offsets=torch.tensor([0, 9])), "last offset 9"),
    (dict(include_last_offset=True, indices=torch.zeros(2, 2, dtype=torch.int64), offsets=None), "1-D indices"),
])
def test_bad_options_are_refused_with_one_line(kwargs, words):
    args = {"indices": torch.tensor([0, 1, 2, 3]), "offsets": torch.tensor([0, 2]), **kwargs}
    with pytest.raises(UsageError, match=words):
        abft.checked_embedding_bag(abft.checked_table(torch.randn(5, 4)), **args)
