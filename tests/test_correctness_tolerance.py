"""Error measures, bounds and storage-preserving copies of the correctness validator."""

from __future__ import annotations

import math

import pytest
import torch
from hyp import examples
from hypothesis import example, given
from hypothesis import strategies as st
from mystique.validators.correctness import engine
from mystique.validators.correctness import tolerance as tol

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _next_up(x: torch.Tensor) -> torch.Tensor:
    """Every element moved one ulp away from zero (bit pattern + 1), in x's dtype."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[x.dtype]
    return (x.view(view) + 1).view(x.dtype)


def _other_neighbour(ref: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """The other representable neighbour of ``exact`` than the correctly rounded ``ref`` (a faithful
    rounding: what a valid algorithm that rounds twice may return), within one ulp of ``exact``."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[ref.dtype]
    away = (ref.double().abs() < exact.abs()).to(view) * 2 - 1  # +1: step away from zero, -1: towards it
    other = (ref.view(view) + away).view(ref.dtype)
    return torch.where(ref.double() == exact, ref, other)


@given(dtype=st.sampled_from(FLOATS), k1=st.integers(1, 10**6), k2=st.integers(1, 10**6),
       s1=st.floats(0, 1), s2=st.floats(0, 1))
def test_floor_grows_with_terms_and_sensitivity_and_never_drops_below_the_output_rounding(dtype, k1, k2, s1, s2):
    lo_k, hi_k = sorted((k1, k2))
    lo_s, hi_s = sorted((s1, s2))
    assert tol.floor_bound(dtype, lo_k, lo_s) <= tol.floor_bound(dtype, hi_k, lo_s)
    assert tol.floor_bound(dtype, lo_k, lo_s) <= tol.floor_bound(dtype, lo_k, hi_s)
    assert tol.floor_bound(dtype, lo_k, lo_s) >= tol.OUTPUT_ROUNDINGS[dtype] * tol.unit_roundoff(dtype)


def test_unit_roundoff_and_accumulation_dtypes():
    assert tol.unit_roundoff(torch.float32) == 2.0 ** -24
    assert tol.unit_roundoff(torch.bfloat16) == 2.0 ** -8
    assert tol.unit_roundoff(torch.float16) == 2.0 ** -11
    assert tol.accumulation_dtype(torch.bfloat16) == torch.float32
    assert tol.accumulation_dtype(torch.float64) == torch.float64
    with pytest.raises(ValueError):
        tol.unit_roundoff(torch.int32)


@examples(40)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**31 - 1), scale_exp=st.integers(-20, 20))
def test_normwise_error_is_zero_on_itself_and_invariant_under_power_of_two_scaling(n, seed, scale_exp):
    g = torch.Generator().manual_seed(seed)
    exact = torch.randn(n, generator=g, dtype=torch.float64)
    x = exact.float()
    assert tol.normwise_error(exact, exact) == 0.0
    a = 2.0 ** scale_exp
    assert tol.normwise_error(x * a, exact * a) == pytest.approx(tol.normwise_error(x, exact), rel=1e-12)
    assert tol.normwise_error(x, exact) <= 2.0 ** -24  # one rounding per element


def test_normwise_error_requires_matching_non_finite_values():
    exact = torch.tensor([1.0, float("nan"), float("inf"), 2.0], dtype=torch.float64)
    assert tol.normwise_error(exact.float(), exact) == 0.0
    assert tol.normwise_error(torch.tensor([1.0, 0.0, float("inf"), 2.0]), exact) == math.inf
    assert tol.normwise_error(torch.tensor([1.0, float("nan"), float("-inf"), 2.0]), exact) == math.inf
    assert tol.normwise_error(torch.tensor([1.0, float("nan"), float("inf"), float("nan")]), exact) == math.inf
    zero = torch.zeros(3, dtype=torch.float64)
    assert tol.normwise_error(torch.tensor([0.0, 3.0, 4.0]), zero) == 5.0  # absolute when ||exact|| = 0
    with pytest.raises(ValueError):
        tol.normwise_error(torch.zeros(2), torch.zeros(3, dtype=torch.float64))


