"""`mystique validate performance`: is this device as fast as its peers, and does it stay fast?"""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import run_validator, validate


@validate.command("performance")
@options.device_under_test
@click.option("--baseline", "baseline", multiple=True, metavar="FILES", type=click.Path(),
              help="results.csv of a peer of the same device model (or its folder); repeatable. The fleet "
                   "group compares every figure with them.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Seconds of sustained load over all workloads (default: 60 at quick, 600 at full).")
@options.group("performance")
@options.workloads("Comma-separated reference workloads of the sustained group (default all)")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=None, metavar="F",
              help="Fleet margin: fail only when slower than the fleet median by more than F (default 0.05) "
                   "and by more than 3 robust standard deviations of the fleet, with confidence.")
@click.option("--shapes-from", "shapes_from", multiple=True, metavar="PATH", type=click.Path(),
              help="A capture or benchmark whose GEMMs the micro group also measures at their own shapes and "
                   "layouts, per dtype (gemm_shape rows, which `mystique predict --profile` prices them by); "
                   "repeatable. Adds at most 600 s (its progress lines count them).")
@options.force
def performance_cmd(output, device, inject, emulate, level, seed, baseline, duration, groups, workloads, margin,
                    shapes_from, force) -> int:
    """Measure the device's throughput and judge it against its peers; writes OUT_DIR/results.csv.

    \b
    micro      GEMM throughput per dtype, memory bandwidth (copy, triad), host<->device transfers
    sustained  the reference workloads' benchmarks for --duration: step-time distribution, CV,
               drift first vs last third, clocks (NVML on NVIDIA GPUs, CPU frequency on CPUs);
               with --inject, the mode's cost paired against the same device without it
    fleet      every figure against --baseline peers (median and MAD of the fleet, this device's
               interval): fails when slower than the fleet beyond the margin with confidence
    Exit 1 when a check fails; OUT_DIR/step_times.csv holds every step time.
    """
    from ..validators import performance

    opts = {"level": level, "seed": seed, "groups": list(groups) or None, "baseline": list(baseline),
            "duration": duration, "workloads": workloads, "margin": margin}
    if shapes_from:
        opts["shapes_from"] = list(shapes_from)
    return run_validator(performance.run, output, force, device, inject, emulate, **opts)
