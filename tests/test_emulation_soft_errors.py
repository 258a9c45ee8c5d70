"""Soft errors on an emulated CUDA device (issue 17, cause 4): CUDA's GEMM kernel set
(mystique.emulation.integer_gemm), the exact integer checksums that run on every device, and the
half-precision rows that check the device's own bf16/fp16 GEMM."""

from __future__ import annotations

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators import soft_errors
from mystique.validators.soft_errors import abft, exact, half
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.emulation import integer_gemm
from mystique.results import counts
from mystique.targets import Target, make_target

CUDA = make_target("cpu", None, "cuda")
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ----------------------------------------------------------------------------- the emulated kernel set

@pytest.mark.parametrize("dtype", INTS)
def test_integer_gemms_raise_cudas_not_implemented_error_under_the_emulation(dtype):
    a, b = torch.ones(3, 4, dtype=dtype), torch.ones(4, 2, dtype=dtype)
    v = torch.ones(4, dtype=dtype)
    name = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte"}[dtype]
    calls = {
        "addmm_cuda": [lambda: a @ b, lambda: torch.mm(a, b), lambda: torch.addmm(torch.ones(3, 2, dtype=dtype), a, b),
                       lambda: torch.addbmm(torch.ones(3, 2, dtype=dtype), a[None], b[None]),
                       lambda: torch.nn.functional.linear(a, b.t()), lambda: torch.mm(a, b, out=torch.empty(3, 2, dtype=dtype))],
        "baddbmm_cuda": [lambda: torch.bmm(a[None], b[None]), lambda: torch.matmul(a[None], b[None]),
                         lambda: torch.baddbmm(torch.ones(1, 3, 2, dtype=dtype), a[None], b[None])],
        "addmv_impl_cuda": [lambda: a @ v, lambda: torch.mv(a, v), lambda: torch.addmv(torch.ones(3, dtype=dtype), a, v)],
        "dot": [lambda: v @ v, lambda: torch.dot(v, v), lambda: torch.vdot(v, v)],
    }
    for kernel, fns in calls.items():
        for fn in fns:
            assert torch.equal(fn(), fn())  # the host computes them all
            with CUDA.active(), pytest.raises(NotImplementedError) as err:
                fn()
            assert str(err.value) == f"\"{kernel}\" not implemented for '{name}'"


def test_empty_integer_products_return_as_on_cuda_and_floats_pass_through():
    a, b = torch.ones(3, 4, dtype=torch.int64), torch.ones(4, 2, dtype=torch.int64)
    with CUDA.active():
        assert a[:0].mm(b).shape == (0, 2)  # empty result: CUDA returns before its dtype dispatch
        assert torch.equal(a[:, :0] @ b[:0], torch.zeros(3, 2, dtype=torch.int64))  # K = 0: zeros
        assert torch.bmm(a[None, :, :0], b[None, :0]).abs().sum() == 0
        assert torch.equal(a.float() @ b.float(), torch.full((3, 2), 4.0))
        with pytest.raises(NotImplementedError, match="dot"):  # dot dispatches whatever the length
            torch.dot(a[0, :0], a[0, :0])


def test_int_mm_runs_where_cudas_shape_constraints_hold_and_names_the_first_that_does_not():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (17, 16), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (16, 8), generator=g, dtype=torch.int8)
    want = (a.long() @ b.long()).int()
    with CUDA.active():
        assert torch.equal(torch._int_mm(a, b), want)
        for x, y, msg in [(a[:16], b, "self.size(0) needs to be greater than 16, but got 16"),
                          (a[:, :12], b[:12], "self.size(1) needs to be greater than 0 and a multiple of 8, but got 12"),
                          (a, b[:, :4], "mat2.size(1) needs to be greater than 0 and a multiple of 8, but got 4"),
                          (a[0], b, "Expected self to be of dimension 2 but got 1")]:
            with pytest.raises(RuntimeError) as err:
                torch._int_mm(x, y)
            assert str(err.value) == msg
    assert torch._int_mm(a[:3, :5], b[:5, :3]).shape == (3, 3)  # the CPU takes any shape


