"""The soft-error validator: ``run(target, level=..., groups=...)`` -> results rows (suite ``soft_errors``).

Groups (``groups(level)``):

* ``abft_gemm``          checked GEMM per dtype and checked Linear layers of a workload: clean run passes,
                         an injected accumulator/operand/output flip is detected and located; bf16/fp16 on the
                         device's own half-precision GEMM (its fp32 output where the backend has one, else its
                         rounded output with the rounding in the threshold), int8 on its int8 GEMM;
* ``abft_embedding_bag`` checked EmbeddingBag (fp32 sum/mean, 8-bit row-wise sum/mean): same;
* ``false_positives``    clean checked operations (random shapes, scales, distributions, dtypes) and
                         protected workload forwards: alarms must be zero; rate with Wilson interval;
* ``detection_campaign`` injected flips per op, site, bit class and pattern: detection rate of
                         significant flips (Wilson interval, trials), benign flips counted apart;
* ``pvf``                Parameter Vulnerability Factor per parameter group of DLRM, BERT, Llama (measurements:
                         status ``info``);
* ``sdc_screen``         repeat-and-compare screening with fp64 goldens;
* ``overhead``           checked / unchecked time - 1 of the product's checked paths: fp32 GEMM, Linear and
                         protected Linear (n >= 1024: target 5%), EmbeddingBag fp32 / 8-bit / protected
                         (target 10%), with an A/A row giving the resolution and ``abft_floor`` rows (the
                         bare memory traffic of a check, no verdict) (seeded random order each
                         round, median of paired ratios with a 95% order-statistics interval, which decides:
                         pass inside the target, fail above it, inconclusive across it; see :mod:`.overhead`).

Rows without a verdict (rates without a target, interval bounds, trial counts, PVFs, times and
overheads without a target) are measurements, status ``info``.

Every operator of the device under test runs inside ``target.active()``; goldens outside it.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from mystique.errors import UsageError
from mystique.progress import Progress
from mystique.results import Results, RunContext

from . import abft, campaign, half, overhead, pvf, sdc
from .bits import flip_random
from .inject import flip_module_output, flip_tensor, hash_seed
from .protect import protect
from .stats import wilson

GROUPS = ("abft_gemm", "abft_embedding_bag", "false_positives", "detection_campaign", "pvf", "sdc_screen",
          "overhead")
DETECTION_TARGET = 0.999
OVERHEAD_TARGETS = overhead.TARGETS

LEVELS: dict[str, dict[str, Any]] = {
    "quick": {"trials": 900, "fp_trials": 2000, "pvf_trials": 24, "pvf_config": "debug", "sdc_runs": 4,
              "overhead_sizes": (1024, 2048), "overhead_reps": 31, "overhead_threads": 1,
              "overhead_tables": ((100_000, 64, 2048, 40), (100_000, 128, 2048, 40)),
              "workloads": ("dlrm", "bert", "llama")},
    "full": {"trials": 30000, "fp_trials": 30000, "pvf_trials": 200, "pvf_config": "small", "sdc_runs": 20,
             "overhead_sizes": (1024, 2048), "overhead_reps": 41, "overhead_threads": 1,
             "overhead_tables": ((100_000, 16, 2048, 40), (100_000, 64, 2048, 40), (100_000, 128, 2048, 40),
                                 (1_000_000, 64, 2048, 20), (100_000, 256, 512, 100)),
             "workloads": ("dlrm", "bert", "llama")},
}


def groups(level: str = "quick") -> list[str]:
    """Names of the check groups run at ``level``.

    ``overhead`` (a property of the checker, timed, so sensitive to a busy host) runs at ``full`` or
    when named; ``quick`` runs the others, sized small.
    """
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    return [g for g in GROUPS if level == "full" or g != "overhead"]


@contextlib.contextmanager
def _threads(device: str, n: int | None) -> Iterator[None]:
    """Small-op campaigns run single-threaded on the CPU (thread wake-ups dominate tiny kernels)."""
    if n is None or torch.device(device).type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _rate_rows(res: Results, check: str, subject: str, dtype: str, metric: str, hits: int, n: int, *,
               target: float | None, higher_is_better: bool, detail: str) -> None:
    """Rows ``metric``, ``metric_ci_low``, ``metric_ci_high`` and ``trials`` for one rate.

    The rate is a check (pass/fail against ``target``) where it has a target, else a measurement
    (``info``); its interval bounds and the trial count are always measurements."""
    lo, hi = wilson(hits, n)
    rate = hits / n if n else math.nan
    if n == 0:
        status = "skip"
    elif target is None:
        status = "info"
    else:
        status = "pass" if (rate >= target if higher_is_better else rate <= target) else "fail"
    res.add(check, subject, metric, rate, status=status, threshold=target, dtype=dtype, detail=detail)
    res.add(check, subject, f"{metric}_ci_low", lo, status="info" if n else "skip", dtype=dtype,
            detail="Wilson 95% interval")
    res.add(check, subject, f"{metric}_ci_high", hi, status="info" if n else "skip", dtype=dtype,
            detail="Wilson 95% interval")
    res.add(check, subject, "trials", n, status="info", dtype=dtype)


# ----------------------------------------------------------------------------- groups

def _group_abft_gemm(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    dev = target.device
    for dt in ("float32", "bfloat16", "float16", "int8"):
        g = torch.Generator().manual_seed(seed)
        shape = (64, 80, 48)
        if dt == "int8":
            a = torch.randint(-128, 128, shape[:2], generator=g, dtype=torch.int8)
            b = torch.randint(-128, 128, shape[1:], generator=g, dtype=torch.int8)
        else:
            a = torch.randn(shape[:2], generator=g).to(getattr(torch, dt))
            b = torch.randn(shape[1:], generator=g).to(getattr(torch, dt))
        a, b = a.to(dev), b.to(dev)
        golden = abft._accumulate(a.cpu(), b.cpu())
        # bf16/fp16: the device's own half-precision GEMM, through its fp32 output where it has one, else
        # with its rounded output (the fp32 GEMM of upcast operands would not run the half-precision units)
        kind = ""
        if a.dtype in half.HALF:
            with target.active():
                kind = "fp32_out" if abft.half_kind(a) == "fp32_out" else "rounded"
        how = f"; {half.describe(kind, a.dtype)}" if kind else ""
        with target.active():
            c, rep = abft.checked_mm(a, b, check_rounded=kind == "rounded")
        expect = golden if dt in ("float32", "int8") else golden.to(a.dtype)
        ratio, at, bound = _golden_deviation(c, expect, a, b, dt, kind)
        wrong = not ratio <= 1.0  # (NaN: wrong)
        res.add("abft_gemm", "checked_mm", "clean_alarm", float(rep.alarm), dtype=dt, threshold=0,
                status="fail" if rep.alarm or wrong else "pass",
                detail=f"{rep.describe()} seed={seed}; max |c - golden| / bound = {ratio:.3g}"
                       + (f" at {at}" if at is not None else "") + f" against the CPU golden, {bound}"
                       + ("; the product differs from the CPU golden beyond its bound" if wrong else "") + how)
        # one flip in the accumulator (the rounded output where that is what the device gives), between
        # product and check
        bit_class = "high" if dt == "int8" else "exponent"
        with target.active():
            enc = abft.encode_gemm(a, b) if dt == "int8" else abft.encode_gemm(a.float(), b.float())
            if kind == "rounded":
                out = half.rounded_half_mm(a, b)
                # its largest element: an exponent flip moves it by >= |c_ij| / 2, well above the rounding
                # bound of its row (u_out sum_j |c_ij|), which a smaller element's flip may stay under
                rec = flip_random(out, random.Random(hash_seed(seed, "abft_gemm", dt)), bit_class=bit_class,
                                  site="gemm_output", target=f"gemm_{dt}", seed=seed,
                                  index=int(out.float().abs().argmax()))
                rep = abft.verify_gemm(enc, out.float(), dtype=a.dtype, u=half.accumulation_u(a),
                                       u_out=abft.UNIT_ROUNDOFF[a.dtype], op="gemm_rounded")
            else:
                acc = abft._accumulate(a, b)
                rec = flip_tensor(acc, seed=seed, site="gemm_output", name=f"gemm_{dt}", bit_class=bit_class)
                rep = abft.verify_gemm(enc, acc, dtype=a.dtype)
        i, j = divmod(rec.index, shape[2])
        located = rep.location == (i, j)
        res.add("abft_gemm", "checked_mm", "injected_detected", float(rep.alarm and located), dtype=dt,
                threshold=1, status="pass" if rep.alarm and located else "fail",
                detail=f"{rec.describe()}; {rep.describe()} (expected location {(i, j)}){how}")
    # checked Linear layers of a real workload (DLRM debug), with a flip in one Linear output
    wl = _workload("dlrm")
    if wl is None:
        res.add("abft_gemm", "protect_dlrm", "injected_detected", math.nan, status="skip",
                detail="mystique.workloads.dlrm is not available")
        return
    mod, cfg = wl
    model = mod.build_model(cfg, device=torch.device(dev), dtype=torch.float32, seed=seed).eval()
    batch = mod.make_batch(cfg, device=torch.device(dev), seed=seed)
    linear_name = next(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad(), protect(model) as guard:
        with target.active():
            mod.forward(model, batch)
        clean_alarms = len(guard.alarms)
        with flip_module_output(model.get_submodule(linear_name), seed=seed, bit_class="exponent",
                                name=linear_name) as recs, target.active():
            mod.forward(model, batch)
    hit = [a for a in guard.alarms[clean_alarms:] if a.module == linear_name]
    res.add("abft_gemm", "protect_dlrm", "injected_detected", float(bool(hit)), threshold=1, dtype="float32",
            status="pass" if hit and clean_alarms == 0 else "fail",
            detail=f"{recs[0].describe() if recs else 'no flip'}; clean alarms {clean_alarms}; "
                   f"{hit[0].describe() if hit else 'not detected'}")


def _golden_deviation(c: torch.Tensor, expect: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt: str, kind: str
                      ) -> tuple[float, tuple[int, int] | None, str]:
    """``(max_ij |c - golden|_ij / bound_ij, its (i, j) or None, the bound in words)`` of a clean checked product.

    int8: the int32 product is exact, bound 0 (any difference: inf). Floats: the device's product and the
    CPU golden (the fp32 GEMM of the same operands) each lie within ``gamma_k(u) (|A||B|)_ij`` of the exact
    product (``gamma_k(u) = k u / (1 - k u)``, ``u`` of each accumulation: the ABFT threshold's GEMM error
    bound), and a bf16/fp16 output is rounded once more on each side (``u_out (1 + gamma) (|A||B|)_ij``,
    plus half the subnormal spacing), so ``|c - golden|_ij <= (gamma_dev + gamma_cpu + 2 u_out (1 + gamma))
    (|A||B|)_ij + 2 s``.
    """
    got, ref = c.detach().cpu(), expect.detach().cpu()
    if dt == "int8":
        diff = torch.nonzero(got.to(torch.int64) != ref.to(torch.int64))
        at = tuple(int(v) for v in diff[0]) if len(diff) else None
        return (math.inf if at is not None else 0.0), at, "bound 0 (exact int32 product)"  # type: ignore[return-value]
    k = a.shape[1]
    low = a.dtype in half.HALF
    u_dev = half.accumulation_u(a) if low else half.U32
    u_cpu = half.U32

    def gamma(u: float) -> float:
        return k * u / (1 - k * u) if k * u < 1 else math.inf

    u_out = half.U_HALF[a.dtype] if low else 0.0
    floor = 2 * half.SUBNORMAL_HALF_SPACING[a.dtype] if low else 0.0
    coef = gamma(u_dev) + gamma(u_cpu) + 2 * u_out * (1 + max(gamma(u_dev), gamma(u_cpu)))
    bound = coef * (a.detach().cpu().double().abs() @ b.detach().cpu().double().abs()) + floor
    err = (got.double() - ref.double()).abs()
    with torch.no_grad():
        r = torch.where(err == 0, torch.zeros_like(err), err / bound)
        r = torch.where(torch.isfinite(got.double()), r, torch.full_like(r, math.inf))
    flat = int(r.argmax()) if r.numel() else 0
    ratio = float(r.reshape(-1)[flat]) if r.numel() else 0.0
    at = divmod(flat, r.shape[1]) if ratio > 0 else None

    def p2(u: float) -> str:
        return f"2^{int(math.log2(u))}"

    text = (f"bound (gamma_{k}(u={p2(u_dev)}) [device] + gamma_{k}(u={p2(u_cpu)}) [CPU golden]"
            + (f" + 2 u_out (1 + gamma) with u_out = {p2(u_out)}) (|A||B|)_ij + 2 x {floor / 2:.3g} (subnormal "
               "rounding)" if low else ") (|A||B|)_ij")
            + f", gamma_k(u) = k u / (1 - k u) (the GEMM error bound of the ABFT threshold, {coef:.3g} x (|A||B|)_ij)")
    return ratio, at, text


def _group_abft_embedding(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    dev = target.device
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(500, 32, generator=g)
    idx = torch.randint(0, 500, (160,), generator=g)
    off = torch.arange(0, 160, 10)
    for quant in (False, True):
        for mode in ("sum", "mean"):
            name = f"embedding_bag_{'8bit_' if quant else ''}{mode}"
            ref = F.embedding_bag(idx, (abft.QuantizedTable.from_float(w).dequantize() if quant else w).double(),
                                  off, mode=mode)
            if quant:
                table = abft.QuantizedTable.from_float(w.to(dev))
                with target.active():
                    out, rep = abft.checked_quantized_embedding_bag(table, idx.to(dev), off.to(dev), mode)
                corrupt = table.packed.clone()
                row = int(idx[7])
                from .bits import flip_bits_

                flip_bits_(corrupt, row * corrupt.shape[1] + 3, [7])
                bad = abft.QuantizedTable(corrupt, table.checks, table.dim)
                with target.active():
                    _, rep2 = abft.checked_quantized_embedding_bag(bad, idx.to(dev), off.to(dev), mode)
                what = f"row {row} code byte 3 bit 7"
            else:
                table = abft.checked_table(w.to(dev))
                with target.active():
                    out, rep = abft.checked_embedding_bag(table, idx.to(dev), off.to(dev), mode)
                corrupt = table.weight.clone()
                row = int(idx[7])
                from .bits import flip_bits_

                flip_bits_(corrupt, row * corrupt.shape[1] + 5, [27])
                with target.active():
                    _, rep2 = abft.checked_embedding_bag(abft.CheckedTable(corrupt, table.checks), idx.to(dev),
                                                         off.to(dev), mode)
                what = f"row {row} col 5 bit 27"
            err = float((out.cpu().double() - ref).abs().max())
            res.add("abft_embedding_bag", name, "clean_alarm", float(rep.alarm), threshold=0,
                    dtype="uint8" if quant else "float32", status="fail" if rep.alarm else "pass",
                    detail=f"{rep.describe()} max|out-fp64|={err:.3g} seed={seed}")
            res.add("abft_embedding_bag", name, "injected_detected", float(rep2.alarm), threshold=1,
                    dtype="uint8" if quant else "float32", status="pass" if rep2.alarm and 0 in rep2.rows else "fail",
                    detail=f"table flip {what} (bag 0): {rep2.describe()}")


def _workload(name: str, config: str = "debug") -> tuple[Any, Any] | None:
    try:
        from mystique import workloads
    except ImportError:
        return None
    try:
        mod = workloads.get(name)
    except (ValueError, ImportError):
        return None
    if config not in mod.CONFIGS:
        return None
    return mod, mod.CONFIGS[config]


def _campaign_key(target: Any, seed: int, opts: dict[str, Any], **params: Any) -> dict[str, Any]:
    """Everything besides the campaign's own ``params`` that changes a campaign's outcomes: the device
    (as results rows label it: injected fault and emulation included), its model name, the seed and
    the level with its sizes (the campaign adds the torch and mystique versions)."""
    return {"device": target.device, "label": target.label, "device_name": target.info().name,
            "inject": target.inject or "", "emulate": target.emulate or "", "seed": int(seed),
            "level": opts.get("level"), **params}


def _group_false_positives(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    n = int(opts["fp_trials"])
    fn = campaign.clean_trial_fn(seed, target.device, target.active)
    camp = campaign.Campaign("false_positives", _campaign_key(target, seed, opts, n=n),
                             n, fn, opts.get("checkpoint"), progress_every=max(1000, n // 10))
    outcomes = camp.run()
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        by_op[o["op"]].append(o)
    alarms = [o for o in outcomes if o["alarm"]]
    first = f"; first alarm: {alarms[0]['op']} seed={alarms[0]['seed']} shape={alarms[0]['shape']}" if alarms else ""
    worst = max((o["ratio"] for o in outcomes if not o["alarm"]), default=0.0)
    _rate_rows(res, "false_positives", "checked_ops", "", "false_positive_rate", len(alarms), n, target=0.0,
               higher_is_better=False,
               detail=f"{len(alarms)} alarms in {n} clean checked ops (campaign seed={seed}, {camp.resumed} resumed); "
                      f"largest clean |diff|/threshold {worst:.3g}{first}")
    disagree = [o for o in outcomes if not o.get("paths_agree", True)]
    res.add("false_positives", "checked_ops", "path_disagreements", len(disagree), threshold=0,
            status="fail" if disagree else "pass",
            detail="clean ops where the lower-bound fast path and the exact thresholds reached different verdicts"
                   + (f"; first: {disagree[0]['op']} seed={disagree[0]['seed']} shape={disagree[0]['shape']}"
                      if disagree else ""))
    for op, outs in sorted(by_op.items()):
        k = sum(o["alarm"] for o in outs)
        res.add("false_positives", op, "alarms", k, threshold=0, status="fail" if k else "pass",
                detail=f"{len(outs)} clean ops; largest ratio {max(o['ratio'] for o in outs):.3g}")
    # protected forwards of the reference workloads: their real activations must raise no alarm
    for name in opts["workloads"]:
        wl = _workload(name)
        if wl is None:
            res.add("false_positives", f"protect_{name}", "alarms", math.nan, status="skip",
                    detail=f"workload {name} not available")
            continue
        mod, cfg = wl
        checks = alarms_n = 0
        worst = 0.0
        for s in range(int(opts.get("workload_seeds", 3))):
            model = mod.build_model(cfg, device=torch.device(target.device), dtype=torch.float32, seed=seed + s).eval()
            batch = mod.make_batch(cfg, device=torch.device(target.device), seed=seed + s)
            with torch.no_grad(), protect(model, exact_ratios=True) as guard, target.active():
                mod.forward(model, batch)
            checks += guard.checks
            alarms_n += len(guard.alarms)
            worst = max(worst, guard.max_ratio)
            first_alarm = guard.alarms[0].describe() if guard.alarms else ""
        res.add("false_positives", f"protect_{name}", "alarms", alarms_n, threshold=0,
                status="fail" if alarms_n else "pass", dtype="float32",
                detail=f"{checks} checked Linear/Embedding calls over {opts.get('workload_seeds', 3)} seeds; "
                       f"largest clean ratio {worst:.3g} {first_alarm}")


def _group_detection(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    ops = tuple(opts.get("ops") or (*campaign.GEMM_OPS, *campaign.EMB_OPS, *campaign.CONTRAST_OPS))
    combos = campaign.detection_combos(ops)
    n = int(opts["trials"])
    fn = campaign.detection_trial_fn(combos, seed, target.device, target.active)
    camp = campaign.Campaign("detection", _campaign_key(target, seed, opts, n=n, ops=list(ops)),
                             n, fn, opts.get("checkpoint"), progress_every=max(500, n // 10))
    outcomes = camp.run()
    keyed: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    per_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    per_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        keyed[(o["op"], o["site"], o["bit_class"])].append(o)
        per_op[o["op"]].append(o)
        per_class[o["bit_class"]].append(o)
    tol = "significant = moves an output by more than 2^-7 x rms(output) (int8: any change)"
    for (op, site, cls), outs in sorted(keyed.items()):
        sig = [o for o in outs if o["significant"]]
        hits = sum(o["detected"] for o in sig)
        missed = [o for o in sig if not o["detected"]]
        benign = len(outs) - len(sig)
        target_rate = None if op in campaign.CONTRAST_OPS else DETECTION_TARGET
        detail = (f"{tol}; {len(sig)} significant, {benign} benign ({sum(o['detected'] for o in outs if not o['significant'])} "
                  f"of them flagged); seed={seed}")
        if missed:
            m = missed[0]
            detail += f"; first miss: seed={m['seed']} shape={m['shape']} bits={m['bits']} delta={m['delta']:.3g}"
        _rate_rows(res, "detection_campaign", f"{op}/{site}/{cls}", "", "detection_rate", hits, len(sig),
                   target=target_rate, higher_is_better=True, detail=detail)
    for op, outs in sorted(per_op.items()):
        sig = [o for o in outs if o["significant"]]
        target_rate = None if op in campaign.CONTRAST_OPS else DETECTION_TARGET
        _rate_rows(res, "detection_campaign", op, "", "detection_rate", sum(o["detected"] for o in sig), len(sig),
                   target=target_rate, higher_is_better=True,
                   detail=f"all sites and bit classes; {tol}" + (
                       "; contrast: bf16 checked after rounding (not the product's method)"
                       if op in campaign.CONTRAST_OPS else "") + _accumulator(op, target))
    real = [o for o in outcomes if o["op"] not in campaign.CONTRAST_OPS]
    for cls, outs in sorted(per_class.items()):
        sig = [o for o in outs if o["significant"] and o["op"] not in campaign.CONTRAST_OPS]
        _rate_rows(res, "detection_campaign", f"bit_class/{cls}", "", "detection_rate",
                   sum(o["detected"] for o in sig), len(sig), target=DETECTION_TARGET, higher_is_better=True,
                   detail=f"all checked ops; {tol}")
    sig = [o for o in real if o["significant"]]
    _rate_rows(res, "detection_campaign", "all", "", "detection_rate", sum(o["detected"] for o in sig), len(sig),
               target=DETECTION_TARGET, higher_is_better=True,
               detail=f"{len(real)} injected flips, {len(sig)} significant; {tol}; {camp.resumed} trials resumed")
    res.add("detection_campaign", "all", "significant_fraction", len(sig) / len(real) if real else math.nan,
            status="info", detail="share of injected flips that are significant")


def _accumulator(op: str, target: Any) -> str:
    """Which product a detection campaign's half-precision GEMM trials flipped and checked (for the detail)."""
    kind = op.removeprefix("gemm_").removesuffix("_rounded_check")
    dt = getattr(torch, kind, None) if op.startswith("gemm_") else None
    if dt not in half.HALF:
        return ""
    with target.active():
        how = abft.half_kind(torch.zeros(1, 1, dtype=dt, device=target.device))
    return f"; accumulator: {half.describe(how, dt)}"


