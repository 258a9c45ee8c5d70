"""Llama 4 (workloads/llama4.py): the MoE decoder runs, its two expert paths agree, published sizes
are refused before allocating, and its math equals Hugging Face's ``Llama4ForCausalLM`` (random
weights, fp64, nothing downloaded): router, sigmoid top-1 scores scaling the routed input, shared
expert, chunked RoPE layers with qk norm, NoPE layers with temperature tuning, dense/MoE interleave."""

from __future__ import annotations

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.workloads import WorkloadTooLarge, llama4, make_step, names
from mystique.workloads.packing import DocLengths, doc_ids, document_mask

CPU = torch.device("cpu")


def test_registered_and_runs_both_modes():
    assert "llama4" in names()
    for mode in ("train", "infer"):
        step = make_step("llama4", "debug", mode)
        out = step()
        assert torch.isfinite(out).all()
        assert step.model.expert_path == ("grouped" if llama4.grouped_mm_supported(CPU, torch.float32) else "loop")


def test_grouped_and_loop_paths_agree_and_fp64_loops():
    cfg = llama4.CONFIGS["debug"]
    model = llama4.build_model(cfg, device=CPU, dtype=torch.float32, seed=0)
    batch = llama4.make_batch(cfg, device=CPU, seed=0)
    first = llama4.forward(model, batch)
    for layer in model.layers:
        if layer.moe:
            layer.feed_forward.grouped = False
    torch.testing.assert_close(llama4.forward(model, batch), first, rtol=1e-5, atol=1e-5)
    assert llama4.build_model(cfg, device=CPU, dtype=torch.float64, seed=0).expert_path == "loop"


def test_published_sizes_and_refusal_before_allocating(monkeypatch):
    scout, maverick = llama4.CONFIGS["scout"], llama4.CONFIGS["maverick"]
    # Meta: Scout 17B active of 109B (text decoder 107.8B), Maverick 17B active of 400B
    assert 107e9 < llama4.param_count(scout) < 110e9 and 400e9 < llama4.param_count(maverick) < 402e9
    for cfg in (scout, maverick):
        assert 17.0e9 < llama4.param_count(cfg, active=True) < 17.3e9
    monkeypatch.setattr("mystique.workloads.base.available_bytes", lambda device: 64 << 30)
    with pytest.raises(WorkloadTooLarge, match=r"llama4 scout train needs ~1\.\d TiB, cpu has 64\.0 GiB"):
        make_step("llama4", "scout", "train")


def test_irope_and_moe_layout():
    cfg = llama4.CONFIGS["scout"]
    assert [cfg.uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    assert all(cfg.is_moe(i) for i in range(48))
    assert [llama4.CONFIGS["maverick"].is_moe(i) for i in range(4)] == [False, True, False, True]


def test_packed_documents_mask_and_lengths():
    g = torch.Generator().manual_seed(0)
    ids = doc_ids(DocLengths("longtail", min_len=2, alpha=1.2), 3, 40, g)
    assert ids.shape == (3, 40) and bool((ids.diff(dim=1) >= 0).all())
    mask = document_mask(ids, 40, 8, CPU)
    i, j = 20, 17
    same = bool(ids[0, i] == ids[0, j]) and i // 8 == j // 8
    assert bool(mask[0, 0, i, j]) == same and not bool(mask[0, 0, j, i])
    assert document_mask(None, 16, 16, CPU) is None
    with pytest.raises(ValueError, match="unknown document lengths"):
        DocLengths("zipf")


def _hf_state(state: dict[str, torch.Tensor], cfg: llama4.Llama4Config) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": state["tok_embeddings.weight"], "model.norm.weight": state["norm.weight"],
           "lm_head.weight": state["output.weight"]}
    for i in range(cfg.n_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            out[f"{q}self_attn.{theirs}.weight"] = state[f"{p}attention.{ours}.weight"]
        out[f"{q}input_layernorm.weight"] = state[f"{p}attention_norm.weight"]
        out[f"{q}post_attention_layernorm.weight"] = state[f"{p}ffn_norm.weight"]
        mlp, f = f"{p}feed_forward.", f"{q}feed_forward."
        if cfg.is_moe(i):
            out[f"{f}experts.gate_up_proj"] = state[f"{mlp}w13"]
            out[f"{f}experts.down_proj"] = state[f"{mlp}w2"]
            out[f"{f}router.weight"] = state[f"{mlp}router.weight"]
            mlp, f = f"{mlp}shared.", f"{f}shared_expert."
        for ours, theirs in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            out[f"{f}{theirs}.weight"] = state[f"{mlp}{ours}.weight"]
    return out


def test_equals_transformers_llama4():
    transformers = pytest.importorskip("transformers")
    cfg = llama4.CONFIGS["debug"]
    hc = transformers.Llama4TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.expert_dim,
        intermediate_size_mlp=cfg.dense_dim, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, num_local_experts=cfg.n_experts,
        num_experts_per_tok=cfg.top_k, interleave_moe_layer_step=cfg.moe_every,
        no_rope_layer_interval=cfg.nope_every, attention_chunk_size=cfg.attention_chunk,
        floor_scale=cfg.floor_scale, attn_scale=cfg.attn_scale, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, rope_scaling=None, max_position_embeddings=cfg.max_seq_len)
    hc._attn_implementation = "eager"
    hf = transformers.Llama4ForCausalLM(hc).double().eval()
    ours = llama4.build_model(cfg, device=CPU, dtype=torch.float64, seed=3).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # random norms too, so that a wrong map of any tensor shows
        for p in ours.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if p.dim() == 1 else 0.02))
    missing = hf.load_state_dict(_hf_state(ours.state_dict(), cfg), strict=False)
    assert not missing.unexpected_keys and not [k for k in missing.missing_keys if "rotary" not in k]
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
    with torch.no_grad():
        theirs = hf(input_ids=tokens).logits
        mine = ours(tokens)
    # Hugging Face rotates in float32 (view_as_complex of xq.float()) and takes the router's sigmoid in
    # float32 even in a float64 model, so the two agree to float32's rounding, not float64's
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5 * max(theirs.abs().max().item(), 1.0))


