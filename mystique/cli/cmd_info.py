"""`mystique workloads` and `mystique faults`: what can be run and injected."""

from __future__ import annotations

import click

from .group import cli


@cli.command("workloads")
def workloads_cmd() -> int:
    """List workloads, their configs and modes."""
    from ..workloads import MODES, get, names

    for name in names():
        mod = get(name)
        click.echo(f"{name}: {mod.DESCRIPTION}")
        click.echo(f"  configs: {', '.join(mod.CONFIGS)}")
        click.echo(f"  modes:   {', '.join(MODES)}")
    return 0


@cli.command("faults")
def faults_cmd() -> int:
    """List built-in fault simulations (for --inject NAME[:k=v,...])."""
    from .. import faults

    faults.load_builtin()
    if not faults.FAULTS:
        click.echo("no built-in fault simulations yet")
        return 0
    for spec in sorted(faults.FAULTS.values(), key=lambda s: s.name):
        params = ",".join(f"{k}={v}" for k, v in spec.params.items())
        click.echo(f"{spec.name}{':' + params if params else ''}")
        click.echo(f"  {spec.summary}")
        click.echo(f"  imitates: {spec.imitates}")
    return 0
