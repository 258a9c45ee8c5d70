"""`mystique qualify`: hardware qualification, run as an in-process pytest session."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .group import cli


@cli.command("qualify")
@options.device_under_test
@click.option("--validators", default=None, metavar="NAMES",
              help="Comma-separated validators to run (default: numerics,soft_errors,correctness).")
@click.option("-k", "keyword", default=None, metavar="EXPR", help="Only the checks matching this pytest -k expression.")
@options.force
def qualify_cmd(output, device, inject, emulate, level, seed, validators, keyword, force) -> int:
    """Qualify the device: every validator's checks as pytest items; writes OUT_DIR/results.csv,
    report.html and junit.xml.

    \b
    Levels, in the spirit of `dcgmi diag -r`:
      quick  every boot: minutes, the groups at small sizes
      full   acceptance: every group at published sizes (adds slow groups)
    Exit 0 when every check passed, 1 when any failed, 4 when none failed but some were
    inconclusive (undecided; the report names them).
    """
    from .. import results
    from ..validators.qualify import qualify

    names = [v.strip() for v in validators.split(",") if v.strip()] if validators else None
    outcome = qualify(output, device=device, inject=inject, emulate=emulate, level=level, seed=seed, force=force,
                      validators=names, keyword=keyword)
    click.echo(f"mystique qualify: {outcome.counts.line}; {', '.join(outcome.files)} in {output}")
    if outcome.exit_code == results.NOTHING_CHECKED:
        click.echo("mystique: error: nothing was checked: every qualification row was skipped or a measurement",
                   err=True)
    return outcome.exit_code
