"""Checked operators (algorithm-based fault tolerance): GEMM and EmbeddingBag with checksums.

GEMM ``C = A @ B`` (A: M x K, B: K x N) is checked twice in O(n^2):

* row check:    ``C e``   against ``A (B e)``      (one number per row of C)
* column check: ``e^T C`` against ``(e^T A) B``    (one number per column of C)

A clean run differs from the reference only by rounding. The threshold per row ``i`` is

    thr_i = lam * u * (sqrt(K) + log2(N) + log2(K) + 2) * ||a_i||_2 * sum_j ||b_j||_2

(and symmetrically per column ``j`` with ``sum_i ||a_i||_2 * ||b_j||_2``), where ``u`` is the unit
roundoff of the *accumulation* dtype. It is built from the probabilistic rounding-error bound of a
dot product (error of ``a.b`` at most ``lam * sqrt(K) * u * sum|a_k b_k|`` with overwhelming
probability, Higham and Mary 2019) and Cauchy-Schwarz (``sum|a_k b_k| <= ||a|| ||b||``), summed
with absolute values over the other index so that perfectly correlated errors (identical rows,
padding tokens) cannot add up past it. The ``log2`` terms cover the rounding of the checksums
themselves (pairwise sums). Every quantity is O(n^2) and row-norm shaped, so the check costs a few
passes over A, B and C instead of a second GEMM. ``lam`` was calibrated on clean data of many
shapes, scales and distributions (uniform positive, heavy tailed, constant, identical rows) and on
the activations of the reference workloads, and carries a margin (see ``calibrate_gemm_lambda``).

bf16/fp16 GEMMs are computed with fp32 accumulation and checked *on the fp32 accumulator*, then
rounded. Checking the rounded output instead would have to allow each output element its rounding
error ``2^-8 |c_ij|`` (bf16): a threshold 2^16 times larger, which lets every flip below about the
eighth mantissa bit of the result through, and every flip of the accumulator that rounding does not
erase but that stays below that bound. ``check_rounded=True`` does exactly that, for comparison.

int8 GEMMs accumulate in int32 and are checked exactly (int64 checksums, equality).

EmbeddingBag over an fp32 table ``W`` (R x D) runs once over the augmented table
``[W | W 1 | |W| 1]`` (R x (D+2), built once by :func:`augment_table`): the two extra columns give,
in the same pass, the reference checksum of each bag and the magnitude its rounding error is bounded
by (``thr_b = lam * u * (L_b + D + 4) * sum_{l in bag} sum_d |w_ld|``, the classic gamma bound).
8-bit row-wise quantized tables (per-row scale and bias, the fbgemm layout) keep their checksums in
a separate R x 2 fp32 table gathered with the same indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from mystique.errors import UsageError

UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
#: Safety factor of the GEMM threshold (calibrated; see module docstring).
GEMM_LAMBDA = 1.0
#: Factor of the EmbeddingBag gamma bound (1 is the rigorous deterministic bound).
EMBEDDING_LAMBDA = 1.0
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class CheckReport:
    """Outcome of one checked operation.

    ``alarm`` is True when a checksum disagreed beyond its threshold; ``max_ratio`` is the largest
    ``|checksum difference| / threshold`` (below 1 on a clean run); ``rows``/``cols`` list the
    flagged rows and columns (GEMM) or bags (EmbeddingBag, in ``rows``); ``location`` is the first
    flagged (row, col) of a GEMM when both checks flag; ``checked`` is False when the inputs were
    not finite (no verdict possible).
    """

    op: str
    dtype: str
    alarm: bool
    max_ratio: float
    checked: bool = True
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    location: tuple[int, int] | None = None
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else (f" rows {self.rows[:4]}" if self.rows else "")
        return (f"{self.op} {self.dtype} {tuple(self.shape)}: {'ALARM' if self.alarm else 'ok'} "
                f"max|diff|/thr={self.max_ratio:.3g}{where}")


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm of each row of a 2-D tensor (fast on row-major and transposed storage)."""
    if x.is_contiguous() or not x.t().is_contiguous():
        return torch.linalg.vector_norm(x, dim=1)
    return col_norms(x.t())


