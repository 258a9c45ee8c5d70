"""ONNX Runtime as a target of the correctness validator (results suite ``onnx``).

For each workload (inference forward at one config) the validator exports ``model.onnx`` (see
:mod:`mystique.onnx_export`), checks it, runs it in ONNX Runtime (the CPU execution provider,
and the CUDA provider when onnxruntime has it and the target is a CUDA device) and compares with
PyTorch on the target device, fed the same inputs:

``onnx_export``             the export itself (exporter, opset, nodes); fails naming the operators
                            that have no ONNX form
``onnx_checker``            ``onnx.checker.check_model(full_check=True)``
``onnx_shape_inference``    ``onnx.shape_inference.infer_shapes(strict_mode=True)``
``onnx_output_deviation``   per output: normwise relative error ``||ort - torch|| / ||torch||``
                            (fp32, bound :data:`FP32_TOLERANCE`) and max absolute error (bound
                            ``FP32_TOLERANCE * max|torch|``)
``onnx_intermediate_deviation``  the same normwise error at each block output of the model
                            (``layers.0``, ...), exposed as extra graph outputs
``onnx_lowp_error_vs_fp64`` the graph exported in float16 / bfloat16, run in ONNX Runtime, against
                            the fp64 golden (the forward in fp64 torch on the CPU): normwise
                            relative error, bound :func:`lowp_bound`
``torch_lowp_error_vs_fp64`` PyTorch's own float16 / bfloat16 forward on the target against the
                            same golden and bound: the yardstick for the row above

ONNX Runtime's CPU provider has no bfloat16 kernels for elementwise ops or Gemm (NOT_IMPLEMENTED);
such rows are ``skip`` naming the missing kernel. A ``--inject`` mode does not reach ONNX Runtime
and is never active while the PyTorch reference runs.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from mystique import onnx_export
from mystique import workloads as wl
from mystique.dtypes import name as dtype_name
from mystique.dtypes import unit_roundoff
from mystique.errors import UsageError
from mystique.progress import Progress
from mystique.results import Results, RunContext
from mystique.targets import Target

from .groups import GroupContext, run_groups

LOW_DTYPES = ("float16", "bfloat16")

#: Bound on the normwise relative error between ONNX Runtime and PyTorch, both in float32.
#: Both evaluate the same operators in fp32 (unit roundoff u = 2^-24) and differ only in
#: summation order, fused kernels and transcendental approximations: a length-K dot product
#: reordered moves by about sqrt(K) u in a normwise sense, a few such stages through
#: normalisation layers stay near 1e-6. 1e-4 leaves headroom for those while an operator computed
#: in reduced precision (fp16: u = 4.9e-4, bf16: 3.9e-3) or a wrong operator (O(1)) fails.
FP32_TOLERANCE = 1e-4
#: Multiple of the unit roundoff bounding a low-precision forward against the fp64 golden.
LOWP_UNITS = 16


def lowp_bound(dtype: torch.dtype) -> float:
    """Bound on the normwise relative error of a ``dtype`` forward against the fp64 golden:
    ``LOWP_UNITS`` unit roundoffs (fp16: 7.8e-3, bf16: 6.25e-2).

    A forward pass is a few dozen rounding stages (weights rounded to ``dtype``, gemms, norms,
    softmax) whose errors add up in norm roughly as sqrt(stages) u. 16u leaves room for a
    different but correct evaluation order, while a graph that silently drops to a narrower
    format (fp8: u >= 2^-4) or computes a wrong operator does not fit.
    """
    return LOWP_UNITS * unit_roundoff(dtype)


def normwise_error(out: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor) -> float:
    """``||out - ref||_2 / ||ref||_2`` in fp64 (the absolute norm when ``ref`` is zero; inf when
    shapes differ or ``out`` is not finite where ``ref`` is)."""
    o = torch.as_tensor(np.asarray(out, dtype=np.float64)) if not isinstance(out, torch.Tensor) else out.double().cpu()
    r = torch.as_tensor(np.asarray(ref, dtype=np.float64)) if not isinstance(ref, torch.Tensor) else ref.double().cpu()
    if o.shape != r.shape:
        return math.inf
    diff = float(torch.linalg.vector_norm(o - r))
    if math.isnan(diff):
        return math.inf
    den = float(torch.linalg.vector_norm(r))
    return diff / den if den > 0 else diff


def max_abs_error(out: np.ndarray | torch.Tensor, ref: np.ndarray | torch.Tensor) -> float:
    """Largest ``|out - ref|`` in fp64 (inf for a shape mismatch or a NaN)."""
    o = np.asarray(out.double().cpu() if isinstance(out, torch.Tensor) else out, dtype=np.float64)
    r = np.asarray(ref.double().cpu() if isinstance(ref, torch.Tensor) else ref, dtype=np.float64)
    if o.shape != r.shape:
        return math.inf
    d = np.abs(o - r)
    return float(d.max()) if d.size and not np.isnan(d).any() else (0.0 if not d.size else math.inf)


def providers_for(target: Target) -> tuple[list[str], str]:
    """ONNX Runtime providers to run: CPU always, CUDA when onnxruntime has it and the target is a
    CUDA device. Returns ``(providers, note)``; ``note`` says why CUDA is absent where it was
    wanted, else empty."""
    ort = onnx_export.require("onnxruntime")["onnxruntime"]
    available = ort.get_available_providers()
    out = ["CPUExecutionProvider"]
    note = ""
    if torch.device(target.device).type == "cuda":
        if "CUDAExecutionProvider" in available:
            out.append("CUDAExecutionProvider")
        else:
            note = "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)"
    return out, note


def _short(provider: str) -> str:
    return "ort-" + provider.replace("ExecutionProvider", "").lower()


def _session(path: str | os.PathLike, provider: str) -> Any:
    ort = onnx_export.require("onnxruntime")["onnxruntime"]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if provider == "CUDAExecutionProvider":
        device_id = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return ort.InferenceSession(str(path), opts, providers=[(provider, {"device_id": device_id})])
    return ort.InferenceSession(str(path), opts, providers=[provider])


def _feeds(inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in inputs.items():
        v = v.detach().cpu()
        out[k] = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
    return out


def _shapes(inputs: dict[str, torch.Tensor]) -> str:
    return " ".join(f"{k}[{'x'.join(map(str, v.shape))}]" for k, v in inputs.items())


def _missing_kernel(exc: BaseException) -> str | None:
    m = re.search(r"Could not find an implementation for (\S+\(\d+\)) node", str(exc))
    if m:
        return m.group(1)
    return "a kernel" if "NOT_IMPLEMENTED" in str(exc) else None


def with_extra_outputs(model_path: Path, values: dict[str, torch.dtype], dest: Path) -> Path:
    """Copy an ONNX model to ``dest`` with the named values added as graph outputs (their element
    type from the torch dtype, shape left to the runtime). Returns ``dest``."""
    onnx = onnx_export.require("onnx")["onnx"]
    proto = onnx.load(str(model_path))
    have = {o.name for o in proto.graph.output}
    for name, dtype in values.items():
        if name in have:
            continue
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype_name(dtype).replace("bfloat16", "float32")))
        if dtype == torch.bfloat16:
            elem = onnx.TensorProto.BFLOAT16
        proto.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    large = proto.ByteSize() > 1_900_000_000
    onnx.save(proto, str(dest), save_as_external_data=large, location=dest.name + ".data" if large else None)
    return dest


def _torch_forward(case: onnx_export.WorkloadCase, device: str, blocks: list[str]) -> tuple[torch.Tensor, dict]:
    """Run the case's module on ``device``; returns the output (CPU) and each block's output."""
    module = case.module.to(device)
    named = onnx_export.block_modules(module.model)
    caught: dict[str, torch.Tensor] = {}
    handles = []
    for b in blocks:
        def hook(_m, _inp, out, b=b):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(t, torch.Tensor):
                caught[b] = t.detach().cpu()
        handles.append(named[b].register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = module(*(v.to(device) for v in case.args))
    finally:
        for h in handles:
            h.remove()
    return out.detach().cpu(), caught


class _Run:
    def __init__(self, target: Target, res: Results, seed: int, work_dir: Path, progress: Progress):
        self.target = target
        self.res = res
        self.seed = seed
        self.work = work_dir
        self.progress = progress
        self.providers, self.provider_note = providers_for(target)

    def export(self, label: str, fn, *a, **k) -> onnx_export.ExportReport | None:
        """Run an export; record ``onnx_export``, ``onnx_checker`` and ``onnx_shape_inference``."""
        try:
            rep = fn(*a, **k)
        except UsageError as exc:
            self.res.add("onnx_export", label, "export_seconds", math.nan, status="fail", unit="s",
                         detail=f"{exc} (seed={self.seed})")
            return None
        mib = rep.file_bytes / 2**20
        extra = f"; TorchScript fallback: {rep.fallback_reason}" if rep.exporter != "dynamo" else ""
        if rep.substituted:
            extra += f"; {len(rep.substituted)} plan tensor(s) substituted by constants"
        self.res.add("onnx_export", label, "export_seconds", rep.seconds, status="pass", unit="s", dtype=rep.dtype,
                     detail=f"exporter={rep.exporter} opset={rep.opset} nodes={sum(rep.onnx_ops.values())} "
                            f"file={mib:.1f} MiB{extra}")
        for check, value in (("onnx_checker", rep.checker), ("onnx_shape_inference", rep.shape_inference)):
            ok = value == "pass"
            self.res.add(check, label, "passed", int(ok), status="pass" if ok else "fail", threshold=1,
                         dtype=rep.dtype, detail="" if ok else f"{value} ({rep.path})")
        return rep

    def run_ort(self, path: Path, feeds: dict[str, np.ndarray], provider: str, subject: str,
                dtype: str) -> list[np.ndarray] | None:
        """Run the model; on a missing kernel record a skip row and return None."""
        try:
            sess = _session(path, provider)
            return sess.run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            kernel = _missing_kernel(exc)
            if kernel is None:
                raise
            self.res.add("onnx_output_deviation" if dtype == "float32" else "onnx_lowp_error_vs_fp64",
                         f"{subject}@{_short(provider)}", "normwise_rel_err", math.nan, status="skip", dtype=dtype,
                         detail=f"onnxruntime {provider} has no {dtype} implementation of {kernel}")
            return None

    def compare_fp32(self, subject: str, rep: onnx_export.ExportReport, ref_out: torch.Tensor,
                     ref_blocks: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> None:
        model = Path(rep.path)
        blocks = {b: v for b, v in rep.intermediates.items() if b in ref_blocks}
        if blocks:
            model = with_extra_outputs(model, {v: ref_blocks[b].dtype for b, v in blocks.items()},
                                       model.parent / f"{model.stem}.intermediates.onnx")
        feeds = _feeds(inputs)
        why = f"seed={self.seed} inputs {_shapes(inputs)}"
        for provider in self.providers:
            subj = f"{subject}@{_short(provider)}"
            outs = self.run_ort(model, feeds, provider, subject, "float32")
            if outs is None:
                continue
            out = outs[0]
            err = normwise_error(out, ref_out)
            scale = float(ref_out.abs().max()) if ref_out.numel() else 0.0
            mae = max_abs_error(out, ref_out)
            abs_bound = FP32_TOLERANCE * max(scale, 1e-30)
            self.res.add("onnx_output_deviation", subj, "normwise_rel_err", err, threshold=FP32_TOLERANCE,
                         dtype="float32", status="pass" if err <= FP32_TOLERANCE else "fail",
                         detail=f"vs torch float32 on {self.target.device}; {why}")
            self.res.add("onnx_output_deviation", subj, "max_abs_err", mae, threshold=abs_bound, dtype="float32",
                         status="pass" if mae <= abs_bound else "fail",
                         detail=f"bound {FP32_TOLERANCE:g} x max|torch| = {abs_bound:.3g}; {why}")
            for (b, _v), value in zip(blocks.items(), outs[1:]):
                e = normwise_error(value, ref_blocks[b])
                self.res.add("onnx_intermediate_deviation", f"{subj}:{b}", "normwise_rel_err", e,
                             threshold=FP32_TOLERANCE, dtype="float32",
                             status="pass" if e <= FP32_TOLERANCE else "fail",
                             detail=f"output of block {b}; {why}")
        if self.provider_note:
            self.res.add("onnx_output_deviation", f"{subject}@ort-cuda", "normwise_rel_err", math.nan, status="skip",
                         dtype="float32", detail=self.provider_note)

    def workload(self, name: str, config: str, batch_size: int | None, low: list[torch.dtype],
                 exporter: str, intermediates: bool) -> None:
        subject = f"{name}/{config}"
        dev = self.target.device
        self.progress.note(f"{subject}: export float32")
        case = onnx_export.workload_case(name, config, seed=self.seed, batch_size=batch_size)
        why = onnx_export.workload_refusal(case)
        if why:  # not applicable: no exporter has a form for one of its operators (export-onnx refuses it)
            self.res.add("onnx_export", subject, "export_seconds", math.nan, status="skip", unit="s",
                         detail=f"not exportable: {why} (seed={self.seed})")
            return
        path = self.work / name / "model.onnx"
        rep = self.export(subject, onnx_export.export_workload, name, config, path, seed=self.seed,
                          exporter=exporter, case=case)
        if rep is None:
            return
        rep.save(path.parent / onnx_export.REPORT_NAME)
        inputs = dict(case.inputs)
        blocks = list(rep.intermediates) if intermediates else []
        self.progress.note(f"{subject}: onnxruntime vs torch on {dev}")
        ref_out, ref_blocks = _torch_forward(case, dev, blocks)
        del case
        self.compare_fp32(subject, rep, ref_out, ref_blocks, inputs)
        if not low:
            return
        gold = onnx_export.workload_case(name, config, dtype=torch.float64, seed=self.seed, batch_size=batch_size)
        with torch.no_grad():
            golden = gold.module(*gold.args).detach()
        del gold
        for dt in low:
            dname = str(dt).replace("torch.", "")
            bound = lowp_bound(dt)
            why = f"seed={self.seed} inputs {_shapes(inputs)}"
            self.progress.note(f"{subject}: {dname} vs fp64 golden")
            lcase = onnx_export.workload_case(name, config, dtype=dt, seed=self.seed, batch_size=batch_size)
            lpath = self.work / name / f"model.{dname}.onnx"
            lrep = self.export(f"{subject}:{dname}", onnx_export.export_workload, name, config, lpath,
                               dtype=dt, seed=self.seed, exporter=exporter, case=lcase)
            try:
                t_out, _ = _torch_forward(lcase, dev, [])
                e = normwise_error(t_out, golden)
                self.res.add("torch_lowp_error_vs_fp64", f"{subject}@torch-{dev}", "normwise_rel_err", e,
                             threshold=bound, dtype=dname, status="pass" if e <= bound else "fail",
                             detail=f"bound {LOWP_UNITS}u; {why}")
            except RuntimeError as exc:
                self.res.add("torch_lowp_error_vs_fp64", f"{subject}@torch-{dev}", "normwise_rel_err", math.nan,
                             status="skip", dtype=dname, detail=f"torch cannot run {dname} on {dev}: "
                                                                f"{str(exc).splitlines()[0][:200]}")
            del lcase
            if lrep is None:
                continue
            feeds = _feeds(inputs)
            for provider in self.providers:
                outs = self.run_ort(Path(lrep.path), feeds, provider, subject, dname)
                if outs is None:
                    continue
                e = normwise_error(outs[0], golden)
                self.res.add("onnx_lowp_error_vs_fp64", f"{subject}@{_short(provider)}", "normwise_rel_err", e,
                             threshold=bound, dtype=dname, status="pass" if e <= bound else "fail",
                             detail=f"bound {LOWP_UNITS}u; exported in {dname}; {why}")

    def benchmark(self, bench: str, exporter: str) -> None:
        subject = f"benchmark:{Path(bench).resolve().name}"
        self.progress.note(f"{subject}: export")
        module = onnx_export.benchmark_module(bench, seed=self.seed)
        path = self.work / "benchmark" / "model.onnx"
        rep = self.export(subject, onnx_export.export_module, module, module.example_inputs, path,
                          input_names=[f"input_{t}" for t in module.input_ids],
                          output_names=[f"output_{t}" for t in module.output_ids], subject=subject,
                          exporter=exporter)
        if rep is None:
            return
        rep.substituted = list(module.substituted)
        rep.save(path.parent / onnx_export.REPORT_NAME)
        with torch.no_grad():
            refs = [r.detach().cpu() for r in module(*module.example_inputs)]
        inputs = {f"input_{t}": v for t, v in zip(module.input_ids, module.example_inputs)}
        feeds = _feeds(inputs)
        for provider in self.providers:
            outs = self.run_ort(path, feeds, provider, subject, "float32")
            if outs is None:
                continue
            for tid, out, ref in zip(module.output_ids, outs, refs):
                e = normwise_error(out, ref)
                self.res.add("onnx_output_deviation", f"{subject}@{_short(provider)}:output_{tid}",
                             "normwise_rel_err", e, threshold=FP32_TOLERANCE, dtype=str(ref.dtype).replace("torch.", ""),
                             status="pass" if e <= FP32_TOLERANCE else "fail",
                             detail=f"vs the plan run by torch on the cpu; seed={self.seed}")


def run(target: Target, *, workloads: tuple[str, ...] | list[str] = wl.WORKLOADS, config: str = "debug",
        seed: int = 0, batch_size: int | None = None, low_precision: tuple[str, ...] | list[str] = LOW_DTYPES,
        intermediates: bool = True, benchmark: str | os.PathLike | None = None, exporter: str = "auto",
        out_dir: str | os.PathLike | None = None, run_id: str | None = None) -> pd.DataFrame:
    """Export, check and run the workloads (and optionally a benchmark folder) in ONNX Runtime.

    ``workloads``: names to export at ``config``; ``low_precision``: dtypes of the fp64-golden
    rows (``float16``, ``bfloat16``; empty for none); ``benchmark``: a generated benchmark folder
    exported with :func:`mystique.onnx_export.export_benchmark` and compared with its eager run.
    The ONNX files (and their ``export_report.json``) are written under ``out_dir/onnx/`` when
    ``out_dir`` is given. Returns the results DataFrame (columns of :data:`mystique.results.COLUMNS`,
    suite ``onnx``). Each workload (and the benchmark) is one group of
    :func:`mystique.validators.groups.run_groups`: one that raises becomes a ``group_error`` row and the
    next runs. Raises UsageError for unknown names or dtypes and EnvironmentUnsupported when an ONNX
    package is missing.
    """
    onnx_export.require()
    workloads = tuple(workloads)
    if not workloads and not benchmark:
        raise UsageError(f"no workload or benchmark given; workloads: {', '.join(wl.WORKLOADS)}")
    for name in workloads:
        if name not in wl.names():
            raise UsageError(f"unknown workload {name!r}; known: {', '.join(wl.names())}")
        if config not in wl.get(name).CONFIGS:
            raise UsageError(f"unknown config {config!r} for workload {name!r}; "
                             f"known: {', '.join(wl.get(name).CONFIGS)}")
    low = []
    for d in low_precision:
        if d not in LOW_DTYPES:
            raise UsageError(f"unknown low-precision dtype {d!r}; expected {', '.join(LOW_DTYPES)}")
        low.append(getattr(torch, d))
    res = Results(RunContext.for_target(target, run_id), "onnx")
    ref_target = target.without_mode()
    tmp = None
    if out_dir is not None:
        work = Path(out_dir) / "onnx"
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="mystique-onnx-")
        work = Path(tmp.name)
    try:
        total = len(workloads) + (1 if benchmark else 0)
        with Progress("onnx", total=total) as progress:
            r = _Run(ref_target, res, seed, work, progress)
            runners = {name: lambda _ctx, name=name: r.workload(name, config, batch_size, low, exporter,
                                                                intermediates) for name in workloads}
            if benchmark:
                runners["benchmark"] = lambda _ctx: r.benchmark(str(benchmark), exporter)
            run_groups(runners, GroupContext(ref_target, res, seed, "", progress), list(runners))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return res.frame()
