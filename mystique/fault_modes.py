"""Built-in fault simulations: dispatch modes that make a healthy device behave like a broken one.

Each simulation is a ``TorchDispatchMode`` registered in :mod:`mystique.faults` (``mystique faults``
lists them; ``--inject NAME[:k=v,...]`` activates one on the device under test). Each changes only
what its summary says; everything else runs untouched.

How the modes compute the faulty result: PyTorch pops a mode off the dispatch-mode stack while its
``__torch_dispatch__`` runs, so plain torch calls made there run on the healthy device (or on the
next mode of the stack) and never re-enter the same mode. In-place and ``out=`` variants are
handled by writing the faulty result into the tensor the schema marks as written (``Tensor(a!)``);
view operators (whose results alias their inputs) are never altered, since altering a view would
alter data an earlier operator already produced.

Simulations and the real failures they imitate:

=========================== =================================================================
``bitflip``                 mercurial cores / silent data corruption at scale
``stuck_lane``              stuck-at fault in one SIMD lane or matrix-unit column
``truncating_casts``        a broken conversion unit rounding toward zero
``low_precision_accum``     reduced-precision accumulators in matrix units
``subnormal_flush``         FTZ/DAZ mode left on
``wrong_gelu``              a wrong library kernel variant (tanh GELU for erf GELU)
``nondeterministic_reduction`` non-deterministic atomics / split-K order in reductions
=========================== =================================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .errors import UsageError
from .faults import FaultSpec, register

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LOW = (torch.float16, torch.bfloat16)
_DTYPES_BY_NAME = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}
# (sign bit, exponent bits, mantissa bits) of each floating format, as bit-index ranges.
_FIELDS = {
    torch.float16: {"sign": (15, 15), "exponent": (10, 14), "mantissa": (0, 9)},
    torch.bfloat16: {"sign": (15, 15), "exponent": (7, 14), "mantissa": (0, 6)},
    torch.float32: {"sign": (31, 31), "exponent": (23, 30), "mantissa": (0, 22)},
    torch.float64: {"sign": (63, 63), "exponent": (52, 62), "mantissa": (0, 51)},
}
# Matrix-multiply family as the dispatcher sees it (linear and matmul decompose into these).
MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot"})
DEFAULT_BITFLIP_OPS = "mm|bmm|addmm|baddbmm|addbmm|mv|addmv|dot|convolution"


# ---------------------------------------------------------------------------------------------
# Schema helpers


def op_name(func: Any) -> str:
    """The operator's name without namespace or overload: ``mm``, ``addmm_``, ``_to_copy``."""
    return func.overloadpacket.__name__


