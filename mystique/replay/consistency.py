"""Process-to-process consistency of replays: one capture replayed in several separate processes.

Issue 33's target: each small reference capture, replayed in 3 separate processes, gets the same
verdict all 3 times with every paired ratio within 0.95-1.05. On an H100 a host-bound bert step
gave 0.982 (pass) in one process and 0.726 (fail) in another, each with a tight interval: a paired
interval says how well one process measured its own placement, not whether another process would
measure the same. This module reads the folders of such replays and judges each capture's group:

    python -m mystique.replay.consistency OUT_DIR [--replays N]

OUT_DIR holds replay folders named ``<group>_<k>`` (k = 1..N, as ``.ci/gpu-check``'s fidelity step
writes ``replay_bert_train_1`` ...), each with its ``summary.json`` and ``results.csv``. Writes
``OUT_DIR/consistency/results.csv`` (suite ``replay``, check ``replay_process_consistency``, one row per
group: value the largest |ratio - 1|, low/high the smallest and largest ratio, threshold
:data:`BAND_HALF`; pass when every process wrote a paired ratio, all verdicts agree and every ratio
lies within ``1 ± BAND_HALF``; fail otherwise; ``error`` when a process wrote no summary) and prints
one line per group. Exit code as every command's (:func:`mystique.results.exit_code`).

The band is the issue's target, not a derived bound: it asks that the ratio a process reports be a
property of the benchmark, not of the process, to within half the verdict band (0.90-1.10).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..results import Results, RunContext, exit_code, read_csv, write_csv

#: the target's band around 1 for every process's paired ratio (issue 33: 0.95-1.05)
BAND_HALF = 0.05
_NAME = re.compile(r"^(?P<group>.+)_(?P<k>\d+)$")


def groups(out_dir: str | Path) -> dict[str, dict[int, Path]]:
    """``group -> {k: folder}`` of the replay folders under ``out_dir`` (those with a ``_k`` suffix and a
    summary.json or results.csv)."""
    found: dict[str, dict[int, Path]] = {}
    for d in sorted(Path(out_dir).iterdir()):
        m = _NAME.match(d.name)
        if d.is_dir() and m and d.name.startswith("replay") and (
                (d / "summary.json").exists() or (d / "results.csv").exists() or (d / "meta.json").exists()):
            found.setdefault(m["group"], {})[int(m["k"])] = d
    return found


def _read_summary(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def judge(summaries: Sequence[dict[str, Any] | None], expected: int) -> tuple[str, str, dict[str, Any]]:
    """``(status, detail, figures)`` of one group's replays (None: a process that wrote no summary)."""
    missing = [i + 1 for i, s in enumerate(summaries) if s is None]
    short = max(0, expected - len(summaries))
    got = [s for s in summaries if s is not None]
    ratios = [s.get("ratio") for s in got]
    verdicts = [s.get("verdict") for s in got]
    figures: dict[str, Any] = {"value": None, "low": None, "high": None}
    each = "; ".join(_one(i + 1, s) for i, s in enumerate(summaries))
    if missing or short:
        why = (f"process(es) {', '.join(map(str, missing))} wrote no summary.json" if missing else "")
        why += ("; " if why and short else "") + (f"{short} of {expected} process(es) never ran" if short else "")
        return "error", f"{why}: no consistency claimed; {each}", figures
    if any(s.get("ratio_kind") != "paired" or not _finite(r) for s, r in zip(got, ratios)):
        return "fail", f"a process has no paired ratio (recorded timing or none): {each}", figures
    dev = max(abs(r - 1) for r in ratios)
    figures = {"value": dev, "low": min(ratios), "high": max(ratios)}
    same = len(set(verdicts)) == 1
    inside = dev <= BAND_HALF
    status = "pass" if same and inside else "fail"
    why = ("the same verdict in every process" if same else f"verdicts differ ({', '.join(map(str, verdicts))})")
    why += (f", every ratio within {1 - BAND_HALF:.2f}-{1 + BAND_HALF:.2f}" if inside
            else f", ratio {_far(ratios):.3f} outside {1 - BAND_HALF:.2f}-{1 + BAND_HALF:.2f}")
    return status, f"{len(got)} processes: {why}; {each}", figures


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _far(ratios: Sequence[float]) -> float:
    return max(ratios, key=lambda r: abs(r - 1))


