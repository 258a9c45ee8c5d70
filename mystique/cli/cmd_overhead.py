"""`mystique overhead`: the replay executor's per-op dispatch cost against eager PyTorch."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .group import cli


@cli.command("overhead")
@options.output_dir
@options.device
@click.option("--ops", "n_ops", default=500, show_default=True, type=click.IntRange(1), metavar="N",
              help="Operators per step.")
@click.option("--steps", "step_list", default="add,mix", show_default=True, metavar="LIST",
              help="Comma list of steps: add (torch.add on 4-element tensors), mix (add, mul, view, linear).")
@click.option("--time-cap", default=20.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              metavar="S", help="Seconds of paired rounds per step (after the warm-up).")
@click.option("--half-width", default=0.01, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              metavar="F", help="Stop once the 95% interval's half-width is at most F of the median ratio.")
@options.seed
@options.force
def overhead_cmd(output, device, n_ops, step_list, time_cap, half_width, seed, force) -> int:
    """Time the executor replaying a step of N small ops against the same ops called eagerly.

    Each step is recorded as `mystique capture` records one, its plan built as `mystique replay`
    builds it, and Executor.run_iteration and the eager step alternate in paired rounds.
    dispatch_overhead_ratio (replay / eager) passes when its 95% interval lies at or below 1.0,
    fails when it lies above, else is inconclusive. Writes OUT_DIR/results.csv and
    OUT_DIR/overhead.json (per-round times).
    """
    from .. import results
    from ..io import check_output_dir
    from ..progress import Progress
    from ..replay.overhead import dispatch_overhead, write_outputs

    check_output_dir(output, force)
    steps = [s.strip() for s in step_list.split(",") if s.strip()]
    progress = Progress("overhead")
    df, stats = dispatch_overhead(device, n_ops, steps=steps, half_width=half_width, time_cap_s=time_cap,
                                  seed=seed, progress=progress.note)
    write_outputs(output, df, stats, force=force)
    def num(v) -> str:
        return f"{v:.3f}" if isinstance(v, (int, float)) else "n/a"

    for subject, s in stats.items():
        click.echo(f"{subject}: replay/eager {num(s['ratio'])} [{num(s['ratio_low'])}, {num(s['ratio_high'])}] "
                   f"({num(s['a_median_ms'])} vs {num(s['b_median_ms'])} ms, {s['rounds']} rounds): {s['verdict']}")
    click.echo(f"results in {output}")
    return results.exit_code(df)
