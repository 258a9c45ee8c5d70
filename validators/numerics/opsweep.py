"""Group ``op_sweep``: every operator of the sweep on the device, judged against an fp64 golden.

For each case and dtype (bf16, fp16, fp32): inputs are drawn in fp32 on the CPU from the run seed
and rounded to the dtype; the golden is the same operator in fp64 on the CPU from those rounded
inputs (outside ``target.active()``); the device runs the operator on the rounded inputs inside it.

Bounds (all stated in the rows' ``threshold``, their derivation in the ``detail``):

* Reductions (sum, mean, cumsum, softmax, log_softmax, layer_norm, rms_norm, cross_entropy,
  embedding_bag): ``normwise_error`` = ||out - golden|| / ||golden|| must be at most ||b|| / ||golden||,
  where b is a componentwise bound derived in :mod:`.bounds` that holds for ANY summation order the
  device may use (sequential, blocked, tree, split over threads and blocks; partial sums kept in
  fp32, or, where a real kernel does so, rounded to the dtype at every combine as CUDA's scan
  does), plus the final rounding(s) to the dtype. fp32 accumulation uses Higham & Mary's
  probabilistic gamma~ (a healthy device fails a row with probability at most 1e-6 under their
  model) or the worst-case gamma where that is smaller.
* Other ops: ``normwise_error`` must be at most ``2 * max(ideal, reference) + 4 * u32 * sqrt(n)``
  (n: the op's reduction length, 1 for elementwise ops), where ``ideal`` is the error of the golden
  rounded once to the dtype (for outputs of fewer than 64 values at least the dtype's unit roundoff
  ``u``), and ``reference`` is the error of a plain reference implementation where the op's
  standard algorithm rounds more than once: GEMMs and convolutions accumulate sequentially in fp32
  (the worst common order), and attention rounds the score and probability matrices to the dtype
  before the next product (as flash-style kernels do).
* GEMMs (mm, bmm, addmm, linear, baddbmm, conv2d): ``componentwise_error`` =
  max_ij |C - C_ref|_ij / (|A||B|)_ij (plus |beta||M| for the added term) must be at most
  ``2 * (u_out + gamma_K(u32))``: the standard bound of an fp32-accumulating GEMM with one output
  rounding, doubled, which also admits a split-K GEMM whose partial sums are rounded to the output
  dtype once before the final reduction; a GEMM accumulating in bf16/fp16 exceeds it. Where the
  device type under test (``target.device_type``: the emulated one when emulating) is CUDA and its
  flags allow TF32 for fp32 GEMMs (``torch.backends.cuda.matmul.allow_tf32`` or a matmul precision
  other than ``highest``) or convolutions (``torch.backends.cudnn.allow_tf32``, on by default),
  the reference reads only the first 10 mantissa bits of its inputs (truncation: the worse of the
  legal TF32 conversions, as PyTorch's numerical-accuracy note describes the tensor cores) and the
  componentwise bound adds ``2 * u_tf32`` (a truncated input errs by less than ``2 u_tf32``); the
  row's detail says "tf32 allowed".
* Elementwise ops (exp, log, rsqrt, gelu erf/tanh, silu): ``max_ulp_error`` must be at most 1 ulp
  for bf16/fp16 (twice the 0.5 ulp of a correctly rounded result; an fp32 evaluation rounded once
  stays within it) and at most the per-op fp32 bound of ``FP32_ULP_BOUNDS``. bf16/fp16 inputs are
  exhaustive: every finite number of the dtype in the op's domain. gelu's error is measured in ulps
  of max(|y|, |x|) because the erf/tanh formulation cancels for negative x (the gate's absolute
  error, scaled by x). Results below the dtype's normal range are left to the ``subnormals`` check.
* SDPA backends: a backend that has no kernel for the inputs (asked first: on CUDA through
  ``torch.backends.cuda.can_use_*``; under an emulated CUDA through
  :func:`mystique.emulation.attention.refusal`; elsewhere recognised from SDPA's own "no kernel"
  refusal) gives a ``skip`` row with torch's reason; any other exception is an ``error``.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mystique.errors import UsageError

from . import bounds as bd
from ._ctx import Ctx, shapes_of, unsupported
from ._fp import (
    FORMATS,
    SWEEP_DTYPES,
    U32,
    U_TF32,
    componentwise_error,
    dtype_name,
    gamma,
    normwise_error,
    truncate_to_tf32,
    ulp_error,
)

SLACK_U32 = 4.0
SMALL_OUTPUT = 64
# fp32 max-ulp bounds: about twice the worst error a healthy x86 CPU (SLEEF/ATen vectorised kernels)
# shows over 32M sampled inputs (exp 0.57, log 0.54, rsqrt 1.49, gelu 5.4, gelu_tanh 1.55, silu 2.4),
# and never below the 2 ulp that CUDA's libdevice documents for expf/rsqrtf.
FP32_ULP_BOUNDS = {"exp": 2.0, "log": 2.0, "rsqrt": 3.0, "silu": 5.0, "gelu": 12.0, "gelu_tanh": 4.0}

Inputs = dict[str, torch.Tensor]


@dataclass
class Case:
    """One operator on one input recipe.

    ``make(g, dtype)`` returns fp32/int inputs; ``fn(**inputs)`` runs the op on any device/dtype;
    ``scale(**fp64 inputs)`` gives |A||B| for GEMMs; ``ref(inputs_in_dtype, dtype, tf32)`` the
    reference implementation's output; ``ulp_scale(inputs64, golden)`` the elementwise ulp scale;
    ``bound(inputs64, golden, dtype)`` a derived componentwise error bound and its derivation
    (:mod:`.bounds`), which replaces the reference-based normwise bound.
    """

    op: str
    variant: str
    kind: str  # gemm | elementwise | other
    make: Callable[[torch.Generator, torch.dtype], Inputs]
    fn: Callable[..., torch.Tensor]
    k: int = 0
    scale: Callable[..., torch.Tensor] | None = None
    ref: Callable[[Inputs, torch.dtype, bool], torch.Tensor] | None = None
    ulp_scale: Callable[[Inputs, torch.Tensor], torch.Tensor] | None = None
    bound: Callable[[Inputs, torch.Tensor, torch.dtype], tuple[torch.Tensor, str]] | None = None
    dtypes: tuple[torch.dtype, ...] = SWEEP_DTYPES
    backend: Any = None
    tf32_flag: str = ""  # "matmul" or "conv"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return f"{self.op}/{self.variant}"


# ---------------------------------------------------------------- shapes of the reference workloads

_DEFAULT_DIMS = {
    "llama": {"hidden": 256, "ffn": 704, "heads": 8, "head_dim": 32},
    "bert": {"hidden": 256, "ffn": 1024, "heads": 4, "head_dim": 64},
    "dlrm": {"emb": 64, "mlp": (512, 256, 64), "top": (512, 256)},
}


def workload_dims() -> dict[str, dict[str, Any]]:
    """Dims of the reference workloads' ``small`` configs, from ``mystique.workloads`` when present.

    Falls back to the table ``_DEFAULT_DIMS`` (the same sizes) when the workloads cannot be read.
    """
    dims = {k: dict(v) for k, v in _DEFAULT_DIMS.items()}
    try:
        from mystique.workloads import get

        c = get("llama").CONFIGS["small"]
        dims["llama"] = {"hidden": int(c.dim), "ffn": int(c.hidden_dim), "heads": int(c.n_heads),
                         "head_dim": int(c.head_dim)}
        c = get("bert").CONFIGS["small"]
        dims["bert"] = {"hidden": int(c.dim), "ffn": int(c.intermediate_dim), "heads": int(c.n_heads),
                        "head_dim": int(c.dim) // int(c.n_heads)}
        c = get("dlrm").CONFIGS["small"]
        dims["dlrm"] = {"emb": int(c.embedding_dim), "mlp": tuple(int(w) for w in c.bottom_mlp),
                        "top": tuple(int(w) for w in c.top_mlp[:-1])}
    except Exception:  # noqa: BLE001  (workloads absent or changed: the table above stands in)
        pass
    return dims


# ---------------------------------------------------------------- input recipes

def _randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _uniform(g: torch.Generator, *shape: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    return torch.rand(*shape, generator=g) * (hi - lo) + lo


def _wide(g: torch.Generator, *shape: int, lo_exp: float = -8, hi_exp: float = 8) -> torch.Tensor:
    mag = torch.pow(2.0, _uniform(g, *shape, lo=lo_exp, hi=hi_exp))
    sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
    return mag * sign


def domain_values(dtype: torch.dtype, lo: float, hi: float, g: torch.Generator, n: int = 65536) -> torch.Tensor:
    """Every finite ``dtype`` number in [lo, hi] for 16-bit dtypes; ``n`` random fp32 values otherwise.

    The fp32 sample mixes uniform values and log-uniform magnitudes so every binade is visited.
    """
    if dtype in (torch.bfloat16, torch.float16):
        allv = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).float()
        keep = torch.isfinite(allv) & (allv >= lo) & (allv <= hi)
        return allv[keep]
    half = n // 2
    uni = _uniform(g, half, lo=lo, hi=hi)
    lo_mag = max(abs(lo), abs(hi)) * 2.0 ** -40 if lo <= 0 <= hi else min(abs(lo), abs(hi))
    hi_mag = max(abs(lo), abs(hi))
    mag = torch.exp(_uniform(g, n - half, lo=math.log(max(lo_mag, 1e-30)), hi=math.log(hi_mag)))
    sign = torch.where(torch.rand(n - half, generator=g) < 0.5, -1.0, 1.0) if lo < 0 else torch.ones(n - half)
    vals = torch.cat([uni, mag * sign])
    return vals[(vals >= lo) & (vals <= hi)]


# ---------------------------------------------------------------- reference implementations

def seq_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32 accumulating sequentially over K (one rounding per product and per add)."""
    a = a.float()
    b = b.float()
    out = torch.zeros_like(a[..., :, :1] * b[..., :1, :])
    for k in range(a.shape[-1]):
        out += a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return out


