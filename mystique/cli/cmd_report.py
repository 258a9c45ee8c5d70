"""`mystique report`: one self-contained HTML page from results.csv files."""

from __future__ import annotations

import click

from .group import cli


@cli.command("report")
@click.argument("results", metavar="RESULTS_CSV...", nargs=-1, required=True, type=click.Path())
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Report file to write (HTML).",
)
@click.option("--title", default=None, help="Title of the page (default: names the devices).")
@click.option("--force", is_flag=True, help="Replace an existing report file.")
def report_cmd(results: tuple[str, ...], output: str, title: str | None, force: bool) -> int:
    """Render RESULTS_CSV... (results.csv files, or folders holding them) into one HTML report.

    Replay runs' ops.csv and summary.json beside a results.csv are picked up too. Exits 0 once the
    report is written, whatever the verdict it shows.
    """
    from ..reports import render_report

    path = render_report(list(results), output, title=title, force=force)
    click.echo(f"report written to {path}")
    return 0
