"""The ``@triton.jit`` kernels of the fused checks (imports Triton: loaded only by :mod:`.kernels`).

Loaded once per mode, compiled for CUDA or interpreted where ``TRITON_INTERPRET=1`` (the decorator reads
the flag when this module runs, so :func:`.kernels.jit_module` loads it as a separate module per mode).
"""

import triton
import triton.language as tl


@triton.jit
def checked_mm_kernel(a_ptr, b_ptr, v_ptr, bias_ptr, sm_ptr, sn_ptr, y_ptr, rpart_ptr, cpart_ptr, ref_ptr,
                      worst_ptr, flip_ptr, M, N, K, sam, sak, sbk, sbn, sym, syn, NT, MT,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr, R: tl.constexpr,
                      HAS_BIAS: tl.constexpr, PREC: tl.constexpr, REF_PREC: tl.constexpr,
                      UPCAST: tl.constexpr, REF_UPCAST: tl.constexpr, FAULT: tl.constexpr, GROUP_M: tl.constexpr):
    """``y = a @ b (+ bias)`` tile by tile, fp32 accumulation; programs of the last column block
    (``pid_n == NT``) compute ``a @ v`` instead (the reference checksums: ``v`` the weight's checksum
    columns). Each output tile's epilogue writes the tile's weighted row sums (``rpart``, 2 x NT x M)
    and column sums (``cpart``, 2 x MT x N) of the fp32 accumulator, before rounding to y's dtype.
    ``FAULT``: xor ``flip = (row, col, bits)`` into that accumulator element (fault injection, tests).
    A 1-D grid of MT x NT output tiles, in groups of ``GROUP_M`` row blocks (the tiles that run together
    share their operands in L2), then the MT reference programs."""
    pid = tl.program_id(0)
    if pid >= MT * NT:
        pid_m = pid - MT * NT
        pid_n = NT
    else:
        group = GROUP_M * NT
        first_m = (pid // group) * GROUP_M
        size_m = tl.minimum(MT - first_m, GROUP_M)
        pid_m = first_m + (pid % group) % size_m
        pid_n = (pid % group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    if pid_n == NT:
        rr = tl.arange(0, RP)
        racc = tl.zeros((BM, RP), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * sam + kk[None, :] * sak,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            v = tl.load(v_ptr + kk[:, None] * RP + rr[None, :], mask=kk[:, None] < K, other=0.0)
            if REF_UPCAST:
                a = a.to(tl.float32)
                v = v.to(tl.float32)
            racc = tl.dot(a, v, racc, input_precision=REF_PREC)
        tl.store(ref_ptr + rr[None, :] * M + rm[:, None], racc, mask=(rm[:, None] < M) & (rr[None, :] < R))
        if pid_m == 0:
            tl.store(worst_ptr, 0.0)  # (the verdict kernel, launched after this one, takes the max into it)
    else:
        rn = pid_n * BN + tl.arange(0, BN)
        # rows and columns past M and N read rows and columns of the operands again (no mask on the hot
        # loads, as Triton's own GEMM); what they compute is never stored nor summed
        ra = tl.max_contiguous(tl.multiple_of(rm % M, BM), BM)
        rb = tl.max_contiguous(tl.multiple_of(rn % N, BN), BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + ra[:, None] * sam + kk[None, :] * sak, mask=kk[None, :] < K, other=0.0)
            b = tl.load(b_ptr + kk[:, None] * sbk + rb[None, :] * sbn, mask=kk[:, None] < K, other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PREC)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if FAULT:
            fi = tl.load(flip_ptr)
            fj = tl.load(flip_ptr + 1)
            fb = tl.load(flip_ptr + 2)
            hit = (rm[:, None] == fi) & (rn[None, :] == fj)
            bits = acc.to(tl.int32, bitcast=True)
            acc = tl.where(hit, (bits ^ fb).to(tl.float32, bitcast=True), acc)
        # (the sums leave out rows m >= M and columns n >= N: their weights sn, sm are 0 there)
        sn = tl.load(sn_ptr + rn, mask=rn < N, other=0.0)
        sm = tl.load(sm_ptr + rm, mask=rm < M, other=0.0)
        tl.store(rpart_ptr + pid_n * M + rm, tl.sum(tl.where(rn[None, :] < N, acc, 0.0), axis=1), mask=rm < M)
        tl.store(rpart_ptr + (NT + pid_n) * M + rm, tl.sum(acc * sn[None, :], axis=1), mask=rm < M)
        tl.store(cpart_ptr + pid_m * N + rn, tl.sum(tl.where(rm[:, None] < M, acc, 0.0), axis=0), mask=rn < N)
        tl.store(cpart_ptr + (MT + pid_m) * N + rn, tl.sum(acc * sm[:, None], axis=0), mask=rn < N)
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

@triton.jit
def verdict_kernel(rpart_ptr, ref_ptr, vw_ptr, cw_ptr, got_ptr, refo_ptr, worst_ptr, M, NT, factor, det, tiny,
                   NTP: tl.constexpr, BMV: tl.constexpr, SPLIT: tl.constexpr, HAS_VW: tl.constexpr):
    """Per row: the output's checksums (the NT tiles' partial sums added), the reference (its three
    bf16-split parts added where ``SPLIT``, plus the bias's checksum), both stored for the exact
    verdict, and ``max_w |got_w - ref_w| / lower-bound threshold`` max-reduced into ``worst``
    (anything not finite counts as infinite)."""
    rm = tl.program_id(0) * BMV + tl.arange(0, BMV)
    rt = tl.arange(0, NTP)
    live = rm < M
    m2 = (rt[:, None] < NT) & live[None, :]
    g0 = tl.sum(tl.load(rpart_ptr + rt[:, None] * M + rm[None, :], mask=m2, other=0.0), axis=0)
    g1 = tl.sum(tl.load(rpart_ptr + (NT + rt[:, None]) * M + rm[None, :], mask=m2, other=0.0), axis=0)
    r0 = tl.load(ref_ptr + rm, mask=live, other=0.0)
    r1 = tl.load(ref_ptr + M + rm, mask=live, other=0.0)
    if SPLIT:  # rows h1_0, h1_1, h2_0, h2_1, h3_0, h3_1: (h1 + h2) + h3, as device_linear adds them
        r0 = r0 + tl.load(ref_ptr + 2 * M + rm, mask=live, other=0.0)
        r1 = r1 + tl.load(ref_ptr + 3 * M + rm, mask=live, other=0.0)
        r0 = r0 + tl.load(ref_ptr + 4 * M + rm, mask=live, other=0.0)
        r1 = r1 + tl.load(ref_ptr + 5 * M + rm, mask=live, other=0.0)
    if HAS_VW:
        r0 = r0 + tl.load(vw_ptr)
        r1 = r1 + tl.load(vw_ptr + 1)
    tl.store(got_ptr + rm, g0, mask=live)
    tl.store(got_ptr + M + rm, g1, mask=live)
    tl.store(refo_ptr + rm, r0, mask=live)
    tl.store(refo_ptr + M + rm, r1, mask=live)
    a0 = tl.abs(r0)
    a1 = tl.abs(r1)
    w0 = a0 * tl.load(cw_ptr)
    w1 = a1 * tl.load(cw_ptr + 1)
    lb = factor * tl.where(w1 > w0, w1, w0) + det * a0 + tiny
    q0 = tl.abs(g0 - r0) / lb
    q1 = tl.abs(g1 - r1) / lb
    q0 = tl.where(q0 == q0, q0, float("inf"))  # NaN: not finite, no clean verdict
    q1 = tl.where(q1 == q1, q1, float("inf"))
    q = tl.where(live, tl.where(q1 > q0, q1, q0), 0.0)
    tl.atomic_max(worst_ptr, tl.max(q, axis=0))


@triton.jit
def _le_f32(p, mask):
    """The fp32s stored as 4 little-endian bytes at ``p`` (any alignment: read byte by byte)."""
    b0 = tl.load(p, mask=mask, other=0).to(tl.int32)
    b1 = tl.load(p + 1, mask=mask, other=0).to(tl.int32)
    b2 = tl.load(p + 2, mask=mask, other=0).to(tl.int32)
    b3 = tl.load(p + 3, mask=mask, other=0).to(tl.int32)
    return (b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)).to(tl.float32, bitcast=True)

@triton.jit
def checked_bag_kernel(w_ptr, idx_ptr, off_ptr, rowsum_ptr, absum_ptr, out_ptr, worst_ptr, ratio_ptr,
                       n_idx, n_bags, n_rows, D, stride_w, k_lam, d_extra, tiny, psw_ptr, pad,
                       BD: tl.constexpr, BL: tl.constexpr, QUANT: tl.constexpr, MEAN: tl.constexpr,
                       WEIGHTED: tl.constexpr, LAST: tl.constexpr, MARGIN: tl.constexpr):
    """One bag per program: its rows pooled in fp32 (8-bit rows dequantized as ``q * scale + bias``), BL rows
    gathered at once (their loads in flight together), the rows' checksums and magnitudes gathered with
    them, the bag's verdict against the exact threshold ``lam u (2 L + D + extra) a + tiny``
    (:func:`..abft.bag_verdict.verify_bag_output`; times ``MARGIN`` = 1 + 2^-10, far above the few
    roundings of its own fp32 evaluation), its ratio stored and max-reduced into ``worst``. An index out
    of range reads nothing and makes the bag's ratio infinite (an alarm). ``WEIGHTED``: row ``i`` times
    ``psw[i]`` (its checksum too, its magnitude times ``|psw[i]|``); an index equal to ``pad`` (-1: none)
    is left out (a mean divides by the indices left); ``LAST``: ``off`` holds the last bag's end too."""
    b = tl.program_id(0)
    rd = tl.arange(0, BD)
    rl = tl.arange(0, BL)
    dm = rd < D
    start = tl.load(off_ptr + b)
    if LAST:
        end = tl.load(off_ptr + b + 1)
    else:
        end = tl.load(off_ptr + b + 1, mask=b + 1 < n_bags, other=n_idx)
    end = tl.minimum(end, n_idx)
    acc = tl.zeros((BD,), dtype=tl.float32)
    ref = tl.zeros((BL,), dtype=tl.float32)
    mag = tl.zeros((BL,), dtype=tl.float32)
    bad = tl.zeros((BL,), dtype=tl.int32)
    cnt = tl.zeros((BL,), dtype=tl.int32)
    for i0 in range(start, end, BL):
        live = i0 + rl < end
        r = tl.load(idx_ptr + i0 + rl, mask=live, other=0)
        ok = (r >= 0) & (r < n_rows)
        bad += (live & ~ok).to(tl.int32)
        live = live & ok & (r != pad)
        cnt += live.to(tl.int32)
        r = tl.where(live, r, 0)
        m2 = live[:, None] & dm[None, :]
        if QUANT:  # fbgemm's row: D codes, then the fp32 scale and bias as 8 little-endian bytes
            row = w_ptr + r * stride_w
            q = tl.load(row[:, None] + rd[None, :], mask=m2, other=0).to(tl.float32)
            s = _le_f32(row + D, live)
            o = _le_f32(row + D + 4, live)
            x = tl.where(m2, q * s[:, None] + o[:, None], 0.0)
        else:
            x = tl.load(w_ptr + r[:, None] * stride_w + rd[None, :], mask=m2, other=0.0).to(tl.float32)
        rs = tl.load(rowsum_ptr + r, mask=live, other=0.0)
        ra = tl.load(absum_ptr + r, mask=live, other=0.0)
        if WEIGHTED:
            pw = tl.load(psw_ptr + i0 + rl, mask=live, other=0.0)
            x = x * pw[:, None]
            rs = rs * pw
            ra = ra * tl.abs(pw)
        acc += tl.sum(x, axis=0)
        ref += rs
        mag += ra
    n = tl.sum(cnt, axis=0).to(tl.float32)
    refs = tl.sum(ref, axis=0)
    mags = tl.sum(mag, axis=0)
    if MEAN:
        den = tl.maximum(n, 1.0)
        acc = acc / den
        refs = refs / den
        mags = mags / den
    acc = tl.where(dm, acc, 0.0)
    tl.store(out_ptr + b * D + rd, acc.to(out_ptr.dtype.element_ty), mask=dm)
    got = tl.sum(acc, axis=0)
    thr = (k_lam * (2.0 * n + d_extra) * mags + tiny) * MARGIN
    q = tl.abs(got - refs) / thr
    q = tl.where((q == q) & (tl.sum(bad, axis=0) == 0), q, float("inf"))
    tl.store(ratio_ptr + b, q)
    tl.atomic_max(worst_ptr, q)