def _in32(t: torch.Tensor, tf32: bool) -> torch.Tensor:
    """fp32 operand of a reference GEMM; with TF32 allowed, only its first 10 mantissa bits."""
    t = t.float()
    return truncate_to_tf32(t) if tf32 else t


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, causal: bool) -> torch.Tensor:
    """Attention in fp32 with the score and probability matrices rounded to ``dtype`` (standard algorithm)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q.float() @ k.float().transpose(-1, -2) * scale).to(dtype).float()
    if causal:
        n, m = s.shape[-2:]
        mask = torch.ones(n, m, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).to(dtype).float()
    return (p @ v.float()).to(dtype)


# ---------------------------------------------------------------- the cases

def _gemm_cases(dims: dict[str, Any], full: bool, extra_shapes: list[tuple[int, int, int]]) -> list[Case]:
    ll, bt = dims["llama"], dims["bert"]
    T = 128 if full else 32
    mm_shapes: list[tuple[str, int, int, int, str]] = [
        ("llama_q_proj", T, ll["hidden"], ll["hidden"], "normal"),
        ("llama_ffn_down", T, ll["ffn"], ll["hidden"], "normal"),
        ("bert_ffn_up", T, bt["hidden"], bt["ffn"], "normal"),
        ("positive_k1024", 32, 1024, 32, "positive"),
        ("wide_range", 32, 256, 32, "wide"),
        ("near_fp16_overflow", 16, 256, 16, "overflow"),
    ]
    if full:
        mm_shapes += [("long_k8192", 64, 8192, 64, "normal"), ("positive_long_k8192", 32, 8192, 32, "positive"),
                      ("long_k16384", 32, 16384, 32, "normal"), ("dlrm_top", 512, dims["dlrm"]["top"][0],
                                                                 dims["dlrm"]["top"][1], "normal")]
    mm_shapes += [(f"benchmark_{i}", m, k, n, "normal") for i, (m, k, n) in enumerate(extra_shapes)]
    cases = []
    for variant, m, k, n, dist in mm_shapes:
        cases.append(Case("mm", variant, "gemm", _mm_make(m, k, n, dist), lambda a, b: torch.mm(a, b), k=k,
                          scale=lambda a, b: a.abs() @ b.abs(),
                          ref=lambda x, dt, tf: seq_matmul(_in32(x["a"], tf), _in32(x["b"], tf)).to(dt),
                          tf32_flag="matmul", extra={"shape": f"{m}x{k}x{n}", "dist": dist}))
    h, hd, nh = ll["hidden"], ll["head_dim"], ll["heads"]
    cases.append(Case(
        "bmm", "llama_attn_scores", "gemm",
        lambda g, dt: {"a": _randn(g, nh, T, hd), "b": _randn(g, nh, hd, T)},
        lambda a, b: torch.bmm(a, b), k=hd, scale=lambda a, b: torch.bmm(a.abs(), b.abs()),
        ref=lambda x, dt, tf: seq_matmul(_in32(x["a"], tf), _in32(x["b"], tf)).to(dt), tf32_flag="matmul"))
    cases.append(Case(
        "addmm", "llama_q_proj_bias", "gemm",
        lambda g, dt: {"c": _randn(g, h), "a": _randn(g, T, h), "b": _randn(g, h, h, scale=h ** -0.5)},
        lambda c, a, b: torch.addmm(c, a, b), k=h + 1, scale=lambda c, a, b: c.abs() + a.abs() @ b.abs(),
        ref=lambda x, dt, tf: (x["c"].float() + seq_matmul(_in32(x["a"], tf), _in32(x["b"], tf))).to(dt),
        tf32_flag="matmul"))
    ffn = bt["ffn"]
    cases.append(Case(
        "linear", "bert_ffn_up", "gemm",
        lambda g, dt: {"x": _randn(g, 2, T // 2, bt["hidden"]), "w": _randn(g, ffn, bt["hidden"], scale=0.05),
                       "b": _randn(g, ffn, scale=0.1)},
        lambda x, w, b: F.linear(x, w, b), k=bt["hidden"] + 1,
        scale=lambda x, w, b: x.abs() @ w.abs().t() + b.abs(),
        ref=lambda x, dt, tf: (seq_matmul(_in32(x["x"], tf), _in32(x["w"], tf).t()) + x["b"].float()).to(dt),
        tf32_flag="matmul"))
    cases.append(Case(
        "baddbmm", "bert_attn_scores", "gemm",
        lambda g, dt: {"c": _randn(g, bt["heads"], T, T), "a": _randn(g, bt["heads"], T, bt["head_dim"]),
                       "b": _randn(g, bt["heads"], bt["head_dim"], T)},
        lambda c, a, b: torch.baddbmm(c, a, b, beta=1.0, alpha=0.125), k=bt["head_dim"] + 1,
        scale=lambda c, a, b: c.abs() + 0.125 * torch.bmm(a.abs(), b.abs()),
        ref=lambda x, dt, tf: (x["c"].float() + 0.125 * seq_matmul(_in32(x["a"], tf), _in32(x["b"], tf))).to(dt),
        tf32_flag="matmul"))
    cin, cout, hw = (32, 64, 16) if full else (16, 32, 8)
    cases.append(Case(
        "conv2d", f"3x3_c{cin}_c{cout}", "gemm",
        lambda g, dt: {"x": _randn(g, 2, cin, hw, hw), "w": _randn(g, cout, cin, 3, 3, scale=(cin * 9) ** -0.5),
                       "b": _randn(g, cout, scale=0.1)},
        lambda x, w, b: F.conv2d(x, w, b, padding=1), k=cin * 9 + 1,
        scale=lambda x, w, b: F.conv2d(x.abs(), w.abs(), b.abs(), padding=1),
        ref=lambda x, dt, tf: _conv_ref(x, dt, tf), tf32_flag="conv"))
    return cases


def _conv_ref(x: Inputs, dtype: torch.dtype, tf32: bool) -> torch.Tensor:
    inp, w, b = _in32(x["x"], tf32), _in32(x["w"], tf32), x["b"].float()
    n, _, hgt, wid = inp.shape
    cols = F.unfold(inp, 3, padding=1)  # (N, C*9, L)
    out = seq_matmul(w.reshape(w.shape[0], -1).unsqueeze(0), cols) + b[None, :, None]
    return out.reshape(n, w.shape[0], hgt, wid).to(dtype)


def _mm_make(m: int, k: int, n: int, dist: str) -> Callable[[torch.Generator, torch.dtype], Inputs]:
    def make(g: torch.Generator, dtype: torch.dtype) -> Inputs:
        if dist == "positive":
            return {"a": _uniform(g, m, k), "b": _uniform(g, k, n)}
        if dist == "wide":  # magnitudes 2^-6..2^6 (2^-4..2^4 in fp16, whose outputs would overflow)
            e = 4 if dtype == torch.float16 else 6
            return {"a": _wide(g, m, k, lo_exp=-e, hi_exp=e), "b": _wide(g, k, n, lo_exp=-e, hi_exp=e)}
        if dist == "overflow":  # entries in [0.5, 1] * s with K s^2 = 60000: outputs in [15000, 60000]
            s = math.sqrt(60000.0 / k)
            return {"a": _uniform(g, m, k, lo=0.5, hi=1.0) * s, "b": _uniform(g, k, n, lo=0.5, hi=1.0) * s}
        return {"a": _randn(g, m, k), "b": _randn(g, k, n, scale=k ** -0.5)}

    return make


def _elementwise_cases() -> list[Case]:
    def ew(op: str, fn: Callable[[torch.Tensor], torch.Tensor], domain: Callable[[torch.dtype], tuple[float, float]],
           ulp_scale: Callable[[Inputs, torch.Tensor], torch.Tensor] | None = None) -> Case:
        return Case(op, "domain", "elementwise",
                    lambda g, dt: {"x": domain_values(dt, *domain(dt), g)}, fn, ulp_scale=ulp_scale)

    def tiny(dt: torch.dtype) -> float:
        return FORMATS[dt].tiny

    def maxv(dt: torch.dtype) -> float:
        return FORMATS[dt].max

    gate = lambda x, y: torch.maximum(y.abs(), x["x"].abs())  # noqa: E731
    return [
        ew("exp", torch.exp, lambda dt: (-16.0, 11.0) if dt == torch.float16 else (-87.0, 88.0)),
        ew("log", torch.log, lambda dt: (tiny(dt), maxv(dt))),
        ew("rsqrt", torch.rsqrt, lambda dt: (tiny(dt), maxv(dt))),
        ew("gelu", lambda x: F.gelu(x), lambda dt: (-20.0, 20.0), gate),
        ew("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda dt: (-20.0, 20.0), gate),
        ew("silu", lambda x: F.silu(x), lambda dt: (-20.0, 20.0)),
    ]


def _other_cases(dims: dict[str, Any], full: bool, backends: list[Any]) -> list[Case]:
    ll, bt, dl = dims["llama"], dims["bert"], dims["dlrm"]
    T = 128 if full else 64
    vocab = 32000 if full else 1024
    n_red = 65536 if full else 4096
    def eb_make(g: torch.Generator, dt: torch.dtype) -> Inputs:
        return {"w": _randn(g, 1000, dl["emb"]), "idx": torch.randint(0, 1000, (256,), generator=g),
                "off": torch.arange(0, 256, 8)}

    cases = [
        Case("softmax", f"rows_{vocab}", "other", lambda g, dt: {"x": _randn(g, T, vocab, scale=3.0)},
             lambda x: torch.softmax(x, -1), k=vocab, bound=lambda x, y, dt: bd.softmax_bound(x["x"], y, dt)),
        Case("log_softmax", f"rows_{vocab}", "other", lambda g, dt: {"x": _randn(g, T, vocab, scale=3.0)},
             lambda x: torch.log_softmax(x, -1), k=vocab,
             bound=lambda x, y, dt: bd.log_softmax_bound(x["x"], y, dt)),
        Case("layer_norm", "bert_hidden", "other",
             lambda g, dt: {"x": _randn(g, T, bt["hidden"], scale=2.0) + 1.0, "w": 1 + _randn(g, bt["hidden"], scale=0.1),
                            "b": _randn(g, bt["hidden"], scale=0.1)},
             lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), k=bt["hidden"],
             bound=lambda x, y, dt: bd.layer_norm_bound(x["x"], x["w"], x["b"], y, dt, 1e-5)),
        Case("rms_norm", "llama_hidden", "other",
             lambda g, dt: {"x": _randn(g, T, ll["hidden"], scale=2.0), "w": 1 + _randn(g, ll["hidden"], scale=0.1)},
             lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), k=ll["hidden"],
             bound=lambda x, y, dt: bd.rms_norm_bound(x["x"], x["w"], y, dt)),
        Case("sum", f"rows_{n_red}", "other", lambda g, dt: {"x": _uniform(g, 16, n_red, lo=-0.5, hi=1.0)},
             lambda x: x.sum(-1), k=n_red, bound=lambda x, y, dt: bd.sum_bound(x["x"], y, dt)),
        Case("mean", f"rows_{n_red}", "other", lambda g, dt: {"x": _uniform(g, 16, n_red, lo=-0.5, hi=1.0)},
             lambda x: x.mean(-1), k=n_red, bound=lambda x, y, dt: bd.sum_bound(x["x"], y, dt, mean=True)),
        Case("cumsum", "rows_1024", "other", lambda g, dt: {"x": _uniform(g, 16, 1024, lo=-0.5, hi=1.0)},
             lambda x: torch.cumsum(x, -1), k=1024, bound=lambda x, y, dt: bd.cumsum_bound(x["x"], y, dt)),
        Case("embedding_bag", "dlrm_sum", "other", eb_make,
             lambda w, idx, off: F.embedding_bag(idx, w, off, mode="sum"), k=8,
             bound=lambda x, y, dt: bd.embedding_bag_bound(x["w"], x["idx"], x["off"], y, dt, mean=False)),
        Case("embedding_bag", "dlrm_mean", "other", eb_make,
             lambda w, idx, off: F.embedding_bag(idx, w, off, mode="mean"), k=8,
             bound=lambda x, y, dt: bd.embedding_bag_bound(x["w"], x["idx"], x["off"], y, dt, mean=True)),
        Case("cross_entropy", f"vocab_{vocab}", "other",
             lambda g, dt: {"x": _randn(g, T, vocab, scale=2.0), "t": torch.randint(0, vocab, (T,), generator=g)},
             lambda x, t: F.cross_entropy(x, t), k=vocab * T,
             bound=lambda x, y, dt: bd.cross_entropy_bound(x["x"], x["t"], y, dt)),
    ]
    seq = 256 if full else 64
    for be in backends:
        for causal in (False, True):
            nh, hd = ll["heads"], ll["head_dim"]
            cases.append(Case(
                "scaled_dot_product_attention", f"{be.name.lower()}_{'causal' if causal else 'full'}_s{seq}", "other",
                lambda g, dt, nh=nh, hd=hd: {"q": _randn(g, 2, nh, seq, hd), "k": _randn(g, 2, nh, seq, hd),
                                             "v": _randn(g, 2, nh, seq, hd)},
                lambda q, k, v, causal=causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                k=seq + ll["head_dim"],
                ref=lambda x, dt, tf, causal=causal: attention_ref(x["q"], x["k"], x["v"], dt, causal),
                backend=be, extra={"causal": causal}))
    return cases


def sdpa_backends(device: torch.device) -> list[Any]:
    """The SDPA backends worth trying on this device type (each may still refuse given inputs)."""
    from torch.nn.attention import SDPBackend

    if device.type == "cuda":
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                SDPBackend.MATH]
    if device.type == "cpu":
        return [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]
    return [SDPBackend.MATH]


def cases_for(ctx: Ctx) -> list[Case]:
    """The cases of this run (level, benchmark shapes, ``ops`` filter)."""
    extra = benchmark_gemm_shapes(ctx.options["benchmark"], ctx.full) if ctx.options.get("benchmark") else []
    dims = workload_dims()
    cases = (_gemm_cases(dims, ctx.full, extra) + _elementwise_cases()
             + _other_cases(dims, ctx.full, sdpa_backends(ctx.device)))
    wanted = ctx.options.get("ops")
    if wanted:
        known = {c.op for c in cases}
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise UsageError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cases = [c for c in cases if c.op in set(wanted)]
    return cases


def op_names() -> list[str]:
    """Names of the swept operators."""
    seen: dict[str, None] = {}
    from torch.nn.attention import SDPBackend

    for c in _gemm_cases(_DEFAULT_DIMS, False, []) + _elementwise_cases() + _other_cases(
            _DEFAULT_DIMS, False, [SDPBackend.MATH]):
        seen.setdefault(c.op)
    return list(seen)


# ---------------------------------------------------------------- benchmark shapes

_GEMM_NAMES = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "mm", "addmm", "bmm", "linear")


def benchmark_gemm_shapes(bench_dir: str | Path, full: bool, limit: int = 6) -> list[tuple[int, int, int]]:
    """(M, K, N) of the distinct 2-D GEMMs named in ``BENCH_DIR/benchmark.json`` (best effort).

    Walks the JSON for operator entries whose ``name``/``op`` is a GEMM and whose tensor
    arguments carry ``shape`` lists; batched shapes are folded into M. Sizes are capped (K at
    16384, M and N at 512 quick / 2048 full). Raises UsageError when the file is missing or is not JSON.
    """
    path = Path(bench_dir)
    path = path / "benchmark.json" if path.is_dir() else path
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"benchmark file {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a benchmark.json: {exc}") from exc
    cap = 2048 if full else 512
    found: list[tuple[int, int, int]] = []

    def shapes(node: Any) -> list[list[int]]:
        out: list[list[int]] = []
        if isinstance(node, dict):
            shp = node.get("shape", node.get("sizes"))
            if isinstance(shp, list) and all(isinstance(s, int) for s in shp) and len(shp) >= 2:
                out.append(shp)
            for key, val in node.items():
                if key not in ("shape", "sizes", "outputs", "output"):
                    out.extend(shapes(val))
        elif isinstance(node, list):
            for val in node:
                out.extend(shapes(val))
        return out

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = str(node.get("name", node.get("op", "")))
            base = name.split(".")[0]
            if base in _GEMM_NAMES:
                shp = shapes(node.get("inputs", node.get("args", [])))
                mkn = _mkn(base.replace("aten::", ""), shp)
                if mkn:
                    m, k, n = min(mkn[0], cap), min(mkn[1], 16384), min(mkn[2], cap)
                    if (m, k, n) not in found and min(m, k, n) > 0:
                        found.append((m, k, n))
            for val in node.values():
                walk(val)
        elif isinstance(node, list):
            for val in node:
                walk(val)

    walk(doc)
    return found[:limit]


def _mkn(op: str, shp: list[list[int]]) -> tuple[int, int, int] | None:
    mats = [s for s in shp if len(s) >= 2]
    if op == "addmm" and len(mats) >= 2:
        mats = mats[-2:]
    if op == "linear" and mats:
        x = mats[0]
        w = mats[1] if len(mats) > 1 else None
        if w is None or len(w) != 2:
            return None
        return math.prod(x[:-1]), x[-1], w[0]
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    if a[-1] != b[-2]:
        return None
    return math.prod(a[:-1]), a[-1], b[-1]


# ---------------------------------------------------------------- running

def _tf32(ctx: Ctx, case: Case, dtype: torch.dtype) -> bool:
    """Whether the device under test may compute this fp32 GEMM/convolution with TF32 inputs.

    Follows the device type the code behaves as (``target.device_type``: the emulated one when
    emulating) and CUDA's flags, read by the same functions the TF32 emulation obeys.
    """
    if dtype != torch.float32 or ctx.target.device_type != "cuda":
        return False
    from mystique.emulation.tf32 import conv_tf32_allowed, matmul_tf32_allowed

    if case.tf32_flag == "matmul":
        return matmul_tf32_allowed()
    if case.tf32_flag == "conv":
        return conv_tf32_allowed()
    return False


def run_op_sweep(ctx: Ctx) -> None:
    """Rows ``normwise_error``, ``componentwise_error`` (GEMMs) and ``max_ulp_error`` (elementwise)."""
    cases = cases_for(ctx)
    from mystique.progress import Progress

    total = sum(len([d for d in c.dtypes if d in ctx.dtypes]) for c in cases)
    progress = Progress("numerics op_sweep", total=total)
    for case in cases:
        for dtype in [d for d in case.dtypes if d in ctx.dtypes]:
            progress.step(f"{case.subject} {dtype_name(dtype)}")
            _run_case(ctx, case, dtype)


def _device_result(ctx: Ctx, case: Case, dtype: torch.dtype, dev: Inputs, repro: str) -> torch.Tensor | None:
    """The device's output on the CPU, or None after a ``skip``/``error`` row.

    An SDPA backend is first asked whether it has a kernel for these inputs
    (:func:`mystique.emulation.attention.refusal`); a backend that says no, or whose call ends in
    SDPA's own "no kernel" refusal, is a ``skip`` carrying torch's reason. Any other exception of
    an SDPA case is an ``error``; other cases skip only on "not implemented"-style errors.
    """
    from mystique.emulation import attention

    if case.backend is not None:
        reason = attention.refusal(case.backend, dev["q"], dev["k"], dev["v"], bool(case.extra.get("causal")),
                                   ctx.target.device_type)
        if reason:
            ctx.skip("normwise_error", case.subject, f"{case.backend.name} has no kernel on {ctx.target.label} "
                     f"for these inputs: {reason}", dtype=dtype, metric="rel_error")
            return None

    def device_call() -> torch.Tensor:
        if case.backend is None:
            return case.fn(**dev)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(case.backend):
            return case.fn(**dev)

    with contextlib.ExitStack() as stack:
        caught: list = []
        if case.backend is not None:  # torch states why a backend refused in UserWarnings
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
        try:
            return ctx.on_device(device_call).detach().cpu()
        except RuntimeError as exc:
            if case.backend is not None and attention.is_refusal(exc):
                reason = attention.reason_from_warnings(caught, case.backend) or str(exc).splitlines()[0][:160]
                ctx.skip("normwise_error", case.subject, f"{case.backend.name} has no kernel on {ctx.target.label} "
                         f"for these inputs: {reason}", dtype=dtype, metric="rel_error")
            elif case.backend is None and unsupported(exc):
                ctx.skip("normwise_error", case.subject, f"not supported on {ctx.target.device}: "
                         f"{str(exc).splitlines()[0][:160]}", dtype=dtype, metric="rel_error")
            else:
                ctx.error("normwise_error", case.subject, exc, dtype=dtype, repro=repro)
            return None


def _run_case(ctx: Ctx, case: Case, dtype: torch.dtype) -> None:
    salt = zlib.crc32(f"{case.subject}/{dtype_name(dtype)}".encode())
    raw = case.make(ctx.generator(salt), dtype)
    low = {k: v.to(dtype) if v.is_floating_point() else v for k, v in raw.items()}
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in low.items()}
    shapes = shapes_of(low.values())
    repro = ctx.repro(op=case.op, variant=case.variant, dtype=dtype_name(dtype), shapes=shapes)
    golden = case.fn(**x64)
    dev = {k: ctx.to_device(v) for k, v in low.items()}
    out = _device_result(ctx, case, dtype, dev, repro)
    if out is None:
        return
    if out.dtype != dtype or out.shape != golden.shape:
        ctx.fact("normwise_error", case.subject, "rel_error", math.inf, ok=False, dtype=dtype,
                 detail=f"device returned {out.dtype} {tuple(out.shape)}, expected {dtype} {tuple(golden.shape)}",
                 repro=repro)
        return
    fmt = FORMATS[dtype]
    tf32 = _tf32(ctx, case, dtype)
    err = normwise_error(out, golden)
    ideal = normwise_error(golden.to(dtype), golden)
    if case.bound is not None:
        b, derivation = case.bound(x64, golden, dtype)
        thr = bd.threshold(b, golden)
        how = f"bound ||b||/||y||, {derivation}; ideal (one rounding) {ideal:.3g}"
    else:
        if golden.numel() < SMALL_OUTPUT:
            ideal = max(ideal, fmt.u)
        ref_err = normwise_error(case.ref(low, dtype, tf32), golden) if case.ref is not None else 0.0
        n_red = max(case.k, 1)
        thr = 2.0 * max(ideal, ref_err) + SLACK_U32 * U32 * math.sqrt(n_red)
        how = f"bound 2*max(ideal {ideal:.3g}, reference {ref_err:.3g}) + {SLACK_U32:g}*u32*sqrt({n_red})"
    ctx.bound("normwise_error", case.subject, "rel_error", err, thr, dtype=dtype,
              detail=f"{shapes}; {how}" + ("; tf32 allowed" if tf32 else ""), repro=repro)
    if case.kind == "gemm":
        scale = case.scale(**x64)
        cw, idx = componentwise_error(out, golden, scale)
        u_acc_term = gamma(case.k, U32) + (2 * U_TF32 if tf32 else 0.0)
        thr_cw = 2.0 * (fmt.u + u_acc_term)
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), golden.shape)) if golden.numel() else ()
        ctx.bound("componentwise_error", case.subject, "max_err_over_abs_a_abs_b", cw, thr_cw, dtype=dtype,
                  detail=f"{shapes}; K={case.k}; bound 2*(u + gamma_K(u32)"
                  + (" + 2 u_tf32); tf32 allowed" if tf32 else ")"),
                  repro=f"{repro} worst_index={where}")
    elif case.kind == "elementwise":
        scale = case.ulp_scale(x64, golden) if case.ulp_scale is not None else None
        ulps = ulp_error(out, golden, dtype, scale)
        # results below the normal range are judged by the subnormals check, not in ulps here
        normal = (golden.abs() >= fmt.tiny) | (golden == 0) | ~torch.isfinite(golden)
        ulps = torch.where(normal, ulps, torch.zeros_like(ulps))
        worst = int(torch.argmax(torch.nan_to_num(ulps, nan=math.inf)))
        bound = FP32_ULP_BOUNDS.get(case.op, 2.0) if dtype == torch.float32 else 1.0
        x_worst = float(x64["x"].reshape(-1)[worst])
        ctx.bound("max_ulp_error", case.subject, "ulp", float(ulps.max()), bound, dtype=dtype, unit="ulp",
                  detail=f"{golden.numel()} inputs" + (" (every finite value in the domain)" if dtype != torch.float32
                                                        else "") + f"; {int((~normal).sum())} subnormal results "
                         "left to the subnormals check",
                  repro=f"{repro} worst_input={x_worst!r} got={float(out.reshape(-1)[worst])!r} "
                        f"golden={float(golden.reshape(-1)[worst])!r}")
