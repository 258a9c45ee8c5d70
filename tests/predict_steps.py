"""Steps of models we did not write, built from `transformers` configs, and a step of 10,000 small
operators: capture targets (``predict_steps:NAME``, with ``tests/`` on the path) of the `mystique
predict` figures and slow tests (issue #35)."""

from __future__ import annotations

import torch


def hf_gpt2_train():
    """A `transformers` GPT-2 training step (4 layers, width 256, 4 x 128 tokens; random weights)."""
    from user_steps import gpt2_train_step

    return gpt2_train_step((4, 128), n_layer=4, n_head=4, n_embd=256, vocab_size=2048, n_positions=128)


def hf_bert_infer():
    """A `transformers` BERT encoder forward (4 layers, width 256, 8 x 128 tokens; random weights, eval)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                     vocab_size=2048, max_position_embeddings=128)
    model = BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (8, 128))

    def step():
        with torch.no_grad():
            return model(input_ids=ids).last_hidden_state

    return step


def many_ops():
    """10,000 small operators per step (2,500 x add, mul, relu, sum): the size target of predict."""
    x = torch.randn(64, 64)

    def step():
        y = x
        for _ in range(2500):
            y = torch.relu(y * 0.5 + x)
            y.sum()
        return y

    return step
