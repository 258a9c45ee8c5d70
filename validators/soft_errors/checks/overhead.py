"""Check group ``overhead``: checked / unchecked time - 1 of the product's checked paths (fp32 GEMM,
Linear and protected Linear; EmbeddingBag fp32, 8-bit and protected), timed interleaved in a seeded
random order each round (:mod:`..overhead`). Each shape gets an A/A row (the timing's resolution) and
``abft_floor`` measurements (the bare memory traffic of a check, no verdict).

On the CPU a shape whose rows have a target runs until they decide (the adaptive stop of
:mod:`mystique.stopping`, shared with the performance validator's paired rows): looks at ``reps``,
``2 reps``, ... ``32 reps`` rounds (:data:`LOOKS`; the level's ``overhead_reps``, x10 for a table: the
first look is the rounds a fixed run used to take) or at :data:`CAP_S` seconds of rounds, each look's
intervals at 99.17% (Bonferroni over 6 looks: 95% overall); the rounds stop at the first look where
every row with a target is decided, and a row still straddling its target at the last look is
inconclusive. Only the repetitions change: every round times the same calls as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mystique.results import Results
from mystique.stopping import Looks, Stopper

from ...groups import GroupContext
from ..overhead import (
    EMBEDDING_COMPARISONS,
    EMBEDDING_FLOORS,
    FRESH_INDICES,
    GEMM_COMPARISONS,
    GEMM_FLOORS,
    GEMM_TARGET_MIN_N,
    TABLE_ROUNDS,
    TARGETS,
    EmbeddingFunctions,
    cpu_threads,
    embedding_bag_target,
    gemm_functions,
    load_average,
    time_interleaved,
)
from ..overhead_device import GPU_SIZES, device_comparisons, device_linear_functions, linear_target

#: the most seconds of rounds one shape's adaptive stop may take (the round cap is 16x the first look's rounds).
#: Sized for the slowest shape with a target, fp32 n = 2048 on a 2-core host (about 1.7 s a round): its
#: rows sit near +3% against +5%, and with 120 s (71 rounds) the 99% interval of gemm_2048 read +1.1% .. +5.5%
#: (docs/results/soft_errors_overhead_quiet_cpu_run2). A half-width shrinks as 1 / sqrt(rounds), so that row
#: needs 71 (2.64 / 2.18)^2 = 104 rounds to lie within its target (upper half-width 2.64 points at 71 rounds,
#: 2.18 points of room): 177 s; 240 s (about 140 rounds) leaves room for a median 0.4 points higher. Shapes
#: that decide earlier stop at their look, as before
CAP_S = 240.0
#: looks of the adaptive stop: a row near its target (EmbeddingBag D=64 on a 2-core host: +24.8% against
#: 26%, half-width 1.3% at 8x the first look's rounds) needs the fifth (16x) or the time cap to decide. A sixth
#: (32x): with five, fp32 n = 1024 (about 0.2 s a round) stopped at the round cap, 496 rounds in 104 s of its 240,
#: at +4.59% (99% interval +4.18 .. +5.10) against +5% (docs/results/soft_errors_overhead_quiet_cpu_run4); 992
#: rounds shrink a half-width by sqrt(2), times 2.64 / 2.58 for the level of six looks (z at 1 - 0.05/12 against
#: 1 - 0.05/10): 0.46 -> 0.33 points, so that the time budget, not the round count, bounds what a row can resolve.
#: A row within that of its target stays inconclusive; the shapes bounded by the time cap (n = 2048) are unchanged
LOOKS = 6


def overhead_stopper(t: Any, comparisons: tuple, target: float, first: int) -> Stopper:
    """The adaptive stop of ``comparisons`` (name, checked, base, ...) against ``target`` over the growing
    timings ``t`` (their sample lists grow in place)."""
    return Stopper(Looks(first=first, time_cap_s=CAP_S, looks=LOOKS), {
        name: ((lambda level, c=checked, b=base: t.interval(c, b, level)), target)
        for name, checked, base, *_ in comparisons})


def overhead_rows(res: Results, t: Any, suffix: str, comparisons: tuple, floors: tuple, target: float | None,
                  common: str, note: str = "", stopper: Stopper | None = None) -> None:
    """The ``abft_overhead`` rows of ``comparisons`` (name, checked, base, dtype, what) against ``target``
    and the ``abft_floor`` measurements of ``floors`` (name, checked, base, what) from one timing.

    A row with a target is decided by the interval of its median overhead (95%; with ``stopper``, its last
    look's, at the looks' level): pass when the interval lies within the target, fail when it lies
    entirely above it, inconclusive when it straddles it (the timing cannot tell); a row without a
    target is a measurement (``info``)."""
    level = stopper.plan.look_level if stopper is not None and stopper.history else 0.95
    how = f"; {stopper.describe()}" if stopper is not None and stopper.history else ""
    for name, checked, base, dt, what in comparisons:
        ov = t.overhead(checked, base)
        lo, hi = t.interval(checked, base, level)
        verdict = ""
        if target is None:
            status = "info"
        else:
            status = "pass" if hi <= target else ("fail" if lo > target else "inconclusive")
            verdict = (f"; verdict from the {level:.2%} interval against {target:+.0%}: "
                       + {"pass": "within", "fail": "entirely above", "inconclusive": "straddles it"}[status] + how)
        res.add("overhead", f"{name}_{suffix}", "abft_overhead", ov, threshold=target, unit="ratio", dtype=dt,
                status=status, low=lo, high=hi,
                detail=f"{what}: {ov:+.2%} ({level:.2%} interval {lo:+.2%} .. {hi:+.2%}){verdict}; "
                       f"unchecked {t.median[base] * 1e3:.3f} ms, checked {t.median[checked] * 1e3:.3f}"
                       f" ms (wall {t.wall[base] * 1e3:.3f} / {t.wall[checked] * 1e3:.3f} ms); {common}{note}")
    for name, checked, base, what in floors:
        ov = t.overhead(checked, base)
        lo, hi = t.interval(checked, base)
        res.add("overhead", f"{name}_{suffix}", "abft_floor", ov, unit="ratio", dtype="float32", status="info",
                low=lo, high=hi, detail=f"{what}: {ov:+.2%} (95% interval {lo:+.2%} .. {hi:+.2%}); {common}")



def run_overhead(ctx: GroupContext) -> None:
    """``abft_overhead`` rows: checked / unchecked - 1 of the product's checked paths."""
    dev, seed, reps = ctx.target.device, ctx.seed, int(ctx.options["overhead_reps"])
    with cpu_threads(dev, int(ctx.options["overhead_threads"])) as threads:
        for n in ctx.options["overhead_sizes"]:
            applies = int(n) >= GEMM_TARGET_MIN_N
            _timed_rows(ctx, str(n), threads, gemm_functions(int(n), dev, seed), reps,
                        pair=("mm_again", "mm"), rounds_note="", aa_what="a @ b timed twice",
                        shape=f"float32 n={n} (M=K=N)", rows=(GEMM_COMPARISONS, GEMM_FLOORS),
                        limit=TARGETS["gemm"] if applies else None,
                        note="" if applies else f"; the target applies at n >= {GEMM_TARGET_MIN_N}")
        _device_linear_rows(ctx, threads, reps)
        for rows, d, bags, length in ctx.options["overhead_tables"]:
            ef = EmbeddingFunctions(int(rows), int(d), int(bags), int(length), dev, seed)
            # a lookup is short and noisy: more rounds
            _timed_rows(ctx, f"{rows}x{d}_b{bags}_l{length}", threads, ef.functions(), TABLE_ROUNDS * reps,
                        pair=("embedding_bag_again", "embedding_bag"), rounds_note=FRESH_INDICES, before_each=ef.fresh,
                        aa_what="the same lookup timed twice",
                        shape=f"table {rows} x {d}, {bags} bags of {length}, sum pooling",
                        rows=(EMBEDDING_COMPARISONS, EMBEDDING_FLOORS), limit=embedding_bag_target(ctx.target.device))
            del ef


