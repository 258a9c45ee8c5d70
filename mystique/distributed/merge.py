"""The merge of a multi-rank replay: the run's ``collectives.csv``, ``summary.json`` and ``results.csv``.

``summary.json`` holds the single-process replay's keys (docs/design.md) summed (counts) or taken
over the real ranks (``replay_step_ms`` and ``original_step_ms``: the slowest rank's, the critical
path; ``ratio`` their quotient), plus ``ranks``, ``world_size``, ``backend`` and ``collectives``.
``results.csv`` holds the ranks' ``replay`` rows and the run's ``distributed`` rows: the checks
(collective coverage, ranks that did not complete, ranks whose results.csv could not be read: an
``error`` row naming the rank and why) and the measurements (critical-path step time, bus bandwidth
per collective: ``info``, no bound holds them).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..io import atomic_write_text, write_csv
from ..results import Results, RunContext, concat, read_csv
from ..results import write_csv as write_results
from ..targets import device_info
from .collectives import COLLECTIVE_COLUMNS, bandwidth
from .launch import LaunchResult


def write_collectives_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """``collectives.csv`` (:data:`COLLECTIVE_COLUMNS`): floats to 6 significant digits, NaN empty."""
    write_csv(path, COLLECTIVE_COLUMNS, [{k: _cell(v) for k, v in r.items()} for r in rows])


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return v


@dataclass
class _Ranks:
    """What the ranks' folders hold, gathered."""

    entries: dict[str, Any] = field(default_factory=dict)
    coll_rows: list[dict[str, Any]] = field(default_factory=list)
    frames: list[Any] = field(default_factory=list)
    real_summaries: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    coll_total: int = 0
    coll_replayed: int = 0
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why its results.csv was not merged


