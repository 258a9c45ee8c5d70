"""`mystique validate {numerics,soft-errors,correctness}`: thin layers over each validator's run()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .group import cli


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
        df = results.with_reproduce(run(target, out_dir=stage, **opts), this_command())
        results.write_csv(df, stage / "results.csv")
    return verdict(df, f"results in {output}/results.csv")


def this_command() -> str:
    """The command line of the running click command, options that differ from their defaults only,
    the output folder as ``OUT`` (what a failure's reproduce line names)."""
    import shlex

    ctx = click.get_current_context()
    words = ctx.command_path.split()
    for p in ctx.command.params:
        value = ctx.params.get(p.name)
        if not isinstance(p, click.Option) or value in (None, False, (), "") or value == p.default:
            continue
        if p.name in ("output", "force"):
            continue
        opt = next((o for o in p.opts if o.startswith("--")), p.opts[0])
        if p.is_flag:
            words.append(opt)
            continue
        for v in value if isinstance(value, (tuple, list)) else (value,):
            words += [opt, str(v)]
    return shlex.join(words) + " -o OUT"


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
