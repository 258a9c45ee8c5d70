"""Checked Linear: ``checked_linear`` and ``verify_linear``, a GEMM check whose weight side is encoded once.

The weight is static: :func:`encode_linear` computes ``W_chk^T W``, the bias term and ``||r||`` once
per weight version (cached by :func:`checked_linear`), so a checked call costs one pass over the input
(``x (W^T W_chk)`` and, on the CPU, its row norms) and one over the output, against the GEMM threshold
of :func:`.encoding.gemm_constants` with the bias as one more column of ``x``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mystique.errors import UsageError

from .._kernels import raw
from .cache import BoundedCache
from .device_linear import cuda_like, device_linear, encode_device_linear
from .encoding import CHECK_VECTORS, GemmEncoding, RowChecks, check_weights, checksum_norms, gemm_constants
from .gemm import compiled_cpu, compiled_ok, verify_gemm
from .report import CLEAR, FLOATS, GEMM_LAMBDA, UNIT_ROUNDOFF, CheckReport, dtype_name, np_view


@dataclass
class LinearEncoding:
    """The weight side of a checked ``F.linear(x, W, b)``, computed once per weight version.

    ``w``/``bias`` are the weight and bias in the accumulation dtype (the originals when fp32);
    ``vt`` (P x K) is ``W_chk^T W``, ``vw`` (P,) ``W_chk^T b``, ``vnorm`` the row norms of
    ``[vt | vw]`` and ``rnorm`` the norm of ``[|W|^T e; sum|b|]``.
    """

    w: torch.Tensor
    bias: torch.Tensor | None
    vt: torch.Tensor
    vw: torch.Tensor | None
    vnorm: np.ndarray
    rnorm: float

    @functools.cached_property
    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(vt, vw, W_chk^T)`` as NumPy views for the compiled CPU check (``vw`` empty without a bias)."""
        wt = check_weights(self.w.shape[0], self.w.device, torch.float32)
        return (np_view(self.vt), np_view(self.vw) if self.vw is not None else np.zeros(0, np.float32), np_view(wt))

    def plan(self, m: int, lam: float | None, u: float | None, u_out: float) -> tuple[Any, ...]:
        """``(*views, threshold constants)`` of a compiled check of ``m`` input rows (cached: the call is on
        the hot path of every checked Linear)."""
        plans = self.__dict__.get("_plans")
        if plans is None:
            plans = self.__dict__["_plans"] = BoundedCache()
        return plans.lookup((m, lam, u, u_out), self._make_plan, m, lam, u, u_out)

    def _make_plan(self, m: int, lam: float | None, u: float | None, u_out: float) -> tuple[Any, ...]:
        k, n = self.w.shape[1], self.w.shape[0]
        return (*self.views, gemm_constants(k + (self.bias is not None), m, n,
                                            UNIT_ROUNDOFF[torch.float32] if u is None else u,
                                            GEMM_LAMBDA if lam is None else lam, u_out, torch.float32))


def encode_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearEncoding:
    """Encode a Linear layer's weight (N x K) and bias (N,) for :func:`verify_linear`."""
    if weight.dim() != 2 or (bias is not None and bias.shape != (weight.shape[0],)):
        raise UsageError(f"encode_linear needs an (N, K) weight and an (N,) bias, got {tuple(weight.shape)}"
                         f"{'' if bias is None else ' and ' + str(tuple(bias.shape))}")
    if weight.dtype not in FLOATS:
        raise UsageError(f"checked Linear supports float32, bfloat16 and float16 weights, got {weight.dtype}")
    with torch.no_grad():
        w = weight.detach().float()
        b = bias.detach().float() if bias is not None else None
        wt = check_weights(w.shape[0], w.device, w.dtype)
        vt = wt @ w
        vw = wt @ b if b is not None else None
        vnorm = checksum_norms(vt, vw) if vw is not None else checksum_norms(vt)
        rnorm = RowChecks(np.zeros((CHECK_VECTORS, 0)), vnorm, w[:0], w.t(), b).r_norm()
        return LinearEncoding(w, b, vt, vw, vnorm, rnorm)


