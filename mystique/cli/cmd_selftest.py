"""`mystique selftest`: the healthy device must pass, every fault simulation must be caught."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import verdict
from .group import cli


@cli.command("selftest")
@options.output_dir
@options.device
@options.emulate
@click.option("--inject", "inject", multiple=True, metavar="SPEC",
              help="A fault of your own to prove caught as well (repeatable): NAME[:k=v,...] or package.module:factory.")
@click.option("--faults", default=None, metavar="NAMES",
              help="Only these built-in fault simulations (comma-separated; default: all of `mystique faults`).")
@options.level
@options.seed
@click.option("--validators", default=None, metavar="NAMES",
              help="Comma-separated validators to run (default: numerics,soft_errors,correctness).")
@options.force
def selftest_cmd(output, device, emulate, inject, faults, level, seed, validators, force) -> int:
    """Prove the suite on this device: quick qualification on the healthy device, then under every
    built-in fault simulation (and each --inject SPEC).

    \b
    Writes OUT_DIR/results.csv (suite selftest: healthy_false_failures, one fault_caught row per
    fault naming the checks that caught it, run times), report.html, and one folder per run.
    Exit 0 only when the healthy run has no failed check and every fault is caught; 1 otherwise.
    Run it first on a new device to know whether to trust the suite there.
    """
    from ..validators.selftest import selftest  # (torch: imported only when the command runs)

    names = [v.strip() for v in validators.split(",") if v.strip()] if validators else None
    only = [f.strip() for f in faults.split(",") if f.strip()] if faults else None
    code, df = selftest(output, device=device, emulate=emulate, inject=inject, faults=only, level=level, seed=seed,
                        validators=names, force=force)
    table = df[df["check"].isin(("healthy_false_failures", "fault_caught"))]
    width = max((len(s) for s in table["subject"]), default=8)
    for _, row in table.iterrows():
        what = "healthy" if row["check"] == "healthy_false_failures" else "fault"
        click.echo(f"  {row['status']:<5} {what:<7} {row['subject']:<{width}}  {row['detail'].split('; rows in')[0]}")
    verdict(df, f"results in {output}/results.csv")
    return code
