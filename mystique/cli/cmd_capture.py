"""`mystique capture`: record a workload step as an execution trace."""

from __future__ import annotations

import click

from . import cli, options


@cli.command("capture")
@click.argument("target_name", metavar="TARGET")
@options.output_dir
@click.option("-c", "--config", default="debug", show_default=True, help="Named size of the workload.")
@click.option("--mode", default="train", show_default=True, type=click.Choice(("train", "infer")))
@options.device
@options.dtype
@click.option("--steps", default=5, show_default=True, type=click.IntRange(1), help="Timed uninstrumented steps.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0), help="Warm-up steps.")
@options.seed
@options.force
def capture_cmd(target_name, output, config, mode, device, dtype, steps, warmup, seed, force) -> int:
    """Capture TARGET (llama | dlrm | bert | package.module:function) into a trace folder."""
    from ..capture import capture

    capture(target_name, output, config=config, mode=mode, device=device, dtype=dtype,
            steps=steps, warmup=warmup, seed=seed, force=force)
    return 0
