"""Llama 4 (Scout, Maverick): a mixture-of-experts decoder with interleaved RoPE and NoPE attention.

Written as Meta's reference and Hugging Face's ``Llama4TextModel`` compute it:

- **MoE feed-forward**: a router (a bias-free Linear to ``n_experts`` logits), top-k (k = 1) with
  sigmoid scores (or softmax), the chosen expert's SwiGLU applied to the token *scaled by its score*,
  plus a shared SwiGLU expert every token goes through. Maverick alternates dense and MoE layers
  (``moe_every`` 2), Scout has MoE in every layer.
- **Dispatch**: tokens grouped per expert (a stable argsort of their expert ids, ``bincount`` of the
  loads, their ``cumsum`` as group offsets), then the expert GEMMs as one grouped matmul
  (``torch._grouped_mm``, int32 ``offs``) where the device and dtype support it, else one GEMM per
  expert over its slice (``split`` by the loads read back to the host). ``Transformer.expert_path``
  says which ran (``grouped`` or ``loop``); the config's ``expert_path`` forces one. Outputs are
  combined with ``index_add`` (the sum over a token's k experts).
- **iRoPE**: every ``nope_every``-th layer (4th) is NoPE: no rotary embedding, global causal
  attention, and the query temperature of long contexts (``log1p(floor((pos + 1) / floor_scale)) *
  attn_scale + 1``); the others apply RoPE (Meta's interleaved pairs, theta 500000), an RMS
  normalisation of q and k without weight (``use_qk_norm``), and causal attention within chunks of
  ``attention_chunk`` positions.
- **Packed documents** (``docs``, see :mod:`.packing`): the batch carries ``doc_ids`` and every
  layer's mask keeps tokens within their document.
- **Routing, recorded and pinned**: :func:`recorded_routing` keeps each MoE layer's top-k choice of
  the forwards run inside it; :func:`pinned_routing` makes a model route as given (the router's own
  scores for the given experts), so that two models (fp64 and bf16, say) can be compared on one
  choice (numerics' ``model_deviation`` does).

The batch is ``tokens``, ``labels`` (next tokens) and, with documents, ``doc_ids``; the loss is the
mean next-token cross entropy. Train with AdamW.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import build_on_meta, cpu_generator, fill_, language_model_terms, upcast
from .llama import RMSNorm, apply_rotary_emb, precompute_freqs_cis
from .packing import DocLengths, doc_ids, document_mask

NAME = "llama4"
DESCRIPTION = ("Llama 4 MoE decoder (top-1 sigmoid router + shared expert, grouped expert GEMMs, "
               "iRoPE: chunked RoPE / global NoPE layers, packed documents); next-token loss, AdamW")
ROUTERS = ("sigmoid", "softmax")
EXPERT_PATHS = ("auto", "grouped", "loop")


@dataclass(frozen=True)
class Llama4Config:
    """Model sizes (Hugging Face ``Llama4TextConfig`` meanings) and the default batch shape."""

    dim: int = 5120
    n_layers: int = 48
    n_heads: int = 40
    n_kv_heads: int = 8
    vocab_size: int = 202048
    n_experts: int = 16
    top_k: int = 1
    expert_dim: int = 8192  # intermediate_size: each expert's and the shared expert's SwiGLU width
    dense_dim: int = 16384  # intermediate_size_mlp: the SwiGLU width of dense (non-MoE) layers
    moe_every: int = 1  # interleave_moe_layer_step: layers moe_every-1, 2*moe_every-1, ... are MoE
    nope_every: int = 4  # no_rope_layer_interval: layers 3, 7, 11, ... are NoPE
    attention_chunk: int = 8192
    router: str = "sigmoid"
    expert_path: str = "auto"
    use_qk_norm: bool = True
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192
    seq_len: int = 8192
    batch_size: int = 1
    docs: DocLengths = DocLengths()

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(f"inconsistent heads: dim {self.dim}, n_heads {self.n_heads}, n_kv_heads {self.n_kv_heads}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in 1..n_experts ({self.n_experts}); got {self.top_k}")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; known: {', '.join(ROUTERS)}")
        if self.expert_path not in EXPERT_PATHS:
            raise ValueError(f"unknown expert_path {self.expert_path!r}; known: {', '.join(EXPERT_PATHS)}")
        if self.seq_len > self.max_seq_len:
            raise ValueError(f"seq_len {self.seq_len} exceeds max_seq_len {self.max_seq_len}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def is_moe(self, layer: int) -> bool:
        return (layer + 1) % self.moe_every == 0

    def uses_rope(self, layer: int) -> bool:
        return (layer + 1) % self.nope_every != 0


_SMALL = dict(vocab_size=4096, n_experts=8, expert_dim=256, dense_dim=512, attention_chunk=32, floor_scale=32,
              max_seq_len=256)
CONFIGS: dict[str, Llama4Config] = {
    # two layers, as Llama 3's debug: a dense RoPE layer with chunked attention, then an MoE NoPE layer
    # with global attention (every kind of block once; the validators' quick level runs it)
    "debug": Llama4Config(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, n_experts=4, expert_dim=64,
                          dense_dim=128, moe_every=2, nope_every=2, attention_chunk=8, floor_scale=8, max_seq_len=64,
                          seq_len=16, batch_size=2),
    "small": Llama4Config(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, seq_len=128, batch_size=8, **_SMALL),
    "small-packed": Llama4Config(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, seq_len=128, batch_size=8,
                                 docs=DocLengths("longtail", min_len=8, alpha=1.2), **_SMALL),
    # small with Maverick's 128 routed experts, each a quarter of dim wide (fine-grained): uniform routing
    # gives each expert 8 of the step's 1024 tokens, so which experts a routing activates moves the step
    # (replay --against's routing-skew figures: a skewed routing skips the weights of the idle experts)
    "small-128e": Llama4Config(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, seq_len=128, batch_size=8,
                               **{**_SMALL, "n_experts": 128, "expert_dim": 64}),
    "scout": Llama4Config(n_experts=16, moe_every=1),
    "maverick": Llama4Config(n_experts=128, moe_every=2),
}


# ----------------------------------------------------------------------------------------------
# experts and their dispatch

_GROUPED_OK: dict[tuple[str, torch.dtype], bool] = {}


def grouped_mm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward on ``device`` in ``dtype`` (tried once
    on a tiny problem per device type and dtype; torch 2.13 runs float32 and bfloat16 on the CPU,
    bfloat16 on recent GPUs, never float64)."""
    key = (device.type, dtype)
    if key not in _GROUPED_OK:
        ok = hasattr(torch, "_grouped_mm") and device.type != "meta"
        if ok:
            try:
                with torch.enable_grad():
                    a = torch.randn(8, 16, device=device).to(dtype).requires_grad_(True)
                    b = torch.randn(2, 16, 16, device=device).to(dtype).requires_grad_(True)
                    y = torch._grouped_mm(a, b, offs=torch.tensor([3, 8], dtype=torch.int32, device=device))
                    y.backward(torch.ones_like(y))
            except (RuntimeError, NotImplementedError, TypeError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


def expert_gemm(x: Tensor, w: Tensor, offs: Tensor, loads: list[int] | None) -> Tensor:
    """Rows of ``x`` grouped per expert (group e ends at ``offs[e]``) times expert e's ``w[e]``
    (E, K, N): one grouped matmul, or with ``loads`` (the group sizes on the host) one GEMM each."""
    if loads is None:
        kind = x.device.type
        if torch.is_autocast_enabled(kind):  # autocast has no rule for the grouped GEMM: cast as for mm
            dt = torch.get_autocast_dtype(kind)
            if grouped_mm_supported(x.device, dt):
                x, w = x.to(dt), w.to(dt)
        return torch._grouped_mm(x, w, offs=offs)
    parts = x.split(loads)
    return torch.cat([p @ w[e] for e, p in enumerate(parts)])


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Router, routed experts (``w13`` (E, dim, 2 * hidden): gate then up; ``w2`` (E, hidden, dim))
    and the shared expert. ``forward`` takes (T, dim) tokens."""

    def __init__(self, cfg: Llama4Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(cfg.n_experts, cfg.dim, 2 * cfg.expert_dim))
        self.w2 = nn.Parameter(torch.empty(cfg.n_experts, cfg.expert_dim, cfg.dim))
        self.shared = SwiGLU(cfg.dim, cfg.expert_dim)
        self.grouped = True  # set by the model from its device, dtype and config
        self.pinned: Tensor | None = None  # (T, k) expert ids to route to instead of the top-k (pinned_routing)
        self.recorded: list[Tensor] | None = None  # each forward's (T, k) choice is appended (recorded_routing)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Each token's top-k expert ids (T, k) and their scores (T, k) in x's dtype. With a pinned
        choice the ids are that choice, and the scores the router's own for those experts."""
        logits = self.router(x)  # (T, E)
        scores = torch.softmax(upcast(logits), dim=-1) if self.cfg.router == "softmax" else logits
        if self.pinned is None:
            top_v, top_i = scores.topk(self.cfg.top_k, dim=-1)
        else:
            if self.pinned.shape != (x.shape[0], self.cfg.top_k):
                raise ValueError(f"pinned routing of shape {tuple(self.pinned.shape)} for {x.shape[0]} tokens "
                                 f"and top-{self.cfg.top_k}")
            top_i = self.pinned
            top_v = scores.gather(-1, top_i)
        if self.recorded is not None:
            self.recorded.append(top_i.detach())
        if self.cfg.router == "softmax":
            return top_i, top_v.type_as(x)
        return top_i, torch.sigmoid(upcast(top_v)).type_as(x)

    def forward(self, x: Tensor) -> Tensor:
        k = self.cfg.top_k
        top_i, scores = self.route(x)
        flat = top_i.flatten()  # (T*k,) expert of each (token, choice)
        order = flat.argsort(stable=True)  # (T*k,) the choices grouped per expert
        tok = order // k  # (T*k,) the token of each grouped choice
        counts = torch.bincount(flat, minlength=self.cfg.n_experts)  # (E,) tokens per expert
        offs = counts.cumsum(0).to(torch.int32)  # (E,) end of each expert's group
        xs = x.index_select(0, tok) * scores.flatten().index_select(0, order).unsqueeze(1)  # (T*k, dim)
        # grouped where chosen and the weights' current dtype and device run it (a model moved to
        # float64 after it was built loops)
        grouped = self.grouped and grouped_mm_supported(self.w13.device, self.w13.dtype)
        loads = None if grouped else counts.tolist()
        h = expert_gemm(xs, self.w13, offs, loads)  # (T*k, 2 * hidden)
        gate, up = h.chunk(2, dim=-1)
        y = expert_gemm(F.silu(gate) * up, self.w2, offs, loads)  # (T*k, dim)
        shared = self.shared(x)  # under autocast in its dtype
        return shared.index_add(0, tok, y.type_as(shared))  # (T, dim)


class Attention(nn.Module):
    def __init__(self, cfg: Llama4Config, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.rope = cfg.uses_rope(layer)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def _qk_norm(self, t: Tensor) -> Tensor:
        tf = upcast(t)
        return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)).type_as(t)

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor | None) -> Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        if self.rope:
            xq, xk = apply_rotary_emb(xq, freqs_cis), apply_rotary_emb(xk, freqs_cis)
            if self.cfg.use_qk_norm:
                xq, xk = self._qk_norm(xq), self._qk_norm(xk)
        elif self.cfg.attn_temperature_tuning:
            pos = torch.arange(seqlen, device=x.device, dtype=torch.float32)
            temp = torch.log1p(torch.floor((pos + 1) / self.cfg.floor_scale)) * self.cfg.attn_scale + 1.0
            xq = (upcast(xq) * temp.view(1, seqlen, 1, 1)).type_as(xq)
        q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))
        n_rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class Block(nn.Module):
    def __init__(self, layer_id: int, cfg: Llama4Config) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(cfg, layer_id)
        self.moe = cfg.is_moe(layer_id)
        self.feed_forward: nn.Module = MoE(cfg) if self.moe else SwiGLU(cfg.dim, cfg.dense_dim)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, freqs_cis: Tensor, masks: dict[bool, Tensor | None]) -> Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, masks[self.attention.rope])
        y = self.ffn_norm(h)
        return h + self.feed_forward(y.flatten(0, 1)).view_as(h) if self.moe else h + self.feed_forward(y)


