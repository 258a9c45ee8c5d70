"""BERT (Devlin et al. 2018), the post-LayerNorm encoder with a masked-language-model head.

Word, learned absolute position and token type embeddings, summed and LayerNormed; each layer is
self-attention (``scaled_dot_product_attention``, bidirectional) and an erf-GELU MLP, each followed
by a residual add and LayerNorm (post-LN). The MLM head is dense + GELU + LayerNorm and a decoder
whose weight is the word embedding matrix (tied, as the original and Hugging Face's
``BertForMaskedLM``) plus its own bias. Trained with AdamW.

The batch is ``tokens``, ``token_types`` and ``labels``, each (B, S) int64: 15% of the positions of
each sequence are chosen; their labels hold the original token (-100 elsewhere, ignored by the
loss) and their input is ``[MASK]`` 80% of the time, a random token 10% and unchanged 10%.
Sequences are full length (no padding), so attention needs no mask. ``dropout`` is 0 in every
config so that a step is a deterministic function of weights and batch (the published recipe
uses 0.1; set it to get dropout in the trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import build_on_meta, cpu_generator, fill_, language_model_terms, upcast

NAME = "bert"
DESCRIPTION = "BERT encoder (post-LN, erf GELU, learned positions, token types) with tied MLM head; AdamW"


@dataclass(frozen=True)
class BertConfig:
    """Model sizes (the original ``bert_config.json`` quantities) and the default batch shape."""

    vocab_size: int = 30522
    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    intermediate_dim: int = 3072
    max_position: int = 512
    type_vocab_size: int = 2
    norm_eps: float = 1e-12
    dropout: float = 0.0
    mask_token_id: int = 103  # [MASK] in the uncased WordPiece vocabulary
    mask_prob: float = 0.15
    seq_len: int = 512  # default sequence length of a batch
    batch_size: int = 8  # default batch size

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.seq_len > self.max_position:
            raise ValueError(f"seq_len {self.seq_len} exceeds max_position {self.max_position}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside the vocabulary")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


CONFIGS: dict[str, BertConfig] = {
    "debug": BertConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, intermediate_dim=256, max_position=64,
                        seq_len=32, batch_size=2),
    "small": BertConfig(vocab_size=8192, dim=256, n_layers=4, n_heads=4, intermediate_dim=1024,
                        max_position=128, seq_len=128, batch_size=8),
    "bert-base": BertConfig(),
    "bert-large": BertConfig(dim=1024, n_layers=24, n_heads=16, intermediate_dim=4096),
}


# ----------------------------------------------------------------------------------------------
# model


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_embeddings = nn.Embedding(cfg.max_position, cfg.dim)
        self.type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, tokens: Tensor, token_types: Tensor) -> Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)  # (S,)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(positions) + self.type_embeddings(token_types)
        return self.dropout(self.norm(h))  # (B, S, dim)


class Attention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.dropout_p = cfg.dropout
        self.wq = nn.Linear(cfg.dim, cfg.dim)
        self.wk = nn.Linear(cfg.dim, cfg.dim)
        self.wv = nn.Linear(cfg.dim, cfg.dim)
        self.wo = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: Tensor) -> Tensor:
        bsz, seqlen, dim = x.shape
        q, k, v = (w(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, hd)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p if self.training else 0.0)
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, dim)  # (B, S, dim)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.intermediate_dim)
        self.w2 = nn.Linear(cfg.intermediate_dim, cfg.dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.gelu(self.w1(x)))  # erf GELU


class EncoderLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.attention_norm(x + self.dropout(self.attention(x)))  # post-LN
        return self.ffn_norm(h + self.dropout(self.feed_forward(h)))


class MLMHead(nn.Module):
    """dense + GELU + LayerNorm, then the decoder: the (tied) word embeddings and a bias."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.dim, cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: Tensor, decoder_weight: Tensor) -> Tensor:
        h = self.norm(F.gelu(self.dense(h)))  # (B, S, dim)
        return F.linear(h, decoder_weight, self.bias)  # (B, S, vocab)


class BertForMLM(nn.Module):
    """(tokens (B, S), token_types (B, S)) -> MLM logits (B, S, vocab)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.mlm_head = MLMHead(cfg)

    def forward(self, tokens: Tensor, token_types: Tensor) -> Tensor:
        h = self.embeddings(tokens, token_types)
        for layer in self.layers:
            h = layer(h)
        return self.mlm_head(h, self.embeddings.tok_embeddings.weight)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """BERT's initialisation, drawn on the CPU from ``generator``: Linear and embedding weights
        N(0, 0.02), biases 0, LayerNorm weight 1 and bias 0."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                fill_(module.weight, torch.randn(module.weight.shape, generator=generator) * 0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        self.mlm_head.bias.zero_()


