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


@pytest.mark.parametrize("how", ["padding", "weights", "last", "all"])
def test_protect_checks_bags_with_options_in_the_fused_kernel_without_leaving_the_device(monkeypatch, how):
    """A protected EmbeddingBag with a padding index, per-sample weights or ``include_last_offset`` takes the
    fused kernel (its verdict deferred, read back in a batch) rather than torch's lookup and a check that
    leaves the padding out on the host (:func:`without_padding`, two host reads a call on CUDA); the output is
    torch's to within its rounding, a flip of a looked-up row alarms in its bags and one of the padding row
    nowhere. (CUDA dispatch pointed at the interpreter's CPU tensors, as in test_soft_errors_triton.)"""
    import importlib

    from mystique.validators.soft_errors.triton_abft import guard as fused_guard
    from torch import nn

    protect_mod = importlib.import_module("mystique.validators.soft_errors.protect")
    monkeypatch.setattr(protect_mod, "fused_installable", lambda: True)
    monkeypatch.setattr(fused_guard, "cuda_wanted", triton_abft.wanted)
    monkeypatch.setattr(protect_mod, "without_padding", lambda *a: pytest.fail("padding left out on the host"))
    pad = 3 if how in ("padding", "all") else None
    last = how in ("last", "all")
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(30, 16, mode="sum", padding_idx=pad, include_last_offset=last)
    idx = torch.tensor([3, 5, 7, 3, 9, 5, 11, 3, 2, 8, 4, 3])
    off = torch.tensor([0, 4, 4, 9] + ([12] if last else []))
    psw = torch.rand(12) if how in ("weights", "all") else None
    with interpreted(), torch.no_grad():
        want = bag(idx, off, psw)
        guard = protect_mod.protect(bag)
        out = bag(idx, off, psw)
        assert len(guard.pending) == 1  # (deferred: the fused kernel ran, no verdict read yet)
        assert guard.checks == 1 and not guard.alarms
        torch.testing.assert_close(out, want)
        w = bag.weight
        w.data[pad if pad is not None else 0, 2] += 1000.0  # the padding row (or row 0, read by no bag)
        bag(idx, off, psw)
        assert not guard.alarms
        w.data.view(torch.int32)[5, 2] ^= 1 << 29  # a soft error in a looked-up row (bags 0 and 2)
        bag(idx, off, psw)
        assert [a.module for a in guard.alarms] == [""] and guard.alarms[0].report.rows == [0, 2]
        guard.remove()