@examples(30)
@example(dtype=torch.bfloat16, n=8, seed=3628800)  # found by the fuzz profile: next_up(ref) is 1.5 ulp off
@given(dtype=st.sampled_from((torch.float32, torch.bfloat16, torch.float16)), n=st.integers(8, 400),
       seed=st.integers(0, 2**31 - 1))
def test_one_ulp_differences_pass_and_a_thousandth_fails(dtype, n, seed):
    """A faithfully rounded target (each element either neighbour of the exact value: error < 1 ulp <=
    2u, the bf16/fp16 floor) passes. One ulp from the correctly rounded reference is not always that:
    when the reference was rounded away from zero, the next value away is 1.5 ulp (up to 3u) off."""
    g = torch.Generator().manual_seed(seed)
    exact = torch.randn(n, generator=g, dtype=torch.float64)
    ref = exact.to(dtype)
    flip = torch.rand(n, generator=g) < 0.5
    one_ulp = torch.where(flip, _other_neighbour(ref, exact), ref)  # what another valid algorithm may return
    assert ((one_ulp.double() - exact).abs() <= (_next_up(ref).double() - ref.double()).abs()).all()
    assert tol.judge(one_ulp, ref, exact).status == "pass"
    assert tol.judge(ref.clone(), ref, exact).kind == "bitwise"
    wrong = (exact * (1 + 1e-3 * torch.sign(torch.randn(n, generator=g, dtype=torch.float64)))).to(dtype)
    if dtype == torch.float32:
        v = tol.judge(wrong, ref, exact)
        assert v.status == "fail" and v.ratio > 1 and v.err_target > v.bound


def test_reference_error_scales_the_bound():
    exact = torch.linspace(1, 2, 100, dtype=torch.float64)
    noisy_ref = (exact * (1 + 1e-4 * torch.cos(torch.arange(100.0, dtype=torch.float64)))).float()
    target = (exact * (1 + 1.5e-4 * torch.sin(torch.arange(100.0, dtype=torch.float64)))).float()
    v = tol.judge(target, noisy_ref, exact)
    assert v.status == "pass" and v.bound == pytest.approx(2 * v.err_reference)
    worse = (exact * (1 + 5e-4 * torch.sin(torch.arange(100.0, dtype=torch.float64)))).float()
    assert tol.judge(worse, noisy_ref, exact).status == "fail"


def test_exact_outputs_must_match_and_kinds_must_agree():
    a = torch.tensor([1, 2, 3])
    assert tol.judge(a.clone(), a).status == "pass"
    v = tol.judge(torch.tensor([1, 2, 4]), a)
    assert v.status == "fail" and v.kind == "exact" and v.err_target == pytest.approx(1 / 3)
    assert tol.judge(torch.ones(3, dtype=torch.float64).float(), torch.ones(3, dtype=torch.float64)).status == "fail"
    assert tol.judge(torch.float32, torch.float32).status == "pass"
    assert tol.judge(3, 4).status == "fail"
    assert tol.judge(float("nan"), float("nan")).status == "pass"


def test_without_fp64_the_floor_alone_judges():
    ref = torch.randn(50)
    v = tol.judge(_next_up(ref), ref, None)
    assert v.kind == "reference" and v.status == "pass"
    assert tol.judge(ref * 1.001, ref, None).status == "fail"


@pytest.mark.parametrize("op,inputs,out_shape,k", [
    ("aten::mm.default", [torch.zeros(4, 96), torch.zeros(96, 8)], (4, 8), 96),
    ("aten::addmm.default", [torch.zeros(8), torch.zeros(4, 48), torch.zeros(48, 8)], (4, 8), 48),
    ("aten::linear.default", [torch.zeros(2, 5, 64), torch.zeros(16, 64)], (2, 5, 16), 64),
    ("aten::sum.dim_IntList", [torch.zeros(10, 300)], (10,), 300),
    ("aten::gelu.default", [torch.zeros(10, 300)], (10, 300), 1),
    ("aten::_softmax.default", [torch.zeros(10, 30)], (10, 30), 30),
    ("aten::embedding_dense_backward.default", [torch.zeros(40, 8), torch.zeros(40, dtype=torch.long)],
     (100, 8), 40),
    # a mixture of experts' grouped GEMMs: the contracted dimension, not the weights' numel / the output's (8)
    ("aten::_grouped_mm.default", [torch.zeros(32, 64), torch.zeros(4, 64, 128),
                                   torch.tensor([8, 16, 24, 32], dtype=torch.int32)], (32, 128), 64),
    ("aten::_grouped_mm.default", [torch.zeros(32, 128), torch.zeros(4, 64, 128).transpose(-2, -1),
                                   torch.tensor([8, 16, 24, 32], dtype=torch.int32)], (32, 64), 128),
    # the weight gradient (K, T) @ (T, N): each expert's output sums its own group's tokens (the largest, 20)
    ("aten::_grouped_mm.default", [torch.zeros(64, 32), torch.zeros(32, 128),
                                   torch.tensor([20, 24, 30, 32], dtype=torch.int32)], (4, 64, 128), 20),
])
def test_reduction_length_estimates(op, inputs, out_shape, k):
    assert tol.reduction_length(op, inputs, torch.zeros(out_shape)) == k


