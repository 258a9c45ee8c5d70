"""What a report is built from: results.csv files and, beside those of replay runs, ops.csv and summary.json.

Nothing else is read, so any report can be rebuilt from these files alone. Never imports torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import UsageError
from ..results import concat, read_csv

RESULTS_NAME = "results.csv"
OPS_NAME = "ops.csv"
SUMMARY_NAME = "summary.json"

#: Columns of the normalised per-operator table (:attr:`ReplayArtifacts.ops`).
OPS_COLUMNS: tuple[str, ...] = (
    "index",
    "name",
    "overload",
    "input_shapes",
    "input_dtypes",
    "original_ms",
    "replay_ms",
    "status",
    "reason",
)
_NAME_ALIASES = ("name", "op", "op_name", "operator")
_INDEX_ALIASES = ("index", "idx", "op_index", "id")
_OVERLOAD_ALIASES = ("overload",)
_SHAPES_ALIASES = ("input_shapes", "shapes", "in_shapes")
_DTYPES_ALIASES = ("input_dtypes", "dtypes", "in_dtypes", "input_types")
_TIME_COLUMN = re.compile(r"^(?P<kind>original|orig|replay)(?:_[a-z0-9]+)*_(?P<unit>ms|us|ns|s)$")
_TO_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
_SUMMARY_NUMBERS = (
    "ops_total",
    "ops_replayed",
    "coverage",
    "coverage_by_time",
    "original_step_ms",
    "replay_step_ms",
    "ratio",
)


@dataclass(frozen=True)
class ReplayArtifacts:
    """The ops.csv / summary.json pair found beside one results.csv.

    ``ops`` has the columns of :data:`OPS_COLUMNS` (times in milliseconds, NaN where unknown), or is
    None when the folder has no ops.csv; ``summary`` is the parsed summary.json, or None.
    """

    folder: Path
    label: str
    run_id: str
    device: str
    summary: dict[str, Any] | None
    ops: pd.DataFrame | None


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report shows: the validated results table, replay artifacts, and the files read."""

    results: pd.DataFrame
    replays: tuple[ReplayArtifacts, ...] = ()
    sources: tuple[str, ...] = ()


def discover(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Expand files and folders into the list of results.csv files to read (each once, in order).

    A folder contributes every ``results.csv`` below it (hidden folders skipped, sorted). Raises
    UsageError for a path that does not exist, or a folder without any results.csv.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise UsageError("no results file given")
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            hits = sorted(
                h
                for h in p.rglob(RESULTS_NAME)
                if h.is_file() and not any(part.startswith(".") for part in h.relative_to(p).parts[:-1])
            )
            if not hits:
                raise UsageError(f"folder {p} holds no {RESULTS_NAME}")
        elif p.exists():
            hits = [p]
        else:
            raise UsageError(f"results file {p} does not exist")
        for h in hits:
            key = h.resolve()
            if key not in seen:
                seen.add(key)
                found.append(h)
    return found


def _pick(columns: Sequence[str], aliases: Sequence[str]) -> str | None:
    lower = {c.lower(): c for c in columns}
    for a in aliases:
        if a in lower:
            return lower[a]
    return None


def read_ops(path: Path) -> pd.DataFrame:
    """Read a replay ops.csv into the columns of :data:`OPS_COLUMNS` (times converted to ms).

    Accepted source columns: ``name`` (or ``op``), optional ``index``, ``overload``,
    ``input_shapes``, ``input_dtypes``, ``status`` (replayed, skipped, ...), ``reason``, and time columns named ``original[_...]_<unit>`` /
    ``replay[_...]_<unit>`` with unit ``s``, ``ms``, ``us`` or ``ns`` (e.g. ``replay_ms``,
    ``original_time_us``). A replay time column is required. UsageError on anything else.
    """
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"{path} is not an ops table: {str(exc).splitlines()[0] if str(exc) else exc}"
        ) from exc
    cols = list(raw.columns)
    name = _pick(cols, _NAME_ALIASES)
    if name is None:
        raise UsageError(f"{path}: ops table lacks an operator name column (name)")
    times: dict[str, tuple[str, float]] = {}
    for c in cols:
        m = _TIME_COLUMN.match(c.lower())
        if m:
            kind = "replay" if m["kind"] == "replay" else "original"
            times.setdefault(kind, (c, _TO_MS[m["unit"]]))
    if "replay" not in times:
        raise UsageError(f"{path}: ops table lacks a replay time column (replay_ms, replay_us, ...)")
    out = pd.DataFrame(index=raw.index)
    idx = _pick(cols, _INDEX_ALIASES)
    out["index"] = (
        pd.to_numeric(raw[idx], errors="coerce") if idx else pd.Series(range(len(raw)), dtype=float)
    )
    out["name"] = raw[name].astype(str)
    for dest, aliases in (
        ("overload", _OVERLOAD_ALIASES),
        ("input_shapes", _SHAPES_ALIASES),
        ("input_dtypes", _DTYPES_ALIASES),
        ("status", ("status", "state")),
        ("reason", ("reason", "skip_reason")),
    ):
        src = _pick(cols, aliases)
        out[dest] = raw[src].astype(str) if src else ""
    for kind in ("original", "replay"):
        if kind in times:
            col, scale = times[kind]
            numbers = pd.to_numeric(raw[col].replace("", math.nan), errors="coerce")
            if numbers.isna().sum() > raw[col].replace("", math.nan).isna().sum():
                raise UsageError(f"{path}: column {col} holds a non-number")
            out[f"{kind}_ms"] = numbers.astype(float) * scale
        else:
            out[f"{kind}_ms"] = math.nan
    return out.loc[:, list(OPS_COLUMNS)].reset_index(drop=True)


