"""The fused Triton EmbeddingBag's lookup options (issue 32), in Triton's interpreter on this host: per-sample
weights (sum pooling), a padding index and offsets that include the last bag's end, held to the properties of
the CPU path (:mod:`test_soft_errors_bag_options`): clean calls never alarm and match torch's lookup with the
same options to within its rounding; a table flip the check must see alarms in exactly the bags that read
the row (a padding entry reads nothing); max pooling is refused. Skipped, saying why, without Triton."""

from __future__ import annotations

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors import triton_abft
from mystique.validators.soft_errors.abft.bag_verdict import EmbeddingChecks
from test_soft_errors_bag_options import OPTIONS, _case, _torch, check_flip, options, padding_flip_cases
from test_soft_errors_triton import interpreted

from mystique.errors import UsageError

pytestmark = pytest.mark.skipif(not triton_abft.available(), reason=triton_abft.why_not() or "")


def _fused(w, checks, idx, off, pool, psw, pad, last):
    from mystique.validators.soft_errors.triton_abft.bag import fused_embedding_bag

    return fused_embedding_bag(w, checks, idx, off, pool, per_sample_weights=psw, padding_idx=pad,
                               include_last_offset=last)


@examples(10)
@given(**OPTIONS)
def test_clean_fused_lookups_with_options_never_alarm_and_match_torchs(rows, d, lengths, mode, padded, negative,
                                                                       last, tail, seed):
    weighted, pool, pad = options(mode, padded, negative, rows, seed)
    w, idx, off, psw = _case(seed, rows, d, lengths, weighted, pad, last, tail)
    with interpreted():
        out, chk = _fused(w, EmbeddingChecks.of(w), idx, off, pool, psw, pad, last)
        rep = chk.report()
    assert not rep.alarm and rep.checked, rep.describe()
    want = _torch(w.double(), idx, off, pool, None if psw is None else psw.double(), pad, last)
    mag = _torch(w.double().abs(), idx, off, pool, None if psw is None else psw.double().abs(), pad, last)
    tol = (max(lengths) + 2) * 2.0**-24 * mag + 1e-30  # (a product and the sums of at most L terms, fp32)
    assert out.shape == want.shape and ((out.double() - want).abs() <= tol).all()


@examples(10)
@given(**OPTIONS, where=st.floats(0, 0.999), bit=st.integers(0, 31), col=st.integers(0, 100))
def test_significant_fused_flips_alarm_exactly_where_torchs_bags_read_them(rows, d, lengths, mode, padded, negative,
                                                                          last, tail, seed, where, bit, col):
    weighted, pool, pad = options(mode, padded, negative, rows, seed)
    w, idx, off, psw = _case(seed, rows, d, lengths, weighted, pad, last, tail)

    def run(table, wf):
        with interpreted():
            return _fused(wf, table.checks, idx, off, pool, psw, pad, last)[1].report()

    check_flip(w, idx, off, pool, psw, pad, last, int(where * rows), bit, col % d, run)


@pytest.mark.parametrize("mode", ["sum", "mean", "weighted"])
def test_a_fused_exponent_flip_alarms_in_the_bags_that_read_the_row_and_not_through_padding(mode):
    for w, wf, idx, off, pool, psw, want in padding_flip_cases(mode):
        with interpreted():
            rep = _fused(wf, EmbeddingChecks.of(w), idx, off, pool, psw, 5, True)[1].report()
        assert rep.rows == want and rep.alarm == bool(want), rep.describe()


def test_fused_max_pooling_is_refused():
    w = torch.randn(5, 4)
    with interpreted(), pytest.raises(UsageError, match="max pooling is not linear"):
        _fused(w, EmbeddingChecks.of(w), torch.tensor([1, 2]), torch.tensor([0]), "max", None, None, False)