def merge_replay(stage: Path, world: int, backend: str, device: str, res: LaunchResult,
                 timeout: float) -> tuple[dict[str, Any], Any]:
    """Write ``collectives.csv``, ``summary.json`` and ``results.csv`` of the whole run into ``stage``.

    ``summary.json`` holds docs/design.md's keys summed (counts) or taken over the real ranks
    (``replay_step_ms`` and ``original_step_ms``: the slowest rank's, the critical path; ``ratio``
    their quotient), and ``ranks`` (per rank: its summary, ``synthetic``, state), ``world_size``,
    ``backend``, ``collectives`` (``total``, ``replayed``, ``coverage``, ``by_kind``).
    Returns ``(summary, results DataFrame)``.
    """
    got = _Ranks()
    for r in range(world):
        _gather_rank(stage / f"rank-{r}", r, res, got)
    write_collectives_csv(stage / "collectives.csv", got.coll_rows)
    for r, e in got.entries.items():
        d = stage / f"rank-{r}"
        if e["state"] != "done" and not (d / "error.json").exists():
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_text(d / "error.json", json.dumps({"rank": int(r), "state": e["state"],
                                                           "error": e.get("error", "")}, indent=2) + "\n")
    summary = merge_summaries(got.real_summaries, world, backend, got.entries, got.coll_total, got.coll_replayed)
    res_d = _distributed_rows(summary, got, world, backend, device, timeout)
    got.frames.append(res_d.frame())
    df = concat(got.frames)
    write_results(df, stage / "results.csv")
    atomic_write_text(stage / "summary.json", json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
    return summary, df


def _gather_rank(d: Path, r: int, res: LaunchResult, got: _Ranks) -> None:
    """Add rank ``r``'s folder ``d`` (rank.json, summary.json, results.csv, collectives.csv) to ``got``."""
    info = json.loads((d / "rank.json").read_text(encoding="utf-8")) if (d / "rank.json").exists() else {}
    summ = json.loads((d / "summary.json").read_text(encoding="utf-8")) if (d / "summary.json").exists() else None
    outcome = res.outcomes.get(r)
    entry = {"state": outcome.state if outcome else "unknown", "synthetic": bool(info.get("synthetic")),
             "summary": summ, "collectives_total": info.get("collectives_total"),
             "collectives_replayed": info.get("collectives_replayed"), "source": info.get("source"),
             "process_groups": info.get("process_groups")}
    if outcome and outcome.error:
        entry["error"] = outcome.error.splitlines()[0]
    got.entries[str(r)] = entry
    if (d / "results.csv").exists():
        try:
            df = read_csv(d / "results.csv")
            df["subject"] = [f"rank-{r}/{s}" for s in df["subject"]]
            got.frames.append(df)
        except UsageError as exc:  # its rows are lost: an error row says so (and fails the run)
            got.unreadable[r] = str(exc)
    elif entry["state"] == "done":  # a completed rank writes one; a rank that did not is reported apart
        got.unreadable[r] = f"{d / 'results.csv'} is absent"
    rows = _read_csv_rows(d / "collectives.csv")
    got.coll_rows.extend(rows)
    if info.get("synthetic"):
        return
    for row in rows:
        entry.setdefault("by_kind", {})
        entry["by_kind"][row["kind"]] = entry["by_kind"].get(row["kind"], 0) + 1
    if summ is not None:
        got.real_summaries.append((r, summ))
    got.coll_total += int(info.get("collectives_total") or 0)
    got.coll_replayed += int(info.get("collectives_replayed") or 0)


def _distributed_rows(summary: dict[str, Any], got: _Ranks, world: int, backend: str, device: str,
                      timeout: float) -> Results:
    """The run's ``distributed`` rows: coverage, ranks not completed, critical path, bus bandwidth."""
    ctx = RunContext(device=device, device_name=_device_name(device), torch_version=torch.__version__)
    res_d = Results(ctx, "distributed")
    n_real = sum(1 for e in got.entries.values() if not e["synthetic"])
    ok_cov = got.coll_total > 0 and got.coll_replayed == got.coll_total
    res_d.add("collectives_replayed", f"{world} ranks", "coverage", summary["collectives"]["coverage"],
              threshold=1.0, status="pass" if ok_cov else "fail",
              detail=f"{got.coll_replayed}/{got.coll_total} collectives of the {n_real} traced rank(s) replayed "
                     f"on {backend}")
    for r, e in got.entries.items():
        if e["state"] != "done":
            res_d.add("rank_completed", f"rank-{r}", "completed", 0, status="error",
                      detail=e.get("error") or f"rank {r} {e['state']} (timeout {timeout:g} s)")
    for r, why in sorted(got.unreadable.items()):
        res_d.add("rank_results_read", f"rank-{r}", "readable", 0, threshold=1, status="error",
                  detail=f"rank {r}'s results were not merged (its checks are unknown): {why}")
    if summary["replay_step_ms"] is not None and math.isfinite(summary["replay_step_ms"]):
        res_d.add("critical_path_step_time", f"{world} ranks", "median_ms", summary["replay_step_ms"], unit="ms",
                  status="info", detail=f"slowest rank: rank {summary['critical_rank']}")
    if summary["ratio"] is not None:
        # two medians measured at different times, in different processes: a measurement, never a
        # verdict (measure_fidelity times both side by side and gives one from its interval)
        res_d.add("critical_path_step_time_ratio", f"{world} ranks", "ratio", summary["ratio"], status="info",
                  detail=f"recorded (not paired): replay {summary['replay_step_ms']:.3f} ms / captured "
                         f"{summary['original_step_ms']:.3f} ms (max over ranks), measured at different times: "
                         f"no verdict")
    _bandwidth_rows(res_d, got.coll_rows, world)
    return res_d


def _bandwidth_rows(res_d: Results, coll_rows: list[dict[str, str]], world: int) -> None:
    """One ``collective_bus_bandwidth`` row per collective, from its slowest rank's time."""
    by_index: dict[str, list[dict[str, str]]] = {}
    for row in coll_rows:
        by_index.setdefault(row["index"], []).append(row)
    for idx in sorted(by_index, key=lambda x: int(x)):
        rows = by_index[idx]
        times = [_num(r["time_us"]) for r in rows if math.isfinite(_num(r["time_us"]))]
        r0 = rows[0]
        if not times:
            res_d.add("collective_bus_bandwidth", f"#{idx} {r0['kind']}", "busbw_gbps", None, status="error",
                      detail=f"{r0['name']}: not completed on any rank")
            continue
        slowest = max(times)
        size = int(_num(r0["size_bytes"]) or 0)
        n = int(_num(r0["pg_size"]) or world)
        alg, bus = bandwidth(r0["kind"], size, slowest * 1e-6, n)
        # a measurement: no bound of this device's bus bandwidth is known to hold it to
        res_d.add("collective_bus_bandwidth", f"#{idx} {r0['kind']}", "busbw_gbps", bus, unit="GB/s",
                  dtype=r0["dtype"], status="info",
                  detail=f"{r0['name']} on pg {r0['pg_name']} ({n} ranks), {size} B, slowest rank {slowest:.1f} us, "
                         f"algbw {alg:.4g} GB/s ({r0['mode']}; nccl-tests conventions)")


def merge_summaries(real: list[tuple[int, dict[str, Any]]], world: int, backend: str, ranks: dict[str, Any],
                    coll_total: int, coll_replayed: int) -> dict[str, Any]:
    """The run's ``summary.json`` from the real ranks' ``(rank, summary)`` and every rank's entry."""
    ops_total = sum(int(s["ops_total"]) for _, s in real)
    ops_replayed = sum(int(s["ops_replayed"]) for _, s in real)
    skipped: dict[str, int] = {}
    for _, s in real:
        for k, v in (s.get("ops_skipped") or {}).items():
            skipped[k] = skipped.get(k, 0) + int(v)
    cbt = [(float(s["coverage_by_time"]), int(s["ops_total"])) for _, s in real]
    steps = [(float(s["replay_step_ms"]), r) for r, s in real if s.get("replay_step_ms") is not None]
    crit_ms, crit_rank = max(steps) if steps else (math.nan, None)
    originals = [s.get("original_step_ms") for _, s in real]
    original = max(originals) if originals and all(isinstance(o, (int, float)) for o in originals) else None
    ratios_known = all(s.get("ratio") is not None for _, s in real) and real
    ratio = crit_ms / original if (original and ratios_known and math.isfinite(crit_ms)) else None
    kinds: dict[str, int] = {}
    for e in ranks.values():
        for k, v in (e.get("by_kind") or {}).items():
            kinds[k] = kinds.get(k, 0) + v
    return {
        "ops_total": ops_total,
        "ops_replayed": ops_replayed,
        "ops_skipped": dict(sorted(skipped.items())),
        "coverage": ops_replayed / ops_total if ops_total else 1.0,
        "coverage_by_time": (sum(c * n for c, n in cbt) / sum(n for _, n in cbt)) if cbt and sum(n for _, n in cbt)
        else 1.0,
        "original_step_ms": original,
        "replay_step_ms": crit_ms if math.isfinite(crit_ms) else None,
        "ratio": ratio,
        "ratio_kind": "recorded" if ratio is not None else None,
        "world_size": world,
        "backend": backend,
        "critical_rank": crit_rank,
        "per_rank_step_ms": {str(r): ms for ms, r in sorted(steps, key=lambda x: x[1])},
        "collectives": {"total": coll_total, "replayed": coll_replayed,
                        "coverage": coll_replayed / coll_total if coll_total else 1.0, "by_kind": kinds},
        "ranks": ranks,
    }


def _read_csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _device_name(device: str) -> str:
    try:
        return device_info(device).name
    except Exception:  # noqa: BLE001
        return ""
