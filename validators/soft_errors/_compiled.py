"""The Numba kernels of :mod:`._kernels` (imported only when Numba is, by :func:`._kernels._build`).

Module-level functions, so that Numba's on-disk cache can key and reload them (a kernel whose
closure holds another compiled function gets a new cache key in every process and is compiled again).
See :mod:`._kernels` for what each computes and why.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._numba_options import NJIT

F32, F64, I64, I32, I8 = ir.FloatType(), ir.DoubleType(), ir.IntType(64), ir.IntType(32), ir.IntType(8)
#: How many indices ahead the fused lookups prefetch a float32 row (fbgemm's CPU kernels use 16 as well)
PREFETCH = 16
#: ... and an 8-bit row of D = 64, read whole by one pass (its codes, scale, bias and row sum in two cache lines,
#: most from beyond the L3 cache in the overhead group's rounds; measured when the row sums were an array of
#: their own, a third line an index: fused_layout.row_layout). A distance measured
#: per shape, as fbgemm's is a parameter: 100000 rows, 2048 bags of 40, this 2-core host, paired rounds of the
#: bare kernel against 16 ahead (600-1200 each, load 3.2-5.6): D = 64, 32 ahead -5.6% [-7.9, -3.1] and -8.3%
#: [-10.9, -5.6], 48 -5.7%, 64 -2.6%, 8 +12.5%; but slower at D = 96 (+6.8% [+5.5, +8.0]: three passes over
#: each bag), D = 128 (+1.9% [+0.8, +3.2]; 24 ahead -0.2% [-1.6, +1.3]) and D = 16 (+7.9% [+5.8, +9.5]), which
#: keep 16
PREFETCH_8BIT = 32
#: Indices per iteration of the fused lookup's loop over float32 rows (8-bit rows: one, LLVM unrolling it;
#: four were slower, with their eight vector accumulators)
UNROLL = 4

jit = numba.njit(**NJIT)
#: the same without reassoc: loops LLVM must not vectorize (a scalar gather)
strict = numba.njit(**{**NJIT, "fastmath": {"contract"}})


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
def row_sums(a, i, w, extra):  # pragma: no cover - compiled
    # (sum_j a_ij w_0j, sum_j a_ij w_1j, sum_j |a_ij| (extra 1) or a_ij^2 (extra 2) or 0) of row i: one row at
    # a time, each product of two fp32 values exact in fp64 and summed in fp64 (LLVM vectorizes the sums over
    # 8-lane fp64 accumulators); 30-40% faster on a cold 4 MB operand than four rows at a time in fp32
    # blocks summed in fp64, and more accurate
    s0 = s1 = e = 0.0
    for j in range(a.shape[1]):
        x = np.float64(a[i, j])
        s0 += x * w[0, j]
        s1 += x * w[1, j]
        if extra == 1:
            e += abs(x)
        elif extra == 2:
            e += x * x
    return s0, s1, e


@jit
def b_pass(lo, hi, b, w, vt, r):  # pragma: no cover - compiled
    # rows [lo, hi) of B: vt = W^T B^T (fp32), r = |B| e; returns sum r_k^2 over the range
    rn = 0.0
    for i in range(lo, hi):
        vt[0, i], vt[1, i], r[i] = row_sums(b, i, w, 1)
        rn += r[i] * r[i]
    return rn


@jit
def x_pass(lo, hi, a, vt, vw, ref, na):  # pragma: no cover - compiled
    # rows [lo, hi) of A (the input x of a Linear): ref = vt A^T (+ vw, the bias column, where vw is not
    # empty), na_i = ||[a_i | 1]|| (||a_i|| without a bias)
    bias = vw.shape[0] > 0
    for i in range(lo, hi):
        s0, s1, q = row_sums(a, i, vt, 2)
        if bias:
            s0 += vw[0]
            s1 += vw[1]
        ref[0, i] = s0
        ref[1, i] = s1
        na[i] = math.sqrt(q + bias)
    return 0.0


@jit
def a_pass(lo, hi, a, vt, ref, na):  # pragma: no cover - compiled
    # rows [lo, hi) of A: ref = vt A^T, na_i = ||a_i||
    return x_pass(lo, hi, a, vt, a[0, :0], ref, na)


@jit
def c_pass(lo, hi, c, w, got):  # pragma: no cover - compiled
    # rows [lo, hi) of C: got = W^T C^T
    for i in range(lo, hi):
        got[0, i], got[1, i], _ = row_sums(c, i, w, 0)
    return 0.0


@jit
def gemm_lower(lo, hi, c, w, ref, vnorm, factor, det, tiny, got):  # pragma: no cover - compiled
    c_pass(lo, hi, c, w, got)
    return rows_verdict(got, ref, vnorm, factor, det, tiny, lo, hi)


@jit
def mm_exact(lo, hi, c, w, ref, na, rnorm, factor, det, tiny, got):  # pragma: no cover - compiled
    c_pass(lo, hi, c, w, got)
    return exact_verdict(got, ref, na, rnorm, factor, det, tiny, lo, hi)


@jit
def linear_exact(lo, hi, x, vt, vw, y, w, rnorm, factor, det, tiny, ref, got, na):  # pragma: no cover
    # the pass over x (reference and row norms, see x_pass), then the one over y and the verdict
    x_pass(lo, hi, x, vt, vw, ref, na)
    c_pass(lo, hi, y, w, got)
    return exact_verdict(got, ref, na, rnorm, factor, det, tiny, lo, hi)


@jit
def indices_in(idx, rows):  # pragma: no cover - compiled
    # whether 0 <= idx_i < rows for all i (a min / max reduction, vectorized: ~2% of a lookup's time)
    lo = 0
    hi = 0
    for i in range(idx.shape[0]):
        lo = min(lo, idx[i])
        hi = max(hi, idx[i])
    return lo >= 0 and (idx.shape[0] == 0 or hi < rows)


@strict
def pooled_refs(lo, hi, idx, off, rowsum, psw, mean, ref):  # pragma: no cover - compiled
    # bags [lo, hi): ref_b = sum_{i in bag b} rowsum[idx_i] (* psw_i) in fp64 (four accumulators), divided by
    # the bag's length with mean; bag b spans idx[off[b]:off[b+1]] (the last to the end). Every index must be
    # in range (the callers check them first: indices_in). Unsigned subscripts: a signed one costs Numba's
    # negative-index wraparound, which doubled this gather's time; no reassoc (a strict jit): LLVM's
    # vectorized gather was slower than scalar loads on the hosts measured. Four accumulators: one fp64 add
    # chain bounds the gather at the add's latency per index (two chains: 84 -> 64 us warm for 81920 indices
    # on this host). Where the row sums span no more cache lines than there are indices (R / 16 <= n: the
    # gather touches most of them anyway) they are first read in order, one value per 64-byte line (a stream
    # the hardware prefetcher follows): 143 -> 105 us for 100000 rows right after a lookup evicted them.
    # Returns 0 (NaN where the touch read a value that is not finite: the loads are used, so kept), or -1 if
    # an offset is out of range (ref then incomplete)
    n = idx.shape[0]
    nb = ref.shape[0]
    touched = np.float32(0.0)
    if rowsum.shape[0] <= 16 * n:
        for k in range(0, rowsum.shape[0], 16):
            touched += rowsum[k]
    weighted = psw.shape[0] > 0
    one, two, three, four = np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4)
    for bg in range(lo, hi):
        s = off[bg]
        e = off[bg + 1] if bg + 1 < nb else n
        if s < 0 or e > n:
            return -1.0
        r0 = r1 = r2 = r3 = 0.0
        i = np.uint64(s)
        stop = np.uint64(max(s, e))
        while i + three < stop:
            if weighted:
                r0 += np.float64(rowsum[np.uint64(idx[i])]) * psw[i]
                r1 += np.float64(rowsum[np.uint64(idx[i + one])]) * psw[i + one]
                r2 += np.float64(rowsum[np.uint64(idx[i + two])]) * psw[i + two]
                r3 += np.float64(rowsum[np.uint64(idx[i + three])]) * psw[i + three]
            else:
                r0 += rowsum[np.uint64(idx[i])]
                r1 += rowsum[np.uint64(idx[i + one])]
                r2 += rowsum[np.uint64(idx[i + two])]
                r3 += rowsum[np.uint64(idx[i + three])]
            i += four
        while i < stop:
            j0 = np.uint64(idx[i])
            r0 += np.float64(rowsum[j0]) * psw[i] if weighted else np.float64(rowsum[j0])
            i += one
        r = (r0 + r1) + (r2 + r3)
        if mean and e - s > 1:
            r /= e - s
        ref[np.uint64(bg)] = r
    return touched * 0.0  # (0, or NaN where a row sum is not finite: the loads of the touch are used)


@jit
def bag_verdict(lo, hi, out, idx, off, rowsum, psw, mean, c_lb, tiny, ref, got):  # pragma: no cover
    # bags [lo, hi); bag b spans idx[off[b]:off[b+1]] (the last to the end; offsets that also hold the end, as
    # FBGEMM's, give the same bags); ref_b = pooled row sums (fp64, pooled_refs), got_b = sum_d out_bd (fp64),
    # written to ref and got; lb_b = c_lb ||out_b||_2 + tiny; returns max_b |got_b - ref_b| / lb_b, NaN if
    # anything is not finite, -1 if an index or an offset is out of range (ref and got then incomplete)
    if not indices_in(idx, rowsum.shape[0]) or pooled_refs(lo, hi, idx, off, rowsum, psw, mean, ref) == -1.0:
        return -1.0
    d = out.shape[1]
    worst = 0.0
    finite = True
    for bg in range(lo, hi):
        g = 0.0  # the output's sum in fp64 (as the exact path's), its square norm in fp32
        sq = np.float32(0.0)
        for k in range(d):
            x = out[bg, k]
            g += x
            sq += x * x
        got[bg] = g
        r = ref[bg]
        if abs(r) < math.inf and sq < math.inf:  # an overflowing square (|x| > 1.8e19) is no verdict
            worst = max(worst, abs(g - r) / (c_lb * math.sqrt(sq) + tiny))
        else:
            finite = False
    return worst if finite else math.nan


class _Chunk:
    """The LLVM IR of one call of a chunk intrinsic (see :func:`_row_chunk`), emitted by :meth:`emit`.

    ``nv`` accumulators of ``width`` float32 lanes; ``quantized`` (8-bit rows), ``weighted`` (per-sample
    weights) and ``sums`` (the chunk also sums the bag's reference) are the literal properties of the call.
    """

    def __init__(self, nv: int, width: int, quantized: bool, weighted: bool, sums: bool,
                 context: Any, builder: Any, signature: Any, args: Any) -> None:
        self.nv, self.width, self.quantized, self.weighted, self.sums = nv, width, quantized, weighted, sums
        self.context, self.builder, self.signature, self.args = context, builder, signature, args
        self.vec = ir.VectorType(F32, width)
        self.arrays = {k: context.make_array(signature.args[k])(context, builder, args[k])
                       for k in (0, 1, 5, 8, 9) if k != 9 or weighted}

    # ------------------------------------------------------------------ helpers over the builder
    def ptr(self, k: int, *inds: Any) -> Any:
        """Pointer to element ``inds`` of array argument ``k``."""
        a, aty, builder = self.arrays[k], self.signature.args[k], self.builder
        return cgutils.get_item_pointer2(self.context, builder, a.data, cgutils.unpack_tuple(builder, a.shape),
                                         cgutils.unpack_tuple(builder, a.strides), aty.layout, list(inds))

    def cast(self, k: int) -> Any:
        """Integer argument ``k`` as an int64."""
        return self.context.cast(self.builder, self.args[k], self.signature.args[k], types.int64)

    def call(self, name: str, ret: Any, *xs: Any, fastmath: tuple[str, ...] = ()) -> Any:
        """A call of the LLVM intrinsic ``name``."""
        fn = cgutils.get_or_insert_function(self.builder.module, ir.FunctionType(ret, [x.type for x in xs]), name)
        return self.builder.call(fn, list(xs), fastmath=fastmath)

    def byte(self, p: Any, k: int) -> Any:
        """Pointer ``k`` bytes past ``p``."""
        return self.builder.gep(self.builder.bitcast(p, I8.as_pointer()), [ir.Constant(I64, k)])

    def prefetch(self, p: Any) -> None:  # (into all levels: a non-temporal hint was slower)
        self.call("llvm.prefetch.p0", ir.VoidType(), self.builder.bitcast(p, I8.as_pointer()), ir.Constant(I32, 0),
                  ir.Constant(I32, 3), ir.Constant(I32, 1))

    def splat(self, x: Any) -> Any:
        """A vector of ``width`` copies of the scalar ``x``."""
        builder, vec = self.builder, self.vec
        v = builder.insert_element(ir.Constant(vec, None), x, ir.Constant(I32, 0))
        return builder.shuffle_vector(v, ir.Constant(vec, None), ir.Constant(ir.VectorType(I32, self.width), None))

    def row_of(self, i: Any) -> Any:  # (the caller has checked every index: see bag_lookup)
        return self.context.cast(self.builder, self.builder.load(self.ptr(1, i)), self.signature.args[1].dtype,
                                 types.int64)

    # ------------------------------------------------------------------ the chunk
    def emit(self) -> Any:
        """The whole chunk: the loop over the bag's indices, the division of mean pooling, the stores of
        the output and its sum and 1-norm; returns the ``(reference, output sum, output 1-norm)`` tuple."""
        builder = self.builder
        self.start, self.stop, self.col0, self.bag, self.codes = (self.cast(k) for k in (2, 3, 4, 6, 10))
        divisor = self.context.cast(builder, self.args[7], self.signature.args[7], types.float32)
        self.n = cgutils.unpack_tuple(builder, self.arrays[1].shape)[0]
        with builder.goto_entry_block():  # allocas in the entry block: mem2reg keeps them in registers
            self.accs = [builder.alloca(self.vec) for _ in range(self.nv)]
            self.ref = builder.alloca(F64)
        for a in self.accs:
            builder.store(ir.Constant(self.vec, None), a)
        builder.store(ir.Constant(F64, 0.0), self.ref)
        self.loop()
        self.divide(divisor)
        got, mag = self.store_output()
        return self.context.make_tuple(builder, self.signature.return_type,
                                       [builder.load(self.ref), got, builder.fpext(mag, F64)])

    def loop(self) -> None:
        """Every index of the bag: float32 rows ``UNROLL`` indices per iteration, then the rest (LLVM
        unrolls the summing loop only twice, which was slower)."""
        builder, start, stop = self.builder, self.start, self.stop
        unroll = 1 if self.quantized else UNROLL
        quads = builder.sdiv(builder.sub(stop, start), ir.Constant(I64, unroll))
        with cgutils.for_range(builder, quads) as loop:
            base = builder.add(start, builder.mul(loop.index, ir.Constant(I64, unroll)))
            for u in range(unroll):
                self.lookup(builder.add(base, ir.Constant(I64, u)))
        rest = builder.add(start, builder.mul(quads, ir.Constant(I64, unroll)))
        with cgutils.for_range_slice(builder, rest, stop, ir.Constant(I64, 1), inc=True) as (i, _):
            self.lookup(i)

    def prefetch_ahead(self, i: Any) -> None:
        """Prefetch the chunk of the row ``PREFETCH`` (8-bit rows of D = 64: ``PREFETCH_8BIT``)
        indices ahead (and its row sum, scale and bias)."""
        builder = self.builder
        if self.quantized and self.sums and self.nv * self.width == 64:  # (D = 64: this chunk reads the whole row)
            dist = builder.select(builder.icmp_signed("==", self.codes, ir.Constant(I64, 64)),
                                  ir.Constant(I64, PREFETCH_8BIT), ir.Constant(I64, PREFETCH))
        else:
            dist = ir.Constant(I64, PREFETCH)
        ahead = builder.add(i, dist)
        with builder.if_then(builder.icmp_signed("<", ahead, self.n), likely=True):
            jp = self.row_of(ahead)
            first = self.ptr(0, jp, self.col0)
            for k in range(0, self.nv * self.width * (1 if self.quantized else 4), 64):
                self.prefetch(self.byte(first, k))
            if self.sums and self.quantized:  # (the scale and bias, and the row sum beside them: row_layout)
                tail = self.ptr(0, jp, self.codes)
                self.prefetch(tail)
                self.prefetch(self.byte(tail, 11))
            elif self.sums:
                self.prefetch(self.ptr(8, jp))

    def lookup(self, i: Any) -> None:
        """One index of the bag: prefetch ahead, then add its row sum to the reference and pool its row."""
        builder = self.builder
        self.prefetch_ahead(i)
        j = self.row_of(i)
        w = builder.load(self.ptr(9, i)) if self.weighted else None
        if self.sums:  # (8-bit rows: the fp32 row sum 8 bytes past the codes, row_layout's; else rowsum[j])
            at = self.byte(self.ptr(0, j, self.codes), 8) if self.quantized else self.ptr(8, j)
            rs = builder.fpext(builder.load(at, typ=F32, align=4), F64)
            if self.weighted:
                rs = builder.fmul(rs, builder.fpext(w, F64))
            builder.store(builder.fadd(builder.load(self.ref), rs), self.ref)
        if self.quantized:
            sb = self.ptr(0, j, self.codes)
            scale = builder.load(self.byte(sb, 0), typ=F32, align=1)
            bias = builder.load(self.byte(sb, 4), typ=F32, align=1)
            if self.weighted:  # (fenced: the backend would fuse w * bias with the add below)
                scale = self.call("llvm.arithmetic.fence.f32", F32, builder.fmul(scale, w))
                bias = self.call("llvm.arithmetic.fence.f32", F32, builder.fmul(bias, w))
            self.pool(j, w, self.splat(scale), self.splat(bias))
        else:
            self.pool(j, w, None, None)

    def pool(self, j: Any, w: Any, vs: Any, vb: Any) -> None:
        """Add row ``j``'s chunk to the accumulators (8-bit rows: ``fma(q, scale, acc + bias)``)."""
        builder, vec, width = self.builder, self.vec, self.width
        for v in range(self.nv):
            p = self.ptr(0, j, builder.add(self.col0, ir.Constant(I64, v * width)))
            acc = builder.load(self.accs[v])
            if self.quantized:
                x = builder.uitofp(builder.load(p, typ=ir.VectorType(I8, width), align=1), vec)
                acc = self.call(f"llvm.fma.v{width}f32", vec, x, vs, builder.fadd(acc, vb))
            elif self.weighted:
                acc = self.call(f"llvm.fma.v{width}f32", vec, self.splat(w), builder.load(p, typ=vec, align=4), acc)
            else:
                acc = builder.fadd(acc, builder.load(p, typ=vec, align=4))
            builder.store(acc, self.accs[v])

    def divide(self, divisor: Any) -> None:
        """Mean pooling: the accumulators divided by the bag's length (x / 1 is x: sum pooling skips it)."""
        builder = self.builder
        dv = self.splat(divisor)
        with builder.if_then(builder.fcmp_ordered("!=", divisor, ir.Constant(F32, 1.0)), likely=False):
            for v in range(self.nv):
                builder.store(builder.fdiv(builder.load(self.accs[v]), dv), self.accs[v])

    def store_output(self) -> tuple[Any, Any]:
        """Store the accumulators to ``out[b, c0:]``; returns the chunk's output sum (fp64: two orders of
        summing agree to ~1e-16, so this verdict and the exact path's agree) and 1-norm (fp32, any order:
        the threshold's D term covers it), from the values just stored."""
        builder, vec, width = self.builder, self.vec, self.width
        vec64 = ir.VectorType(F64, width)
        total = absolute = None
        for v in range(self.nv):
            p = self.ptr(5, self.bag, builder.add(self.col0, ir.Constant(I64, v * width)))
            o = builder.load(self.accs[v])
            builder.store(o, builder.bitcast(p, vec.as_pointer()), align=4)
            a = self.call(f"llvm.fabs.v{width}f32", vec, o)
            o64 = builder.fpext(o, vec64)
            total = o64 if total is None else builder.fadd(total, o64)
            absolute = a if absolute is None else builder.fadd(absolute, a)
        got = self.call(f"llvm.vector.reduce.fadd.v{width}f64", F64, ir.Constant(F64, 0.0), total,
                        fastmath=("reassoc",))
        mag = self.call(f"llvm.vector.reduce.fadd.v{width}f32", F32, ir.Constant(F32, 0.0), absolute,
                        fastmath=("reassoc",))
        return got, mag


def _row_chunk(nv: int, width: int) -> Any:
    """A Numba intrinsic that pools one column chunk of a bag, written in LLVM IR.

    ``chunk(table, idx, s, e, c0, out, b, div, rowsum, psw, dcodes, summing)`` sets
    ``out[b, c0 : c0 + nv*width]`` to the bag ``idx[s:e]`` pooled over those columns and divided by
    ``div``, with ``nv`` accumulators of ``width`` float32 lanes held in registers (Numba's own loops keep
    them in memory, which no alias analysis can lift). ``table`` is a float32
    (R x D) table or an 8-bit row-wise one (uint8, R x S, S >= D + 12: D codes, then the fp32 scale, bias and
    row sum at byte ``dcodes``); ``psw`` the per-sample weights or None. Each element is summed in index order in
    float32 exactly as torch's CPU kernels do (fp32 rows: ``acc + x``, or ``fma(w, x, acc)`` with
    weights; 8-bit rows: ``fma(q, scale, acc + bias)``, scale and bias multiplied by the weight first),
    so the output is bitwise torch's (and checked to be, see :func:`.abft.fused_lookup.fused_lookups_agree`). The
    chunk's cache lines of the row ``PREFETCH`` (8-bit rows of D = 64: ``PREFETCH_8BIT``)
    indices ahead are prefetched. A ``summing`` chunk (a
    literal) also returns the bag's reference ``sum_i rowsum[j_i] (* psw[i])`` in fp64 and prefetches the
    row sums (8-bit rows: each read in its row, :func:`.abft.fused_layout.row_layout`; float32 rows: ``rowsum``)
    and the scale and bias. Returns ``(reference, output sum, output 1-norm)``. The indices
    are not checked here (each check is two instructions more per index in a loop whose speed is the
    number of rows it has in flight): :func:`bag_lookup` checks them all first.
    """

    @intrinsic
    def chunk(typingctx, table, idx, s, e, c0, out, b, div, rowsum, psw, dcodes, summing):
        if not isinstance(summing, types.BooleanLiteral):
            return None
        sig = types.UniTuple(types.float64, 3)(table, idx, s, e, c0, out, b, div, rowsum, psw, dcodes, summing)
        props = (table.dtype == types.uint8, not isinstance(psw, types.NoneType), summing.literal_value)

        def codegen(context, builder, signature, args):
            return _Chunk(nv, width, *props, context, builder, signature, args).emit()

        return sig, codegen

    return chunk


# chunks of 128, 64 and 16 columns (8, 4 and 1 vector accumulators) and single columns
chunk128, chunk64, chunk16, chunk1 = (_row_chunk(nv, w) for nv, w in ((8, 16), (4, 16), (1, 16), (1, 1)))


@jit
def _more(g, a, part):  # pragma: no cover - compiled
    # a further column chunk's (output sum, 1-norm) added to the bag's
    return g + part[1], a + part[2]


@jit
def bag_lookup(lo, hi, table, idx, off, out, rowsum, psw, mean, check, c_lb, tiny, ref, got):  # pragma: no cover
    # bags [lo, hi) of out (bags x D) pooled from table (float32, or uint8 8-bit row-wise), psw None or the
    # per-sample weights; writes each bag's reference to ref and, with check, its output sum to got and
    # returns the largest |got - ref| / (c_lb sum_d |out_bd| + tiny) (the lower-bound verdict of
    # bag_verdict, with the 1-norm, which bounds the 2-norm from above); NaN if something is not finite,
    # -1 if an index or an offset is out of range
    nb, d = out.shape
    n = idx.shape[0]
    if (lo < hi and off[0] != 0) or (n and not table.shape[0]):
        return -1.0  # (torch refuses a first offset other than 0; no row of an empty table can be read)
    if table.itemsize == 1 and table.shape[1] < d + 12:
        return -1.0  # (8-bit rows are read in row_layout's layout: codes, scale, bias, the row sum)
    if not indices_in(idx, table.shape[0]):
        return -1.0  # (every index is in some bag, the first offset being 0: torch refuses any outside the table)
    # float32 rows: the references first, in a pass of their own (pooled_refs), then the lookup without them.
    # Gathered inside the lookup, each row sum is one more cache line per row, fetched from beyond the L2
    # cache, which the rows streaming through it keep evicting; in their own pass the R x 1 row sums stay in
    # it. 100000 x 64 fp32 rows, 2048 bags of 40, this host: +14% -> +6% over torch's lookup (x 128: +14% ->
    # +8%). 8-bit rows (72 bytes, a 7 MB table) were faster fused: +17% against +23%
    first = table.itemsize != 1
    for bg in range(lo, hi):
        s = off[bg]
        e = off[bg + 1] if bg + 1 < nb else n
        if s < 0 or e > n or s > e:
            return -1.0
    worst = 0.0
    if first and lo < hi:
        worst = pooled_refs(lo, hi, idx, off, rowsum, rowsum[:0] if psw is None else psw, mean, ref)
    finite = worst == 0.0
    for bg in range(lo, hi):
        s = off[bg]
        e = off[bg + 1] if bg + 1 < nb else n
        div = np.float32(e - s) if mean and e > s else np.float32(1.0)
        r = g = a = 0.0
        c = 0
        # (chunks of 128 columns for both row types: a bag's rows are read in one pass over its indices, which
        # matters where they are not in the caches; two passes of 64 columns were faster only on warm rows)
        if first:
            r = ref[bg]
        elif d >= 128:  # the first chunk also sums the reference
            r, g, a = chunk128(table, idx, s, e, 0, out, bg, div, rowsum, psw, d, True)
            c = 128
        elif d >= 64:
            r, g, a = chunk64(table, idx, s, e, 0, out, bg, div, rowsum, psw, d, True)
            c = 64
        elif d >= 16:
            r, g, a = chunk16(table, idx, s, e, 0, out, bg, div, rowsum, psw, d, True)
            c = 16
        elif d >= 1:
            r, g, a = chunk1(table, idx, s, e, 0, out, bg, div, rowsum, psw, d, True)
            c = 1
        while c + 128 <= d:
            g, a = _more(g, a, chunk128(table, idx, s, e, c, out, bg, div, rowsum, psw, d, False))
            c += 128
        while c + 64 <= d:
            g, a = _more(g, a, chunk64(table, idx, s, e, c, out, bg, div, rowsum, psw, d, False))
            c += 64
        while c + 16 <= d:
            g, a = _more(g, a, chunk16(table, idx, s, e, c, out, bg, div, rowsum, psw, d, False))
            c += 16
        while c < d:
            g, a = _more(g, a, chunk1(table, idx, s, e, c, out, bg, div, rowsum, psw, d, False))
            c += 1
        if not first and mean and e - s > 1:
            r /= e - s
        ref[bg] = r
        if not check:
            continue
        got[bg] = g
        if abs(r) < math.inf and a < math.inf:
            worst = max(worst, abs(g - r) / (c_lb * a + tiny))
        else:
            finite = False
    return worst if finite else math.nan


@jit
def bag_out_verdict(lo, hi, out, ref, c_lb, tiny, got):  # pragma: no cover - compiled
    # bags [lo, hi): the output sums (fp64) and the lower-bound verdict of bag_lookup (1-norm) against the
    # references bag_lookup wrote (the check of a lookup whose output is verified later, as protect's hook does)
    d = out.shape[1]
    worst = 0.0
    finite = True
    for bg in range(lo, hi):
        g = 0.0
        a = np.float32(0.0)
        for k in range(d):
            x = out[bg, k]
            g += x
            a += abs(x)
        got[bg] = g
        r = ref[bg]
        if abs(r) < math.inf and a < math.inf:
            worst = max(worst, abs(g - r) / (c_lb * a + tiny))
        else:
            finite = False
    return worst if finite else math.nan


KERNELS = {"gemm_lower": gemm_lower, "b_pass": b_pass, "a_pass": a_pass, "x_pass": x_pass, "mm_exact": mm_exact,
           "linear_exact": linear_exact, "bag_verdict": bag_verdict, "bag_lookup": bag_lookup,
           "bag_out_verdict": bag_out_verdict}
