"""Broken devices, simulated: dispatch modes the numerics validator must fail.

Each factory returns a ``TorchDispatchMode`` that makes the healthy CPU behave like a device with
one numerics defect. They serve the test suite and ``--inject
mystique.validators.numerics.testing:<factory>`` (the CLI's ``package.module:factory`` form):

* :func:`round_toward_zero`: fp32 -> bf16/fp16 conversions truncate instead of rounding to nearest even.
* :func:`bf16_accumulation`: bf16 ``mm``/``bmm``/``addmm``/``baddbmm`` accumulate in bf16.
* :func:`flush_fp16_subnormals`: every fp16 result below the normal range becomes (signed) zero.
* :func:`push_ulps`: one op's results (default ``exp``) moved a few ulps away from the true value.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from mystique.dtypes import FLOAT_LAYOUT, HALF_DTYPES, int_view

aten = torch.ops.aten


def _truncate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round ``x`` (fp32/fp64) to ``dtype`` toward zero."""
    nearest = x.to(dtype)
    over = nearest.to(x.dtype).abs() > x.abs()
    bits = nearest.view(torch.int16)
    step = torch.where(bits < 0, -1, 1).to(torch.int16)  # sign-magnitude: this shrinks |value| by one ulp
    fixed = (bits - step).view(dtype)
    return torch.where(over & torch.isfinite(x), fixed, nearest)


class RoundTowardZero(TorchDispatchMode):
    """Conversions to bf16/fp16 from wider floats round toward zero."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (aten._to_copy.default, aten.copy_.default, aten._to_copy.out):
            src = args[1] if func is aten.copy_.default else args[0]
            if (isinstance(out, torch.Tensor) and out.dtype in HALF_DTYPES and isinstance(src, torch.Tensor)
                    and src.dtype in (torch.float32, torch.float64)):
                res = _truncate(src.to(out.device), out.dtype)
                if func is aten.copy_.default:
                    return out.copy_(res)
                return res
        return out


def _bf16_seq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b accumulated sequentially in bf16 (every partial sum rounded to bf16)."""
    acc = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.bfloat16, device=a.device)
    af, bf = a.float(), b.float()
    for k in range(a.shape[-1]):
        acc = (acc.float() + af[..., :, k:k + 1] * bf[..., k:k + 1, :]).to(torch.bfloat16)
    return acc


class Bf16Accumulation(TorchDispatchMode):
    """bf16 GEMMs accumulate in bf16 instead of fp32."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.mm.default, aten.bmm.default) and args[0].dtype == torch.bfloat16:
            return _bf16_seq(args[0], args[1])
        if func in (aten.addmm.default, aten.baddbmm.default) and args[1].dtype == torch.bfloat16:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            prod = _bf16_seq(args[1], args[2]).float()
            return (beta * args[0].float() + alpha * prod).to(torch.bfloat16)
        return func(*args, **kwargs)


class FlushFp16Subnormals(TorchDispatchMode):
    """fp16 results in the subnormal range are flushed to zero (FTZ)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tiny = torch.finfo(torch.float16).tiny

        def flush(t):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float16:
                sub = (t.abs() < tiny) & (t != 0)
                if bool(sub.any()):
                    return torch.where(sub, torch.zeros_like(t) * torch.sign(t), t)
            return t

        if func is aten.copy_.default:
            res = flush(out)
            return out.copy_(res) if res is not out else out
        return tree_map(flush, out)


class PushUlps(TorchDispatchMode):
    """Results of ``op`` moved ``ulps`` units in the last place away from zero."""

    def __init__(self, op: str = "exp", ulps: int = 4):
        super().__init__()
        self.op = op
        self.ulps = ulps

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.split(".")[0] == self.op and isinstance(out, torch.Tensor) and out.dtype in FLOAT_LAYOUT:
            bits = int_view(out.contiguous())
            step = torch.where(bits < 0, -1, 1).to(bits.dtype)  # sign-magnitude: grows |value|
            pushed = (bits + step * self.ulps).view(out.dtype)
            return torch.where(torch.isfinite(out) & (out != 0), pushed, out)
        return out


def round_toward_zero() -> TorchDispatchMode:
    return RoundTowardZero()


def bf16_accumulation() -> TorchDispatchMode:
    return Bf16Accumulation()


def flush_fp16_subnormals() -> TorchDispatchMode:
    return FlushFp16Subnormals()


def push_ulps() -> TorchDispatchMode:
    """``exp`` results pushed 4 ulps: a few ulps past the 1-ulp (bf16/fp16) and 2-ulp (fp32) bounds."""
    return PushUlps("exp", 4)