def col_norms(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm of each column of a 2-D tensor, without an n x n temporary."""
    if x.t().is_contiguous():
        return torch.linalg.vector_norm(x.t(), dim=1)
    acc = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    step = max(1, (1 << 18) // max(1, x.shape[1]))
    for s in range(0, x.shape[0], step):
        chunk = x[s:s + step]
        acc.add_((chunk * chunk).sum(0))
    return acc.sqrt_()


@dataclass
class GemmEncoding:
    """Checksums and threshold scales of ``A @ B`` computed from the operands before the product."""

    ref_row: torch.Tensor  # A (B e)          (M,)
    ref_col: torch.Tensor  # (e^T A) B        (N,)
    scale_row: torch.Tensor  # ||a_i|| * sum_j ||b_j||
    scale_col: torch.Tensor  # sum_i ||a_i|| * ||b_j||
    k: int
    m: int
    n: int
    exact: bool = False


def _check_2d(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise UsageError(f"checked GEMM needs (M,K) @ (K,N) matrices, got {tuple(a.shape)} @ {tuple(b.shape)}")


def encode_gemm(a: torch.Tensor, b: torch.Tensor, checks: str = "both",
                bias: torch.Tensor | None = None) -> GemmEncoding:
    """Reference checksums of ``a @ b (+ bias)`` from the operands (float: in a's dtype; int8: int64).

    ``bias`` (N,) is folded in as an extra column of ones in A and an extra row in B.
    """
    _check_2d(a, b)
    m, k = a.shape
    n = b.shape[1]
    if a.dtype in (torch.int8, torch.uint8):
        a64, b64 = a.to(torch.int64), b.to(torch.int64)
        ref_row = a64 @ b64.sum(1) if checks in ("row", "both") else torch.empty(0)
        ref_col = a64.sum(0) @ b64 if checks in ("col", "both") else torch.empty(0)
        if bias is not None:
            ref_row = ref_row + bias.to(torch.int64).sum()
            ref_col = ref_col + m * bias.to(torch.int64)
        empty = torch.empty(0)
        return GemmEncoding(ref_row, ref_col, empty, empty, k, m, n, exact=True)
    na = row_norms(a)
    nb = col_norms(b)
    if bias is not None:
        nb = torch.sqrt(nb * nb + bias.to(nb.dtype) ** 2)
        na = torch.sqrt(na * na + 1.0)
    ref_row = ref_col = torch.empty(0)
    if checks in ("row", "both"):
        ref_row = a @ b.sum(1)
        if bias is not None:
            ref_row = ref_row + bias.sum()
    if checks in ("col", "both"):
        ref_col = a.sum(0) @ b
        if bias is not None:
            ref_col = ref_col + m * bias
    return GemmEncoding(ref_row, ref_col, na * nb.sum(), na.sum() * nb, k + (bias is not None), m, n)


def gemm_factor(k: int, m: int, n: int, u: float, lam: float) -> float:
    """The scalar in front of the norm products of the GEMM threshold (see module docstring)."""
    return lam * u * (math.sqrt(k) + math.log2(max(m, n, 2)) + math.log2(max(k, 2)) + 2.0)


def verify_gemm(enc: GemmEncoding, c: torch.Tensor, *, dtype: torch.dtype, lam: float | None = None,
                u: float | None = None, u_out: float = 0.0, op: str = "gemm") -> CheckReport:
    """Compare the computed product ``c`` (accumulator precision) with the encoding.

    ``u`` defaults to the unit roundoff of ``c.dtype``; ``u_out`` adds the rounding of an output
    that was rounded to a narrower dtype before the check. Returns a :class:`CheckReport`.
    """
    shape = (enc.m, enc.k, enc.n)
    rows: list[int] = []
    cols: list[int] = []
    if enc.exact:
        c64 = c.to(torch.int64)
        if enc.ref_row.numel():
            rows = torch.nonzero(c64.sum(1) != enc.ref_row).flatten().tolist()
        if enc.ref_col.numel():
            cols = torch.nonzero(c64.sum(0) != enc.ref_col).flatten().tolist()
        alarm = bool(rows or cols)
        loc = (rows[0], cols[0]) if rows and cols else None
        return CheckReport(op, _dt(dtype), alarm, math.inf if alarm else 0.0, True, rows[:16], cols[:16], loc, shape)
    lam = GEMM_LAMBDA if lam is None else lam
    u = UNIT_ROUNDOFF[c.dtype] if u is None else u
    factor = gemm_factor(enc.k, enc.m, enc.n, u, lam) + u_out
    # same-sign data make rounding errors correlated (they add up like K, not sqrt(K)); then
    # sum_j sum_k |a_ik b_kj| = |checksum| and the deterministic gamma bound applies to it directly
    det = u * (enc.k + math.log2(max(enc.m, enc.n, 2)) + 2.0)
    tiny = torch.finfo(c.dtype).tiny * (enc.k + enc.m + enc.n)
    ratios = []
    checked = True
    for got_fn, ref, scale, out in ((lambda: c.sum(1), enc.ref_row, enc.scale_row, rows),
                                    (lambda: c.sum(0), enc.ref_col, enc.scale_col, cols)):
        if not ref.numel():
            continue
        thr = torch.addcmul(scale * factor + tiny, ref.abs(), torch.tensor(det, dtype=ref.dtype, device=ref.device))
        diff = got_fn().sub_(ref).abs_()
        worst = float(diff.div(thr).max())  # NaN when anything is not finite
        if worst <= 1.0:  # fast path: clean
            ratios.append(worst)
            continue
        valid = torch.isfinite(ref) & torch.isfinite(thr)
        if not bool(valid.all()):
            checked = False
        bad = ~(diff <= thr) & valid
        out.extend(torch.nonzero(bad).flatten()[:16].tolist())
        r = torch.where(valid, diff / thr, torch.zeros_like(diff))
        ratios.append(float(r.nan_to_num(math.inf).max()) if r.numel() else 0.0)
    alarm = bool(rows or cols)
    loc = (rows[0], cols[0]) if rows and cols else None
    return CheckReport(op, _dt(dtype), alarm, max(ratios) if ratios else 0.0, checked, rows, cols, loc, shape)


def _accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product in the accumulation dtype: fp32 for floats (exact products, fp32 sums), int32 for int8."""
    if a.dtype == torch.int8:
        try:
            return torch._int_mm(a, b)
        except RuntimeError:  # shapes or device the fused int8 kernel does not take
            return (a.to(torch.int32) @ b.to(torch.int32)) if a.device.type == "cpu" else \
                (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)
    if a.dtype in (torch.bfloat16, torch.float16):
        return a.float() @ b.float()
    return a @ b


def checked_mm(a: torch.Tensor, b: torch.Tensor, *, checks: str = "both", lam: float | None = None,
               check_rounded: bool = False) -> tuple[torch.Tensor, CheckReport]:
    """``a @ b`` with row and column checksums; returns ``(c, report)``.

    fp32: checked as computed. bf16/fp16: accumulated and checked in fp32, then rounded to the input
    dtype (``check_rounded=True`` checks the rounded output instead; weaker, for comparison).
    int8: int32 result, exact check.
    """
    _check_2d(a, b)
    if a.dtype != b.dtype:
        raise UsageError(f"checked_mm needs one dtype, got {a.dtype} and {b.dtype}")
    if checks not in ("row", "col", "both"):
        raise UsageError(f"checks must be row, col or both, got {checks!r}")
    if a.dtype not in (*_FLOATS, torch.int8):
        raise UsageError(f"checked_mm supports float32, bfloat16, float16 and int8, got {a.dtype}")
    if a.dtype == torch.int8:
        enc = encode_gemm(a, b, checks)
        c = _accumulate(a, b)
        return c, verify_gemm(enc, c, dtype=a.dtype, op="gemm")
    a32, b32 = (a, b) if a.dtype == torch.float32 else (a.float(), b.float())
    enc = encode_gemm(a32, b32, checks)
    acc = _accumulate(a, b)
    if a.dtype == torch.float32:
        return acc, verify_gemm(enc, acc, dtype=a.dtype, lam=lam)
    out = acc.to(a.dtype)
    if check_rounded:
        return out, verify_gemm(enc, out.float(), dtype=a.dtype, lam=lam, u=UNIT_ROUNDOFF[torch.float32],
                                u_out=UNIT_ROUNDOFF[a.dtype], op="gemm_rounded")
    return out, verify_gemm(enc, acc, dtype=a.dtype, lam=lam)


def checked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   lam: float | None = None) -> tuple[torch.Tensor, CheckReport]:
    """``F.linear(x, weight, bias)`` checked like a GEMM (x flattened to 2-D); returns ``(y, report)``."""
    x2 = x.reshape(-1, x.shape[-1])
    work = torch.float32 if x.dtype in _FLOATS else x.dtype
    xw, ww = x2.to(work), weight.to(work)
    bw = bias.to(work) if bias is not None else None
    enc = encode_gemm(xw, ww.t(), "both", bias=bw)
    acc = F.linear(xw, ww, bw)
    rep = verify_gemm(enc, acc, dtype=x.dtype, lam=lam, op="linear")
    return acc.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0]), rep


