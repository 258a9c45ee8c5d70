"""Locating a soft error in a checked GEMM where the column check's bound is too loose (issue 33): a
column checksum sums all M elements of a column, so with TF32 operands its bound holds M elements'
2^-10 operand rounding, and an error that the flagged row's bound (N elements) exceeds can stay below
it. The flagged rows are then recomputed in fp64 and each element held to its own bound
(``abft.gemm.locate_elements``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors import abft
from mystique.validators.soft_errors.abft import device_linear as dl
from mystique.validators.soft_errors.abft.flags import U_TF32_PRODUCT
from mystique.validators.soft_errors.abft.gemm import locate_elements
from mystique.validators.soft_errors.abft.report import UNIT_ROUNDOFF

from mystique.emulation.tf32 import truncate_to_tf32 as tf32

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
TF32_PATH = dl.GemmPath("tf32", torch.float32, UNIT_ROUNDOFF[torch.float32], u_in=U_TF32_PRODUCT)


def _data(m: int, k: int, n: int, seed: int, positive: bool = False):
    g = torch.Generator().manual_seed(seed)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / math.sqrt(k), torch.randn(n, generator=g)
    if positive:  # same-sign data: rounding errors add up, the hardest case for a bound
        x, w, b = x.abs() + 1, w.abs() + 1 / k, b.abs()
    return x, w, b


def _row_scale(x: torch.Tensor, w: torch.Tensor, i: int) -> float:
    """``||x_i|| ||r||``, r = |W|^T e: what every term of row i's bound multiplies (encoding.gemm_constants)."""
    return float(x[i].double().norm()) * float(w.double().abs().sum(0).norm())


def _tall_tf32_case(corrupt: bool):
    """A tall TF32 product (M = 128 N): a corruption of 4 u_in ||x_i|| ||r|| (4x the TF32 term of its row's
    bound) at (M/2, N/3)."""
    m, k, n = 4096, 64, 32
    x, w, b = _data(m, k, n, 0)
    y = F.linear(tf32(x), tf32(w), b)  # what a TF32 GEMM computes
    i, j = m // 2, n // 3
    if corrupt:
        y[i, j] += 4 * U_TF32_PRODUCT * _row_scale(x, w, i)
    return x, w, b, y, (i, j)


@pytest.mark.parametrize("via", ["verify_gemm", "device_linear"])
def test_a_tf32_error_below_the_column_bound_is_located_in_its_flagged_row(via):
    x, w, b, y, at = _tall_tf32_case(corrupt=True)
    enc = abft.encode_gemm(x, w.t(), "col", bias=b)
    enc.locate = False
    cols_only = abft.verify_gemm(enc, y, dtype=torch.float32, u_out=U_TF32_PRODUCT)
    assert not cols_only.alarm, cols_only.describe()  # the case: the column check alone misses it
    if via == "verify_gemm":
        rep = abft.verify_gemm(abft.encode_gemm(x, w.t(), bias=b), y, dtype=torch.float32, u_out=U_TF32_PRODUCT)
    else:
        rep = dl.check_device_linear(dl.encode_device_linear(w, b), x, y, TF32_PATH).report()
    assert rep.alarm and rep.location == at and rep.rows == [at[0]] and rep.cols == [at[1]], rep.describe()


def test_a_column_alarm_with_no_row_check_is_located_in_its_flagged_column():
    x, w, _, _, (i, j) = _tall_tf32_case(corrupt=False)
    yt = tf32(w) @ tf32(x).t()  # the transposed product: only its column check, whose bound is the tight one
    yt[j, i] += 4 * U_TF32_PRODUCT * _row_scale(x, w, i)
    rep = abft.verify_gemm(abft.encode_gemm(w, x.t(), "col"), yt, dtype=torch.float32, u_out=U_TF32_PRODUCT)
    assert rep.alarm and rep.location == (j, i) and rep.rows == [j] and rep.cols == [i], rep.describe()


@pytest.mark.parametrize("via", ["verify_gemm", "device_linear"])
def test_the_clean_tall_tf32_product_neither_alarms_nor_locates(via):
    x, w, b, y, _ = _tall_tf32_case(corrupt=False)
    if via == "verify_gemm":
        rep = abft.verify_gemm(abft.encode_gemm(x, w.t(), bias=b), y, dtype=torch.float32, u_out=U_TF32_PRODUCT,
                               exact_ratio=True)
    else:
        rep = dl.check_device_linear(dl.encode_device_linear(w, b), x, y, TF32_PATH).exact(True)
    assert not rep.alarm and rep.max_ratio <= 1.0 and rep.location is None and not rep.cols, rep.describe()


