"""`mystique predict`: a step's time on another device or configuration, from its trace."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .group import cli


@cli.command("predict")
@click.argument("source", metavar="CAPTURE_OR_BENCHMARK")
@options.output_dir
@options.predict_ops
@options.predict_scale
@options.predict_profile
@options.predict_target_profile
@options.predict_dtype
@options.predict_batch_scale
@options.predict_verify
@options.predict_original
@options.device
@options.seed
@options.half_width
@options.time_cap(30.0)
@click.option("--iteration", default=None, type=int, metavar="K", help="Profiler step of a trace (default: the last complete one).")
@options.allow_ops
@options.force
def predict_cmd(source, output, ops_csv, scale, profile, target_profile, dtype, batch_scale, verify, original, device,
                seed, half_width, time_cap, iteration, allow_ops, force) -> int:
    """Predict the step time of CAPTURE_OR_BENCHMARK (capture folder, ET file, or benchmark with --ops).

    Builds the step's execution graph (host threads' operators and gaps, kernels on device streams,
    data dependencies, synchronisations, collectives), applies the what-ifs (--scale, --dtype,
    --batch-scale, --target-profile) and simulates it. Writes OUT_DIR/results.csv (predicted step
    time, critical path, per-class breakdown; with --verify the measured time and prediction_error)
    and OUT_DIR/prediction.json.
    """
    from .. import results
    from ..predict import PredictOptions, predict

    o = PredictOptions(ops_csv=ops_csv, scale=scale, profile=profile, target_profile=target_profile, dtype=dtype,
                       batch_scale=batch_scale, verify=verify, original=original, device=device, seed=seed,
                       half_width=half_width, time_cap=time_cap, iteration=iteration, allow_ops=tuple(allow_ops))
    summary, df = predict(source, output, force=force, options=o)
    line = f"predicted step {summary['predicted_step_ms']:.3f} ms ({summary['ops']} ops"
    line += f"; {summary['whatif']})" if summary["whatif"] else ")"
    for v in summary["verify"]:
        if v.get("measured") is not None:
            line += (f"; {v['against'].replace('_', ' ')}: measured {v['measured']:.4g} [{v['low']:.4g}, {v['high']:.4g}]"
                     f"{' (ratio)' if v['kind'] == 'transform' else ' ms'}, error {v['error']:+.2%} ({v['verdict']})")
        else:
            line += f"; {v['against'].replace('_', ' ')}: not verified: {v['why_not']}"
    click.echo(line + f"; results in {output}")
    return results.exit_code(df)
