"""Error bounds of the op sweep's reductions, valid for any summation order a device may use.

Every function here returns ``(b, how)``: ``b`` a componentwise bound (fp64 tensor, the golden's
shape) on ``|device - golden|``, and ``how`` one line stating the derivation. The op sweep holds
``normwise_error`` to ``||b||_2 / ||golden||_2`` (``|e_i| <= b_i`` for every i gives
``||e|| <= ||b||``). Everything runs on the CPU on fp64 copies of the dtype-rounded inputs.

Notation: ``u`` the unit roundoff of the output dtype, ``u32`` of fp32, ``eta`` the smallest
subnormal of the output dtype (a rounding in the subnormal range errs by at most ``eta/2``), and
``A_i = sum_j |x_j|`` over the terms of output i.

* One final rounding of an accumulator value z to the dtype: ``|fl(z) - y| <= u|y| + (1+u)|z - y|
  + eta/2``; r roundings in a row compound to ``r u |y| + (1+u)^r |z - y| + r eta/2``.
* Worst case (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., sec. 4.2): a sum
  computed in ANY order (recursive, blocked, pairwise, split over threads or blocks) in which no
  term passes through more than d roundings errs by at most ``gamma_d(u_acc) * A``,
  ``gamma_d = d u / (1 - d u)``. Every order of an n-term sum has d <= n - 1.
* Probabilistic (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, Thm 3.1 and sec. 4.1): when the
  rounding errors of the accumulator are independent, mean-zero and bounded by ``u_acc``, the same
  sum errs by at most ``gamma~_d(lam) * A`` with ``gamma~_d(lam) = exp(lam sqrt(d) u + d u^2/(1-u)) - 1``,
  except with probability ``2 exp(-lam^2 (1-u)^2 / 2)`` per term. ``lam`` is chosen by a union
  bound over every (output, term) pair so that a healthy device fails a row with probability at
  most ``P_FAIL``. Used only for fp32 accumulators, where the model is credible for these inputs:
  the rounding errors of round-to-nearest are systematically biased only under stagnation (terms
  absorbed whole because they are below u32 times the partial sum), which needs terms below
  n u32 max|x| <= 2^-8 max|x| here (n <= 2^16, partial sums below n max|x|); the sweep's random
  inputs put a negligible share of sum|x| there, and the experiments of Higham & Mary (sec. 5)
  show the model's bound holding for such data. It is an assumption, stated as such; where the
  worst case is smaller it is used instead. Low-precision (bf16/fp16) partial sums, which can
  stagnate after 2^8 to 2^11 terms, always get the worst case.
* Library functions: fp32 ``exp``/``log`` err by at most 2 ulp and ``rsqrt`` by at most 2 ulp (CUDA
  libdevice's documented maxima; the CPU's SLEEF kernels are within them), i.e. by a relative
  ``2 * 2 u32`` each (one ulp is at most ``2 u`` relative).
"""

from __future__ import annotations

import math

import torch

from ._fp import FORMATS, U32, gamma

P_FAIL = 1e-6
LIB_ULPS = 2.0  # exp, log, rsqrt in fp32 (libdevice maxima)
E_LIB = 2.0 * LIB_ULPS * U32


def lam_for(events: int, p_fail: float = P_FAIL) -> float:
    """lam with ``events * 2 exp(-lam^2 (1-u32)^2 / 2) <= p_fail`` (union bound)."""
    return math.sqrt(2.0 * math.log(2.0 * max(events, 1) / p_fail)) / (1.0 - U32)


def gamma_tilde(n: int, u: float, lam: float) -> float:
    """Higham & Mary's probabilistic gamma~_n(lam) = exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1."""
    return math.expm1(lam * math.sqrt(max(n, 0)) * u + n * u * u / (1.0 - u))


def acc_gamma(d: int, events: int) -> tuple[float, str]:
    """The smaller of the worst-case gamma_d(u32) and the probabilistic gamma~_d(lam), and its name."""
    lam = lam_for(events)
    g_w, g_p = gamma(d, U32), gamma_tilde(d, U32, lam)
    return (g_w, f"gamma_{d}(u32)") if g_w <= g_p else (g_p, f"gamma~_{d}(u32, lam={lam:.2f})")


