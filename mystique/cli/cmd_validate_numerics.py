"""`mystique validate numerics`: bf16/fp16/fp32 results of the device against fp64 goldens."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import run_validator, validate


@validate.command("numerics")
@options.device_under_test
@click.option("--benchmark", "benchmark", default=None, metavar="BENCH_DIR",
              type=click.Path(exists=True, file_okay=True, dir_okay=True),
              help="Add the GEMM shapes of this benchmark folder (benchmark.json) to the op sweep.")
@click.option("--dtypes", default="bfloat16,float16,float32", show_default=True, metavar="LIST",
              help="Comma-separated dtypes to check (bfloat16, float16, float32).")
@options.group("numerics")
@click.option("--ops", default=None, metavar="LIST", help="Comma-separated operators of the op sweep (default all).")
@options.force
def numerics_cmd(output, device, inject, emulate, level, seed, benchmark, dtypes, groups, ops, force) -> int:
    """Judge the device's numerics against fp64 goldens; writes OUT_DIR/results.csv.

    Exhaustive bf16/fp16 rounding, special values, an operator sweep with error bounds, the
    accumulator precision of low-precision GEMMs, model-level deviation and repeatability.
    """
    from ..validators import numerics

    opts = {"level": level, "seed": seed, "dtypes": dtypes, "groups": list(groups) or None}
    if benchmark:
        opts["benchmark"] = benchmark
    if ops:
        opts["ops"] = ops
    return run_validator(numerics.run, output, force, device, inject, emulate, **opts)