# ----------------------------------------------------------------------------------------------
# the Workload protocol


def param_count(cfg: BertConfig) -> int:
    """Number of parameters, counted from the config without building the model (the decoder
    weight is the word embedding matrix, counted once)."""
    d, i = cfg.dim, cfg.intermediate_dim
    embeddings = (cfg.vocab_size + cfg.max_position + cfg.type_vocab_size) * d + 2 * d
    layer = 4 * (d * d + d) + (d * i + i) + (i * d + d) + 2 * 2 * d
    head = d * d + d + 2 * d + cfg.vocab_size
    return embeddings + cfg.n_layers * layer + head


def build_model(cfg: BertConfig, *, device: torch.device, dtype: torch.dtype, seed: int) -> BertForMLM:
    """The model on ``device`` with floating parameters in ``dtype``, weights drawn from ``seed``."""
    return build_on_meta(lambda: BertForMLM(cfg), device=device, dtype=dtype, seed=seed)


def make_batch(cfg: BertConfig, *, device: torch.device, seed: int,
               batch_size: int | None = None) -> dict[str, Tensor]:
    """``tokens``, ``token_types`` (0 for the first segment, 1 after a random split point) and
    ``labels`` (the original token at the round(mask_prob * S) >= 1 chosen positions of each
    sequence, -100 elsewhere), each (B, S) int64."""
    bsz = batch_size or cfg.batch_size
    seqlen = cfg.seq_len
    g = cpu_generator(seed + 1)
    original = torch.randint(0, cfg.vocab_size, (bsz, seqlen), generator=g)  # (B, S)
    split = torch.randint(1, seqlen, (bsz, 1), generator=g) if seqlen > 1 else torch.ones(bsz, 1, dtype=torch.int64)
    token_types = (torch.arange(seqlen).unsqueeze(0) >= split).long()  # (B, S)
    n_masked = max(1, round(cfg.mask_prob * seqlen))
    chosen_pos = torch.rand((bsz, seqlen), generator=g).argsort(dim=1)[:, :n_masked]  # (B, n_masked)
    chosen = torch.zeros((bsz, seqlen), dtype=torch.bool).scatter_(1, chosen_pos, True)  # (B, S)
    labels = torch.where(chosen, original, torch.full_like(original, -100))
    fate = torch.rand((bsz, seqlen), generator=g)  # < 0.8: [MASK]; < 0.9: random token; else unchanged
    random_tokens = torch.randint(0, cfg.vocab_size, (bsz, seqlen), generator=g)
    tokens = torch.where(chosen & (fate < 0.8), torch.full_like(original, cfg.mask_token_id), original)
    tokens = torch.where(chosen & (fate >= 0.8) & (fate < 0.9), random_tokens, tokens)
    return {"tokens": tokens.to(device), "token_types": token_types.to(device), "labels": labels.to(device)}


def forward(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """MLM logits (B, S, vocab) in the model's dtype."""
    return model(batch["tokens"], batch["token_types"])


def loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean cross entropy over the masked positions only (labels -100 are ignored; 0-d, float32;
    float64 for a float64 model)."""
    logits = forward(model, batch)
    return F.cross_entropy(upcast(logits.flatten(0, 1)), batch["labels"].flatten(), ignore_index=-100)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW as BERT pre-training (lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)


def memory_bytes(cfg: BertConfig, *, mode: str, dtype: torch.dtype, batch_size: int | None = None) -> int:
    """Estimated peak bytes of one BERT step: parameters, and in train mode gradients, AdamW's two
    moments and the saved activations of every layer; in infer mode the largest transient ones."""
    e, tokens, logits = language_model_terms(cfg, dtype, batch_size)
    n = param_count(cfg)
    d, i = cfg.dim, cfg.intermediate_dim
    if mode == "train":
        # saved per layer: input, q, k, v, attention output, projections, two LayerNorms with
        # their statistics, the MLP's pre- and post-GELU activations
        per_layer = tokens * (10 * d + 2 * i) * e
        return 4 * n * e + cfg.n_layers * per_layer + tokens * 4 * d * e + logits
    return n * e + tokens * (6 * d + 2 * i) * e + logits
