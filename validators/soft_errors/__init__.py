"""Soft-error (silent data corruption) validator: checked operators (ABFT), fault-injection
campaigns, Parameter Vulnerability Factor and SDC screening.

``run(target, level=..., seed=..., groups=..., out_dir=...) -> DataFrame`` and ``groups(level)``
are the validator contract (:mod:`.runner`; each check group in its module of :mod:`.checks`). The
pieces are usable on their own:

* :mod:`.abft`     checked operators -> ``(result, CheckReport)``: ``checked_mm``, ``checked_linear``,
                   ``checked_embedding_bag`` (over a ``checked_table``), ``checked_quantized_embedding_bag``;
                   ``encode_linear`` / ``verify_linear``; ``verify_bag_output``
* :mod:`.exact`    exact integer checksums and the int8 product with kernels every device has
* :mod:`.half`     the device's own bf16/fp16 GEMM: with fp32 output (``mm(out_dtype=float32)``) or rounded
* :mod:`.overhead` interleaved side-by-side timing of the checked paths (the ``overhead`` group)
* :mod:`.protect`  ``protect(model)`` -> Guard (hooks on every Linear/Embedding/EmbeddingBag)
* :mod:`.inject`   seeded flips at injection sites (parameters, module outputs, GEMM outputs, table rows)
* :mod:`.campaign` checkpointed, resumable campaigns and their trial functions
* :mod:`.pvf`, :mod:`.sdc`, :mod:`.stats` PVF trials, SDC screening, Wilson intervals

The bit-level fault model and flips in operator results on the device under test
(``BitFlipMode``) are :mod:`mystique.faults`.
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
from .protect import protect
from .runner import GROUPS, RUNNERS, groups, run
from .stats import wilson

__all__ = [
    "GROUPS", "RUNNERS", "CheckReport", "CheckedTable", "EmbeddingChecks", "QuantizedTable", "checked_embedding_bag",
    "checked_linear", "checked_mm", "checked_quantized_embedding_bag", "checked_table", "encode_linear", "groups",
    "protect", "run", "verify_bag_output", "verify_linear", "wilson",
]
