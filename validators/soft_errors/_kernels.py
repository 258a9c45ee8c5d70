"""One-pass CPU checksums and verdicts of the checked GEMM, Linear and EmbeddingBag, compiled with Numba.

A checksum verdict made of torch operations is some ten small operations after the checked
product; right after a large GEMM or lookup the caches and predictors are cold and each of them
costs more than the checksum's own memory traffic. These kernels (defined in :mod:`._compiled`)
compute the checksums and the verdict in the passes over the data themselves:

* ``b_pass``, ``a_pass``, ``mm_exact``: ``B W`` and ``|B| e`` in one pass over B, the reference
  ``A (B W)`` and the row norms of A in one over A, then ``C W`` and the ratio of every row to its
  *exact* threshold in one over C (:func:`.abft.encoding.gemm_constants`);
* ``x_pass`` (before the product) and ``mm_exact``, or ``linear_exact`` (both after it): the reference
  and the row norms of the input and ``C W`` of the output of a Linear, against the exact threshold;
* :func:`gemm_lower`: ``C W`` and the lower-bound verdict of an :func:`.abft.encode_gemm` encoding;
* ``bag_verdict``: the gather of the row sums, the per-bag reference, the sum and 2-norm of each
  output row and the lower-bound verdict of an EmbeddingBag computed by torch;
* ``bag_lookup``: the EmbeddingBag itself (float32 or 8-bit row-wise rows, sum or mean, per-sample
  weights), bitwise torch's, each bag checked as it is pooled, its inner loop written in LLVM IR so
  that the accumulators stay in registers; the row sums are gathered into each bag's reference in a
  pass of their own before it (float32 rows: ``pooled_refs``, the R x 1 row sums then stay in the L2
  cache, which the rows streaming through it would evict) or in the lookup's own pass (8-bit rows, read
  in :func:`.abft.fused_layout.row_layout`'s layout, each row's fp32 checksum beside it);
  ``bag_out_verdict`` checks its output later against the references it wrote.

The kernels run on the calling thread. The GEMM passes read one row at a time and sum its products
(exact in fp64: two fp32 factors) in fp64 over vectorized lanes. The kernels return the largest ratio,
NaN where a value is not finite, and -1 (EmbeddingBag) where an index or offset is out of range; the
caller then takes the NumPy/torch verdict, which also locates an alarm, reusing the checksums the
kernel wrote. A kernel's verdict is therefore only ever "clean", and the tests check it against the
exact path on random and corrupted data.

Numba compiles the kernels on first use (once: they are cached on disk next to :mod:`._compiled` or
in Numba's user cache). Where Numba cannot be imported, or with ``MYSTIQUE_NO_NUMBA=1``,
:func:`available` is False and the torch path runs instead, with the same verdicts. The compile
options are in :mod:`._numba_options`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._numba_options import NJIT

_STATE: dict[str, Any] = {}

#: Environment variable that turns the compiled verdicts off (``1``): the torch path runs instead.
DISABLE_ENV = "MYSTIQUE_NO_NUMBA"


def _build(cache: bool = True) -> dict[str, Any] | None:
    """The compiled kernels (:mod:`._compiled`), with Numba's on-disk cache or, ``cache=False``, without
    it (the module is then imported afresh); None where Numba cannot be imported."""
    try:
        import numba  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure (missing, broken LLVM) means the torch path
        return None
    NJIT["cache"] = cache
    from ._compiled import KERNELS as kernels

    if not cache:  # the module imported afresh, so that its kernels are compiled without the cache
        kernels = importlib.reload(sys.modules[f"{__package__}._compiled"]).KERNELS
    return dict(kernels)


def _run(name: str, n: int, *args: Any) -> float:
    """Kernel ``name`` over rows (bags) ``[0, n)`` on the calling thread (the kernels release the GIL,
    but splitting the rows over a thread pool was slower than one thread)."""
    return float(_kernels()[name](0, n, *args))


def _smoke(k: dict[str, Any]) -> None:
    """Call every kernel once on tiny arrays of the dtypes the checks use (float32 data, int64 indices):
    this loads (or compiles) them, so that a cache Numba cannot load fails here, not in a check."""
    f32, f64 = np.float32, np.float64
    c, w = np.ones((2, 3), f32), np.ones((2, 3), f32)
    ref, got, na, vt, r = np.zeros((2, 2)), np.zeros((2, 2)), np.ones(2), np.ones((2, 3), f32), np.zeros(3)
    k["gemm_lower"](0, 2, c, w, np.zeros((2, 2), f32), np.ones(2), 1.0, 1.0, 1.0, got)
    k["b_pass"](0, 3, np.ones((3, 3), f32), w, vt, r)
    k["a_pass"](0, 2, c, vt, ref, na)
    k["x_pass"](0, 2, c, vt, NO_WEIGHTS, ref, na)
    k["mm_exact"](0, 2, c, w, ref, na, 1.0, 1.0, 1.0, 1.0, got)
    k["linear_exact"](0, 2, c, vt, NO_WEIGHTS, c, w, 1.0, 1.0, 1.0, 1.0, ref, got, na)
    k["bag_verdict"](0, 1, np.ones((1, 3), f32), np.zeros(2, np.int64), np.zeros(1, np.int64), np.ones(3, f32),
                     NO_WEIGHTS, False, 1.0, 1.0, np.zeros(1, f64), np.zeros(1, f64))
    k["bag_out_verdict"](0, 1, np.ones((1, 3), f32), np.zeros(1, f64), 1.0, 1.0, np.zeros(1, f64))
    for table in (np.ones((3, 1), f32), np.ones((3, 16), np.uint8)):  # fp32 and 8-bit, unweighted and weighted
        for psw in (None, np.ones(2, f32)):
            k["bag_lookup"](0, 1, table, np.zeros(2, np.int64), np.zeros(1, np.int64), np.empty((1, 1), f32),
                            np.ones(3, f32), psw, False, True, 1.0, 1.0, np.zeros(1, f64), np.zeros(1, f64))


def _kernels() -> dict[str, Any] | None:
    if "k" not in _STATE:
        k = None if os.environ.get(DISABLE_ENV) == "1" else _build()
        if k is not None:
            try:
                _smoke(k)
            except Exception as exc:  # noqa: BLE001 - a cache Numba cannot load (stale, foreign, corrupt)
                warnings.warn(f"mystique: Numba's kernel cache could not be loaded ({exc}); compiling without "
                              "it in this process", RuntimeWarning, stacklevel=2)
                k = _build(cache=False)
                try:
                    _smoke(k)
                except Exception:  # noqa: BLE001 - no compiled verdicts: the torch path runs
                    k = None
        _STATE["k"] = k
    return _STATE["k"]


def raw(name: str) -> Any:
    """The compiled kernel ``name`` itself (rows ``lo, hi`` first): the hot paths of :mod:`.abft` call it
    directly, every Python-level call right after a large product being costly."""
    return _kernels()[name]


def kernel_table() -> dict[str, Any] | None:
    """Every compiled kernel by name (None where the compiled verdicts cannot run), for the calls that are
    no hot path and are not :func:`raw`'s."""
    return _kernels()