def test_param_count_matches_the_built_model():
    for key, cfg in llama4.CONFIGS.items():
        with torch.device("meta"):
            model = llama4.Transformer(cfg)
        assert llama4.param_count(cfg) == sum(p.numel() for p in model.parameters()), key


def test_llama3_packed_documents_mask_within_documents():
    from mystique.workloads import llama

    cfg = llama.CONFIGS["small-packed"]
    assert llama.CONFIGS["small"].docs.kind == "none"  # the default keeps plain causal attention
    batch = llama.make_batch(cfg, device=CPU, seed=0)
    assert batch["doc_ids"].shape == batch["tokens"].shape
    model = llama.build_model(llama.CONFIGS["debug"], device=CPU, dtype=torch.float64, seed=0)
    # a token's logits do not depend on earlier documents: change the first document's tokens
    tokens = batch["tokens"][:1, :16] % 256
    ids = torch.tensor([[0] * 5 + [1] * 11])
    other = tokens.clone()
    other[0, :5] = (other[0, :5] + 1) % 256
    a, b = model(tokens, ids), model(other, ids)
    assert torch.equal(a[0, 5:], b[0, 5:]) and not torch.equal(a[0, :5], b[0, :5])


def test_onnx_export_refuses_naming_the_operator(tmp_path, capsys):
    pytest.importorskip("onnx")
    from mystique.cli import main

    code = main(["-q", "export-onnx", "llama4", "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "aten::_grouped_mm has no ONNX form" in err, err
    assert not (tmp_path / "o").exists()


def test_validators_take_llama4_by_name():
    from mystique.validators import correctness

    from mystique.targets import Target

    df = correctness.run(Target("cpu"), groups=["workload_output"], workloads="llama4")
    row = df[df.check == "workload_output_error"].iloc[0]
    assert row.subject == "llama4/debug" and row.status == "pass"


@examples(6, deadline=None)
@given(seed=st.integers(0, 2**16), draw=st.integers(0, 2**16))
def test_pinned_routing_sends_each_token_to_the_given_experts(seed, draw):
    """Pinned to its own recorded choice the forward is bitwise unchanged; pinned to any other choice
    each MoE layer routes exactly that choice (its loads follow), with the router's own scores, which
    backward still reaches."""
    cfg = llama4.CONFIGS["debug"]
    model = llama4.build_model(cfg, device=CPU, dtype=torch.float32, seed=seed)
    batch = llama4.make_batch(cfg, device=CPU, seed=seed)
    with torch.no_grad(), llama4.recorded_routing(model) as seen:
        out = llama4.forward(model, batch)
    own = {k: v[0] for k, v in seen.items()}
    assert list(own) == ["layers.1.feed_forward"] and own["layers.1.feed_forward"].shape == (32, 1)  # 2 x 16 tokens
    with torch.no_grad(), llama4.pinned_routing(model, own):
        assert torch.equal(llama4.forward(model, batch), out)
    g = torch.Generator().manual_seed(draw)
    other = {k: torch.randint(0, cfg.n_experts, v.shape, generator=g) for k, v in own.items()}
    with llama4.pinned_routing(model, other), llama4.recorded_routing(model) as seen:
        llama4.loss(model, batch).backward()
    assert all(torch.equal(seen[k][0], other[k]) for k in other)
    assert all(layer.feed_forward.router.weight.grad.abs().sum() > 0 for layer in model.layers if layer.moe)
    assert all(layer.feed_forward.pinned is None and layer.feed_forward.recorded is None
               for layer in model.layers if layer.moe)  # the contexts leave the model as it was


def test_pinned_routing_refuses_other_layers_and_other_tokens():
    cfg = llama4.CONFIGS["debug"]
    model = llama4.build_model(cfg, device=CPU, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="pinned routing for MoE layers"):
        with llama4.pinned_routing(model, {"layers.0.feed_forward": torch.zeros(32, 1, dtype=torch.long)}):
            pass
    wrong = {"layers.1.feed_forward": torch.zeros(31, 1, dtype=torch.long)}
    with pytest.raises(ValueError, match=r"pinned routing of shape \(31, 1\) for 32 tokens"):
        with torch.no_grad(), llama4.pinned_routing(model, wrong):
            llama4.forward(model, llama4.make_batch(cfg, device=CPU, seed=0))


def test_onnx_validator_skips_llama4_naming_the_operator():
    """llama4 is a default workload: the ONNX validator's row for it is a skip naming the operator that no
    exporter has (not a failed export on a healthy device)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from mystique.validators import onnx_runtime

    from mystique.targets import Target

    df = onnx_runtime.run(Target("cpu"), workloads=["llama4"], low_precision=())
    assert len(df) == 1, df[["check", "subject", "status"]].to_string()
    row = df.iloc[0]
    assert (row.check, row.subject, row.status) == ("onnx_export", "llama4/debug", "skip")
    assert row.detail.startswith("not exportable: ") and "aten::_grouped_mm" in row.detail
