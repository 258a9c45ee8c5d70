"""protect()'s fused EmbeddingBag path: the lookup checks its bags in its own pass, and the hook checks the
output again only where another forward hook ran before it; verdicts as the checked lookup's."""

from __future__ import annotations

import contextlib
import os
import random
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from mystique.validators.soft_errors import _kernels, abft
from mystique.validators.soft_errors.abft import fused_lookup
from mystique.validators.soft_errors.protect import protect

from mystique.dtypes import int_view

needs_kernels = pytest.mark.skipif(os.environ.get(_kernels.DISABLE_ENV) == "1",
                                   reason="the compiled kernels are turned off (MYSTIQUE_NO_NUMBA=1)")


@contextlib.contextmanager
def _spy_kernels():
    """The names of the compiled kernels the fused lookup fetches inside the block."""
    names: list[str] = []
    real = _kernels.raw
    with mock.patch.object(fused_lookup, "raw", lambda name: names.append(name) or real(name)):
        yield names


@needs_kernels
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), d=st.sampled_from([1, 7, 16, 64, 65]), mode=st.sampled_from(["sum", "mean"]),
       int32=st.booleans(), hooked=st.booleans())
def test_protect_decides_as_the_checked_lookup_clean_and_with_a_flipped_table_row(seed, d, mode, int32, hooked):
    # protect()'s lookup checks its bags in its own pass; with another forward hook before its own the hook
    # checks the output again. Either way: torch's output, no alarm when clean, and a flipped exponent bit
    # of a looked-up row raises the alarm in the bags that looked it up, as checked_embedding_bag says
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    rows = rng.randint(1, 60)
    lengths = [rng.choice([0, 1, 2, 5, 9]) for _ in range(rng.randint(1, 8))]
    n = sum(lengths)
    dt = torch.int32 if int32 else torch.int64
    idx = torch.randint(0, rows, (n,), generator=g, dtype=dt)
    off = torch.tensor([0, *lengths[:-1]], dtype=dt).cumsum(0).to(dt)
    bag = torch.nn.EmbeddingBag(rows, d, mode=mode)
    with torch.no_grad():
        bag.weight.copy_(torch.randn(rows, d, generator=g))
    checks = abft.EmbeddingChecks.of(bag.weight)
    with torch.no_grad(), protect(bag) as guard, _spy_kernels() as names:
        if hooked:
            bag.register_forward_hook(lambda m, i, o: None, prepend=True)
        out = bag(idx, off)
        assert torch.equal(out, F.embedding_bag(idx, bag.weight, off, mode=mode))
        assert guard.checks == 1 and not guard.alarms
        assert names.count("bag_out_verdict") == int(hooked), names
        if not n:
            return
        pos = rng.randrange(n)
        int_view(bag.weight.data)[int(idx[pos]), rng.randrange(d)] ^= 1 << 28  # (no version bump: a soft error)
        bag(idx, off)
        want = abft.checked_embedding_bag(abft.CheckedTable(bag.weight.detach(), checks), idx, off, mode)[1]
    hit = int((off <= pos).nonzero().max())  # the last bag starting at or before pos holds it
    assert len(guard.alarms) == 1 and hit in guard.alarms[0].report.rows, [a.describe() for a in guard.alarms]
    assert guard.alarms[0].report.rows == want.rows
