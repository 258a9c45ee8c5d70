"""Packed documents: variable-length documents packed into fixed-length sequences, with the
attention mask that keeps each document to itself (document masking).

Long-context training packs documents end to end into each sequence; a token attends only to the
earlier tokens of its own document. The document lengths follow a distribution (``DOC_LENGTHS``):

- ``uniform``: lengths uniform in ``[min, max]``;
- ``longtail``: a long tail, as WLB-LLM (Wang et al., 2025) describes real corpora: most documents
  short, a few as long as the sequence. Lengths are drawn from a Pareto law of exponent ``alpha``
  (``min * U^(-1/alpha)``, capped at ``max``), so the share of tokens in long documents grows as
  ``alpha`` falls.

A sequence is filled by drawing documents until it is full (the last one cut at the sequence's end).
The batch carries ``doc_ids`` (B, S) int64: the document index of each position within its sequence.
:func:`document_mask` turns them into the boolean mask of ``scaled_dot_product_attention`` (True:
attend), causal and within a document (and within an attention chunk for chunked layers).

The mask path (a dense boolean mask, SDPA's math or flash-with-mask kernels) works on every device;
torch's ``flex_attention`` skips fully masked blocks and would save work, but its CPU path compiles
with Inductor, which the replay's eager operators do not reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: the document length distributions a config may name (``none``: one sequence is one document)
DOC_LENGTHS = ("none", "uniform", "longtail")


@dataclass(frozen=True)
class DocLengths:
    """How document lengths are drawn: ``kind`` in :data:`DOC_LENGTHS`, lengths within
    ``[min_len, max_len]`` (``max_len`` 0: the sequence length), ``alpha`` the Pareto exponent of
    ``longtail``."""

    kind: str = "none"
    min_len: int = 16
    max_len: int = 0
    alpha: float = 1.2

    def __post_init__(self) -> None:
        if self.kind not in DOC_LENGTHS:
            raise ValueError(f"unknown document lengths {self.kind!r}; known: {', '.join(DOC_LENGTHS)}")
        if self.min_len < 1 or (self.max_len and self.max_len < self.min_len) or not self.alpha > 0:
            raise ValueError(f"document lengths need 1 <= min_len <= max_len and alpha > 0; got {self}")


def draw_lengths(spec: DocLengths, seq_len: int, generator: torch.Generator) -> list[int]:
    """Document lengths filling one sequence of ``seq_len`` positions (they add up to it)."""
    top = min(spec.max_len or seq_len, seq_len)
    low = min(spec.min_len, top)
    out: list[int] = []
    left = seq_len
    while left > 0:
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if spec.kind == "uniform":
            n = low + int(u * (top - low + 1))
        else:  # longtail: Pareto(alpha) from low, capped at top
            n = int(low * max(1.0 - u, 1e-12) ** (-1.0 / spec.alpha))
        n = max(1, min(n, top, left))
        out.append(n)
        left -= n
    return out


def doc_ids(spec: DocLengths, batch: int, seq_len: int, generator: torch.Generator) -> Tensor:
    """(batch, seq_len) int64: each position's document index within its sequence."""
    rows = []
    for _ in range(batch):
        lengths = draw_lengths(spec, seq_len, generator)
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)))
    return torch.stack(rows)


def document_mask(ids: Tensor | None, seq_len: int, chunk: int | None, device: torch.device) -> Tensor | None:
    """The boolean attention mask (True: attend), (B, 1, S, S) with documents, (S, S) without; None
    when plain causal attention is the same (no documents, no chunk shorter than the sequence)."""
    chunked = chunk is not None and chunk < seq_len
    if ids is None and not chunked:
        return None
    pos = torch.arange(seq_len, device=device)
    mask = pos[:, None] >= pos[None, :]  # (S, S) causal
    if chunked:
        mask = mask & (pos[:, None] // chunk == pos[None, :] // chunk)
    if ids is not None:
        same = ids[:, :, None] == ids[:, None, :]  # (B, S, S)
        mask = (mask & same).unsqueeze(1)  # (B, 1, S, S)
    return mask
