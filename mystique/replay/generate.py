"""``mystique generate``: turn a trace into a benchmark folder.

Writes ``benchmark.json`` (the replay plan, see :mod:`mystique.replay.plan`) and
``benchmark.py`` (a standalone program needing only torch: the replay runtime's source followed by a
small ``main``). Transformations, applied in this order: ``keep``/``drop`` (regexes on op names),
``batch_scale`` (rescale the batch dimension, checked by shape propagation on the meta device),
``dtype`` (retarget floating tensors), ``device`` (the benchmark's default device) and
``obfuscate`` (strip names that could tell the model).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import mystique.replay.runtime as ex

from .. import hostinfo, onnx_export
from ..errors import UsageError
from ..io import atomic_write_text, check_output_dir, staged_output_dir
from ..progress import Progress
from ..targets import parse_device
from .batch_scale import FLOAT_DTYPES, infer_batch, one_line, recompute_nbytes, rescale_batch  # noqa: F401 - infer_batch: re-exported
from .pins import parse_doc_lengths, parse_routing, transform_doc_lengths, transform_routing
from .plan import Plan, normalise, plan_from_path

FORMATS = ("json", "py", "onnx")

_line = one_line


def parse_formats(spec: str) -> list[str]:
    """``"json,py"`` -> ``["json", "py"]`` (UsageError for unknown formats; py implies json)."""
    out = []
    for f in (x.strip().lower() for x in spec.split(",")):
        if not f:
            continue
        if f not in FORMATS:
            raise UsageError(f"unknown format {f!r}; expected a comma list of {', '.join(FORMATS)}")
        if f not in out:
            out.append(f)
    if not out:
        raise UsageError("--format names no format")
    if "py" in out and "json" not in out:
        out.insert(0, "json")
    return out


def _check_device_name(device: str) -> str:
    """A well-formed torch device string (the benchmark may target a device this machine lacks)."""
    return parse_device(device)


def _compile(pattern: str | None, flag: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"{flag} {pattern!r} is not a valid regular expression: {_line(exc)}") from exc


def filter_ops(plan: Plan, keep: str | None = None, drop: str | None = None) -> Plan:
    """Keep the ops whose name matches ``keep`` and drop those matching ``drop`` (``re.search``).

    Tensors that removed ops produced become synthetic inputs of the remaining ones.
    """
    k, d = _compile(keep, "--keep"), _compile(drop, "--drop")
    if k is None and d is None:
        return plan
    ops = [op for op in plan.ops
           if (k is None or k.search(op["name"]) or k.search(op.get("op", "")))
           and not (d is not None and (d.search(op["name"]) or d.search(op.get("op", ""))))]
    if not ops:
        raise UsageError("--keep/--drop removed every operator")
    # the trace's op count before any filter: coverage is reported against it, not the filtered plan's
    before = len(plan.ops)
    plan.metadata.setdefault("original_ops_total", before)
    plan.data["ops"] = ops
    plan.metadata["transforms"].append({"filter": {"keep": keep, "drop": drop, "ops_before": before,
                                                   "ops_after": len(ops)}})
    return normalise(plan)


def retarget_dtype(plan: Plan, dtype: str) -> Plan:
    """Make every floating tensor, storage and floating dtype argument ``dtype``."""
    if dtype not in FLOAT_DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; expected one of {', '.join(FLOAT_DTYPES)}")
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    for t in plan.tensors:
        if t["dtype"] in FLOAT_DTYPES:
            t["dtype"] = dtype
    for s in plan.storages:
        if s["dtype"] in FLOAT_DTYPES and s["dtype"] != dtype:
            old = torch.empty((), dtype=getattr(torch, s["dtype"])).element_size()
            s["nbytes"] = int(math.ceil(int(s["nbytes"]) / old)) * size
            s["dtype"] = dtype

    def fix(enc: Any) -> Any:
        if isinstance(enc, list):
            return [fix(e) for e in enc]
        if isinstance(enc, dict) and enc.get("dtype") in FLOAT_DTYPES:
            return {"dtype": dtype}
        return enc

    for op in plan.ops:
        op["args"] = fix(op["args"])
        op["kwargs"] = {k: fix(v) for k, v in op["kwargs"].items()}
    recompute_nbytes(plan)
    plan.metadata["transforms"].append({"dtype": dtype})
    return plan


def obfuscate(plan: Plan) -> Plan:
    """Strip what could name the model: scopes (module and ``## ... ##`` labels), the source file,
    the capture host/device description, the captured workload's name (``subject``) and every
    argument of skipped ops; op names stay."""
    for op in plan.ops:
        op["scope"] = ""
        if op["action"] != "call":
            op["args"], op["kwargs"] = [], {}
    meta = plan.metadata
    meta["source"] = "obfuscated"
    meta["captured_on"] = None
    meta["subject"] = None
    meta["obfuscated"] = True
    meta["transforms"].append({"obfuscate": True})
    return plan


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

_PY_HEADER = '''#!/usr/bin/env python3
# Mystique Suite standalone benchmark: replays benchmark.json (beside this file) with synthetic data.
# Needs only torch. Usage: python benchmark.py [--device cuda] [--iters 10] [--warmup 3] [--plan PATH]
# Generated from {source} ({ops} operators). What follows is the replay engine, then main().
from __future__ import annotations
'''

_PY_MAIN = '''

if __name__ == "__main__":
    import os
    import sys

    sys.exit(main(default_plan=os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmark.json")))
'''


def _module_text(path: str) -> str:
    """A runtime module's source without its ``from __future__`` import and its imports of the
    suite's own modules (``from .format import ...``, ``from mystique.hostinfo import ...``): in
    ``benchmark.py`` every module's names share one namespace."""
    src = Path(path).read_text(encoding="utf-8")
    lines = src.splitlines()
    for node in ast.parse(src).body:
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__"
                                                 or (node.module or "").startswith("mystique")):
            for k in range(node.lineno - 1, node.end_lineno or node.lineno):
                lines[k] = ""
    return "\n".join(lines).strip() + "\n"


