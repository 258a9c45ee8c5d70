"""Soft errors as a GPU runs them (issue 21), exercised on an emulated CUDA device: the checked Linear on
the device's own kernel with the bound of that kernel (fp32, TF32, bf16/fp16 with fp32 output, rounded
output with cuBLAS's reduced-precision split-K reductions), weight checksums cached per weight version,
verdicts left on the device and read back in batches, protect() in training and inference, CUDA graph
capture refused, EmbeddingBag (fp32 and 8-bit row-wise, sum and mean) on the torch-op path."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors import abft, protect
from mystique.validators.soft_errors.abft import device_linear as dl
from mystique.validators.soft_errors.abft.bag_verdict import device_bag_output
from mystique.validators.soft_errors.abft.device_check import DeviceCheck, resolve
from mystique.validators.soft_errors.inject import flip_module_output
from torch import nn

from mystique.emulation.tf32 import truncate_to_tf32
from mystique.errors import UsageError
from mystique.targets import make_target

CUDA = make_target("cpu", None, "cuda")
protect_mod = importlib.import_module("mystique.validators.soft_errors.protect")
HALF = [torch.bfloat16, torch.float16]


@pytest.fixture
def tf32():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(old)


def _data(m: int, k: int, n: int, seed: int, dtype: torch.dtype, positive: bool = False):
    g = torch.Generator().manual_seed(seed)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / math.sqrt(k), torch.randn(n, generator=g)
    if positive:  # same-sign data: rounding errors add up, the hardest case for a bound
        x, w, b = x.abs() + 1, w.abs() + 1 / k, b.abs()
    return x.to(dtype), w.to(dtype), b.to(dtype)


# ----------------------------------------------------------------------------- which kernel, which bound

def test_the_path_names_the_devices_kernel_and_its_bound(tf32):
    assert dl.gemm_path(torch.float32, True, fp32_out=False).kind == "tf32"
    assert dl.gemm_path(torch.float32, False, fp32_out=False).kind == "fp32"  # the CPU has no TF32
    m = torch.backends.cuda.matmul
    old = m.allow_bf16_reduced_precision_reduction
    try:
        m.allow_bf16_reduced_precision_reduction = True
        p = dl.gemm_path(torch.bfloat16, True, fp32_out=False)
        assert p.kind == "rounded_reduced" and "allow_bf16_reduced_precision_reduction" in p.describe()
        assert p.extra(4096, 1.0) == pytest.approx(2.0**-8 + 64 * 2.0**-8)
        m.allow_bf16_reduced_precision_reduction = False
        assert dl.gemm_path(torch.bfloat16, True, fp32_out=False).kind == "rounded"
    finally:
        m.allow_bf16_reduced_precision_reduction = old
    assert dl.gemm_path(torch.float16, True, fp32_out=True).kind == "fp32_out"


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_checked_linear_on_the_emulated_gpu_runs_its_own_kernel_and_locates_a_flip(dtype):
    x, w, b = _data(48, 96, 40, 0, dtype)
    with CUDA.active():
        y, rep = abft.checked_linear(x, w, b)
        enc = dl.encode_device_linear(w, b)
        _, chk = dl.device_linear(x, enc)
    assert not rep.alarm and rep.checked and y.dtype == dtype and y.shape == (48, 40)
    assert chk.path.kind == ("fp32" if dtype == torch.float32 else "fp32_out")
    # what the kernel computes, bitwise: F.linear (fp32), or the fp32-output half GEMM + bias, rounded once
    want = torch.nn.functional.linear(x, w, b) if dtype == torch.float32 else \
        (x.float() @ w.float().t()).add_(b.float()).to(dtype)
    assert torch.equal(y, want)
    acc = torch.nn.functional.linear(x.float(), w.float(), b.float())
    acc[7, 11] += 2.0**-6 * acc.abs().max()  # far above the rounding of a clean run
    with CUDA.active():
        rep = dl.check_device_linear(enc, x, acc, chk.path).report()
    assert rep.alarm and rep.location == (7, 11), rep.describe()


class _CorruptFp32OutGemm(torch.utils._python_dispatch.TorchDispatchMode):
    """A fault of the half-precision GEMM unit: every ``mm`` with an ``out_dtype`` gets one wrong element."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.startswith("mm.dtype"):
            out.view(-1)[3] += out.abs().max() + 1
        return out


