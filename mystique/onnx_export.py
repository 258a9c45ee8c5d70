"""Export reference workloads and generated benchmarks to ONNX, and check what was written.

Two entry points, both returning an :class:`ExportReport`:

* :func:`export_workload` exports the inference forward of a reference workload (``llama``,
  ``dlrm``, ``bert``) at one config;
* :func:`export_benchmark` exports a generated inference benchmark (a ``benchmark.json`` replay
  plan): an ``nn.Module`` whose forward runs the plan's operators, in order, on the plan's
  external tensors (integer tensors such as token ids and bag offsets become graph inputs,
  floating ones initializers).

Both go through :func:`export_module`: the dynamo-based exporter (``torch.onnx.export(...,
dynamo=True)``, translation through onnxscript's torchlib) first; the TorchScript exporter only
when the dynamo exporter fails and ``exporter="auto"``. The report records which one wrote the
file. Every written model is checked with ``onnx.checker.check_model(full_check=True)`` and
``onnx.shape_inference.infer_shapes(strict_mode=True)``. Operators that have no ONNX form are
listed (in the raised :class:`~mystique.errors.UsageError`, and in the report when the
TorchScript exporter managed), never dropped.

The ONNX packages are optional: a missing one raises :class:`EnvironmentUnsupported` naming it
(``pip install 'mystique-suite[onnx]'``).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import EnvironmentUnsupported, UsageError
from .replay.onnx_plan import PlanModule
from .replay.runtime import ReplayError, check_plan, load_plan, plan_refusal

INSTALL_HINT = "pip install 'mystique-suite[onnx]'"
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
EXPORTERS = ("auto", "dynamo", "torchscript")
TORCHSCRIPT_OPSET = 17
REPORT_NAME = "export_report.json"
_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir", "torch.fx")


def require(*names: str) -> dict[str, Any]:
    """Import the ONNX packages (default: onnx, onnxscript, onnxruntime) and return them by name.

    Raises :class:`EnvironmentUnsupported` naming every missing package and how to install it.
    """
    mods: dict[str, Any] = {}
    missing: list[str] = []
    for name in names or ONNX_PACKAGES:
        try:
            mods[name] = importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise EnvironmentUnsupported(
            f"ONNX export needs the package(s) {', '.join(missing)}, which are not installed; {INSTALL_HINT}")
    return mods


@dataclass
class ExportReport:
    """What an export wrote and what was checked.

    ``exporter`` is ``dynamo`` or ``torchscript``; ``inputs`` / ``outputs`` list ``{"name",
    "shape", "dtype"}`` of the graph; ``intermediates`` maps a block of the model (``layers.0``)
    to the ONNX value holding its output, for per-block comparisons; ``aten_ops`` counts the
    operators of the traced program, ``onnx_ops`` the node types of the ONNX graph;
    ``unsupported_ops`` names the operators without an ONNX form (non-empty only when the
    TorchScript exporter stood in for the dynamo one); ``substituted`` lists plan operators whose
    outputs became constants (skipped by the plan, or recorded metadata their result disagreed
    with); ``checker`` and ``shape_inference`` are ``"pass"`` or the first line of the failure.
    """

    path: str
    subject: str
    exporter: str
    opset: int
    dtype: str
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    intermediates: dict[str, str] = field(default_factory=dict)
    aten_ops: dict[str, int] = field(default_factory=dict)
    onnx_ops: dict[str, int] = field(default_factory=dict)
    unsupported_ops: list[str] = field(default_factory=list)
    substituted: list[dict[str, Any]] = field(default_factory=list)
    fallback_reason: str = ""
    checker: str = ""
    shape_inference: str = ""
    seconds: float = 0.0
    file_bytes: int = 0
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when both the checker and strict shape inference passed."""
        return self.checker == "pass" and self.shape_inference == "pass"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the report as JSON, atomically."""
        from .io import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> ExportReport:
        """Read a report written by :meth:`save` (UsageError when it is not one)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"{path} is not an ONNX export report: {exc}") from exc


# ----------------------------------------------------------------------------------------------
# quiet exporting


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Silence the exporters' progress prints, warnings and log lines; yields what they printed."""
    buf = io.StringIO()
    saved = {}
    for name in _NOISY_LOGGERS:
        lg = logging.getLogger(name)
        saved[name] = lg.level
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
            warnings.simplefilter("ignore")
            yield buf
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line[:limit]