def rounded(y: torch.Tensor, kappa: torch.Tensor, dtype: torch.dtype, r: int = 1) -> torch.Tensor:
    """Bound after r roundings to ``dtype`` of a value within ``kappa`` of ``y``."""
    fmt = FORMATS[dtype]
    return r * fmt.u * y.abs() + (1.0 + fmt.u) ** r * kappa + r * fmt.min_subnormal / 2


def threshold(b: torch.Tensor, golden: torch.Tensor) -> float:
    """``||b|| / ||golden||``: the normwise bound implied by the componentwise one."""
    den = float(torch.linalg.vector_norm(golden.double()))
    return float(torch.linalg.vector_norm(b.double())) / den if den > 0 else math.inf


def _abs_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x.double().abs().sum(dim)


# ---------------------------------------------------------------- sums

def sum_bound(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype, mean: bool = False):
    """sum / mean over the last dim: fp32 accumulation in any order, then the result rounded.

    Mean adds two fp32 roundings (``1/n`` and the product, or one division) and may round twice
    to the dtype (the CPU rounds the sum, then the quotient).
    """
    n = x.shape[-1]
    d = n + 1 if mean else n - 1
    g, gname = acc_gamma(d, y.numel() * n)
    a = _abs_sum(x) / (n if mean else 1)
    r = 2 if mean and dtype != torch.float32 else 1
    how = (f"any order with fp32 accumulators: b = {r}u|y| + (1+u)^{r} {gname} sum|x|{'/n' if mean else ''}; "
           f"{r} rounding{'s' if r > 1 else ''} to the dtype")
    return rounded(y, g * a, dtype, r), how


