"""Bit-level fault model: IEEE-754 and integer bit flips that are exact and reproducible.

A flip views the element's storage as a signed integer of the same width and XORs a mask, so it
works for ``float32``, ``bfloat16``, ``float16``, ``float64``, ``int8``, ``uint8``, ``int16``,
``int32`` and ``int64`` on any device. Bit 0 is the least significant bit.

Bit classes per dtype (:func:`bit_classes`): ``sign``, ``exponent`` and ``mantissa`` for floats;
``sign``, ``high`` (upper half of the value bits) and ``low`` for signed integers; ``high`` and
``low`` for ``uint8``. Patterns: ``single`` (one bit), ``multiple`` (``k`` distinct bits of the
class, anywhere), ``burst`` (``k`` adjacent bits starting inside the class, clipped to the word).
Every injection is described by a :class:`FlipRecord`, enough to reproduce it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mystique import dtypes
from mystique.dtypes import int_view
from mystique.errors import UsageError

PATTERNS = ("single", "multiple", "burst")


def hash_seed(seed: int, *salt: Any) -> int:
    """A stable 63-bit seed from ``seed`` and salt values (independent of PYTHONHASHSEED)."""
    h = hashlib.sha256(repr((seed, *salt)).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def dtype_bits(dtype: torch.dtype) -> int:
    """Width in bits of one element of ``dtype`` (UsageError for dtypes that cannot be flipped)."""
    try:
        return dtypes.bits(dtype)
    except ValueError:
        raise UsageError(f"bit flips are not defined for dtype {dtype}") from None


def bit_classes(dtype: torch.dtype) -> dict[str, list[int]]:
    """Bit positions of each class of ``dtype``, plus ``any`` (all bits)."""
    width = dtype_bits(dtype)
    if dtype in dtypes.FLOAT_LAYOUT:
        classes = {k: list(range(lo, hi + 1)) for k, (lo, hi) in
                   ((k, sorted(v)) for k, v in dtypes.fields(dtype).items())}
    elif dtype == torch.uint8:
        classes = {"high": list(range(4, 8)), "low": list(range(4))}
    else:
        value = width - 1
        half = value // 2
        classes = {"sign": [width - 1], "high": list(range(value - half, value)), "low": list(range(value - half))}
    classes["any"] = list(range(width))
    return classes


def resolve_bit_class(dtype: torch.dtype, bit_class: str) -> list[int]:
    classes = bit_classes(dtype)
    if bit_class not in classes:
        raise UsageError(f"unknown bit class {bit_class!r} for {dtypes.name(dtype)}; "
                         f"expected one of {', '.join(classes)}")
    return classes[bit_class]


def choose_bits(dtype: torch.dtype, bit_class: str = "any", pattern: str = "single", k: int = 2,
                rng: random.Random | None = None) -> list[int]:
    """Bits to flip for one fault: ``pattern`` over ``bit_class`` of ``dtype``; sorted, distinct."""
    rng = rng or random.Random(0)
    pool = resolve_bit_class(dtype, bit_class)
    width = dtype_bits(dtype)
    if pattern == "single":
        return [rng.choice(pool)]
    if k < 1:
        raise UsageError(f"a {pattern} fault needs k >= 1 bits, got {k}")
    if pattern == "multiple":
        return sorted(rng.sample(pool, min(k, len(pool))))
    if pattern == "burst":
        start = rng.choice(pool)
        start = min(start, width - k) if k <= width else 0
        return list(range(start, min(start + k, width)))
    raise UsageError(f"unknown flip pattern {pattern!r}; expected one of {', '.join(PATTERNS)}")


def _signed_mask(bits: list[int], width: int) -> int:
    mask = 0
    for b in bits:
        if not 0 <= b < width:
            raise UsageError(f"bit {b} is outside a {width}-bit word")
        mask |= 1 << b
    return mask - (1 << width) if mask >= 1 << (width - 1) else mask


def flip_bits_(t: torch.Tensor, flat_index: int, bits: list[int]) -> tuple[float, float]:
    """Flip ``bits`` of element ``flat_index`` (row-major over the tensor's shape) in place.

    Works on non-contiguous tensors (the flipped element is the one ``t.reshape(-1)[flat_index]``
    names). Returns ``(original, corrupted)`` as Python numbers.
    """
    if not 0 <= flat_index < t.numel():
        raise UsageError(f"element {flat_index} is outside a tensor of {t.numel()} elements")
    idx = torch.unravel_index(torch.tensor(flat_index), t.shape) if t.dim() else ()
    idx = tuple(int(i) for i in idx)
    elem = t[idx] if idx else t
    original = elem.item()
    mask = _signed_mask(bits, dtype_bits(t.dtype))
    view = int_view(t)
    with torch.no_grad():
        if idx:
            view[idx] = view[idx] ^ mask
        else:
            view.bitwise_xor_(mask)
    corrupted = (t[idx] if idx else t).item()
    return original, corrupted


def flip_value(value: float, dtype: torch.dtype, bits: list[int]) -> float:
    """The value ``value`` (rounded to ``dtype``) would read after flipping ``bits``."""
    t = torch.tensor([value], dtype=dtype)
    return flip_bits_(t, 0, bits)[1]


@dataclass
class FlipRecord:
    """One injected fault, enough to reproduce it: where, which element, which bits, what changed."""

    site: str  # parameter | module_output | gemm_output | gemm_operand | embedding_row | op_output
    target: str  # parameter/module/op name
    index: int  # flat element index
    bits: list[int]
    dtype: str
    seed: int
    original: float
    corrupted: float
    bit_class: str = "any"
    pattern: str = "single"
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.site} {self.target}[{self.index}] bits {self.bits} ({self.bit_class}/{self.pattern}) "
                f"{self.dtype} {self.original!r} -> {self.corrupted!r} seed={self.seed}")


def flip_random(t: torch.Tensor, rng: random.Random, *, bit_class: str = "any", pattern: str = "single",
                k: int = 2, site: str = "tensor", target: str = "", seed: int = 0,
                index: int | None = None) -> FlipRecord:
    """Flip a random element (or ``index``) of ``t`` in place with bits drawn from ``rng``."""
    index = rng.randrange(t.numel()) if index is None else index
    bits = choose_bits(t.dtype, bit_class, pattern, k, rng)
    orig, new = flip_bits_(t, index, bits)
    return FlipRecord(site, target, index, bits, dtypes.name(t.dtype), seed, orig, new, bit_class, pattern)
