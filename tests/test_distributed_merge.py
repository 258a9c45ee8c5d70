"""The merge of a multi-rank replay (mystique.distributed.merge) on synthetic rank folders: no process
group is launched; each rank's folder holds what a replaying rank writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mystique.distributed import LaunchResult, RankOutcome
from mystique.distributed.collectives import COLLECTIVE_COLUMNS
from mystique.distributed.merge import merge_replay, write_collectives_csv
from mystique.results import Results, RunContext, exit_code, write_csv


def _rank(stage: Path, r: int, step_ms: float) -> None:
    """Rank ``r``'s folder as a completed replaying rank leaves it: one all_reduce, one replay row."""
    d = stage / f"rank-{r}"
    d.mkdir(parents=True)
    (d / "rank.json").write_text(json.dumps({"rank": r, "synthetic": False, "collectives_total": 1,
                                             "collectives_replayed": 1}))
    (d / "summary.json").write_text(json.dumps({
        "ops_total": 10, "ops_replayed": 10, "ops_skipped": {}, "coverage": 1.0, "coverage_by_time": 1.0,
        "original_step_ms": 2.0, "replay_step_ms": step_ms, "ratio": step_ms / 2.0}))
    res = Results(RunContext(device="cpu"), "replay")
    res.add("ops_replayed", "bench", "coverage", 1.0, threshold=1.0, status="pass")
    write_csv(res.frame(), d / "results.csv")
    row = {c: "" for c in COLLECTIVE_COLUMNS}
    row.update(rank=r, index=0, op_index=3, name="c10d::allreduce_", kind="all_reduce", pg_name="default",
               pg_size=2, dtype="float32", size_bytes=4096, mode="sync", calls=2, time_us=50.0 + r,
               synthetic=False)
    write_collectives_csv(d / "collectives.csv", [row])


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    for r in (0, 1):
        _rank(tmp_path, r, 3.0 + r)
    return tmp_path


def _done(world: int = 2) -> LaunchResult:
    return LaunchResult({r: RankOutcome(r, "done", 0) for r in range(world)})


def test_bandwidth_and_step_time_are_measurements_and_coverage_is_the_check(stage):
    summary, df = merge_replay(stage, 2, "gloo", "cpu", _done(), 10.0)
    dist = df[df.suite == "distributed"].set_index("check")
    assert dist.status["collective_bus_bandwidth"] == "info"  # no bound: a measurement, never a pass
    assert dist.value["collective_bus_bandwidth"] > 0 and "slowest rank 51.0 us" in dist.detail[
        "collective_bus_bandwidth"]
    assert dist.status["critical_path_step_time"] == "info" and dist.status["critical_path_step_time_ratio"] == "info"
    assert dist.status["collectives_replayed"] == "pass" and summary["critical_rank"] == 1
    assert exit_code(df) == 0 and {"rank-0/bench", "rank-1/bench"} <= set(df.subject)


def test_coverage_fails_when_a_collective_was_not_replayed(stage):
    info = json.loads((stage / "rank-1" / "rank.json").read_text())
    (stage / "rank-1" / "rank.json").write_text(json.dumps({**info, "collectives_replayed": 0}))
    _summary, df = merge_replay(stage, 2, "gloo", "cpu", _done(), 10.0)
    cov = df[df.check == "collectives_replayed"].iloc[0]
    assert cov.status == "fail" and cov.detail.startswith("1/2 collectives") and exit_code(df) == 1


@pytest.mark.parametrize("corrupt, reason", [
    (lambda b: b"\xff\xfe\x00garbage\x9c", "is not a results CSV"),  # not text
    (lambda b: b[: b.rindex(b",pass")], "status"),  # cut short in its last row: no status
    (lambda b: b"run_id,started_at\nx,y\n", "lacks column(s)"),
], ids=["binary", "truncated", "columns"])
def test_a_rank_whose_results_csv_is_corrupt_is_an_error_row_naming_it(stage, corrupt, reason):
    f = stage / "rank-1" / "results.csv"
    f.write_bytes(corrupt(f.read_bytes()))
    _summary, df = merge_replay(stage, 2, "gloo", "cpu", _done(), 10.0)
    bad = df[df.status == "error"]
    assert list(bad.check) == ["rank_results_read"] and list(bad.subject) == ["rank-1"]
    assert "rank 1's results were not merged" in bad.detail.iloc[0]
    assert "rank-1/results.csv" in bad.detail.iloc[0] and reason in bad.detail.iloc[0]
    assert exit_code(df) == 1  # the run fails: the rank's checks are unknown
    assert "rank-0/bench" in set(df.subject) and "rank-1/bench" not in set(df.subject)


def test_a_completed_rank_without_results_csv_is_an_error_row(stage):
    (stage / "rank-0" / "results.csv").unlink()
    _summary, df = merge_replay(stage, 2, "gloo", "cpu", _done(), 10.0)
    bad = df[df.status == "error"].set_index("subject")
    assert list(bad.index) == ["rank-0"] and "is absent" in bad.detail["rank-0"]
    assert exit_code(df) == 1
