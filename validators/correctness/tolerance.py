"""Error measures and dtype-aware bounds of the cross-device correctness validator.

An output of the device under test (the *target*) is judged against an fp64 recomputation of the
same operator on the same inputs, relative to the reference device's own error:

    err(x)  = ||x - exact||_2 / ||exact||_2           (normwise, over the finite elements, in fp64)
    pass   iff  x is bitwise equal to the reference output,
           or   err(target) <= bound = max(2 * err(reference), floor(dtype, K, s))

The floor covers the case where the reference happens to be (nearly) exact while the target uses
another valid algorithm (another summation order, a 2-ulp ``exp``):

    floor = c(dtype) * u(dtype) + 4 * sqrt(K) * max(s, u_acc)

* ``u(dtype)``: unit roundoff of the output dtype (2^-24 float32, 2^-8 bfloat16, 2^-11 float16,
  2^-53 float64); ``c`` = 4 for float32/float64 (two ulps: vendor math libraries promise 1-2 ulp
  for transcendental functions), 2 for bfloat16/float16 (one ulp: half-precision results are
  computed in float32 and rounded once, double rounding included).
* ``u_acc``: unit roundoff of the accumulation dtype: float32 for bfloat16/float16 (a correct
  device accumulates half-precision products in float32; one that does not is a finding), else
  the dtype itself.
* ``K``: terms summed per output element (the inner dimension of a matrix product, the reduced
  length of a reduction; 1 for elementwise operators), see :func:`reduction_length`. Rounding
  errors of a K-term sum in a valid order grow like ``sqrt(K) * u`` for random data (``K * u``
  is the worst case, ``log2(K) * u`` for pairwise summation).
* ``s``: the operator's sensitivity at that precision, measured: the normwise relative change of
  the fp64 result when every floating input is multiplied by ``1 + u_acc * r`` with ``r`` uniform
  in [-1, 1]. A backward-stable algorithm returns the exact result of inputs perturbed by about
  ``sqrt(K) * u_acc``, so ``sqrt(K) * s`` is the error a correct device can show; the measure
  brings in the conditioning (cancellation in a sum, a near-zero output) that no dtype-only
  bound knows. The factor 4 is margin.

Integer, boolean and other non-floating outputs must match the reference exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mystique.dtypes import HALF_DTYPES, unit_roundoff

OUTPUT_ROUNDINGS: dict[torch.dtype, float] = {torch.float64: 4.0, torch.float32: 4.0, torch.bfloat16: 2.0,
                                              torch.float16: 2.0}
ACCUMULATION_MARGIN = 4.0
REFERENCE_FACTOR = 2.0

# operator families for the reduction length K (names without namespace and overload)
_MATMUL_FIRST = frozenset({"mm", "bmm", "matmul", "mv", "linear", "_addmm_activation"})
_MATMUL_SECOND = frozenset({"addmm", "baddbmm", "addbmm", "addmv"})
_DOT = frozenset({"dot", "vdot", "inner"})
_GROUPED = frozenset({"_grouped_mm", "grouped_mm"})
_ROWWISE_MARKERS = ("softmax", "norm", "logsumexp", "cumsum", "cumprod", "cross_entropy", "nll_loss", "var", "std")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a correct device accumulates ``dtype`` results in (float32 for half types)."""
    if dtype in HALF_DTYPES or (dtype.is_floating_point and dtype.itemsize == 1):
        return torch.float32
    return dtype


def floor_bound(dtype: torch.dtype, k: float = 1.0, sensitivity: float = 0.0) -> float:
    """The floor of the error bound of a ``dtype`` output summing ``k`` terms (module docstring).

    Returns ``c * u + 4 * sqrt(k) * max(sensitivity, u_acc)``; grows with ``k`` and with
    ``sensitivity`` and never falls below ``c * u``.
    """
    u = unit_roundoff(dtype)
    ua = unit_roundoff(accumulation_dtype(dtype))
    c = OUTPUT_ROUNDINGS.get(dtype, 2.0)
    s = sensitivity if math.isfinite(sensitivity) else math.inf
    return c * u + ACCUMULATION_MARGIN * math.sqrt(max(1.0, float(k))) * max(s, ua)


def error_bound(err_reference: float, floor: float) -> float:
    """The error the target may show: ``max(2 * err_reference, floor)``."""
    ref = err_reference if math.isfinite(err_reference) else math.inf
    return max(REFERENCE_FACTOR * ref, floor)