def _device_linear_rows(ctx: GroupContext, threads: int, reps: int) -> None:
    """The rows of the GPU targets (:mod:`..overhead_device`): fp32 and bf16 device-checked Linear at the GPU
    sizes on CUDA, at the CPU sizes elsewhere (measurements there)."""
    dev = ctx.target.device
    cuda = torch.device(dev).type == "cuda"
    sizes = ctx.options.get("overhead_device_sizes") or (GPU_SIZES if cuda else ctx.options["overhead_sizes"][:1])
    for n in sizes:
        for dtype in (torch.float32, torch.bfloat16):
            dt = str(dtype).replace("torch.", "")
            limit = linear_target(dt, int(n), cuda)
            _timed_rows(ctx, f"{dt}_{n}", threads, device_linear_functions(int(n), dtype, dev, ctx.seed), reps,
                        pair=("linear_again", "linear"), rounds_note="", aa_what="F.linear timed twice",
                        shape=f"{dt} Linear n={n} (M=K=N)", rows=(device_comparisons(dt), ()), limit=limit,
                        note="" if limit is not None else "; the GPU targets apply on CUDA at n >= 4096")


def _timed_rows(ctx: GroupContext, suffix: str, threads: int, fns: dict[str, Callable[[], Any]], rounds: int,
                *, pair: tuple[str, str], rounds_note: str, aa_what: str,
                shape: str, rows: tuple[tuple, tuple], limit: float | None, note: str = "",
                before_each: Callable[[str], None] | None = None) -> None:
    """Time ``fns`` interleaved on the device under test, then write the shape's A/A row (``pair``: the
    same function timed twice) and its overhead rows against ``limit``: with a limit, ``rounds`` is the
    first look of the adaptive stop (see the module), without one the rounds are ``rounds``."""
    load0 = load_average()
    held: list[Stopper] = []

    def until(t: Any, seconds: float) -> str | None:
        if not held:
            held.append(overhead_stopper(t, rows[0], limit, rounds))
        return held[0].after_round(t.reps, seconds)

    # on the CPU (the rows this host must decide); an accelerator's rows keep their fixed rounds
    adaptive = limit is not None and bool(rows[0]) and torch.device(ctx.target.device).type == "cpu"
    with torch.no_grad(), ctx.target.active():
        t = time_interleaved(fns, 2 ** (LOOKS - 1) * rounds if adaptive else rounds, device=ctx.target.device, threads=threads,
                             sync=ctx.target.synchronize, seed=ctx.seed, before_each=before_each,
                             until=until if adaptive else None)
    load1 = load_average()
    aa = t.overhead(*pair)
    alo, ahi = t.interval(*pair)
    common = (f"{t.clock}, {threads} thread(s), median of {t.reps} paired ratios of interleaved rounds{rounds_note}; "
              f"A/A resolution {aa:+.2%} (95% interval {alo:+.2%} .. {ahi:+.2%}; {aa_what}); load average "
              f"{load0:.2f} -> {load1:.2f}; clock resolution {t.resolution:.0e} s; {shape}")
    ctx.res.add("overhead", f"timing_resolution_{suffix}", "aa_relative_difference", aa, unit="ratio",
                dtype="float32", status="info", detail=common)
    overhead_rows(ctx.res, t, suffix, *rows, limit, common, note, stopper=held[0] if held else None)
