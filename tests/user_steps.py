"""Step functions of a user's own, named as ``user_steps:NAME`` capture targets in tests."""

from __future__ import annotations

import torch


def tiny_mlp():
    """A two-layer MLP training step with AdamW (foreach implementation)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(16, 32)
    y = torch.randint(0, 8, (16,))

    def step() -> float:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().item()

    return step


def hf_gpt2_train():
    """A `transformers` GPT-2 (random weights, tiny config) training step: a model we did not write."""
    return gpt2_train_step((2, 16), n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=32)


def gpt2_train_step(tokens: tuple[int, int], **config):
    """A `transformers` GPT-2 training step of ``GPT2Config(**config)`` (random weights, seed 0) on a
    ``tokens`` = (batch, sequence) batch of random ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(**config)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, tokens)

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def not_a_step():
    return 42


def broken_factory():
    raise RuntimeError("the user's factory failed")
