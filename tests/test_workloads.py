"""The reference workloads: registry, steps, seeded inputs, memory guard and published sizes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from mystique.workloads import MODES, Step, WorkloadTooLarge, base, bert, dlrm, get, llama, make_step, names

WORKLOADS = {"llama": llama, "dlrm": dlrm, "bert": bert}
CPU = torch.device("cpu")


def _meta_numel(mod, cfg) -> int:
    """Parameters of the model built on the meta device (no memory), tied ones counted once."""
    model_cls = {"llama": llama.Transformer, "dlrm": dlrm.DLRM, "bert": bert.BertForMLM}[mod.NAME]
    with torch.device("meta"):
        model = model_cls(cfg)
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# registry and errors


def test_registry_lists_the_three_workloads_with_the_protocol() -> None:
    assert names() == ["bert", "dlrm", "llama", "llama4"]
    for name in names():
        mod = get(name)
        assert mod.NAME == name and mod.DESCRIPTION
        assert {"debug", "small"} <= set(mod.CONFIGS)
        for fn in ("build_model", "make_batch", "forward", "loss", "make_optimizer", "memory_bytes", "param_count"):
            assert callable(getattr(mod, fn)), (name, fn)
        for cfg in mod.CONFIGS.values():
            assert dataclasses.is_dataclass(cfg)


@pytest.mark.parametrize(
    ("args", "kwargs", "known"),
    [
        (("gpt2",), {}, "bert, dlrm, llama"),
        (("llama", "llama3-1b"), {}, "debug, small, small-packed, llama3-8b"),
        (("bert", "debug", "eval"), {}, "train, infer"),
        (("dlrm", "debug", "train"), {"dtype": torch.int64}, "float32"),
        (("dlrm", "debug", "train"), {"batch_size": 0}, "at least 1"),
    ],
)
def test_bad_name_config_mode_dtype_or_batch_raise_value_error_naming_the_known(args, kwargs, known) -> None:
    with pytest.raises(ValueError, match=known):
        make_step(*args, **kwargs)


# ----------------------------------------------------------------------------------------------
# steps


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_debug_train_step_updates_parameters_and_gives_finite_loss(name: str) -> None:
    step = make_step(name, "debug", "train", seed=1)
    assert isinstance(step, Step) and step.optimizer is not None and step.model.training
    before = {k: v.detach().clone() for k, v in step.model.named_parameters()}
    first = step()
    second = step()
    assert first.dim() == 0 and math.isfinite(first.item()) and math.isfinite(second.item())
    changed = [k for k, v in step.model.named_parameters() if not torch.equal(v, before[k])]
    assert len(changed) == len(before), f"not updated: {set(before) - set(changed)}"
    assert second.item() < first.item(), "a step on the same batch lowers its loss"
    assert all(p.grad is not None for p in step.model.parameters()), "backward reached every parameter"


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_debug_infer_step_runs_under_inference_mode(name: str) -> None:
    step = make_step(name, "debug", "infer", seed=1)
    assert step.optimizer is None and not step.model.training
    before = {k: v.detach().clone() for k, v in step.model.named_parameters()}
    out = step()
    assert out.is_inference() and not out.requires_grad
    assert torch.isfinite(out).all()
    assert all(torch.equal(v, before[k]) for k, v in step.model.named_parameters())
    assert all(p.grad is None for p in step.model.parameters())
    cfg = step.config
    if name == "dlrm":
        assert tuple(out.shape) == (cfg.batch_size, 1)
        assert ((out > 0) & (out < 1)).all(), "DLRM predicts probabilities"
    else:
        assert tuple(out.shape) == (cfg.batch_size, cfg.seq_len, cfg.vocab_size)


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_bfloat16_applies_to_floating_parameters_only(name: str) -> None:
    step = make_step(name, "debug", "train", dtype=torch.bfloat16, batch_size=3)
    assert {p.dtype for p in step.model.parameters()} == {torch.bfloat16}
    index_keys = {"llama": ["tokens", "labels"], "dlrm": ["indices", "offsets"], "bert": ["tokens", "token_types", "labels"]}
    for key in index_keys[name]:
        assert step.batch[key].dtype == torch.int64, key
    lead_key = "dense" if name == "dlrm" else "tokens"
    assert step.batch[lead_key].shape[0] == 3
    if name == "dlrm":
        assert step.batch["dense"].dtype == torch.float32, "inputs are cast inside forward"
    assert math.isfinite(step().item())


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_float64_model_computes_in_float64_and_agrees_with_float32(name: str) -> None:
    """fp64 goldens stay fp64 end to end (no internal cast down to float32)."""
    mod = WORKLOADS[name]
    cfg = mod.CONFIGS["debug"]
    batch = mod.make_batch(cfg, device=CPU, seed=0)
    losses = {}
    for dtype in (torch.float64, torch.float32):
        model = mod.build_model(cfg, device=CPU, dtype=dtype, seed=0)
        with torch.no_grad():
            losses[dtype] = mod.loss(model, batch)
            assert mod.forward(model, batch).dtype == dtype
    assert losses[torch.float64].dtype == torch.float64 and losses[torch.float32].dtype == torch.float32
    torch.testing.assert_close(losses[torch.float32].double(), losses[torch.float64], rtol=1e-5, atol=1e-6)
    if name == "llama":
        assert model.freqs_cis.dtype == torch.float32


def test_llama_rope_table_stays_float32_under_bfloat16() -> None:
    model = llama.build_model(llama.CONFIGS["debug"], device=CPU, dtype=torch.bfloat16, seed=0)
    assert model.freqs_cis.dtype == torch.float32
    fresh = llama.precompute_freqs_cis(model.cfg.max_seq_len, model.cfg.head_dim, model.cfg.rope_theta)
    torch.testing.assert_close(model.freqs_cis, fresh, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# seeded inputs and weights


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_same_seed_gives_identical_batch_and_weights(name: str) -> None:
    mod = WORKLOADS[name]
    cfg = mod.CONFIGS["debug"]
    a, b, c = (mod.make_batch(cfg, device=CPU, seed=s) for s in (7, 7, 8))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a), "another seed gives another batch"
    m1, m2, m3 = (mod.build_model(cfg, device=CPU, dtype=torch.float32, seed=s) for s in (7, 7, 8))
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert any(not torch.equal(s1[k], s3[k]) for k in s1)


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_batch_size_override(name: str) -> None:
    mod = WORKLOADS[name]
    batch = mod.make_batch(mod.CONFIGS["debug"], device=CPU, seed=0, batch_size=5)
    lead = batch["dense"].shape[0] if name == "dlrm" else batch["tokens"].shape[0]
    assert lead == 5
    if name == "dlrm":
        assert batch["offsets"].shape == (len(mod.CONFIGS["debug"].table_sizes), 5)


def test_llama_labels_are_the_next_tokens() -> None:
    cfg = llama.CONFIGS["debug"]
    batch = llama.make_batch(cfg, device=CPU, seed=2)
    assert batch["tokens"].shape == batch["labels"].shape == (cfg.batch_size, cfg.seq_len)
    assert torch.equal(batch["labels"][:, :-1], batch["tokens"][:, 1:])
    assert int(batch["tokens"].max()) < cfg.vocab_size and int(batch["tokens"].min()) >= 0


def test_bert_masks_fifteen_percent_with_the_80_10_10_recipe() -> None:
    cfg = dataclasses.replace(bert.CONFIGS["debug"], seq_len=64)
    batch = bert.make_batch(cfg, device=CPU, seed=4, batch_size=64)
    labels, tokens = batch["labels"], batch["tokens"]
    chosen = labels != -100
    assert (chosen.sum(dim=1) == round(0.15 * cfg.seq_len)).all()
    masked = (tokens == cfg.mask_token_id) & chosen
    kept = (tokens == labels) & chosen & ~masked
    n = int(chosen.sum())
    assert 0.72 < int(masked.sum()) / n < 0.88
    assert 0.04 < int(kept.sum()) / n < 0.17  # unchanged 10% (+ random draws equal to the original)
    types = batch["token_types"]
    assert ((types == 0) | (types == 1)).all() and (types[:, 0] == 0).all()
    assert (types.diff(dim=1) >= 0).all(), "segment A then segment B"


# ----------------------------------------------------------------------------------------------
# DLRM sparse inputs


def test_dlrm_indices_within_tables_and_offsets_valid() -> None:
    cfg = dlrm.CONFIGS["debug"]
    batch = dlrm.make_batch(cfg, device=CPU, seed=3, batch_size=32)
    idx, off = batch["indices"], batch["offsets"]
    assert idx.dtype == off.dtype == torch.int64
    assert idx.shape == (cfg.num_tables, 32 * cfg.pooling) and off.shape == (cfg.num_tables, 32)
    for t, n in enumerate(cfg.table_sizes):
        assert 0 <= int(idx[t].min()) and int(idx[t].max()) < n
        assert int(off[t, 0]) == 0 and (off[t].diff() >= 0).all() and int(off[t, -1]) <= idx.shape[1]
    lengths = torch.diff(off, append=torch.full((cfg.num_tables, 1), idx.shape[1]), dim=1)
    assert lengths.float().mean().item() == cfg.pooling
    assert lengths.unique().numel() > 1, "multi-hot bags of varying size"


def test_dlrm_one_hot_config_has_one_id_per_bag() -> None:
    cfg = dlrm.CONFIGS["criteo-kaggle"]
    assert cfg.pooling == 1
    small_tables = dataclasses.replace(cfg, table_sizes=tuple(min(n, 1000) for n in cfg.table_sizes))
    batch = dlrm.make_batch(small_tables, device=CPU, seed=0)
    assert torch.equal(batch["offsets"], torch.arange(128).expand(26, 128))


def test_dlrm_popular_decile_gets_a_large_share() -> None:
    rows = dlrm.zipf_rows(1000, 50_000, 1.05, torch.Generator().manual_seed(0))
    per_row = torch.bincount(rows, minlength=1000)
    counts, order = per_row.sort(descending=True)
    share = counts[:100].sum().item() / counts.sum().item()
    assert share > 0.5, share
    assert counts[0].item() > 20 * counts[500].item()
    top10 = order[:10]
    assert int(top10.max() - top10.min()) > 300, "popular rows are scattered over the table, not packed at the front"


@examples(40)
@given(n_rows=st.integers(1, 10_000_000), count=st.integers(1, 300), alpha=st.floats(0.5, 2.0),
       seed=st.integers(0, 2**31))
def test_zipf_rows_always_within_the_table(n_rows: int, count: int, alpha: float, seed: int) -> None:
    rows = dlrm.zipf_rows(n_rows, count, alpha, torch.Generator().manual_seed(seed))
    assert rows.shape == (count,) and rows.dtype == torch.int64
    assert int(rows.min()) >= 0 and int(rows.max()) < n_rows


@examples(40)
@given(batch=st.integers(1, 200), pooling=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_bag_offsets_partition_the_ids(batch: int, pooling: int, seed: int) -> None:
    count = batch * pooling
    off = dlrm.bag_offsets(batch, count, pooling == 1, torch.Generator().manual_seed(seed))
    assert off.shape == (batch,) and int(off[0]) == 0
    assert (off.diff() >= 0).all() and int(off[-1]) <= count


def test_dlrm_interaction_is_the_lower_triangle_of_pairwise_dots() -> None:
    cfg = dlrm.CONFIGS["debug"]
    model = dlrm.build_model(cfg, device=CPU, dtype=torch.float32, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, cfg.embedding_dim, generator=g)
    ly = [torch.randn(3, cfg.embedding_dim, generator=g) for _ in cfg.table_sizes]
    out = model.interact(x, ly)
    assert out.shape == (3, cfg.interaction_dim)
    feats = [x, *ly]
    expected = [(feats[i] * feats[j]).sum(dim=1) for i in range(len(feats)) for j in range(i)]
    torch.testing.assert_close(out, torch.cat([x, torch.stack(expected, dim=1)], dim=1))


def test_dlrm_model_gives_logits_forward_their_sigmoid_and_loss_takes_the_logits() -> None:
    """The top MLP ends in a Linear (the logit); ``forward`` is its sigmoid; the loss, computed
    from the logits (autocast-safe), equals BCE of the probabilities and its gradient too."""
    cfg = dlrm.CONFIGS["debug"]
    model = dlrm.build_model(cfg, device=CPU, dtype=torch.float64, seed=0)
    batch = dlrm.make_batch(cfg, device=CPU, seed=0)
    assert isinstance(model.top_l[-1], torch.nn.Linear) and isinstance(model.bot_l[-1], torch.nn.ReLU)
    assert not any(isinstance(m, torch.nn.Sigmoid) for m in model.modules())
    z = dlrm.logits(model, batch)
    probs = dlrm.forward(model, batch)
    assert z.shape == probs.shape == (cfg.batch_size, 1) and not torch.allclose(z, probs)
    torch.testing.assert_close(probs, torch.sigmoid(z), rtol=0, atol=0)
    got = dlrm.loss(model, batch)
    got.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    expected = torch.nn.functional.binary_cross_entropy(dlrm.forward(model, batch), batch["labels"].double())
    expected.backward()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-9, atol=1e-15)


def test_dlrm_sparse_gradients_train_with_sgd() -> None:
    cfg = dataclasses.replace(dlrm.CONFIGS["debug"], sparse_grads=True)
    model = dlrm.build_model(cfg, device=CPU, dtype=torch.float32, seed=0)
    batch = dlrm.make_batch(cfg, device=CPU, seed=0)
    opt = dlrm.make_optimizer(model)
    table = model.emb_l[1].weight.detach().clone()
    dlrm.loss(model, batch).backward()
    assert model.emb_l[1].weight.grad.is_sparse
    opt.step()
    touched = torch.zeros(cfg.table_sizes[1], dtype=torch.bool)
    touched[batch["indices"][1]] = True
    moved = (model.emb_l[1].weight.detach() != table).any(dim=1)
    assert moved.any() and not (moved & ~touched).any(), "only rows in the batch move"


# ----------------------------------------------------------------------------------------------
# memory guard


def test_too_large_config_raises_before_allocating(monkeypatch) -> None:
    def must_not_build(*args, **kwargs):
        raise AssertionError("build_model called for a config that cannot fit")

    monkeypatch.setattr(llama, "build_model", must_not_build)
    monkeypatch.setattr(llama, "make_batch", must_not_build)
    with pytest.raises(WorkloadTooLarge) as err:
        make_step("llama", "llama3-405b", "train")
    msg = str(err.value)
    needed = llama.memory_bytes(llama.CONFIGS["llama3-405b"], mode="train", dtype=torch.float32)
    assert err.value.needed == needed > 405e9 * 16
    assert "llama3-405b train needs ~" in msg and "TiB" in msg and "cpu has" in msg and "available" in msg
    assert base.format_bytes(err.value.available) in msg


def test_memory_guard_uses_what_the_device_reports(monkeypatch) -> None:
    monkeypatch.setattr(base, "available_bytes", lambda device: 3 * 2**30)
    need = bert.memory_bytes(bert.CONFIGS["bert-large"], mode="train", dtype=torch.bfloat16)
    assert need > 3 * 2**30
    with pytest.raises(WorkloadTooLarge, match=r"bert bert-large train needs ~\d+\.\d GiB, cpu has 3\.0 GiB available"):
        make_step("bert", "bert-large", "train", dtype=torch.bfloat16)
    monkeypatch.setattr(base, "available_bytes", lambda device: None)  # a backend that does not say
    assert make_step("bert", "debug", "infer").mode == "infer"


def test_available_bytes_reads_meminfo_on_cpu() -> None:
    avail = base.available_bytes(CPU)
    assert avail is not None and 0 < avail
    with open("/proc/meminfo", encoding="utf-8") as fh:
        total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    assert avail <= total


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_memory_estimate_grows_with_batch_and_training(name: str) -> None:
    mod = WORKLOADS[name]
    for cfg in mod.CONFIGS.values():
        infer = mod.memory_bytes(cfg, mode="infer", dtype=torch.float32)
        train = mod.memory_bytes(cfg, mode="train", dtype=torch.float32)
        bigger = mod.memory_bytes(cfg, mode="train", dtype=torch.float32, batch_size=cfg.batch_size * 4)
        half = mod.memory_bytes(cfg, mode="train", dtype=torch.bfloat16)
        weights = mod.param_count(cfg) * 4
        assert weights < infer < train < bigger
        assert half < train


def test_format_bytes() -> None:
    assert base.format_bytes(512) == "512 B"
    assert base.format_bytes(23.4 * 2**30) == "23.4 GiB"
    assert base.format_bytes(1.1 * 2**40) == "1.1 TiB"
    assert base.format_bytes(3000 * 2**40) == "3000.0 TiB"


# ----------------------------------------------------------------------------------------------
# published sizes


@pytest.mark.parametrize(
    ("name", "config", "expected"),
    [
        ("llama", "llama3-8b", 8_030_261_248),
        ("llama", "llama3-70b", 70_553_706_496),
        ("llama", "llama3-405b", 405_853_388_800),
        ("bert", "bert-base", 109_514_298),  # BertForMaskedLM(bert-base-uncased), decoder tied
        ("bert", "bert-large", 335_174_458),
        ("dlrm", "criteo-kaggle", 33_762_577 * 16 + 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16
         + 367 * 512 + 512 + 512 * 256 + 256 + 256 + 1),
    ],
)
def test_published_parameter_counts(name: str, config: str, expected: int) -> None:
    mod = WORKLOADS[name]
    assert mod.param_count(mod.CONFIGS[config]) == expected


def test_llama3_published_dimensions() -> None:
    widths = {k: llama.CONFIGS[k].hidden_dim for k in ("llama3-8b", "llama3-70b", "llama3-405b")}
    assert widths == {"llama3-8b": 14336, "llama3-70b": 28672, "llama3-405b": 53248}
    for key in widths:
        cfg = llama.CONFIGS[key]
        assert (cfg.vocab_size, cfg.n_kv_heads, cfg.norm_eps, cfg.rope_theta) == (128256, 8, 1e-5, 500000.0)


def test_criteo_kaggle_is_the_reference_architecture() -> None:
    cfg = dlrm.CONFIGS["criteo-kaggle"]
    assert (cfg.num_dense, cfg.num_tables, cfg.embedding_dim, cfg.batch_size) == (13, 26, 16, 128)
    assert sum(cfg.table_sizes) == 33_762_577 and max(cfg.table_sizes) == 10_131_227
    assert (cfg.num_dense, *cfg.bottom_mlp) == (13, 512, 256, 64, 16) and cfg.top_mlp == (512, 256, 1)
    assert cfg.interaction_dim == 367  # 16 + 27 * 26 / 2


@pytest.mark.parametrize("name", ["llama", "dlrm", "bert"])
def test_param_count_matches_the_built_model_for_every_config(name: str) -> None:
    mod = WORKLOADS[name]
    for key, cfg in mod.CONFIGS.items():
        assert mod.param_count(cfg) == _meta_numel(mod, cfg), key


def test_modes_constant() -> None:
    assert MODES == ("train", "infer")
