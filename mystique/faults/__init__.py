"""Fault simulations: dispatch modes that make a healthy device behave like a broken one.

``--inject NAME[:k=v,...]`` activates a registered simulation on the device under test
(``mystique faults`` lists them); each changes only what its summary says. In-place and ``out=``
variants get the faulty result written where the schema says (``Tensor(a!)``); views are never
altered.

* :mod:`.spec`     the registry (:class:`FaultSpec`, :func:`register`, ``--inject`` parameter parsing)
* :mod:`.builtin`  the built-in simulations' entries (a new simulation: its mode here, its entry there)
* :mod:`.schema`   operator-schema helpers, shared with :mod:`mystique.emulation` (``op_name``, ``bind``, ...)
* :mod:`.modes`    :class:`FaultMode`, the base of the simulations
* :mod:`.bits`     the bit-level fault model (bit classes, patterns, :class:`FlipRecord`)
* :mod:`.bitflip`  :class:`BitFlipMode`: ``bitflip`` and the soft-error validator's injections
* :mod:`.numeric`  ``truncating_casts``, ``low_precision_accum``, ``subnormal_flush``
* :mod:`.kernels`  ``stuck_lane``, ``wrong_gelu``, ``nondeterministic_reduction``
* :mod:`.slowness` ``throttle``, ``straggler`` (and the pass-through reference mode)
"""

from .bitflip import DEFAULT_BITFLIP_OPS, BitFlipMode, bitflip, bitflip_mode
from .bits import FlipRecord, bit_classes, choose_bits, flip_bits_, flip_random, hash_seed
from .builtin import BUILTIN
from .kernels import NondeterministicReductionMode, StuckLaneMode, WrongGeluMode, permute_along
from .modes import MATMUL_OPERANDS, MATMUL_OPS, FaultMode, entropy_seed, grouped_parts, matmul_selection
from .numeric import (
    LowPrecisionAccumMode,
    SubnormalFlushMode,
    TruncatingCastMode,
    flush_subnormals,
    low_precision_matmul,
    round_toward_zero_fix,
)
from .slowness import SLOWNESS_FAULTS, PassThroughMode, StragglerMode, ThrottleMode
from .spec import FAULTS, FaultSpec, make_factory, parse_params, register


def load_builtin() -> None:
    """(Re-)register the built-in simulations (after a caller replaced one of the same name)."""
    for spec in BUILTIN:
        register(spec)


load_builtin()

__all__ = [
    "BUILTIN", "DEFAULT_BITFLIP_OPS", "FAULTS", "MATMUL_OPERANDS", "MATMUL_OPS", "BitFlipMode", "FaultMode",
    "FaultSpec", "FlipRecord", "LowPrecisionAccumMode", "NondeterministicReductionMode", "StuckLaneMode",
    "SubnormalFlushMode", "TruncatingCastMode", "WrongGeluMode", "bit_classes", "bitflip", "bitflip_mode",
    "choose_bits", "entropy_seed", "flip_bits_", "flip_random", "flush_subnormals", "grouped_parts", "hash_seed",
    "load_builtin", "low_precision_matmul", "make_factory", "matmul_selection", "parse_params", "permute_along",
    "register", "round_toward_zero_fix",
    "SLOWNESS_FAULTS", "PassThroughMode", "StragglerMode", "ThrottleMode",
]