# ----------------------------------------------------------------------------- EmbeddingBag

def augment_table(weight: torch.Tensor) -> torch.Tensor:
    """``[W | W 1 | |W| 1]`` (R x (D+2), fp32): the table with its row checksum and magnitude columns."""
    if weight.dim() != 2 or weight.dtype != torch.float32:
        raise UsageError(f"augment_table needs a 2-D float32 table, got {tuple(weight.shape)} {weight.dtype}")
    w64 = weight.detach().double()
    extra = torch.stack([w64.sum(1), w64.abs().sum(1)], dim=1).to(torch.float32)
    return torch.cat([weight.detach(), extra], dim=1).contiguous()


def _bag_lengths(indices: torch.Tensor, offsets: torch.Tensor, n_bags: int) -> torch.Tensor:
    return torch.diff(offsets[:n_bags], append=offsets.new_full((1,), indices.numel())) if n_bags else offsets[:0]


def _verify_bags(got: torch.Tensor, ref: torch.Tensor, absum: torch.Tensor, lengths: torch.Tensor, d: int,
                 extra: float, lam: float | None, op: str, dtype: str, shape: tuple[int, ...]) -> CheckReport:
    lam = EMBEDDING_LAMBDA if lam is None else lam
    u = UNIT_ROUNDOFF[torch.float32]
    thr = (lengths.to(torch.float32) + (d + extra)).mul_(absum).mul_(lam * u).add_(torch.finfo(torch.float32).tiny * (d + 2))
    diff = got.sub_(ref).abs_() if got.is_floating_point() else (got - ref).abs()
    worst = float(diff.div(thr).max()) if diff.numel() else 0.0
    if worst <= 1.0:
        return CheckReport(op, dtype, False, worst, True, [], [], None, shape)
    valid = torch.isfinite(ref) & torch.isfinite(thr)
    bad = ~(diff <= thr) & valid
    rows = torch.nonzero(bad).flatten()[:16].tolist()
    r = torch.where(valid, diff / thr, torch.zeros_like(diff))
    ratio = float(r.nan_to_num(math.inf).max()) if r.numel() else 0.0
    return CheckReport(op, dtype, bool(rows), ratio, bool(valid.all()), rows, [], None, shape)


