"""`mystique capture`: record a workload step as an execution trace."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .group import cli


@cli.command("capture")
@click.argument("target_name", metavar="TARGET")
@options.output_dir
@click.option("-c", "--config", default="debug", show_default=True, help="Named size of the workload.")
@click.option("--mode", default="train", show_default=True, type=click.Choice(("train", "infer")))
@options.device
@options.dtype
@click.option("--steps", default=5, show_default=True, type=click.IntRange(1),
              help="Timed uninstrumented steps; where more than 8, also the pairs of a light-profiled and a plain "
                   "step that `predict` checks its self-prediction against (8 otherwise).")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0), help="Warm-up steps.")
@options.seed
@options.force
@click.option("--nproc", default=None, type=click.IntRange(2), metavar="N",
              help="Capture N ranks (one process each) into OUT/rank-K/; under torchrun the ranks are detected.")
@click.option("--parallel", default="ddp", show_default=True, type=click.Choice(("ddp", "fsdp", "none")),
              help="How a multi-rank capture trains a built-in workload.")
@click.option("--backend", default=None, type=click.Choice(("gloo", "nccl")),
              help="Process-group backend of a multi-rank capture (default: nccl on cuda, else gloo).")
@options.cpu_affinity
def capture_cmd(target_name, output, config, mode, device, dtype, steps, warmup, seed, force,
                nproc, parallel, backend, cpu_affinity) -> int:
    """Capture TARGET (llama | dlrm | bert | package.module:function) into a trace folder."""
    from ..capture import capture
    from ..distributed import torchrun_env

    if nproc or torchrun_env():  # scale-out: one trace dir per rank (mystique.distributed)
        if cpu_affinity != "none":
            from ..errors import UsageError

            raise UsageError("--cpu-affinity applies to a single-process capture")
        from ..distributed import capture_distributed

        capture_distributed(target_name, output, nproc=nproc, parallel=parallel, backend=backend, config=config,
                            mode=mode, device=device, dtype=dtype, steps=steps, warmup=warmup, seed=seed,
                            force=force)
        return 0
    capture(target_name, output, config=config, mode=mode, device=device, dtype=dtype,
            steps=steps, warmup=warmup, seed=seed, force=force, cpu_affinity=cpu_affinity)
    return 0