def _op_name(target: Any) -> str:
    """``torch.ops.aten.addmm.default`` -> ``aten::addmm.default``; other callables by name."""
    if isinstance(target, torch._ops.OpOverload):
        ns, _, rest = target.name().partition("::")
        name = rest if "." in rest else f"{rest}.default"
        return f"{ns}::{name}"
    return getattr(target, "__name__", str(target))


def _program_ops(ep: Any) -> dict[str, int]:
    """Count the operator targets of an ``ExportedProgram``'s graph."""
    counts: Counter[str] = Counter()
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            counts[_op_name(node.target)] += 1
    return dict(sorted(counts.items()))


_DISPATCH_RE = re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'\)>")


def unsupported_ops(ep: Any, error: BaseException | None = None) -> list[str]:
    """The operators of ``ep`` (an ``ExportedProgram``) that have no ONNX translation.

    Decomposes the program as the dynamo exporter does and lists every remaining operator the
    torchlib registry does not translate (sorted). Where the registry cannot be consulted, the
    operators named in ``error`` (the exporter's failure) are returned instead.
    """
    found: set[str] = set()
    try:
        from torch.onnx._internal.exporter import _fx_passes, _registration

        registry = _registration.ONNXRegistry.from_torchlib()
        with _quiet():
            decomposed = _fx_passes.decompose_with_registry(ep, registry)
        for node in decomposed.graph.nodes:
            if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                    and not registry.is_registered(node.target)):
                name = _op_name(node.target)
                orig = node.meta.get("original_aten")
                if isinstance(orig, torch._ops.OpOverload) and _op_name(orig) != name:
                    name = f"{_op_name(orig)} (as {name})"
                found.add(name)
    except Exception:  # noqa: BLE001 - the private registry API moved: read the error instead
        found = set()
    if not found and error is not None:
        text = str(error)
        for op, overload in _DISPATCH_RE.findall(text):
            ns, _, name = op.partition(".")
            found.add(f"{ns}::{name}.{overload}")
    return sorted(found)


# ----------------------------------------------------------------------------------------------
# checking


def check_model(path: str | os.PathLike) -> tuple[str, str]:
    """Run ``onnx.checker.check_model(full_check=True)`` and strict shape inference on a file.

    Returns ``(checker, shape_inference)``: each ``"pass"`` or the first line of its failure.
    """
    onnx = require("onnx")["onnx"]
    path = str(path)
    try:
        onnx.checker.check_model(path, full_check=True)
        checker = "pass"
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; each is a failed check
        checker = _first_line(exc)
    try:
        model = onnx.load(path, load_external_data=False)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        shapes = "pass"
    except Exception as exc:  # noqa: BLE001
        shapes = _first_line(exc)
    return checker, shapes


def _value_infos(values: Sequence[Any]) -> list[dict[str, Any]]:
    onnx = require("onnx")["onnx"]
    out = []
    for v in values:
        tt = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        out.append({"name": v.name, "shape": shape,
                    "dtype": onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else ""})
    return out


# ----------------------------------------------------------------------------------------------
# the core export


def _scope_of(node: Any) -> list[str]:
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return []
            return [s for s in scopes if isinstance(s, str)]
    return []


def find_block_outputs(model_proto: Any, blocks: Sequence[str], prefix: str = "model") -> dict[str, str]:
    """Map each block (a submodule path such as ``layers.0``) to the ONNX value its forward returns.

    The dynamo exporter records each node's module scope (``pkg.torch.onnx.name_scopes``); the
    output of a block is the first output of the last node inside its scope. Blocks absent from
    the graph are left out.
    """
    last: dict[str, str] = {}
    wanted = {f"{prefix}.{b}" if prefix else b: b for b in blocks}
    for node in model_proto.graph.node:
        if not node.output:
            continue
        for scope in _scope_of(node):
            if scope in wanted:
                last[wanted[scope]] = node.output[0]
    return {b: last[b] for b in blocks if b in last}


