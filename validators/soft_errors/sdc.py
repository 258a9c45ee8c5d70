"""SDC screening by repeat-and-compare, stricter than ``dcgmi diag`` / OpenDCDiag style checks.

Each kernel runs ``runs`` times on the device under test with seeded inputs. Every run is compared
bit-exactly with the first run (a healthy device is deterministic for a fixed kernel, shape and
thread count) and with an fp64 golden computed on the CPU outside the device-under-test mode, held to
a rounding-error bound. A mismatch is reported with everything needed to reproduce it: the kernel,
seed, run, first mismatching element (flat and multi-index), expected and actual values and the XOR
of their bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .bits import int_view, xor_hex


@dataclass
class Kernel:
    """A screened kernel: ``make(seed) -> inputs`` (CPU), ``run(inputs on device) -> tensor``,
    ``golden(inputs) -> (fp64 result, per-element bound)``."""

    name: str
    dtype: str
    make: Callable[[int], tuple[torch.Tensor, ...]]
    run: Callable[..., torch.Tensor]
    golden: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    #: why the kernel's runs may legitimately differ on a CUDA device (atomics), or "" (deterministic)
    varies_on_cuda: str = ""


def repeat_case(kernel: Kernel, cuda: bool, deterministic: bool) -> str:
    """How runs of ``kernel`` are compared with run 0: ``bitwise`` where the device computes it
    deterministically, ``bound`` where its summation order may vary run to run (``varies_on_cuda`` on a
    CUDA device without ``torch.use_deterministic_algorithms``): then each run lies within the fp64
    golden's bound ``b`` of the exact result, so two runs lie within ``2 b`` of each other."""
    return "bound" if cuda and kernel.varies_on_cuda and not deterministic else "bitwise"


@dataclass
class ScreenResult:
    kernel: str
    dtype: str
    seed: int
    runs: int
    mismatched_runs: list[int] = field(default_factory=list)
    first_mismatch: dict[str, Any] | None = None
    golden_ratio: float = 0.0  # max |run - fp64| / bound over runs (<= 1 is healthy)
    golden_bad_runs: list[int] = field(default_factory=list)
    case: str = "bitwise"
    why: str = ""

    def case_words(self) -> str:
        if self.case == "bitwise":
            return "repeat-and-compare bit-exact (deterministic on this device)"
        return f"repeat-and-compare within 2x the fp64 bound, not bit-exact ({self.why})"

    @property
    def ok(self) -> bool:
        return not self.mismatched_runs and not self.golden_bad_runs

    def describe(self) -> str:
        if self.ok:
            same = "bit-identical" if self.case == "bitwise" else "within 2x the fp64 bound of run 0"
            return f"{self.kernel} seed={self.seed}: {self.runs} runs {same}, within fp64 bound; {self.case_words()}"
        fm = self.first_mismatch or {}
        return (f"{self.kernel} seed={self.seed}: runs {self.mismatched_runs[:8]} differ from run 0; first at run "
                f"{fm.get('run')} index {fm.get('index')} {tuple(fm.get('multi_index', ()))}: expected "
                f"{fm.get('expected')!r} actual {fm.get('actual')!r} xor {fm.get('xor')}; "
                f"fp64 bound exceeded in runs {self.golden_bad_runs[:8]} (max ratio {self.golden_ratio:.3g}); "
                f"{self.case_words()}")


