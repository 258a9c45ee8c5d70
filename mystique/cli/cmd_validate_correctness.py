"""`mystique validate correctness`: the same benchmark on the device and on a reference device."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import run_validator, validate


@validate.command("correctness")
@options.device_under_test
@click.option("--benchmark", "benchmark", default=None, metavar="BENCH_DIR",
              type=click.Path(exists=True, file_okay=True, dir_okay=True),
              help="Replay this benchmark (folder, benchmark.json, trace folder or ET file) instead of the "
                   "built-in reference benchmarks.")
@click.option("--reference-device", "reference_device", default=None, metavar="DEV",
              help="Device the reference runs on (no --inject mode there); it must differ from --device "
                   "unless --inject or --emulate is given (then it is the device without them). Default: cpu, "
                   "or, for an unmodified cpu, none: operators are then not compared across devices (a skip "
                   "row) and workload outputs are judged against fp64 goldens alone.")
@options.group("correctness")
@options.workloads("Comma-separated reference workloads (default all)")
@click.option("--threads", type=click.IntRange(0), default=1, show_default=True,
              help="CPU threads while validating (0 keeps torch's setting, e.g. to qualify multi-threaded CPU "
                   "kernels).")
@options.force
def correctness_cmd(output, device, inject, emulate, level, seed, benchmark, reference_device, groups, workloads, threads,
                    force) -> int:
    """Compare every operator of a benchmark on the device with a reference device; writes OUT_DIR/results.csv.

    Each operator runs on the device and on the reference device with identical synthetic inputs
    and is recomputed in fp64; the first operator whose error exceeds the dtype-aware bound is
    named (index, name, shapes, errors). Also compares whole workload outputs and checks that two
    runs on the device are bit-identical. Exit 1 on any divergence.
    """
    from ..validators import correctness

    opts = {"level": level, "seed": seed, "groups": list(groups) or None, "benchmark": benchmark,
            "reference_device": reference_device, "threads": threads or None}
    if workloads:
        opts["workloads"] = workloads
    return run_validator(correctness.run, output, force, device, inject, emulate, **opts)
