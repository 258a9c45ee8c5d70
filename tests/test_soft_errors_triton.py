"""The fused Triton checks (issue 32) held to the CPU path's properties.

On this host the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, NumPy over CPU tensors):
the same kernel source as on a GPU, so its tiling, masking, epilogue sums, verdict and fault injection are
tested here; the interpreter's one difference is noted in :mod:`mystique.validators.soft_errors.triton_abft.
linear` (its bf16 ``tl.dot`` is wrong, so bf16 tiles are multiplied as their exact fp32 upcasts there).
The ``cuda``-marked tests run the same properties compiled, on a GPU. Properties:

* clean calls never alarm, and their output is the product (the lookup) to within its rounding;
* every significant flip alarms, at its row and column (GEMM: a bit of the fp32 accumulator flipped
  inside the kernel; significant where the change exceeds twice both the row's and the column's exact
  threshold, so that no rounding can hide it) and in every bag that reads a flipped table row
  (:func:`..abft.bag_verdict.sure_alarms`), and only in bags that read it.

Skipped, saying why, where Triton is not installed (the ``triton`` extra).
"""

from __future__ import annotations

import contextlib
import math
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors import triton_abft

pytestmark = pytest.mark.skipif(not triton_abft.available(), reason=triton_abft.why_not() or "")

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@contextlib.contextmanager
def interpreted():
    """Triton's interpreter for the kernels launched inside (CPU tensors)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        yield


# --- GEMM / Linear ------------------------------------------------------------------------------------


def _operands(m: int, k: int, n: int, dtype: torch.dtype, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=g).to(device=device, dtype=dtype)
    return x, w, b


def check_clean_linear(m: int, k: int, n: int, dtype: torch.dtype, bias: bool, seed: int, device: str,
                       small_row: float = 1.0) -> None:
    """``small_row``: row 0 of x scaled by it (2^-14: fp16 subnormals, whose rows cuBLAS's fp16 kernel checked
    at the product's scale, :data:`..abft.gemm.SCALE_FLOOR_DTYPES`)."""
    from mystique.validators.soft_errors.abft.device_linear import encode_device_linear
    from mystique.validators.soft_errors.triton_abft.linear import fused_linear, fused_mm

    x, w, b = _operands(m, k, n, dtype, seed, device)
    if small_row != 1.0:
        x[0] = (x[0].float() * small_row).to(dtype)
    enc = encode_device_linear(w, b if bias else None)
    y, chk = fused_linear(x, enc)
    rep = chk.report()
    assert not rep.alarm and rep.checked, rep.describe()
    x64, w64 = x.double().cpu(), w.double().cpu()
    ref = x64 @ w64.t() + (b.double().cpu() if bias else 0.0)
    # accumulation (K + 1 terms, at most 2^-23 each) plus the output's rounding to its dtype
    s = x64.abs() @ w64.abs().t() + (b.double().cpu().abs() if bias else 0.0)
    u_out = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    # (2 u_out: the interpreter rounds fp32 to a half dtype by truncation, the GPU to nearest)
    tol = (k + 2) * 2.0**-23 * s + 2 * u_out * ref.abs() + 1e-30
    if dtype == torch.float16:
        tol = tol + 2.0**-25  # (fp16's subnormal spacing)
    assert ((y.double().cpu() - ref).abs() <= tol).all()
    c, chm = fused_mm(x, w.t().contiguous())
    assert not chm.report().alarm
    prod, s = x64 @ w64.t(), x64.abs() @ w64.abs().t()
    assert ((c.double().cpu() - prod).abs() <= (k + 2) * 2.0**-23 * s + 2 * u_out * prod.abs() + 2.0**-25).all()


def _thresholds(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, path, lam: float, extra: float):
    """The exact row and column thresholds of the fused check (fp64 host arrays)."""
    from mystique.validators.soft_errors.abft.encoding import col_checks, encode_rows, gemm_constants

    x32, w32 = x.float().cpu(), w.t().float().cpu()
    b32 = None if b is None else b.float().cpu()
    m, n = x32.shape[0], w32.shape[1]
    out = []
    for rc, mm, nn in ((encode_rows(x32, w32, v=b32), m, n), (col_checks(x32, w32, b32), n, m)):
        factor, det, tiny = gemm_constants(rc.k, mm, nn, path.u, lam, extra, torch.float32)
        out.append(factor * rc.row_norms(np.arange(mm)) * rc.r_norm() + det * np.abs(rc.ref[0]) + tiny)
    return out


def _flipped(v: float, bit: int) -> float:
    (i,) = struct.unpack("<I", struct.pack("<f", v))
    return struct.unpack("<f", struct.pack("<I", i ^ (1 << bit)))[0]


def check_flip_linear(m: int, k: int, n: int, dtype: torch.dtype, i: int, j: int, bit: int, seed: int,
                      device: str) -> bool:
    """A flip of one bit of the accumulator inside the kernel: significant ones alarm at (i, j) exactly.
    Returns whether the flip was significant."""
    from mystique.validators.soft_errors.abft.device_linear import encode_device_linear
    from mystique.validators.soft_errors.triton_abft.linear import epilogue_u, fused_linear, fused_path, tiles

    x, w, b = _operands(m, k, n, dtype, seed, device)
    enc = encode_device_linear(w, b)
    _, clean = fused_linear(x, enc)
    y, chk = fused_linear(x, enc, flip=(i, j, (1 << bit) - (1 << 32 if bit == 31 else 0)))
    rep = chk.report()
    path = fused_path(dtype, x.is_cuda)
    extra = path.extra(enc.k, 1.0) + epilogue_u(tiles(dtype, path.prec), m, n, path.u, 1.0)
    thr_rows, thr_cols = _thresholds(x, w, b, path, 1.0, extra)
    acc = (x.double().cpu() @ w.double().cpu().t() + b.double().cpu())[i, j].item()
    acc = struct.unpack("<f", struct.pack("<f", acc))[0]
    change = abs(_flipped(acc, bit) - acc)
    # 4x: twice for the reference's and the product's rounding, twice for acc's estimate (halves: fp64 product)
    significant = not math.isfinite(change) or (change > 4 * thr_rows[i] and change > 4 * thr_cols[j])
    assert not clean.report().alarm
    if significant:
        assert rep.alarm and rep.rows == [i] and rep.cols == [j] and rep.location == (i, j), rep.describe()
    else:
        assert set(rep.rows) <= {i} and set(rep.cols) <= {j}, rep.describe()
    return significant


SIZES = st.integers(1, 72)


@examples(8)
@given(m=SIZES, k=SIZES, n=SIZES, dtype=st.sampled_from(DTYPES), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_clean_fused_linear_never_alarms_and_matches_the_product(m, k, n, dtype, bias, seed):
    with interpreted():
        check_clean_linear(m, k, n, dtype, bias, seed, "cpu")


@examples(8)
@given(m=st.integers(1, 48), k=st.integers(1, 48), n=st.integers(1, 48), dtype=st.sampled_from(DTYPES),
       where=st.tuples(st.floats(0, 0.999), st.floats(0, 0.999)), bit=st.integers(20, 31), seed=st.integers(0, 2**16))
def test_significant_accumulator_flips_alarm_at_their_row_and_column(m, k, n, dtype, where, bit, seed):
    with interpreted():
        check_flip_linear(m, k, n, dtype, int(where[0] * m), int(where[1] * n), bit, seed, "cpu")


def test_flips_of_the_exponent_are_significant_and_located():
    """A fixed case that must be significant (the property above may draw few): bit 30 of a non-zero value."""
    with interpreted():
        assert check_flip_linear(40, 33, 70, torch.float32, 17, 65, 30, 1, "cpu")
        assert check_flip_linear(40, 33, 70, torch.bfloat16, 39, 0, 29, 2, "cpu")
        from mystique.validators.soft_errors.abft.device_linear import encode_device_linear
        from mystique.validators.soft_errors.triton_abft.linear import encode_operand, fused_mm

        x, w, _ = _operands(30, 20, 50, torch.bfloat16, 4, "cpu")
        rep = fused_mm(x, w.t(), flip=(29, 3, 1 << 28))[1].report()  # (b's checksums encoded on the device)
        assert rep.location == (29, 3) and rep.rows == [29] and rep.cols == [3], rep.describe()
        torch.testing.assert_close(encode_operand(w.t()).cw, encode_device_linear(w).cw, rtol=2.0**-20, atol=0)


def test_a_flipped_weight_alarms_in_its_column():
    """A weight changed after its checksums were cached: every row alarms (all read it). The column checks,
    encoded from the operands as they are after the alarm, cannot place it (they read the changed weight)."""
    with interpreted():
        from mystique.validators.soft_errors.abft.device_linear import encode_device_linear
        from mystique.validators.soft_errors.triton_abft.linear import fused_linear

        x, w, b = _operands(24, 40, 36, torch.float32, 3, "cpu")
        enc = encode_device_linear(w, b)
        w[5, 7] = _flipped(float(w[5, 7]), 29)  # (enc holds w itself: the kernel reads the flipped weight)
        rep = fused_linear(x, enc)[1].report()
        assert rep.alarm and set(rep.cols) <= {5} and rep.rows == list(range(16))


def test_the_triton_path_describes_its_bound():
    from mystique.validators.soft_errors.triton_abft.linear import fused_path

    assert "2^-23" in fused_path(torch.bfloat16, True).describe()
    assert "u = 2^-24" in fused_path(torch.float32, False).describe()


# --- EmbeddingBag --------------------------------------------------------------------------------------


def _bags(g: torch.Generator, rows: int, lengths: list[int], device: str):
    idx = torch.randint(0, rows, (sum(lengths),), generator=g).to(device)
    off = torch.tensor([0, *np.cumsum(lengths)[:-1].tolist()], dtype=torch.int64).to(device)
    return idx, off


def _table(kind: str, rows: int, d: int, g: torch.Generator, device: str):
    from mystique.validators.soft_errors.abft.bag_verdict import EmbeddingChecks
    from mystique.validators.soft_errors.abft.quantized import QuantizedTable

    src = torch.randn(rows, d, generator=g)
    if kind == "uint8":
        qt = QuantizedTable.from_float(src)
        return QuantizedTable(qt.packed.to(device), EmbeddingChecks(qt.checks.rowsum.to(device),
                                                                    qt.checks.absum.to(device)), d)
    w = src.to(device=device, dtype=getattr(torch, kind))
    return w, EmbeddingChecks.of(w)


def _lookup(table, kind: str, idx, off, mode: str):
    from mystique.validators.soft_errors.triton_abft.bag import fused_embedding_bag, fused_quantized_bag

    if kind == "uint8":
        return fused_quantized_bag(table, idx, off, mode)
    return fused_embedding_bag(table[0], table[1], idx, off, mode)


KINDS = ("float32", "bfloat16", "float16", "uint8")


def check_clean_bag(kind: str, rows: int, d: int, lengths: list[int], mode: str, seed: int, device: str) -> None:
    g = torch.Generator().manual_seed(seed)
    table = _table(kind, rows, d, g, device)
    idx, off = _bags(g, rows, lengths, device)
    out, chk = _lookup(table, kind, idx, off, mode)
    rep = chk.report()
    assert not rep.alarm and rep.checked, rep.describe()
    dense = (table.dequantize() if kind == "uint8" else table[0]).double().cpu()
    ref = F.embedding_bag(idx.cpu(), dense, off.cpu(), mode=mode)
    mag = F.embedding_bag(idx.cpu(), dense.abs(), off.cpu(), mode=mode)
    u_out = {"bfloat16": 2.0**-8, "float16": 2.0**-11}.get(kind, 0.0)
    tol = (max(lengths) + 8) * 2.0**-24 * mag + 2 * u_out * ref.abs() + (2.0**-24 if kind == "float16" else 0.0)
    assert ((out.double().cpu() - ref).abs() <= tol + 1e-30).all()


@examples(10)
@given(kind=st.sampled_from(KINDS), rows=st.integers(1, 60), d=st.integers(1, 70),
       lengths=st.lists(st.integers(0, 9), min_size=1, max_size=12), mode=st.sampled_from(("sum", "mean")),
       seed=st.integers(0, 2**16))
def test_clean_fused_bags_never_alarm_and_match_the_lookup(kind, rows, d, lengths, mode, seed):
    with interpreted():
        check_clean_bag(kind, rows, d, lengths, mode, seed, "cpu")


def check_flip_bag(kind: str, rows: int, d: int, lengths: list[int], mode: str, row: int, byte: int, bit: int,
                   seed: int, device: str) -> None:
    """One bit of one table row flipped after its checksums: every bag the flip surely moves past its bound
    alarms (:func:`sure_alarms`), and no bag that does not read the row."""
    from mystique.validators.soft_errors.abft.bag_verdict import row_sums64, sure_alarms
    from mystique.validators.soft_errors.abft.quantized import QuantizedTable

    g = torch.Generator().manual_seed(seed)
    table = _table(kind, rows, d, g, device)
    idx, off = _bags(g, rows, lengths, device)
    if kind == "uint8":
        before = QuantizedTable.row_sums64(table.packed.cpu())
        packed = table.packed.clone()
        packed[row, byte % packed.shape[1]] ^= 1 << (bit % 8)
        flipped = QuantizedTable(packed, table.checks, d)
        after = QuantizedTable.row_sums64(packed.cpu())
        extra = 6.0
    else:
        w = table[0]
        before = row_sums64(w.cpu())
        wf = w.clone()
        raw = wf.view(torch.int16 if w.element_size() == 2 else torch.int32)
        raw[row, byte % d] ^= 1 << (bit % (8 * w.element_size()))
        flipped = (wf, table[1])
        after = row_sums64(wf.cpu())
        extra = 4.0
    rep = _lookup(flipped, kind, idx, off, mode)[1].report()
    sure = np.flatnonzero(sure_alarms(before, after, idx.cpu(), off.cpu(), mode, d, extra))
    reads = {b for b in range(len(lengths)) if row in idx.cpu()[off[b]:off[b] + lengths[b]].tolist()}
    assert set(sure.tolist()) <= set(rep.rows), (sure, rep.describe())
    assert set(rep.rows) <= reads, rep.describe()


@examples(10)
@given(kind=st.sampled_from(KINDS), rows=st.integers(1, 20), d=st.integers(1, 40),
       lengths=st.lists(st.integers(0, 8), min_size=1, max_size=10), mode=st.sampled_from(("sum", "mean")),
       where=st.floats(0, 0.999), byte=st.integers(0, 100), bit=st.integers(0, 31), seed=st.integers(0, 2**16))
def test_significant_table_flips_alarm_in_the_bags_that_read_them(kind, rows, d, lengths, mode, where,
                                                                 byte, bit, seed):
    with interpreted():
        check_flip_bag(kind, rows, d, lengths, mode, int(where * rows), byte, bit, seed, "cpu")


def test_an_index_out_of_range_alarms_rather_than_reading_past_the_table():
    with interpreted():
        g = torch.Generator().manual_seed(0)
        w, checks = _table("float32", 10, 8, g, "cpu")
        from mystique.validators.soft_errors.triton_abft.bag import fused_embedding_bag

        rep = fused_embedding_bag(w, checks, torch.tensor([1, 2, 10, 3]), torch.tensor([0, 2]))[1].report()
        assert rep.alarm and rep.rows == [1]


# --- the same properties, compiled, on a GPU ------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_fused_linear_clean_and_flips(dtype):
    for seed, (m, k, n) in enumerate(((300, 257, 129), (64, 1024, 512), (1, 64, 3))):
        check_clean_linear(m, k, n, dtype, True, seed, "cuda")
        check_clean_linear(m, k, n, dtype, False, seed, "cuda", small_row=2.0**-14)
        for bit in (22, 26, 30):
            check_flip_linear(m, k, n, dtype, m // 2, n // 3, bit, seed, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_fused_bags_clean_and_flips(kind):
    lengths = [40] * 64 + [0, 1, 7]
    for mode in ("sum", "mean"):
        check_clean_bag(kind, 1000, 128, lengths, mode, 0, "cuda")
        for bit in (3, 20, 30):
            check_flip_bag(kind, 50, 64, [5, 0, 9, 40], mode, 7, 3, bit, 1, "cuda")


# --- protect() with the fused forwards (their CUDA dispatch pointed at the interpreter's CPU tensors) ----------


def test_protect_runs_the_fused_forwards_and_defers_their_verdicts(monkeypatch):
    import importlib

    from mystique.validators.soft_errors.triton_abft import guard as fused_guard
    from torch import nn

    protect_mod = importlib.import_module("mystique.validators.soft_errors.protect")

    monkeypatch.setattr(protect_mod, "fused_installable", lambda: True)
    monkeypatch.setattr(fused_guard, "cuda_wanted", triton_abft.wanted)
    torch.manual_seed(0)
    model = nn.ModuleDict({"lin": nn.Linear(40, 24).to(torch.bfloat16),
                           "bag": nn.EmbeddingBag(30, 16, mode="mean")})
    x = torch.randn(20, 40).to(torch.bfloat16)
    idx, off = torch.randint(0, 30, (25,)), torch.tensor([0, 4, 4, 20])
    with interpreted(), torch.no_grad():
        guard = protect_mod.protect(model)
        y, out = model["lin"](x), model["bag"](idx, off)
        assert len(guard.pending) == 2  # (deferred: no verdict read yet)
        assert guard.checks == 2 and not guard.alarms
        torch.testing.assert_close(y.float(), F.linear(x.float(), model["lin"].weight.float(),
                                                       model["lin"].bias.float()), atol=0.05, rtol=0.02)
        torch.testing.assert_close(out, F.embedding_bag(idx, model["bag"].weight, off, mode="mean"))
        model["lin"].weight[3, 5] = 512.0  # in place: a new version, a new encoding; still clean
        model["lin"](x)
        assert not guard.alarms
        w = model["bag"].weight
        w.data.view(torch.int32)[idx[5], 2] ^= 1 << 29  # a soft error: bits changed behind the version counter
        model["bag"](idx, off)
        assert [a.module for a in guard.alarms] == ["bag"] and 2 in guard.alarms[0].report.rows
        guard.remove()


@pytest.mark.cuda
def test_cuda_checked_calls_take_the_fused_kernels(monkeypatch):
    """On CUDA the product's checked calls run the fused kernels (``MYSTIQUE_TRITON=0``: the torch paths)."""
    from mystique.validators.soft_errors.abft import (
        checked_embedding_bag,
        checked_linear,
        checked_mm,
        checked_table,
    )
    from mystique.validators.soft_errors.abft.device_linear import device_linear, encode_device_linear
    from mystique.validators.soft_errors.triton_abft.linear import FusedPath

    x, w, b = _operands(300, 256, 200, torch.bfloat16, 0, "cuda")
    assert isinstance(device_linear(x, encode_device_linear(w, b))[1].path, FusedPath)
    assert not checked_linear(x, w, b)[1].alarm and not checked_mm(x, w.t())[1].alarm
    table = checked_table(torch.randn(1000, 64, device="cuda"))
    idx, off = torch.randint(0, 1000, (400,), device="cuda"), torch.arange(0, 400, 40, device="cuda")
    out, rep = checked_embedding_bag(table, idx, off)
    assert not rep.alarm
    torch.testing.assert_close(out, F.embedding_bag(idx, table.weight, off))
    monkeypatch.setenv("MYSTIQUE_TRITON", "0")
    assert not isinstance(device_linear(x, encode_device_linear(w, b))[1].path, FusedPath)


# --- a wider sweep under the interpreter (opt in: -m slow) -------------------------------------------------


@pytest.mark.slow
@examples(60)
@given(m=st.integers(1, 200), k=st.integers(1, 300), n=st.integers(1, 200), dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_wide_clean_fused_linear(m, k, n, dtype, bias, seed):
    with interpreted():
        check_clean_linear(m, k, n, dtype, bias, seed, "cpu")


@pytest.mark.slow
@examples(60)
@given(m=st.integers(1, 150), k=st.integers(1, 200), n=st.integers(1, 150), dtype=st.sampled_from(DTYPES),
       where=st.tuples(st.floats(0, 0.999), st.floats(0, 0.999)), bit=st.integers(0, 31), seed=st.integers(0, 2**16))
def test_wide_accumulator_flips(m, k, n, dtype, where, bit, seed):
    with interpreted():
        check_flip_linear(m, k, n, dtype, int(where[0] * m), int(where[1] * n), bit, seed, "cpu")


@pytest.mark.slow
@examples(60)
@given(kind=st.sampled_from(KINDS), rows=st.integers(1, 300), d=st.integers(1, 300),
       lengths=st.lists(st.integers(0, 60), min_size=1, max_size=40), mode=st.sampled_from(("sum", "mean")),
       seed=st.integers(0, 2**16))
def test_wide_clean_fused_bags(kind, rows, d, lengths, mode, seed):
    with interpreted():
        check_clean_bag(kind, rows, d, lengths, mode, seed, "cpu")


@pytest.mark.slow
def test_the_kernels_compile_for_hopper_on_tensor_cores():
    """Without a GPU: Triton's own compiler and ptxas build the kernels for sm_90 (H100) as a launch would
    specialise them (unit strides, 16-divisible sizes), the GEMM on wgmma with a cp.async pipeline."""
    import triton
    from mystique.validators.soft_errors.triton_abft.kernels import jit_module
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if triton_abft.interpreting():
        pytest.skip("TRITON_INTERPRET is set: the kernels are interpreted, not compiled, in this process")
    if type(triton.language.zeros).__name__ != "JITFunction":
        # this process holds the interpreter's standard library (tests/conftest.py): compile in a fresh one
        import os
        import subprocess
        import sys

        env = dict(os.environ, MYSTIQUE_TRITON_STDLIB="compiled")
        env.pop("TRITON_INTERPRET", None)
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow",
                            f"{__file__}::test_the_kernels_compile_for_hopper_on_tensor_cores"],
                           env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
        return
    mod = jit_module()
    target = GPUTarget("cuda", 90, 32)
    ints = ("M", "N", "K", "sam", "sbn", "sym", "sbk", "sak", "syn", "NT", "MT")
    for dt, prec, ref_up in (("bf16", "ieee", False), ("fp16", "ieee", True), ("fp32", "tf32", False)):
        sig = {p: f"*{dt}" for p in ("a_ptr", "b_ptr", "bias_ptr", "y_ptr")}
        sig.update({p: "*fp32" for p in ("sm_ptr", "sn_ptr", "rpart_ptr", "cpart_ptr", "ref_ptr", "worst_ptr",
                                          "flip_ptr")})
        sig["v_ptr"] = "*bf16" if dt == "bf16" else "*fp32"
        sig = {n: sig[n] for n in ("a_ptr", "b_ptr", "v_ptr", "bias_ptr", "sm_ptr", "sn_ptr", "y_ptr", "rpart_ptr",
                                   "cpart_ptr", "ref_ptr", "worst_ptr", "flip_ptr")}
        sig.update(dict.fromkeys(ints, "i32"))
        consts = dict(sak=1, sbk=1, syn=1, BM=128, BN=128, BK=64 if dt != "fp32" else 32, RP=16,
                      R=6 if dt == "bf16" else 2, HAS_BIAS=True, PREC=prec, REF_PREC=prec, UPCAST=False,
                      REF_UPCAST=ref_up, FAULT=False, GROUP_M=8)
        sig.update(dict.fromkeys(consts, "constexpr"))
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
                 if n.endswith("_ptr") or n in ("M", "N", "K", "sam", "sbn", "sym")}
        k = triton.compile(ASTSource(mod.checked_mm_kernel, sig, consts, attrs), target=target,
                           options={"num_warps": 8, "num_stages": 3})
        ptx = k.asm["ptx"]
        assert "wgmma.mma_async" in ptx and "cp.async" in ptx and k.metadata.shared >= 3 * 32768, (dt, prec)
    sig = {n: "*fp32" for n in ("rpart_ptr", "ref_ptr", "vw_ptr", "cw_ptr", "got_ptr", "refo_ptr", "worst_ptr")}
    sig.update({"M": "i32", "NT": "i32", "factor": "fp32", "det": "fp32", "tiny": "fp32"})
    consts = dict(NTP=64, BMV=128, SPLIT=True, HAS_VW=True)
    sig.update(dict.fromkeys(consts, "constexpr"))
    triton.compile(ASTSource(mod.verdict_kernel, sig, consts), target=target, options={"num_warps": 4})
    for wdt, quant in (("fp32", False), ("bf16", False), ("u8", True)):
        sig = {"w_ptr": f"*{wdt}", "idx_ptr": "*i64", "off_ptr": "*i64", "rowsum_ptr": "*fp32", "absum_ptr": "*fp32",
               "out_ptr": "*bf16" if wdt == "bf16" else "*fp32", "worst_ptr": "*fp32", "ratio_ptr": "*fp32",
               "n_idx": "i32", "n_bags": "i32", "n_rows": "i32", "D": "i32", "stride_w": "i32", "k_lam": "fp32",
               "d_extra": "fp32", "tiny": "fp32"}
        consts = dict(BD=128, BL=16, QUANT=quant, MEAN=True, MARGIN=1.0 + 2.0**-10)
        sig.update(dict.fromkeys(consts, "constexpr"))
        triton.compile(ASTSource(mod.checked_bag_kernel, sig, consts), target=target, options={"num_warps": 1})