def _gemm_encoding(enc: LinearEncoding, ref: torch.Tensor | np.ndarray, x2: torch.Tensor) -> GemmEncoding:
    """The GEMM encoding of one call ``x2 W^T + b`` from its reference checksums ``ref`` (P x M)."""
    rc = RowChecks(ref, enc.vnorm, x2, enc.w.t(), enc.bias, None, enc.rnorm)
    return GemmEncoding(x2.shape[0], x2.shape[1], enc.w.shape[0], rows=rc, bias=enc.bias)


def verify_linear(enc: LinearEncoding, x2: torch.Tensor, y2: torch.Tensor, *, dtype: torch.dtype,
                  lam: float | None = None, u: float | None = None, u_out: float = 0.0,
                  op: str = "linear", exact_ratio: bool = False) -> CheckReport:
    """Check ``y2 = x2 W^T + b`` (2-D, accumulation dtype) against the layer's encoding; returns a report.

    Costs one pass over ``x2`` (the reference checksums) and one over ``y2``; on the CPU both, the
    input's row norms and the verdict against the exact threshold are one compiled pass (:mod:`.._kernels`).
    """
    n, k = enc.w.shape
    if x2.dim() != 2 or y2.dim() != 2 or x2.shape[1] != k or y2.shape != (x2.shape[0], n):
        raise UsageError(f"verify_linear needs x (M, {k}) and y (M, {n}), got {tuple(x2.shape)} and {tuple(y2.shape)}")
    with torch.no_grad():
        if x2.shape[0] and compiled_cpu(x2, y2):  # (no out=: autograd is no obstacle here)
            return CompiledLinear(enc, x2, y2, dtype=dtype, lam=lam, u=u, u_out=u_out, op=op).verdict(exact_ratio)
        ref = torch.addmm(enc.vw[:, None], enc.vt, x2.t()) if enc.vw is not None else enc.vt @ x2.t()
        return verify_gemm(_gemm_encoding(enc, ref, x2), y2, dtype=dtype, lam=lam, u=u, u_out=u_out, op=op,
                           exact_ratio=exact_ratio)


class CompiledLinear:
    """The compiled CPU verdict of one Linear call ``y2 = x2 W^T + b``, prepared (NumPy views, constants,
    buffers, report) before the product writes ``y2``; :meth:`verdict` is then one kernel call (see
    compiled_ok: each Python-level operation here is on the hot path)."""

    def __init__(self, enc: LinearEncoding, x2: torch.Tensor, y2: torch.Tensor | None, *, dtype: torch.dtype,
                 lam: float | None, u: float | None, u_out: float, op: str) -> None:
        self.enc, self.x2, self.y2 = enc, x2, y2
        self.opts = (dtype, lam, u, u_out, op)
        self.buf = np.empty((5, x2.shape[0]))  # ref (2 rows), got (2), the input's row norms (1)
        self.vt, self.vw, self.wt, self.consts = enc.plan(x2.shape[0], lam, u, u_out)
        self.x_np = x2.detach().numpy()
        self.y_np = None if y2 is None else y2.detach().numpy()

    def bind(self, y2: torch.Tensor) -> None:
        """Set the output ``y2`` of a check made with ``y2=None`` (whose :meth:`reference` ran before the
        product)."""
        self.y2, self.y_np = y2, y2.detach().numpy()

    def reference(self) -> None:
        """The pass over x alone (the reference and the input's row norms), before the product (cheaper
        than reading x after it: the product then finds x in the caches)."""
        buf = self.buf
        raw("x_pass")(0, buf.shape[1], self.x_np, self.vt, self.vw, buf[0:2], buf[4])

    def verdict(self, exact_ratio: bool = False, *, referenced: bool = False) -> CheckReport:
        """The verdict on y (after :meth:`reference`: the pass over y alone, else over x and y)."""
        buf, m = self.buf, self.buf.shape[1]
        if referenced:
            worst = raw("mm_exact")(0, m, self.y_np, self.wt, buf[0:2], buf[4], self.enc.rnorm, *self.consts,
                                     buf[2:4])
        else:
            worst = raw("linear_exact")(0, m, self.x_np, self.vt, self.vw, self.y_np, self.wt, self.enc.rnorm,
                                         *self.consts, buf[0:2], buf[2:4], buf[4])
        enc, x2 = self.enc, self.x2
        dtype, lam, u, u_out, op = self.opts
        if not exact_ratio and worst <= CLEAR:  # NaN (something not finite) falls through to the full check
            return CheckReport(op, dtype_name(dtype), False, float(worst), True, [], [], None,
                               (x2.shape[0], x2.shape[1], enc.w.shape[0]))
        ref = self.buf[0:2]
        with np.errstate(invalid="ignore"):  # the full check reuses the kernel's checksums
            diff = np.abs(self.buf[2:4] - ref).max(0)
        return verify_gemm(_gemm_encoding(enc, ref, x2), self.y2, exact_ratio=exact_ratio, diff=diff, dtype=dtype,
                           lam=lam, u=u, u_out=u_out, op=op)