def _pvf_rows(res: Results, name: str, outcomes: list[dict[str, Any]], config: str, seed: int) -> None:
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        per[o["group"]].append(o)
    stats = []
    for gname, outs in per.items():
        k = sum(o["changed"] for o in outs)
        lo, hi = wilson(k, len(outs))
        stats.append((gname, k, len(outs), lo, hi))
    stats.sort(key=lambda s: (-(s[1] / s[2]), -s[3], s[0]))
    for rank, (gname, k, n, lo, hi) in enumerate(stats, 1):
        subj = f"{name}/{gname}"
        first = next((o for o in per[gname] if o["changed"]), None)
        detail = f"{name} {config}, one random bit flip per trial, seed={seed}"
        if first:
            detail += f"; e.g. {first['param']}[{first['index']}] bits {first['bits']} {first['original']:.3g}->{first['corrupted']:.3g}"
        res.add("pvf", subj, "pvf", k / n, status="info", dtype="float32", detail=detail)
        res.add("pvf", subj, "pvf_ci_low", lo, status="info", dtype="float32", detail="Wilson 95% interval")
        res.add("pvf", subj, "pvf_ci_high", hi, status="info", dtype="float32", detail="Wilson 95% interval")
        res.add("pvf", subj, "trials", n, status="info", dtype="float32")
        res.add("pvf", subj, "pvf_rank", rank, status="info", dtype="float32",
                detail=f"rank among {len(stats)} parameter groups of {name} (1 = most vulnerable)")


