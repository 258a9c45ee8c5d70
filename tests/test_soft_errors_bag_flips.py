"""Every flip of a looked-up row that the EmbeddingBag check's bound says must be seen raises the alarm, at
its bag, for every D in 1..130 (the compiled lookup's chunks of 128, 64, 16 and single columns and their
ragged tails), every bit of an fp32 element and of an 8-bit row (codes, scale, bias), sum and mean, on the
fused compiled lookup, on torch's lookup with the compiled verdict and on the torch path.

Which flips must be seen is :func:`sure_alarms`: the derivation of the check's own threshold (a flip
whose change of the bag's checksum is within the rounding a clean lookup may make cannot be told from it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from unittest import mock

import numpy as np
import pytest
import torch
from mystique.validators.soft_errors import _kernels, abft
from mystique.validators.soft_errors.abft import bag_verdict, fused_lookup
from mystique.validators.soft_errors.abft.bag_verdict import row_sums64, sure_alarms

from mystique.dtypes import int_view

#: the kernel each path must reach (None: no compiled kernel at all)
KERNEL = {"fused": (fused_lookup, "bag_lookup"), "verdict": (bag_verdict, "bag_verdict"), "torch": None}
SIGN_EXPONENT = (31, *range(23, 31))
GROUP = 15  # flipped bags per lookup: with the clean bag, at most 16 bags alarm, all listed in report.rows
FP32_EXTRA, BYTE_EXTRA = 4.0, 6.0  # the `extra` roundings of checked_embedding_bag and its 8-bit lookup

needs_kernels = pytest.mark.skipif(os.environ.get(_kernels.DISABLE_ENV) == "1",
                                   reason="the compiled kernels are turned off (MYSTIQUE_NO_NUMBA=1)")
#: the fused lookup; torch's lookup and the compiled verdict; torch only
PATHS = [pytest.param("fused", marks=needs_kernels), pytest.param("verdict", marks=needs_kernels), "torch"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Thousands of lookups of a few bags each: one intra-op thread (more only wait for each other, at
    milliseconds a call where other processes hold the cores)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _fp32_flips(d: int, bits: Collection[int] = range(32)) -> list[tuple[int, float | None, int]]:
    """(column, value set there first or None for the table's own, bit) of every flip at D = d: columns
    0, D // 2 and D - 1 (the first chunk, the middle, the ragged tail); 1.5 (exponent 127: every exponent
    flip shrinks it, bit 30 makes it NaN) and -2.5 (exponent 128: every exponent flip but bit 30 grows it)."""
    cols: dict[int, float | None] = {d - 1: -2.5}
    cols.setdefault(0, 1.5)
    cols.setdefault(d // 2, None)
    return [(c, v, b) for c, v in cols.items() for b in bits]


def _byte_flips(d: int, bits: Collection[int] = range(32)) -> list[tuple[int, int]]:
    """(byte of the packed row, bit) of every flip of an 8-bit row at D = d: the bits of the codes at
    columns 0, D // 2 and D - 1 and of the fp32 scale and bias among ``bits`` (those of an fp32: the codes
    take the ones below 8)."""
    return [(c, b) for c in sorted({0, d // 2, d - 1}) for b in range(8) if b in bits] + \
        [(d + k, b) for k in range(8) for b in range(8) if 8 * (k % 4) + b in bits]


def _bit32(b: int) -> int:
    """Bit ``b`` of an int32 (bit 31 is its sign)."""
    return -(1 << 31) if b == 31 else 1 << b


def _bags(nf: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bag j < nf: the flipped row j between the clean rows nf and nf + 1 (at place j % 3); bag nf: both
    clean rows only (it must stay quiet)."""
    bags = [[[j, nf, nf + 1], [nf, j, nf + 1], [nf, nf + 1, j]][j % 3] for j in range(nf)] + [[nf, nf + 1]]
    idx = torch.tensor([i for b in bags for i in b])
    off = torch.tensor([0, *np.cumsum([len(b) for b in bags])[:-1].tolist()])
    return idx, off


