"""`generate --batch-scale` (and `predict --batch-scale`) on steps shaped like the reference captures
(issue #35): size lists that follow their inputs, heads as many as the batch, a transposed attention
output viewed back, a loss whose saved activation the trace holds as an input."""

from __future__ import annotations

import pytest
import torch
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.replay.batch_scale import expand_sizes, grad_sizes, infer_batch, rescale_batch, view_sizes

# --- size lists, alone ----------------------------------------------------------------------------------


def test_a_split_into_as_many_heads_as_the_batch_scales_the_batch_and_keeps_the_heads():
    assert view_sizes([8, 128, 8, 32], [8, 128, 256], [16, 128, 256]) == [16, 128, 8, 32]


def test_a_merge_of_batch_and_sequence_and_its_split_back_scale_the_batch_part():
    assert view_sizes([1024, 256], [8, 128, 256], [16, 128, 256]) == [2048, 256]
    assert view_sizes([8, 128, 256], [1024, 256], [2048, 256]) == [16, 128, 256]
    assert view_sizes([-1, 2048], [4, 128, 2048], [8, 128, 2048]) == [-1, 2048]  # -1 absorbs it


def test_a_view_of_an_input_that_kept_its_shape_keeps_its_sizes_even_where_one_equals_the_batch():
    assert view_sizes([8, 32], [256], [256]) == [8, 32]


def test_a_list_that_does_not_hold_the_inputs_elements_is_not_resolved():
    assert view_sizes([3, 5], [8, 2], [16, 2]) is None and view_sizes([-1, -1], [4], [8]) is None


@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.lists(st.integers(1, 6), min_size=0, max_size=3),
       st.integers(2, 3), st.data())
@examples(60)
def test_a_resolved_view_holds_the_scaled_inputs_elements(rest, split, k, data):
    """Law: whatever the list (the input's dims regrouped), its resolution holds exactly the elements of
    the input with its leading dim scaled by k."""
    old_in = [4] + rest
    new_in = [4 * k] + rest
    flat = old_in[:]
    cut = data.draw(st.integers(0, len(flat)))
    sizes = flat[:cut] + [int(torch.tensor(flat[cut:]).prod())] if cut < len(flat) else flat  # merge a tail
    got = view_sizes(sizes, old_in, new_in)
    assert got is not None
    n_new = 1
    for d in new_in:
        n_new *= d
    prod = 1
    for d in got:
        prod *= d
    assert prod == n_new


def test_expand_follows_its_input_and_takes_a_new_leading_batch():
    assert expand_sizes([8, 1, 128, 128], [8, 1, 1, 128], [16, 1, 1, 128], 8, 16) == [16, 1, 128, 128]
    assert expand_sizes([8, 128], [1, 128], [1, 128], 8, 16) == [16, 128]  # position ids broadcast over the batch
    assert expand_sizes([8, -1, 64], [8, 8, 64], [8, 8, 64], 8, 16) == [8, -1, 64]  # an input that kept its 8s


def test_a_backward_ops_input_sizes_follow_the_gradient_and_keep_the_selected_dim():
    assert grad_sizes([8, 128, 256], [8, 127, 256], [16, 127, 256], 1) == [16, 128, 256]  # slice_backward
    assert grad_sizes([8, 4, 256], [8, 256], [16, 256], 1) == [16, 4, 256]  # select_backward at dim 1


# --- whole steps ----------------------------------------------------------------------------------------


class _Attention(torch.nn.Module):
    """As many heads as the batch, a transposed attention output viewed back, a cross-entropy loss, and
    two integer buffers with a leading unit dim (position and token-type ids, as `transformers` keeps)."""

    def __init__(self, heads=4, width=16, vocab=40, seq=8):
        super().__init__()
        self.heads, self.width = heads, width
        self.emb = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(seq, width)
        self.typ = torch.nn.Embedding(2, width)
        self.register_buffer("pos_ids", torch.arange(seq)[None])
        self.register_buffer("typ_ids", torch.zeros(1, seq, dtype=torch.long))
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids) + self.pos(self.pos_ids) + self.typ(self.typ_ids)
        q, k, v = self.qkv(x).split(self.width, dim=-1)
        q, k, v = (t.view(b, n, self.heads, self.width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, self.width)
        return self.out(y)


def attention_train_step():
    """A training step of :class:`_Attention` on a batch of 4 sequences of 8 tokens (4 heads)."""
    torch.manual_seed(0)
    m = _Attention()
    ids = torch.randint(0, 40, (4, 8))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        logits = m(ids)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1))
        loss.backward()
        opt.step()

    return step


def attention_infer_step():
    torch.manual_seed(0)
    m = _Attention().eval()
    ids = torch.randint(0, 40, (4, 8))

    def step():
        with torch.no_grad():
            return m(ids)

    return step


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    from mystique.capture import capture

    root = tmp_path_factory.mktemp("bscale")
    return {mode: capture(f"test_batch_scale:attention_{mode}_step", root / mode, steps=1, warmup=0)
            for mode in ("train", "infer")}


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_an_attention_step_with_as_many_heads_as_its_batch_doubles_its_batch_and_replays(captures, mode):
    from mystique.replay.plan import plan_from_path
    from mystique.replay.runtime import Executor

    plan, _ = plan_from_path(captures[mode])
    assert infer_batch(plan) == 4
    big = rescale_batch(plan, 2.0)
    assert big.metadata["batch_size"] == 8
    old = {t["id"]: t["shape"] for t in plan.tensors}
    growth = {int(torch.Size(t["shape"]).numel() / max(torch.Size(old[t["id"]]).numel(), 1)) for t in big.tensors
              if torch.Size(old[t["id"]]).numel()}
    assert growth <= {1, 2}  # twice the batch: no tensor more than twice as large (attention's saved [B, H, L] too)
    views = [op["args"][1] for op in big.ops if op["name"] == "aten::view" and len(op["args"][1]) == 4]
    assert views and all(v == [8, 8, 4, 4] for v in views)  # batch 8, heads still 4
    e = Executor(big.data, "cpu")
    e.run_iteration(probe=True)
    assert [s.name for s in e.status if s.state == "skipped"] == []