def _bags_args(indices: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if indices.dim() == 2:
        b, L = indices.shape
        return indices.reshape(-1), torch.arange(0, b * L, L, device=indices.device)
    if offsets is None:
        raise UsageError("1-D indices need offsets")
    return indices, offsets


def checked_embedding_bag(aug_table: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor | None = None,
                          mode: str = "sum", *, lam: float | None = None) -> tuple[torch.Tensor, CheckReport]:
    """EmbeddingBag (sum or mean) over a table made by :func:`augment_table`; returns ``(out, report)``.

    ``out`` is the (bags x D) result (a view of the augmented output); one embedding_bag call gives
    both the result and its checksums.
    """
    if mode not in ("sum", "mean"):
        raise UsageError(f"checked_embedding_bag supports sum and mean pooling, got {mode!r}")
    idx, off = _bags_args(indices, offsets)
    d = aug_table.shape[1] - 2
    res = F.embedding_bag(idx, aug_table, off, mode=mode)
    out = res[:, :d]
    lengths = _bag_lengths(idx, off, res.shape[0])
    rep = _verify_bags(out.sum(1), res[:, d], res[:, d + 1], lengths, d, 4.0, lam, f"embedding_bag_{mode}",
                       "float32", (aug_table.shape[0], d, res.shape[0]))
    return out, rep


@dataclass
class QuantizedTable:
    """An 8-bit row-wise quantized table (fbgemm layout: D uint8 codes, fp32 scale, fp32 bias per row).

    ``checks`` (R x 2, fp32) holds, per row, the checksum ``sum_d (s q_d + b)`` and the magnitude
    ``sum_d (|s q_d| + |b|)``, computed in fp64 from the packed bytes.
    """

    packed: torch.Tensor
    checks: torch.Tensor
    dim: int

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> QuantizedTable:
        try:
            packed = torch.ops.quantized.embedding_bag_byte_prepack(weight.detach().float().cpu().contiguous())
        except (RuntimeError, AttributeError) as exc:
            from mystique.errors import EnvironmentUnsupported

            raise EnvironmentUnsupported(f"this torch build lacks 8-bit embedding ops: {exc}") from exc
        packed = packed.to(weight.device)
        return cls(packed, cls.compute_checks(packed), weight.shape[1])

    @staticmethod
    def compute_checks(packed: torch.Tensor) -> torch.Tensor:
        d = packed.shape[1] - 8
        q = packed[:, :d].to(torch.float64)
        sb = packed[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32).to(torch.float64)
        scale, bias = sb[:, 0:1], sb[:, 1:2]
        rowsum = (q * scale + bias).sum(1)
        absum = (q * scale.abs() + bias.abs()).sum(1)
        return torch.stack([rowsum, absum], 1).to(torch.float32)

    def dequantize(self) -> torch.Tensor:
        d = self.dim
        q = self.packed[:, :d].to(torch.float32)
        sb = self.packed[:, d:].clone(memory_format=torch.contiguous_format).view(torch.float32)
        return q * sb[:, 0:1] + sb[:, 1:2]


def quantized_embedding_bag(table: QuantizedTable, indices: torch.Tensor, offsets: torch.Tensor,
                            mode: str = "sum") -> torch.Tensor:
    """The fused 8-bit row-wise EmbeddingBag (unchecked), on the device of the table.

    The fused kernel is called in sum mode and mean pooling divides by the bag length afterwards:
    on torch 2.13 CPU ``embedding_bag_byte_rowwise_offsets`` silently returns sums when asked for
    mode=1 (mean), which the clean campaign of this checker flagged.
    """
    out = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
        table.packed, indices, offsets, False, 0, False, None, None, False)
    if mode == "mean":
        lengths = _bag_lengths(indices, offsets, out.shape[0]).clamp(min=1).to(out.dtype)
        out = out / lengths[:, None]
    elif mode != "sum":
        raise UsageError(f"8-bit EmbeddingBag supports sum and mean pooling, got {mode!r}")
    return out


