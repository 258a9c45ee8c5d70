"""protect() checks an EmbeddingBag with a padding index (issue 32): torch's lookup runs (its output unchanged)
and the bags are checked with the padding entries left out, as torch pools them; a flipped looked-up row alarms
in the bags that read it (in every bag its flip is sure to alarm in), the padding row's flips alarm nowhere."""

from __future__ import annotations

import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mystique.validators.soft_errors.abft.bag_verdict import row_sums64, sure_alarms
from mystique.validators.soft_errors.abft.embedding_bag import without_padding
from mystique.validators.soft_errors.protect import protect

from mystique.dtypes import int_view

FP32_EXTRA = 4.0  # the `extra` roundings of a float32 lookup's check (protect's and checked_embedding_bag's)


def _bag_of(off: torch.Tensor, n: int) -> torch.Tensor:
    """The bag of each of ``n`` indices (bags start at ``off``; the last runs to the end)."""
    return torch.searchsorted(off, torch.arange(n, dtype=off.dtype), right=True) - 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(2, 40), d=st.sampled_from([1, 7, 16, 64, 65]),
       lengths=st.lists(st.integers(0, 9), min_size=1, max_size=8), mode=st.sampled_from(["sum", "mean", "weighted"]),
       layout=st.sampled_from(["offsets", "last_offset", "2d"]), negative=st.booleans())
def test_protect_checks_a_padded_embedding_bag_a_flipped_row_alarms_and_the_padding_row_never(
        seed, rows, d, lengths, mode, layout, negative):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    pad = rng.randrange(rows)
    if layout == "2d":  # bags of equal length, no offsets
        lengths = [max(1, lengths[0])] * len(lengths)
    n = sum(lengths)
    idx = torch.randint(0, rows, (n,), generator=g)
    if n:
        idx[torch.randint(0, n, (max(1, n // 3),), generator=g)] = pad  # some bags read the padding index
    starts = torch.tensor([0, *np.cumsum(lengths)[:-1].tolist()], dtype=torch.int64)
    args = (idx.reshape(len(lengths), -1),) if layout == "2d" else \
        (idx, torch.cat([starts, torch.tensor([n])]) if layout == "last_offset" else starts)
    psw = torch.randn(n, generator=g) if mode == "weighted" else None
    if psw is not None:
        args = (*args, None, psw.reshape(args[0].shape)) if layout == "2d" else (*args, psw)
    pool = "sum" if mode == "weighted" else mode
    bag = torch.nn.EmbeddingBag(rows, d, mode=pool, padding_idx=pad - rows if negative else pad,
                                include_last_offset=layout == "last_offset")
    with torch.no_grad():
        bag.weight.copy_(torch.randn(rows, d, generator=g))
        want = bag(*args)
    fidx, foff, fpsw = without_padding(idx, starts, psw, pad)  # the bags as torch pools them
    with torch.no_grad(), protect(bag) as guard:
        out = bag(*args)
        assert torch.equal(out, want)  # torch's own lookup, its output unchanged
        assert guard.checks == 1 and guard.unchecked == 0 and not guard.alarms, [a.describe() for a in guard.alarms]
        read = (idx != pad).nonzero()[:, 0].tolist()
        if read:  # a looked-up row other than the padding one: 1.5 -> 1.5 2^-64 (exponent bit 29)
            pos, col = rng.choice(read), rng.randrange(d)
            row = int(idx[pos])
            bag.weight[row, col] = 1.5  # (the checksums follow: a version bump)
            bag(*args)
            before = row_sums64(bag.weight)
            int_view(bag.weight.data)[row, col] ^= 1 << 29  # (no version bump: a soft error)
            bag(*args)
            sure = sure_alarms(before, row_sums64(bag.weight), fidx, foff, pool, d, FP32_EXTRA,
                               per_sample_weights=fpsw).nonzero()[0].tolist()
            looked = set(_bag_of(foff, fidx.numel())[fidx == row].tolist())
            rows_alarmed = [a.report.rows for a in guard.alarms]
            assert len(rows_alarmed) <= 1 and set(sure) <= set(sum(rows_alarmed, [])) <= looked, \
                (sure, rows_alarmed, looked)
            assert sure or mode == "weighted"  # (unweighted: a change of 1.5 / length is far above the bound)
            int_view(bag.weight.data)[row, col] ^= 1 << 29  # (undone)
        alarms, clean = len(guard.alarms), bag(*args)
        int_view(bag.weight.data)[pad] ^= 1 << 29  # every element of the padding row: no bag reads it
        assert torch.equal(bag(*args), clean)
        assert len(guard.alarms) == alarms and guard.unchecked == 0


def test_protect_leaves_a_padded_bag_unchecked_where_torch_pools_indices_past_the_last_offset():
    # torch 2.13's CPU lookup with a padding index pools the indices past the last offset into the last bag
    # (tests/test_soft_errors_bag_options.py): no checksum of the documented bags can check that output
    bag = torch.nn.EmbeddingBag(3, 1, mode="sum", padding_idx=0, include_last_offset=True)
    with torch.no_grad():
        bag.weight.copy_(torch.tensor([[1.0], [100.0], [10000.0]]))
        idx, off = torch.tensor([2, 0, 1]), torch.tensor([0, 2])
        with protect(bag) as guard:
            out = bag(idx, off)
            assert guard.checks == 0 and guard.unchecked == 1 and not guard.alarms
            out2 = bag(idx[:2], off)  # no index past the end: checked
            assert guard.checks == 1 and guard.unchecked == 1 and not guard.alarms
    assert out.item() == 10100.0 and out2.item() == 10000.0
