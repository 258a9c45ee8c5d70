"""Fault injection: seeded bit flips at parameters, module outputs, GEMM outputs and embedding rows,
and :class:`BitFlipMode`, a ``TorchDispatchMode`` that corrupts operator outputs on the device under
test (usable as a Target's mode, ``--inject bitflip:...``).

Unlike pytorchfi (which perturbs values as 8-bit fixed point), flips here act on the real storage
bits (IEEE-754 sign/exponent/mantissa, or integer bits) and every injection returns a
:class:`~.bits.FlipRecord` that reproduces it.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mystique.errors import UsageError

from .bits import FlipRecord, choose_bits, dtype_bits, flip_bits_, flip_random

_CLASSES = ("any", "sign", "exponent", "mantissa", "high", "low")
_FLIPPABLE = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8,
              torch.int16, torch.int32, torch.int64)


def _rng(seed: int, *salt: Any) -> random.Random:
    return random.Random(hash_seed(seed, *salt))


def hash_seed(seed: int, *salt: Any) -> int:
    """A stable 63-bit seed from ``seed`` and salt values (independent of PYTHONHASHSEED)."""
    import hashlib

    h = hashlib.sha256(repr((seed, *salt)).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


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
    backup = None
    with torch.no_grad():
        if bits is not None:
            index = rng.randrange(t.numel()) if index is None else index
            backup = t.reshape(-1)[index].clone() if t.is_contiguous() else None
            orig, new = flip_bits_(t, index, list(bits))
            rec = FlipRecord("parameter", name, index, list(bits), str(t.dtype)[6:], seed, orig, new, "chosen")
        else:
            index = rng.randrange(t.numel()) if index is None else index
            backup = t.reshape(-1)[index].clone() if t.is_contiguous() else None
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
    return FlipRecord("embedding_row", name, index, bits, str(weight.dtype)[6:], seed, orig, new, bit_class,
                      pattern, {"row": row, "col": col})


def flip_tensor(t: torch.Tensor, *, seed: int = 0, site: str = "gemm_output", name: str = "",
                bit_class: str = "any", pattern: str = "single", k: int = 2, salt: Any = 0) -> FlipRecord:
    """Flip bits of a random element of ``t`` in place (a GEMM output or operand)."""
    rng = _rng(seed, site, name, salt)
    return flip_random(t, rng, bit_class=bit_class, pattern=pattern, k=k, site=site, target=name, seed=seed)


# ----------------------------------------------------------------------------- dispatch mode

def _op_matches(func: Any, ops: set[str] | None) -> bool:
    if ops is None:
        return True
    packet = getattr(func, "overloadpacket", func)
    name = getattr(packet, "__name__", str(packet))
    return name in ops or str(func) in ops or f"aten.{name}" in ops


def _aliases_input(func: Any) -> bool:
    """Whether an op returns a view of, or writes into, one of its inputs (a view, an in-place op).

    An ``out=`` variant (``aten.mm.out``) writes its result into the ``out`` argument: that is the
    op's output, produced by the device like any other, so it is not counted as aliasing.
    """
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    if any(getattr(a, "is_out", False) for a in schema.arguments):
        return False
    return any(r.alias_info is not None for r in schema.returns)


class BitFlipMode(TorchDispatchMode):
    """Flip bits in operator outputs on the device under test.

    Each element of each output of a matching operator call is corrupted independently with
    probability ``rate`` (the number of flips per output is drawn from a binomial, their positions
    uniformly). ``bit_class`` (``any``, ``sign``, ``exponent``, ``mantissa``, ...) or explicit
    ``bits`` choose the bits; ``pattern``/``k`` make multi-bit and burst faults. ``ops`` restricts
    to operator names (``{"mm", "addmm"}``); ``calls`` to the 0-based indices of matching calls
    (``{0}``: only the first). Ops whose outputs alias an input (views, in-place) are left alone.
    Every flip is appended to ``records`` as a :class:`FlipRecord` (seeded: the same run flips
    the same bits).
    """

    def __init__(self, rate: float = 1e-6, bits: Sequence[int] | None = None, bit_class: str = "any",
                 seed: int = 0, ops: Sequence[str] | str | None = None, *, calls: Sequence[int] | None = None,
                 pattern: str = "single", k: int = 2, max_flips: int | None = None) -> None:
        super().__init__()
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"bitflip rate must lie in [0, 1], got {rate}")
        if isinstance(ops, str):
            ops = [o for o in ops.replace("+", ",").replace("|", ",").split(",") if o.strip()]
        self.rate = float(rate)
        self.bits = list(bits) if bits is not None else None
        self.bit_class = bit_class
        self.seed = seed
        self.ops = {o.strip() for o in ops} if ops else None
        self.calls = set(calls) if calls is not None else None
        self.pattern = pattern
        self.k = k
        self.max_flips = max_flips
        self.records: list[FlipRecord] = []
        self.matched = 0
        self._gen = torch.Generator().manual_seed(hash_seed(seed, "bitflip"))
        self._rng = random.Random(hash_seed(seed, "bitflip-bits"))
        if bits is None and bit_class not in _CLASSES:
            raise UsageError(f"unknown bit class {bit_class!r}; expected one of {', '.join(_CLASSES)}")

    def _count(self, n: int) -> int:
        # a deterministic binomial draw from our own generator (the global RNG is left untouched)
        if self.rate >= 1.0:
            return n
        if n * self.rate > 50:
            mean = n * self.rate
            sd = (mean * (1 - self.rate)) ** 0.5
            return max(0, round(mean + sd * float(torch.randn(1, generator=self._gen))))
        u = torch.rand(n, generator=self._gen) if n <= 1 << 22 else None
        if u is not None:
            return int((u < self.rate).sum())
        return int(torch.distributions.Binomial(n, torch.tensor(self.rate)).sample())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not _op_matches(func, self.ops) or _aliases_input(func):
            return out
        call = self.matched
        self.matched += 1
        if self.calls is not None and call not in self.calls:
            return out
        if self.max_flips is not None and len(self.records) >= self.max_flips:
            return out
        leaves, _ = tree_flatten(out)
        name = str(getattr(func, "overloadpacket", func))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.dtype in _FLIPPABLE:
                self._corrupt_counted(leaf, name)
        return out

    def _corrupt_counted(self, t: torch.Tensor, name: str) -> None:
        n = t.numel()
        if n == 0:
            return
        count = self._count(n)
        if self.max_flips is not None:
            count = min(count, self.max_flips - len(self.records))
        if count <= 0:
            return
        idx = torch.randperm(n, generator=self._gen)[:count].tolist()
        for i in idx:
            if self.bits is not None:
                bits = [b for b in self.bits if b < dtype_bits(t.dtype)] or [0]
                cls = "chosen"
            else:
                cls = self.bit_class
                try:
                    bits = choose_bits(t.dtype, cls, self.pattern, self.k, self._rng)
                except UsageError:
                    bits = choose_bits(t.dtype, "any", self.pattern, self.k, self._rng)
            orig, new = flip_bits_(t, i, bits)
            self.records.append(FlipRecord("op_output", name, i, bits, str(t.dtype)[6:], self.seed, orig, new,
                                           cls, self.pattern, {"call": self.matched - 1}))


def bitflip_mode(rate: float = 1e-6, bit_class: str = "any", seed: int = 0, ops: str = "", bits: str = "",
                 calls: str = "", pattern: str = "single", k: int = 2) -> BitFlipMode:
    """Registry builder for ``--inject bitflip:rate=..,bit_class=..,seed=..,ops=mm+addmm,bits=30+23,calls=0``.

    List parameters use ``+`` between items (``,`` separates parameters).
    """
    bit_list = [int(b) for b in bits.split("+") if b.strip()] if bits else None
    call_list = [int(c) for c in calls.split("+") if c.strip()] if calls else None
    try:
        return BitFlipMode(rate, bit_list, bit_class, seed, ops or None, calls=call_list, pattern=pattern, k=k)
    except ValueError as exc:
        raise UsageError(f"--inject bitflip: {exc}") from exc
