"""The benchmarks the correctness validator replays: a given benchmark, or the built-in references.

The built-in reference benchmarks are the reference workloads (Llama, DLRM, BERT) captured on the
CPU in ``infer`` and ``train`` modes (config ``debug`` at level ``quick``, ``small`` at ``full``) and
generated into plans; float32 as captured, plus bfloat16 variants (the same plans retargeted by
``mystique generate --dtype bfloat16``) so the target's low-precision kernels are compared too.
Captures and plans are cached on disk under ``OUT_DIR/reference_benchmarks/<workload>-<config>-
<mode>-torch<version>/`` and in memory for the process, so the groups of one run (and a rerun
into the same folder) capture each workload once.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mystique import workloads as wl
from mystique.capture import capture
from mystique.replay import generate, plan_from_path
from mystique.replay import runtime as ex

MODES: tuple[str, ...] = ("infer", "train")
LEVELS: dict[str, dict[str, Any]] = {
    "quick": {"config": "debug", "dtypes": {"infer": ("float32", "bfloat16"), "train": ("float32",)}},
    "full": {"config": "small", "dtypes": {"infer": ("float32", "bfloat16"), "train": ("float32", "bfloat16")}},
}
CACHE_DIR = "reference_benchmarks"

_MEMO: dict[tuple[str, ...], dict[str, Any]] = {}


@dataclass
class Benchmark:
    """One benchmark to replay: its name in results rows and its plan (``benchmark.json`` data)."""

    subject: str
    plan: dict[str, Any]
    path: Path | None = None


def load(path: str | os.PathLike) -> Benchmark:
    """A benchmark dir, a ``benchmark.json``, a trace dir or an ET file as a :class:`Benchmark`
    (UsageError when it is none of these)."""
    p = Path(path)
    plan, _kind = plan_from_path(p)
    name = p.name if p.name not in ("benchmark.json", "") else p.parent.name
    return Benchmark(name or str(p), plan.data, p)


def _torch_tag() -> str:
    return "torch" + "".join(c if c.isalnum() or c in ".-" else "_" for c in torch.__version__)


@contextlib.contextmanager
def cache_root(out_dir: str | os.PathLike | None) -> Iterator[Path]:
    """``OUT_DIR/reference_benchmarks`` (created when something is captured), or a temporary folder
    removed afterwards."""
    if out_dir is not None:
        yield Path(out_dir) / CACHE_DIR
        return
    with tempfile.TemporaryDirectory(prefix="mystique-correctness-") as tmp:
        yield Path(tmp)


def _plan_of(folder: Path) -> dict[str, Any] | None:
    path = folder / "benchmark.json"
    if not path.is_file():
        return None
    try:
        return ex.load_plan(path)
    except ex.ReplayError:
        return None


def reference(workload: str, config: str, mode: str, dtype: str, root: Path, progress: Any = None) -> Benchmark:
    """The reference benchmark of ``workload``/``config``/``mode`` in ``dtype``, captured and
    generated into ``root`` unless cached (in memory or on disk)."""
    tag = _torch_tag()
    key = (workload, config, mode, dtype, tag)
    subject = f"{workload}/{config}/{mode}" + ("" if dtype == "float32" else f"/{dtype}")
    folder = root / f"{workload}-{config}-{mode}-{tag}"
    bench_dir = folder / f"benchmark-{dtype}"
    if key in _MEMO:
        return Benchmark(subject, json.loads(json.dumps(_MEMO[key])), None)
    plan = _plan_of(bench_dir)
    if plan is None:
        trace_dir = folder / "trace"
        if not (trace_dir / "capture.json").is_file():
            if progress is not None:
                progress.note(f"capturing {workload} ({config}, {mode}) on cpu")
            # (no light profile: operator outputs are compared here, never the capture's timing)
            capture(workload, trace_dir, config=config, mode=mode, device="cpu", steps=1, warmup=1, seed=0,
                    light=False, force=True)
        if progress is not None:
            progress.note(f"generating {subject}")
        generate(str(trace_dir), str(bench_dir), device="cpu", dtype=None if dtype == "float32" else dtype,
                 formats="json", force=True)
        plan = _plan_of(bench_dir)
        if plan is None:
            raise RuntimeError(f"generate wrote no readable plan into {bench_dir}")
    _MEMO[key] = plan
    return Benchmark(subject, json.loads(json.dumps(plan)), bench_dir)


def references(level: str, root: Path, workloads: tuple[str, ...] = wl.WORKLOADS, config: str | None = None,
               progress: Any = None) -> list[Benchmark]:
    """Every built-in reference benchmark of ``level`` (see the module docstring)."""
    spec = LEVELS[level]
    cfg = config or spec["config"]
    out = []
    for w in workloads:
        for mode in MODES:
            for dtype in spec["dtypes"][mode]:
                out.append(reference(w, cfg, mode, dtype, root, progress))
    return out
