"""Our Llama and BERT against an independent reference: Hugging Face ``transformers``.

Both sides are built from configs (random init, nothing downloaded). Our state_dict goes into the
Hugging Face model through an explicit name map; with the same weights and the same batch the
logits and the loss must agree in float32.

RoPE layouts differ: ours (Meta's, gpt-fast's) rotates consecutive pairs (x[2k], x[2k+1]) of a
head; Hugging Face's ``rotate_half`` rotates (x[k], x[k + hd/2]). The map therefore permutes the
output rows of wq and wk within each head (pair k's two rows go to rows k and k + hd/2), exactly
as Meta-to-HF checkpoint conversion does. The Hugging Face side runs its eager attention, so our
``scaled_dot_product_attention`` is checked against an explicit softmax(QK^T)V.
"""

from __future__ import annotations

import pytest
import torch
from mystique.workloads import bert, llama

transformers = pytest.importorskip("transformers")


def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """Random values in every parameter (norm weights and biases too), so that a wrong map of any
    tensor shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0) * 0.5)


def _assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5 * max(scale, 1.0))


# ----------------------------------------------------------------------------------------------
# Llama


def meta_to_hf_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the output rows of a q/k projection from Meta's interleaved pairs to HF's halves.

    (n_heads * hd, dim) -> (n_heads, hd/2, 2, dim) -> swap the pair axis in front of the pair
    index -> (n_heads * hd, dim): row 2k of a head goes to row k, row 2k+1 to row k + hd/2.
    """
    rows, dim = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


def llama_to_hf(state: dict[str, torch.Tensor], cfg: llama.LlamaConfig,
                permute_rope: bool = True) -> dict[str, torch.Tensor]:
    """Our Llama state_dict under LlamaForCausalLM's names."""
    def rope(w: torch.Tensor, heads: int) -> torch.Tensor:
        return meta_to_hf_rope_rows(w, heads) if permute_rope else w

    out = {
        "model.embed_tokens.weight": state["tok_embeddings.weight"],
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["output.weight"],
    }
    for i in range(cfg.n_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        out[hf + "self_attn.q_proj.weight"] = rope(state[ours + "attention.wq.weight"], cfg.n_heads)
        out[hf + "self_attn.k_proj.weight"] = rope(state[ours + "attention.wk.weight"], cfg.n_kv_heads)
        out[hf + "self_attn.v_proj.weight"] = state[ours + "attention.wv.weight"]
        out[hf + "self_attn.o_proj.weight"] = state[ours + "attention.wo.weight"]
        out[hf + "mlp.gate_proj.weight"] = state[ours + "feed_forward.w1.weight"]
        out[hf + "mlp.up_proj.weight"] = state[ours + "feed_forward.w3.weight"]
        out[hf + "mlp.down_proj.weight"] = state[ours + "feed_forward.w2.weight"]
        out[hf + "input_layernorm.weight"] = state[ours + "attention_norm.weight"]
        out[hf + "post_attention_layernorm.weight"] = state[ours + "ffn_norm.weight"]
    assert len(out) == len(state), "every tensor of ours is mapped exactly once"
    return out


def _hf_llama(cfg: llama.LlamaConfig) -> torch.nn.Module:
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_seq_len,
        hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        attention_dropout=0.0,
    )
    hf_cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(hf_cfg).eval()


@pytest.fixture(scope="module")
def llama_pair() -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor], llama.LlamaConfig]:
    cfg = llama.CONFIGS["debug"]
    assert cfg.n_heads > cfg.n_kv_heads, "the debug config must exercise grouped-query attention"
    ours = llama.build_model(cfg, device=torch.device("cpu"), dtype=torch.float32, seed=3).eval()
    _randomize_(ours, seed=11)
    theirs = _hf_llama(cfg)
    result = theirs.load_state_dict(llama_to_hf(ours.state_dict(), cfg), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    batch = llama.make_batch(cfg, device=torch.device("cpu"), seed=5)
    return ours, theirs, batch, cfg


def test_llama_logits_match_transformers(llama_pair) -> None:
    ours, theirs, batch, cfg = llama_pair
    with torch.no_grad():
        mine = llama.forward(ours, batch)
        ref = theirs(input_ids=batch["tokens"]).logits
    assert mine.shape == ref.shape == (cfg.batch_size, cfg.seq_len, cfg.vocab_size)
    _assert_close(mine, ref)


def test_llama_loss_matches_transformers(llama_pair) -> None:
    ours, theirs, batch, _cfg = llama_pair
    with torch.no_grad():
        mine = llama.loss(ours, batch)
        # HF shifts labels itself: its labels are the inputs, position t predicts token t + 1.
        full = torch.cat([batch["tokens"], batch["labels"][:, -1:]], dim=1)  # (B, S + 1)
        logits = theirs(input_ids=full).logits[:, :-1]  # (B, S, V): the positions of our tokens
        ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), full[:, 1:].flatten())
    _assert_close(mine, ref)