def _one(k: int, s: dict[str, Any] | None) -> str:
    """'#2 0.982 [0.956, 1.001] pass, 9.23/9.22 ms, host timeline, main CPU 1'."""
    if s is None:
        return f"#{k} no summary"
    def f(v: Any) -> str:
        return f"{v:.3f}" if _finite(v) else "n/a"

    t = s.get("timing") or {}
    pl = t.get("cpu_placement") or {}
    where = f"main CPU {pl['main_cpu']}" if pl.get("applied") else "not pinned"
    return (f"#{k} {f(s.get('ratio'))} [{f(s.get('ratio_low'))}, {f(s.get('ratio_high'))}] {s.get('verdict')}, "
            f"{f(s.get('replay_step_ms'))}/{f(s.get('original_step_ms'))} ms, {t.get('basis') or 'no basis'}, {where}")


def consistency(out_dir: str | Path, expected: int = 3) -> Any:
    """The ``replay_process_consistency`` rows of every group under ``out_dir`` (a results DataFrame)."""
    found = groups(out_dir)
    ctx = None
    res = None
    for group, by_k in sorted(found.items()):
        summaries = [_read_summary(by_k[k]) if k in by_k else None for k in range(1, max(expected, max(by_k)) + 1)]
        subject, ctx_now = _subject_and_context(by_k, group)
        if res is None:
            ctx = ctx_now
            res = Results(ctx, "replay")
        status, detail, fig = judge(summaries, expected)
        res.add("replay_process_consistency", subject, "max_abs_ratio_deviation", fig["value"], status=status,
                threshold=BAND_HALF, low=fig["low"], high=fig["high"],
                detail=f"{detail}; reproduce: .ci/gpu-check OUT 600 fidelity (REPLAYS={expected})")
    if res is None:
        res = Results(RunContext(device="unknown"), "replay")
    return res.frame()


def _subject_and_context(by_k: dict[int, Path], group: str) -> tuple[str, RunContext]:
    """The group's subject and run context from the first of its results.csv files that reads."""
    for k in sorted(by_k):
        try:
            df = read_csv(by_k[k] / "results.csv")
        except Exception:  # noqa: BLE001 - a process that died leaves none; the next may
            continue
        if len(df):
            r = df.iloc[0]
            return str(r["subject"]), RunContext(device=str(r["device"]), device_name=str(r["device_name"]),
                                                 torch_version=str(r["torch_version"]))
    return group, RunContext(device="unknown")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mystique.replay.consistency",
                                 description="Judge replays of one capture in separate processes (issue 33).")
    ap.add_argument("out_dir")
    ap.add_argument("--replays", type=int, default=3, help="processes per capture (default 3)")
    a = ap.parse_args(argv)
    if not Path(a.out_dir).is_dir() or a.replays < 1:
        print(f"consistency: error: {a.out_dir!r} is not a folder or --replays < 1", file=sys.stderr)
        return 2
    df = consistency(a.out_dir, a.replays)
    out = Path(a.out_dir) / "consistency"
    out.mkdir(exist_ok=True)
    write_csv(df, out / "results.csv")
    for r in df.itertuples():
        print(f"consistency {r.subject}: {r.status}: {r.detail.split('; reproduce:')[0]}")
    if not len(df):
        print("consistency: no replay folders (replay_<group>_<k>) found", file=sys.stderr)
        return 3
    return exit_code(df)


if __name__ == "__main__":
    sys.exit(main())
