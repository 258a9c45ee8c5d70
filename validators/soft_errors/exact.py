"""Exact integer arithmetic for the int8 GEMM check, with kernels every device has.

The int8 check of :mod:`.abft` compares integer checksums for equality, so its reference sums
must be exact. The obvious way, an int64 matrix-vector product, exists on the CPU only: CUDA has
no int64 (nor int32, int16, int8) GEMM or GEMV kernel (``"addmv_impl_cuda" not implemented for
'Long'``), MPS has no fp64 at all. What every backend has are elementwise integer products and
integer reductions with an int64 accumulator (``torch.sum(..., dtype=torch.int64)``), and the
int8 product itself is the device's int8 GEMM (``torch._int_mm``, int8 x int8 -> int32), which
has shape constraints on CUDA.

:func:`int_matvec` -- ``sum_k x_ik v_k`` (or over the other dimension), exact:

* every product ``x_ik v_k`` is formed in int32 when ``max|x| max|v| <= 2^31 - 1`` (both bounds
  known from the dtypes and the lengths, no device read), else in int64 (asserted
  ``max|x| max|v| <= 2^63 - 1``): an integer product that fits its type is exact;
* the products are summed with an int64 accumulator (asserted ``K max|x| max|v| <= 2^63 - 1``):
  integer addition without overflow is exact in any order.

For the int8 GEMM ``C = A B`` (|a|, |b| <= 128): the row reference ``A (B e)`` has
``|(B e)_k| <= 128 N``, products ``<= 2^14 N`` (int32 while ``N < 2^17``) and sums
``<= 2^14 N K`` (int64 while ``N K < 2^49``); the column reference alike with ``M``.

:func:`int8_mm` -- the int8 product itself, exact, on the device's int8 GEMM: ``torch._int_mm``,
whose CUDA kernel needs ``M > 16`` and ``K``, ``N`` positive multiples of 8 (``_int_mm_out_cuda``
in aten/src/ATen/native/cuda/Blas.cpp); other shapes are zero-padded to those (zero rows and
columns add nothing to a sum) and the result sliced. Where the device has no ``_int_mm`` at all,
a float32 GEMM in K-chunks of at most 1024 is exact: int8 values are exact in fp32 (and in TF32
and bf16), each product is an integer ``<= 2^14`` and each chunk's partial sums ``<= 2^10 2^14 =
2^24``, all integers fp32 represents exactly, in whatever order the kernel adds them; the chunks
are then added in int32 (the dtype of the int8 GEMM's own accumulator, exact while
``K 2^14 < 2^31``, i.e. ``K < 2^17``, as ``_int_mm``'s).
"""

from __future__ import annotations

import torch

from mystique.errors import UsageError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: the largest K-chunk whose fp32 partial sums of int8 products stay exact (2^10 * 2^14 = 2^24)
FP32_EXACT_CHUNK = 1024
#: elements of the product temporary formed at once by :func:`int_matvec` (64 MiB of int32)
_CHUNK_ELEMENTS = 1 << 24
#: CUDA's ``_int_mm`` shape constraints: M > 16, K and N positive multiples of 8
INT_MM_MIN_M = 17
INT_MM_MULTIPLE = 8

_BOUNDS: dict[torch.dtype, int] = {
    torch.int8: 128, torch.uint8: 255, torch.int16: 2**15, torch.int32: 2**31, torch.int64: 2**63,
    torch.bool: 1,
}


def dtype_bound(dtype: torch.dtype) -> int:
    """The largest magnitude a value of the integer ``dtype`` can have."""
    try:
        return _BOUNDS[dtype]
    except KeyError:
        raise UsageError(f"exact integer sums need an integer dtype, got {dtype}") from None