def test_clone_group_keeps_aliasing_layout_and_upcasts():
    base = torch.arange(24, dtype=torch.float32)
    a = base[2:14].view(3, 4)
    b = base.view(4, 6).t()  # non-contiguous view of the same storage
    c = torch.ones(2)
    ca, cb, cc = engine.clone_group([a, b, c], torch.device("cpu"))
    assert ca.untyped_storage().data_ptr() == cb.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert cb.stride() == b.stride() and torch.equal(ca, a) and torch.equal(cb, b) and torch.equal(cc, c)
    ca.add_(100)  # writes through to the other copy, not to the original
    assert torch.equal(cb, b + 100 * ((b >= 2) & (b < 14))) and base[2] == 2
    da, db = engine.clone_group([a, b], torch.device("cpu"), upcast=True)
    assert da.dtype == db.dtype == torch.float64 and torch.equal(db, b.double())
    assert da.untyped_storage().data_ptr() == db.untyped_storage().data_ptr()
    pa, = engine.clone_group([a], torch.device("cpu"), upcast=True, perturb=torch.Generator().manual_seed(0))
    rel = ((pa - a.double()) / a.double()).abs().max()
    assert 0 < rel <= 2.0 ** -24
    ca.detach_()  # a tensor on the copy, not an autograd view: in-place detach works


def test_classification_of_random_and_undefined_ops():
    assert engine.classify("aten::native_dropout.default") == "random op"
    assert engine.classify("aten::bernoulli_.float") == "random op"
    assert engine.classify("aten::randperm.default") == "random op"
    assert engine.classify("aten::empty_strided.default") == "undefined memory"
    assert engine.classify("aten::resize_.default") == "undefined memory"
    assert engine.classify("aten::nonzero.default") is None
    assert engine.classify("aten::mm.default") is None
    # the arguments decide for dropouts (p = 0 or eval: no draw); other namespaces are never aten's draws
    assert engine.classify("aten::dropout.default", {"p": 0.0, "train": True}) is None
    assert engine.classify("aten::feature_dropout.default", {"p": 0.2, "train": False}) is None
    assert engine.classify("aten::rand_like.default", {"p": 0.0}) == "random op"
    assert engine.classify("mylib::dropout.default", {"p": 0.5, "train": True}) is None


def test_records_name_the_outputs_not_compared_as_is():
    from mystique.validators import correctness

    rec = engine.OpRecord(7, "aten::embedding_bag", "aten::embedding_bag.padding_idx", "pass", kind="bitwise",
                          input_shapes=[[100, 8], [48], [16]], output_shapes=[[16, 8], [0], [16], [16]],
                          err_reference=1e-8, excluded="outputs 1-3 of aten::embedding_bag not compared: x")
    assert rec.describe().endswith("bitwise equal to the reference (error vs fp64 1e-08); "
                                   "outputs 1-3 of aten::embedding_bag not compared: x")
    rec.reason = "note"
    assert correctness.ops_csv_text([rec]).splitlines()[1].endswith(
        ",note; outputs 1-3 of aten::embedding_bag not compared: x")
    bare = engine.OpRecord(1, "aten::mm", "aten::mm.default", "pass", kind="bitwise")
    assert "not compared" not in bare.describe() and correctness.ops_csv_text([bare]).splitlines()[1].endswith(",")