def _gemm_kernel(n: int, dtype: torch.dtype) -> Kernel:
    u = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]

    def make(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)

    def golden(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a64, b64 = a.double(), b.double()
        ref = a64 @ b64
        # fp32 accumulation bound gamma_K |A||B| plus the rounding of the output to its dtype
        bound = 2.0**-24 * (n + 2) * (a64.abs() @ b64.abs()) + u * ref.abs() + 1e-300
        return ref, bound

    return Kernel(f"gemm_{n}", str(dtype)[6:], make, lambda a, b: a @ b, golden)


def _embedding_kernel(rows: int, d: int, bags: int, length: int) -> Kernel:
    def make(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(rows, d, generator=g)
        idx = torch.randint(0, rows, (bags * length,), generator=g)
        return w, idx, torch.arange(0, bags * length, length)

    def golden(w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ref = F.embedding_bag(idx, w.double(), off, mode="sum")
        bound = 2.0**-24 * (length + 1) * F.embedding_bag(idx, w.double().abs(), off, mode="sum") + 1e-300
        return ref, bound

    return Kernel(f"embedding_bag_{rows}x{d}", "float32", make,
                  lambda w, idx, off: F.embedding_bag(idx, w, off, mode="sum"), golden)


def _softmax_kernel(rows: int, cols: int) -> Kernel:
    def make(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(rows, cols, generator=g) * 4,)

    def golden(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ref = torch.softmax(x.double(), -1)
        return ref, 2.0**-24 * (cols + 8) * ref.abs() + 2.0**-24 * 1e-6

    return Kernel(f"softmax_{rows}x{cols}", "float32", make, lambda x: torch.softmax(x, -1), golden)


def _index_add_kernel(rows: int, d: int, n: int) -> Kernel:
    def make(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, rows, (n,), generator=g), torch.randn(n, d, generator=g)

    def golden(idx: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ref = torch.zeros(rows, d, dtype=torch.float64).index_add_(0, idx, src.double())
        count = torch.bincount(idx, minlength=rows).double()[:, None]
        # any order of the count_r additions into a zero row: gamma_count(u) sum |terms|
        bound = 2.0**-24 * count * torch.zeros(rows, d, dtype=torch.float64).index_add_(0, idx, src.double().abs())
        return ref, bound + 1e-300

    return Kernel(f"index_add_{rows}x{d}", "float32", make,
                  lambda idx, src: torch.zeros(rows, d, device=src.device).index_add_(0, idx, src), golden,
                  varies_on_cuda="index_add_ on CUDA adds with atomicAdd: the order of duplicate indices varies")


def _embedding_backward_kernel(rows: int, d: int, bags: int, length: int) -> Kernel:
    base = _embedding_kernel(rows, d, bags, length)

    def make(seed: int) -> tuple[torch.Tensor, ...]:
        w, idx, off = base.make(seed)
        return w, idx, off, torch.randn(bags, d, generator=torch.Generator().manual_seed(seed + 1))

    def run(w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            leaf = w.detach().requires_grad_()
            F.embedding_bag(idx, leaf, off, mode="sum").backward(grad)
        return leaf.grad

    def golden(w: torch.Tensor, idx: torch.Tensor, off: torch.Tensor, grad: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        bag = torch.arange(bags).repeat_interleave(length)
        terms = grad.double()[bag]
        ref = torch.zeros(rows, d, dtype=torch.float64).index_add_(0, idx, terms)
        count = torch.bincount(idx, minlength=rows).double()[:, None]
        bound = 2.0**-24 * count * torch.zeros(rows, d, dtype=torch.float64).index_add_(0, idx, terms.abs())
        return ref, bound + 1e-300

    return Kernel(f"embedding_bag_backward_{rows}x{d}", "float32", make, run, golden,
                  varies_on_cuda="the embedding backward on CUDA accumulates duplicate indices in an order that "
                                 "varies (atomics)")


def default_kernels(level: str = "quick") -> list[Kernel]:
    """The screened kernels: fp32/bf16 GEMMs, an EmbeddingBag and its backward, an index_add and a softmax
    (larger at ``full``)."""
    n = 256 if level == "quick" else 1024
    return [_gemm_kernel(n, torch.float32), _gemm_kernel(n, torch.bfloat16), _gemm_kernel(n // 2 + 3, torch.float32),
            _embedding_kernel(4096, 64, 256, 20), _embedding_backward_kernel(512, 32, 64, 20),
            _index_add_kernel(256, 32, 4096), _softmax_kernel(256, 1000)]


def _first_mismatch(ref: torch.Tensor, out: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    if ref.shape != out.shape or ref.dtype != out.dtype:
        return (-1, ())
    diff = int_view(ref.contiguous()) != int_view(out.contiguous())
    if not bool(diff.any()):
        return None
    flat = int(torch.nonzero(diff.reshape(-1))[0])
    multi = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape))
    return flat, multi


def _beyond(ref: torch.Tensor, out: torch.Tensor, bound: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """The first element where ``out`` differs from ``ref`` by more than ``bound`` (NaN counts), or None."""
    if ref.shape != out.shape or ref.dtype != out.dtype:
        return (-1, ())
    bad = ~((out.double() - ref.double()).abs() <= bound)
    if not bool(bad.any()):
        return None
    flat = int(torch.nonzero(bad.reshape(-1))[0])
    return flat, tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape))


def screen(kernel: Kernel, *, seed: int, runs: int, device: str,
           active: Callable[[], AbstractContextManager[Any]], emulated_cuda: bool = False) -> ScreenResult:
    """Run ``kernel`` ``runs`` times on ``device`` inside ``active()``; compare with run 0 (bit-exactly, or
    within the bound where the device's order varies: :func:`repeat_case`; ``emulated_cuda`` for a device
    emulating CUDA) and with fp64."""
    inputs_cpu = kernel.make(seed)
    golden, bound = kernel.golden(*inputs_cpu)  # outside the device-under-test mode
    inputs = tuple(t.to(device) for t in inputs_cpu)
    cuda = torch.device(device).type == "cuda" or emulated_cuda
    case = repeat_case(kernel, cuda, torch.are_deterministic_algorithms_enabled())
    res = ScreenResult(kernel.name, kernel.dtype, seed, runs, case=case, why=kernel.varies_on_cuda)
    first: torch.Tensor | None = None
    for r in range(runs):
        with torch.no_grad(), active():
            out = kernel.run(*inputs)
        out = out.detach().cpu().clone()
        ratio = ((out.double() - golden).abs() / bound)
        worst = float(ratio.nan_to_num(math.inf).max()) if ratio.numel() else 0.0
        res.golden_ratio = max(res.golden_ratio, worst)
        if worst > 1.0:
            res.golden_bad_runs.append(r)
        if first is None:
            first = out
            continue
        mm = _first_mismatch(first, out) if case == "bitwise" else _beyond(first, out, 2 * bound)
        if mm is not None:
            res.mismatched_runs.append(r)
            if res.first_mismatch is None:
                flat, multi = mm
                exp = first.reshape(-1)[flat] if flat >= 0 else first.reshape(-1)[0]
                act = out.reshape(-1)[flat] if flat >= 0 else out.reshape(-1)[0]
                res.first_mismatch = {"run": r, "index": flat, "multi_index": list(multi),
                                      "expected": float(exp), "actual": float(act), "xor": xor_hex(exp, act)}
    if res.first_mismatch is None and res.golden_bad_runs:
        # run 0 itself (or every run alike) is off: report its worst element against fp64
        out0 = first if first is not None else golden
        ratio = ((out0.double() - golden).abs() / bound).nan_to_num(math.inf)
        flat = int(ratio.reshape(-1).argmax())
        multi = [int(i) for i in torch.unravel_index(torch.tensor(flat), golden.shape)]
        exp = golden.reshape(-1)[flat].to(out0.dtype)
        act = out0.reshape(-1)[flat]
        res.first_mismatch = {"run": res.golden_bad_runs[0], "index": flat, "multi_index": multi,
                              "expected": float(golden.reshape(-1)[flat]), "actual": float(act),
                              "xor": xor_hex(exp, act)}
    return res
