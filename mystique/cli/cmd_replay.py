"""`mystique replay` and `mystique generate`: benchmarks from traces, and how close their replay is."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .group import cli


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
@options.timing
@options.half_width
@options.time_cap(60.0)
@options.pacing
@options.threads
@options.cpu_affinity
@options.allow_ops
@click.option("--original", default=None, metavar="MODULE:FUNCTION",
              help="The captured step to time the replay against (paired), when it is a package.module:function "
              "factory: a step that the benchmark or capture folder names is imported only when given here (a "
              "built-in workload is rebuilt from its name).")
@options.against
def replay_cmd(source, output, device, iters, warmup, iteration, seed, force, timeout, world_size, backend,
               timing, half_width, time_cap, pacing, threads, cpu_affinity, allow_ops, original, against) -> int:
    """Replay BENCH_OR_TRACE (benchmark dir, benchmark.json, trace dir or ET file) with synthetic data.

    Writes OUT_DIR/ops.csv, OUT_DIR/summary.json and OUT_DIR/results.csv. Where the captured step
    can be rebuilt (a capture dir, or a benchmark generated from one, of a built-in workload; a user's
    package.module:function step only when named with --original: a benchmark or trace is data, and
    what it names is never imported), the replay alternates with it in this process and the ratio
    replay/original is the median of paired rounds with a 95% interval: pass when the interval lies
    within 0.90-1.10, fail outside, inconclusive (exit 4) when it straddles. --iters is then the
    least number of rounds and --warmup the least number of warm-up rounds. Elsewhere the ratio is
    against the recorded original, a measurement.

    A multi-rank trace (a folder of rank-K/ trace dirs or of per-rank ET files named ...K.json)
    replays with one process per rank: OUT_DIR/rank-K/ per rank, OUT_DIR/collectives.csv and a
    merged summary.

    With --against BASE_BENCH (two routings of one capture): the change BENCH / BASE_BENCH is predicted
    by timing the grouped GEMMs with each routing's loads in paired rounds, then measured in rounds that rotate two executors of each plan,
    beside a null (two more of BASE_BENCH: the floor two executors of one plan show), and judged
    against the prediction with the measured interval widened by that floor (OUT_DIR/results.csv,
    OUT_DIR/routing_skew.json).
    """
    from .. import results
    from ..distributed import find_rank_sources

    if cpu_affinity != "none" and (against is not None or world_size or find_rank_sources(source) is not None):
        from ..errors import UsageError

        raise UsageError("--cpu-affinity applies to a single-process replay of one benchmark (not with --against "
                         "or a multi-rank replay)")
    if against is not None:
        return _against(source, against, output, device, iters, seed, force, world_size, timing, half_width,
                        time_cap, pacing, threads, allow_ops, original)

    if world_size or find_rank_sources(source) is not None:  # scale-out (mystique.distributed)
        from ..distributed import replay_distributed
        from ..errors import UsageError

        if timing == "paired" or pacing != "none" or threads is not None:
            raise UsageError("--timing paired, --pacing and --threads apply to single-process replays; a multi-rank "
                             "replay compares with the recorded step times")

        if allow_ops or original:
            raise UsageError("--allow-ops and --original apply to single-process replays; a multi-rank replay calls "
                             "the operators of the allowed namespaces only, timed against the recorded steps")

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
                         force=force, seed=seed, timing=timing, half_width=half_width, time_cap=time_cap,
                         pacing=pacing, threads=threads, allow_ops=allow_ops, original=original,
                         cpu_affinity=cpu_affinity)
    click.echo(
        f"{summary['ops_replayed']}/{summary['ops_total']} ops replayed (coverage {summary['coverage']:.3f}); "
        f"step {summary['replay_step_ms']:.3f} ms{ratio_words(summary)}; results in {output}"
    )
    if summary.get("verdict") == "inconclusive":
        click.echo(f"inconclusive: the 95% interval [{summary['ratio_low']:.3f}, {summary['ratio_high']:.3f}] of the "
                   f"paired ratio straddles the band 0.90-1.10 (more rounds with --time-cap, or a quieter host, "
                   f"may decide)")
    return results.exit_code(df)


def _against(source, against, output, device, iters, seed, force, world_size, timing, half_width, time_cap, pacing,
             threads, allow_ops, original) -> int:
    from .. import results
    from ..errors import UsageError
    from ..replay.against import replay_against

    if world_size or timing == "recorded" or pacing != "none" or original:
        raise UsageError("--against times two benchmarks in paired rounds in one process: it takes no --world-size, "
                         "--timing recorded, --pacing or --original")
    s, df = replay_against(source, against, output, device=device, seed=seed, iters=iters, half_width=half_width,
                           time_cap=time_cap, threads=threads, allow_ops=tuple(allow_ops), force=force)
    click.echo(f"predicted ratio {s['predicted_ratio']:.4f} [{s['predicted_low']:.4f}, {s['predicted_high']:.4f}] "
               f"({s['predicted_delta_ms']:+.3f} ms on {s['base_step_ms']:.3f}); measured {s['measured_ratio']:.4f} "
               f"[{s['measured_low']:.4f}, {s['measured_high']:.4f}], null {s['null_ratio']:.4f} "
               f"[{s['null_low']:.4f}, {s['null_high']:.4f}] (floor {s['floor']:.4f}), {s['rounds']} rotated rounds "
               f"({s['verdict']}); results in {output}")
    return results.exit_code(df)


def ratio_words(summary: dict) -> str:
    """``, original X ms, ratio R [lo, hi] paired (verdict)`` or ``..., ratio R (recorded)``; empty without."""
    ratio = summary.get("ratio")
    if ratio is None:
        return ""
    head = f", original {summary['original_step_ms']:.3f} ms, ratio {ratio:.3f}"
    if summary.get("ratio_kind") == "paired":
        t = summary.get("timing") or {}
        return (head + f" [{summary['ratio_low']:.3f}, {summary['ratio_high']:.3f}] paired, "
                f"{t.get('rounds')} rounds ({summary.get('verdict')})")
    return head + " (recorded, no verdict)" + (" cross-device" if summary.get("cross_device") else "")


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
@options.allow_ops
@options.routing
@options.doc_lengths
def generate_cmd(trace, output, device, dtype, formats, batch_scale, keep, drop, obfuscate, iteration, force,
                 allow_ops, routing, doc_lengths) -> int:
    """Generate a benchmark folder (benchmark.json, benchmark.py) from TRACE (trace dir or ET file)."""
    from ..replay.generate import generate

    plan = generate(trace, output, device=device, dtype=dtype, formats=formats, batch_scale=batch_scale,
                    keep=keep, drop=drop, obfuscate_names=obfuscate, iteration=iteration, force=force,
                    allow_ops=allow_ops, routing=routing,
                    doc_lengths=doc_lengths)
    skipped = sum(s["count"] for s in plan.metadata.get("skipped", {}).values())
    click.echo(f"{len(plan.ops)} ops ({skipped} will be skipped) written to {output}")
    return 0
