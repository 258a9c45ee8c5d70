"""Llama 3: a decoder-only transformer, written as Meta's reference, gpt-fast and torchtitan write it.

RMSNorm, rotary position embeddings (theta 500000, Meta's interleaved pair layout computed in real
arithmetic, no complex tensors), grouped-query attention through
``torch.nn.functional.scaled_dot_product_attention`` (causal), a SwiGLU MLP and an untied output
head. Published sizes follow Meta's ``params.json`` (vocab 128256, 8 KV heads, norm eps 1e-5, the
FFN width from ``ffn_dim_multiplier`` and ``multiple_of``).

The batch is ``tokens`` (B, S) and ``labels`` (B, S), the next token of each position; the loss is
the mean cross entropy of next-token prediction. Train with AdamW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import build_on_meta, cpu_generator, fill_, language_model_terms, upcast
from .packing import DocLengths, doc_ids, document_mask

NAME = "llama"
DESCRIPTION = "Llama 3 decoder (RMSNorm, RoPE theta 500k, GQA via SDPA, SwiGLU); next-token loss, AdamW"


@dataclass(frozen=True)
class LlamaConfig:
    """Model sizes (Meta's ``params.json`` names) and the default batch shape."""

    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    vocab_size: int = 128256
    multiple_of: int = 1024
    ffn_dim_multiplier: float | None = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192  # length of the rotary table; a batch may be shorter
    seq_len: int = 8192  # default sequence length of a batch
    batch_size: int = 1  # default batch size
    docs: DocLengths = DocLengths()  # packed documents (none: one sequence is one document, plain causal)

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(f"inconsistent heads: dim {self.dim}, n_heads {self.n_heads}, "
                             f"n_kv_heads {self.n_kv_heads} (need an even head_dim and n_heads % n_kv_heads == 0)")
        if self.seq_len > self.max_seq_len:
            raise ValueError(f"seq_len {self.seq_len} exceeds max_seq_len {self.max_seq_len}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """The SwiGLU width: 2/3 of 4*dim, times ``ffn_dim_multiplier``, rounded up to ``multiple_of``."""
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


CONFIGS: dict[str, LlamaConfig] = {
    "debug": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=32,
                         ffn_dim_multiplier=None, max_seq_len=64, seq_len=16, batch_size=2),
    "small": LlamaConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=4096, multiple_of=64,
                         ffn_dim_multiplier=None, max_seq_len=256, seq_len=128, batch_size=8),
    "small-packed": LlamaConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=4096, multiple_of=64,
                                ffn_dim_multiplier=None, max_seq_len=256, seq_len=128, batch_size=8,
                                docs=DocLengths("longtail", min_len=8, alpha=1.2)),
    "llama3-8b": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, multiple_of=1024,
                             ffn_dim_multiplier=1.3),
    "llama3-70b": LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, multiple_of=4096,
                              ffn_dim_multiplier=1.3),
    "llama3-405b": LlamaConfig(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, multiple_of=4096,
                               ffn_dim_multiplier=1.2),
}


# ----------------------------------------------------------------------------------------------
# model


def precompute_freqs_cis(seq_len: int, head_dim: int, theta: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """The rotary table: (seq_len, head_dim // 2, 2) holding cos and sin of position * frequency,
    in ``dtype``. Frequency k is ``theta ** (-2k / head_dim)``."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))  # (hd/2,)
    t = torch.arange(seq_len, dtype=dtype)  # (S,)
    angles = torch.outer(t, freqs)  # (S, hd/2)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)  # (S, hd/2, 2)


def apply_rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """Rotate consecutive pairs (x[2k], x[2k+1]) of each head by the table's angles (Meta's layout).

    x: (B, S, H, hd); freqs_cis: (S, hd/2, 2). Computed in at least float32, returned in x's dtype.
    """
    xp = upcast(x).reshape(*x.shape[:-1], -1, 2)  # (B, S, H, hd/2, 2)
    fc = freqs_cis.view(1, xp.size(1), 1, xp.size(3), 2)  # (1, S, 1, hd/2, 2)
    out = torch.stack(
        [xp[..., 0] * fc[..., 0] - xp[..., 1] * fc[..., 1],
         xp[..., 1] * fc[..., 0] + xp[..., 0] * fc[..., 1]],
        dim=-1,
    )  # (B, S, H, hd/2, 2)
    return out.flatten(3).type_as(x)  # (B, S, H, hd)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = upcast(x)  # statistics in at least float32
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor | None = None) -> Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)  # (B, S, H, hd)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)  # (B, S, Hkv, hd)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)  # (B, S, Hkv, hd)
        xq = apply_rotary_emb(xq, freqs_cis)
        xk = apply_rotary_emb(xk, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))  # (B, H or Hkv, S, hd)
        n_rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(n_rep, dim=1)  # (B, H, S, hd): query head h reads KV head h // n_rep
        v = v.repeat_interleave(n_rep, dim=1)  # (B, H, S, hd)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, S, hd)
        else:  # packed documents: causal within each document
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)  # (B, S, H * hd)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, cfg: LlamaConfig) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg.dim, cfg.hidden_dim)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor | None = None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """tokens (B, S) int64 -> logits (B, S, vocab)."""

    freqs_cis: Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, cfg) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta),
                             persistent=False)

    def forward(self, tokens: Tensor, doc_ids: Tensor | None = None) -> Tensor:
        seqlen = tokens.size(1)
        h = self.tok_embeddings(tokens)  # (B, S, dim)
        freqs_cis = self.freqs_cis[:seqlen]  # (S, hd/2, 2)
        mask = document_mask(doc_ids, seqlen, None, h.device)  # None without packed documents
        for layer in self.layers:
            h = layer(h, freqs_cis, mask)
        return self.output(self.norm(h))  # (B, S, vocab)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """torchtitan's initialisation, drawn on the CPU from ``generator`` (device independent):
        embeddings N(0, 1); wq, wk, wv, w1 truncated N(0, 0.02); wo, w2, w3 truncated
        N(0, 0.02 / sqrt(2 (layer + 1))); output truncated N(0, dim^-0.5) at 3 std; norms 1.
        The rotary table is recomputed in at least float32 on the model's device."""

        def trunc(p: Tensor, std: float, cutoff: float = 2.0) -> None:
            t = torch.empty(p.shape, dtype=torch.float32)
            nn.init.trunc_normal_(t, std=std, a=-cutoff * std, b=cutoff * std, generator=generator)
            fill_(p, t)

        fill_(self.tok_embeddings.weight,
              torch.randn(self.tok_embeddings.weight.shape, generator=generator))
        for layer in self.layers:
            assert isinstance(layer, TransformerBlock)
            depth_std = 0.02 / math.sqrt(2 * (layer.layer_id + 1))
            for lin in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.feed_forward.w1):
                trunc(lin.weight, 0.02)
            for lin in (layer.attention.wo, layer.feed_forward.w2, layer.feed_forward.w3):
                trunc(lin.weight, depth_std)
            layer.attention_norm.weight.fill_(1.0)
            layer.ffn_norm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        trunc(self.output.weight, self.cfg.dim ** -0.5, cutoff=3.0)
        weight = self.output.weight
        table = precompute_freqs_cis(self.cfg.max_seq_len, self.cfg.head_dim, self.cfg.rope_theta,
                                     dtype=torch.promote_types(weight.dtype, torch.float32))
        self.freqs_cis = table.to(weight.device)