def block_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The blocks of a model whose outputs are compared one by one: its direct children, and the
    children of its ``ModuleList`` / ``ModuleDict`` children (``tok_embeddings``, ``layers.0``,
    ..., ``norm``). Containers that are never called themselves are replaced by their items."""
    out: dict[str, nn.Module] = {}
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            for sub, grandchild in child.named_children():
                out[f"{name}.{sub}"] = grandchild
        else:
            out[name] = child
    return out


def _save_program(program: Any, out_path: Path) -> None:
    """Save an ONNXProgram atomically (with ``<name>.data`` beside it when over 2 GiB)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_path.name}.", dir=out_path.parent))
    try:
        program.save(str(tmp / out_path.name))
        for item in sorted(tmp.iterdir(), key=lambda p: p.name != out_path.name):
            os.replace(item, out_path.parent / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _export_torchscript(module: nn.Module, args: tuple, out_path: Path, input_names: list[str],
                        output_names: list[str]) -> None:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    try:
        with _quiet():
            torch.onnx.export(module, args, tmp, dynamo=False, input_names=input_names,
                              output_names=output_names, opset_version=TORCHSCRIPT_OPSET)
        os.replace(tmp, out_path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__}
    for name in ONNX_PACKAGES:
        with contextlib.suppress(ImportError):
            out[name] = getattr(importlib.import_module(name), "__version__", "")
    return out


def _export_dynamo(module: nn.Module, args: tuple[torch.Tensor, ...], out_path: Path, input_names: list[str],
                   output_names: Sequence[str] | None, subject: str,
                   exporter: str) -> tuple[str, str, list[str], dict[str, int]]:
    """Export with the dynamo exporter: ``(exporter used, why it was not, operators without an ONNX
    form, aten operators of the program)``; ``used`` is "" when it failed (UsageError instead when
    the module cannot be traced, or ``exporter`` is ``dynamo``)."""
    try:
        with _quiet():
            ep = torch.export.export(module, args, strict=False)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is reported in one line
        raise UsageError(f"cannot trace {subject or type(module).__name__} with torch.export: "
                         f"{type(exc).__name__}: {_first_line(exc)}") from exc
    aten_ops = _program_ops(ep)
    try:
        with _quiet():
            program = torch.onnx.export(ep, (), dynamo=True, input_names=input_names,
                                        output_names=list(output_names) if output_names else None,
                                        verbose=False, optimize=True)
        _save_program(program, out_path)
        return "dynamo", "", [], aten_ops
    except Exception as exc:  # noqa: BLE001
        unsupported = unsupported_ops(ep, exc)
        fallback_reason = (f"dynamo exporter: no ONNX form for {', '.join(unsupported)}" if unsupported
                           else f"dynamo exporter failed: {type(exc).__name__}: {_first_line(exc)}")
        if exporter == "dynamo":
            raise UsageError(f"cannot export {subject} to ONNX: {fallback_reason}") from exc
        return "", fallback_reason, unsupported, aten_ops


def export_module(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    out_path: str | os.PathLike,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str] | None = None,
    subject: str = "",
    dtype: str = "",
    blocks: Sequence[str] = (),
    exporter: str = "auto",
) -> ExportReport:
    """Export ``module(*args)`` to ``out_path`` and check the file.

    ``exporter``: ``dynamo`` (only the dynamo exporter), ``torchscript`` (only the TorchScript
    exporter) or ``auto`` (dynamo, the TorchScript exporter when dynamo fails; the report says
    which wrote the file and why). ``blocks``: submodule paths of ``module.model`` whose outputs
    are located in the graph (``report.intermediates``; dynamo exporter only).

    Returns the :class:`ExportReport`. Raises :class:`UsageError` when the module cannot be
    traced or has operators without an ONNX form (naming them), and
    :class:`EnvironmentUnsupported` when an ONNX package is missing.
    """
    if exporter not in EXPORTERS:
        raise UsageError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    mods = require()
    onnx = mods["onnx"]
    out_path = Path(out_path)
    t0 = time.perf_counter()
    module = module.eval()
    input_names = list(input_names)
    used, fallback_reason, unsupported, aten_ops = "", "", [], {}
    if exporter in ("auto", "dynamo"):
        used, fallback_reason, unsupported, aten_ops = _export_dynamo(module, args, out_path, input_names,
                                                                      output_names, subject, exporter)
    if not used:
        try:
            _export_torchscript(module, args, out_path, input_names, list(output_names or ["output"]))
            used = "torchscript"
        except Exception as exc:  # noqa: BLE001
            why = fallback_reason or f"TorchScript exporter: {type(exc).__name__}: {_first_line(exc)}"
            if unsupported:
                why = f"operators without an ONNX form: {', '.join(unsupported)}"
            raise UsageError(f"cannot export {subject or type(module).__name__} to ONNX: {why} "
                             f"(TorchScript exporter: {_first_line(exc, 160)})") from exc
    proto = onnx.load(str(out_path), load_external_data=False)
    checker, shapes = check_model(out_path)
    intermediates = find_block_outputs(proto, blocks) if blocks and used == "dynamo" else {}
    graph_outputs = {o.name for o in proto.graph.output}
    intermediates = {b: v for b, v in intermediates.items() if v not in graph_outputs}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    size = sum(p.stat().st_size for p in out_path.parent.glob(out_path.name + "*") if p.is_file())
    return ExportReport(
        path=str(out_path), subject=subject, exporter=used, opset=int(opset), dtype=dtype,
        inputs=_value_infos(proto.graph.input), outputs=_value_infos(proto.graph.output),
        intermediates=intermediates, aten_ops=aten_ops,
        onnx_ops=dict(sorted(Counter(n.op_type for n in proto.graph.node).items())),
        unsupported_ops=unsupported, fallback_reason=fallback_reason if used != "dynamo" else "",
        checker=checker, shape_inference=shapes, seconds=round(time.perf_counter() - t0, 3),
        file_bytes=int(size), versions=_versions(),
    )