def int_matvec(x: torch.Tensor, v: torch.Tensor, *, dim: int = 1, x_bound: int | None = None,
               v_bound: int | None = None) -> torch.Tensor:
    """``sum_k x[i, k] v[k]`` (``dim=1``) or ``sum_k x[k, j] v[k]`` (``dim=0``) as exact int64.

    ``x`` is a 2-D integer tensor, ``v`` a 1-D integer tensor on the same device; ``x_bound`` /
    ``v_bound`` bound their magnitudes (default: their dtypes' ranges). Only elementwise products
    and int64-accumulated sums run (see the module docstring for the range argument, asserted here).
    """
    if x.dim() != 2 or v.dim() != 1 or x.shape[dim] != v.shape[0]:
        raise UsageError(f"int_matvec needs a matrix and a vector along dim {dim}, got {tuple(x.shape)} and "
                         f"{tuple(v.shape)}")
    xb = dtype_bound(x.dtype) if x_bound is None else int(x_bound)
    vb = dtype_bound(v.dtype) if v_bound is None else int(v_bound)
    k = x.shape[dim]
    if xb * vb * max(k, 1) > INT64_MAX:
        raise UsageError(f"int_matvec: {k} products of magnitude up to {xb} x {vb} may overflow int64")
    # (x's narrower dtype is promoted to the product dtype by the multiplication itself)
    vv = v.to(torch.int32 if xb * vb <= INT32_MAX else torch.int64)
    vv = vv[None, :] if dim == 1 else vv[:, None]
    other = x.shape[1 - dim]
    if other * k <= _CHUNK_ELEMENTS:
        return torch.mul(x, vv).sum(dim, dtype=torch.int64)
    step = max(1, _CHUNK_ELEMENTS // k)  # rows (dim=1) or columns (dim=0) per product temporary
    parts = [torch.mul(x[s:s + step] if dim == 1 else x[:, s:s + step], vv).sum(dim, dtype=torch.int64)
             for s in range(0, other, step)]
    return torch.cat(parts)


def int8_checksums(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A (B e), (e^T A) B)`` of an 8-bit GEMM ``A B`` (int8 or uint8 operands), exact int64.

    The row sums ``B e`` and column sums ``e^T A`` are int64 reductions; the products with the
    other operand go through :func:`int_matvec` with the bounds ``|B e| <= max|b| N`` and
    ``|e^T A| <= max|a| M``.
    """
    m, n = a.shape[0], b.shape[1]
    ab, bb = dtype_bound(a.dtype), dtype_bound(b.dtype)
    row = int_matvec(a, b.sum(1, dtype=torch.int64), dim=1, x_bound=ab, v_bound=bb * max(n, 1))
    col = int_matvec(b, a.sum(0, dtype=torch.int64), dim=0, x_bound=bb, v_bound=ab * max(m, 1))
    return row, col


def int_mm_shape_ok(m: int, k: int, n: int) -> bool:
    """Whether ``(m x k) @ (k x n)`` meets the shape constraints of CUDA's ``_int_mm``."""
    return m >= INT_MM_MIN_M and k > 0 and n > 0 and k % INT_MM_MULTIPLE == 0 and n % INT_MM_MULTIPLE == 0


def _round_up(x: int, q: int) -> int:
    return max(q, -(-x // q) * q)


def int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The exact int32 product of two int8 matrices on their device (see the module docstring):
    ``torch._int_mm``, zero-padded to CUDA's shape constraints where needed; a chunked fp32 GEMM
    where the device has no int8 GEMM."""
    if a.dtype != torch.int8 or b.dtype != torch.int8 or a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise UsageError(f"int8_mm needs (M,K) @ (K,N) int8 matrices, got {tuple(a.shape)} {a.dtype} @ "
                         f"{tuple(b.shape)} {b.dtype}")
    (m, k), n = a.shape, b.shape[1]
    try:
        if int_mm_shape_ok(m, k, n):
            return torch._int_mm(a, b)
        mp, kp, np_ = max(m, INT_MM_MIN_M), _round_up(k, INT_MM_MULTIPLE), _round_up(n, INT_MM_MULTIPLE)
        ap = a.new_zeros((mp, kp))
        ap[:m, :k] = a
        bp = b.new_zeros((kp, np_))
        bp[:k, :n] = b
        return torch._int_mm(ap, bp)[:m, :n].contiguous()
    except (RuntimeError, NotImplementedError):  # no int8 GEMM on this device (or not for these operands)
        return fp32_chunked_int8_mm(a, b)


def fp32_chunked_int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The int8 product by float32 GEMMs over K-chunks of :data:`FP32_EXACT_CHUNK`, exact (module docstring)."""
    (m, k), n = a.shape, b.shape[1]
    out = torch.zeros((m, n), dtype=torch.int32, device=a.device)
    for s in range(0, k, FP32_EXACT_CHUNK):
        part = torch.mm(a[:, s:s + FP32_EXACT_CHUNK].float(), b[s:s + FP32_EXACT_CHUNK].float())
        out += part.to(torch.int32)
    return out