@pytest.mark.parametrize("dtype", HALF)
def test_the_half_linear_is_checked_on_the_devices_fp32_output_kernel_itself(dtype):
    x, w, b = _data(20, 64, 24, 1, dtype)
    with CUDA.active(), _CorruptFp32OutGemm():
        _, rep = abft.checked_linear(x, w, b)
    assert rep.alarm and rep.location == (0, 3), rep.describe()


@examples(25)
@given(m=st.integers(1, 40), k=st.integers(1, 300), n=st.integers(1, 40), seed=st.integers(0, 2**31),
       positive=st.booleans(), dtype=st.sampled_from([torch.float32, *HALF]))
def test_no_clean_tf32_or_half_linear_alarms_on_the_emulated_gpu(m, k, n, seed, positive, dtype):
    x, w, b = _data(m, k, n, seed, dtype, positive)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 allowed: the emulation reads 10 mantissa bits
    try:
        with CUDA.active():
            _, rep = abft.checked_linear(x, w, b)
            _, exact = abft.checked_linear(x, w, b, exact_ratio=True)
    finally:
        torch.set_float32_matmul_precision(old)
    assert not rep.alarm and not exact.alarm and exact.max_ratio <= 1.0, exact.describe()


def test_the_tf32_term_is_needed_a_clean_tf32_product_exceeds_the_fp32_bound():
    x, w, b = _data(8, 4096, 16, 2, torch.float32, positive=True)
    y = torch.nn.functional.linear(truncate_to_tf32(x), truncate_to_tf32(w), b)  # what a TF32 GEMM computes
    enc = dl.encode_device_linear(w, b)
    fp32 = dl.check_device_linear(enc, x, y, dl.gemm_path(torch.float32, False, fp32_out=False)).exact(True)
    with CUDA.active():
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            path = dl.gemm_path(torch.float32, True, fp32_out=False)
        finally:
            torch.set_float32_matmul_precision(old)
    tf = dl.check_device_linear(enc, x, y, path).exact(True)
    assert fp32.alarm and not tf.alarm and tf.max_ratio <= 1.0


def _split_k_reduced(x: torch.Tensor, w: torch.Tensor, splits: int, dtype: torch.dtype) -> torch.Tensor:
    """A GEMM as cuBLAS computes it with reduced-precision split-K reductions: each K-slice accumulated in
    fp32, rounded to the half dtype, the partials added in the half dtype."""
    k = x.shape[1]
    edges = [round(i * k / splits) for i in range(splits + 1)]
    out = None
    for s, e in zip(edges, edges[1:]):
        part = (x[:, s:e].float() @ w[:, s:e].float().t()).to(dtype)
        out = part if out is None else out + part
    return out


@examples(20)
@given(k=st.integers(16, 2048), splits=st.integers(2, 16), seed=st.integers(0, 2**31), positive=st.booleans(),
       dtype=st.sampled_from(HALF))
def test_reduced_precision_split_k_products_stay_within_the_rounded_reduced_bound(k, splits, seed, positive, dtype):
    x, w, _ = _data(12, k, 10, seed, dtype, positive)
    y = _split_k_reduced(x, w, min(splits, k), dtype)
    enc = dl.encode_device_linear(w)
    path = dl.GemmPath("rounded_reduced", dtype, 2.0**-24, u_out=dl.U_HALF[dtype], u_reduce=dl.U_HALF[dtype])
    rep = dl.check_device_linear(enc, x, y.float(), path).exact(True)
    assert not rep.alarm and rep.max_ratio <= 1.0, rep.describe()


# ----------------------------------------------------------------------------- verdicts on the device

