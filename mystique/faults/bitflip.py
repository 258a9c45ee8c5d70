"""Bit flips in operator results on the device under test: one mode, :class:`BitFlipMode`, for the
``--inject bitflip`` simulation and for the soft-error validator's recorded injections.

Each element of each result of a selected operator call is hit with probability ``rate``; which
bits flip follows the bit model of :mod:`.bits`. Two samplers draw the flips:

* recorded (``records=True``, the Python API's default): flips drawn one at a time, each kept as a
  :class:`~.bits.FlipRecord` in ``mode.records``; any bit class, explicit ``bits``, multi-bit and
  burst patterns, integer results too;
* vectorized (``records=False``, ``--inject bitflip``): one draw per result tensor, one bit of the
  chosen IEEE field per hit element, floating results only; only counted, cheap for long runs.

Views are never altered (altering one would alter data an earlier operator produced). With
``in_place`` the in-place variants (``add_``) are corrupted too; ``out=`` variants always are.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from mystique import dtypes
from mystique.errors import UsageError

from .bits import FlipRecord, choose_bits, dtype_bits, flip_bits_, hash_seed
from .modes import FaultMode, entropy_seed
from .schema import base_name, input_storages, is_view, op_name, storage_key, written_args

CLASSES = ("any", "sign", "exponent", "mantissa", "high", "low")
FIELDS = ("sign", "exponent", "mantissa", "any")  # the bit classes of the vectorized sampler
DEFAULT_BITFLIP_OPS = "mm|bmm|addmm|baddbmm|addbmm|mv|addmv|dot|_grouped_mm|convolution"
_FLIPPABLE = (*dtypes.FLOAT_DTYPES, *dtypes.INT_BITS)
_NUMPY_INT = {16: np.int16, 32: np.int32, 64: np.int64}


def _ops_regex(ops: str | Collection[str] | None) -> re.Pattern | None:
    """``ops`` as one pattern: a regular expression (``,`` separates alternatives too) or a collection
    of operator names; None selects every operator."""
    if ops is None or (not isinstance(ops, str) and not ops):
        return None
    text = "|".join(o.strip() for o in ops.split(",") if o.strip()) if isinstance(ops, str) \
        else "|".join(re.escape(o.strip()) for o in ops if o.strip())
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(f"bitflip: ops={ops!r} is not a regular expression: {exc}") from exc


class _RecordedSampler:
    """Flips drawn one by one from seeded generators, each kept as a :class:`FlipRecord`."""

    def __init__(self, mode: BitFlipMode) -> None:
        self.mode = mode
        self.gen = torch.Generator().manual_seed(hash_seed(mode.seed, "bitflip"))
        self.rng = random.Random(hash_seed(mode.seed, "bitflip-bits"))

    def count(self, n: int) -> int:
        """A deterministic binomial draw from our own generator (the global RNG is left untouched)."""
        rate = self.mode.rate
        if rate >= 1.0:
            return n
        if n * rate > 50:
            mean = n * rate
            sd = (mean * (1 - rate)) ** 0.5
            return max(0, round(mean + sd * float(torch.randn(1, generator=self.gen))))
        if n <= 1 << 22:
            return int((torch.rand(n, generator=self.gen) < rate).sum())
        return int(torch.distributions.Binomial(n, torch.tensor(rate)).sample())

    def bits_for(self, dtype: torch.dtype) -> tuple[list[int], str]:
        m = self.mode
        if m.bits is not None:
            return [b for b in m.bits if b < dtype_bits(dtype)] or [0], "chosen"
        try:
            return choose_bits(dtype, m.bit_class, m.pattern, m.k, self.rng), m.bit_class
        except UsageError:  # a class the dtype lacks (an exponent of an integer): any bit
            return choose_bits(dtype, "any", m.pattern, m.k, self.rng), m.bit_class

    def corrupt(self, t: torch.Tensor, name: str, call: int) -> None:
        m = self.mode
        n = t.numel()
        count = self.count(n)
        if m.max_flips is not None:
            count = min(count, m.max_flips - m.flips)
        if count <= 0:
            return
        for i in torch.randperm(n, generator=self.gen)[:count].tolist():
            bits, cls = self.bits_for(t.dtype)
            orig, new = flip_bits_(t, i, bits)
            m.records.append(FlipRecord("op_output", name, i, bits, dtypes.name(t.dtype), m.seed, orig, new,
                                        cls, m.pattern, {"call": call}))
            m.flips += 1


class _VectorSampler:
    """One binomial draw of hit elements per tensor and one bit of the chosen field per hit."""

    def __init__(self, mode: BitFlipMode) -> None:
        self.mode = mode
        self.rng = np.random.default_rng(mode.seed)

    def corrupt(self, t: torch.Tensor, name: str, call: int) -> None:
        m, rng = self.mode, self.rng
        n = t.numel()
        k = int(rng.binomial(n, m.rate))
        if m.max_flips is not None:
            k = min(k, m.max_flips - m.flips)
        if k <= 0:
            return
        positions = rng.choice(n, size=k, replace=False)
        width = dtypes.bits(t.dtype)
        lo, hi = (0, width - 1) if m.bit_class == "any" else dtypes.fields(t.dtype)[m.bit_class]
        bit = rng.integers(lo, hi + 1, size=k).astype(np.int64)
        masks = np.left_shift(np.int64(1), bit).astype(_NUMPY_INT[width])  # bit 63 wraps to int64's sign: wanted
        y = t if t.is_contiguous() else t.contiguous()
        flat = dtypes.int_view(y).view(-1)
        idx = torch.from_numpy(positions.astype(np.int64)).to(t.device)
        flat[idx] = flat[idx] ^ torch.from_numpy(masks).to(t.device)
        if y is not t:
            t.copy_(y)
        m.flips += k


class BitFlipMode(FaultMode):
    """Flip bits in the results of the selected operators on the device under test.

    ``rate``: probability per result element. ``bit_class`` (``any``, ``sign``, ``exponent``,
    ``mantissa``, ``high``, ``low``) or explicit ``bits`` choose the bits; ``pattern``/``k`` make
    multi-bit and burst faults. ``ops``: a regular expression matched in full against the operator
    name (``mm``, ``addmm_``, ``aten.mm.out``; ``,`` also separates alternatives) or a collection of
    names; None selects every operator. ``calls``: the 0-based indices of selected calls to corrupt
    (``{0}``: only the first). ``max_flips`` caps the flips; ``seed`` < 0 draws from OS entropy.
    ``records``, ``in_place`` and ``integers`` pick the sampler and what may be hit (module
    docstring). ``flips`` counts the corrupted elements, ``matched`` the selected calls seen.
    """

    name = "bitflip"

    def __init__(self, rate: float = 1e-6, bits: Collection[int] | None = None, bit_class: str = "any",
                 seed: int = 0, ops: str | Collection[str] | None = None, *, calls: Collection[int] | None = None,
                 pattern: str = "single", k: int = 2, max_flips: int | None = None, records: bool = True,
                 in_place: bool = False, integers: bool = True) -> None:
        super().__init__()
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"bitflip: rate={rate} is not a probability in [0, 1]")
        if bits is None and bit_class not in (CLASSES if records else FIELDS):
            raise UsageError(f"bitflip: unknown bit class {bit_class!r}; expected one of "
                             f"{', '.join(CLASSES if records else FIELDS)}")
        if not records and (bits is not None or pattern != "single" or integers):
            raise UsageError("bitflip: the vectorized sampler flips one bit of a field of floating results")
        self.rate = float(rate)
        self.bits = list(bits) if bits is not None else None
        self.bit_class = bit_class
        self.seed = entropy_seed(seed)
        self.ops = _ops_regex(ops)
        self.calls = set(calls) if calls is not None else None
        self.pattern = pattern
        self.k = k
        self.max_flips = max_flips
        self.in_place = in_place
        self.dtypes = _FLIPPABLE if integers else dtypes.FLOAT_DTYPES
        self.records: list[FlipRecord] = []
        self.flips = 0
        self.matched = 0
        self.sampler = _RecordedSampler(self) if records else _VectorSampler(self)

    def selects(self, func: Any) -> bool:
        """Whether ``func`` is one of the operators to corrupt (views, and in-place ones unless
        ``in_place``, never are)."""
        if self.ops is not None and not any(self.ops.fullmatch(n) for n in (
                op_name(func), base_name(func), str(func.overloadpacket), str(func))):
            return False
        return not is_view(func) and (self.in_place or all(kw_only for _, kw_only in written_args(func)))

    def fault(self, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        if self.rate == 0.0 or not self.selects(func):
            return out
        call = self.matched
        self.matched += 1
        if (self.calls is not None and call not in self.calls) or \
                (self.max_flips is not None and self.flips >= self.max_flips):
            return out
        inputs = None if func._schema.is_mutable else input_storages(args, kwargs)
        name = str(func.overloadpacket)
        for leaf in tree_flatten(out)[0]:
            if self._hittable(leaf) and (inputs is None or storage_key(leaf) not in inputs):
                self.sampler.corrupt(leaf, name, call)
        return out

    def _hittable(self, t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and t.dtype in self.dtypes and t.layout == torch.strided
                and t.device.type != "meta" and t.numel() > 0)


def bitflip(rate: float = 1e-4, bits: str = "any", seed: int = 0, ops: str = DEFAULT_BITFLIP_OPS) -> BitFlipMode:
    """``--inject bitflip:rate=..,bits=sign|exponent|mantissa|any,seed=..,ops=REGEX``: the vectorized
    sampler on floating results, in-place variants included."""
    if bits not in FIELDS:
        raise UsageError(f"--inject bitflip: bits={bits!r} is not one of sign, exponent, mantissa, any")
    try:
        return BitFlipMode(rate, bit_class=bits, seed=seed, ops=ops, records=False, in_place=True, integers=False)
    except UsageError as exc:
        raise UsageError(f"--inject {exc}") from exc


def bitflip_mode(rate: float = 1e-6, bit_class: str = "any", seed: int = 0, ops: str = "", bits: str = "",
                 calls: str = "", pattern: str = "single", k: int = 2) -> BitFlipMode:
    """A recorded-sampler builder for a :class:`~.spec.FaultSpec`
    (``rate=..,bit_class=..,seed=..,ops=mm+addmm,bits=30+23,calls=0``): list parameters use ``+``
    between items (``,`` separates parameters)."""
    def numbers(text: str) -> list[int] | None:
        return [int(b) for b in text.split("+") if b.strip()] if text else None

    try:
        return BitFlipMode(rate, numbers(bits), bit_class, seed, ops.replace("+", ",") or None, calls=numbers(calls),
                           pattern=pattern, k=k)
    except (ValueError, UsageError) as exc:
        raise UsageError(f"--inject {exc}") from exc