def test_half_gemms_with_an_fp32_output_exist_under_the_emulation():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, 7, generator=g).bfloat16(), torch.randn(7, 3, generator=g).bfloat16()
    with pytest.raises(NotImplementedError, match="aten::mm.dtype"):
        torch.mm(a, b, out_dtype=torch.float32)  # no CPU kernel in torch 2.13
    with CUDA.active():
        c = torch.mm(a, b, out_dtype=torch.float32)
        assert c.dtype == torch.float32 and torch.equal(c, a.float() @ b.float())
        bb = torch.bmm(a[None], b[None], out_dtype=torch.float32)
        assert bb.dtype == torch.float32 and torch.equal(bb[0], c)
        out = torch.empty(0)
        assert torch.mm(a, b, out_dtype=torch.float32, out=out) is out and torch.equal(out, c)
        with pytest.raises(RuntimeError, match="out_dtype must be the same as input dtype or fp32"):
            torch.mm(a.float(), b.float(), out_dtype=torch.bfloat16)
        with pytest.raises(NotImplementedError, match="addmm_cuda"):
            torch.mm(a.long(), b.long(), out_dtype=torch.int64)
    names = {d.name for d in integer_gemm.DIFFERENCES}
    assert names == {"no_integer_gemm", "int_mm_shape_constraints", "half_gemm_fp32_output"}


# ----------------------------------------------------------------------------- exact integer arithmetic

def _ints(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator, extreme: bool) -> torch.Tensor:
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    if extreme:  # the extremes of the range, where an overflow or a rounding would show first
        return torch.where(torch.rand(shape, generator=g) < 0.5, torch.tensor(lo), torch.tensor(hi)).to(dtype)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64).to(dtype)


@examples(60)
@given(m=st.integers(0, 40), k=st.integers(0, 40), n=st.integers(0, 40), dtype=st.sampled_from([torch.int8, torch.uint8]),
       extreme=st.booleans(), emulated=st.booleans(), seed=st.integers(0, 2**31))
