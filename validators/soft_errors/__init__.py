"""Soft-error (silent data corruption) validator: checked operators (ABFT), bit-flip fault
injection, statistical campaigns, Parameter Vulnerability Factor and SDC screening.

``run(target, level=..., seed=..., groups=..., out_dir=...) -> DataFrame`` and ``groups(level)``
are the validator contract; the pieces are usable on their own:

* :mod:`.abft`     ``checked_mm``, ``checked_linear``, ``checked_embedding_bag`` (over a
                   ``checked_table``), ``checked_quantized_embedding_bag`` -> ``(result, CheckReport)``;
                   ``encode_linear`` / ``verify_linear`` (a Linear's weight side encoded once);
                   ``verify_bag_output`` (any EmbeddingBag output against ``EmbeddingChecks``)
* :mod:`.exact`    exact integer checksums and the int8 product with kernels every device has
                   (elementwise products, int64-accumulated sums, ``_int_mm`` padded to CUDA's shapes)
* :mod:`.half`     the device's own bf16/fp16 GEMM: with fp32 output (``mm(out_dtype=float32)``) or rounded
* :mod:`.overhead` interleaved side-by-side timing of the checked paths (the ``overhead`` group)
* :mod:`.protect`  ``protect(model)`` -> Guard (hooks on every Linear/Embedding/EmbeddingBag)
* :mod:`.bits`     exact bit flips and bit classes per dtype
* :mod:`.inject`   injection sites and ``BitFlipMode`` (a TorchDispatchMode)
* :mod:`.campaign` checkpointed, resumable campaigns
* :mod:`.stats`    Wilson intervals
"""

from .abft import (
    CheckedTable,
    CheckReport,
    EmbeddingChecks,
    QuantizedTable,
    checked_embedding_bag,
    checked_linear,
    checked_mm,
    checked_quantized_embedding_bag,
    checked_table,
    encode_linear,
    verify_bag_output,
    verify_linear,
)
from .bits import FlipRecord, bit_classes, flip_bits_
from .inject import BitFlipMode, bitflip_mode
from .protect import protect
from .runner import GROUPS, groups, run
from .stats import wilson

__all__ = [
    "GROUPS", "BitFlipMode", "CheckReport", "CheckedTable", "EmbeddingChecks", "FlipRecord", "QuantizedTable",
    "bit_classes", "bitflip_mode", "checked_embedding_bag", "checked_linear", "checked_mm",
    "checked_quantized_embedding_bag", "checked_table", "encode_linear", "flip_bits_", "groups", "protect", "run",
    "verify_bag_output", "verify_linear", "wilson",
]
