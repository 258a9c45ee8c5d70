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
def replay_cmd(source, output, device, iters, warmup, iteration, seed, force) -> int:
    """Replay BENCH_OR_TRACE (benchmark dir, benchmark.json, trace dir or ET file) with synthetic data.

    Writes OUT_DIR/ops.csv, OUT_DIR/summary.json and OUT_DIR/results.csv.
    """
    from .. import results
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
