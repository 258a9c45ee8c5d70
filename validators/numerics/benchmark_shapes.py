"""The GEMM shapes of a benchmark, read from its ``benchmark.json``, that join the op sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mystique.errors import UsageError
from mystique.replay.runtime.format import MAX_PLAN_BYTES_ENV, ReplayError, max_plan_bytes

_GEMM_NAMES = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "mm", "addmm", "bmm", "linear")


def benchmark_gemm_shapes(bench_dir: str | Path, full: bool, limit: int = 6) -> list[tuple[int, int, int]]:
    """(M, K, N) of the distinct 2-D GEMMs named in ``BENCH_DIR/benchmark.json`` (best effort).

    Walks the JSON for operator entries whose ``name``/``op`` is a GEMM and whose tensor
    arguments carry ``shape`` lists; batched shapes are folded into M. Sizes are capped (K at
    16384, M and N at 512 quick / 2048 full). Raises UsageError when the file is missing or is not JSON.
    """
    path = Path(bench_dir)
    path = path / "benchmark.json" if path.is_dir() else path
    try:
        limit = max_plan_bytes()  # the cap of every benchmark.json (MYSTIQUE_MAX_TRACE_BYTES)
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
        if len(raw) > limit:
            raise UsageError(f"{path} is larger than {limit} bytes ({MAX_PLAN_BYTES_ENV} raises the cap)")
        doc = json.loads(raw.decode("utf-8"))
    except ReplayError as exc:
        raise UsageError(str(exc)) from exc
    except FileNotFoundError as exc:
        raise UsageError(f"benchmark file {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a benchmark.json: {exc}") from exc
    cap = 2048 if full else 512
    found: list[tuple[int, int, int]] = []

    def shapes(node: Any) -> list[list[int]]:
        out: list[list[int]] = []
        if isinstance(node, dict):
            shp = node.get("shape", node.get("sizes"))
            if isinstance(shp, list) and all(isinstance(s, int) for s in shp) and len(shp) >= 2:
                out.append(shp)
            for key, val in node.items():
                if key not in ("shape", "sizes", "outputs", "output"):
                    out.extend(shapes(val))
        elif isinstance(node, list):
            for val in node:
                out.extend(shapes(val))
        return out

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = str(node.get("name", node.get("op", "")))
            base = name.split(".")[0]
            if base in _GEMM_NAMES:
                shp = shapes(node.get("inputs", node.get("args", [])))
                mkn = _mkn(base.replace("aten::", ""), shp)
                if mkn:
                    m, k, n = min(mkn[0], cap), min(mkn[1], 16384), min(mkn[2], cap)
                    if (m, k, n) not in found and min(m, k, n) > 0:
                        found.append((m, k, n))
            for val in node.values():
                walk(val)
        elif isinstance(node, list):
            for val in node:
                walk(val)

    walk(doc)
    return found[:limit]


def _mkn(op: str, shp: list[list[int]]) -> tuple[int, int, int] | None:
    mats = [s for s in shp if len(s) >= 2]
    if op == "addmm" and len(mats) >= 2:
        mats = mats[-2:]
    if op == "linear" and mats:
        x = mats[0]
        w = mats[1] if len(mats) > 1 else None
        if w is None or len(w) != 2:
            return None
        return math.prod(x[:-1]), x[-1], w[0]
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    if a[-1] != b[-2]:
        return None
    return math.prod(a[:-1]), a[-1], b[-1]