def checked_quantized_embedding_bag(table: QuantizedTable, indices: torch.Tensor,
                                    offsets: torch.Tensor | None = None, mode: str = "sum", *,
                                    lam: float | None = None) -> tuple[torch.Tensor, CheckReport]:
    """8-bit row-wise EmbeddingBag (sum or mean) checked against the precomputed row checksums."""
    if mode not in ("sum", "mean"):
        raise UsageError(f"checked_quantized_embedding_bag supports sum and mean pooling, got {mode!r}")
    idx, off = _bags_args(indices, offsets)
    out = quantized_embedding_bag(table, idx, off, mode)
    chk = F.embedding_bag(idx, table.checks, off, mode=mode)
    lengths = _bag_lengths(idx, off, out.shape[0])
    rep = _verify_bags(out.sum(1), chk[:, 0], chk[:, 1], lengths, table.dim, 6.0, lam,
                       f"embedding_bag_8bit_{mode}", "uint8", (table.packed.shape[0], table.dim, out.shape[0]))
    return out, rep


def embedding_checks_table(weight: torch.Tensor) -> torch.Tensor:
    """R x 2 fp32 ``[W 1, |W| 1]`` computed in fp64 (for checking an existing Embedding/EmbeddingBag)."""
    w64 = weight.detach().double()
    return torch.stack([w64.sum(1), w64.abs().sum(1)], 1).to(torch.float32)


