"""`mystique validate soft-errors`: checked operators, fault-injection campaigns, PVF, SDC screening."""

from __future__ import annotations

import click

import mystique.cli.options as options

from ..errors import UsageError
from .cmd_validate import run_validator, validate


@validate.command("soft-errors")
@options.device_under_test
@options.group("soft_errors")
@click.option("--trials", type=click.IntRange(1), default=None, help="Injected flips of the detection campaign.")
@click.option("--fp-trials", type=click.IntRange(1), default=None, help="Clean checked operations (false positives).")
@click.option("--pvf-trials", type=click.IntRange(1), default=None, help="Flips per parameter group for PVF.")
@options.workloads("Comma-separated workloads for PVF and protect (default all)")
@click.option("--checkpoint", default=None, metavar="DIR", type=click.Path(file_okay=False),
              help="Folder of campaign checkpoints (a rerun with the same settings resumes from it).")
@click.option("--overhead-sizes", default=None, metavar="N,N,...",
              help="fp32 GEMM sizes (M=K=N) of the overhead group (default 1024,2048).")
@click.option("--overhead-tables", default=None, metavar="RxD[xBAGSxLEN],...",
              help="EmbeddingBag shapes of the overhead group: rows x dim, optionally x bags x bag length "
                   "(default bags 2048 of 40; quick: 100000x64,100000x128).")
@click.option("--overhead-reps", type=click.IntRange(3), default=None,
              help="Interleaved rounds of the overhead timing (tables: ten times as many).")
@click.option("--overhead-threads", type=click.IntRange(0), default=None,
              help="CPU intra-op threads of the overhead timing (0: leave torch's setting; default 1).")
@options.force
def soft_errors_cmd(output, device, inject, emulate, level, seed, groups, trials, fp_trials, pvf_trials, workloads,
                    checkpoint, overhead_sizes, overhead_tables, overhead_reps, overhead_threads, force) -> int:
    """Soft-error detection on the device; writes OUT_DIR/results.csv.

    Checksummed GEMM and EmbeddingBag (clean runs must not alarm, injected flips must be found),
    detection and false-positive rates with Wilson intervals, Parameter Vulnerability Factors of the
    reference workloads, repeat-and-compare SDC screening and the checksum overhead.
    """
    from ..validators import soft_errors  # (torch: imported only when the command runs)

    return run_validator(soft_errors.run, output, force, device, inject, emulate, level=level, seed=seed,
                         groups=list(groups) or None, trials=trials, fp_trials=fp_trials, pvf_trials=pvf_trials,
                         workloads=workloads, checkpoint=checkpoint, overhead_sizes=_sizes(overhead_sizes),
                         overhead_tables=_tables(overhead_tables), overhead_reps=overhead_reps,
                         overhead_threads=overhead_threads)


def _sizes(text: str | None) -> tuple[int, ...] | None:
    """``1024,2048`` -> (1024, 2048); one clear line (exit 2) for anything else."""
    if text is None:
        return None
    try:
        sizes = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--overhead-sizes needs positive integers separated by commas, got {text!r}")
    return sizes


def _tables(text: str | None) -> tuple[tuple[int, int, int, int], ...] | None:
    """``100000x64,1000000x128x512x100`` -> ((rows, dim, bags, length), ...); bags 2048 of 40 by default."""
    if text is None:
        return None
    shapes = []
    for item in (t.strip() for t in text.split(",")):
        try:
            dims = [int(v) for v in item.lower().split("x")]
        except ValueError:
            dims = []
        if len(dims) not in (2, 4) or min(dims) < 1:
            raise UsageError(f"--overhead-tables: {item!r} is not ROWSxDIM or ROWSxDIMxBAGSxLEN (positive integers)")
        shapes.append((*dims, 2048, 40) if len(dims) == 2 else tuple(dims))
    return tuple(shapes)
