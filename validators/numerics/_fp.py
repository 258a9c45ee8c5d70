"""Floating-point facts and error metrics shared by the numerics checks.

Everything here runs on the CPU on reference data (fp64 goldens); nothing here runs on the
device under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mystique import dtypes

SWEEP_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: ``p`` significand bits (with the implicit one), ``emin``."""

    dtype: torch.dtype
    p: int
    emin: int
    emax: int

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p (half an ulp of 1)."""
        return 2.0 ** -self.p

    @property
    def max(self) -> float:
        return float(torch.finfo(self.dtype).max)

    @property
    def tiny(self) -> float:
        """Smallest positive normal."""
        return 2.0 ** self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.p + 1)


FORMATS = {
    torch.bfloat16: Format(torch.bfloat16, 8, -126, 127),
    torch.float16: Format(torch.float16, 11, -14, 15),
    torch.float32: Format(torch.float32, 24, -126, 127),
    torch.float64: Format(torch.float64, 53, -1022, 1023),
}
U32 = FORMATS[torch.float32].u
U_TF32 = 2.0 ** -11


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the worst-case relative error of an n-term recursive sum."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 1 else math.inf


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ulp of ``dtype`` at each fp64 value (the spacing of dtype numbers there; subnormal-aware).

    Values beyond the largest finite number get the ulp of the largest finite number.
    """
    fmt = FORMATS[dtype]
    v = values.double().abs().clamp(max=fmt.max)
    _, e = torch.frexp(v)  # v = m * 2**e, m in [0.5, 1) -> floor(log2 v) = e - 1
    expo = torch.clamp(e.double() - 1, min=fmt.emin)
    return torch.pow(2.0, expo - (fmt.p - 1))


def ulp_error(out: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype,
              scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per-element error of ``out`` against the fp64 ``golden`` in ulps of ``dtype`` at ``scale``.

    ``scale`` defaults to ``|golden|``. Matching non-finite values (NaN and NaN, equal infinities)
    count 0; any other non-finite mismatch counts inf.
    """
    o = out.double()
    g = golden.double()
    s = g.abs() if scale is None else scale.double().abs()
    err = (o - g).abs() / ulp(s, dtype)
    both_nan = torch.isnan(o) & torch.isnan(g)
    same_inf = torch.isinf(o) & torch.isinf(g) & (o == g)
    err = torch.where(both_nan | same_inf, torch.zeros_like(err), err)
    bad = ~torch.isfinite(o) | ~torch.isfinite(g)
    return torch.where(bad & ~(both_nan | same_inf), torch.full_like(err, math.inf), err)


def normwise_error(out: torch.Tensor, golden: torch.Tensor) -> float:
    """||out - golden||_2 / ||golden||_2 in fp64 (inf when out has a non-finite value golden lacks)."""
    o = out.double().reshape(-1)
    g = golden.double().reshape(-1)
    if not torch.isfinite(o).all() or not torch.isfinite(g).all():
        return math.inf if not torch.equal(torch.isfinite(o), torch.isfinite(g)) else _masked_normwise(o, g)
    den = float(torch.linalg.vector_norm(g))
    num = float(torch.linalg.vector_norm(o - g))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _masked_normwise(o: torch.Tensor, g: torch.Tensor) -> float:
    fin = torch.isfinite(g)
    if not torch.equal(o[~fin].nan_to_num(), g[~fin].nan_to_num()):
        return math.inf
    return normwise_error(o[fin], g[fin]) if fin.any() else 0.0


def componentwise_error(out: torch.Tensor, golden: torch.Tensor, scale: torch.Tensor) -> tuple[float, int]:
    """max_i |out_i - golden_i| / scale_i over entries with scale_i > 0, and the flat index of the max.

    For a GEMM ``scale`` is ``|A||B|`` (plus ``|beta||C|`` for addmm-like ops).
    """
    o = out.double().reshape(-1)
    g = golden.double().reshape(-1)
    s = scale.double().reshape(-1)
    err = (o - g).abs() / s
    err = torch.where(s > 0, err, torch.where(o == g, torch.zeros_like(err), torch.full_like(err, math.inf)))
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    if err.numel() == 0:
        return 0.0, 0
    i = int(torch.argmax(err))
    return float(err[i]), i


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to TF32 (10 explicit mantissa bits) with ties to even; NaN/inf kept."""
    b = x.contiguous().view(torch.int32)
    lsb = (b >> 13) & 1
    r = ((b + 0xFFF + lsb) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), r, x)


def hexbits(t: torch.Tensor) -> list[str]:
    """Hex strings of the bit patterns of a 1-D float tensor (for failure details)."""
    width = dtypes.bits(t.dtype) // 4
    mask = (1 << (4 * width)) - 1
    return [f"0x{int(v) & mask:0{width}x}" for v in dtypes.int_view(t.contiguous()).reshape(-1).tolist()]