class _LinearCache:
    """Encodings of the weights :func:`checked_linear` saw, keyed by identity and version (weakly held);
    ``make(weight, bias)`` encodes one (:func:`encode_linear`, or the device encoding)."""

    def __init__(self, make: Callable[..., Any] = encode_linear) -> None:
        self.make = make
        self.entries = BoundedCache()  # id(weight) -> (weight ref, bias ref, key, encoding)

    def get(self, weight: torch.Tensor, bias: torch.Tensor | None) -> LinearEncoding:
        # (a new dtype, device or shape comes with new storage: the data pointers cover them)
        key = (weight._version, weight.data_ptr(), weight.shape,
               None if bias is None else (bias._version, bias.data_ptr()))
        hit = self.entries.get(id(weight))
        if hit is not None and hit[0]() is weight and (hit[1]() if hit[1] is not None else None) is bias \
                and hit[2] == key:
            return hit[3]
        enc = self.make(weight, bias)
        if len(self.entries) >= self.entries.limit:
            self.entries.clear()
        if hit is None:  # the encoding (which shares the weight's storage) goes when the weight goes
            weakref.finalize(weight, self.entries.pop, id(weight), None)
        self.entries[id(weight)] = (weakref.ref(weight), weakref.ref(bias) if bias is not None else None, key, enc)
        return enc


_LINEARS = _LinearCache()
_DEVICE_LINEARS = _LinearCache(encode_device_linear)


def checked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   lam: float | None = None, encoding: LinearEncoding | None = None, exact_ratio: bool = False
                   ) -> tuple[torch.Tensor, CheckReport]:
    """``F.linear(x, weight, bias)`` checked like a GEMM (x flattened to 2-D); returns ``(y, report)``.

    The weight side is encoded once per weight version (``encoding``, or a cache keyed by the
    weight tensor itself), so a call costs the product, one pass over ``x`` and one over ``y``.
    On a CUDA device (or under ``--emulate cuda``) the device's own kernel is checked, with the bound
    of that kernel and the verdict computed on the device (:mod:`.device_linear`).
    """
    if encoding is None and cuda_like(x):
        y, chk = device_linear(x, _DEVICE_LINEARS.get(weight, bias), lam=lam)
        return y, (chk.exact(True) if exact_ratio else chk.report())
    enc = encoding if encoding is not None else _LINEARS.get(weight, bias)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if x2.dtype != enc.w.dtype:
        x2 = x2.to(enc.w.dtype)
    if not exact_ratio and x2.shape[0] and x2.shape[1] == enc.w.shape[1] and compiled_ok(x2, enc.w):
        # the compiled CPU verdict prepared before the product, which writes into its buffer
        acc = torch.empty((x2.shape[0], enc.w.shape[0]), dtype=torch.float32, device="cpu")
        run = CompiledLinear(enc, x2, acc, dtype=x.dtype, lam=lam, u=None, u_out=0.0, op="linear")
        run.reference()
        if enc.bias is not None:
            torch.addmm(enc.bias, x2, enc.w.t(), out=acc)  # what F.linear computes for 2-D input
        else:
            torch.mm(x2, enc.w.t(), out=acc)
        rep = run.verdict(referenced=True)
    else:
        acc = F.linear(x2, enc.w, enc.bias)
        # the pass over x after the product, not before it as for checked_mm: measured side by side
        # (n = 1024, this CPU) the Linear costs ~4% more when x is read ahead of F.linear
        rep = verify_linear(enc, x2, acc, dtype=x.dtype, lam=lam, exact_ratio=exact_ratio)
    y = acc if acc.dtype == x.dtype else acc.to(x.dtype)
    return (y if x.dim() == 2 else y.reshape(*x.shape[:-1], enc.w.shape[0])), rep