def bitwise_equal(a: Any, b: Any) -> bool:
    """True when two results are the same bits: tensors of equal dtype, shape and bytes (NaN
    payloads and signed zeros included); other values (numbers, dtypes, None) when ``a == b``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.numel() == 0:
            return True
        x = a.detach().cpu().contiguous().reshape(-1)
        y = b.detach().cpu().contiguous().reshape(-1)
        if x.dtype.is_complex:
            x, y = torch.view_as_real(x).reshape(-1), torch.view_as_real(y).reshape(-1)
        if x.dtype == torch.bool:
            return bool(torch.equal(x, y))
        return bool(torch.equal(x.view(torch.uint8), y.view(torch.uint8)))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, RuntimeError):
        return False


def is_floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64).reshape(-1)


def normwise_error(x: torch.Tensor, exact: torch.Tensor, scale: float | None = None) -> float:
    """``||x - exact||_2 / ||exact||_2`` over the elements where ``exact`` is finite, in fp64.

    Non-finite values must agree: where ``exact`` is NaN, ``x`` must be NaN, where it is +-inf,
    ``x`` must be the same infinity; a disagreement, or a non-finite ``x`` where ``exact`` is
    finite, returns ``inf``. When ``||exact|| = 0`` the denominator is ``scale`` (e.g. the
    reference output's norm) when positive, else 1 (absolute error). Shapes must broadcast-free
    match (ValueError otherwise).
    """
    if tuple(x.shape) != tuple(exact.shape):
        raise ValueError(f"shape {tuple(x.shape)} differs from the exact result's {tuple(exact.shape)}")
    if x.numel() == 0:
        return 0.0
    xv, ev = _f64(x), _f64(exact)
    fin_e = torch.isfinite(ev)
    if not bool(fin_e.all()):
        ne, nx = ev[~fin_e], xv[~fin_e]
        same = (torch.isnan(ne) & torch.isnan(nx)) | (ne == nx)
        if not bool(same.all()):
            return math.inf
    xv, ev = xv[fin_e], ev[fin_e]
    if not bool(torch.isfinite(xv).all()):
        return math.inf
    num = float(torch.linalg.vector_norm(xv - ev))
    den = float(torch.linalg.vector_norm(ev))
    if den == 0.0:
        den = scale if scale is not None and scale > 0 and math.isfinite(scale) else 1.0
    return num / den


def mismatch_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements of two exact-valued tensors that differ (1.0 when shapes or dtypes differ)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return 1.0
    if a.numel() == 0:
        return 0.0
    x, y = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
    if x.dtype.is_floating_point or x.dtype.is_complex:
        differ = ~((x == y) | (torch.isnan(x) & torch.isnan(y)))
    else:
        differ = x != y
    return float(differ.sum()) / x.numel()


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def reduction_length(op: str, inputs: Sequence[Any], output: torch.Tensor | None) -> int:
    """K: an estimate of the terms summed into each element of ``output`` by operator ``op``.

    ``op`` is ``aten::mm.default``-like (namespace and overload optional); ``inputs`` the op's
    arguments in schema order (tensors, lists of tensors, other values). Matrix products use
    their inner dimension, convolutions ``in_channels / groups * kernel size``, attention the
    head dimension plus the key length; every op also counts ``max floating input numel /
    output numel`` (a reduction's terms per output); row-wise normalisations (softmax, norms,
    log-sum-exp, losses) count the last dimension of their first input, and index-driven
    accumulations (embedding backward, index_put) the number of indices. A grouped GEMM
    (``_grouped_mm``) counts its contracted dimension: ``mat_a``'s last, or, where the groups split
    the contracted dimension (a weight gradient ``(K, T) @ (T, N)``), the largest group. Returns at
    least 1.
    """
    name = op.split("::", 1)[-1].split(".", 1)[0]
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    tensors = _tensors(inputs)
    floats = [t for t in tensors if t.dtype.is_floating_point]
    k = 1
    if output is not None and output.numel() > 0 and floats:
        k = max(k, max(t.numel() for t in floats) // output.numel())
    try:
        if base in _MATMUL_FIRST and floats:
            k = max(k, floats[0].shape[-1] if floats[0].dim() else 1)
        elif base in _MATMUL_SECOND and len(floats) >= 2:
            k = max(k, floats[1].shape[-1] if floats[1].dim() else 1)
        elif base in _GROUPED and len(floats) >= 2:
            k = max(k, _grouped_k(floats[0], floats[1], [t for t in tensors if not t.dtype.is_floating_point]))
        elif base in _DOT and floats:
            k = max(k, floats[0].numel())
        elif "convolution" in base or base.startswith("conv"):
            if len(floats) >= 2 and floats[1].dim() >= 2:
                w = floats[1]
                k = max(k, w.numel() // max(1, w.shape[0]), w.shape[0])
        elif "scaled_dot_product" in base or "attention" in base:
            if len(floats) >= 2 and floats[0].dim() >= 2 and floats[1].dim() >= 2:
                k = max(k, floats[0].shape[-1] + floats[1].shape[-2])
        elif any(m in base for m in _ROWWISE_MARKERS):
            if floats and floats[0].dim():
                k = max(k, floats[0].shape[-1])
        if "embedding" in base or base.startswith(("index_put", "_index_put", "index_add", "scatter")):
            ints = [t for t in tensors if not t.dtype.is_floating_point and t.dtype != torch.bool]
            if ints:
                k = max(k, max(t.numel() for t in ints))
    except (IndexError, RuntimeError):
        pass
    return max(1, int(k))


def _grouped_k(a: torch.Tensor, b: torch.Tensor, ints: list[torch.Tensor]) -> int:
    """The terms each output of ``torch._grouped_mm(a, b, offs=...)`` sums: ``a``'s last dimension
    ((T, K) @ (E, K, N), (E, M, K) @ (K, T), (E, M, K) @ (E, K, N)); with both operands 2-d the groups
    split the contracted dimension T, and each output sums its own group's tokens: the largest group
    from ``offs`` (cumulative ends; T when absent)."""
    if a.dim() == 2 and b.dim() == 2 and ints and ints[0].numel():
        ends = [0, *ints[0].reshape(-1).tolist()]
        return max(1, *(e - s for s, e in zip(ends, ends[1:])))
    return a.shape[-1] if a.dim() else 1


@dataclass(frozen=True)
class Verdict:
    """How one output of one operator compared.

    ``status``: ``pass``/``fail``; ``kind``: ``bitwise`` (same bits as the reference), ``exact``
    (non-floating, compared for equality), ``fp64`` (judged against the fp64 recomputation) or
    ``reference`` (no fp64 result: judged against the reference output and the floor alone).
    ``err_target``/``err_reference``: normwise errors (mismatch fraction for exact outputs),
    ``bound`` the error allowed, ``ratio`` = ``err_target / bound`` (0 when bitwise equal, inf
    when an exact output differs).
    """

    status: str
    kind: str
    err_target: float
    err_reference: float
    bound: float
    ratio: float
    note: str = ""


def judge(target: Any, reference: Any, exact: Any = None, *, k: int = 1, sensitivity: float | None = None,
          note: str = "") -> Verdict:
    """Compare one output of the target with the reference's and, when given, the fp64 result.

    ``exact`` is the fp64 recomputation (a float64 tensor of the same shape) or None;
    ``sensitivity`` the measured ``s`` of :func:`floor_bound` (None: ``u_acc``). Returns a
    :class:`Verdict` (see there).
    """
    if bitwise_equal(target, reference):
        return Verdict("pass", "bitwise", 0.0, 0.0, 0.0, 0.0, note)
    if not (isinstance(target, torch.Tensor) and isinstance(reference, torch.Tensor)):
        if isinstance(target, float) and isinstance(reference, float):  # e.g. item() of a float tensor
            return judge(torch.tensor(target, dtype=torch.float64), torch.tensor(reference, dtype=torch.float64),
                         None if exact is None else torch.tensor(float(exact), dtype=torch.float64),
                         k=k, sensitivity=sensitivity, note=note)
        return Verdict("fail", "exact", 1.0, 0.0, 0.0, math.inf,
                       f"value {target!r} differs from the reference's {reference!r}")
    if target.shape != reference.shape or target.dtype != reference.dtype:
        return Verdict("fail", "exact", 1.0, 0.0, 0.0, math.inf,
                       f"result {target.dtype} {list(target.shape)} differs in kind from the reference's "
                       f"{reference.dtype} {list(reference.shape)}")
    if not reference.dtype.is_floating_point:
        frac = mismatch_fraction(target, reference)
        return Verdict("fail" if frac > 0 else "pass", "exact", frac, 0.0, 0.0, math.inf if frac > 0 else 0.0,
                       f"{frac:.3g} of the elements differ" if frac > 0 else note)
    s = sensitivity if sensitivity is not None else 0.0
    floor = floor_bound(reference.dtype, k, s)
    if exact is None or not isinstance(exact, torch.Tensor) or tuple(exact.shape) != tuple(reference.shape):
        err_t = normwise_error(target, reference)
        bound = floor
        ratio = err_t / bound if bound > 0 else math.inf
        return Verdict("pass" if err_t <= bound else "fail", "reference", err_t, 0.0, bound, ratio,
                       note or "no fp64 result: judged against the reference output and the floor")
    ref_norm = float(torch.linalg.vector_norm(_f64(reference)[torch.isfinite(_f64(reference))])) \
        if reference.numel() else 0.0
    err_r = normwise_error(reference, exact, scale=ref_norm)
    if not math.isfinite(err_r):  # the reference itself overflowed or made NaNs: judge against it
        return judge(target, reference, None, k=k, sensitivity=sensitivity,
                     note="the reference result has non-finite errors vs fp64: judged against the reference")
    err_t = normwise_error(target, exact, scale=ref_norm)
    bound = error_bound(err_r, floor)
    ratio = err_t / bound if bound > 0 else (0.0 if err_t == 0 else math.inf)
    ok = err_t <= bound
    return Verdict("pass" if ok else "fail", "fp64", err_t, err_r, bound, ratio, note)