def test_a_device_check_is_a_device_scalar_read_back_with_others_in_one_transfer():
    x, w, b = _data(16, 32, 8, 4, torch.float32)
    enc = dl.encode_device_linear(w, b)
    y = torch.nn.functional.linear(x, w, b)
    bad = y.clone()
    bad[2, 3] = 1e6
    path = dl.gemm_path(torch.float32, False, fp32_out=False)
    checks = [dl.check_device_linear(enc, x, t, path) for t in (y, bad, y)]
    assert all(isinstance(c, DeviceCheck) and c.worst.dim() == 0 for c in checks)
    reps = resolve(checks)
    assert [r.alarm for r in reps] == [False, True, False] and reps[1].location == (2, 3)
    assert math.isnan(float(dl.check_device_linear(enc, x, y * math.nan, path).worst))
    assert dl.check_device_linear(enc, x, y * math.nan, path).report().alarm  # a NaN from finite operands: never clean


def test_the_weight_side_is_encoded_once_per_weight_version(monkeypatch):
    made = []
    real = protect_mod.encode_device_linear
    monkeypatch.setattr(protect_mod, "encode_device_linear", lambda w, b: made.append(1) or real(w, b))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with protect(model) as guard, CUDA.active():
        with torch.no_grad():
            for _ in range(3):
                model(x)
        assert len(made) == 2  # inference: two layers, encoded once
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()  # (in place: the weights' versions move)
            opt.zero_grad()
        assert len(made) == 2 + 2 * 2  # re-encoded after each optimizer step a forward follows
    assert guard.checks == 12 and not guard.alarms and guard.unchecked == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_protect_on_the_emulated_gpu_defers_verdicts_and_catches_a_flip(dtype):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).to(dtype)
    x = torch.randn(10, 32).to(dtype)
    with torch.no_grad(), protect(model) as guard, CUDA.active():
        model(x)
        assert len(guard.pending) == 2  # nothing read back yet
        assert guard.checks == 2 and not guard.alarms and not guard.pending
        if dtype == torch.float32:
            with flip_module_output(model[2], seed=1, bit_class="exponent", name="2") as recs:
                model(x)
            assert recs
        else:  # a bf16 output is checked with its rounding and the split-K term allowed: a large error
            handle = model[2].register_forward_hook(lambda m, i, o: [o.view(-1)[5].fill_(64.0)] and None,
                                                    prepend=True)
            model(x)
            handle.remove()
        alarms = guard.alarms
    assert [a.module for a in alarms] == ["2"] and alarms[0].call == 2, alarms


def test_pending_verdicts_are_read_back_in_batches():
    model = nn.Linear(8, 8)
    with torch.no_grad(), protect(model) as guard, CUDA.active():
        for _ in range(guard.FLUSH_EVERY + 3):
            model(torch.randn(2, 8))
        assert len(guard.pending) == 3
    assert guard.checks == guard.FLUSH_EVERY + 3 and not guard.pending


def test_protect_refuses_cuda_graph_capture_with_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    model = nn.Sequential(nn.Linear(4, 4), nn.EmbeddingBag(10, 4))
    with torch.no_grad(), protect(model), CUDA.active():
        with pytest.raises(UsageError, match="CUDA graph capture") as err:
            model[0](torch.randn(2, 4))
        assert "\n" not in str(err.value)
        with pytest.raises(UsageError, match="CUDA graph capture"):
            model[1](torch.tensor([1, 2, 3]), torch.tensor([0, 2]))


# ----------------------------------------------------------------------------- EmbeddingBag on the device

