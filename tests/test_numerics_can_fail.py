"""Numerics checks that no other test drove to ``fail``, each under a device that breaks what it checks
(issue #30: every check can fail; the registry is tests/check_reproducers.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from mystique.validators import numerics
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.targets import Target

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


class Breaks(TorchDispatchMode):
    """The floating results of the ops in ``ops`` (overload packets) passed through ``change``."""

    def __init__(self, ops: tuple, change: Callable[[torch.Tensor, tuple], torch.Tensor]):
        super().__init__()
        self.ops, self.change = ops, change

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket not in self.ops:
            return out
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):  # attention: (output, logsumexp)
            return (self.change(out[0], args), *out[1:])
        return self.change(out, args) if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def _run(ops: tuple, change: Callable, label: str, group: str, **options):
    return numerics.run(Target("cpu", lambda: Breaks(ops, change), label), groups=[group], **options)


def _statuses(df, check: str) -> set[str]:
    return set(df.loc[df["check"] == check, "status"])


def test_nan_propagation_fails_when_addition_drops_nans():
    df = _run((aten.add,), lambda out, a: torch.nan_to_num(out, nan=0.0, posinf=torch.inf, neginf=-torch.inf),
              "nan_to_zero", "special_values", dtypes="bfloat16")
    rows = df[df["check"] == "nan_propagation"]
    assert rows["status"].tolist() == ["fail"] and "NaN lost in: add" in rows["detail"].iloc[0]


def test_overflow_to_inf_fails_when_multiplication_saturates():
    df = _run((aten.mul,), lambda out, a: out.clamp(torch.finfo(out.dtype).min, torch.finfo(out.dtype).max),
              "saturating", "special_values", dtypes="float16")
    rows = df[df["check"] == "overflow_to_inf"]
    assert rows["status"].tolist() == ["fail"] and "mul_two" in rows["detail"].iloc[0]


def test_signed_zero_fails_when_negation_loses_the_sign_of_zero():
    df = _run((aten.neg,), lambda out, a: torch.where(out == 0, torch.zeros_like(out), out),
              "unsigned_zero", "special_values", dtypes="bfloat16")
    rows = df[df["check"] == "signed_zero"]
    assert rows["status"].tolist() == ["fail"] and "neg" in rows["detail"].iloc[0]


def _widening_off_by_one(out: torch.Tensor, args: tuple) -> torch.Tensor:
    """fp32 results of a conversion from a 16-bit float, the last mantissa bit flipped where finite and nonzero."""
    if out.dtype != torch.float32 or args[0].dtype not in (torch.bfloat16, torch.float16):
        return out
    flipped = (out.view(torch.int32) ^ 1).view(torch.float32)
    return torch.where(torch.isfinite(out) & (out != 0), flipped, out)


def test_conversion_widening_exact_fails_when_widening_is_off_by_one_ulp():
    df = _run((aten._to_copy,), _widening_off_by_one, "wide_ulp", "conversions", dtypes="bfloat16")
    rows = df[df["check"] == "conversion_widening_exact"]
    assert rows["status"].tolist() == ["fail"] and rows["value"].iloc[0] > 60000


def test_model_deviation_checks_fail_when_matmuls_are_ten_percent_off():
    """Every GEMM result 10% too large: each block, the output, the loss and the gradients leave their bounds."""
    df = _run((aten.mm, aten.addmm, aten.bmm), lambda out, a: out * 1.1, "gemm_ten_percent", "model_deviation",
              workloads=["llama"], dtypes="bfloat16")
    for check in ("model_layer_deviation", "model_output_deviation", "model_train_deviation"):
        rows = df[df["check"] == check]
        assert "fail" in set(rows["status"]), rows[["subject", "status", "detail"]].to_string()
    assert df.loc[df["subject"] == "llama/layers.0", "status"].tolist() == ["fail"]


def test_attention_backend_deviation_fails_when_the_fused_kernel_is_off_and_math_is_not():
    """Only the fused (flash) attention kernel is wrong (its output 4x): its deviation leaves the bound
    relative to the math backend's."""
    df = _run((aten._scaled_dot_product_flash_attention_for_cpu,), lambda out, a: out * 4, "flash_off",
              "model_deviation", workloads=["llama"], dtypes="bfloat16")
    rows = df[df["check"] == "attention_backend_deviation"]
    assert rows["status"].tolist() == ["fail"], rows[["subject", "status", "detail"]].to_string()
    assert rows["value"].iloc[0] > 2 * rows["threshold"].iloc[0]
