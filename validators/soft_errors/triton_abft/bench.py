"""The fused kernels' own GPU figures (issue 32), beside the ``overhead`` group's rows: run by ``.ci/gpu-check``.

``python -m mystique.validators.soft_errors.triton_abft.bench OUT_DIR [--trials N] [--clean N] [--reps N]``
writes ``OUT_DIR/results.csv`` (the results schema: one ``info`` row per figure, its target's verdict in the
detail) and ``meta.json`` (``python docs/figures.py keep NAME OUT_DIR`` keeps them), and exits 0 (every
figure with a target meets it), 1 (one misses it), 4 (none misses, one is undecided) or 3 (no CUDA).

* ``gemm_overhead_<dtype>_2048``: ``checked_mm`` (the fused kernel, b's checksums encoded per call, the
  verdict read back) against ``a @ b``, bf16 and fp16 at n = 2048, interleaved rounds timed with CUDA
  events (:func:`..overhead.time_interleaved`), median paired ratio with its 95% interval; target 10%.
  ``gemm_overhead_cached_<dtype>_2048``: the same product with b's checksums cached (a weight), the
  verdicts read back 64 at a time (as ``protect()``): a measurement.
* ``detection_<class>``: flips of the fp32 accumulator inside the kernel (``flip=``), bits drawn from each
  bit class of float32 (:func:`mystique.faults.bits.bit_classes`), a random element of a 256 x 512 x 384
  bf16 Linear; a flip counts where it is significant (its change above 2^-7 of the product's rms, or not
  finite); detected where the call alarms. Target: the Wilson 95% lower bound at least 0.999.
* ``false_positives``: clean checked calls (bf16/fp16/TF32 Linear of three shapes, fresh x each call, and
  fp32/8-bit EmbeddingBag, 2048 bags of 40 at D = 128): alarms counted, target 0.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from mystique.binomial import wilson
from mystique.faults.bits import bit_classes

#: the device measured: cuda; cpu smoke-tests this script at small sizes under TRITON_INTERPRET=1
DEV = "cuda"
SMALL = False


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _row(rows: list[dict], name: str, value: float, low: float | None = None, high: float | None = None,
         target: str = "", status: str = "info", detail: str = "") -> None:
    """One figure. Kept as an ``info`` row of the results schema (a measured figure), the verdict against
    its target in ``verdict`` (the exit code) and in the detail."""
    rows.append({"name": name, "value": value, "low": low, "high": high, "target": target, "verdict": status,
                 "detail": detail + (f"; target {target}: {status}" if target else "")})
    print(f"{name}: {value:.6g} [{low}, {high}] {target} {status}", flush=True)


def _write(rows: list[dict], out: Path, argv: list[str], wall: float, code: int) -> None:
    """``results.csv`` (the results schema, suite soft_errors) and ``meta.json`` (for ``docs/figures.py keep``)."""
    import json

    from mystique.results import Results, RunContext, write_csv

    res = Results(RunContext(device=DEV, device_name=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu",
                             torch_version=torch.__version__), "soft_errors")
    for r in rows:
        check = "gemm_overhead" if r["name"].startswith("gemm") else r["name"].split("_")[0] \
            if r["name"].startswith("detection") else r["name"]
        res.add(f"fused_{check}", r["name"], "value", r["value"], status="info", low=r["low"], high=r["high"],
                detail=r["detail"])
    out.mkdir(parents=True, exist_ok=True)
    write_csv(res.frame(), out / "results.csv")
    cmd = "python -m mystique.validators.soft_errors.triton_abft.bench OUT " + " ".join(argv)
    (out / "meta.json").write_text(json.dumps({"command": cmd.strip(), "exit_code": code, "wall_s": round(wall, 1),
                                               "note": "issue 32: the fused Triton kernels' GPU figures",
                                               "load_note": ""}, indent=1))


def _gemm_functions(dtype: torch.dtype, n: int) -> dict:
    from ..abft import checked_mm
    from ..abft.device_check import resolve
    from ..abft.device_linear import encode_device_linear
    from .linear import fused_linear

    g = torch.Generator(device=DEV).manual_seed(0)
    a = torch.randn(n, n, device=DEV, generator=g).to(dtype)
    b = torch.randn(n, n, device=DEV, generator=g).to(dtype)
    enc = encode_device_linear(b.t())
    pending: list = []

    def cached() -> None:
        pending.append(fused_linear(a, enc)[1])
        if len(pending) >= 64:
            bad = [r.describe() for r in resolve(pending) if r.alarm]
            pending.clear()
            if bad:
                raise RuntimeError(f"clean fused GEMM raised an alarm: {bad[0]}")

    return {"mm": lambda: a @ b, "mm_again": lambda: a @ b, "checked_mm": lambda: checked_mm(a, b), "cached": cached}


def overhead(rows: list[dict], reps: int) -> None:
    from ..overhead import time_interleaved

    n = 64 if SMALL else 2048
    for dtype in (torch.bfloat16, torch.float16):
        t = time_interleaved(_gemm_functions(dtype, n), reps, device=DEV, threads=1, sync=_sync)
        name = str(dtype).removeprefix("torch.")
        for key, row, target in (("checked_mm", f"gemm_overhead_{name}_{n}", 0.10),
                                 ("cached", f"gemm_overhead_cached_{name}_{n}", None),
                                 ("mm_again", f"gemm_aa_{name}_{n}", None)):
            lo, hi = t.interval(key, "mm")
            status = "info" if target is None else ("pass" if hi <= target else "fail" if lo > target else
                                                   "inconclusive")
            _row(rows, row, t.overhead(key, "mm"), lo, hi, "" if target is None else f"<= {target:.0%}", status,
                 f"{t.clock}, median of {t.reps} paired ratios vs a @ b, n = {n}")


def detection(rows: list[dict], trials: int) -> None:
    from ..abft.device_check import resolve
    from ..abft.device_linear import encode_device_linear
    from .linear import fused_linear

    m, k, n = (24, 40, 32) if SMALL else (256, 512, 384)
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device=DEV, generator=g) / math.sqrt(k)).to(torch.bfloat16)
    b = torch.randn(n, device=DEV, generator=g).to(torch.bfloat16)
    enc = encode_device_linear(w, b)
    acc = (x.double() @ w.double().t() + b.double()).float().cpu()
    rms = float(acc.double().square().mean().sqrt())
    rng = torch.Generator().manual_seed(2)
    for cls, bits in bit_classes(torch.float32).items():
        if cls == "any":
            continue
        sig = hit = located = 0
        for s in range(0, trials, 256):
            cnt = min(256, trials - s)
            ii = torch.randint(0, m, (cnt,), generator=rng).tolist()
            jj = torch.randint(0, n, (cnt,), generator=rng).tolist()
            bb = [bits[q] for q in torch.randint(0, len(bits), (cnt,), generator=rng).tolist()]
            checks, keep = [], []
            for i, j, bit in zip(ii, jj, bb):
                v = acc[i, j:j + 1].clone()
                v.view(torch.int32).bitwise_xor_(1 << bit if bit < 31 else -(1 << 31))
                change = abs(float(v) - float(acc[i, j]))
                if math.isfinite(change) and change <= 2.0**-7 * rms:
                    continue
                mask = (1 << bit) - (1 << 32 if bit == 31 else 0)
                checks.append(fused_linear(x, enc, flip=(i, j, mask))[1])
                keep.append((i, j))
            for (i, j), rep in zip(keep, resolve(checks)):
                sig += 1
                hit += bool(rep.alarm and i in rep.rows)
                located += rep.location == (i, j)
        lo, hi = wilson(hit, sig)
        status = "inconclusive" if sig == 0 else ("pass" if lo >= 0.999 else "fail" if hi < 0.999 else "inconclusive")
        _row(rows, f"detection_{cls}", hit / sig if sig else float("nan"), lo, hi, ">= 0.999 (lower bound)", status,
             f"{hit} of {sig} significant accumulator flips (of {trials} drawn) alarmed at their row, {located} "
             f"located at their element; bf16 Linear "
             f"{m}x{k}x{n}")


def false_positives(rows: list[dict], calls: int) -> None:
    from ..abft.bag_verdict import EmbeddingChecks
    from ..abft.device_check import resolve
    from ..abft.device_linear import encode_device_linear
    from ..abft.quantized import QuantizedTable
    from .bag import fused_embedding_bag, fused_quantized_bag
    from .linear import fused_linear

    alarms = done = 0
    g = torch.Generator(device=DEV).manual_seed(3)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # (TF32 allowed: the fp32 Linear is checked as TF32)
    setups = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, k, n in ((16, 24, 40),) if SMALL else ((512, 1024, 1024), (77, 4096, 1000), (2048, 256, 4096)):
            w = (torch.randn(n, k, device=DEV, generator=g) / math.sqrt(k)).to(dtype)
            setups.append(("linear", encode_device_linear(w, torch.randn(n, device=DEV, generator=g).to(dtype)),
                           (m, k, dtype)))
    rows_, d, nb, length = (500, 16, 32, 8) if SMALL else (100_000, 128, 2048, 40)
    table = torch.randn(rows_, d, device=DEV, generator=g)
    setups.append(("bag", (table, EmbeddingChecks.of(table)), None))
    qt = QuantizedTable.from_float(table.cpu())
    qt = QuantizedTable(qt.packed.to(DEV), EmbeddingChecks(qt.checks.rowsum.to(DEV), qt.checks.absum.to(DEV)), d)
    setups.append(("bag8", qt, None))
    off = torch.arange(0, nb * length, length, device=DEV)
    pending = []
    for c in range(calls):
        kind, obj, shape = setups[c % len(setups)]
        if kind == "linear":
            x = torch.randn(shape[0], shape[1], device=DEV, generator=g).to(shape[2])
            pending.append(fused_linear(x, obj)[1])
        else:
            idx = torch.randint(0, rows_, (nb * length,), device=DEV, generator=g)
            pending.append(fused_embedding_bag(*obj, idx, off)[1] if kind == "bag" else
                           fused_quantized_bag(obj, idx, off)[1])
        if len(pending) >= 256 or c == calls - 1:
            alarms += sum(r.alarm for r in resolve(pending))
            done += len(pending)
            pending.clear()
    torch.set_float32_matmul_precision(precision)
    _row(rows, "false_positives", alarms, 0, None, "0", "pass" if alarms == 0 else "fail",
         f"{alarms} alarms in {done} clean checked calls (bf16/fp16/TF32 Linear, 3 shapes, fresh x; fp32 and 8-bit "
         "EmbeddingBag, 2048 bags of 40, D = 128)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--trials", type=int, default=4000, help="flips drawn per bit class")
    p.add_argument("--clean", type=int, default=30000, help="clean checked calls")
    p.add_argument("--reps", type=int, default=41, help="interleaved rounds of the GEMM timing")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a smoke test of this script at small sizes (needs TRITON_INTERPRET=1)")
    args = p.parse_args(argv)
    global DEV, SMALL
    DEV, SMALL = args.device, args.device == "cpu"
    if DEV == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device: nothing measured")
        return 3
    rows: list[dict] = []
    t0 = time.perf_counter()
    overhead(rows, args.reps)
    false_positives(rows, args.clean)
    detection(rows, args.trials)
    verdicts = {r["verdict"] for r in rows}
    code = 1 if "fail" in verdicts else 4 if "inconclusive" in verdicts else 0
    _write(rows, Path(args.out), (argv if argv is not None else sys.argv[1:])[1:], time.perf_counter() - t0, code)
    return code

if __name__ == "__main__":
    sys.exit(main())