@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("eight_bit", [False, True])
def test_embedding_bags_on_the_emulated_gpu_are_checked_with_torch_ops(mode, eight_bit):
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(200, 24, generator=g)
    idx = torch.randint(0, 200, (90,), generator=g)
    off = torch.tensor([0, 5, 5, 30, 61])
    with CUDA.active():
        if eight_bit:
            table = abft.QuantizedTable.from_float(weight)
            out, rep = abft.checked_quantized_embedding_bag(table, idx, off, mode)
            want = torch.nn.functional.embedding_bag(idx, table.dequantize(), off, mode=mode)
            checks = table.checks
        else:
            table = abft.checked_table(weight)
            out, rep = abft.checked_embedding_bag(table, idx, off, mode)
            want = torch.nn.functional.embedding_bag(idx, weight, off, mode=mode)
            checks = table.checks
        assert not rep.alarm and rep.checked and torch.allclose(out, want, rtol=1e-5, atol=1e-5)
        bad = out.clone()
        bad[3, 7] += 1.0
        chk = device_bag_output(bad, checks, idx, off, mode, extra=6.0 if eight_bit else 4.0)
    assert isinstance(chk, DeviceCheck) and chk.worst.dim() == 0
    rep = chk.report()
    assert rep.alarm and rep.rows == [3], rep.describe()


def test_the_8bit_torch_op_lookup_matches_the_cpu_kernel():
    g = torch.Generator().manual_seed(6)
    table = abft.QuantizedTable.from_float(torch.randn(50, 64, generator=g))
    idx, off = torch.randint(0, 50, (40,), generator=g), torch.tensor([0, 0, 9, 17])
    cpu = abft.quantized_embedding_bag(table, idx, off)
    with CUDA.active():
        dev = abft.quantized_embedding_bag(table, idx, off)
    assert torch.allclose(dev, cpu, rtol=2**-20, atol=1e-5)


def test_protect_checks_embedding_bags_on_the_emulated_gpu_in_training():
    model = nn.EmbeddingBag(100, 16, mode="mean")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx, off = torch.randint(0, 100, (30,)), torch.tensor([0, 10, 12])
    with protect(model) as guard, CUDA.active():
        for _ in range(3):
            model(idx, off).square().sum().backward()
            opt.step()
            opt.zero_grad()
        assert len(guard.pending) == 3
    assert guard.checks == 3 and not guard.alarms



