"""Checked operators (algorithm-based fault tolerance): GEMM, Linear and EmbeddingBag with checksums.

Each checked call returns ``(result, CheckReport)``: checksums of the result are compared with a
reference computed from the operands, within a bound of the rounding error of a clean run.

* GEMM (:mod:`.gemm`, encodings in :mod:`.encoding`): ``C W`` against ``A (B W)`` with two weighted
  row checksums (ones and a +-1 pattern); the bound is a probabilistic dot-product bound on the norm
  products plus a deterministic one for same-sign data (:func:`.encoding.gemm_constants`). Columns
  are checked as well after an alarm, to locate it. bf16/fp16 are checked on the fp32 accumulator;
  int8 exactly, with int64 checksums.
* Linear (:mod:`.linear`): the GEMM check with the weight side encoded once per weight version.
* EmbeddingBag (:mod:`.embedding_bag`, fp32 and 8-bit row-wise tables in :mod:`.quantized`): each
  bag's output sum against the bag pooled over per-row checksums, within the gamma bound of the
  summation (:func:`.bag_verdict.verify_bag_output`); on the CPU the lookup itself is a fused
  compiled kernel that checks in the same pass (:mod:`.fused_lookup`). Per-sample weights, a padding
  index and offsets with the last bag's end as torch's; max pooling (not linear) is refused.
* FBGEMM: one inference table (:mod:`.fbgemm`) and whole table-batched modules (:mod:`.tbe`).

On the CPU with Numba the checksums and the verdicts are computed by the compiled kernels of
:mod:`.._kernels`; elsewhere by torch and NumPy operations, with the same verdicts.
"""

from .bag_verdict import Bags, CompiledBags, EmbeddingChecks, bags_args, verify_bag_output
from .embedding_bag import CheckedTable, checked_embedding_bag, checked_quantized_embedding_bag, checked_table
from .encoding import CHECK_VECTORS, GemmEncoding, RowChecks, check_weights, encode_gemm, gemm_factor
from .fused_layout import fused_table
from .fused_lookup import FusedCall, fused_lookups_agree
from .gemm import accumulate, checked_mm, half_kind, prime, verify_gemm
from .linear import CompiledLinear, LinearEncoding, checked_linear, encode_linear, verify_linear
from .quantized import QuantizedTable, quantized_embedding_bag
from .report import EMBEDDING_LAMBDA, GEMM_LAMBDA, UNIT_ROUNDOFF, CheckReport, describe_thresholds

__all__ = [
    "CHECK_VECTORS", "EMBEDDING_LAMBDA", "GEMM_LAMBDA", "UNIT_ROUNDOFF", "CheckReport", "CheckedTable",
    "EmbeddingChecks", "GemmEncoding", "LinearEncoding", "QuantizedTable", "RowChecks", "check_weights",
    "checked_embedding_bag", "checked_linear", "checked_mm", "checked_quantized_embedding_bag", "checked_table",
    "describe_thresholds", "encode_gemm", "encode_linear", "fused_table", "gemm_factor", "half_kind",
    "quantized_embedding_bag", "verify_bag_output", "verify_gemm", "verify_linear",
    # the prepared and fused calls of the hot paths (protect, campaign)
    "Bags", "CompiledBags", "CompiledLinear", "FusedCall", "accumulate", "bags_args",
    "fused_lookups_agree", "prime",
]
