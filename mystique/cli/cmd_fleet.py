"""`mystique fleet RESULTS...`: a fleet of devices of one model, summarised."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import verdict
from .group import cli


def _ns(text: str) -> list[int]:
    try:
        ns = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers") from exc
    if not ns or ns[0] < 1 or ns[-1] > 10_000_000:
        raise click.BadParameter("job sizes must be within 1..10,000,000")
    return ns


@cli.command("fleet")
@click.argument("results_files", metavar="RESULTS...", nargs=-1, required=True, type=click.Path())
@options.output_dir
@click.option("--sizes", default="1,8,64,512,4096,32768,100000", show_default=True, metavar="N,...",
              help="Job sizes N of the synchronous-slowdown rows.")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True, metavar="F",
              help="Outlier margin: slower than the others' median by more than F and 3 robust standard "
                   "deviations, with confidence.")
@options.force
def fleet_cmd(results_files, output, sizes, margin, force) -> int:
    """Summarise `mystique validate performance` runs of many devices (RESULTS: results.csv files or
    their folders); writes OUT_DIR/results.csv and report.html.

    \b
    Per figure: the fleet's distribution (median, scaled MAD), every device against the others
    (outliers fail), and for each workload's step time the expected slowdown of a synchronous job
    of N devices drawn from the fleet: E[max of N draws] / median by the empirical CDF, from the
    devices' medians and, where step_times.csv lies beside a results.csv, from their pooled steps.
    Exit 1 when a device is an outlier.
    """
    from .. import results
    from ..io import check_output_dir, staged_output_dir
    from ..reports import render_report
    from ..validators.performance.summary import summarise

    ns = _ns(sizes)
    check_output_dir(output, force)
    df = summarise(list(results_files), ns, margin)
    with staged_output_dir(output, force) as stage:
        results.write_csv(df, stage / "results.csv")
        render_report([str(stage / "results.csv")], str(stage / "report.html"), title="Mystique Suite fleet summary")
    return verdict(df, f"results in {output}/results.csv, report in {output}/report.html")