@pytest.mark.parametrize("mode", ["sum", "mean", "weighted"])
def test_protect_leaves_padding_out_on_the_emulated_gpu_in_training_without_a_host_read(monkeypatch, mode):
    """In training (autograd: torch's lookup, then the hook's device verdict), a padding index is left out of
    the reference by its own lookup over the row sums rather than on the host (:func:`without_padding`: two
    host reads a call on CUDA); the verdicts stay deferred; clean steps never alarm; a flip of a looked-up row
    alarms in exactly its bags and one of the padding row nowhere."""
    monkeypatch.setattr(protect_mod, "without_padding", lambda *a: pytest.fail("padding left out on the host"))
    torch.manual_seed(0)
    pool = "sum" if mode == "weighted" else mode
    model = nn.EmbeddingBag(30, 16, mode=pool, padding_idx=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.tensor([3, 5, 7, 3, 9, 5, 11, 3, 2, 8, 4, 3])
    off = torch.tensor([0, 4, 4, 9])  # bags [3 5 7 3] [] [9 5 11 3 2] [8 4 3]
    psw = torch.rand(12) + 0.5 if mode == "weighted" else None
    with protect(model) as guard, CUDA.active():
        for _ in range(3):
            model(idx, off, psw).square().sum().backward()
            opt.step()
            opt.zero_grad()
        assert len(guard.pending) == 3  # (deferred: no verdict read yet)
        assert not guard.alarms and guard.checks == 3
        model.weight.data[3] += 1000.0  # the padding row: read by no bag
        model(idx, off, psw).sum().backward()
        assert not guard.alarms
        model.weight.data.view(torch.int32)[5, 2] ^= 1 << 29  # a soft error in a looked-up row (bags 0 and 2)
        model(idx, off, psw).sum().backward()
        assert [a.report.rows for a in guard.alarms] == [[0, 2]]
    assert guard.unchecked == 0

# ----------------------------------------------------------------------------- SDC screening: which repeat case

class _ReorderedAtomics(torch.utils._python_dispatch.TorchDispatchMode):
    """What atomics do to index_add_ on a GPU: another summation order each run, i.e. a result that differs
    in its last bits (here one ulp up or down per element, seeded per call) and stays within the bound."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.startswith("index_add"):
            self.calls += 1
            g = torch.Generator().manual_seed(self.calls)
            sign = torch.randint(0, 2, out.shape, generator=g).mul(2).sub(1).float()
            out.copy_(out * (1 + sign * 2.0**-23))
        return out


def test_sdc_screen_compares_atomic_kernels_within_the_bound_and_names_the_case():
    from mystique.validators.soft_errors import sdc

    kernels = {k.name: k for k in sdc.default_kernels("quick")}
    index_add = kernels["index_add_256x32"]
    mode = _ReorderedAtomics()
    healthy = sdc.screen(index_add, seed=0, runs=3, device="cpu", active=lambda: mode, emulated_cuda=True)
    assert healthy.ok and healthy.case == "bound" and "within 2x the fp64 bound" in healthy.describe()
    assert "atomicAdd" in healthy.describe()
    again = _ReorderedAtomics()
    on_cpu = sdc.screen(index_add, seed=0, runs=3, device="cpu", active=lambda: again)
    assert on_cpu.case == "bitwise" and on_cpu.mismatched_runs == [1, 2]  # the CPU is deterministic: caught
    gemm = sdc.screen(kernels["gemm_256"], seed=0, runs=2, device="cpu", active=CUDA.active, emulated_cuda=True)
    assert gemm.ok and gemm.case == "bitwise" and "bit-exact" in gemm.describe()
    backward = sdc.screen(kernels["embedding_bag_backward_512x32"], seed=0, runs=2, device="cpu", active=CUDA.active,
                          emulated_cuda=True)
    assert backward.ok and backward.case == "bound", backward.describe()


class _SlightlyWrongHalfGemm(torch.utils._python_dispatch.TorchDispatchMode):
    """A half-precision GEMM unit whose element 3 of every fp32-output product is off by 1% of its row's
    largest magnitude: far above the accumulator's rounding, below the rounded output's loose bound."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.startswith("mm.dtype") and out.shape[1] > 8:  # (the layers' products, not the checksums)
            out[0, 3] += out[0].abs().max() * 0.01
        return out


def test_protect_accumulator_checks_half_linears_on_their_fp32_accumulator():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64)).to(torch.bfloat16)
    x = torch.randn(32, 256).to(torch.bfloat16)
    with torch.no_grad(), protect(model, accumulator=True) as strong, CUDA.active():
        y = model(x)
        assert strong.checks == 2 and not strong.alarms and strong.max_ratio < 1
        with _SlightlyWrongHalfGemm():
            model(x)
        assert [a.module for a in strong.alarms] == ["0", "2"], strong.alarms
    h = torch.relu((x.float() @ model[0].weight.float().t()).add_(model[0].bias.float()).bfloat16())
    assert torch.equal(y, (h.float() @ model[2].weight.float().t()).add_(model[2].bias.float()).bfloat16())
    with torch.no_grad(), protect(model) as rounded, CUDA.active(), _SlightlyWrongHalfGemm():
        model(x)  # (no mm.dtype runs here: F.linear's rounded output, checked with the loose bound)
    assert rounded.checks == 2
    with protect(model, accumulator=True) as training, CUDA.active():
        model(x.requires_grad_()).float().sum().backward()  # autograd: the module's own forward, hook-checked
    assert training.checks == 2 and not training.alarms


@examples(40)
@given(workload=st.sampled_from(["dlrm", "bert", "llama"]), seed=st.integers(0, 2**31), change=st.floats(0, 0.05),
       nan=st.booleans())
def test_the_one_flag_pvf_verdict_is_the_stated_definition(workload, seed, change, nan):
    from mystique.validators.soft_errors.pvf import DLRM_TOL, output_changed

    g = torch.Generator().manual_seed(seed)
    shape = (8, 1) if workload == "dlrm" else (3, 5, 7)
    golden = torch.rand(shape, generator=g) if workload == "dlrm" else torch.randn(shape, generator=g)
    out = golden + change * torch.randn(shape, generator=g)
    if nan:
        out.view(-1)[seed % out.numel()] = math.nan
    labels = torch.where(torch.rand(3, 5, generator=g) < 0.5, -100, 1)
    if not torch.isfinite(out).all():
        want = True
    elif workload == "dlrm":
        want = bool(((golden > 0.5) != (out > 0.5)).any()) or float((out - golden).abs().max()) > DLRM_TOL
    elif workload == "bert":
        m = labels != -100
        want = bool((golden.argmax(-1)[m] != out.argmax(-1)[m]).any())
    else:
        want = bool((golden[:, -1].argmax(-1) != out[:, -1].argmax(-1)).any())
    assert output_changed(workload, golden, out, {"labels": labels}) == want


