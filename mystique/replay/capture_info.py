"""What a capture folder holds beside its execution trace: ``capture.json`` (the captured step's
description and uninstrumented step time) and the Kineto trace of the same run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..trace.files import beside
from ..trace.kineto import KINETO_FILE_NAMES

_MAX_CAPTURE_BYTES = 16 * 1024**2
_MAX_CAPTURE_DEPTH = 16  # capture.json nests 3 levels; values copied from it go into the plan's metadata
# what of capture.json rebuilds the captured step in another process (mystique.capture.rebuild_step)
ORIGINAL_STEP_KEYS = ("target", "kind", "config", "mode", "dtype", "seed", "device", "threads")


def read_capture(trace_path: str | os.PathLike) -> dict[str, Any] | None:
    """``capture.json`` beside a trace (or inside a trace dir), or None."""
    p = Path(trace_path)
    folder = p if p.is_dir() else p.parent
    cap = folder / "capture.json"
    if not cap.is_file():
        return None
    try:
        if cap.stat().st_size > _MAX_CAPTURE_BYTES:  # a few KB when we write it: anything huge is not ours
            return None
        data = json.loads(cap.read_text(encoding="utf-8"), parse_constant=_not_json, parse_float=_finite)
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON, bad UTF-8, a 5000-digit number, NaN
        return None
    return data if isinstance(data, dict) and _nesting(data) <= _MAX_CAPTURE_DEPTH else None


def _not_json(name: str) -> float:
    """NaN and Infinity are not JSON: values copied from capture.json go into plans and summaries,
    which are written as strict JSON (found by the fuzz campaign: a NaN seed ended in an internal error)."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e999 parses as inf
        raise ValueError(f"{text[:20]} is beyond a double")
    return v


def _nesting(doc: Any) -> int:
    deepest, stack = 0, [(doc, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def capture_step_ms(capture: dict[str, Any] | None) -> float | None:
    """The median uninstrumented step time (ms) recorded in ``capture.json``, or None."""
    if not capture:
        return None
    st = capture.get("step_time")
    if isinstance(st, dict):
        v = st.get("median_ms")
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            return float(v)
    return None


def capture_subject(capture: dict[str, Any] | None) -> str | None:
    """What ``capture.json`` says was captured: ``workload/config/mode`` for a built-in workload, the
    ``package.module:function`` of a user's step, else its ``target``; None without one."""
    if not capture:
        return None
    w, cfg, mode = capture.get("workload"), capture.get("config"), capture.get("mode")
    if isinstance(w, str) and w:
        return "/".join(str(x) for x in (w, cfg, mode) if x)
    for key in ("function", "target"):
        v = capture.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def capture_original_step(capture: dict[str, Any] | None) -> dict[str, Any] | None:
    """The description of the captured step that :func:`mystique.capture.rebuild_step` needs: the
    capture's target (a built-in workload or ``package.module:function``), config, mode, dtype, seed,
    device and thread count. None without a ``capture.json``, for a multi-rank capture (its step
    runs under a process group) or when the target is missing."""
    if not capture or capture.get("distributed"):
        return None
    if not isinstance(capture.get("target"), str) or not capture["target"]:
        return None
    if capture.get("kind") not in ("workload", "user"):
        return None
    return {k: capture.get(k) for k in ORIGINAL_STEP_KEYS}


def find_kineto(trace_path: str | os.PathLike) -> Path | None:
    return beside(trace_path, KINETO_FILE_NAMES)