class Transformer(nn.Module):
    """tokens (B, S) int64 [, doc_ids (B, S)] -> logits (B, S, vocab)."""

    freqs_cis: Tensor

    def __init__(self, cfg: Llama4Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(i, cfg) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta),
                             persistent=False)
        self.expert_path = "grouped"

    def forward(self, tokens: Tensor, doc_ids: Tensor | None = None) -> Tensor:
        seqlen = tokens.size(1)
        h = self.tok_embeddings(tokens)
        # rope layers: chunked (and per document); nope layers: global (per document)
        masks = {True: document_mask(doc_ids, seqlen, self.cfg.attention_chunk, h.device),
                 False: document_mask(doc_ids, seqlen, None, h.device)}
        for layer in self.layers:
            h = layer(h, self.freqs_cis[:seqlen], masks)
        return self.output(self.norm(h))

    def choose_expert_path(self) -> str:
        """Set and return the expert GEMM path (``grouped`` where supported, else ``loop``)."""
        w = self.output.weight
        path = self.cfg.expert_path
        if path == "auto":
            path = "grouped" if grouped_mm_supported(w.device, w.dtype) else "loop"
        self.expert_path = path
        for layer in self.layers:
            if isinstance(layer.feed_forward, MoE):
                layer.feed_forward.grouped = path == "grouped"
        return path

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """As Llama 3's (:mod:`.llama`): embeddings N(0, 1); input projections (wq, wk, wv, w1, w3,
        the router, the experts' gate and up) truncated N(0, 0.02); output projections (wo, w2, the
        experts' down) truncated N(0, 0.02 / sqrt(2 (layer + 1))); output N(0, dim^-0.5) at 3 std."""

        def trunc(p: Tensor, std: float, cutoff: float = 2.0) -> None:
            t = torch.empty(p.shape, dtype=torch.float32)
            nn.init.trunc_normal_(t, std=std, a=-cutoff * std, b=cutoff * std, generator=generator)
            fill_(p, t)

        fill_(self.tok_embeddings.weight, torch.randn(self.tok_embeddings.weight.shape, generator=generator))
        for layer in self.layers:
            assert isinstance(layer, Block)
            depth = 0.02 / math.sqrt(2 * (layer.layer_id + 1))
            a, ff = layer.attention, layer.feed_forward
            for p in (a.wq.weight, a.wk.weight, a.wv.weight):
                trunc(p, 0.02)
            trunc(a.wo.weight, depth)
            mlps = [ff.shared] if isinstance(ff, MoE) else [ff]
            if isinstance(ff, MoE):
                trunc(ff.router.weight, 0.02)
                trunc(ff.w13, 0.02)
                trunc(ff.w2, depth)
            for m in mlps:
                trunc(m.w1.weight, 0.02)
                trunc(m.w3.weight, 0.02)
                trunc(m.w2.weight, depth)
            layer.attention_norm.weight.fill_(1.0)
            layer.ffn_norm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        trunc(self.output.weight, self.cfg.dim ** -0.5, cutoff=3.0)
        w = self.output.weight
        table = precompute_freqs_cis(self.cfg.max_seq_len, self.cfg.head_dim, self.cfg.rope_theta,
                                     dtype=torch.promote_types(w.dtype, torch.float32))
        self.freqs_cis = table.to(w.device)
        self.choose_expert_path()