@examples(12)
@given(m=st.integers(1, 30), k=st.integers(1, 2048), n=st.integers(1, 30), seed=st.integers(0, 2**31),
       positive=st.booleans())
def test_checked_mm_on_an_emulated_gpu_with_tf32_allowed_has_no_false_alarm_and_catches_flips(m, k, n, seed, positive):
    x, w, _ = _data(m, k, n, seed, torch.float32, positive)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with CUDA.active():
            c, rep = abft.checked_mm(x, w.t().contiguous())
            enc = abft.encode_gemm(x, w.t().contiguous())
        from mystique.validators.soft_errors.abft.flags import U_TF32_PRODUCT

        bad = c.clone()  # an error 4x the TF32 term of its row's bound (u_in ||a_i|| ||r||, the bound's largest)
        r = float(w.abs().sum(0).norm())
        bad[m // 2, n // 2] += 4 * U_TF32_PRODUCT * float(x[m // 2].norm()) * r + 1.0
        flagged = abft.verify_gemm(enc, bad, dtype=torch.float32, u_out=U_TF32_PRODUCT)
    finally:
        torch.set_float32_matmul_precision(old)
    assert rep.op == "gemm_tf32" and not rep.alarm and rep.max_ratio <= 1.0, rep.describe()
    assert torch.equal(c, truncate_to_tf32(x) @ truncate_to_tf32(w.t().contiguous()))  # the TF32 product itself
    assert flagged.alarm, flagged.describe()


@pytest.mark.parametrize("exact", [False, True])
def test_a_half_output_in_the_subnormal_range_is_no_false_alarm_on_the_emulated_gpu(exact):
    # every output of the layer is an fp16 subnormal: its rounding errs by up to 2^-25 absolute, which the
    # relative term u_out |c| does not bound; the bound's subnormal term does
    g = torch.Generator().manual_seed(7)
    model = nn.Linear(64, 32, bias=False).half()
    with torch.no_grad():
        model.weight.copy_((torch.randn(32, 64, generator=g) * 1e-3).half())
    x = (torch.randn(16, 64, generator=g) * 1e-3).half()
    with torch.no_grad(), protect(model, exact_ratios=exact) as guard, CUDA.active():
        y = model(x)
    assert y.abs().max() < 2.0**-14 and guard.checks == 1 and not guard.alarms, guard.alarms


@examples(40)
@given(p=st.integers(1, 3), k=st.integers(1, 64), scale=st.floats(-30, 30), seed=st.integers(0, 2**31))
def test_the_three_part_bf16_split_of_the_checksum_weights_is_within_fp32_rounding(p, k, scale, seed):
    v = torch.randn(p, k, generator=torch.Generator().manual_seed(seed)) * 2.0**scale
    parts = dl.split_bf16(v)
    assert parts.dtype == torch.bfloat16 and parts.shape == (k, 3 * p)
    back = parts.double().t().reshape(3, p, k).sum(0)
    assert bool(((back - v.double()).abs() <= 2.0**-24 * v.double().abs()).all())


def test_a_deferred_verdict_whose_output_was_modified_in_place_is_unchecked_never_judged_on_other_data():
    x, w, b = _data(6, 16, 5, 8, torch.float32)
    enc = dl.encode_device_linear(w, b)
    y = torch.nn.functional.linear(x, w, b)
    y[1, 2] += 100.0  # a fault: the lower-bound verdict is far above 1
    path = dl.gemm_path(torch.float32, False, fp32_out=False)
    fresh = dl.check_device_linear(enc, x, y, path).watch(x, y)
    stale = dl.check_device_linear(enc, x, y, path).watch(x, y)
    assert fresh.report().alarm
    y.relu_()  # (what nn.ReLU(inplace=True) after the layer does before the guard reads its verdicts)
    rep = stale.report()
    assert not rep.alarm and not rep.checked and rep.max_ratio > 1


def _h100_false_positive_case():
    """The clean fp16 GEMM an H100 alarmed on (false_positives seed 0, trial seed 513690122354366768):
    rows of fp16-subnormal operands next to rows 10^4 larger."""
    from mystique.validators.soft_errors.campaign import DISTRIBUTIONS, random_matrix

    s = 513690122354366768
    import random

    rng, g = random.Random(s), torch.Generator().manual_seed(s)
    dist, scale = rng.choice(DISTRIBUTIONS), 10.0 ** rng.uniform(-6, 6)
    m, k, n = (rng.randint(1, 48) for _ in range(3))
    a = (random_matrix((m, k), dist, g) * min(scale, 1e3)).to(torch.float16)
    b = random_matrix((k, n), dist, g).to(torch.float16)
    return a, b


def _h100_device_product(a, b):
    """(the exact product, the product as the H100's fp16 kernel made it: errs by up to 0.34 u of the
    largest row's sum |a||b|, uniformly, seeded)."""
    exact = a.double() @ b.double()
    scale = float((a.double().abs() @ b.double().abs()).amax())
    noise = torch.empty_like(exact).uniform_(-1, 1, generator=torch.Generator().manual_seed(1))
    return exact, (exact + noise * 0.34 * 2.0**-24 * scale).float()


def test_fp16_rows_are_held_to_the_products_scale_as_the_h100_kernel_errs():
    """The H100's fp16 GEMM with fp32 output erred by up to 0.34 u of the largest row's sum |a||b| in rows
    hundreds of times smaller (1195 u of their own): held to the largest row's threshold, such a product
    passes, and a flip significant at 2^-7 rms(C) in one of those rows is still found and located."""
    from mystique.validators.soft_errors.abft.encoding import encode_gemm
    from mystique.validators.soft_errors.abft.gemm import SCALE_FLOOR_DTYPES, verify_gemm

    assert torch.float16 in SCALE_FLOOR_DTYPES and torch.bfloat16 not in SCALE_FLOOR_DTYPES
    a, b = _h100_false_positive_case()
    exact, device = _h100_device_product(a, b)  # the error pattern the H100 showed
    enc = lambda: encode_gemm(a.float(), b.float())  # noqa: E731
    for exact_ratio in (False, True):
        assert verify_gemm(enc(), device, dtype=torch.float16, exact_ratio=exact_ratio).alarm  # per-row: alarms
        assert not verify_gemm(enc(), device, dtype=torch.float16, exact_ratio=exact_ratio, scale_floor=True).alarm
    tiny = int((a.float().abs().amax(1)).argmin())
    flipped = device.clone()
    flipped[tiny, 3] += 2.0**-7 * float(exact.square().mean().sqrt())
    rep = verify_gemm(enc(), flipped, dtype=torch.float16, scale_floor=True)
    assert rep.alarm and rep.location == (tiny, 3), rep.describe()


def test_checked_mm_holds_the_device_fp16_kernel_to_the_products_scale(monkeypatch):
    """checked_mm takes the scale floor where the device's own fp16 kernel made the accumulator, not elsewhere."""
    from mystique.validators.soft_errors.abft import gemm

    a, b = _h100_false_positive_case()
    _, device = _h100_device_product(a, b)
    monkeypatch.setattr(gemm, "device_half_mm", lambda x, y: device)
    monkeypatch.setattr(gemm, "missing", lambda device: False)
    assert not gemm.checked_mm(a, b, exact_ratio=True)[1].alarm
    monkeypatch.setattr(gemm, "SCALE_FLOOR_DTYPES", ())
    assert gemm.checked_mm(a, b, exact_ratio=True)[1].alarm
