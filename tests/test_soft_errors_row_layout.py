"""The fused 8-bit lookup reads its rows in a layout of its own, each row's fp32 checksum beside it
(:func:`fused_layout.row_layout`): the layout's law, that the kernel reads the checksum there, and that
the copy follows the packed table through in-place writes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.soft_errors import _kernels, abft
from mystique.validators.soft_errors.abft import fused_layout

pytestmark = pytest.mark.skipif(os.environ.get(_kernels.DISABLE_ENV) == "1",
                                reason="the compiled kernels are turned off (MYSTIQUE_NO_NUMBA=1)")


def _table(rows: int, d: int, seed: int = 0) -> abft.QuantizedTable:
    g = torch.Generator().manual_seed(seed)
    return abft.QuantizedTable.from_float(torch.randn(rows, d, generator=g))


def _bags(rows: int, n_bags: int, length: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, rows, (n_bags * length,), generator=g)
    return idx, torch.arange(0, n_bags * length, length)


def _fbgemm(table: abft.QuantizedTable, idx: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
    return torch.ops.quantized.embedding_bag_byte_rowwise_offsets(table.packed, idx, off, False, 0, False, None,
                                                                  None, False)


@examples(30)
@given(rows=st.integers(1, 40), d=st.integers(1, 200), seed=st.integers(0, 2**31 - 1))
def test_each_row_of_the_layout_is_the_packed_row_then_its_fp32_checksum_at_an_aligned_stride(rows, d, seed):
    table = _table(rows, d, seed)
    ft = table.fused()
    lay, packed = ft.view, table.packed.numpy()
    assert lay.ctypes.data % fused_layout.LINE == 0
    assert lay.shape[1] % fused_layout.ROW_ALIGN == 0 and d + 12 <= lay.shape[1] < d + 12 + fused_layout.ROW_ALIGN
    assert np.array_equal(lay[:, :d + 8], packed)
    sums = np.ascontiguousarray(lay[:, d + 8:d + 12]).view(np.float32)[:, 0]
    assert np.array_equal(sums, table.checks.rowsum[:, 0].numpy())
    assert not lay[:, d + 12:].any()


@pytest.mark.parametrize("d", [64, 7, 130])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_a_flipped_checksum_in_the_layout_alarms_in_exactly_the_bags_that_read_its_row(d, mode):
    """The kernel takes each bag's reference from the checksums in the rows it reads (were it to read the
    separate ``rowsum`` array, this flip would go unseen), and the output stays torch's."""
    table = _table(300, d)
    idx, off = _bags(300, 24, 5)
    clean, rep = abft.checked_quantized_embedding_bag(table, idx, off, mode)
    assert not rep.alarm
    sums = table.checks.rowsum[:, 0]
    row = next(int(j) for j in idx if 1e-3 < abs(float(sums[j])) < 1)  # (bit 30 then multiplies it by 2^128)
    lay = table.fused().view
    lay[row, d + 8 + 3] ^= 0x40  # the checksum's exponent, bit 30
    out, rep = abft.checked_quantized_embedding_bag(table, idx, off, mode)
    reads = sorted({b for b in range(24) if row in idx[b * 5:(b + 1) * 5].tolist()})
    assert rep.alarm and rep.rows == reads, rep.describe()
    assert torch.equal(out, clean)


def test_a_flipped_code_in_the_layout_alarms_and_moves_the_output_as_read():
    table = _table(300, 64)
    idx, off = _bags(300, 24, 5)
    clean, _ = abft.checked_quantized_embedding_bag(table, idx, off)
    row = int(idx[0])
    table.fused().view[row, 5] ^= 0x80
    out, rep = abft.checked_quantized_embedding_bag(table, idx, off)
    assert rep.alarm and 0 in rep.rows, rep.describe()
    assert not torch.equal(out[0], clean[0])


def test_an_in_place_write_to_the_packed_table_is_read_by_the_next_checked_lookup():
    """The layout is a copy: after a write through torch (version counter bumped) it is made again, so the
    checked output is torch's on the table as it now is, and the stale checksums alarm."""
    table = _table(300, 64)
    idx, off = _bags(300, 24, 5)
    abft.checked_quantized_embedding_bag(table, idx, off)
    row = int(idx[0])
    table.packed[row, 5] ^= 0x80
    out, rep = abft.checked_quantized_embedding_bag(table, idx, off)
    assert torch.equal(out, _fbgemm(table, idx, off))
    assert rep.alarm and 0 in rep.rows, rep.describe()


def test_new_checksums_after_an_update_are_clean():
    table = _table(300, 64)
    idx, off = _bags(300, 24, 5)
    abft.checked_quantized_embedding_bag(table, idx, off)
    table.packed[:10, :64] = 3
    updated = abft.QuantizedTable(table.packed, abft.QuantizedTable.compute_checks(table.packed), 64)
    out, rep = abft.checked_quantized_embedding_bag(updated, idx, off)
    assert not rep.alarm and torch.equal(out, _fbgemm(table, idx, off))


def test_the_kernel_refuses_8bit_rows_without_room_for_their_checksum():
    """A uint8 table narrower than D + 12 bytes a row (fbgemm's own packed rows) is never read past its rows:
    the kernel returns -1 (torch's lookup then runs)."""
    table = _table(50, 16)
    idx, off = _bags(50, 4, 3)
    kernel = _kernels.kernel_table()["bag_lookup"]
    out, buf = np.empty((4, 16), np.float32), np.empty((2, 4))
    args = (idx.numpy(), off.numpy(), out, table.checks.rowsum_view(), None, False, True, 1.0, 1.0, buf[0], buf[1])
    assert kernel(0, 4, table.packed.numpy(), *args) == -1.0
    assert kernel(0, 4, table.fused().view, *args) != -1.0


def test_an_inference_tensor_table_is_checked_without_the_copy():
    """An inference tensor has no version counter, so no copy could follow its writes: the checked lookup
    takes torch's path, with the same output and verdict."""
    with torch.inference_mode():
        table = _table(300, 64)
    idx, off = _bags(300, 24, 5)
    assert table.fused() is None
    out, rep = abft.checked_quantized_embedding_bag(table, idx, off)
    assert not rep.alarm and torch.equal(out, _fbgemm(table, idx, off))
