"""`mystique fleet-campaign`: prove on this host that the fleet comparison flags a slow device and
spares healthy ones, with a noisy neighbour."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import verdict
from .group import cli


@cli.command("fleet-campaign")
@options.output_dir
@options.device
@click.option("--runs", type=click.IntRange(3), default=20, show_default=True,
              help="Healthy runs (the fleet) and as many runs under the fault.")
@click.option("--inject", "fault", default="throttle", show_default=True, metavar="SPEC",
              help="The slow device: a slowness fault simulation NAME[:k=v,...] or package.module:factory.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              metavar="S", help="Seconds of sustained load per run.")
@options.workloads("Reference workloads each run replays", default="dlrm")
@click.option("--busy", default="0.5,2", show_default=True, metavar="B,P",
              help="The noisy neighbour: a process busy B seconds of every P (0,P: none).")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True, metavar="F",
              help="Fleet margin (as `mystique fleet`).")
@click.option("--schedule", type=click.Choice(["at-once", "sequential"]), default="at-once", show_default=True,
              help="at-once: every run measured in the same window, in shuffled rounds of short bursts (as a "
                   "synchronous job measures its devices); sequential: one run after another.")
@options.seed
@options.force
def fleet_campaign_cmd(output, device, runs, fault, duration, workloads, busy, margin, schedule, seed, force) -> int:
    """Replay the reference workloads as RUNS healthy devices and RUNS devices under --inject, while a
    background process is busy part of the time; judge each healthy run against the other healthy
    runs and each slow run against all of them, as `mystique fleet` does.

    \b
    Writes OUT_DIR/results.csv (campaign_flagged per side: healthy must have none flagged, the slow
    side at least RUNS - RUNS//20; campaign_run per run), report.html and a folder per run.
    Exit 1 when either side misses its target.
    """
    from .. import results
    from ..errors import UsageError
    from ..io import check_output_dir, staged_output_dir
    from ..reports import render_report
    from ..validators.performance.campaign import campaign

    try:
        busy_s, period_s = (float(x) for x in busy.split(","))
    except ValueError as exc:
        raise UsageError(f"--busy {busy!r}: expected B,P (two numbers of seconds)") from exc
    check_output_dir(output, force)
    with staged_output_dir(output, force) as stage:
        df = campaign(stage, runs=runs, fault=fault, duration=duration, workloads=workloads, busy_s=busy_s,
                      period_s=period_s, margin=margin, seed=seed, device=device, schedule=schedule)
        results.write_csv(df, stage / "results.csv")
        render_report([str(stage / "results.csv")], str(stage / "report.html"), title="Mystique Suite fleet campaign")
    return verdict(df, f"results in {output}/results.csv, report in {output}/report.html")
