"""Seeded bit flips at injection sites of the soft-error validator: parameters, module outputs,
GEMM outputs and operands, embedding rows.

Unlike pytorchfi (which perturbs values as 8-bit fixed point), flips here act on the real storage
bits (IEEE-754 sign/exponent/mantissa, or integer bits) and every injection returns a
:class:`~mystique.faults.FlipRecord` that reproduces it. Flips in operator results on the device
under test are :class:`mystique.faults.BitFlipMode`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from mystique import dtypes
from mystique.errors import UsageError
from mystique.faults.bits import FlipRecord, choose_bits, flip_bits_, flip_random, hash_seed

_FLIPPABLE = (*dtypes.FLOAT_DTYPES, *dtypes.INT_BITS)


def _rng(seed: int, *salt: Any) -> random.Random:
    return random.Random(hash_seed(seed, *salt))


@contextlib.contextmanager
def flip_parameter(model: nn.Module, name: str, *, seed: int = 0, bit_class: str = "any",
                   pattern: str = "single", k: int = 2, index: int | None = None,
                   bits: Sequence[int] | None = None) -> Iterator[FlipRecord]:
    """Flip bits of one element of parameter ``name`` for the duration of the block, then restore it."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    if name not in params and name not in buffers:
        raise UsageError(f"model has no parameter or buffer {name!r}")
    t = (params.get(name) if name in params else buffers[name]).data
    rng = _rng(seed, "parameter", name)
    with torch.no_grad():
        index = rng.randrange(t.numel()) if index is None else index
        backup = t.reshape(-1)[index].clone() if t.is_contiguous() else None
        if bits is not None:
            orig, new = flip_bits_(t, index, list(bits))
            rec = FlipRecord("parameter", name, index, list(bits), dtypes.name(t.dtype), seed, orig, new, "chosen")
        else:
            rec = flip_random(t, rng, bit_class=bit_class, pattern=pattern, k=k, site="parameter", target=name,
                              seed=seed, index=index)
    try:
        yield rec
    finally:
        with torch.no_grad():
            if backup is not None:
                t.view(-1)[rec.index] = backup
            else:
                flip_bits_(t, rec.index, rec.bits)


@contextlib.contextmanager
def flip_module_output(module: nn.Module, *, seed: int = 0, bit_class: str = "any", pattern: str = "single",
                       k: int = 2, call: int = 0, name: str = "") -> Iterator[list[FlipRecord]]:
    """Flip bits of one element of ``module``'s output on its ``call``-th forward inside the block.

    Yields the list that receives the :class:`FlipRecord` once the flip happened.
    """
    records: list[FlipRecord] = []
    counter = [0]
    rng = _rng(seed, "module_output", name)

    def hook(mod: nn.Module, inputs: Any, output: Any) -> Any:
        n = counter[0]
        counter[0] += 1
        if n != call:
            return None
        out = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(out, torch.Tensor) or out.dtype not in _FLIPPABLE or out.numel() == 0:
            return None
        with torch.no_grad():
            records.append(flip_random(out.data, rng, bit_class=bit_class, pattern=pattern, k=k,
                                       site="module_output", target=name, seed=seed))
        return None

    handle = module.register_forward_hook(hook, prepend=True)  # before any checker sees the output
    try:
        yield records
    finally:
        handle.remove()


def flip_embedding_row(weight: torch.Tensor, row: int, *, seed: int = 0, bit_class: str = "any",
                       pattern: str = "single", k: int = 2, columns: int | None = None,
                       name: str = "embedding") -> FlipRecord:
    """Flip bits of one element of table row ``row`` in place (``columns`` limits the column range)."""
    rng = _rng(seed, "embedding_row", name, row)
    width = weight.shape[1] if columns is None else columns
    col = rng.randrange(width)
    index = row * weight.shape[1] + col
    bits = choose_bits(weight.dtype, bit_class, pattern, k, rng)
    orig, new = flip_bits_(weight, index, bits)
    return FlipRecord("embedding_row", name, index, bits, dtypes.name(weight.dtype), seed, orig, new, bit_class,
                      pattern, {"row": row, "col": col})


def flip_tensor(t: torch.Tensor, *, seed: int = 0, site: str = "gemm_output", name: str = "",
                bit_class: str = "any", pattern: str = "single", k: int = 2, salt: Any = 0) -> FlipRecord:
    """Flip bits of a random element of ``t`` in place (a GEMM output or operand)."""
    rng = _rng(seed, site, name, salt)
    return flip_random(t, rng, bit_class=bit_class, pattern=pattern, k=k, site=site, target=name, seed=seed)
