"""Soft errors: bit flips, Wilson intervals, checked operators, protect(), BitFlipMode, campaigns."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hyp import examples
from hypothesis import assume, given
from hypothesis import strategies as st
from mystique.validators.soft_errors import _kernels, abft, campaign, inject, stats
from mystique.validators.soft_errors.abft import bag_verdict, fused_lookup
from mystique.validators.soft_errors.abft import gemm as abft_gemm
from mystique.validators.soft_errors.abft import linear as abft_linear
from mystique.validators.soft_errors.protect import protect

from mystique.dtypes import int_view
from mystique.errors import UsageError
from mystique.faults import BitFlipMode, bits

#: the tests of the compiled verdicts themselves; the rest of this file runs with them off as well (CI)
needs_kernels = pytest.mark.skipif(os.environ.get(_kernels.DISABLE_ENV) == "1",
                                   reason="compiled verdicts turned off (MYSTIQUE_NO_NUMBA=1)")


def _kernels_on(on: bool) -> contextlib.AbstractContextManager:
    """The compiled CPU verdicts as they are (on) or turned off for the block (the torch path)."""
    return contextlib.nullcontext() if on else _kernels.disabled()


@contextlib.contextmanager
def _raw_spy(side_effect=None):
    """One spy on ``_kernels.raw`` as every checked operator module that fetches kernels calls it."""
    spy = mock.Mock(wraps=_kernels.raw) if side_effect is None else mock.Mock(side_effect=side_effect)
    with contextlib.ExitStack() as stack:
        for module in (abft_gemm, abft_linear, bag_verdict, fused_lookup):
            stack.enter_context(mock.patch.object(module, "raw", spy))
        yield spy

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
ALL = [*FLOATS, torch.int8, torch.int32]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny operators, as the validator runs them: thread wake-ups would dominate on a busy host."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ----------------------------------------------------------------------------- bits

@examples(60)
@given(dt=st.sampled_from(ALL), value=st.floats(-1e4, 1e4, allow_nan=False), data=st.data())
def test_flipping_the_same_bits_twice_is_identity(dt, value, data):
    width = bits.dtype_bits(dt)
    chosen = data.draw(st.lists(st.integers(0, width - 1), min_size=1, max_size=4, unique=True))
    t = torch.tensor([value]).to(dt)
    before = int_view(t.clone())
    bits.flip_bits_(t, 0, chosen)
    assert not torch.equal(int_view(t.clone()), before)
    bits.flip_bits_(t, 0, chosen)
    assert torch.equal(int_view(t.clone()), before)


@examples(40)
@given(dt=st.sampled_from(FLOATS), value=st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False))
def test_flipping_the_sign_bit_negates(dt, value):
    t = torch.tensor([value]).to(dt)
    orig, new = bits.flip_bits_(t, 0, bits.bit_classes(dt)["sign"])
    assert new == -orig and math.copysign(1, new) != math.copysign(1, orig)


@examples(80)
@given(dt=st.sampled_from(FLOATS), value=st.floats(1e-3, 1e3), data=st.data())
def test_exponent_flips_scale_by_a_power_of_two(dt, value, data):
    exp_bits = bits.bit_classes(dt)["exponent"]
    b = data.draw(st.sampled_from(exp_bits))
    t = torch.tensor([value]).to(dt)
    orig, new = bits.flip_bits_(t, 0, [b])
    step = 2 ** (b - exp_bits[0])
    if new != 0 and math.isfinite(new) and abs(new) >= torch.finfo(dt).tiny:
        ratio = new / orig
        assert ratio in (2.0**step, 2.0**-step)


def test_bit_classes_partition_the_word():
    for dt in ALL + [torch.uint8]:
        classes = bits.bit_classes(dt)
        parts = [b for name, bs in classes.items() if name != "any" for b in bs]
        assert sorted(parts) == list(range(bits.dtype_bits(dt))) == classes["any"]


def test_burst_and_multiple_patterns_stay_in_the_word():
    rng = random.Random(1)
    for _ in range(200):
        burst = bits.choose_bits(torch.float32, "mantissa", "burst", 4, rng)
        assert burst == list(range(burst[0], burst[0] + 4)) and burst[-1] < 32
        multi = bits.choose_bits(torch.bfloat16, "exponent", "multiple", 3, rng)
        assert len(set(multi)) == 3 and all(7 <= b <= 14 for b in multi)
    with pytest.raises(UsageError):
        bits.choose_bits(torch.int8, "exponent")


# ----------------------------------------------------------------------------- Wilson

def test_wilson_matches_known_values():
    lo, hi = stats.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = stats.wilson(0, 30000)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / (30000 + 3.8415), rel=1e-3)
    lo, hi = stats.wilson(81, 263)  # Wilson (1927) style textbook example: 0.2553 .. 0.3662
    assert lo == pytest.approx(0.2553, abs=2e-4) and hi == pytest.approx(0.3662, abs=2e-4)
    assert stats.wilson(0, 0) == (0.0, 1.0)


@examples(100)
@given(n=st.integers(1, 100000), data=st.data())
def test_wilson_bounds_solve_the_score_equation(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = stats.wilson(k, n)
    p = k / n
    z2 = stats.Z95**2
    assert 0 <= lo <= p <= hi <= 1
    for bound in (lo, hi):
        if 0 < bound < 1:
            assert (p - bound) ** 2 == pytest.approx(z2 * bound * (1 - bound) / n, rel=1e-6, abs=1e-15)


# ----------------------------------------------------------------------------- checked operators

@examples(120)
@given(m=st.integers(1, 70), k=st.integers(1, 300), n=st.integers(1, 70), dt=st.sampled_from(FLOATS),
       dist=st.sampled_from(campaign.DISTRIBUTIONS + ("constant", "same_rows")), scale=st.floats(-8, 8),
       seed=st.integers(0, 2**31))
def test_checked_mm_never_alarms_on_clean_data(m, k, n, dt, dist, scale, seed):
    g = torch.Generator().manual_seed(seed)
    if dist == "constant":
        a, b = torch.full((m, k), 0.1), torch.full((k, n), 0.7)
    elif dist == "same_rows":
        a, b = torch.rand(1, k, generator=g).expand(m, k).contiguous(), torch.rand(k, n, generator=g)
    else:
        a, b = campaign.random_matrix((m, k), dist, g), campaign.random_matrix((k, n), dist, g)
    s = 10.0 ** (scale / 2 if dt == torch.float16 else scale)
    c, rep = abft.checked_mm((a * s).to(dt), b.to(dt))
    assert not rep.alarm, rep.describe()
    assert c.dtype == dt and c.shape == (m, n)


@examples(120)
@given(m=st.integers(1, 70), k=st.integers(1, 300), n=st.integers(1, 70), dt=st.sampled_from(FLOATS[1:]),
       dist=st.sampled_from(campaign.DISTRIBUTIONS + ("constant", "same_rows")), scale=st.floats(-6, 4),
       seed=st.integers(0, 2**31))
def test_the_rounded_check_of_the_devices_half_gemm_never_alarms_on_clean_data(m, k, n, dt, dist, scale, seed):
    # the device's own bf16/fp16 GEMM with its rounded output; fp16 reaches its subnormal range at the small
    # scales (where the threshold's subnormal term, not u_out |c|, bounds the rounding)
    g = torch.Generator().manual_seed(seed)
    if dist == "constant":
        a, b = torch.full((m, k), 0.1), torch.full((k, n), 0.7)
    elif dist == "same_rows":
        a, b = torch.rand(1, k, generator=g).expand(m, k).contiguous(), torch.rand(k, n, generator=g)
    else:
        a, b = campaign.random_matrix((m, k), dist, g), campaign.random_matrix((k, n), dist, g)
    a, b = (a * 10.0**scale).to(dt), b.to(dt)
    assume(float((a.float() @ b.float()).abs().max()) < torch.finfo(dt).max / 2)  # (an overflow is an alarm)
    c, rep = abft.checked_mm(a, b, check_rounded=True)
    assert not rep.alarm, rep.describe()
    assert c.dtype == dt and rep.op == "gemm_rounded" and torch.equal(c, a @ b)  # the device's own half GEMM


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_checked_mm_detects_and_locates_an_accumulator_flip(dt):
    g = torch.Generator().manual_seed(3)
    if dt == torch.int8:
        a = torch.randint(-128, 128, (33, 40), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (40, 21), generator=g, dtype=torch.int8)
    else:
        a, b = torch.randn(33, 40, generator=g).to(dt), torch.randn(40, 21, generator=g).to(dt)
    c, rep = abft.checked_mm(a, b)
    assert not rep.alarm
    enc = abft.encode_gemm(a, b) if dt == torch.int8 else abft.encode_gemm(a.float(), b.float())
    acc = abft.accumulate(a, b)
    bit = 3 if dt == torch.int8 else 27  # an int32 low bit / an fp32 exponent bit
    bits.flip_bits_(acc, 5 * 21 + 7, [bit])
    rep = abft.verify_gemm(enc, acc, dtype=dt)
    assert rep.alarm and rep.location == (5, 7)


def test_int8_check_is_exact_even_for_the_lowest_bit():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (16, 64), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 8), generator=g, dtype=torch.int8)
    enc = abft.encode_gemm(a, b)
    acc = abft.accumulate(a, b)
    assert torch.equal(acc, (a.long() @ b.long()).int())
    bits.flip_bits_(acc, 17, [0])
    assert abft.verify_gemm(enc, acc, dtype=torch.int8).alarm


def test_bf16_checked_on_the_accumulator_catches_what_the_rounded_check_misses():
    ops = ("gemm_bfloat16", "gemm_bfloat16_rounded_check")
    combos = [(op, "gemm_output", cls, "single") for op in ops for cls in ("exponent", "mantissa", "sign")]
    fn = campaign.detection_trial_fn(combos, 5, "cpu", contextlib.nullcontext)
    outs = [fn(i) for i in range(240)]
    rate = {}
    for op in ops:
        sig = [o for o in outs if o["op"] == op and o["significant"]]
        rate[op] = sum(o["detected"] for o in sig) / len(sig)
    assert rate["gemm_bfloat16"] == 1.0
    assert rate["gemm_bfloat16_rounded_check"] < 0.95


def test_checked_linear_with_bias_matches_f_linear_and_detects():
    g = torch.Generator().manual_seed(1)
    x, w, bias = torch.randn(4, 5, 24, generator=g), torch.randn(12, 24, generator=g), torch.randn(12, generator=g)
    y, rep = abft.checked_linear(x, w, bias)
    assert not rep.alarm and torch.allclose(y, F.linear(x, w, bias), atol=1e-5)
    enc = abft.encode_gemm(x.reshape(-1, 24), w.t(), bias=bias)
    acc = F.linear(x.reshape(-1, 24), w, bias)
    bits.flip_bits_(acc, 40, [31])
    assert abft.verify_gemm(enc, acc, dtype=torch.float32).alarm


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("quant", [False, True])
def test_checked_embedding_bag_is_right_quiet_when_clean_and_detects_a_table_flip(mode, quant):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(300, 24, generator=g) * 3
    idx = torch.randint(0, 300, (90,), generator=g)
    off = torch.tensor([0, 10, 25, 25, 60])  # includes an empty bag
    if quant:
        table = abft.QuantizedTable.from_float(w)
        out, rep = abft.checked_quantized_embedding_bag(table, idx, off, mode)
        ref = F.embedding_bag(idx, table.dequantize().double(), off, mode=mode)
    else:
        table = abft.checked_table(w)
        out, rep = abft.checked_embedding_bag(table, idx, off, mode)
        ref = F.embedding_bag(idx, w.double(), off, mode=mode)
    assert not rep.alarm, rep.describe()
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    row = int(idx[12])  # in bag 1
    if quant:
        bad = table.packed.clone()
        bits.flip_bits_(bad, row * bad.shape[1] + 2, [6])
        _, rep = abft.checked_quantized_embedding_bag(abft.QuantizedTable(bad, table.checks, 24), idx, off, mode)
    else:
        bad = table.weight.clone()
        bits.flip_bits_(bad, row * bad.shape[1] + 2, [29])
        _, rep = abft.checked_embedding_bag(abft.CheckedTable(bad, table.checks), idx, off, mode)
    assert rep.alarm and 1 in rep.rows


@examples(120)
@given(m=st.integers(1, 90), k=st.integers(1, 200), n=st.integers(1, 90), dist=st.sampled_from(campaign.DISTRIBUTIONS),
       flips=st.integers(0, 2), bit=st.integers(0, 31), seed=st.integers(0, 2**31),
       path=st.sampled_from(["compiled", "primed", "torch"]))
def test_lower_bound_fast_path_reaches_the_verdict_of_the_exact_thresholds(m, k, n, dist, flips, bit, seed, path):
    # compiled: the one-call Numba verdict of the CPU; primed: the two-operation device verdict prepared
    # before the product (checked_mm off the CPU); torch: the host lower bound
    g = torch.Generator().manual_seed(seed)
    a, b = campaign.random_matrix((m, k), dist, g), campaign.random_matrix((k, n), dist, g)
    acc = a @ b
    rng = random.Random(seed)
    for _ in range(flips):
        bits.flip_bits_(acc, rng.randrange(m * n), [bit])
    with _kernels_on(path == "compiled"):
        enc = abft.encode_gemm(a, b)
        if path == "primed":
            abft.prime(enc, None)
            assert enc.rows.fast is not None
        fast = abft.verify_gemm(enc, acc, dtype=torch.float32)
        exact = abft.verify_gemm(enc, acc, dtype=torch.float32, exact_ratio=True)
    assert (fast.alarm, fast.rows, fast.cols) == (exact.alarm, exact.rows, exact.cols)
    if not exact.alarm:  # the fast ratio is an upper bound of the exact one
        assert fast.max_ratio >= exact.max_ratio * (1 - 1e-6) or fast.max_ratio == exact.max_ratio


def test_weighted_row_check_catches_an_operand_flip_the_plain_row_sum_cannot_see():
    g = torch.Generator().manual_seed(7)
    a = torch.randn(24, 32, generator=g)
    b = torch.randn(32, 40, generator=g)
    b -= b.mean(1, keepdim=True)  # rows of B sum to zero (LayerNorm-like): B e = 0, the plain row sum is blind
    enc = abft.encode_gemm(a, b)
    a_used = a.clone()
    bits.flip_bits_(a_used, 5 * 32 + 3, [30])  # a flip in the GEMM's copy of A, after encoding
    rep = abft.verify_gemm(enc, a_used @ b, dtype=torch.float32)
    assert rep.alarm and 5 in rep.rows
    plain = (a_used @ b).sum(1) - a @ b.sum(1)
    assert float(plain.abs().max()) < 1e-3 * float((a_used @ b - a @ b).abs().max())


def test_checked_linear_encodes_a_weight_once_and_again_after_an_update():
    g = torch.Generator().manual_seed(5)
    x, w, bias = torch.randn(16, 24, generator=g), torch.randn(8, 24, generator=g), torch.randn(8, generator=g)
    _, rep = abft.checked_linear(x, w, bias)
    enc = abft_linear._LINEARS.get(w, bias)
    assert not rep.alarm and abft_linear._LINEARS.get(w, bias) is enc
    with torch.no_grad():
        w.mul_(3.0)  # an optimizer step: the version changes, a stale encoding would raise alarms
    y, rep = abft.checked_linear(x, w, bias)
    assert not rep.alarm and abft_linear._LINEARS.get(w, bias) is not enc
    assert torch.allclose(y, F.linear(x, w, bias), atol=1e-5)
    with pytest.raises(UsageError):
        abft.encode_linear(w, torch.zeros(3))
    key = id(w)
    del w
    assert key not in abft_linear._LINEARS.entries  # the cached encoding does not keep a dead weight's memory


@examples(120)
@given(rows=st.integers(1, 120), d=st.sampled_from([1, 4, 16, 33]), lengths=st.lists(st.integers(0, 30), min_size=1,
       max_size=10), mode=st.sampled_from(["sum", "mean"]), weighted=st.booleans(),
       site=st.sampled_from(["clean", "table", "output"]), bit=st.integers(0, 31), seed=st.integers(0, 2**31),
       path=st.sampled_from(["compiled", "torch"]))
def test_embedding_bag_fast_path_reaches_the_exact_verdict(rows, d, lengths, mode, weighted, site, bit, seed, path):
    # compiled: the one-pass Numba verdict of the CPU; torch: the device-operation lower bound
    g = torch.Generator().manual_seed(seed)
    clean = abft.checked_table(torch.randn(rows, d, generator=g) * 10 ** (torch.rand(rows, 1, generator=g) * 4 - 2))
    idx = torch.randint(0, rows, (sum(lengths),), generator=g)
    off = torch.tensor([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()])
    psw = torch.rand(idx.numel(), generator=g) * 4 - 2 if weighted and mode == "sum" else None
    table = abft.CheckedTable(clean.weight.clone(), clean.checks)
    if site == "table" and idx.numel():
        bits.flip_bits_(table.weight, int(idx[0]) * d, [bit])
    out = F.embedding_bag(idx, table.weight, off, mode=mode, per_sample_weights=psw)
    if site == "output":
        bits.flip_bits_(out, (seed % len(lengths)) * d + seed % d, [bit])
    with _kernels_on(path == "compiled"):
        fast = abft.verify_bag_output(out, table.checks, idx, off, mode, psw)
        exact = abft.verify_bag_output(out, table.checks, idx, off, mode, psw, exact_ratio=True)
    assert (fast.alarm, fast.rows, fast.checked) == (exact.alarm, exact.rows, exact.checked)
    if not exact.alarm and exact.checked:  # the fast ratio is an upper bound of the exact one
        assert fast.max_ratio >= exact.max_ratio * (1 - 1e-6)


@needs_kernels
@examples(120)
@given(m=st.integers(1, 70), k=st.integers(1, 150), n=st.integers(1, 70), dist=st.sampled_from(campaign.DISTRIBUTIONS),
       flips=st.integers(0, 2), bit=st.integers(0, 31), seed=st.integers(0, 2**31),
       op=st.sampled_from(["mm", "linear", "linear_nobias"]))
def test_compiled_checked_products_reach_the_verdict_of_the_exact_path(m, k, n, dist, flips, bit, seed, op):
    # checked_mm / checked_linear take the compiled exact verdict on the CPU; flips land in the product's
    # output (the out= buffer, right after the product); the verdict must be the exact path's
    g = torch.Generator().manual_seed(seed)
    a, b = campaign.random_matrix((m, k), dist, g), campaign.random_matrix((k, n), dist, g)
    bias = campaign.random_matrix((1, n), dist, g).reshape(n) if op == "linear" else None
    rng = random.Random(seed)
    spots = [rng.randrange(m * n) for _ in range(flips)]
    product = torch.addmm if bias is not None else torch.mm

    def flipped(*args, out=None):
        product(*args, out=out)
        for spot in spots:
            bits.flip_bits_(out, spot, [bit])
        return out

    with mock.patch.object(torch, "addmm" if bias is not None else "mm", side_effect=flipped) as spy:
        if op == "mm":
            c, fast = abft.checked_mm(a, b)
        else:
            c, fast = abft.checked_linear(a, b.t().contiguous(), bias)
    assert spy.call_count == 1
    if op == "mm":
        exact = abft.verify_gemm(abft.encode_gemm(a, b), c, dtype=torch.float32, exact_ratio=True)
    else:
        exact = abft.verify_linear(abft.encode_linear(b.t().contiguous(), bias), a, c, dtype=torch.float32,
                                   exact_ratio=True)
    assert (fast.alarm, fast.rows, fast.cols, fast.checked) == (exact.alarm, exact.rows, exact.cols, exact.checked)
    if not spots:
        assert not fast.alarm


@needs_kernels
def test_the_compiled_verdicts_run_in_the_test_environment():
    # numba is a dependency: without it the "compiled" cases above would test the torch path twice
    assert _kernels.available()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 5, generator=g), torch.randn(5, 6, generator=g)
    enc = abft.encode_gemm(a, b)
    with mock.patch.object(abft_gemm, "gemm_lower", wraps=_kernels.gemm_lower) as spy:
        assert not abft.verify_gemm(enc, a @ b, dtype=torch.float32).alarm
    assert spy.call_count == 1
    abft_gemm._MM_PLANS.clear()  # (the kernels of a shape are looked up once, with its plan)
    with _raw_spy() as spy:
        assert not abft.checked_mm(a, b)[1].alarm
    assert [c.args[0] for c in spy.call_args_list] == ["b_pass", "a_pass", "mm_exact"]
    with _raw_spy() as spy:
        assert not abft.checked_linear(a, b.t().contiguous(), torch.randn(6, generator=g))[1].alarm
    assert [c.args[0] for c in spy.call_args_list] == ["x_pass", "mm_exact"]
    table = abft.checked_table(torch.randn(30, 4, generator=g))
    idx, off = torch.randint(0, 30, (12,), generator=g), torch.tensor([0, 5])
    with _raw_spy() as spy:
        assert not abft.checked_embedding_bag(table, idx, off)[1].alarm
    assert [c.args[0] for c in spy.call_args_list] == ["bag_lookup"]


@needs_kernels
@pytest.mark.parametrize("bad", ["index", "offset", "none"])
def test_the_compiled_bag_verdict_leaves_out_of_range_indices_and_offsets_to_the_exact_path(bad):
    g = torch.Generator().manual_seed(1)
    table = abft.checked_table(torch.randn(30, 4, generator=g))
    idx, off = torch.randint(0, 30, (12,), generator=g), torch.tensor([0, 5])
    out = F.embedding_bag(idx, table.weight, off, mode="sum")
    idx_bad, off_bad = {"index": (torch.cat([idx[:-1], torch.tensor([30])]), off),
                        "offset": (idx, torch.tensor([0, 13])), "none": (idx, off)}[bad]
    ref, got = np.empty(2), np.empty(2)
    worst = _kernels.raw("bag_verdict")(0, 2, out.numpy(), idx_bad.numpy(), off_bad.numpy(),
                                        table.checks.rowsum_view(), _kernels.NO_WEIGHTS, False, 1e-3, 1e-37, ref, got)
    if bad == "none":
        assert 0 <= worst <= 1.0
        np.testing.assert_allclose(got, out.double().sum(1).numpy(), rtol=1e-6)
        np.testing.assert_allclose(ref, [table.checks.rowsum[idx[:5], 0].double().sum(),
                                         table.checks.rowsum[idx[5:], 0].double().sum()], rtol=1e-6)
    else:
        assert worst == -1.0


def test_protect_checks_every_layer_and_flags_a_corrupted_linear_output():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    emb = torch.nn.EmbeddingBag(50, 16, mode="mean")
    idx, off = torch.randint(0, 50, (40,)), torch.arange(0, 40, 5)
    with torch.no_grad(), protect(model) as guard, protect(emb) as eguard:
        model(emb(idx, off))
        assert guard.checks == 2 and eguard.checks == 1 and not guard.alarms and not eguard.alarms
        with inject.flip_module_output(model[0], seed=1, bit_class="exponent", name="0") as recs:
            model(emb(idx, off))
    assert recs and [a.module for a in guard.alarms] == ["0"]
    assert not model[0]._forward_hooks  # hooks removed on exit


def test_flip_parameter_restores_the_exact_value():
    lin = torch.nn.Linear(8, 8)
    before = lin.weight.detach().clone()
    with inject.flip_parameter(lin, "weight", seed=4, bit_class="exponent") as rec:
        assert not torch.equal(lin.weight, before)
        assert rec.site == "parameter" and rec.original != rec.corrupted
    assert torch.equal(lin.weight, before)
    with pytest.raises(UsageError):
        with inject.flip_parameter(lin, "nope"):
            pass


def test_bitflip_mode_is_seeded_filters_ops_and_calls():
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    clean = a @ b

    def go(**kw):
        mode = BitFlipMode(**kw)
        with mode:
            outs = [a @ b, a + b, a @ b]
        return mode, outs

    m1, o1 = go(rate=0.01, bit_class="exponent", seed=7, ops="mm", calls=[1])
    m2, o2 = go(rate=0.01, bit_class="exponent", seed=7, ops="mm", calls=[1])
    assert m1.records and [r.as_dict() for r in m1.records] == [r.as_dict() for r in m2.records]
    assert torch.equal(o1[0], clean) and not torch.equal(o1[2], clean) and torch.equal(o1[1], a + b)
    assert all(r.bits[0] in range(23, 31) for r in m1.records)
    with pytest.raises(UsageError):
        BitFlipMode(rate=2.0)


# ----------------------------------------------------------------------------- campaigns

def _trial(i: int) -> dict:
    rng = random.Random(i * 7919)
    return {"x": rng.random(), "hit": rng.random() < 0.3}


def test_campaign_resumes_after_a_kill_without_losing_or_repeating_trials(tmp_path):
    full = campaign.Campaign("demo", {"a": 1}, 60, _trial, tmp_path / "full").run()

    class Killed(Exception):
        pass

    def dying(i: int) -> dict:
        if i == 23:
            raise Killed
        return _trial(i)

    camp = campaign.Campaign("demo", {"a": 1}, 60, dying, tmp_path / "resume")
    with pytest.raises(Killed):
        camp.run()
    path = camp.path
    assert len(path.read_text().splitlines()) == 24  # the config header + 23 outcomes
    with open(path, "a") as fh:  # a torn write and a duplicate of trial 0
        fh.write(json.dumps({"config": camp.hash, "trial": 0, "x": -1, "hit": True}) + "\n")
        fh.write('{"config": "' + camp.hash + '", "trial": 23, "x"')
    calls = []

    def counting(i: int) -> dict:
        calls.append(i)
        return _trial(i)

    resumed = campaign.Campaign("demo", {"a": 1}, 60, counting, tmp_path / "resume")
    out = resumed.run()
    assert calls == list(range(23, 60)) and resumed.resumed == 23
    assert [(o["trial"], o["x"], o["hit"]) for o in out] == [(o["trial"], o["x"], o["hit"]) for o in full]
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    assert len(lines) == 62  # header + 23 + the duplicate + 37 new, all parseable
    other = campaign.Campaign("demo", {"a": 2}, 60, counting, tmp_path / "resume")
    with pytest.raises(UsageError, match=r"a: 1 \(checkpoint\) vs 2 \(this run\)"):
        other.run()


def test_campaign_refuses_a_checkpoint_written_with_other_settings(tmp_path, monkeypatch):
    """A checkpoint of another config (other device, torch, trial count) is refused naming what differs:
    never reused, never silently ignored."""
    campaign.Campaign("demo", {"device_name": "GPU A", "seed": 0}, 10, _trial, tmp_path).run()
    for config, n, what in (({"device_name": "GPU B", "seed": 0}, 10, "device_name: 'GPU A'"),
                            ({"device_name": "GPU A", "seed": 1}, 10, "seed: 0"),
                            ({"device_name": "GPU A", "seed": 0}, 12, "n_trials: 10")):
        with pytest.raises(UsageError, match=what):
            campaign.Campaign("demo", config, n, _trial, tmp_path).run()
    monkeypatch.setattr(torch, "__version__", "0.0.1-other")
    with pytest.raises(UsageError, match="torch: .* vs '0.0.1-other'"):
        campaign.Campaign("demo", {"device_name": "GPU A", "seed": 0}, 10, _trial, tmp_path).load()
    monkeypatch.undo()
    calls = []
    again = campaign.Campaign("demo", {"device_name": "GPU A", "seed": 0}, 10, lambda i: calls.append(i) or _trial(i),
                              tmp_path)
    assert len(again.run()) == 10 and calls == [] and again.resumed == 10  # the same settings resume
    explicit = tmp_path / "explicit.jsonl"  # an explicit file without a header: its records' hash decides
    explicit.write_text(json.dumps({"config": "0123456789abcdef", "trial": 0, "x": 1.0, "hit": True}) + "\n")
    with pytest.raises(UsageError, match="config hash"):
        campaign.Campaign("demo", {"a": 1}, 5, _trial, checkpoint=explicit).run()


def test_detection_campaign_finds_every_significant_flip():
    combos = campaign.detection_combos((*campaign.GEMM_OPS, *campaign.EMB_OPS))
    fn = campaign.detection_trial_fn(combos, 11, "cpu", contextlib.nullcontext)
    outs = [fn(i) for i in range(len(combos) * 2)]
    sig = [o for o in outs if o["significant"]]
    assert len(sig) > 0.5 * len(outs)
    missed = [o for o in sig if not o["detected"]]
    assert not missed, missed[:3]
    assert any(not o["significant"] for o in outs)  # low mantissa flips exist and are classed benign


def test_clean_campaign_raises_no_alarm():
    fn = campaign.clean_trial_fn(3, "cpu", contextlib.nullcontext)
    outs = [fn(i) for i in range(450)]
    assert {o["op"] for o in outs} == set(campaign.CLEAN_OPS)
    assert not [o for o in outs if o["alarm"]]


@examples(80)
@given(rows=st.integers(1, 50), lengths=st.lists(st.integers(0, 12), min_size=1, max_size=12),
       mode=st.sampled_from(["sum", "mean"]), weighted=st.booleans(), seed=st.integers(0, 2**31))
def test_pooled_reference_equals_an_fp64_embedding_bag_for_any_bag_layout(rows, lengths, mode, weighted, seed):
    # empty bags first, in the middle and last, uniform and ragged layouts: the gathered reference
    # (index_select + fp64 reshape-sum or reduceat) is the fp64 EmbeddingBag of the row-sum column
    g = torch.Generator().manual_seed(seed)
    col = torch.randn(rows, 1, generator=g)
    idx = torch.randint(0, rows, (sum(lengths),), generator=g)
    off = torch.tensor([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()])
    psw = torch.rand(idx.numel(), generator=g) if weighted and mode == "sum" else None
    pooled, fp64 = bag_verdict._pooled(col, idx, off, mode, len(lengths), psw)
    got = pooled.double().numpy()
    ref = F.embedding_bag(idx, col.double(), off, mode=mode,
                          per_sample_weights=psw.double() if psw is not None else None)[:, 0]
    assert got.shape == (len(lengths),)
    # fp64 sums (ragged bags) agree to fp64 rounding; fp32 sums (uniform bags) within the gamma bound
    mag = F.embedding_bag(idx, col.double().abs(), off, mode=mode,
                          per_sample_weights=psw.double() if psw is not None else None)[:, 0].numpy()
    u = 2.0**-53 if fp64 else 2.0**-24
    weight_rounding = 2.0**-24 if psw is not None else 0.0  # the fp32 product psw * rowsum
    assert (np.abs(got - ref.numpy()) <= ((max(lengths) + 2) * u + weight_rounding) * mag + 1e-300).all()
    assert fp64 or len(set(lengths)) == 1


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("value", [1e20, 3e38, math.inf, math.nan])
def test_a_bag_output_corrupted_beyond_the_norms_range_is_flagged_not_waved_through(value, compiled):
    # the cheap threshold is read from the output itself: a corrupted value whose square overflows
    # must make that bound "no verdict", never a clean one
    g = torch.Generator().manual_seed(5)
    table = abft.checked_table(torch.randn(200, 64, generator=g))
    idx, off = torch.randint(0, 200, (120,), generator=g), torch.arange(0, 120, 10)
    out, rep = abft.checked_embedding_bag(table, idx, off)
    assert not rep.alarm
    bad = out.clone()
    bad[3, 5] = value
    with _kernels_on(compiled):
        rep = abft.verify_bag_output(bad, table.checks, idx, off, "sum")
    assert (rep.alarm and 3 in rep.rows) or not rep.checked, rep.describe()
    if math.isfinite(value):
        assert rep.alarm and rep.rows == [3]


@pytest.mark.parametrize("kind", ["bag_offsets", "bag_2d", "bag_last_offset", "bag_weighted", "bag_mean", "embedding"])
def test_protect_checks_every_kind_of_lookup_once_and_flags_a_corrupted_one(kind):
    torch.manual_seed(3)
    if kind == "embedding":
        mod, args = torch.nn.Embedding(80, 24), (torch.randint(0, 80, (6, 7)),)
    else:
        mode = "mean" if kind == "bag_mean" else "sum"
        mod = torch.nn.EmbeddingBag(80, 24, mode=mode, include_last_offset=kind == "bag_last_offset")
        idx = torch.randint(0, 80, (50,))
        off = torch.tensor([0, 4, 4, 19, 33])  # ragged, one empty bag
        args = {"bag_2d": (idx[:48].reshape(6, 8),),
                "bag_last_offset": (idx, torch.cat([off, torch.tensor([50])])),
                "bag_weighted": (idx, off, torch.rand(50))}.get(kind, (idx, off))
    pooled = []
    real, compiled = bag_verdict._pooled, _kernels.raw
    with torch.no_grad(), protect(mod) as guard, \
            mock.patch.object(bag_verdict, "_pooled", lambda *a, **k: pooled.append(1) or real(*a, **k)), \
            _raw_spy(lambda name: pooled.append(name) or compiled(name)):
        clean = mod(*args)
        # one row-sum gather per call: torch's (_pooled), the compiled verdict's or the fused lookup's
        assert guard.checks == 1 and not guard.alarms and \
            len([p for p in pooled if p in (1, "bag_verdict", "bag_lookup")]) == 1, pooled
        with inject.flip_module_output(mod, seed=2, bit_class="exponent", name="emb") as recs:
            mod(*args)
    assert recs and len(guard.alarms) == 1, [a.describe() for a in guard.alarms]
    ref = F.embedding(args[0], mod.weight) if kind == "embedding" else None
    assert ref is None or torch.equal(clean, ref)


def test_bitflip_mode_corrupts_the_result_of_an_out_variant_but_leaves_in_place_ops_alone():
    # checked_mm / checked_linear write their product with out=: a faulty device corrupts that
    # result like any other, so the dispatch-mode fault simulation must reach it
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    out = torch.empty(8, 8)
    with BitFlipMode(rate=1.0, bit_class="sign", seed=0, ops="mm,add_") as mode:
        torch.mm(a, b, out=out)
        x = torch.ones(4)
        x.add_(1.0)
    assert len(mode.records) == 64 and all("mm" in r.target for r in mode.records)
    assert torch.equal(out, -(a @ b)) and torch.equal(x, torch.full((4,), 2.0))
    with BitFlipMode(rate=1.0, bit_class="exponent", seed=0, ops="mm"):
        _, rep = abft.checked_mm(a, b)
    assert rep.alarm



@needs_kernels
def test_protect_takes_the_compiled_linear_check_while_training():
    # outputs that require grad (a training step) are read through detached views: still compiled
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 12)
    with protect(model) as guard, _raw_spy() as spy:
        model(x).sum().backward()
    assert [c.args[0] for c in spy.call_args_list] == ["x_pass", "mm_exact"] * 2 and guard.checks == 2 and not guard.alarms
    assert model[0].weight.grad is not None


@needs_kernels
def test_a_kernel_cache_numba_cannot_load_falls_back_to_compiling_without_it(monkeypatch):
    # (seen: an index written by a process that imported the package under another name raises
    # ModuleNotFoundError on load; the checks must go on, not fail)
    monkeypatch.setattr(_kernels, "_STATE", {})
    real = _kernels._smoke
    calls = []

    def smoke(k):
        calls.append(k)
        if len(calls) == 1:
            raise ModuleNotFoundError("No module named 'validators'")
        real(k)

    monkeypatch.setattr(_kernels, "_smoke", smoke)
    with pytest.warns(RuntimeWarning, match="could not be loaded"):
        assert _kernels.available()
    assert len(calls) == 2 and calls[1] is _kernels._STATE["k"]
    g = torch.Generator().manual_seed(0)
    assert not abft.checked_mm(torch.randn(6, 5, generator=g), torch.randn(5, 4, generator=g))[1].alarm


# ----------------------------------------------------------------------------- fused EmbeddingBag lookup

def _spy_kernels():
    names: list[str] = []
    real = _kernels.raw
    return names, _raw_spy(lambda name: names.append(name) or real(name))


@needs_kernels
@examples(40)
@given(seed=st.integers(0, 2**31 - 1), d=st.sampled_from([1, 7, 16, 17, 63, 64, 65, 128, 130, 200, 256]),
       mode=st.sampled_from(["sum", "mean", "weighted"]), quantized=st.booleans(), int32=st.booleans())
def test_the_fused_lookup_returns_torchs_output_bitwise_and_no_alarm(seed, d, mode, quantized, int32):
    # the checked EmbeddingBag computes the lookup itself on the CPU: it must be torch's, bit for bit
    # (ragged and empty bags, every column chunk, int32 and int64 indices, weights, 8-bit rows)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    rows = rng.randint(1, 300)
    lengths = [rng.choice([0, 1, 2, 5, 17, 40]) for _ in range(rng.randint(1, 12))]
    dt = torch.int32 if int32 else torch.int64
    idx = torch.randint(0, rows, (sum(lengths),), generator=g).to(dt)
    off = torch.tensor([0, *np.cumsum(lengths)[:-1].tolist()], dtype=dt)
    w = torch.randn(rows, d, generator=g) * torch.logspace(-4, 4, rows)[:, None]
    weighted = mode == "weighted" and not quantized
    psw = torch.randn(idx.shape[0], generator=g) if weighted else None
    pool = "mean" if mode == "mean" else "sum"
    names, spy = _spy_kernels()
    with spy:
        if quantized:
            table = abft.QuantizedTable.from_float(w)
            out, rep = abft.checked_quantized_embedding_bag(table, idx, off, pool)
            want = abft.quantized_embedding_bag(table, idx.long(), off.long(), pool)
        else:
            out, rep = abft.checked_embedding_bag(abft.checked_table(w), idx, off, pool, per_sample_weights=psw)
            want = F.embedding_bag(idx, w, off, mode=pool, per_sample_weights=psw)
    assert names[0] == "bag_lookup"
    assert torch.equal(out, want) and out.dtype == torch.float32 and out.is_contiguous()
    assert not rep.alarm and rep.checked and rep.max_ratio <= 1.0


@needs_kernels
@pytest.mark.parametrize(("quantized", "site"), [(False, "row"), (True, "row"), (True, "scale_bias")])
def test_the_fused_lookup_flags_a_flipped_table_row_in_its_bag(quantized, site):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(100, 64, generator=g)
    idx = torch.randint(0, 100, (60,), generator=g)
    off = torch.tensor([0, 20, 40])
    row = int(idx[45])  # in bag 2 only
    idx[:40] = torch.where(idx[:40] == row, (row + 1) % 100, idx[:40])
    names, spy = _spy_kernels()
    if quantized:
        table = abft.QuantizedTable.from_float(w)
        packed = table.packed.clone()
        col = 64 + 3 if site == "scale_bias" else 10  # the scale's top byte, or a code's top bit
        packed[row, col] ^= 0x40 if site == "scale_bias" else 0x80
        faulty = abft.QuantizedTable(packed, table.checks, 64)
        with spy:
            out, rep = abft.checked_quantized_embedding_bag(faulty, idx, off)
        assert torch.equal(out, abft.quantized_embedding_bag(faulty, idx, off))
    else:
        table = abft.checked_table(w)
        bad = table.weight.clone()
        bad.view(torch.int32)[row, 7] ^= 1 << 29  # an exponent bit
        with spy:
            out, rep = abft.checked_embedding_bag(abft.CheckedTable(bad, table.checks), idx, off)
        assert torch.equal(out, F.embedding_bag(idx, bad, off, mode="sum"))
    assert names[0] == "bag_lookup" and rep.alarm and rep.rows == [2], rep.describe()


@needs_kernels
@pytest.mark.parametrize("index", [100, -1])
def test_the_fused_lookup_leaves_an_out_of_range_index_to_torch(index):
    table = abft.checked_table(torch.randn(100, 32))
    idx, off = torch.tensor([1, 2, index, 3]), torch.tensor([0, 2])
    with pytest.raises(RuntimeError, match="valid range"):
        F.embedding_bag(idx, table.weight, off)
    with pytest.raises(RuntimeError, match="valid range"):
        abft.checked_embedding_bag(table, idx, off)
    with pytest.raises(RuntimeError, match="offsets"):
        abft.checked_embedding_bag(table, torch.tensor([1, 2]), torch.tensor([0, 3]))


@needs_kernels
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("pos", [0, 17, 150, 199])
@pytest.mark.parametrize("index", [10**9, -(10**9), 100])
def test_the_fused_lookup_checks_every_index_before_reading_a_row(pos, index, quantized):
    # the compiled loop reads (and prefetches 16 ahead) without a bound of its own: one index out of
    # range anywhere, in a later bag or the last position, sends the whole call to torch, which refuses it
    g = torch.Generator().manual_seed(pos)
    w = torch.randn(100, 64, generator=g)
    idx, off = torch.randint(0, 100, (200,), generator=g), torch.arange(0, 200, 20)
    idx[pos] = index
    with pytest.raises(RuntimeError):
        if quantized:
            abft.checked_quantized_embedding_bag(abft.QuantizedTable.from_float(w), idx, off)
        else:
            abft.checked_embedding_bag(abft.checked_table(w), idx, off)


@needs_kernels
def test_torchs_lookup_runs_under_a_dispatch_mode_under_autograd_and_where_the_kernels_disagree(monkeypatch):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(50, 16, generator=g)
    idx, off = torch.randint(0, 50, (30,), generator=g), torch.tensor([0, 10, 20])
    table = abft.checked_table(w)
    # a fault simulated on torch's operators reaches the lookup (and is caught)
    with BitFlipMode(rate=1.0, bit_class="exponent", seed=0, max_flips=1,
                            ops="_embedding_bag_forward_only,_embedding_bag"):
        out, rep = abft.checked_embedding_bag(table, idx, off)
    assert rep.alarm and not torch.equal(out, F.embedding_bag(idx, w, off))
    # autograd: torch's lookup, whose output carries the graph
    leaf = torch.nn.Parameter(w.clone())
    names, spy = _spy_kernels()
    with spy:
        out, rep = abft.checked_embedding_bag(abft.CheckedTable(leaf, table.checks), idx, off)
    assert out.grad_fn is not None and not rep.alarm and "bag_lookup" not in names
    # strided per-sample weights: torch pools them with another kernel, which rounds otherwise
    psw = torch.randn(60, generator=g)[::2]
    names, spy = _spy_kernels()
    with spy:
        out, rep = abft.checked_embedding_bag(table, idx, off, per_sample_weights=psw)
    assert torch.equal(out, F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw)) and not rep.alarm
    assert "bag_lookup" not in names
    # a torch build that rounds otherwise: the fused lookup is not used
    monkeypatch.setitem(fused_lookup._AGREE, (False, False), False)
    names, spy = _spy_kernels()
    with spy:
        assert not abft.checked_embedding_bag(table, idx, off)[1].alarm
    assert names == ["bag_verdict"]


@needs_kernels
def test_the_fused_lookup_agreement_check_catches_a_kernel_that_rounds_otherwise(monkeypatch):
    monkeypatch.setattr(fused_lookup, "_AGREE", {})
    assert fused_lookup.fused_lookups_agree(False, True) and fused_lookup.fused_lookups_agree(True, False)
    real = _kernels._kernels()["bag_lookup"]

    def off_by_one_ulp(*args):
        worst = real(*args)
        args[5][0, 0] = np.nextafter(args[5][0, 0], np.float32(np.inf))
        return worst

    monkeypatch.setattr(fused_lookup, "_AGREE", {})
    monkeypatch.setitem(_kernels._kernels(), "bag_lookup", off_by_one_ulp)
    assert not fused_lookup.fused_lookups_agree(False, False)


@needs_kernels
def test_protect_runs_the_fused_lookup_keeps_outputs_and_restores_the_module():
    torch.manual_seed(4)
    bag = torch.nn.EmbeddingBag(200, 64, mode="sum")
    idx, off = torch.randint(0, 200, (90,)), torch.tensor([0, 30, 60])
    with torch.no_grad():
        want = bag(idx, off)
        names, spy = _spy_kernels()
        with protect(bag) as guard, spy:
            assert "forward" in bag.__dict__
            got = bag(idx, off)
            got_kw = bag(input=idx, offsets=off)  # keyword arguments: the hooks see them too
            with inject.flip_module_output(bag, seed=3, bit_class="exponent", name="bag") as recs:
                bag(idx, off)
        assert "forward" not in bag.__dict__ and not bag._forward_hooks and not bag._forward_pre_hooks
    assert torch.equal(got, want) and torch.equal(got_kw, want)
    # the lookup checks its bags in its own pass; the hook passes over the output again only where another
    # forward hook ran before it (the injected flip)
    assert names.count("bag_lookup") == 3 and names.count("bag_out_verdict") == 1
    assert guard.checks == 3 and recs and len(guard.alarms) == 1
    # the output flip came after the lookup: the hook's pass over the output saw it
    assert guard.alarms[0].call == 3


# ----------------------------------------------------------------------------- review findings (fused paths)

def _both_reports(w, checks, idx, off, delta):
    bad = w.clone()
    bad[:, 3] += delta
    table = abft.CheckedTable(bad, checks)
    return (abft.checked_embedding_bag(table, idx, off)[1],
            abft.checked_embedding_bag(table, idx, off, exact_ratio=True)[1])


@needs_kernels
@pytest.mark.parametrize("d", [16, 128])
def test_a_fused_clean_verdict_is_clean_on_the_exact_path_at_the_threshold(d):
    # faults sized so that the fused verdict sits just under its threshold: the exact path must agree
    # (the two sum the output in different orders: both in fp64, and a margin of 2^-10 for the fused one)
    g = torch.Generator().manual_seed(d)
    for _ in range(40):
        w = torch.randn(8, d, generator=g) * torch.rand(8, 1, generator=g) * 10
        w[:, : d // 2] += 5.0
        checks = abft.EmbeddingChecks.of(w)
        idx, off = torch.arange(8), torch.arange(8)  # one index per bag: the least slack

        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if not _both_reports(w, checks, idx, off, mid)[0].alarm else (lo, mid)
        fused, exact = _both_reports(w, checks, idx, off, lo)
        assert not fused.alarm and not exact.alarm, (fused.max_ratio, exact.max_ratio)


def test_protect_leaves_wrong_input_widths_and_offsets_to_torch():
    torch.manual_seed(0)
    lin, bag = torch.nn.Linear(4, 8), torch.nn.EmbeddingBag(10, 16, mode="sum")
    empty = torch.nn.EmbeddingBag(0, 1000, mode="sum")
    with torch.no_grad(), protect(lin) as guard, protect(bag), protect(empty):
        with pytest.raises(RuntimeError):
            lin(torch.randn(2, 100_000))  # (read past the encoding before: a crash)
        with pytest.raises(ValueError, match="offsets has to be None"):
            bag(torch.randint(0, 10, (3, 4)), torch.tensor([0, 1, 2]))
        with pytest.raises(RuntimeError, match="offsets"):
            bag(torch.arange(1, 6), torch.tensor([1, 3]))  # a first offset other than 0
        with pytest.raises(RuntimeError, match="valid range"):
            empty(torch.tensor([0]), torch.tensor([0]))  # (no row 0 to fall back on: a read past the table before)
    assert not guard.alarms
    with pytest.raises(RuntimeError):
        abft.checked_linear(torch.randn(2, 100_000), torch.randn(8, 4))
    with pytest.raises(UsageError, match="no offsets"):
        abft.checked_embedding_bag(abft.checked_table(torch.randn(10, 4)), torch.zeros(2, 3, dtype=torch.long),
                                   torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="offsets"):
        abft.checked_embedding_bag(abft.checked_table(torch.randn(10, 4)), torch.arange(1, 6), torch.tensor([1, 3]))
    with pytest.raises(RuntimeError, match="valid range"):
        abft.checked_embedding_bag(abft.checked_table(torch.empty(0, 1000)), torch.tensor([0]), torch.tensor([0]))


@needs_kernels
def test_a_protected_embedding_bag_copies_restores_and_follows_its_weight():
    import copy

    torch.manual_seed(1)
    bag = torch.nn.EmbeddingBag(20, 16, mode="sum")
    idx, off = torch.randint(0, 20, (12,)), torch.tensor([0, 5])
    with torch.no_grad():
        g1 = protect(bag)
        twin = copy.deepcopy(bag)  # its forward is bound to the copy, not to the original
        twin.weight.mul_(2)
        assert torch.equal(twin(idx, off), F.embedding_bag(idx, twin.weight, off, mode="sum"))
        bag.weight.data = bag.weight.data.view(40, 8)  # same storage, same version, another shape
        assert torch.equal(bag(idx, off), F.embedding_bag(idx, bag.weight, off, mode="sum"))
        with torch.device("meta"):  # a default device (a TorchFunctionMode): torch's lookup, as unprotected
            assert torch.equal(bag(idx, off), F.embedding_bag(idx, bag.weight, off, mode="sum"))
        g2 = protect(bag)
        g1.remove()  # guards removed out of order: no protected forward stays behind
        g2.remove()
    assert "forward" not in bag.__dict__ and not g1.alarms and not g2.alarms


def test_two_dimensional_indices_take_two_dimensional_per_sample_weights_as_torch_does():
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(30, 16, mode="sum")
    idx, psw = torch.randint(0, 30, (4, 5)), torch.randn(4, 5)
    with torch.no_grad():
        want = bag(idx, per_sample_weights=psw)
        with protect(bag) as guard:
            assert torch.equal(bag(idx, per_sample_weights=psw), want)
        out, rep = abft.checked_embedding_bag(abft.checked_table(bag.weight), idx, per_sample_weights=psw)
        assert torch.equal(out, want) and not rep.alarm
        assert not abft.verify_bag_output(want, abft.EmbeddingChecks.of(bag.weight), idx, None, "sum", psw).alarm
    assert guard.checks == 1 and not guard.alarms