def _group_pvf(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    config = opts["pvf_config"]
    for name in opts["workloads"]:
        wl = _workload(name, config)
        if wl is None:
            res.add("pvf", name, "pvf", math.nan, status="skip", detail=f"workload {name} {config} not available")
            continue
        mod, cfg = wl
        dev = torch.device(target.device)
        model = mod.build_model(cfg, device=dev, dtype=torch.float32, seed=seed).eval()
        batch = mod.make_batch(cfg, device=dev, seed=seed)
        with torch.no_grad():
            golden = mod.forward(model, batch).detach().clone()  # outside the device-under-test mode
        with torch.no_grad(), target.active():  # the control: no flip, on the device under test
            control = mod.forward(model, batch).detach()
        off = pvf.output_changed(name, golden, control, batch)
        res.add("pvf_control", name, "output_changed", float(off), threshold=0, status="fail" if off else "pass",
                dtype="float32",
                detail=f"{name} {config}: the unflipped model on the device under test "
                       + ("does NOT reproduce" if off else "reproduces")
                       + " the golden output by the PVF's own change test (else a trial's 'changed' would be the "
                         f"device's own difference, not the flip's); seed={seed}")
        groups_ = pvf.parameter_groups(model)
        n = int(opts["pvf_trials"]) * len(groups_)
        fn = pvf.pvf_trial_fn(name, model, batch, golden, mod.forward, groups_, seed, target.active)
        camp = campaign.Campaign(f"pvf_{name}", _campaign_key(target, seed, opts, n=n, config=config,
                                                              groups=list(groups_)),
                                 n, fn, opts.get("checkpoint"), progress_every=max(200, n // 5))
        _pvf_rows(res, name, camp.run(), config, seed)


def _group_sdc(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    kernels = list(opts.get("sdc_kernels") or sdc.default_kernels(opts["level"]))
    prog = Progress("sdc_screen", total=len(kernels))
    for k in kernels:
        r = sdc.screen(k, seed=seed, runs=int(opts["sdc_runs"]), device=target.device, active=target.active)
        prog.step(k.name)
        res.add("sdc_screen", k.name, "mismatched_runs", len(r.mismatched_runs), threshold=0, dtype=k.dtype,
                status="fail" if r.mismatched_runs else "pass", detail=r.describe())
        res.add("sdc_screen", k.name, "error_vs_fp64_bound", r.golden_ratio, threshold=1, dtype=k.dtype,
                status="fail" if r.golden_bad_runs else "pass", detail=r.describe())


def _overhead_rows(res: Results, t: Any, suffix: str, comparisons: tuple, floors: tuple, target: float | None,
                   common: str, note: str = "") -> None:
    """The ``abft_overhead`` rows of ``comparisons`` (name, checked, base, dtype, what) against ``target``
    and the ``abft_floor`` measurements of ``floors`` (name, checked, base, what) from one timing.

    A row with a target is decided by the 95% interval of its median overhead: pass when the interval
    lies within the target, fail when it lies entirely above it, inconclusive when it straddles it
    (the timing cannot tell); a row without a target is a measurement (``info``)."""
    for name, checked, base, dt, what in comparisons:
        ov = t.overhead(checked, base)
        lo, hi = t.interval(checked, base)
        verdict = ""
        if target is None:
            status = "info"
        else:
            status = "pass" if hi <= target else ("fail" if lo > target else "inconclusive")
            verdict = (f"; verdict from the 95% interval against {target:+.0%}: "
                       + {"pass": "within", "fail": "entirely above", "inconclusive": "straddles it"}[status])
        res.add("overhead", f"{name}_{suffix}", "abft_overhead", ov, threshold=target, unit="ratio", dtype=dt,
                status=status,
                detail=f"{what}: {ov:+.2%} (95% interval {lo:+.2%} .. {hi:+.2%}){verdict}; "
                       f"unchecked {t.median[base] * 1e3:.3f} ms, checked {t.median[checked] * 1e3:.3f}"
                       f" ms (wall {t.wall[base] * 1e3:.3f} / {t.wall[checked] * 1e3:.3f} ms); {common}{note}")
    for name, checked, base, what in floors:
        ov = t.overhead(checked, base)
        lo, hi = t.interval(checked, base)
        res.add("overhead", f"{name}_{suffix}", "abft_floor", ov, unit="ratio", dtype="float32", status="info",
                detail=f"{what}: {ov:+.2%} (95% interval {lo:+.2%} .. {hi:+.2%}); {common}")


def _group_overhead(res: Results, target: Any, seed: int, opts: dict[str, Any]) -> None:
    """``abft_overhead`` rows: checked / unchecked - 1 of the product's checked paths (see :mod:`.overhead`)."""
    dev = target.device
    reps = int(opts["overhead_reps"])
    with overhead.cpu_threads(dev, int(opts["overhead_threads"])) as threads:
        for n in opts["overhead_sizes"]:
            load0 = overhead.load_average()
            fns = overhead.gemm_functions(int(n), dev, seed)
            with torch.no_grad(), target.active():
                t = overhead.time_interleaved(fns, reps, device=dev, threads=threads, sync=target.synchronize,
                                              seed=seed)
            load1 = overhead.load_average()
            aa = t.overhead("mm_again", "mm")
            alo, ahi = t.interval("mm_again", "mm")
            common = (f"{t.clock}, {threads} thread(s), median of {reps} paired ratios of interleaved rounds; A/A "
                      f"resolution {aa:+.2%} (95% interval {alo:+.2%} .. {ahi:+.2%}; a @ b timed twice); load "
                      f"average {load0:.2f} -> {load1:.2f}; "
                      f"clock resolution {t.resolution:.0e} s; float32 n={n} (M=K=N)")
            res.add("overhead", f"timing_resolution_{n}", "aa_relative_difference", aa, unit="ratio",
                    dtype="float32", status="info", detail=common)
            applies = int(n) >= overhead.GEMM_TARGET_MIN_N
            _overhead_rows(res, t, str(n), overhead.GEMM_COMPARISONS, overhead.GEMM_FLOORS,
                           overhead.TARGETS["gemm"] if applies else None, common,
                           "" if applies else f"; the target applies at n >= {overhead.GEMM_TARGET_MIN_N}")
            del fns
        for rows, d, bags, length in opts["overhead_tables"]:
            shape = f"{rows}x{d}_b{bags}_l{length}"
            load0 = overhead.load_average()
            ef = overhead.EmbeddingFunctions(int(rows), int(d), int(bags), int(length), dev, seed)
            with torch.no_grad(), target.active():  # a lookup is short and noisy: more rounds
                t = overhead.time_interleaved(ef.functions(), overhead.TABLE_ROUNDS * reps, device=dev, threads=threads,
                                              sync=target.synchronize, prepare=ef.prepare, seed=seed)
            load1 = overhead.load_average()
            aa = t.overhead("embedding_bag_again", "embedding_bag")
            alo, ahi = t.interval("embedding_bag_again", "embedding_bag")
            common = (f"{t.clock}, {threads} thread(s), median of {t.reps} paired ratios of interleaved rounds, fresh "
                      f"random indices each round; A/A resolution {aa:+.2%} (95% interval {alo:+.2%} .. {ahi:+.2%}; "
                      f"the same lookup timed twice); load average {load0:.2f} -> "
                      f"{load1:.2f}; clock resolution {t.resolution:.0e} s; table {rows} x {d}, {bags} bags of {length}, "
                      "sum pooling")
            res.add("overhead", f"timing_resolution_{shape}", "aa_relative_difference", aa, unit="ratio",
                    dtype="float32", status="info", detail=common)
            _overhead_rows(res, t, shape, overhead.EMBEDDING_COMPARISONS, overhead.EMBEDDING_FLOORS,
                           overhead.TARGETS["embedding_bag"], common)
            del ef


# groups of many tiny operators: single-threaded on the CPU, where thread wake-ups would dominate
_SMALL_OP_GROUPS = ("abft_gemm", "abft_embedding_bag", "false_positives", "detection_campaign", "pvf")
_RUNNERS = {
    "abft_gemm": _group_abft_gemm,
    "abft_embedding_bag": _group_abft_embedding,
    "false_positives": _group_false_positives,
    "detection_campaign": _group_detection,
    "pvf": _group_pvf,
    "sdc_screen": _group_sdc,
    "overhead": _group_overhead,
}


def _groups_of(level: str) -> list[str]:
    return groups(level)


def run(target: Any, *, level: str = "quick", seed: int = 0, groups: list[str] | tuple[str, ...] | None = None,
        out_dir: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """Run the soft-error checks on ``target``; returns the results table (``mystique.results`` columns).

    ``options`` override the level's sizes: ``trials`` (detection campaign), ``fp_trials`` (clean
    checked ops), ``pvf_trials`` (per parameter group), ``pvf_config``, ``workloads``, ``sdc_runs``,
    ``overhead_sizes``, ``overhead_reps``, ``overhead_threads`` (CPU intra-op threads of the timing, 0 for
    torch's setting), ``overhead_tables`` ((rows, dim, bags, bag length) per EmbeddingBag shape), ``ops`` (detection ops), ``checkpoint`` (folder of the campaign
    checkpoints; default ``out_dir``). Campaign checkpoints are JSONL files in that folder, one per
    campaign, keyed on everything that changes an outcome (:func:`_campaign_key`; torch and mystique
    versions): a rerun with the same settings resumes, one with other settings (another device model,
    fault, emulation, seed, level or trial count) raises :class:`UsageError` naming what differs.
    """
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    chosen = list(groups) if groups else _groups_of(level)
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown:
        raise UsageError(f"unknown soft-error group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    opts = {**LEVELS[level], "level": level}
    bad = [k for k in options if k not in (*LEVELS[level], "ops", "checkpoint", "workload_seeds", "sdc_kernels")]
    if bad:
        raise UsageError(f"unknown soft-error option(s) {', '.join(bad)}")
    opts.update({k: v for k, v in options.items() if v is not None})
    if opts.get("checkpoint") is None and out_dir is not None:
        opts["checkpoint"] = out_dir
    if opts.get("checkpoint") is not None:
        Path(opts["checkpoint"]).mkdir(parents=True, exist_ok=True)
    res = Results(RunContext.for_target(target), "soft_errors")
    prog = Progress("soft_errors", total=len(chosen))
    for name in chosen:
        prog.step(name)
        before = len(res)
        try:
            with _threads(target.device, 1 if name in _SMALL_OP_GROUPS else None):
                _RUNNERS[name](res, target, seed, opts)
        except (UsageError, MemoryError):
            raise
        except Exception as exc:  # one group failing must not hide the others
            from mystique.errors import EnvironmentUnsupported

            if isinstance(exc, EnvironmentUnsupported):
                res.add(name, "group", "ran", 0, status="skip", detail=str(exc))
            else:
                res.add(name, "group", "ran", 0, status="error",
                        detail=f"{type(exc).__name__}: {exc} (seed={seed}, level={level})")
        if len(res) == before:
            res.add(name, "group", "ran", 0, status="skip", detail="nothing to check")
    return res.frame()
