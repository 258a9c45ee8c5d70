"""What every checked operator returns and shares: the report, the unit roundoffs and threshold factors.

A check compares checksums of the computed result with a reference computed from the operands; its
``max_ratio`` is the largest ``|difference| / threshold``, the threshold bounding the rounding error of
a clean run (derived per operator where it is computed: :func:`.encoding.gemm_constants`,
:func:`.bag_verdict.verify_bag_output`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mystique import dtypes
from mystique.dtypes import name as dtype_name

#: Unit roundoff of the floating dtypes (accumulation and output precisions of the checks).
UNIT_ROUNDOFF: dict[torch.dtype, float] = {dt: dtypes.unit_roundoff(dt) for dt in dtypes.FLOAT_LAYOUT}
#: Safety factor of the GEMM threshold (calibrated on clean data, see :func:`.encoding.gemm_factor`).
GEMM_LAMBDA = 1.0
#: Factor of the EmbeddingBag gamma bound (1 is the rigorous deterministic bound).
EMBEDDING_LAMBDA = 1.0
#: The floating dtypes a checked GEMM or Linear takes.
FLOATS = (torch.float32, *dtypes.HALF_DTYPES)
#: A compiled exact verdict (fp64-accumulated norms) is taken as clean only below this ratio; above it
#: the NumPy/torch exact path decides, with its own norms, so that both always reach one verdict.
CLEAR = 1.0 - 2.0**-10


@dataclass
class CheckReport:
    """Outcome of one checked operation.

    ``alarm`` is True when a checksum disagreed beyond its threshold; ``max_ratio`` is the largest
    ``|checksum difference| / threshold`` (below 1 on a clean run; an upper bound of it where the
    lower-bound threshold already decided); ``rows``/``cols`` list the flagged rows and columns
    (GEMM) or bags (EmbeddingBag, in ``rows``); ``location`` is the first flagged (row, col) of a
    GEMM when both checks flag, else the first element of a flagged row (column) beyond its own bound
    (:func:`.gemm.locate_elements`, which also gives ``cols`` (``rows``) then); ``checked`` is False when
    the inputs were not finite (no verdict).
    """

    op: str
    dtype: str
    alarm: bool
    max_ratio: float
    checked: bool = True
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    location: tuple[int, int] | None = None
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else (f" rows {self.rows[:4]}" if self.rows else "")
        return (f"{self.op} {self.dtype} {tuple(self.shape)}: {'ALARM' if self.alarm else 'ok'} "
                f"max|diff|/thr={self.max_ratio:.3g}{where}")


def host(t: torch.Tensor, f64: bool = True) -> np.ndarray:
    """A small tensor as a NumPy array (the O(M) threshold arithmetic runs on the host), float64 by default."""
    a = t.detach().cpu().numpy()
    return a.astype(np.float64) if f64 else a


def np_view(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A CPU tensor's NumPy view (no copy) for the compiled kernels."""
    return t if isinstance(t, np.ndarray) else t.detach().numpy()


def describe_thresholds() -> dict[str, Any]:
    """The constants the checks use (for results details and documentation)."""
    return {"gemm_lambda": GEMM_LAMBDA, "embedding_lambda": EMBEDDING_LAMBDA,
            "u": {dtype_name(k): v for k, v in UNIT_ROUNDOFF.items()}}
