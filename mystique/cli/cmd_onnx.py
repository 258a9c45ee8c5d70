"""`mystique export-onnx` and `mystique validate onnx`: ONNX export and ONNX Runtime comparisons."""

from __future__ import annotations

import click

import mystique.cli.options as options

from .cmd_validate import run_validator, validate
from .group import cli

_EXPORTERS = ("auto", "dynamo", "torchscript")


@cli.command("export-onnx")
@click.argument("workload", metavar="WORKLOAD|BENCH_DIR")
@click.option("-c", "--config", default="debug", show_default=True, help="Named size of the workload.")
@options.output_dir
@options.dtype
@options.seed
@click.option("--batch-size", type=click.IntRange(1), default=None, help="Batch size (default: the config's).")
@click.option("--exporter", type=click.Choice(_EXPORTERS), default="auto", show_default=True,
              help="dynamo (torch.onnx.export(dynamo=True)); auto falls back to the TorchScript exporter.")
@options.force
def export_onnx_cmd(workload, config, output, dtype, seed, batch_size, exporter, force) -> int:
    """Export a workload's inference forward (llama | dlrm | bert) or a generated benchmark folder
    to OUT_DIR/model.onnx, checked, with OUT_DIR/export_report.json."""
    from pathlib import Path

    import torch

    from .. import onnx_export
    from ..io import check_output_dir, staged_output_dir

    onnx_export.require()
    check_output_dir(output, force)
    with staged_output_dir(output, force) as stage:
        if Path(workload).exists():
            report = onnx_export.export_benchmark(workload, stage / "model.onnx", seed=seed, exporter=exporter)
        else:
            report = onnx_export.export_workload(workload, config, stage / "model.onnx",
                                                 dtype=getattr(torch, dtype), seed=seed,
                                                 batch_size=batch_size, exporter=exporter)
        report.path = str(Path(output) / "model.onnx")
        report.save(stage / onnx_export.REPORT_NAME)
    click.echo(f"{report.subject}: {report.exporter} exporter, opset {report.opset}, "
               f"{sum(report.onnx_ops.values())} nodes; checker {report.checker}; "
               f"strict shape inference {report.shape_inference}; written to {output}/model.onnx")
    by_op: dict[tuple, list[int]] = {}
    for sub in report.substituted:
        by_op.setdefault((sub["index"], sub["op"] or "a view", sub["reason"]), []).append(sub["tensor"])
    for (index, op, reason), tids in by_op.items():
        where = f"op {index} ({op})" if index is not None else op
        click.echo(f"  {len(tids)} output(s) of {where} replaced by constants: {reason}", err=True)
    return 0 if report.ok else 1


@validate.command("onnx")
@options.output_dir
@options.device
@options.inject
@click.option("-w", "--workload", "workloads", multiple=True, type=options.LazyChoice(options.workload_names),
              help="Workload(s) to export and compare (repeatable; default: all of them).")
@click.option("-c", "--config", default="debug", show_default=True, help="Named size of the workloads.")
@click.option("--low-precision", default="float16,bfloat16", show_default=True,
              help="Comma-separated dtypes compared with the fp64 golden; 'none' for none.")
@click.option("--no-intermediates", is_flag=True, help="Compare the outputs only, not each block's output.")
@click.option("--benchmark", type=click.Path(exists=True, file_okay=False), default=None,
              help="Also export and compare a generated benchmark folder.")
@click.option("--exporter", type=click.Choice(_EXPORTERS), default="auto", show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=None)
@options.seed
@options.force
def validate_onnx_cmd(output, device, inject, workloads, config, low_precision, no_intermediates, benchmark,
                      exporter, batch_size, seed, force) -> int:
    """Export to ONNX, check the graph, and compare ONNX Runtime with PyTorch on DEV (suite onnx)."""
    from ..errors import UsageError

    low = () if low_precision.strip().lower() in ("", "none") else tuple(
        d.strip() for d in low_precision.split(",") if d.strip())
    if not workloads and not benchmark:
        workloads = options.workload_names()
    if low and not workloads:
        raise UsageError("--low-precision compares workloads with their fp64 golden: name a --workload")

    def run(target, out_dir, **opts):
        from mystique.validators import onnx_runtime

        return onnx_runtime.run(target, out_dir=out_dir, **opts)

    return run_validator(run, output, force, device, inject, workloads=tuple(workloads), config=config,
                         low_precision=low, intermediates=not no_intermediates, benchmark=benchmark,
                         exporter=exporter, batch_size=batch_size, seed=seed)
