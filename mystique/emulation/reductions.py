"""Scans and reductions computed in the order PyTorch's CUDA kernels use, on the host.

Healthy CUDA kernels sum in other orders than the CPU's, and CUDA's scans round every partial
sum to the tensor's dtype. Both are legal (PyTorch specifies neither order nor the precision of a
scan's partial sums) and both move results by more than the CPU's own rounding, so a validator
calibrated on the CPU alone fails a healthy GPU.
Each function below reproduces the structure of the CUDA kernel named in its docstring with
vectorised torch code, deterministically (same inputs, same bits: the real kernels have fixed
schedules and no atomics for these ops). Scans follow the kernel exactly for the innermost and
outer dimensions; the 1-D scan (cub) and the reductions follow the kernels' shape (thread count,
vector width, tree) with illustrative launch parameters, not one launch bit for bit.

Only floating inputs of the float dtypes are taken; everything else is left to the host (PASS).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..dtypes import FLOAT_DTYPES
from ..faults.schema import base_name, bind, finish, op_name
from .difference import PASS, Difference

Combine = Callable[[Any, Any], Any]


def _acc(dtype: Any) -> Any:
    """The accumulator type CUDA uses (``at::opmath_type``): fp32 for bf16/fp16/fp32, fp64 for fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _in_dtype(op: Callable[[Any, Any], Any], dtype: Any) -> Combine:
    """``op`` as ``c10::BFloat16``/``c10::Half`` operators compute it: in fp32, result rounded to the dtype."""
    if dtype in (torch.bfloat16, torch.float16):
        return lambda a, b: op(a.float(), b.float()).to(dtype)
    return op


def _ok(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES and t.layout == torch.strided
            and t.device.type != "meta" and t.numel() > 0)


# ---------------------------------------------------------------- scans (ATen cuda/ScanUtils.cuh)

def log_num_threads_x(rows: int, n: int) -> int:
    """``get_log_num_threads_x_inner_scan<uint32_t>``: about 512 threads, x : y like n : rows, x in [2^4, 2^9]."""
    lx = max(0, math.ceil(math.log2(max(n, 1))))
    ly = max(0, math.ceil(math.log2(max(rows, 1))))
    lx = ((9 + lx - ly) & 0xFFFFFFFF) // 2  # uint32_t arithmetic, wrap-around included
    return min(max(4, lx), 9)


