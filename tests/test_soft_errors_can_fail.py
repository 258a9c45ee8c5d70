"""Soft-error checks that no other test drove to ``fail`` in-process, each under a fault
(issue #30: every check can fail; the registry is tests/check_reproducers.py)."""

from __future__ import annotations

import pytest
import torch
from mystique.validators import soft_errors
from mystique.validators.soft_errors import sdc
from mystique.validators.soft_errors.abft import CheckedTable, EmbeddingChecks
from mystique.validators.soft_errors.checks import abft_embedding_bag

from mystique.faults.bitflip import BitFlipMode
from mystique.targets import Target


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


def test_sdc_screen_fails_when_one_run_of_a_kernel_differs_from_the_others():
    """The second of three runs has one bit flipped: the runs mismatch and that run leaves the fp64 bound."""
    modes: list[BitFlipMode] = []

    def second_run_flips():
        modes.append(BitFlipMode(rate=1.0 if len(modes) == 1 else 0.0, bits=[30], seed=2, max_flips=1))
        return modes[-1]

    kernel = sdc.default_kernels("quick")[0]
    df = soft_errors.run(Target("cpu", second_run_flips, "second_run_flips"), groups=["sdc_screen"], sdc_runs=3,
                         sdc_kernels=[kernel])
    rows = df[df["check"] == "sdc_screen"].set_index("metric")
    assert rows.loc["mismatched_runs", "status"] == "fail" and rows.loc["mismatched_runs", "value"] == 1
    assert rows.loc["error_vs_fp64_bound", "status"] == "fail"


def test_false_positives_fails_when_the_device_corrupts_clean_products():
    """A device flipping exponent bits in 1% of mm outputs: clean checked GEMMs alarm."""
    target = Target("cpu", lambda: BitFlipMode(rate=0.01, bit_class="exponent", seed=1, ops="mm"), "corrupt_mm")
    df = soft_errors.run(target, groups=["false_positives"], fp_trials=60, workloads=["dlrm"], workload_seeds=1)
    rows = df[(df["check"] == "false_positives") & (df["status"] == "fail")]
    assert {"alarms"} <= set(rows["metric"]), df[df["check"] == "false_positives"][["subject", "metric", "status"]]


def test_abft_embedding_bag_fails_when_the_table_changed_after_its_checksums(monkeypatch):
    """Every fp32 table row doubled after its checksums were taken (memory corrupted after encoding):
    the clean lookups alarm."""
    def stale(weight: torch.Tensor) -> CheckedTable:
        return CheckedTable(weight.detach() * 2, EmbeddingChecks.of(weight))

    monkeypatch.setattr(abft_embedding_bag, "checked_table", stale)
    df = soft_errors.run(Target("cpu"), groups=["abft_embedding_bag"])
    rows = df[(df["check"] == "abft_embedding_bag") & (df["metric"] == "clean_alarm")].set_index("subject")
    assert rows.loc["embedding_bag_sum", "status"] == "fail" and rows.loc["embedding_bag_mean", "status"] == "fail"
    assert rows.loc["embedding_bag_8bit_sum", "status"] == "pass"  # the 8-bit tables are untouched


def test_abft_fbgemm_fails_when_the_tbe_rows_changed_after_their_checksums(monkeypatch):
    """The top bit of code byte 0 of every FBGEMM table row flipped after the table (and its checksums)
    were built: the clean lookups alarm."""
    from mystique.validators.soft_errors.abft.fbgemm import FbgemmTable, fbgemm_available

    if not fbgemm_available():
        pytest.skip("FBGEMM is not installed")
    real = FbgemmTable.from_float.__func__

    def corrupted(cls, weight, bits=8, mode="sum"):
        table = real(cls, weight, bits, mode)
        packed, _sb = table.tbe.split_embedding_weights(split_scale_shifts=True)[0]
        packed[:, 0] ^= 0x80
        return table

    monkeypatch.setattr(FbgemmTable, "from_float", classmethod(corrupted))
    df = soft_errors.run(Target("cpu"), groups=["abft_fbgemm"])
    rows = df[(df["check"] == "abft_fbgemm") & (df["metric"] == "clean_alarm") & df.subject.str.startswith("fbgemm_")]
    assert len(rows) == 4 and set(rows["status"]) == {"fail"}, rows[["subject", "status", "detail"]].to_string()


def test_abft_fbgemm_tbe_rows_fail_when_the_checksums_disagree_with_the_tables(monkeypatch):
    """CheckedTBE's row sums all off by one: the clean table-batched forwards alarm (clean_alarm fails); with a
    verdict that never alarms, the flipped rows go unseen (injected_detected fails)."""
    from mystique.validators.soft_errors.abft import tbe
    from mystique.validators.soft_errors.abft.bag_verdict import EmbeddingChecks
    from mystique.validators.soft_errors.abft.fbgemm import fbgemm_available

    if not fbgemm_available():
        pytest.skip("FBGEMM is not installed")
    real = tbe.CheckedTBE.checks
    monkeypatch.setattr(tbe.CheckedTBE, "checks", lambda self: [EmbeddingChecks(c.rowsum + 1.0, c.absum)
                                                                for c in real(self)])
    df = soft_errors.run(Target("cpu"), groups=["abft_fbgemm"])
    rows = df[(df["metric"] == "clean_alarm") & df.subject.str.startswith("tbe_")]
    assert len(rows) == 2 and set(rows["status"]) == {"fail"}, rows[["subject", "status", "detail"]].to_string()
    monkeypatch.setattr(tbe.CheckedTBE, "checks", real)
    monkeypatch.setattr(tbe.CheckedTBE, "verify", lambda self, *a, **k: tbe.CheckReport("tbe", "float32", False, 0.0))
    df = soft_errors.run(Target("cpu"), groups=["abft_fbgemm"])
    rows = df[(df["metric"] == "injected_detected") & df.subject.str.startswith("tbe_")]
    assert len(rows) == 2 and set(rows["status"]) == {"fail"}, rows[["subject", "status", "detail"]].to_string()