def base_name(func: Any) -> str:
    """The name with an in-place trailing underscore removed (``addmm_`` -> ``addmm``)."""
    name = op_name(func)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Map every schema argument name of ``func`` to the value of this call (defaults filled in)."""
    bound: dict[str, Any] = {}
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    for i, arg in enumerate(positional):
        if i < len(args):
            bound[arg.name] = args[i]
    for arg in func._schema.arguments:
        if arg.name in bound:
            continue
        if arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


def replace_args(func: Any, args: tuple, kwargs: dict, **new: Any) -> tuple[tuple, dict]:
    """Return ``(args, kwargs)`` of the same call with the named arguments replaced."""
    args = list(args)
    kwargs = dict(kwargs)
    positional = [a.name for a in func._schema.arguments if not a.kwarg_only]
    for name, value in new.items():
        if name in positional and positional.index(name) < len(args):
            args[positional.index(name)] = value
        else:
            kwargs[name] = value
    return tuple(args), kwargs


def written_args(func: Any) -> list[tuple[str, bool]]:
    """``(name, kwarg_only)`` of each argument the operator writes (``self`` in place, ``out=``)."""
    return [(a.name, a.kwarg_only) for a in func._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write]


def is_view(func: Any) -> bool:
    """True when a result of the operator aliases an input without writing it (a view)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _is_float(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype in _FLOATS and t.layout == torch.strided
            and t.device.type != "meta" and t.numel() > 0)


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _input_storages(args: tuple, kwargs: dict) -> set[int]:
    keys: set[int] = set()

    def visit(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = _storage_key(x)
            if key:
                keys.add(key)
        return x

    tree_map(visit, (args, kwargs))
    return keys


def map_outputs(func: Any, args: tuple, kwargs: dict, out: Any,
                fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` (tensor -> faulty tensor of the same shape and dtype) to the op's floating results.

    Fresh results are replaced by ``fn``'s result; results that are written inputs (in-place,
    ``out=``) get the faulty values copied into them; results that alias an input without the
    schema saying it is written (views, ``_unsafe_view``) are returned untouched. Returns the
    operator's result with those replacements.
    """
    if is_view(func):
        return out
    mutable = func._schema.is_mutable
    inputs = _input_storages(args, kwargs)

    def one(t: Any) -> Any:
        if not _is_float(t):
            return t
        aliased = _storage_key(t) in inputs
        if aliased and not mutable:
            return t
        faulty = fn(t)
        if faulty is t:
            return t
        if aliased:
            t.copy_(faulty)
            return t
        return faulty

    return tree_map(one, out)


def finish(func: Any, bound: dict[str, Any], value: torch.Tensor) -> torch.Tensor:
    """Deliver a functionally computed faulty ``value`` the way ``func`` would: into its written
    argument (in place or ``out=``, resized as ``out=`` semantics allow) or as a fresh result."""
    written = written_args(func)
    if not written:
        return value
    target = bound[written[0][0]]
    if written[0][1] and target.shape != value.shape:  # out=: resized like the real kernel does
        target.resize_(value.shape)
    target.copy_(value)
    return target


def _entropy_seed(seed: int) -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1 if seed < 0 else seed


class FaultMode(TorchDispatchMode):
    """Base of the built-in simulations: ``fault(func, args, kwargs)`` computes each result."""

    name = "fault"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.fault(func, tuple(args), dict(kwargs or {}))

    def fault(self, func: Any, args: tuple, kwargs: dict) -> Any:  # pragma: no cover - overridden
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# bitflip


class BitFlipMode(FaultMode):
    """Flip random bits in the floating results of the selected operators.

    Each result element is hit with probability ``rate``; the flipped bit is drawn uniformly from
    the chosen field (``sign``, ``exponent``, ``mantissa`` or ``any`` bit) of its format. ``ops``
    is a regular expression matched in full against the operator name (``mm``, ``addmm_``, ...;
    no commas, since ``--inject`` splits parameters on them). ``flips`` counts the bits flipped.
    """

    name = "bitflip"

    def __init__(self, rate: float = 1e-4, bits: str = "any", seed: int = 0, ops: str = DEFAULT_BITFLIP_OPS):
        super().__init__()
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"--inject bitflip: rate={rate} is not a probability in [0, 1]")
        if bits not in ("sign", "exponent", "mantissa", "any"):
            raise UsageError(f"--inject bitflip: bits={bits!r} is not one of sign, exponent, mantissa, any")
        try:
            self.ops = re.compile(ops)
        except re.error as exc:
            raise UsageError(f"--inject bitflip: ops={ops!r} is not a regular expression: {exc}") from exc
        self.rate = rate
        self.bits = bits
        self.seed = seed
        self.rng = np.random.default_rng(_entropy_seed(seed))
        self.flips = 0

    def selects(self, func: Any) -> bool:
        return bool(self.ops.fullmatch(op_name(func)) or self.ops.fullmatch(base_name(func)))

    def fault(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if self.rate == 0.0 or not self.selects(func):
            return out
        return map_outputs(func, args, kwargs, out, self._flip)

    def _flip(self, t: torch.Tensor) -> torch.Tensor:
        n = t.numel()
        k = int(self.rng.binomial(n, self.rate))
        if k == 0:
            return t
        positions = self.rng.choice(n, size=k, replace=False)
        width = t.element_size() * 8
        lo, hi = (0, width - 1) if self.bits == "any" else _FIELDS[t.dtype][self.bits]
        bit = self.rng.integers(lo, hi + 1, size=k).astype(np.int64)
        masks = np.left_shift(np.int64(1), bit)  # bit 63 wraps to the sign bit of int64: wanted
        int_dtype = _INT_VIEW[t.dtype]
        masks = masks.astype({torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64}[int_dtype])
        y = t.clone(memory_format=torch.contiguous_format)
        flat = y.view(int_dtype).view(-1)
        idx = torch.from_numpy(positions.astype(np.int64)).to(t.device)
        flat[idx] = flat[idx] ^ torch.from_numpy(masks).to(t.device)
        self.flips += k
        return y


# ---------------------------------------------------------------------------------------------
# stuck_lane


def _parse_mask(text: str, what: str) -> int:
    if not text:
        return 0
    try:
        value = int(text, 0) if text.lower().startswith(("0x", "0b", "0o")) else int(text, 16)
    except ValueError as exc:
        raise UsageError(f"--inject stuck_lane: {what}={text!r} is not a bit mask (e.g. 0x40000000)") from exc
    if value < 0 or value >= 1 << 64:
        raise UsageError(f"--inject stuck_lane: {what}={text!r} does not fit in 64 bits")
    return value


def _signed(mask: int, width: int) -> int:
    mask &= (1 << width) - 1
    return mask - (1 << width) if mask >= 1 << (width - 1) else mask


class StuckLaneMode(FaultMode):
    """One output lane of matrix-multiply results is stuck.

    Elements whose index along the last dimension is ``lane`` modulo ``width`` read ``value``, or,
    when ``stuck1``/``stuck0`` bit masks are given (hex), have those bits forced to 1/0 instead.
    Only the matmul family (``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``mv``,
    ``addmv``) is affected; scalar results (``dot``) have no lanes and are left alone.
    """

    name = "stuck_lane"

    def __init__(self, lane: int = 3, width: int = 16, value: float = 0.0, stuck1: str = "", stuck0: str = ""):
        super().__init__()
        if width < 1:
            raise UsageError(f"--inject stuck_lane: width={width} must be at least 1")
        if not 0 <= lane < width:
            raise UsageError(f"--inject stuck_lane: lane={lane} must be in [0, width={width})")
        self.lane = lane
        self.width = width
        self.value = value
        self.stuck1 = _parse_mask(stuck1, "stuck1")
        self.stuck0 = _parse_mask(stuck0, "stuck0")

    def fault(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if base_name(func) not in MATMUL_OPS:
            return out
        return map_outputs(func, args, kwargs, out, self._stick)

    def _stick(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[-1] <= self.lane:
            return t
        y = t.clone()
        lanes = y[..., self.lane::self.width]
        if self.stuck1 or self.stuck0:
            width = t.element_size() * 8
            bits = lanes.view(_INT_VIEW[t.dtype])
            if self.stuck1:
                bits.bitwise_or_(_signed(self.stuck1, width))
            if self.stuck0:
                bits.bitwise_and_(_signed(~self.stuck0, width))
        else:
            lanes.fill_(self.value)
        return y


# ---------------------------------------------------------------------------------------------
# truncating_casts


def round_toward_zero_fix(rounded: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Turn a round-to-nearest conversion ``rounded`` of ``source`` into round-toward-zero.

    Where the rounded magnitude exceeds the source's, the result steps one ulp toward zero
    (the bit pattern of a non-zero float minus one; infinity becomes the largest finite value).
    NaNs and exact conversions are unchanged. Returns a new tensor in ``rounded``'s dtype.
    """
    wide = torch.promote_types(rounded.dtype, source.dtype)
    src = source.to(device=rounded.device, dtype=wide)
    if src.shape != rounded.shape:
        src = src.expand(rounded.shape)
    away = rounded.to(wide).abs() > src.abs()
    int_dtype = _INT_VIEW[rounded.dtype]
    stepped = (rounded.contiguous().view(int_dtype) - 1).view(rounded.dtype)
    return torch.where(away, stepped, rounded)


class TruncatingCastMode(FaultMode):
    """Float conversions into ``dtypes`` round toward zero instead of to nearest even.

    Covers the explicit conversions the dispatcher sees: ``_to_copy`` (``.to``, ``.half()``,
    ``.bfloat16()``, ``type_as``), ``to`` and ``copy``/``copy_`` into a tensor of the lower
    dtype, including their ``out=`` forms. Conversions from integer types and all arithmetic are
    untouched.
    """

    name = "truncating_casts"
    _SOURCE_ARG = {"_to_copy": "self", "to": "self", "copy": "src", "copy_": "src"}

    def __init__(self, dtypes: str = "bfloat16+float16"):
        super().__init__()
        names = [d.strip() for d in dtypes.replace("+", ",").split(",") if d.strip()]
        bad = [d for d in names if d not in _DTYPES_BY_NAME]
        if bad or not names:
            raise UsageError(f"--inject truncating_casts: dtypes={dtypes!r}: expected bfloat16 and/or float16 "
                             "(joined with +)")
        self.dtypes = {_DTYPES_BY_NAME[d] for d in names}

    def fault(self, func, args, kwargs):
        out = func(*args, **kwargs)
        source_arg = self._SOURCE_ARG.get(op_name(func))
        if source_arg is None or not isinstance(out, torch.Tensor) or out.dtype not in self.dtypes:
            return out
        source = bind(func, args, kwargs).get(source_arg)
        if not _is_float(source) or source.dtype == out.dtype or out.numel() == 0:
            return out
        fixed = round_toward_zero_fix(out, source)
        if func._schema.is_mutable:
            out.copy_(fixed)
            return out
        return fixed


# ---------------------------------------------------------------------------------------------
# low_precision_accum


def low_precision_matmul(a: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
    """``a @ b`` (``(..., M, K) @ (..., K, N)``) with a low-precision accumulator.

    Each K-chunk of ``chunk`` products is summed in float32 (as one matrix-unit step does), then
    added to an accumulator that is rounded to ``a.dtype`` after every partial sum. Returns the
    accumulator in ``a.dtype``.
    """
    low = a.dtype
    k = a.shape[-1]
    acc = None
    for start in range(0, k, chunk):
        part = torch.matmul(a[..., start:start + chunk].float(), b[..., start:start + chunk, :].float())
        acc = part.to(low) if acc is None else (acc.float() + part).to(low)
    if acc is None:
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        acc = torch.zeros(shape, dtype=low, device=a.device)
    return acc


def _scaled_sum(bias: torch.Tensor, product: torch.Tensor, beta: Any, alpha: Any, low: torch.dtype) -> torch.Tensor:
    """``beta * bias + alpha * product`` in float32, rounded once to ``low`` (``bias`` ignored when beta is 0)."""
    value = product.float() * alpha if alpha != 1 else product.float()
    if beta != 0:
        value = value + bias.float() * beta
    return value.to(low)


class LowPrecisionAccumMode(FaultMode):
    """bf16/fp16 matrix multiplies accumulate in the low dtype instead of float32.

    ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``mv``, ``addmv`` and ``dot`` (and so
    ``linear``/``matmul``, which decompose into them) whose operands are float16 or bfloat16 are
    computed with :func:`low_precision_matmul` (partial sums of ``chunk`` products, the
    accumulator rounded to the operand dtype after each). Float32/64 multiplies are untouched.
    """

    name = "low_precision_accum"

    def __init__(self, chunk: int = 16):
        super().__init__()
        if chunk < 1:
            raise UsageError(f"--inject low_precision_accum: chunk={chunk} must be at least 1")
        self.chunk = chunk

    def fault(self, func, args, kwargs):
        name = base_name(func)
        if name not in MATMUL_OPS or name == "vdot":
            return func(*args, **kwargs)
        b = bind(func, args, kwargs)
        value = self._compute(name, b)
        if value is None:
            return func(*args, **kwargs)
        out_dtype = b.get("out_dtype")  # mm(a, b, out_dtype=float32): the low accumulator, a wider result
        if isinstance(out_dtype, torch.dtype) and value.dtype != out_dtype:
            value = value.to(out_dtype)
        return finish(func, b, value)

    def _compute(self, name: str, b: dict[str, Any]) -> torch.Tensor | None:
        operands = {
            "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"),
            "baddbmm": ("batch1", "batch2"), "addbmm": ("batch1", "batch2"), "mv": ("self", "vec"),
            "addmv": ("mat", "vec"), "dot": ("self", "tensor"),
        }[name]
        x, y = b[operands[0]], b[operands[1]]
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.dtype not in _LOW or y.dtype != x.dtype:
            return None
        low, c = x.dtype, self.chunk
        if name in ("mm", "bmm", "addmm", "baddbmm"):
            prod = low_precision_matmul(x, y, c)
        elif name == "addbmm":  # sum over the batch is part of the same reduction
            nb, m, k = x.shape
            prod = low_precision_matmul(x.transpose(0, 1).reshape(m, nb * k), y.reshape(nb * k, y.shape[-1]), c)
        elif name in ("mv", "addmv"):
            prod = low_precision_matmul(x, y.unsqueeze(-1), c).squeeze(-1)
        else:  # dot
            prod = low_precision_matmul(x.unsqueeze(0), y.unsqueeze(-1), c).reshape(())
        if name in ("addmm", "baddbmm", "addbmm", "addmv"):  # beta * self (broadcast) + alpha * product
            return _scaled_sum(b["self"], prod, b["beta"], b["alpha"], low)
        return prod


# ---------------------------------------------------------------------------------------------
# subnormal_flush

# Operators that move or create data without floating arithmetic: FTZ/DAZ hardware does not
# flush loads, stores, copies, indexing or constant fills.
_DATA_MOVEMENT = frozenset({
    "clone", "copy", "copy_", "_copy_from", "_copy_from_and_resize", "contiguous", "detach", "alias",
    "lift_fresh", "lift_fresh_copy", "_unsafe_view", "cat", "stack", "index", "index_select", "gather",
    "scatter", "index_put", "index_put_", "index_copy", "masked_select", "masked_scatter", "take",
    "slice_scatter", "select_scatter", "as_strided_scatter", "constant_pad_nd", "flip", "roll", "repeat",
    "expand_copy", "permute_copy", "t_copy", "transpose_copy", "view_copy", "unsqueeze_copy", "squeeze_copy",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "fill", "fill_", "zero_", "scalar_tensor",
    "_local_scalar_dense", "item", "set_", "resize_", "resize_as_", "randn", "rand", "randn_like", "rand_like",
    "normal", "normal_", "uniform_", "randint", "randperm", "bernoulli", "bernoulli_", "arange", "linspace",
    "tril", "triu", "diag_embed", "split_with_sizes_copy", "unbind_copy", "_to_dense", "to",
})


def _subnormal_mask(t: torch.Tensor) -> torch.Tensor:
    return (t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)


def flush_subnormals(t: torch.Tensor) -> torch.Tensor:
    """``t`` with subnormal values replaced by zeros of the same sign; ``t`` itself when it has none."""
    mask = _subnormal_mask(t)
    if not bool(mask.any()):
        return t
    return torch.where(mask, t * 0, t)


class SubnormalFlushMode(FaultMode):
    """Flush-to-zero (results) and denormals-are-zero (inputs) on floating arithmetic.

    With ``outputs`` (FTZ) subnormal results of floating operators become zero; with ``inputs``
    (DAZ) subnormal operands are read as zero. Data movement (copies, views, indexing, fills,
    random generation, same-dtype ``_to_copy``) is untouched, as it is on real hardware; a
    conversion to another dtype flushes.
    """

    name = "subnormal_flush"

    def __init__(self, inputs: bool = True, outputs: bool = True):
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs

    def _applies(self, func: Any, args: tuple, kwargs: dict) -> bool:
        name = op_name(func)
        if is_view(func) or name in _DATA_MOVEMENT:
            return False
        if name == "_to_copy":
            dtype = kwargs.get("dtype")
            return dtype is not None and isinstance(args[0], torch.Tensor) and dtype != args[0].dtype
        return True

    def fault(self, func, args, kwargs):
        if not self._applies(func, args, kwargs):
            return func(*args, **kwargs)
        if self.inputs:
            args, kwargs = self._flush_inputs(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.outputs:
            out = map_outputs(func, args, kwargs, out, flush_subnormals)
        return out

    def _flush_inputs(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        written = written_args(func)
        in_place = {name for name, kw_only in written if not kw_only}
        out_args = {name for name, kw_only in written if kw_only}
        b = bind(func, args, kwargs)
        new: dict[str, Any] = {}
        for name, value in b.items():
            if name in out_args:
                continue
            if name in in_place:
                if _is_float(value):
                    flushed = flush_subnormals(value)
                    if flushed is not value:
                        value.copy_(flushed)  # read-modify-write of the in-place operand
                continue
            replaced = tree_map(lambda x: flush_subnormals(x) if _is_float(x) else x, value)
            if replaced is not value and _differs(replaced, value):
                new[name] = replaced
        return replace_args(func, args, kwargs, **new) if new else (args, kwargs)


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is not b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return any(_differs(x, y) for x, y in zip(a, b))
    return False


# ---------------------------------------------------------------------------------------------
# wrong_gelu


class WrongGeluMode(FaultMode):
    """Exact (erf) GELU is computed with the tanh approximation.

    ``aten.gelu`` (functional, in place and ``out=``) called with ``approximate='none'`` runs
    with ``approximate='tanh'``; with ``backward`` (default) so does ``aten.gelu_backward``, as a
    library that ships only the tanh kernel would do. Calls that already ask for tanh are
    unchanged.
    """

    name = "wrong_gelu"

    def __init__(self, backward: bool = True):
        super().__init__()
        self.backward = backward

    def fault(self, func, args, kwargs):
        name = base_name(func)
        if name == "gelu" or (self.backward and name == "gelu_backward"):
            if kwargs.get("approximate", "none") == "none":
                kwargs = {**kwargs, "approximate": "tanh"}
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# nondeterministic_reduction

_REDUCTIONS = frozenset({"sum", "mean", "nansum"})
# name -> (operand whose last dim is K, operand whose K dim is -2 (or -1 for a vector))
_MATMUL_K = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"),
    "baddbmm": ("batch1", "batch2"), "addbmm": ("batch1", "batch2"), "mv": ("self", "vec"),
    "addmv": ("mat", "vec"), "dot": ("self", "tensor"), "vdot": ("self", "other"),
}


def permute_along(t: torch.Tensor, dims: Iterable[int], perm: torch.Tensor) -> torch.Tensor:
    """``t`` with its elements permuted jointly over ``dims`` (flattened) by ``perm``; same shape."""
    dims = sorted({d % t.dim() for d in dims})
    end = list(range(t.dim() - len(dims), t.dim()))
    moved = t.movedim(dims, end)
    flat = moved.reshape(*moved.shape[: t.dim() - len(dims)], -1)
    shuffled = flat.index_select(-1, perm.to(t.device)).reshape(moved.shape)
    return shuffled.movedim(end, dims)


class NondeterministicReductionMode(FaultMode):
    """Reductions add their terms in a random order, drawn anew for every call.

    ``sum``, ``mean`` and ``nansum`` (all their overloads, ``out=`` included) reduce a copy of the
    input whose elements are shuffled over the reduced dimensions; the matmul family shuffles
    its K dimension. The mathematical result is the same; the rounding, and so the last bits,
    change from call to call. ``seed=-1`` (default) draws the orders from OS entropy, so runs
    differ too; any other seed makes the sequence of orders reproducible.
    """

    name = "nondeterministic_reduction"

    def __init__(self, seed: int = -1):
        super().__init__()
        self.seed = seed
        self.gen = torch.Generator().manual_seed(_entropy_seed(seed))

    def _perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)

    def fault(self, func, args, kwargs):
        name = base_name(func)
        if name in _REDUCTIONS:
            b = bind(func, args, kwargs)
            x = b["self"]
            if _is_float(x) and x.dim() > 0:
                dims = b.get("dim")
                dims = list(range(x.dim())) if not dims else ([dims] if isinstance(dims, int) else list(dims))
                if all(isinstance(d, int) for d in dims):
                    n = 1
                    for d in dims:
                        n *= x.shape[d]
                    if n > 1:
                        args, kwargs = replace_args(func, args, kwargs, self=permute_along(x, dims, self._perm(n)))
        elif name in _MATMUL_K:
            b = bind(func, args, kwargs)
            first, second = _MATMUL_K[name]
            x, y = b[first], b[second]
            if _is_float(x) and _is_float(y) and x.shape[-1] > 1:
                perm = self._perm(x.shape[-1]).to(x.device)
                y_dim = -2 if y.dim() >= 2 else -1
                args, kwargs = replace_args(func, args, kwargs, **{
                    first: x.index_select(-1, perm), second: y.index_select(y_dim, perm)})
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# Registry

register(FaultSpec(
    name="bitflip",
    summary="random bit flips (rate per element; bits sign|exponent|mantissa|any) in floating results "
            "of the ops matching the regex ops (default: matmul family and convolution)",
    imitates="mercurial cores: silent data corruption at scale (Meta, Dixit et al. 2021; Google, Hochschild "
             "et al. 2021 'Cores that don't count'), defective execution units that flip result bits without "
             "any error being raised; also particle-strike soft errors in unprotected datapath latches",
    build=BitFlipMode,
    params={"rate": 1e-4, "bits": "any", "seed": 0, "ops": DEFAULT_BITFLIP_OPS},
))
register(FaultSpec(
    name="stuck_lane",
    summary="matmul-family results at last-dim index = lane mod width read value "
            "(or have the hex bit masks stuck1/stuck0 forced to 1/0)",
    imitates="a stuck-at fault in one SIMD lane or one matrix-unit output column (a manufacturing defect or "
             "wear-out that escaped test): every result that lane produces is fixed or has a bit stuck, "
             "the other lanes are right",
    build=StuckLaneMode,
    params={"lane": 3, "width": 16, "value": 0.0, "stuck1": "", "stuck0": ""},
))
register(FaultSpec(
    name="truncating_casts",
    summary="float conversions to bfloat16/float16 (_to_copy, to, copy_) round toward zero instead of to "
            "nearest even (dtypes: bfloat16+float16)",
    imitates="a broken conversion unit (F2F/cvt) or a wrong rounding-mode default in firmware or a "
             "conversion kernel: every low-precision value is biased toward zero by half an ulp on average",
    build=TruncatingCastMode,
    params={"dtypes": "bfloat16+float16"},
))
register(FaultSpec(
    name="low_precision_accum",
    summary="bf16/fp16 mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot (and so linear/matmul) accumulate in "
            "the low dtype: partial sums of chunk products rounded to it after each",
    imitates="reduced-precision accumulators: early tensor cores and matrix units with fp16 accumulation, "
             "FP8 tensor cores keeping about 14 accumulator bits, or a library picking a reduced-precision "
             "reduction kernel; the error grows with K instead of staying one output rounding",
    build=LowPrecisionAccumMode,
    params={"chunk": 16},
))
register(FaultSpec(
    name="subnormal_flush",
    summary="FTZ/DAZ: subnormal results (outputs) and operands (inputs) of floating arithmetic read as zero",
    imitates="flush-to-zero / denormals-are-zero mode left on (MXCSR FTZ/DAZ set by code built with "
             "-ffast-math, GPU kernels built with -ftz=true): tiny gradients, variances and softmax tails "
             "vanish",
    build=SubnormalFlushMode,
    params={"inputs": True, "outputs": True},
))
register(FaultSpec(
    name="wrong_gelu",
    summary="exact erf GELU (aten.gelu approximate='none', and its backward) computed with the tanh "
            "approximation",
    imitates="a wrong library kernel variant: a fused or vendor kernel that implements only tanh-GELU "
             "dispatched for erf-GELU, a silent error of up to about 5e-4 per activation",
    build=WrongGeluMode,
    params={"backward": True},
))
register(FaultSpec(
    name="nondeterministic_reduction",
    summary="sum, mean, nansum and matmul-family K reductions add their terms in a random order drawn per "
            "call (seed=-1: from OS entropy), so results vary in the last bits",
    imitates="non-deterministic reductions: atomicAdd-based or split-K kernels whose summation order depends "
             "on thread scheduling, so repeated runs disagree bitwise (what torch.use_deterministic_algorithms "
             "guards against)",
    build=NondeterministicReductionMode,
    params={"seed": -1},
))