# ----------------------------------------------------------------------------------------------
# the Workload protocol


def param_count(cfg: LlamaConfig) -> int:
    """Number of parameters, counted from the config without building the model."""
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    attn = cfg.dim * cfg.dim * 2 + cfg.dim * kv_dim * 2  # wq, wo, wk, wv
    ffn = 3 * cfg.dim * cfg.hidden_dim
    per_layer = attn + ffn + 2 * cfg.dim  # + two norms
    return 2 * cfg.vocab_size * cfg.dim + cfg.n_layers * per_layer + cfg.dim  # embeddings, output, norm


def build_model(cfg: LlamaConfig, *, device: torch.device, dtype: torch.dtype, seed: int) -> Transformer:
    """The model on ``device`` with floating parameters in ``dtype``, weights drawn from ``seed``."""
    return build_on_meta(lambda: Transformer(cfg), device=device, dtype=dtype, seed=seed)


def make_batch(cfg: LlamaConfig, *, device: torch.device, seed: int,
               batch_size: int | None = None) -> dict[str, Tensor]:
    """``tokens`` (B, S) and ``labels`` (B, S) int64: uniform random token ids, labels shifted by one;
    with packed documents (``cfg.docs``) also ``doc_ids`` (B, S) int64 (:mod:`.packing`)."""
    bsz = batch_size or cfg.batch_size
    g = cpu_generator(seed + 1)
    seq = torch.randint(0, cfg.vocab_size, (bsz, cfg.seq_len + 1), generator=g)  # (B, S + 1)
    batch = {"tokens": seq[:, :-1].contiguous().to(device), "labels": seq[:, 1:].contiguous().to(device)}
    if cfg.docs.kind != "none":
        batch["doc_ids"] = doc_ids(cfg.docs, bsz, cfg.seq_len, g).to(device)
    return batch


def forward(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Logits (B, S, vocab) in the model's dtype."""
    if "doc_ids" in batch:
        return model(batch["tokens"], batch["doc_ids"])
    return model(batch["tokens"])


def loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean next-token cross entropy (0-d, float32; float64 for a float64 model)."""
    logits = forward(model, batch)
    return F.cross_entropy(upcast(logits.flatten(0, 1)), batch["labels"].flatten())  # (B*S, V) vs (B*S,)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW as torchtitan trains Llama 3 (lr 8e-4, betas 0.9/0.95, weight decay 0.1)."""
    return torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def memory_bytes(cfg: LlamaConfig, *, mode: str, dtype: torch.dtype, batch_size: int | None = None) -> int:
    """Peak bytes of one Llama step, estimated: the parameters; in train mode also their gradients,
    both AdamW moments and each block's saved activations; in infer mode the transient activations."""
    e, tokens, logits = language_model_terms(cfg, dtype, batch_size)
    n = param_count(cfg)
    d, h, kv = cfg.dim, cfg.hidden_dim, cfg.n_kv_heads * cfg.head_dim
    if mode == "train":
        # saved per layer: norm inputs/outputs, q, k, v (k, v repeated), rope and norm float32
        # intermediates, attention output, residuals, w1/w3/silu/product of the MLP
        per_layer = tokens * ((10 * d + 2 * kv + 4 * h) * e + 6 * d * 4)
        return 4 * n * e + cfg.n_layers * per_layer + logits
    transient = tokens * ((6 * d + 2 * kv + 3 * h) * e + 4 * d * 4)
    return n * e + transient + logits
