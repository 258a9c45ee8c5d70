"""`mystique replay` and `mystique generate`: benchmarks from traces, and how close their replay is."""

from __future__ import annotations

import click

from . import cli, options


@cli.command("replay")
@click.argument("source", metavar="BENCH_OR_TRACE")
@options.output_dir
@options.device
@options.iters
@options.warmup
@click.option("--iteration", default=None, type=int, metavar="K",
              help="Profiler step to replay when reading a trace (default: the last complete one).")
@options.seed
@options.force
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              metavar="S", help="Multi-rank replay: seconds a collective may wait for its peers.")
@click.option("--world-size", default=None, type=click.IntRange(2), metavar="N",
              help="Multi-rank replay of a trace with fewer ranks than N: the others are synthetic peers.")
@click.option("--backend", default=None, type=click.Choice(("gloo", "nccl")),
              help="Multi-rank replay backend (default: nccl on cuda, else gloo).")
def replay_cmd(source, output, device, iters, warmup, iteration, seed, force, timeout, world_size, backend) -> int:
    """Replay BENCH_OR_TRACE (benchmark dir, benchmark.json, trace dir or ET file) with synthetic data.

    Writes OUT_DIR/ops.csv, OUT_DIR/summary.json and OUT_DIR/results.csv. A multi-rank trace (a
    folder of rank-K/ trace dirs or of per-rank ET files named ...K.json) replays with one
    process per rank: OUT_DIR/rank-K/ per rank, OUT_DIR/collectives.csv and a merged summary.
    """
    from .. import results
    from ..distributed import find_rank_sources

    if world_size or find_rank_sources(source) is not None:  # scale-out (mystique.distributed)
        from ..distributed import replay_distributed

        summary, df = replay_distributed(source, output, device=device, iters=iters, warmup=warmup,
                                         iteration=iteration, seed=seed, force=force, world_size=world_size,
                                         backend=backend, timeout=timeout)
        c = summary["collectives"]
        click.echo(f"{summary['world_size']} ranks: {c['replayed']}/{c['total']} collectives, "
                   f"{summary['ops_replayed']}/{summary['ops_total']} ops replayed; critical-path step "
                   f"{summary['replay_step_ms']:.3f} ms (rank {summary['critical_rank']})"
                   + (f", ratio {summary['ratio']:.3f}" if summary["ratio"] is not None else "")
                   + f"; results in {output}")
        return results.exit_code(df)
    from ..replay.run import replay

    summary, df = replay(source, output, device=device, iters=iters, warmup=warmup, iteration=iteration,
                         force=force, seed=seed)
    ratio = summary["ratio"]
    click.echo(
        f"{summary['ops_replayed']}/{summary['ops_total']} ops replayed (coverage {summary['coverage']:.3f}); "
        f"step {summary['replay_step_ms']:.3f} ms"
        + (f", original {summary['original_step_ms']:.3f} ms, ratio {ratio:.3f}" if ratio is not None else "")
        + f"; results in {output}"
    )
    return results.exit_code(df)


@cli.command("generate")
@click.argument("trace", metavar="TRACE")
@options.output_dir
@options.device
@click.option("--dtype", default=None, type=click.Choice(options.DTYPES),
              help="Retarget floating tensors to this dtype (default: as recorded).")
@click.option("--format", "formats", default="json,py", show_default=True, metavar="LIST",
              help="Comma list of json, py, onnx.")
@click.option("--batch-scale", default=None, type=float, metavar="F", help="Scale the batch dimension by F.")
@click.option("--keep", default=None, metavar="REGEX", help="Keep only the ops whose name matches.")
@click.option("--drop", default=None, metavar="REGEX", help="Drop the ops whose name matches.")
@click.option("--obfuscate", is_flag=True, help="Strip module names, scopes and source names; keep op names.")
@click.option("--iteration", default=None, type=int, metavar="K", help="Profiler step to take (default: last complete).")
@options.force
def generate_cmd(trace, output, device, dtype, formats, batch_scale, keep, drop, obfuscate, iteration, force) -> int:
    """Generate a benchmark folder (benchmark.json, benchmark.py) from TRACE (trace dir or ET file)."""
    from ..replay.generate import generate

    plan = generate(trace, output, device=device, dtype=dtype, formats=formats, batch_scale=batch_scale,
                    keep=keep, drop=drop, obfuscate_names=obfuscate, iteration=iteration, force=force)
    skipped = sum(s["count"] for s in plan.metadata.get("skipped", {}).values())
    click.echo(f"{len(plan.ops)} ops ({skipped} will be skipped) written to {output}")
    return 0
