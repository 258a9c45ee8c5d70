"""Numeric faults reach a mixture of experts' grouped GEMM (``aten::_grouped_mm``, issue 34): each
group is one GEMM, and ``stuck_lane``, ``low_precision_accum`` and ``nondeterministic_reduction`` treat
it as one, group by group, on every layout (2D x 3D, 2D x 2D, 3D x 2D) and in autograd's backward;
the validators catch a fault confined to the experts' GEMMs on Llama 4."""

from __future__ import annotations

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.errors import UsageError
from mystique.faults import grouped_parts, low_precision_matmul
from mystique.targets import make_target

LAYOUTS = ("rows", "inner", "cols")


def operands(layout: str, loads: list[int], k: int, n: int, dtype=torch.float32, seed: int = 0):
    """(a, b, offs) of one grouped GEMM of ``layout`` whose groups hold ``loads`` (dims multiples of 8:
    the CPU kernel wants 16-byte strides)."""
    g = torch.Generator().manual_seed(seed)
    t, e = sum(loads), len(loads)
    offs = torch.tensor(loads).cumsum(0).to(torch.int32)
    if layout == "rows":  # (T, K) @ (E, K, N): the forward
        a, b = torch.randn(t, k, generator=g), torch.randn(e, k, n, generator=g)
    elif layout == "inner":  # (K, T) @ (T, N) -> (E, K, N): the weight gradient
        a, b = torch.randn(t, k, generator=g).t(), torch.randn(t, n, generator=g)
    else:  # (E, M, K) @ (K, T) -> (M, T)
        a, b = torch.randn(e, n, k, generator=g), torch.randn(t, k, generator=g).t()
    return a.to(dtype), b.to(dtype), offs


def faulty(spec: str, a, b, offs):
    with make_target("cpu", spec).active():
        return torch._grouped_mm(a, b, offs=offs)


loads_st = st.lists(st.sampled_from([0, 1, 3, 8, 13]), min_size=1, max_size=4).filter(lambda xs: sum(xs) % 8 == 0
                                                                                       and sum(xs) > 0)


@examples(40)
@given(layout=st.sampled_from(LAYOUTS), loads=loads_st)
def test_grouped_parts_are_the_grouped_gemm(layout, loads):
    # the law the faults rest on: the grouped GEMM is the ordinary GEMMs of its parts, each in its place
    a, b, offs = operands(layout, loads, 16, 8)
    out = torch._grouped_mm(a, b, offs=offs)
    for index, a_g, b_g in grouped_parts(a, b, offs):
        torch.testing.assert_close(out[index], a_g @ b_g, rtol=1e-5, atol=1e-5)


@examples(40)
@given(layout=st.sampled_from(LAYOUTS), loads=loads_st, lane=st.integers(0, 3), width=st.sampled_from([4, 8]))
def test_stuck_lane_sticks_each_groups_own_lane(layout, loads, lane, width):
    a, b, offs = operands(layout, loads, 16, 8)
    healthy = torch._grouped_mm(a, b, offs=offs)
    got = faulty(f"stuck_lane:lane={lane},width={width},value=7", a, b, offs)
    want = healthy.clone()
    for index, _, _ in grouped_parts(a, b, offs):
        want[index][..., lane::width] = 7.0  # counted from the group's first output column
    if layout == "rows":  # rows past the last group's end are no group's: as the device wrote them
        want[int(offs[-1]):] = got[int(offs[-1]):]
    assert torch.equal(got, want)


def test_stuck_lane_on_side_by_side_groups_counts_from_each_group():
    # 3D x 2D: groups of 3, 0 and 5 output columns; lane 1 of width 4 is column 1 of group 0 and column 3 + 1
    a, b, offs = operands("cols", [3, 0, 5], 16, 8)
    got = faulty("stuck_lane:lane=1,width=4,value=7", a, b, offs)
    assert [j for j in range(8) if bool((got[:, j] == 7).all())] == [1, 4]


def test_stuck_lane_reaches_the_backward_grouped_gemms():
    # llama4's expert weights' gradient is a 2D x 2D grouped GEMM: a stuck lane there changes w.grad
    a, w, offs = operands("rows", [8, 0, 8], 16, 16)
    up = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))  # the gradient flowing in
    grads = []
    for spec in (None, "stuck_lane:lane=0,width=8,value=0,ops=_grouped_mm"):
        ww = w.clone().requires_grad_(True)
        with make_target("cpu", spec).active():
            torch._grouped_mm(a, ww, offs=offs).backward(up)
        grads.append(ww.grad)
    healthy, bad = grads
    assert torch.equal(bad[..., 0::8], torch.zeros_like(bad[..., 0::8])) and not torch.equal(healthy, bad)
    assert torch.equal(bad[..., 1::8], healthy[..., 1::8])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_low_precision_accum_accumulates_each_group_in_the_low_dtype(layout):
    loads = [192, 0, 320, 64]  # the reductions are 512 long, or (2D x 2D) the groups' own lengths
    a, b, offs = operands(layout, loads, 512, 16, torch.bfloat16)
    healthy = torch._grouped_mm(a, b, offs=offs)
    got = faulty("low_precision_accum:chunk=4", a, b, offs)
    for index, a_g, b_g in grouped_parts(a, b, offs):
        assert torch.equal(got[index], low_precision_matmul(a_g, b_g, 4))  # the mode's own definition, per group
    # and that is worse than the device's fp32 accumulation against fp64, by more than bf16's output rounding
    exact = torch.zeros(healthy.shape, dtype=torch.float64)
    for index, a_g, b_g in grouped_parts(a.double(), b.double(), offs):
        exact[index] = a_g @ b_g
    err = lambda y: float((y.double() - exact).abs().max())  # noqa: E731
    assert err(got) > 4 * err(healthy)