def test_llama_rope_layout_needs_the_permutation(llama_pair) -> None:
    """Without the q/k row permutation the models disagree: the map's RoPE handling is load-bearing."""
    ours, _theirs, batch, cfg = llama_pair
    unpermuted = _hf_llama(cfg)
    unpermuted.load_state_dict(llama_to_hf(ours.state_dict(), cfg, permute_rope=False), strict=True)
    with torch.no_grad():
        diff = (llama.forward(ours, batch) - unpermuted(input_ids=batch["tokens"]).logits).abs().max().item()
    assert diff > 1e-3


# ----------------------------------------------------------------------------------------------
# BERT


def bert_to_hf(state: dict[str, torch.Tensor], cfg: bert.BertConfig) -> dict[str, torch.Tensor]:
    """Our BERT state_dict under BertForMaskedLM's names (its decoder weight and bias are tied to
    the word embeddings and ``cls.predictions.bias``, so they are filled through those)."""
    out = {
        "bert.embeddings.word_embeddings.weight": state["embeddings.tok_embeddings.weight"],
        "bert.embeddings.position_embeddings.weight": state["embeddings.pos_embeddings.weight"],
        "bert.embeddings.token_type_embeddings.weight": state["embeddings.type_embeddings.weight"],
        "bert.embeddings.LayerNorm.weight": state["embeddings.norm.weight"],
        "bert.embeddings.LayerNorm.bias": state["embeddings.norm.bias"],
        "cls.predictions.transform.dense.weight": state["mlm_head.dense.weight"],
        "cls.predictions.transform.dense.bias": state["mlm_head.dense.bias"],
        "cls.predictions.transform.LayerNorm.weight": state["mlm_head.norm.weight"],
        "cls.predictions.transform.LayerNorm.bias": state["mlm_head.norm.bias"],
        "cls.predictions.bias": state["mlm_head.bias"],
    }
    names = {
        "attention.wq": "attention.self.query",
        "attention.wk": "attention.self.key",
        "attention.wv": "attention.self.value",
        "attention.wo": "attention.output.dense",
        "attention_norm": "attention.output.LayerNorm",
        "feed_forward.w1": "intermediate.dense",
        "feed_forward.w2": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    for i in range(cfg.n_layers):
        for ours, hf in names.items():
            for kind in ("weight", "bias"):
                out[f"bert.encoder.layer.{i}.{hf}.{kind}"] = state[f"layers.{i}.{ours}.{kind}"]
    assert len(out) == len(state), "every tensor of ours is mapped exactly once"
    return out


@pytest.fixture(scope="module")
def bert_pair() -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor], bert.BertConfig]:
    cfg = bert.CONFIGS["debug"]
    ours = bert.build_model(cfg, device=torch.device("cpu"), dtype=torch.float32, seed=3).eval()
    _randomize_(ours, seed=12)
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.intermediate_dim, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=cfg.max_position,
        type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.norm_eps, tie_word_embeddings=True,
    )
    hf_cfg._attn_implementation = "eager"
    theirs = transformers.BertForMaskedLM(hf_cfg).eval()
    result = theirs.load_state_dict(bert_to_hf(ours.state_dict(), cfg), strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    decoder = theirs.cls.predictions.decoder
    torch.testing.assert_close(decoder.weight, ours.embeddings.tok_embeddings.weight, rtol=0, atol=0)
    torch.testing.assert_close(decoder.bias, ours.mlm_head.bias, rtol=0, atol=0)
    batch = bert.make_batch(cfg, device=torch.device("cpu"), seed=5)
    return ours, theirs, batch, cfg


def test_bert_logits_match_transformers(bert_pair) -> None:
    ours, theirs, batch, cfg = bert_pair
    with torch.no_grad():
        mine = bert.forward(ours, batch)
        ref = theirs(input_ids=batch["tokens"], token_type_ids=batch["token_types"]).logits
    assert mine.shape == ref.shape == (cfg.batch_size, cfg.seq_len, cfg.vocab_size)
    _assert_close(mine, ref)


def test_bert_masked_loss_matches_transformers(bert_pair) -> None:
    ours, theirs, batch, _cfg = bert_pair
    with torch.no_grad():
        mine = bert.loss(ours, batch)
        ref = theirs(input_ids=batch["tokens"], token_type_ids=batch["token_types"], labels=batch["labels"]).loss
    _assert_close(mine, ref)


def test_bert_gradients_match_transformers(bert_pair) -> None:
    """Backward agrees too: the word-embedding gradient collects the tied decoder's share on both sides."""
    ours, theirs, batch, _cfg = bert_pair
    ours.zero_grad(set_to_none=True)
    theirs.zero_grad(set_to_none=True)
    bert.loss(ours, batch).backward()
    theirs(input_ids=batch["tokens"], token_type_ids=batch["token_types"], labels=batch["labels"]).loss.backward()
    mine = ours.embeddings.tok_embeddings.weight.grad
    ref = theirs.bert.embeddings.word_embeddings.weight.grad
    assert mine is not None and ref is not None
    _assert_close(mine, ref)
    _assert_close(ours.layers[0].attention.wq.weight.grad, theirs.bert.encoder.layer[0].attention.self.query.weight.grad)