# ----------------------------------------------------------------------------------------------
# reference workloads


class _KeyRecorder(dict):
    """A batch dict that records which keys the forward reads, in order."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.read: list[str] = []

    def __getitem__(self, key: str) -> Any:
        if key not in self.read:
            self.read.append(key)
        return super().__getitem__(key)


class WorkloadModule(nn.Module):
    """``forward(*inputs)`` runs the workload's inference forward on ``dict(zip(keys, inputs))``.

    The model is the attribute ``model``, so its blocks appear as ``model.<path>`` scopes.
    """

    def __init__(self, workload: Any, model: nn.Module, keys: Sequence[str]) -> None:
        super().__init__()
        self.workload = workload
        self.model = model
        self.keys = list(keys)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.workload.forward(self.model, dict(zip(self.keys, inputs)))


@dataclass
class WorkloadCase:
    """A workload ready to export and compare: the wrapped module, its inputs and their names."""

    name: str
    config: str
    module: WorkloadModule
    inputs: dict[str, torch.Tensor]

    @property
    def subject(self) -> str:
        return f"{self.name}/{self.config}"

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.inputs.values())


def workload_case(name: str, config: str = "debug", *, dtype: torch.dtype = torch.float32, seed: int = 0,
                  batch_size: int | None = None, device: str | torch.device = "cpu") -> WorkloadCase:
    """Build the model (eval mode) and batch of a workload; the inputs are the batch entries its
    forward reads (labels are not). UsageError for unknown names, configs and batch sizes."""
    from . import workloads

    try:
        mod = workloads.get(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if config not in mod.CONFIGS:
        raise UsageError(f"unknown config {config!r} for workload {name!r}; known: {', '.join(mod.CONFIGS)}")
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"batch size must be at least 1; got {batch_size}")
    cfg = mod.CONFIGS[config]
    dev = torch.device(device)
    needed = mod.memory_bytes(cfg, mode="infer", dtype=dtype, batch_size=batch_size)
    try:
        workloads.base.check_fits(f"{name} {config} infer", needed, dev)
    except workloads.WorkloadTooLarge as exc:
        raise EnvironmentUnsupported(str(exc)) from exc
    model = mod.build_model(cfg, device=dev, dtype=dtype, seed=seed).eval()
    batch = _KeyRecorder(mod.make_batch(cfg, device=dev, seed=seed, batch_size=batch_size))
    with torch.no_grad():
        mod.forward(model, batch)  # learns which entries the forward reads
    inputs = {k: dict.__getitem__(batch, k) for k in batch.read}
    return WorkloadCase(name, config, WorkloadModule(mod, model, list(inputs)), inputs)


def workload_refusal(case: WorkloadCase) -> str | None:
    """Why the workload of ``case`` has no ONNX export, naming the operator (its ``onnx_refusal``), or None."""
    refusal = getattr(case.module.workload, "onnx_refusal", None)  # a workload that knows it cannot be exported
    return refusal(case.module.model) if refusal is not None else None


def export_workload(name: str, config: str, out_path: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
                    seed: int = 0, batch_size: int | None = None, exporter: str = "auto",
                    case: WorkloadCase | None = None) -> ExportReport:
    """Export the inference forward of workload ``name`` at ``config`` to ``out_path``.

    The graph's inputs are named after the batch entries (``tokens``, ``dense``, ...), its output
    ``output``; its initializers are the seeded weights in ``dtype``. ``report.intermediates``
    locates each block's output (see :func:`block_modules`). ``case`` reuses a built
    :class:`WorkloadCase`. Returns the :class:`ExportReport`.
    """
    require()
    case = case or workload_case(name, config, dtype=dtype, seed=seed, batch_size=batch_size)
    why = workload_refusal(case)
    if why:
        raise UsageError(f"cannot export {case.subject} to ONNX: {why}")
    blocks = list(block_modules(case.module.model))
    return export_module(case.module, case.args, out_path, input_names=list(case.inputs),
                         output_names=["output"], subject=case.subject,
                         dtype=str(dtype).replace("torch.", ""), blocks=blocks, exporter=exporter)


# ----------------------------------------------------------------------------------------------
# generated benchmarks (replay plans)


def _load_plan(plan_or_bench_dir: Any) -> dict[str, Any]:
    """The plan's data, checked: its header, and no operator the operator policy refuses."""
    plan = _read_plan(plan_or_bench_dir)
    refused = plan_refusal(plan["ops"])
    if refused:
        raise UsageError(refused)
    return plan


