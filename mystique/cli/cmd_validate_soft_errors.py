"""`mystique validate soft-errors`: checked operators, fault-injection campaigns, PVF, SDC screening."""

from __future__ import annotations

import click

from . import options
from .cmd_validate import run_validator, validate

_GROUPS = ("abft_gemm", "abft_embedding_bag", "false_positives", "detection_campaign", "pvf", "sdc_screen",
           "overhead")


@validate.command("soft-errors")
@options.output_dir
@options.device
@options.inject
@options.level
@options.seed
@click.option("--group", "groups", multiple=True, type=click.Choice(_GROUPS), metavar="NAME",
              help=f"Run only this check group (repeatable): {', '.join(_GROUPS)}.")
@click.option("--trials", type=click.IntRange(1), default=None, help="Injected flips of the detection campaign.")
@click.option("--fp-trials", type=click.IntRange(1), default=None, help="Clean checked operations (false positives).")
@click.option("--pvf-trials", type=click.IntRange(1), default=None, help="Flips per parameter group for PVF.")
@click.option("--workloads", default=None, metavar="LIST", help="Comma-separated workloads for PVF and protect "
              "(dlrm,bert,llama).")
@click.option("--checkpoint", default=None, metavar="DIR", type=click.Path(file_okay=False),
              help="Folder of campaign checkpoints (a rerun with the same settings resumes from it).")
@options.force
def soft_errors_cmd(output, device, inject, level, seed, groups, trials, fp_trials, pvf_trials, workloads,
                    checkpoint, force) -> int:
    """Soft-error detection on the device; writes OUT_DIR/results.csv.

    Checksummed GEMM and EmbeddingBag (clean runs must not alarm, injected flips must be found),
    detection and false-positive rates with Wilson intervals, Parameter Vulnerability Factors of the
    reference workloads, repeat-and-compare SDC screening and the checksum overhead.
    """
    from ..errors import UsageError
    from ..validators import soft_errors

    wl = None
    if workloads:
        wl = tuple(w.strip() for w in workloads.split(",") if w.strip())
        bad = [w for w in wl if w not in ("dlrm", "bert", "llama")]
        if bad:
            raise UsageError(f"unknown workload(s) {', '.join(bad)}; expected dlrm, bert, llama")
    return run_validator(soft_errors.run, output, force, device, inject, level=level, seed=seed,
                         groups=list(groups) or None, trials=trials, fp_trials=fp_trials, pvf_trials=pvf_trials,
                         workloads=wl, checkpoint=checkpoint)