def _product(path: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    """``(y, check)``: the product as the path's kernel computes it (as the CPU emulates it) and a function
    from an output to its report."""
    if path in ("fp32", "tf32"):
        u_out = U_TF32_PRODUCT if path == "tf32" else 0.0
        y = F.linear(tf32(x), tf32(w), b) if path == "tf32" else F.linear(x, w, b)
        enc = abft.encode_gemm(x, w.t(), bias=b)
        return y, lambda out: abft.verify_gemm(enc, out, dtype=torch.float32, u_out=u_out)
    if path in ("bf16", "fp16", "fp16_floor"):  # the fp32 accumulator of the half product
        dt = HALF[path[:4]]
        x16, w16, b16 = x.to(dt).float(), w.to(dt).float(), b.to(dt).float()
        enc = abft.encode_gemm(x16, w16.t(), bias=b16)
        floor = path == "fp16_floor"
        return F.linear(x16, w16, b16), lambda out: abft.verify_gemm(enc, out, dtype=dt, scale_floor=floor)
    if path == "tf32_linear":
        enc = dl.encode_device_linear(w, b)
        return F.linear(tf32(x), tf32(w), b), lambda out: dl.check_device_linear(enc, x, out, TF32_PATH).report()
    dt = HALF[path[:4]]  # bf16_rounded / fp16_rounded: the device Linear's rounded half output
    xh, wh, bh = x.to(dt), w.to(dt), b.to(dt)
    enc = dl.encode_device_linear(wh, bh)
    pth = dl.gemm_path(dt, False, fp32_out=False)
    return F.linear(xh.float(), wh.float(), bh.float()).to(dt), \
        lambda out: dl.check_device_linear(enc, xh, out, pth).report()


PATHS = ["fp32", "tf32", "bf16", "fp16", "fp16_floor", "tf32_linear", "bf16_rounded", "fp16_rounded"]


@examples(30)
@given(m=st.integers(1, 300), k=st.integers(1, 300), n=st.integers(1, 40), seed=st.integers(0, 2**31),
       positive=st.booleans(), path=st.sampled_from(PATHS), at=st.tuples(st.floats(0, 1), st.floats(0, 1)),
       sign=st.sampled_from([-1.0, 1.0]))
def test_a_single_significant_corruption_is_located_at_its_exact_element(m, k, n, seed, positive, path, at, sign):
    x, w, b = _data(m, k, n, seed, positive)
    y, check = _product(path, x, w, b)
    i, j = min(int(at[0] * m), m - 1), min(int(at[1] * n), n - 1)
    # significant: 2^-5 of its row's scale, 4x the largest per-row term of any path's bound (2^-8 for a
    # rounded bf16 output, u_in < 2^-8 for TF32); the fp16 scale floor holds every row to the largest row's
    scale = max(_row_scale(x, w, r) for r in range(m)) if path == "fp16_floor" else _row_scale(x, w, i)
    bad = y.clone()
    bad[i, j] += sign * (2.0**-5 * scale + 1.0)
    assert not check(y).alarm
    rep = check(bad)
    assert rep.alarm and rep.location == (i, j) and rep.rows == [i] and rep.cols == [j], (path, rep.describe())


@examples(20)
@given(m=st.integers(1, 64), k=st.integers(1, 2048), n=st.integers(1, 64), seed=st.integers(0, 2**31),
       positive=st.booleans(), path=st.sampled_from(["tf32", "bf16_rounded", "fp16_floor"]))
def test_no_element_of_a_clean_product_exceeds_its_own_bound(m, k, n, seed, positive, path):
    # locate_elements runs only after an alarm; here on every row of a clean product, so that its element
    # bound is shown to hold each clean element (same-sign data: the errors add up)
    x, w, b = _data(m, k, n, seed, positive)
    if path == "tf32":
        y, rc, u_out, dt = F.linear(tf32(x), tf32(w), b), abft.encode_gemm(x, w.t(), bias=b).rows, U_TF32_PRODUCT, None
    elif path == "bf16_rounded":
        xh, wh, bh = x.bfloat16().float(), w.bfloat16().float(), b.bfloat16().float()
        y, rc = F.linear(xh, wh, bh).bfloat16().float(), abft.encode_gemm(xh, wh.t(), bias=bh).rows
        u_out, dt = UNIT_ROUNDOFF[torch.bfloat16], torch.bfloat16
    else:
        xh, wh, bh = x.half().float(), w.half().float(), b.half().float()
        y, rc, u_out, dt = F.linear(xh, wh, bh), abft.encode_gemm(xh, wh.t(), bias=bh).rows, 0.0, None
    found = locate_elements(rc, y, list(range(m)), u=UNIT_ROUNDOFF[torch.float32], lam=1.0, u_out=u_out,
                            out_dtype=dt, scale_floor=path == "fp16_floor")
    assert found == []