def runtime_source() -> str:
    """The replay runtime as one module: :mod:`mystique.hostinfo`, then the runtime's modules in
    dependency order (:data:`runtime.MODULES`)."""
    folder = Path(ex.__file__).parent
    paths = [hostinfo.__file__] + [str(folder / f"{m}.py") for m in ex.MODULES]
    return "\n\n".join(_module_text(p) for p in paths)


def benchmark_py(plan: Plan) -> str:
    """The source of the standalone ``benchmark.py``: the runtime's source + a ``__main__`` block.

    The program is the same for every plan: what comes from the trace (its file name, and every
    other string, which stays in ``benchmark.json``) is data, never code. The one string shown, the
    trace's name in a comment, is written with :func:`ascii` (quoted, every line break, control and
    non-ASCII character escaped), so it cannot end the comment line.
    """
    source = plan.metadata.get("source")
    shown = ascii(source) if isinstance(source, str) and source else "a trace"
    header = _PY_HEADER.format(source=shown, ops=int(len(plan.ops)))
    return header + "\n" + runtime_source().rstrip() + "\n" + _PY_MAIN


def generate(
    trace: str,
    out_dir: str,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    formats: str = "json,py",
    batch_scale: float | None = None,
    keep: str | None = None,
    drop: str | None = None,
    obfuscate_names: bool = False,
    iteration: int | None = None,
    force: bool = False,
    allow_ops: Sequence[str] = (),
    routing: str = "recorded",
    doc_lengths: str = "recorded",
) -> Plan:
    """Generate a benchmark folder from a trace (dir or ET file); returns the written plan.

    ``routing``: the tokens per expert of the pinned grouped GEMMs (:func:`.pins.transform_routing`:
    ``recorded``, ``uniform``, ``skewed:ALPHA``); a trace without them refuses any but ``recorded``.
    ``doc_lengths``: the lengths of the pinned packed documents (:func:`.pins.transform_doc_lengths`).

    ``allow_ops``: fnmatch patterns (``ns::name``) of operators outside
    ``runtime.ALLOWED_OP_NAMESPACES`` to keep (else skipped in the plan); whoever replays the
    benchmark passes them again (``benchmark.py --allow-ops``, ``mystique replay --allow-ops``)."""
    fmts = parse_formats(formats)
    try:
        parse_routing(routing)
        parse_doc_lengths(doc_lengths)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if "onnx" in fmts:
        onnx_export.require()  # exit 3 naming the missing package, before any work
    _compile(keep, "--keep")
    _compile(drop, "--drop")
    check_output_dir(out_dir, force)
    device = _check_device_name(device)
    prog = Progress("generate")
    prog.note(f"reading {trace}")
    plan, kind = plan_from_path(trace, iteration, allow_ops)
    if kind == "benchmark":
        raise UsageError(f"{_line(trace)} is a benchmark already; generate reads a trace")
    prog.note(f"{len(plan.ops)} ops of iteration {plan.metadata.get('iteration')}")
    plan = filter_ops(plan, keep, drop)
    if batch_scale is not None and batch_scale != 1:
        prog.note(f"rescaling the batch by {batch_scale}")
        plan = rescale_batch(plan, batch_scale, allow_ops)
    if dtype:
        plan = retarget_dtype(plan, dtype)
    if routing != "recorded":
        if not transform_routing(plan, routing):
            raise UsageError(f"--routing {routing}: {_line(trace)} records no routing (no grouped GEMM with "
                             "recorded group offsets; capture it again with this version)")
        plan.metadata["transforms"].append({"routing": plan.metadata["routing"]})
        prog.note(f"routing: {plan.metadata['routing']}")
    if doc_lengths != "recorded":
        if not transform_doc_lengths(plan, doc_lengths):
            raise UsageError(f"--doc-lengths {doc_lengths}: {_line(trace)} records no packed documents (no "
                             "document-masked attention with recorded document ids)")
        plan.metadata["transforms"].append({"doc_lengths": doc_lengths})
    plan.metadata["default_device"] = device
    if obfuscate_names:
        plan = obfuscate(plan)
    e = ex.Executor(plan.data, "meta", check_memory=False)
    plan.metadata["peak_bytes"] = e.peak_bytes()
    with staged_output_dir(out_dir, force) as stage:
        atomic_write_text(stage / "benchmark.json", plan.to_json() + "\n")
        if "py" in fmts:
            atomic_write_text(stage / "benchmark.py", benchmark_py(plan))
        if "onnx" in fmts:
            # asked for explicitly: an export that cannot work fails the command, naming the operators
            prog.note("exporting model.onnx")
            try:
                report = onnx_export.export_benchmark(stage / "benchmark.json", stage / "model.onnx")
            except UsageError as exc:  # name the user's folder, not the staging one
                raise UsageError(str(exc).replace(stage.name, Path(out_dir).name)) from exc
            report.save(stage / "export_report.json")
            if report.substituted:
                prog.note(f"onnx: {len(report.substituted)} tensor(s) of skipped ops became constants")
    prog.note(f"wrote {', '.join('benchmark.' + f for f in fmts)} to {out_dir}")
    return plan