def matmul_bound(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """``a @ b`` (K terms per output) with fp32 accumulators in any order, then the result rounded.

    A product of two bf16/fp16 numbers (8/11-bit significands) has at most 22 bits and is exact in
    fp32, except below fp32's normal range, where it errs by at most ``eta32/2``; an fp32 product
    rounds once, which ``gamma_K`` (one more than the K - 1 additions) covers. So
    ``|c - y| <= u|y| + (1+u)(gamma_K(u32) A + K eta32/2)``, ``A = |a| |b|``.
    """
    k = a.shape[-1]
    g, gname = acc_gamma(k, y.numel() * k)
    big_a = a.double().abs() @ b.double().abs()
    eta32 = FORMATS[torch.float32].min_subnormal
    return rounded(y, g * big_a + k * eta32 / 2, dtype), (
        f"any order with fp32 accumulators: b = u|y| + (1+u)({gname} |a||b| + K eta32/2), K = {k}; products of "
        "bf16/fp16 are exact in fp32")


def scan_depth_cuda(rows: int, n: int) -> tuple[int, int]:
    """(block B, rounding depth d) of CUDA's innermost-dim scan (ATen ScanUtils.cuh).

    ``tensor_kernel_scan_innermost_dim`` scans blocks of ``B = 2 * num_threads_x`` elements with a
    Sklansky network (log2 B levels, one rounding each) after adding the previous block's total
    to the block's first element (one rounding). A term therefore passes through at most
    log2 B + 1 roundings per block it crosses: ``d = ceil(n / B) * (log2 B + 1)``.
    ``num_threads_x`` follows ``get_log_num_threads_x_inner_scan`` (uint32 arithmetic included).
    """
    lx = max(0, math.ceil(math.log2(max(n, 1))))
    ly = max(0, math.ceil(math.log2(max(rows, 1))))
    lx = (((9 + lx - ly) & 0xFFFFFFFF) // 2)
    lx = min(max(4, lx), 9)
    block = 2 << lx
    return block, math.ceil(n / block) * (lx + 2)


def cumsum_bound(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """Inclusive cumsum along the last dim, for either legal family of kernels.

    (a) fp32 partial sums in any order (the CPU: sequential), one rounding per output:
        ``u|y_i| + (1+u) g32 A_i``. (b) partial sums rounded to the dtype at every combine, as
        CUDA's kernel does (``std::plus<scalar_t>`` on BFloat16/Half), with per-term depth at most
        d, the depth of CUDA's blocked Sklansky scan for this shape: ``gamma_d(u) A_i`` (worst case;
        d is small and bf16 rounding too coarse for the probabilistic model). b = max of the two.

    Not covered: CUDA's scan along an outer dim keeps one running sum in the dtype (depth n), for
    which no bound below 1 exists in bf16 at n = 1024; the sweep scans the last dim only.
    """
    rows, n = math.prod(x.shape[:-1]), x.shape[-1]
    if rows < 2:
        raise ValueError("cumsum_bound: one row goes to cub's scan, whose depth is not bounded here; use >= 2 rows")
    a = x.double().abs().cumsum(-1)
    g32, gname = acc_gamma(n - 1, y.numel() * n)
    fam_a = rounded(y, g32 * a, dtype)
    fp32 = f"u|y| + (1+u) {gname} A [fp32 partials, any order]"
    if dtype == torch.float32:  # the dtype is the accumulator: (a) covers every order
        return fam_a, f"b = {fp32}; A_i = sum_{{j<=i}} |x_j|"
    block, d = scan_depth_cuda(rows, n)
    fam_b = gamma(d, FORMATS[dtype].u) * a
    return torch.maximum(fam_a, fam_b), (
        f"b = max({fp32}, gamma_{d}(u) A [partials in the dtype, per-term depth <= {d} = ceil({n}/{block})"
        f"*(log2 {block}+1): CUDA's blocked Sklansky scan]); A_i = sum_{{j<=i}} |x_j|")


def embedding_bag_bound(w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor, y: torch.Tensor,
                        dtype: torch.dtype, mean: bool):
    """Bags of gathered rows summed with fp32 accumulators in any order (mean: 2 more roundings)."""
    ends = torch.cat([off[1:], torch.tensor([idx.numel()])])
    a = torch.stack([w.double()[idx[s:e]].abs().sum(0) for s, e in zip(off.tolist(), ends.tolist())])
    sizes = (ends - off).double().clamp(min=1).unsqueeze(-1)
    s = int((ends - off).max())
    g, gname = acc_gamma(s + 1 if mean else max(s - 1, 0), y.numel() * s)
    a = a / sizes if mean else a
    how = f"fp32 accumulation in any order: b = u|y| + (1+u) {gname} sum|w_j|{'/bag' if mean else ''} (bag <= {s})"
    return rounded(y, g * a, dtype), how


# ---------------------------------------------------------------- softmax family

def _softmax_parts(x: torch.Tensor):
    """(t = x - max, S = sum exp t, relative error bound rho_S of S, description) along the last dim.

    Each term exp(t_j) errs by ``rho_j = 2|t_j| u32 + E_LIB`` (the subtraction and a possible
    scaling of the argument, one rounding each, then exp); the positive terms are summed in any
    order (``g32``); an online kernel rescales a partial sum at most ceil(log2 n) times (tree merge
    of per-thread partials), each rescale erring by ``E_LIB + 2 R u32 + u32`` with R the row's range.
    """
    x = x.double()
    n = x.shape[-1]
    t = x - x.amax(-1, keepdim=True)
    s = torch.exp(t).sum(-1, keepdim=True)
    rng = (-t).amax(-1, keepdim=True)
    g32, gname = acc_gamma(n - 1, x.numel())
    merges = math.ceil(math.log2(max(n, 2)))
    rho_s = (2 * rng * U32 + E_LIB) + g32 + merges * (E_LIB + 2 * rng * U32 + U32)
    how = (f"rho_S = max_j(2|t_j|u32 + E) + {gname} + {merges}(E + 2 R u32 + u32), E = {LIB_ULPS:g}-ulp exp/log "
           f"= {E_LIB:.3g}, t = x - max, R = max|t| (two-pass or tree-merged online kernels)")
    return t, s, rho_s, how


def softmax_bound(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """y = exp(t) / S: relative error rho_t + rho_S + 2 u32 (division, or reciprocal and product)."""
    t, _, rho_s, how = _softmax_parts(x)
    kappa = y.double().abs() * (2 * t.abs() * U32 + E_LIB + rho_s + 2 * U32)
    return rounded(y, kappa, dtype), f"b = u|y| + (1+u)|y|(2|t|u32 + E + rho_S + 2u32); {how}"


def log_softmax_bound(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """y = t - log S: absolute error u32(|t| + |max| + |log S| + |y|) + rho_S + E |log S|."""
    t, s, rho_s, how = _softmax_parts(x)
    m = x.double().amax(-1, keepdim=True)
    log_s = torch.log(s)
    kappa = U32 * (t.abs() + m.abs() + log_s.abs() + y.double().abs()) + rho_s * (1 + rho_s) + E_LIB * log_s.abs()
    return rounded(y, kappa, dtype), f"b = u|y| + (1+u)(u32(|t|+|max|+|log S|+|y|) + rho_S + E|log S|); {how}"


def cross_entropy_bound(x: torch.Tensor, target: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """mean_r(-log_softmax(x_r)[t_r]): log-probabilities possibly rounded to the dtype (the CPU's
    ``_log_softmax`` + ``nll_loss``), then T terms summed in fp32 in any order, divided, rounded."""
    ls = torch.log_softmax(x.double(), -1)
    picked = ls.gather(-1, target.view(-1, 1)).squeeze(-1)
    b_ls, how_ls = log_softmax_bound(x, ls, dtype)
    b_pick = b_ls.gather(-1, target.view(-1, 1)).squeeze(-1)
    rows = picked.numel()
    g, gname = acc_gamma(rows + 1, rows)
    kappa = b_pick.mean() + g * picked.abs().mean()
    return (rounded(y, kappa.reshape(y.shape), dtype),
            f"b = u|L| + (1+u)(mean_r b_logsoftmax,r + {gname} mean|log p|), b_logsoftmax with its own rounding "
            f"to the dtype; {how_ls}")


# ---------------------------------------------------------------- normalisations

def _rel_var(x: torch.Tensor, events: int):
    """Relative error bound of a row variance from fp32 accumulators: 3 g32 (1 + mu^2/sigma^2).

    Covers the two-pass ((n+3)u), the updating/Welford (~n u kappa) and the textbook one-pass
    (~n u kappa^2) algorithms of Chan, Golub & LeVeque (1983), kappa^2 = 1 + mu^2/sigma^2, with the
    factor 3 for the cancellation of E[x^2] - mu^2 and the combine of partial moments.
    """
    n = x.shape[-1]
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    g, gname = acc_gamma(n + 2, events)
    return mu, var, 3 * g * (1 + mu * mu / var.clamp(min=1e-300)), gname


def layer_norm_bound(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, y: torch.Tensor, dtype: torch.dtype,
                     eps: float):
    """y = (x - mu) r w + b, r = 1/sqrt(var + eps), every step in fp32 (mean, variance in any order).

    |mu^ - mu| <= g32 mean|x|; r relative rho_r = rho_var/2 + u32 + E (rsqrt); the affine part costs
    3 u32 and, for kernels that fold it into x (r w) + (b - mu r w), u32 (|x| + |mu|) r |w| + u32|b|.
    """
    x = x.double()
    n = x.shape[-1]
    mu, var, rho_var, gname = _rel_var(x, x.numel())
    g_mu, _ = acc_gamma(n, x.numel())
    r = 1.0 / torch.sqrt(var + eps)
    rho_r = rho_var / 2 + U32 + E_LIB
    e_mu = g_mu * x.abs().mean(-1, keepdim=True)
    d = x - mu
    kappa = (r * w.double().abs() * (e_mu + (d.abs() + x.abs() + mu.abs()) * (rho_r + 3 * U32))
             + U32 * (y.double().abs() + bias.double().abs()))
    return rounded(y, kappa, dtype), (f"b = u|y| + (1+u)(r|w|(e_mu + (|x-mu|+|x|+|mu|)(rho_r + 3u32)) + u32(|y|+|b|)); "
                                      f"rho_var = 3 {gname}(1 + mu^2/var), rho_r = rho_var/2 + u32 + E")


def rms_norm_bound(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """y = x r w, r = rsqrt(mean(x^2) + eps): the mean of positive terms errs by g32 + u32 (squares)."""
    n = x.shape[-1]
    g, gname = acc_gamma(n + 1, x.numel())
    rho_r = (g + U32) / 2 + U32 + E_LIB
    kappa = y.double().abs() * (rho_r + 2 * U32)
    return rounded(y, kappa, dtype), f"b = u|y| + (1+u)|y|(({gname} + u32)/2 + u32 + E + 2u32)"