def test_int8_checksums_are_bit_exact_against_a_cpu_int64_reference(m, k, n, dtype, extreme, emulated, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _ints(dtype, (m, k), g, extreme), _ints(dtype, (k, n), g, extreme)
    with CUDA.active() if emulated else Target("cpu").active():
        row, col = exact.int8_checksums(a, b)
    a64, b64 = a.long(), b.long()
    assert row.dtype == col.dtype == torch.int64
    assert torch.equal(row, a64 @ b64.sum(1)) and torch.equal(col, a64.sum(0) @ b64)


@examples(60)
@given(rows=st.integers(1, 30), k=st.integers(0, 30), dtype=st.sampled_from(INTS), extreme=st.booleans(),
       dim=st.sampled_from([0, 1]), seed=st.integers(0, 2**31))
def test_int_matvec_is_exact_for_every_integer_dtype_in_int32_and_int64_products(rows, k, dtype, extreme, dim, seed):
    # 8- and 16-bit operands multiply in int32 (|x v| <= 2^30); int32/int64 ones, bounded by 2^29 here, in
    # int64 (|x v| <= 2^58, K <= 30: sums below 2^63)
    g = torch.Generator().manual_seed(seed)
    wide = dtype in (torch.int32, torch.int64)
    shape = (rows, k) if dim == 1 else (k, rows)
    if wide:
        lim = 2**29
        x = (torch.randint(-lim, lim + 1, shape, generator=g) if not extreme else
             torch.where(torch.rand(shape, generator=g) < 0.5, -lim, lim)).to(dtype)
        v = (torch.randint(-lim, lim + 1, (k,), generator=g) if not extreme else torch.full((k,), -lim)).to(dtype)
        bounds = {"x_bound": lim, "v_bound": lim}
    else:
        x, v, bounds = _ints(dtype, shape, g, extreme), _ints(dtype, (k,), g, extreme), {}
    want = x.long() @ v.long() if dim == 1 else v.long() @ x.long()
    with CUDA.active():
        got = exact.int_matvec(x, v, dim=dim, **bounds)
    assert got.dtype == torch.int64 and torch.equal(got, want)


def test_int_matvec_refuses_a_range_that_could_overflow_int64():
    x, v = torch.ones(2, 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64)
    with pytest.raises(Exception, match="overflow int64"):
        exact.int_matvec(x, v)
    assert torch.equal(exact.int_matvec(x, v, x_bound=1, v_bound=1), torch.full((2,), 3))


@examples(40)
@given(m=st.integers(0, 40), k=st.integers(0, 40), n=st.integers(0, 40), extreme=st.booleans(),
       seed=st.integers(0, 2**31))
def test_int8_mm_is_exact_on_cudas_int_mm_for_every_shape(m, k, n, extreme, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _ints(torch.int8, (m, k), g, extreme), _ints(torch.int8, (k, n), g, extreme)
    with CUDA.active():  # (M <= 16 or K, N not multiples of 8: zero-padded to the constraints)
        c = exact.int8_mm(a, b)
    assert c.dtype == torch.int32 and c.is_contiguous() and torch.equal(c, (a.long() @ b.long()).int())


def test_the_fp32_fallback_of_the_int8_product_is_exact_at_the_edge_of_its_range(monkeypatch):
    # all -128: every product is 2^14 and a full chunk of 1024 sums to 2^24, the last integer fp32 holds
    # exactly beside its neighbours; K = 2500 spans three chunks
    a = torch.full((3, 2500), -128, dtype=torch.int8)
    b = torch.full((2500, 4), -128, dtype=torch.int8)
    b[7, 1] = 127
    want = (a.long() @ b.long()).int()
    assert torch.equal(exact.fp32_chunked_int8_mm(a, b), want)

    def no_int_mm(*args, **kwargs):
        raise NotImplementedError("no int8 GEMM on this device")

    monkeypatch.setattr(torch, "_int_mm", no_int_mm)
    assert torch.equal(exact.int8_mm(a, b), want)


def test_the_int8_check_stays_exact_under_the_emulation_and_sees_the_lowest_bit():
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-128, 128, (5, 13), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (13, 6), generator=g, dtype=torch.int8)
    want = (a.long() @ b.long()).int()
    with CUDA.active():
        c, rep = abft.checked_mm(a, b)
        assert not rep.alarm and torch.equal(c, want)
        enc = abft.encode_gemm(a, b)
        acc = abft.accumulate(a, b)
        acc.view(-1)[9] ^= 1
        rep = abft.verify_gemm(enc, acc, dtype=torch.int8)
    assert rep.alarm and rep.location == divmod(9, 6)


# ----------------------------------------------------------------------------- half-precision rows

class _CorruptHalfGemm(TorchDispatchMode):
    """A fault of the half-precision GEMM unit only: the first element of every mm/addmm whose operands are
    bf16 or fp16 (whatever the output dtype) reads 64 x the largest magnitude of that output, far above
    any rounding bound; fp32 GEMMs are left alone."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "").split(".")[0]
        if name in ("mm", "addmm") and any(isinstance(t, torch.Tensor) and t.dtype in half.HALF for t in args):
            self.hits += 1
            out.view(-1)[0] = out.abs().max() * 64 + 1
        return out


@pytest.mark.parametrize("emulate", [None, "cuda"])
def test_the_half_precision_rows_check_the_devices_own_half_gemm(emulate):
    healthy = make_target("cpu", None, emulate)
    faulty = Target("cpu", _CorruptHalfGemm, emulate=emulate)
    rows = {}
    for name, target in (("healthy", healthy), ("faulty", faulty)):
        df = soft_errors.run(target, level="quick", seed=0, groups=["abft_gemm"])
        rows[name] = df[df.metric == "clean_alarm"].set_index("dtype")
    ok, bad = rows["healthy"], rows["faulty"]
    assert (ok.status == "pass").all(), ok.detail
    assert bad.status["bfloat16"] == "fail" and bad.status["float16"] == "fail", bad.detail
    assert bad.status["float32"] == "pass" and bad.status["int8"] == "pass"
    how = "with fp32 output (torch.mm(out_dtype=float32)" if emulate else "with its rounded bfloat16 output"
    assert how in ok.detail["bfloat16"] and "threshold" in ok.detail["bfloat16"]


def test_checked_mm_takes_the_devices_fp32_output_half_gemm_where_it_has_one():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(20, 33, generator=g).half(), torch.randn(33, 9, generator=g).half()
    mode = _CorruptHalfGemm()
    with CUDA.active(), mode:
        assert abft.half_kind(a) == "fp32_out"
        _, rep = abft.checked_mm(a, b)
    assert mode.hits >= 1 and rep.alarm and rep.location == (0, 0)
    assert abft.half_kind(a) == "upcast"  # the CPU itself has no such kernel


# ----------------------------------------------------------------------------- the groups of issue 17

def test_the_gemm_groups_run_clean_on_an_emulated_cuda_device(tmp_path):
    # on the old code all three groups errored here as on the H100: "addmv_impl_cuda" not implemented for 'Long'
    df = soft_errors.run(CUDA, level="quick", seed=0, groups=["abft_gemm", "false_positives", "detection_campaign"],
                         out_dir=tmp_path, workloads=("dlrm",))
    bad = df[df.status.isin(["fail", "error", "inconclusive", "skip"])]
    assert bad.empty, bad[["check", "subject", "metric", "detail"]].to_string()
    assert set(df.check) == {"abft_gemm", "false_positives", "detection_campaign"}
    c = counts(df)
    assert c.failed == 0 and c.checks > 50 and c.measurements > 50
    assert (df.device == "cpu[emulate=cuda]").all()
    per_op = df[(df.check == "detection_campaign") & (df.metric == "detection_rate")].set_index("subject")
    assert per_op.value["gemm_int8"] == 1.0 and per_op.value["gemm_bfloat16"] == 1.0
    assert "aten::mm.dtype" in per_op.detail["gemm_bfloat16"]


def test_the_rounded_check_runs_cublas_reductions_in_fp32_and_restores_the_users_setting():
    m = torch.backends.cuda.matmul
    before = (m.allow_bf16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction_split_k,
              m.allow_fp16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction_split_k)
    with half.fp32_reductions(torch.device("cuda")):
        assert not m.allow_bf16_reduced_precision_reduction and not m.allow_fp16_reduced_precision_reduction
    after = (m.allow_bf16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction_split_k,
             m.allow_fp16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction_split_k)
    assert after == before
    with half.fp32_reductions(torch.device("cpu")):  # nothing to change off CUDA
        assert m.allow_bf16_reduced_precision_reduction == before[0]


def test_fp16_accumulation_on_cuda_widens_the_accumulation_roundoff():
    from types import SimpleNamespace

    m = torch.backends.cuda.matmul
    on_cuda = SimpleNamespace(dtype=torch.float16, device=torch.device("cuda"))
    old = m.allow_fp16_accumulation
    assert half.accumulation_u(on_cuda) == 2.0**-24 or old
    try:
        m.allow_fp16_accumulation = True
        assert half.accumulation_u(on_cuda) == 2.0**-11  # cuBLAS compute type 16F, also with an fp32 output
        assert half.accumulation_u(SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda"))) == 2.0**-24
        assert half.accumulation_u(torch.zeros(1, dtype=torch.float16)) == 2.0**-24
    finally:
        m.allow_fp16_accumulation = old