@contextlib.contextmanager
def _path(path: str):
    """The lookup of ``path``: the torch path with the compiled kernels off; torch's lookup and the compiled
    verdict as where this torch build's lookup rounds otherwise than the fused one (which then stands down)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        names: list[str] = []
        if path == "torch":
            stack.enter_context(_kernels.disabled())
        else:
            module, _ = KERNEL[path]
            stack.enter_context(mock.patch.object(module, "raw", lambda name: names.append(name) or _kernels.raw(name)))
        if path == "verdict":
            stack.enter_context(mock.patch.object(fused_lookup, "fused_lookups_agree", lambda *a: False))
        yield
        if KERNEL[path] is not None:
            assert KERNEL[path][1] in names, (path, names)


def _check(report: abft.CheckReport, sure: np.ndarray, nf: int, what: str) -> None:
    """Every bag sure to alarm is flagged, and none without a flipped row (the last bag)."""
    rows = set(report.rows)
    assert set(np.flatnonzero(sure).tolist()) <= rows, (what, sorted(rows), np.flatnonzero(sure).tolist())
    assert nf not in rows, (what, sorted(rows))


def _sweep_fp32(d: int, path: str, mode: str, bits: Collection[int]) -> np.ndarray:
    """The fp32 flips of ``bits`` at D = d on ``path``: checks each lookup, returns whether each flip was sure."""
    flips = _fp32_flips(d, bits)
    sure_all = []
    g = torch.Generator().manual_seed(d)
    for at in range(0, len(flips), GROUP):
        group = flips[at:at + GROUP]
        w = torch.randn(len(group) + 2, d, generator=g)
        for j, (c, v, _) in enumerate(group):
            if v is not None:
                w[j, c] = v
        checks = abft.EmbeddingChecks.of(w)
        bad = w.clone()
        for j, (c, _, b) in enumerate(group):
            int_view(bad)[j, c] ^= _bit32(b)
        idx, off = _bags(len(group))
        sure = sure_alarms(row_sums64(w), row_sums64(bad), idx, off, mode, d, FP32_EXTRA)
        with _path(path):
            report = abft.checked_embedding_bag(abft.CheckedTable(bad, checks), idx, off, mode)[1]
        _check(report, sure, len(group), f"fp32 D={d} {path} {mode} flips {group}")
        sure_all.append(sure[:-1])
    return np.concatenate(sure_all)


def _sweep_bytes(d: int, path: str, mode: str, bits: Collection[int]) -> np.ndarray:
    """The 8-bit-row flips of ``bits`` at D = d on ``path``, as :func:`_sweep_fp32`."""
    flips = _byte_flips(d, bits)
    sure_all = []
    g = torch.Generator().manual_seed(1000 + d)
    for at in range(0, len(flips), GROUP):
        group = flips[at:at + GROUP]
        table = abft.QuantizedTable.from_float(torch.randn(len(group) + 2, d, generator=g))
        bad = table.packed.clone()
        for j, (byte, b) in enumerate(group):
            bad[j, byte] ^= 1 << b
        idx, off = _bags(len(group))
        sure = sure_alarms(table.row_sums64(table.packed), table.row_sums64(bad), idx, off, mode, d, BYTE_EXTRA)
        with _path(path):
            report = abft.checked_quantized_embedding_bag(abft.QuantizedTable(bad, table.checks, d), idx,
                                                          off, mode)[1]
        _check(report, sure, len(group), f"8-bit D={d} {path} {mode} flips {group}")
        sure_all.append(sure[:-1])
    return np.concatenate(sure_all)


def _fp32_coverage(d: int, bits: Collection[int], sure: np.ndarray) -> None:
    """The sweep is no empty one: the sign, every exponent bit and the top mantissa bit of the two set
    values (1.5 and -2.5: each flip moves the value by at least 0.5, about 100 x the bound at D = 130)
    are sure to alarm."""
    for k, (c, v, b) in enumerate(_fp32_flips(d, bits)):
        if v is not None and b in (*SIGN_EXPONENT, 22):
            assert sure[k], (d, c, v, b)


def _byte_coverage(d: int, bits: Collection[int], sure: np.ndarray) -> None:
    """The top bit of a code (128 steps of the scale) is sure to alarm where the row has a range (D > 1)."""
    for k, (byte, b) in enumerate(_byte_flips(d, bits)):
        if d > 1 and byte < d and b == 7:
            assert sure[k], (d, byte, b)


def _sweep(dims: Collection[int], path: str, bits: Collection[int] = range(32)) -> None:
    for d in dims:
        for mode in ("sum", "mean"):
            _fp32_coverage(d, bits, _sweep_fp32(d, path, mode, bits))
            _byte_coverage(d, bits, _sweep_bytes(d, path, mode, bits))


EDGES = (1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 130)  # (single columns, chunks of 16, 64 and 128, tails)


@pytest.mark.parametrize("path", PATHS)
def test_every_sure_flip_of_a_looked_up_row_alarms_at_its_bag_at_the_chunk_edges(path):
    _sweep(EDGES, path)


@pytest.mark.parametrize("path", PATHS)
def test_sure_exponent_and_sign_flips_of_a_looked_up_row_alarm_at_their_bag_for_every_d(path):
    # bit 28 (issue #30 item 14's), bit 30 (to NaN or a subnormal) and the sign: of an fp32 element, and of
    # an 8-bit row's scale and bias; the top bit of its codes
    _sweep(range(1, 131), path, (7, 28, 30, 31))


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_every_sure_flip_of_a_looked_up_row_alarms_at_its_bag_for_every_d(path):
    _sweep([d for d in range(1, 131) if d not in EDGES], path)


def test_the_d65_exponent_flip_below_the_bound_is_not_sure_to_alarm():
    # issue #30 item 14: bit 28 of -3.52e-4 (exponent 115) clears 2^5 of the exponent: the value becomes
    # -8.2e-14, a change of 3.5e-4 to a 9-row bag's checksum whose clean rounding bound is 2.1e-3 to 2.3e-3
    # (u (9 (1 + r) + 65 + 4) a_b, a_b = 447): a change the rounding of a clean lookup may make
    w = torch.full((9, 65), 447.0 / (9 * 65 - 1))  # a_b = 447
    w[0, 0] = -3.522693587001413e-4
    bad = w.clone()
    int_view(bad)[0, 0] ^= 1 << 28
    assert abs(float(bad[0, 0])) < 1e-13
    idx, off = torch.arange(9), torch.tensor([0])
    assert not sure_alarms(row_sums64(w), row_sums64(bad), idx, off, "sum", 65, FP32_EXTRA).any()
    thr = 2.0**-24 * (2 * 9 + 65 + 4) * 447.0  # the larger bound (r = 1)
    bad[0, 0] = 2.0 * thr  # a change just over twice it (the magnitudes grow by 2 thr: thr grows by 2e-5 thr)
    assert sure_alarms(row_sums64(w), row_sums64(bad), idx, off, "sum", 65, FP32_EXTRA).all()
    bad[0, 0] = thr - 3.6e-4  # a change just below it
    assert not sure_alarms(row_sums64(w), row_sums64(bad), idx, off, "sum", 65, FP32_EXTRA).any()
