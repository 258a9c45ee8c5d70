"""Check group ``sdc_screen``: repeat-and-compare screening of kernels against fp64 goldens; every run
must match the first bitwise and stay within the fp64 error bound."""

from __future__ import annotations

from mystique.progress import Progress

from ...groups import GroupContext
from ..sdc import default_kernels, screen


def run_sdc_screen(ctx: GroupContext) -> None:
    res, target, opts = ctx.res, ctx.target, ctx.options
    kernels = list(opts.get("sdc_kernels") or default_kernels(ctx.level))
    prog = Progress("sdc_screen", total=len(kernels))
    for k in kernels:
        r = screen(k, seed=ctx.seed, runs=int(opts["sdc_runs"]), device=target.device, active=target.active,
                   emulated_cuda=target.emulate == "cuda")
        prog.step(k.name)
        res.add("sdc_screen", k.name, "mismatched_runs", len(r.mismatched_runs), threshold=0, dtype=k.dtype,
                status="fail" if r.mismatched_runs else "pass", detail=r.describe())
        res.add("sdc_screen", k.name, "error_vs_fp64_bound", r.golden_ratio, threshold=1, dtype=k.dtype,
                status="fail" if r.golden_bad_runs else "pass", detail=r.describe())