def _read_plan(plan_or_bench_dir: Any) -> dict[str, Any]:
    if isinstance(plan_or_bench_dir, dict):
        try:
            return check_plan(plan_or_bench_dir)
        except ReplayError as exc:
            raise UsageError(f"not a benchmark plan: {exc}") from exc
    data = getattr(plan_or_bench_dir, "data", None)
    if isinstance(data, dict):
        return _read_plan(data)
    p = Path(plan_or_bench_dir)
    if p.is_dir():
        p = p / "benchmark.json"
    if not p.is_file():
        raise UsageError(f"{p} does not exist (expected a benchmark folder or its benchmark.json)")
    try:
        return load_plan(p)
    except ReplayError as exc:
        raise UsageError(f"{p}: {exc}") from exc


def benchmark_module(plan_or_bench_dir: Any, *, seed: int = 0, float_inputs: bool = False) -> PlanModule:
    """The :class:`PlanModule` of a plan (a dict, a ``Plan``, a benchmark folder or its
    ``benchmark.json``), already run once eagerly on the CPU. UsageError for a bad plan."""
    plan = _load_plan(plan_or_bench_dir)
    module = PlanModule(plan, seed=seed, float_inputs=float_inputs)
    module.check_results()
    if not module.output_ids:
        raise UsageError("the benchmark produces no tensor to export (every op was skipped)")
    return module


def export_benchmark(plan_or_bench_dir: Any, out_path: str | os.PathLike, *, seed: int = 0,
                     exporter: str = "auto", float_inputs: bool = False) -> ExportReport:
    """Export a generated inference benchmark to ONNX (see :class:`PlanModule`).

    ``plan_or_bench_dir``: a benchmark folder, its ``benchmark.json``, a plan dict or a ``Plan``.
    Graph inputs are named ``input_<tensor id>``, outputs ``output_<tensor id>``; floating
    external tensors are initializers unless ``float_inputs``. Returns the
    :class:`ExportReport` (``substituted`` lists plan ops whose outputs became constants).
    Raises UsageError for a bad plan or operators without an ONNX form (naming them), and
    EnvironmentUnsupported when an ONNX package is missing.
    """
    require()
    module = benchmark_module(plan_or_bench_dir, seed=seed, float_inputs=float_inputs)
    if isinstance(plan_or_bench_dir, (str, os.PathLike)):
        p = Path(plan_or_bench_dir).resolve()
        subject = p.parent.name if p.is_file() else p.name
    else:
        subject = str(module.plan.get("metadata", {}).get("source") or "benchmark")
    report = export_module(module, module.example_inputs, out_path,
                           input_names=[f"input_{t}" for t in module.input_ids],
                           output_names=[f"output_{t}" for t in module.output_ids],
                           subject=subject, exporter=exporter)
    report.substituted = list(module.substituted)
    return report