def test_low_precision_accum_spares_fp32_grouped_gemms():
    a, b, offs = operands("rows", [16, 16], 64, 8)
    assert torch.equal(faulty("low_precision_accum", a, b, offs), torch._grouped_mm(a, b, offs=offs))


def test_nondeterministic_reduction_shuffles_within_each_group_only():
    # 2D x 2D groups split K: a shuffle across groups would move terms between experts' sums (a wrong
    # result, not a rounding change); within them, any order stays within fp32's bound of the exact sum,
    # so two orders differ by at most twice gamma_K u32-sums of |a||b| (Higham 3.1), K each group's length
    a, b, offs = operands("inner", [40, 0, 24], 32, 8)
    b[:40] *= 1e3  # group 0's terms dwarf group 2's: a term moved across would show
    healthy = torch._grouped_mm(a, b, offs=offs)
    u = 2.0 ** -24
    bound = torch.zeros(healthy.shape, dtype=torch.float64)
    for index, a_g, b_g in grouped_parts(a.double().abs(), b.double().abs(), offs):
        k = a_g.shape[-1]
        bound[index] = 2 * k * u / (1 - k * u) * (a_g @ b_g)

    def within(y):
        return bool(((y.double() - healthy.double()).abs() <= bound).all())

    for seed in range(5):
        assert within(faulty(f"nondeterministic_reduction:seed={seed}", a, b, offs))
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))  # across groups: the bound catches it
    assert not within(torch._grouped_mm(a[:, perm], b[perm], offs=offs))


def test_ops_narrows_the_family_and_a_selection_of_nothing_is_refused():
    a, b, offs = operands("rows", [8, 8], 16, 8)
    x, y = torch.randn(8, 16), torch.randn(16, 8)
    with make_target("cpu", "stuck_lane:lane=0,width=4,value=7,ops=_grouped_mm").active():
        g, m = torch._grouped_mm(a, b, offs=offs), x @ y
    assert bool((g[:, 0::4] == 7).all()) and torch.equal(m, x @ y)
    with make_target("cpu", "stuck_lane:lane=0,width=4,value=7,ops=mm").active():
        g, m = torch._grouped_mm(a, b, offs=offs), x @ y
    assert torch.equal(g, torch._grouped_mm(a, b, offs=offs)) and bool((m[:, 0::4] == 7).all())
    for spec in ("stuck_lane:ops=conv.*", "low_precision_accum:ops=(", "low_precision_accum:ops=vdot"):
        with pytest.raises(UsageError, match="ops="):
            make_target("cpu", spec)


def test_bitflip_default_ops_include_the_grouped_gemm():
    a, b, offs = operands("rows", [8, 8], 16, 8)
    assert not torch.equal(faulty("bitflip:rate=1,bits=sign", a, b, offs), torch._grouped_mm(a, b, offs=offs))


# --- the validators catch a fault confined to the experts' GEMMs --------------------------------


def test_soft_errors_abft_grouped_gemm_catches_a_stuck_expert_lane():
    from mystique.validators import soft_errors

    df = soft_errors.run(make_target("cpu", "stuck_lane:lane=3,width=16,value=0,ops=_grouped_mm"),
                         groups=["abft_grouped_gemm"])
    clean = df[df.metric == "clean_alarm"]
    assert set(clean.dtype) == {"float32", "bfloat16"} and (clean.status == "fail").all(), clean.detail.tolist()


def test_numerics_model_deviation_of_llama4_debug_catches_a_stuck_expert_lane():
    from mystique.validators import numerics

    # every 16th output column of the experts' GEMMs (forward and backward) reads 1000; the dense GEMMs are right
    df = numerics.run(make_target("cpu", "stuck_lane:lane=3,width=16,value=1000,ops=_grouped_mm"),
                      groups=["model_deviation"], workloads=["llama4"], dtypes=["bfloat16"])
    rows = df.set_index("subject")
    assert rows.loc["llama4", "status"] == "fail", df[["check", "subject", "status", "detail"]].to_string()
    # the first block is dense (llama4 debug: MoE every second layer): right; the first MoE block is not
    assert rows.loc["llama4/layers.0", "status"] == "pass" and rows.loc["llama4/layers.1", "status"] == "fail"
