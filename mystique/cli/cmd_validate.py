"""`mystique validate {numerics,soft-errors,correctness}`: thin layers over each validator's run()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from . import cli


@cli.group("validate")
def validate() -> None:
    """Run one validator on the device under test; writes OUT_DIR/results.csv."""


def run_validator(run: Callable[..., Any], output: str, force: bool, device: str, inject: str | None,
                  emulate: str | None = None, **opts: Any) -> int:
    """Build the Target, run the validator, write results.csv atomically, return the exit code.

    ``run(target, out_dir=<staging dir>, **opts)`` returns the results DataFrame; it may write
    extra files into ``out_dir`` (checkpoints, tables), which land beside results.csv.
    """
    from .. import results
    from ..io import check_output_dir, staged_output_dir
    from ..targets import make_target

    check_output_dir(output, force)
    target = make_target(device, inject, emulate)
    with staged_output_dir(output, force) as stage:
        df = run(target, out_dir=stage, **opts)
        results.write_csv(df, stage / "results.csv")
    return verdict(df, f"results in {output}/results.csv")


def verdict(df: Any, where: str) -> int:
    """Say ``N checks, M failed, K measurements; WHERE`` and return the exit code of ``df``.

    A run in which nothing was checked (every row skipped or a measurement) says so on stderr and
    exits 3: it proves nothing about the device.
    """
    from .. import results

    click.echo(f"{results.counts(df).line}; {where}")
    code = results.exit_code(df)
    if code == results.NOTHING_CHECKED:
        click.echo(f"mystique: error: {results.nothing_checked_line(df)}", err=True)
    return code