# ----------------------------------------------------------------------------------------------
# routing: record a model's top-k choices, pin another model to them


def _moes(model: nn.Module) -> dict[str, MoE]:
    return {name: m for name, m in model.named_modules() if isinstance(m, MoE)}


@contextmanager
def recorded_routing(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Within: each MoE layer's top-k expert ids (T, k) of every forward run, by module name, in order."""
    moes = _moes(model)
    seen: dict[str, list[Tensor]] = {name: [] for name in moes}
    for name, m in moes.items():
        m.recorded = seen[name]
    try:
        yield seen
    finally:
        for m in moes.values():
            m.recorded = None


@contextmanager
def pinned_routing(model: nn.Module, choices: dict[str, Tensor]) -> Iterator[None]:
    """Within: every MoE layer of ``model`` sends its tokens to the experts ``choices[name]`` (T, k),
    e.g. another model's choice from :func:`recorded_routing`, instead of its own top-k; the scores
    stay the router's own for those experts (so the arithmetic is the model's, the discrete choice
    the other's). ValueError when the layers differ; a batch of other tokens fails in the forward."""
    moes = _moes(model)
    if set(moes) != set(choices):
        raise ValueError(f"pinned routing for MoE layers {sorted(choices)}, the model has {sorted(moes)}")
    for name, m in moes.items():
        m.pinned = choices[name].to(m.w13.device)
    try:
        yield
    finally:
        for m in moes.values():
            m.pinned = None


# ----------------------------------------------------------------------------------------------
# the Workload protocol


def _layer_params(cfg: Llama4Config, layer: int, active: bool) -> int:
    kv = cfg.n_kv_heads * cfg.head_dim
    attn = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv
    if cfg.is_moe(layer):
        experts = cfg.top_k if active else cfg.n_experts
        ffn = cfg.dim * cfg.n_experts + (experts + 1) * 3 * cfg.dim * cfg.expert_dim  # router, experts, shared
    else:
        ffn = 3 * cfg.dim * cfg.dense_dim
    return attn + ffn + 2 * cfg.dim


def param_count(cfg: Llama4Config, active: bool = False) -> int:
    """Parameters, counted from the config (``active``: those one token uses, its top-k experts)."""
    layers = sum(_layer_params(cfg, i, active) for i in range(cfg.n_layers))
    return 2 * cfg.vocab_size * cfg.dim + layers + cfg.dim


def build_model(cfg: Llama4Config, *, device: torch.device, dtype: torch.dtype, seed: int) -> Transformer:
    """The model on ``device`` with floating parameters in ``dtype``, weights drawn from ``seed``."""
    return build_on_meta(lambda: Transformer(cfg), device=device, dtype=dtype, seed=seed)


def make_batch(cfg: Llama4Config, *, device: torch.device, seed: int, batch_size: int | None = None) -> dict[str, Tensor]:
    """``tokens``, ``labels`` (B, S) int64 (uniform token ids, labels shifted by one) and, with
    packed documents, ``doc_ids`` (B, S) int64."""
    bsz = batch_size or cfg.batch_size
    g = cpu_generator(seed + 1)
    seq = torch.randint(0, cfg.vocab_size, (bsz, cfg.seq_len + 1), generator=g)
    batch = {"tokens": seq[:, :-1].contiguous().to(device), "labels": seq[:, 1:].contiguous().to(device)}
    if cfg.docs.kind != "none":
        batch["doc_ids"] = doc_ids(cfg.docs, bsz, cfg.seq_len, g).to(device)
    return batch


def forward(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return model(batch["tokens"], batch.get("doc_ids"))


def loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean next-token cross entropy (0-d, float32; float64 for a float64 model)."""
    logits = forward(model, batch)
    return F.cross_entropy(upcast(logits.flatten(0, 1)), batch["labels"].flatten())


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with Llama 3's settings (lr 8e-4, betas 0.9/0.95, weight decay 0.1)."""
    return torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def memory_bytes(cfg: Llama4Config, *, mode: str, dtype: torch.dtype, batch_size: int | None = None) -> int:
    """Peak bytes of one step, estimated as Llama 3's: parameters (all experts); in train mode their
    gradients, both AdamW moments and each block's saved activations (the routed tokens' expert
    activations, k per token, and the shared expert's); in infer mode the transient activations;
    plus the attention masks of chunked or packed layers."""
    e, tokens, logits = language_model_terms(cfg, dtype, batch_size)
    n = param_count(cfg)
    d, h, kv = cfg.dim, max(cfg.expert_dim * (cfg.top_k + 1), cfg.dense_dim), cfg.n_kv_heads * cfg.head_dim
    bsz = batch_size or cfg.batch_size
    masks = 2 * bsz * cfg.seq_len * cfg.seq_len
    if mode == "train":
        per_layer = tokens * ((12 * d + 2 * kv + 4 * h) * e + 6 * d * 4)
        return 4 * n * e + cfg.n_layers * per_layer + logits + masks
    transient = tokens * ((8 * d + 2 * kv + 3 * h) * e + 4 * d * 4)
    return n * e + transient + logits + masks


def describe(model: nn.Module) -> dict[str, Any]:
    """What a capture records of the model beside its config: the expert GEMM path that ran."""
    return {"expert_path": getattr(model, "expert_path", None)}


def onnx_refusal(model: nn.Module) -> str | None:
    """Why the model has no ONNX export (None: it has one). The experts' GEMMs have none in torch 2.13:
    ``aten::_grouped_mm`` has no ONNX form (and torch.export's fake kernel accepts only bfloat16 on
    CUDA), and the per-expert loop splits the tokens by loads read back to the host, shapes that
    depend on the data (the ONNX graph would hold the loads of one batch)."""
    path = getattr(model, "expert_path", None)
    if path == "grouped":
        return "the experts' grouped GEMM aten::_grouped_mm has no ONNX form in torch's exporters"
    if path == "loop":
        return ("the per-expert loop splits tokens by loads read back to the host (aten::split_with_sizes of "
                "data-dependent sizes): an ONNX graph would fix one batch's routing")
    return None