def available() -> bool:
    """Whether the compiled verdicts can run (Numba importable and not disabled by ``MYSTIQUE_NO_NUMBA=1``)."""
    return _kernels() is not None


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, the compiled verdicts are off and the torch path decides (for side-by-side tests)."""
    missing = object()
    saved = _STATE.get("k", missing)
    _STATE["k"] = None
    try:
        yield
    finally:
        if saved is missing:
            _STATE.pop("k", None)
        else:
            _STATE["k"] = saved


def gemm_lower(c: np.ndarray, w: np.ndarray, ref: np.ndarray, vnorm: np.ndarray, factor: float, det: float,
               tiny: float, got: np.ndarray) -> float:
    """Write the row checksums ``W^T C^T`` (fp64) of an (M x N) float32 ``c`` with the
    (2 x N) float32 weights ``w`` to ``got`` (2 x M float64) and return the largest
    ``max_w |got_wi - ref_wi| / lb_i``, ``lb`` the lower-bound threshold of
    :meth:`.abft.RowChecks.lower_bound` (NaN when a value is not finite)."""
    return _run("gemm_lower", c.shape[0], c, w, ref, vnorm, factor, det, tiny, got)


#: the empty per-sample weights / bias argument of the kernels
NO_WEIGHTS = np.zeros(0, np.float32)
