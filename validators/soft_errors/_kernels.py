"""One-pass CPU checksums and verdicts of the checked GEMM, Linear and EmbeddingBag, compiled with Numba.

A checksum verdict made of torch operations is some ten small operations after the checked
product; right after a large GEMM or lookup the caches and predictors are cold and each of them
costs 10-60 us on a 2-core x86 host, which is more than the checksum's own memory traffic. These
kernels compute the checksums and the verdict in the passes over the data themselves:

* :func:`mm_encode` / ``mm_exact``: ``B W`` and ``|B| e`` in one pass over B, the reference
  ``A (B W)`` and the row norms of A in one over A, then ``C W`` and the ratio of every row to its
  *exact* threshold in one over C (:mod:`.abft`'s formula);
* ``linear_exact``: the reference and the row norms of the input and ``C W`` of the output of a
  Linear, in one pass over both, against the exact threshold;
* :func:`gemm_lower`: ``C W`` and the lower-bound verdict of an :func:`.abft.encode_gemm` encoding;
* ``bag_verdict``: the gather of the row sums, the per-bag reference, the sum and 2-norm of
  each output row and the lower-bound verdict of an EmbeddingBag.

The kernels run on the calling thread: at 2 intra-op threads on this 2-core host the checked
n = 1024 GEMM costs +11.5% (+15% with the rows split over a thread pool, so they are not split); on
a host with many cores the torch path's multi-threaded BLAS passes (``MYSTIQUE_NO_NUMBA=1``) may be
the faster one, which is not measured here.
Rows are read two at a time (two independent streams: 6-12% faster than one after a large GEMM);
sums are fp32 over blocks of :data:`BLOCK` (vectorized) and fp64 across blocks. The kernels return
the largest ratio, NaN where a value is not finite, and -1 (EmbeddingBag) where an index or offset is
out of range; the caller then takes the NumPy/torch verdict, which also locates an alarm, reusing the
checksums the kernel wrote. A kernel's verdict is therefore only ever "clean", and the tests check
it against the exact path on random and corrupted data.

Numba compiles each kernel on first use (about a second per signature, cached on disk next to this
file or in Numba's user cache). Where it cannot be imported, or with ``MYSTIQUE_NO_NUMBA=1``,
:func:`available` is False and the torch path runs instead, with the same verdicts. Only the
``reassoc``/``contract`` fast-math flags are set: NaN and infinity keep their IEEE meaning, which the
verdicts rely on.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

_STATE: dict[str, Any] = {}

#: Environment variable that turns the compiled verdicts off (``1``): the torch path runs instead.
DISABLE_ENV = "MYSTIQUE_NO_NUMBA"


#: Block of the compiled checksums: fp32 partial sums over blocks of this many elements (vectorized),
#: the blocks accumulated in fp64.
BLOCK = 64


def _build(cache: bool = True) -> dict[str, Any] | None:
    try:
        import numba
    except Exception:  # noqa: BLE001 - any import failure (missing, broken LLVM) means the torch path
        return None
    flags = {"reassoc", "contract"}
    jit = numba.njit(cache=cache, nogil=True, boundscheck=False, fastmath=flags)

    def make_pair(kind):
        # kind 0: (sum_j c_ij w_0j, sum_j c_ij w_1j); 1: also sum_j |c_ij|; 2: also sum_j c_ij^2 -- for the
        # two rows i and k at once (two independent streams: 6-12% faster than one row at a time after a
        # large GEMM), fp32 over blocks of BLOCK, the blocks summed in fp64
        @jit
        def pair(c, i, k, w):  # pragma: no cover - compiled
            n = c.shape[1]
            full = n - n % BLOCK
            a0 = a1 = ea = b0 = b1 = eb = 0.0
            for j0 in range(0, full, BLOCK):
                s0 = s1 = qa = t0 = t1 = qb = np.float32(0.0)
                for jj in range(BLOCK):
                    x = c[i, j0 + jj]
                    y = c[k, j0 + jj]
                    w0 = w[0, j0 + jj]
                    w1 = w[1, j0 + jj]
                    s0 += x * w0
                    s1 += x * w1
                    t0 += y * w0
                    t1 += y * w1
                    if kind == 1:
                        qa += abs(x)
                        qb += abs(y)
                    elif kind == 2:
                        qa += x * x
                        qb += y * y
                a0 += s0
                a1 += s1
                ea += qa
                b0 += t0
                b1 += t1
                eb += qb
            for j in range(full, n):
                x = np.float64(c[i, j])
                y = np.float64(c[k, j])
                a0 += x * w[0, j]
                a1 += x * w[1, j]
                b0 += y * w[0, j]
                b1 += y * w[1, j]
                if kind == 1:
                    ea += abs(x)
                    eb += abs(y)
                elif kind == 2:
                    ea += x * x
                    eb += y * y
            return a0, a1, ea, b0, b1, eb

        return pair

    pair_dots = make_pair(0)
    pair_abs = make_pair(1)
    pair_sq = make_pair(2)

    @jit
    def rows_verdict(got, ref, vnorm, factor, det, tiny, lo, hi):  # pragma: no cover - compiled
        # rows [lo, hi): lb_i = det |ref_0i| + tiny + factor max_w(|ref_wi| vmax / vn_w) (1 - 2^-16), vn =
        # max(vnorm, tiny); returns max_i max_w |got_wi - ref_wi| / lb_i, NaN if anything is not finite
        p = got.shape[0]
        vmax = tiny
        finite = True
        for w in range(p):
            vmax = max(vmax, vnorm[w])
            finite &= vnorm[w] < math.inf
        worst = 0.0
        for i in range(lo, hi):
            lb = 0.0
            d = 0.0
            for w in range(p):
                r = np.float64(ref[w, i])
                g = got[w, i]
                finite &= abs(r) < math.inf and abs(g) < math.inf  # (max() below would drop a NaN)
                lb = max(lb, abs(r) * (vmax * factor * (1.0 - 2.0**-16) / max(vnorm[w], tiny)))
                d = max(d, abs(g - r))
            worst = max(worst, d / (lb + abs(np.float64(ref[0, i])) * det + tiny))
        return worst if finite else math.nan

    @jit
    def exact_verdict(got, ref, na, rnorm, factor, det, tiny, lo, hi):  # pragma: no cover - compiled
        # rows [lo, hi): thr_i = det |ref_0i| + tiny + factor ||a_i|| ||r||, the exact threshold of abft's
        # module docstring; returns max_i max_w |got_wi - ref_wi| / thr_i, NaN if anything is not finite
        worst = 0.0
        finite = rnorm < math.inf
        for i in range(lo, hi):
            d = 0.0
            for w in range(2):
                r = ref[w, i]
                g = got[w, i]
                finite &= abs(r) < math.inf and abs(g) < math.inf  # (max() below would drop a NaN)
                d = max(d, abs(g - r))
            finite &= na[i] < math.inf
            worst = max(worst, d / (abs(ref[0, i]) * det + tiny + factor * na[i] * rnorm))
        return worst if finite else math.nan

    @jit
    def gemm_lower(lo, hi, c, w, ref, vnorm, factor, det, tiny, got):  # pragma: no cover - compiled
        for i in range(lo, hi, 2):
            k = min(i + 1, hi - 1)
            got[0, i], got[1, i], _, got[0, k], got[1, k], _ = pair_dots(c, i, k, w)
        return rows_verdict(got, ref, vnorm, factor, det, tiny, lo, hi)

    @jit
    def b_pass(lo, hi, b, w, vt, r):  # pragma: no cover - compiled
        # rows [lo, hi) of B: vt = W^T B^T (fp32), r = |B| e; returns sum r_k^2 over the range
        for i in range(lo, hi, 2):
            k = min(i + 1, hi - 1)
            vt[0, i], vt[1, i], r[i], vt[0, k], vt[1, k], r[k] = pair_abs(b, i, k, w)
        rn = 0.0
        for i in range(lo, hi):
            rn += r[i] * r[i]
        return rn

    @jit
    def a_pass(lo, hi, a, vt, ref, na):  # pragma: no cover - compiled
        # rows [lo, hi) of A: ref = vt A^T, na_i = ||a_i||
        for i in range(lo, hi, 2):
            k = min(i + 1, hi - 1)
            ref[0, i], ref[1, i], sa, ref[0, k], ref[1, k], sb = pair_sq(a, i, k, vt)
            na[i] = math.sqrt(sa)
            na[k] = math.sqrt(sb)
        return 0.0

    @jit
    def mm_exact(lo, hi, c, w, ref, na, rnorm, factor, det, tiny, got):  # pragma: no cover - compiled
        for i in range(lo, hi, 2):
            k = min(i + 1, hi - 1)
            got[0, i], got[1, i], _, got[0, k], got[1, k], _ = pair_dots(c, i, k, w)
        return exact_verdict(got, ref, na, rnorm, factor, det, tiny, lo, hi)

    @jit
    def linear_exact(lo, hi, x, vt, vw, y, w, rnorm, factor, det, tiny, ref, got, na):  # pragma: no cover
        # ref = vt x_i + vw and na_i = ||[x_i | 1]|| (the bias column) in the pass over x, got in the one over y
        bias = vw.shape[0] > 0
        for i in range(lo, hi, 2):
            k = min(i + 1, hi - 1)
            ref[0, i], ref[1, i], sa, ref[0, k], ref[1, k], sb = pair_sq(x, i, k, vt)
            got[0, i], got[1, i], _, got[0, k], got[1, k], _ = pair_dots(y, i, k, w)
            if bias:
                ref[0, i] += vw[0]
                ref[1, i] += vw[1]
                if k != i:  # (k == i on the last row of an odd range: that row once)
                    ref[0, k] += vw[0]
                    ref[1, k] += vw[1]
            na[i] = math.sqrt(sa + bias)
            na[k] = math.sqrt(sb + bias)
        return exact_verdict(got, ref, na, rnorm, factor, det, tiny, lo, hi)

    @jit
    def bag_verdict(lo, hi, out, idx, off, rowsum, psw, mean, c_lb, tiny, ref, got):  # pragma: no cover
        # bags [lo, hi); bag b spans idx[off[b]:off[b+1]] (the last to the end); ref_b = pooled row sums
        # (fp64), got_b = sum_d out_bd (fp32), written to ref and got; lb_b = c_lb ||out_b||_2 + tiny;
        # returns max_b |got_b - ref_b| / lb_b, NaN if anything is not finite, -1 if an index or an
        # offset is out of range (ref and got then incomplete)
        nb, d = out.shape
        n = idx.shape[0]
        rows = rowsum.shape[0]
        weighted = psw.shape[0] > 0
        worst = 0.0
        finite = True
        bad = False
        for bg in range(lo, hi):
            s = off[bg]
            e = off[bg + 1] if bg + 1 < nb else n
            if s < 0 or e > n:
                return -1.0
            r = 0.0
            for i in range(s, e):
                j = idx[i]
                bad |= (j < 0) | (j >= rows)  # (no branch in the gather loop: 10% faster; clamped to stay in
                j = min(max(j, 0), rows - 1)  # the table, and the call reports -1 at the end)
                if weighted:
                    r += np.float64(rowsum[j]) * psw[i]
                else:
                    r += rowsum[j]
            if mean and e - s > 1:
                r /= e - s
            g = np.float32(0.0)  # the output's sums in fp32, as the threshold's D term allows
            sq = np.float32(0.0)
            for k in range(d):
                x = out[bg, k]
                g += x
                sq += x * x
            ref[bg] = r
            got[bg] = g
            if abs(r) < math.inf and sq < math.inf:  # an overflowing square (|x| > 1.8e19) is no verdict
                worst = max(worst, abs(g - r) / (c_lb * math.sqrt(sq) + tiny))
            else:
                finite = False
        if bad:
            return -1.0
        return worst if finite else math.nan

    return {"gemm_lower": gemm_lower, "b_pass": b_pass, "a_pass": a_pass, "mm_exact": mm_exact,
            "linear_exact": linear_exact, "bag_verdict": bag_verdict}


def _run(name: str, n: int, *args: Any) -> float:
    """Kernel ``name`` over rows (bags) ``[0, n)`` on the calling thread.

    (Splitting the rows over a thread pool -- the kernels release the GIL -- was measured slower on
    this 2-core host at 2 intra-op threads: +15% against +11.5% of an n = 1024 GEMM for one thread.)
    """
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
    k["mm_exact"](0, 2, c, w, ref, na, 1.0, 1.0, 1.0, 1.0, got)
    k["linear_exact"](0, 2, c, vt, NO_WEIGHTS, c, w, 1.0, 1.0, 1.0, 1.0, ref, got, na)
    k["bag_verdict"](0, 1, np.ones((1, 3), f32), np.zeros(2, np.int64), np.zeros(1, np.int64), np.ones(3, f32),
                     NO_WEIGHTS, False, 1.0, 1.0, np.zeros(1, f64), np.zeros(1, f64))


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
    """Write the row checksums ``W^T C^T`` (fp64, see :data:`BLOCK`) of an (M x N) float32 ``c`` with the
    (2 x N) float32 weights ``w`` to ``got`` (2 x M float64) and return the largest
    ``max_w |got_wi - ref_wi| / lb_i``, ``lb`` the lower-bound threshold of
    :meth:`.abft.RowChecks._lower_bound` (NaN when a value is not finite)."""
    return _run("gemm_lower", c.shape[0], c, w, ref, vnorm, factor, det, tiny, got)


def mm_encode(a: np.ndarray, b: np.ndarray, w: np.ndarray, vt: np.ndarray, r: np.ndarray, ref: np.ndarray,
              na: np.ndarray) -> float:
    """The reference side of a checked ``A @ B`` in one pass over each operand: ``vt = W^T B^T`` (2 x K
    float32), ``r = |B| e`` (K), ``ref = vt A^T`` (2 x M) and the row norms ``na`` of A (M), written to
    the given arrays; returns ``||r||``."""
    rn = _run("b_pass", b.shape[0], b, w, vt, r)
    _run("a_pass", a.shape[0], a, vt, ref, na)
    return math.sqrt(rn)


#: the empty per-sample weights / bias argument of the kernels
NO_WEIGHTS = np.zeros(0, np.float32)