def read_summary(path: Path) -> dict[str, Any]:
    """Read a replay summary.json; numeric fields become floats (None where null). UsageError if malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is not a replay summary: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a replay summary: expected a JSON object")
    out: dict[str, Any] = dict(data)
    for key in _SUMMARY_NUMBERS:
        v = data.get(key)
        if v is None:
            out[key] = None
            continue
        try:
            out[key] = float(v)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{path}: {key} is not a number: {v!r}") from exc
    skipped = data.get("ops_skipped") or {}
    if not isinstance(skipped, dict):
        raise UsageError(f"{path}: ops_skipped is not an object")
    out["ops_skipped"] = {str(k): int(v) for k, v in skipped.items() if isinstance(v, (int, float))}
    return out


def _replay_artifacts(csv_path: Path, df: pd.DataFrame) -> ReplayArtifacts | None:
    folder = csv_path.parent
    ops_path, summary_path = folder / OPS_NAME, folder / SUMMARY_NAME
    if not ops_path.is_file() and not summary_path.is_file():
        return None
    replay_rows = df[df["suite"] == "replay"]
    subjects = [s for s in dict.fromkeys(replay_rows["subject"]) if s]
    # per-op rows name "<workload>/<op>": the workload is the subject the others nest under
    subjects = [s for s in subjects if not any(s.startswith(f"{o}/") for o in subjects if o != s)]
    label = subjects[0] if len(subjects) == 1 else (folder.resolve().name or str(folder))
    rows = replay_rows if len(replay_rows) else df
    run_id = rows["run_id"].iloc[0] if len(rows) else ""
    device = rows["device"].iloc[0] if len(rows) else ""
    return ReplayArtifacts(
        folder=folder,
        label=label,
        run_id=run_id,
        device=device,
        summary=read_summary(summary_path) if summary_path.is_file() else None,
        ops=read_ops(ops_path) if ops_path.is_file() else None,
    )


def load_inputs(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> ReportInputs:
    """Read results files (or folders of them) and the replay artifacts beside them.

    Each results.csv is read and validated by :func:`mystique.results.read_csv`; UsageError (one
    line) on a missing path, a malformed or empty file, or wrong columns.
    """
    files = discover(paths if not isinstance(paths, (str, os.PathLike)) else [paths])
    frames, replays = [], []
    for f in files:
        df = read_csv(f)
        frames.append(df)
        art = _replay_artifacts(f, df)
        if art is not None:
            replays.append(art)
    return ReportInputs(results=concat(frames), replays=tuple(replays), sources=tuple(str(f) for f in files))
