"""The operators of the numerics op sweep: one :class:`Case` per operator and input recipe.

A case says how to draw its inputs (in fp32 on the CPU from a seeded generator), how to run the
operator on any device and dtype, and what the sweep judges it by: ``scale`` (|A||B| of a GEMM),
``ref`` (a plain reference implementation whose error the bound admits), ``ulp_scale`` (elementwise
ops) or ``bound`` (a derived componentwise bound of :mod:`.bounds`). A new operator of the sweep is
one more :class:`Case` in :func:`gemm_cases`, :func:`elementwise_cases` or :func:`other_cases`;
:mod:`.opsweep` runs and judges them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from mystique.workloads import get as get_workload
from torch.nn.attention import SDPBackend

from mystique.emulation.tf32 import truncate_to_tf32

from ._fp import FORMATS, SWEEP_DTYPES
from .bounds import (
    cross_entropy_bound,
    cumsum_bound,
    embedding_bag_bound,
    layer_norm_bound,
    log_softmax_bound,
    rms_norm_bound,
    softmax_bound,
    sum_bound,
)

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
    """Dims of the reference workloads' ``small`` configs (``mystique.workloads``); the table
    ``_DEFAULT_DIMS`` holds the same sizes for :func:`op_names`, which needs no workload."""
    c = get_workload("llama").CONFIGS["small"]
    llama = {"hidden": int(c.dim), "ffn": int(c.hidden_dim), "heads": int(c.n_heads), "head_dim": int(c.head_dim)}
    c = get_workload("bert").CONFIGS["small"]
    bert = {"hidden": int(c.dim), "ffn": int(c.intermediate_dim), "heads": int(c.n_heads),
            "head_dim": int(c.dim) // int(c.n_heads)}
    c = get_workload("dlrm").CONFIGS["small"]
    dlrm = {"emb": int(c.embedding_dim), "mlp": tuple(int(w) for w in c.bottom_mlp),
            "top": tuple(int(w) for w in c.top_mlp[:-1])}
    return {"llama": llama, "bert": bert, "dlrm": dlrm}


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

def gemm_cases(dims: dict[str, Any], full: bool, extra_shapes: list[tuple[int, int, int]]) -> list[Case]:
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


def elementwise_cases() -> list[Case]:
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


def other_cases(dims: dict[str, Any], full: bool, backends: list[Any]) -> list[Case]:
    ll, bt, dl = dims["llama"], dims["bert"], dims["dlrm"]
    T = 128 if full else 64
    vocab = 32000 if full else 1024
    n_red = 65536 if full else 4096
    def eb_make(g: torch.Generator, dt: torch.dtype) -> Inputs:
        return {"w": _randn(g, 1000, dl["emb"]), "idx": torch.randint(0, 1000, (256,), generator=g),
                "off": torch.arange(0, 256, 8)}

    cases = [
        Case("softmax", f"rows_{vocab}", "other", lambda g, dt: {"x": _randn(g, T, vocab, scale=3.0)},
             lambda x: torch.softmax(x, -1), k=vocab, bound=lambda x, y, dt: softmax_bound(x["x"], y, dt)),
        Case("log_softmax", f"rows_{vocab}", "other", lambda g, dt: {"x": _randn(g, T, vocab, scale=3.0)},
             lambda x: torch.log_softmax(x, -1), k=vocab,
             bound=lambda x, y, dt: log_softmax_bound(x["x"], y, dt)),
        Case("layer_norm", "bert_hidden", "other",
             lambda g, dt: {"x": _randn(g, T, bt["hidden"], scale=2.0) + 1.0, "w": 1 + _randn(g, bt["hidden"], scale=0.1),
                            "b": _randn(g, bt["hidden"], scale=0.1)},
             lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), k=bt["hidden"],
             bound=lambda x, y, dt: layer_norm_bound(x["x"], x["w"], x["b"], y, dt, 1e-5)),
        Case("rms_norm", "llama_hidden", "other",
             lambda g, dt: {"x": _randn(g, T, ll["hidden"], scale=2.0), "w": 1 + _randn(g, ll["hidden"], scale=0.1)},
             lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), k=ll["hidden"],
             bound=lambda x, y, dt: rms_norm_bound(x["x"], x["w"], y, dt)),
        Case("sum", f"rows_{n_red}", "other", lambda g, dt: {"x": _uniform(g, 16, n_red, lo=-0.5, hi=1.0)},
             lambda x: x.sum(-1), k=n_red, bound=lambda x, y, dt: sum_bound(x["x"], y, dt)),
        Case("mean", f"rows_{n_red}", "other", lambda g, dt: {"x": _uniform(g, 16, n_red, lo=-0.5, hi=1.0)},
             lambda x: x.mean(-1), k=n_red, bound=lambda x, y, dt: sum_bound(x["x"], y, dt, mean=True)),
        Case("cumsum", "rows_1024", "other", lambda g, dt: {"x": _uniform(g, 16, 1024, lo=-0.5, hi=1.0)},
             lambda x: torch.cumsum(x, -1), k=1024, bound=lambda x, y, dt: cumsum_bound(x["x"], y, dt)),
        Case("embedding_bag", "dlrm_sum", "other", eb_make,
             lambda w, idx, off: F.embedding_bag(idx, w, off, mode="sum"), k=8,
             bound=lambda x, y, dt: embedding_bag_bound(x["w"], x["idx"], x["off"], y, dt, mean=False)),
        Case("embedding_bag", "dlrm_mean", "other", eb_make,
             lambda w, idx, off: F.embedding_bag(idx, w, off, mode="mean"), k=8,
             bound=lambda x, y, dt: embedding_bag_bound(x["w"], x["idx"], x["off"], y, dt, mean=True)),
        Case("cross_entropy", f"vocab_{vocab}", "other",
             lambda g, dt: {"x": _randn(g, T, vocab, scale=2.0), "t": torch.randint(0, vocab, (T,), generator=g)},
             lambda x, t: F.cross_entropy(x, t), k=vocab * T,
             bound=lambda x, y, dt: cross_entropy_bound(x["x"], x["t"], y, dt)),
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
    if device.type == "cuda":
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                SDPBackend.MATH]
    if device.type == "cpu":
        return [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]
    return [SDPBackend.MATH]


def op_names() -> list[str]:
    """Names of the swept operators."""
    seen: dict[str, None] = {}
    for c in gemm_cases(_DEFAULT_DIMS, False, []) + elementwise_cases() + other_cases(
            _DEFAULT_DIMS, False, [SDPBackend.MATH]):
        seen.setdefault(c.op)
    return list(seen)