def _sklansky(buf: Any, levels: int, comb: Combine) -> None:
    """In place on contiguous ``(rows, 2^levels)``: level m adds the last element of each lower half
    of a 2^(m+1) group to every element of its upper half (one rounding per level)."""
    rows, width = buf.shape
    for m in range(levels):
        s = 1 << m
        v = buf.view(rows, width // (2 * s), 2, s)
        v[:, :, 1, :] = comb(v[:, :, 1, :], v[:, :, 0, s - 1:s])


def scan_innermost(x: Any, comb: Combine, init: float) -> Any:
    """``tensor_kernel_scan_innermost_dim`` on ``(rows, n)``: blocks of ``B = 2 * num_threads_x``
    elements, the previous block's total combined into the first element, then a Sklansky scan."""
    rows, n = x.shape
    lx = log_num_threads_x(rows, n)
    block = 2 << lx
    nb = -(-n // block)
    buf = torch.full((rows, nb * block), init, dtype=x.dtype)
    buf[:, :n] = x
    buf = buf.view(rows, nb, block)
    carry = torch.full((rows,), init, dtype=x.dtype)
    for b in range(nb):
        blk = buf[:, b].clone()
        blk[:, 0] = comb(blk[:, 0], carry)
        _sklansky(blk, lx + 1, comb)
        buf[:, b] = blk
        carry = blk[:, -1].clone()
    return buf.reshape(rows, nb * block)[:, :n]


def scan_outer(x: Any, comb: Combine, init: float) -> Any:
    """``tensor_kernel_scan_outer_dim`` on ``(L, ...)``: one thread per column, sequential, acc in the dtype."""
    out = torch.empty_like(x)
    acc = torch.full(x.shape[1:], init, dtype=x.dtype)
    for i in range(x.shape[0]):
        acc = comb(acc, x[i])
        out[i] = acc
    return out


def scan_1d(x: Any, comb: Combine, init: float, threads: int = 128, items: int = 8) -> Any:
    """The shape of cub's single-pass scan (``DeviceScan::InclusiveScan``, used when the tensor is one
    row): tiles of ``threads x items``; each thread reduces its items sequentially, the thread totals
    are scanned across the block (Sklansky), tiles are chained by a running prefix, and each thread
    re-scans its items from its prefix. Every partial is in the dtype (the scan's value type)."""
    n = x.numel()
    tile = threads * items
    nt = -(-n // tile)
    buf = torch.full((nt * tile,), init, dtype=x.dtype)
    buf[:n] = x.reshape(-1)
    buf = buf.view(nt, threads, items)
    tot = buf[:, :, 0].clone()
    for i in range(1, items):
        tot = comb(tot, buf[:, :, i])
    inc = tot.clone()
    _sklansky(inc, int(math.log2(threads)), comb)
    out = torch.empty_like(buf)
    running = torch.full((), init, dtype=x.dtype)
    for t in range(nt):
        prefix = torch.cat([running.reshape(1), comb(running.expand(threads - 1), inc[t, :-1])])
        acc = prefix
        for i in range(items):
            acc = comb(acc, buf[t, :, i])
            out[t, :, i] = acc
        running = comb(running, inc[t, -1])
    return out.reshape(-1)[:n].reshape(x.shape)


def scan(x: Any, dim: int, comb: Combine, init: float) -> Any:
    """``scan_dim``: cub for a single row, the innermost kernel for the last dim, else the outer one."""
    x = x.contiguous()
    if x.dim() == 0:
        return x.clone()
    if x.numel() == x.shape[dim]:
        return scan_1d(x, comb, init)
    if dim == x.dim() - 1:
        return scan_innermost(x.reshape(-1, x.shape[-1]), comb, init).reshape(x.shape)
    return scan_outer(x.movedim(dim, 0), comb, init).movedim(0, dim).contiguous()


def _scan_op(op: Callable[[Any, Any], Any], init: float) -> Callable[[Any, tuple, dict], Any]:
    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        if func._overloadname not in ("default", "out"):  # Dimname overloads: the host's kernel
            return PASS
        b = bind(func, args, kwargs)
        x, dtype = b["self"], b.get("dtype") or b["self"].dtype
        if not _ok(x) or dtype not in FLOAT_DTYPES:
            return PASS
        xd = x.to(dtype)
        res = scan(xd, b["dim"] % max(xd.dim(), 1), _in_dtype(op, dtype), init)
        return finish(func, b, res)

    return run


# ---------------------------------------------------------------- reductions (ATen cuda/Reduce.cuh)

def _padded(x: Any, threads: int, vec: int) -> tuple[Any, int, int]:
    """``(rows, n)`` zero-padded to whole rounds of ``vec`` loads by each of at most ``threads``
    threads (fewer for a short row): the buffer ``(rows, steps * threads * vec)``, threads, steps."""
    rows, n = x.shape
    threads = max(1, min(threads, 1 << max(0, math.ceil(math.log2(-(-n // vec))))))
    steps = -(-n // (threads * vec))
    buf = torch.zeros((rows, steps * threads * vec), dtype=x.dtype)
    buf[:, :n] = x
    return buf, threads, steps


def tree_sum(x: Any, threads: int = 512, vec: int = 4) -> Any:
    """Sum of ``(rows, n)`` over n in Reduce.cuh's order, in x's dtype (the accumulator).

    Thread t loads ``vec`` consecutive elements at a time with stride ``vec * threads`` and keeps
    ``vec`` accumulators; they are combined in sequence, then the thread values are reduced by a
    tree (warp shuffles, then shared memory), halving the active threads at each level.
    """
    rows = x.shape[0]
    buf, threads, steps = _padded(x, threads, vec)
    buf = buf.view(rows, steps, threads, vec)
    acc = buf[:, 0]
    for s in range(1, steps):
        acc = acc + buf[:, s]
    t = acc[..., 0]
    for i in range(1, vec):
        t = t + acc[..., i]
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = t[..., :h] + t[..., h:]
    return t[:, 0]


def _reduce_dims(x: Any, dim: Any) -> list[int] | None:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not all(isinstance(d, int) for d in dims):
        return None  # Dimname
    return sorted({d % max(x.dim(), 1) for d in dims}) if x.dim() else []


def _sum_mean(mean: bool) -> Callable[[Any, tuple, dict], Any]:
    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        b = bind(func, args, kwargs)
        x = b["self"]
        dtype = b.get("dtype") or (x.dtype if isinstance(x, torch.Tensor) else None)
        dims = _reduce_dims(x, b.get("dim")) if _ok(x) else None
        if dims is None or dtype not in FLOAT_DTYPES:
            return PASS
        keep = [d for d in range(x.dim()) if d not in dims]
        n = math.prod(x.shape[d] for d in dims)
        acc = _acc(dtype)
        rows = (x.permute(*keep, *dims) if x.dim() else x).reshape(-1, n).to(acc)
        total = tree_sum(rows)
        if mean:  # MeanOps: acc * factor, factor = 1/n in the accumulator type
            total = total * torch.tensor(1.0, dtype=acc).div(n)
        res = total.reshape([x.shape[d] for d in keep]).to(dtype)
        if b.get("keepdim"):
            for d in dims:
                res = res.unsqueeze(d)
        return finish(func, b, res)

    return run


# ---------------------------------------------------------------- softmax (ATen cuda/SoftMax.cu)

def _softmax(log: bool) -> Callable[[Any, tuple, dict], Any]:
    """Max, then the sum of exp(x - max) in fp32 (a warp per row with strided lanes for rows of at
    most 1024, a block with 4-wide loads above), then ``exp(x - max) / sum`` or
    ``(x - max) - log(sum)`` rounded once."""
    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        b = bind(func, args, kwargs)
        x = b["self"]
        if not _ok(x) or x.dim() == 0:
            return PASS
        dim = b["dim"] % x.dim()
        out_dtype = torch.float32 if b.get("half_to_float") else x.dtype
        xm = x.movedim(dim, -1)
        shape = xm.shape
        rows = xm.reshape(-1, shape[-1]).to(_acc(x.dtype))
        mx = rows.amax(-1, keepdim=True)
        t = rows - mx
        e = torch.exp(t)
        warp = shape[-1] <= 1024
        s = tree_sum(e, threads=32 if warp else 1024, vec=1 if warp else 4).unsqueeze(-1)
        y = (t - torch.log(s)) if log else e / s
        res = y.to(out_dtype).reshape(shape).movedim(-1, dim).contiguous()
        return finish(func, b, res)

    return run


# ---------------------------------------------------------------- layer norm (ATen cuda/layer_norm_kernel.cu)

def welford_rows(x: Any, threads: int = 128, vec: int = 4) -> tuple[Any, Any]:
    """Mean and biased variance of ``(rows, n)`` (fp32) as the vectorised layer-norm kernel gets them:
    each thread runs Welford's update over its elements (``vec`` consecutive ones at a stride of
    ``vec * threads``), then the thread states are merged by a tree of Chan's pairwise combines."""
    rows, n = x.shape
    buf, threads, steps = _padded(x, threads, vec)
    lanes = threads * vec
    valid = torch.zeros(steps * lanes, dtype=torch.bool)
    valid[:n] = True
    buf, valid = buf.view(rows, steps, threads, vec), valid.view(steps, threads, vec)
    cnt = torch.zeros(threads, dtype=x.dtype)
    mean = torch.zeros(rows, threads, dtype=x.dtype)
    m2 = torch.zeros(rows, threads, dtype=x.dtype)
    for s in range(steps):
        for i in range(vec):
            v, ok = buf[:, s, :, i], valid[s, :, i]
            c = cnt + ok.to(x.dtype)
            delta = v - mean
            new_mean = torch.where(ok, mean + delta / c.clamp(min=1), mean)
            m2 = torch.where(ok, m2 + delta * (v - new_mean), m2)
            mean, cnt = new_mean, c
    cnt = cnt.expand(rows, threads)
    while mean.shape[-1] > 1:
        h = mean.shape[-1] // 2
        na, nb_ = cnt[:, :h], cnt[:, h:]
        nn = na + nb_
        nb_over_n = torch.where(nn > 0, nb_ / nn.clamp(min=1), torch.zeros_like(nn))
        delta = mean[:, h:] - mean[:, :h]
        mean = mean[:, :h] + delta * nb_over_n
        m2 = m2[:, :h] + m2[:, h:] + delta * delta * na * nb_over_n
        cnt = nn
    return mean[:, 0], m2[:, 0] / n


def _layer_norm(func: Any, args: tuple, kwargs: dict) -> Any:
    b = bind(func, args, kwargs)
    x, shape, w, bias, eps = b["input"], list(b["normalized_shape"]), b.get("weight"), b.get("bias"), b["eps"]
    if not _ok(x) or not shape or func._overloadname != "default":
        return PASS
    k = len(shape)
    n = math.prod(shape)
    acc = _acc(x.dtype)
    rows = x.reshape(-1, n).to(acc)
    mean, var = welford_rows(rows)
    rstd = torch.rsqrt(var + eps)
    y = (rows - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    if w is not None:
        y = y * w.reshape(-1).to(acc)
    if bias is not None:
        y = y + bias.reshape(-1).to(acc)
    stat_shape = list(x.shape[:x.dim() - k]) + [1] * k
    # mean/rstd in the dtype the host's kernel returns (its backward reads them): the parameters'
    # fp32 when they are fp32 and the input is not (ATen's mixed-type layer norm), else the input's
    mixed = any(p is not None and p.dtype != x.dtype for p in (w, bias))
    stat = torch.float32 if mixed else x.dtype
    return (y.to(x.dtype).reshape(x.shape), mean.to(stat).reshape(stat_shape), rstd.to(stat).reshape(stat_shape))


def _add(a: Any, b: Any) -> Any:
    return a + b


def _mul(a: Any, b: Any) -> Any:
    return a * b


_SCANS = {"cumsum": _scan_op(_add, 0.0), "cumprod": _scan_op(_mul, 1.0)}
_REDUCES = {"sum": _sum_mean(False), "mean": _sum_mean(True)}
_SOFTMAX = {"_softmax": _softmax(False), "_log_softmax": _softmax(True)}


def _per_op(table: dict[str, Callable[[Any, tuple, dict], Any]],
            key: Callable[[Any], str] = op_name) -> Callable[[Any, tuple, dict], Any]:
    """A ``Difference.run`` computing each op by its entry in ``table`` (looked up by ``key(func)``)."""
    return lambda func, args, kwargs: table[key(func)](func, args, kwargs)


_SRC = "ATen aten/src/ATen/native/cuda/"
DIFFERENCES = [
    Difference(
        name="scan_in_dtype",
        summary="cumsum/cumprod combine partial results in the tensor's dtype (bf16/fp16 partial sums rounded at "
                "every step) in CUDA's order: blocked Sklansky scan along the last dim, sequential along others, "
                "cub's tiled scan for a single row",
        documented=_SRC + "CumsumKernel.cu and CumprodKernel.cu (std::plus<scalar_t>, std::multiplies<scalar_t>), "
                   "ScanUtils.cuh (scan_dim, tensor_kernel_scan_innermost_dim / _outer_dim); observed on an H100 "
                   "(evidence h100-2026-11-25: cumsum/rows_1024)",
        ops=frozenset({"cumsum", "cumsum_", "cumprod", "cumprod_"}),
        run=_per_op(_SCANS, base_name),
    ),
    Difference(
        name="reduce_tree_order",
        summary="sum/mean accumulate in fp32 (fp64 for fp64) in Reduce.cuh's order: 4-wide vector loads per "
                "thread, per-thread strided accumulators, then a tree over threads; mean multiplies by 1/n",
        documented=_SRC + "Reduce.cuh (ReduceConfig, input_vectorized_thread_reduce_impl, block_x_reduce), "
                   "ReduceSumProdKernel.cu, ReduceMomentKernel.cu (MeanOps)",
        ops=frozenset(_REDUCES), run=_per_op(_REDUCES),
    ),
    Difference(
        name="softmax_tree_order",
        summary="softmax/log_softmax sum exp(x - max) in fp32 over a warp (rows <= 1024) or a block, tree-combined",
        documented=_SRC + "SoftMax.cu (host_softmax, dispatch_softmax_forward, cunn_SoftMaxForward), "
                   "PersistentSoftmax.cuh (warp_reduce)",
        ops=frozenset(_SOFTMAX),
        run=_per_op(_SOFTMAX),
    ),
    Difference(
        name="layer_norm_welford",
        summary="layer_norm's mean and variance by per-thread Welford updates merged by a tree of Chan combines (fp32)",
        documented=_SRC + "layer_norm_kernel.cu (vectorized_layer_norm_kernel, compute_stats), "
                   "block_reduce.cuh / SharedReduceOps.h (WelfordOps::combine)",
        ops=frozenset({"native_layer_norm"}),
        run=_layer_norm,
    ),
]