def verify_embedding_output(out: torch.Tensor, checks: torch.Tensor, indices: torch.Tensor,
                            offsets: torch.Tensor | None, mode: str, per_sample_weights: torch.Tensor | None = None,
                            *, lam: float | None = None, u_out: float = 0.0, op: str = "embedding_bag"
                            ) -> CheckReport:
    """Check the output of an existing EmbeddingBag (or Embedding when ``mode == 'none'``) call."""
    d = out.shape[-1]
    if mode == "none":
        got = out.float().reshape(-1, d).sum(1)
        chk = checks[indices.reshape(-1)]
        lengths = torch.ones_like(got)
        ref, absum = chk[:, 0], chk[:, 1]
    else:
        idx, off = _bags_args(indices, offsets)
        if mode == "max":
            return CheckReport(op, _dt(out.dtype), False, 0.0, False, shape=tuple(out.shape))
        got = out.float().sum(1)
        ref = F.embedding_bag(idx, checks[:, :1], off, mode=mode, per_sample_weights=per_sample_weights)[:, 0]
        psw_abs = per_sample_weights.abs() if per_sample_weights is not None else None
        absum = F.embedding_bag(idx, checks[:, 1:], off, mode=mode, per_sample_weights=psw_abs)[:, 0]
        lengths = _bag_lengths(idx, off, got.shape[0])
    rep = _verify_bags(got.clone(), ref, absum, lengths, d, 4.0, lam, op, _dt(out.dtype), tuple(out.shape))
    if u_out:
        # output rounded to a narrower dtype: allow each element its rounding error (sum |out| <= absum)
        thr_extra = u_out * absum
        diff = (got - ref).abs()
        base = EMBEDDING_LAMBDA * UNIT_ROUNDOFF[torch.float32] * (lengths.to(torch.float32) + d + 4.0) * absum
        bad = ~(diff <= base + thr_extra) & torch.isfinite(ref)
        rep.rows = torch.nonzero(bad).flatten()[:16].tolist()
        rep.alarm = bool(rep.rows)
        rep.max_ratio = float((diff / (base + thr_extra + 1e-38)).nan_to_num(math.inf).max()) if diff.numel() else 0.0
    return rep


def describe_thresholds() -> dict[str, Any]:
    """The constants the checks use (for results details and documentation)."""
    return {"gemm_lambda": GEMM_LAMBDA, "embedding_lambda": EMBEDDING_LAMBDA,
            "u": {_dt(k): v for k, v in UNIT_ROUNDOFF.items()}}
