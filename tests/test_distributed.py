"""Multi-rank capture and replay (mystique.distributed).

The unit tests read the real multi-rank traces of ../shared/traces (PARAM's 8-rank DLRM, 1.0.1;
Chakra's 2-rank all_gather, 1.0.2). The process tests launch real 2-rank gloo groups: a DDP
capture of the debug Llama, its replay, a synthetic peer, a rank that dies and a rank that hangs.
"""

from __future__ import annotations

import csv
import gzip
import json
import tarfile
import time
from pathlib import Path

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.distributed import LaunchResult, RankOutcome, failure_message, find_rank_sources
from mystique.distributed import collectives as coll
from mystique.distributed.runner import FAULT_ENV, parse_fault
from mystique.errors import UsageError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _extract(name: str, dest: Path) -> Path:
    archive = SHARED / name
    if not archive.exists():
        pytest.skip(f"{archive} is absent (the shared real traces are not checked out)")
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory) -> Path:
    return _extract("param__dlrm_pytorch_et.tar.gz", tmp_path_factory.mktemp("dlrm")) / "dlrm_pytorch_et"


@pytest.fixture(scope="module")
def chakra_file(tmp_path_factory) -> Path:
    d = _extract("chakra__1.0.2-chakra.0.0.4.tgz", tmp_path_factory.mktemp("chakra"))
    return d / "1.0.2-chakra.0.0.4.json"


# ------------------------------------------------------------------------------------------------
# bandwidth conventions


def test_bus_factors_follow_nccl_tests():
    assert coll.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for kind in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        assert coll.bus_factor(kind, 8) == pytest.approx(7 / 8)
    assert coll.bus_factor("broadcast", 8) == 1.0
    assert coll.bus_factor("barrier", 8) == 0.0
    alg, bus = coll.bandwidth("all_reduce", 4_000_000_000, 2.0, 4)
    assert alg == pytest.approx(2.0) and bus == pytest.approx(3.0)
    with pytest.raises(ValueError):
        coll.bus_factor("all_reduce", 0)


@given(n=st.integers(1, 4096), size=st.integers(0, 2**40), seconds=st.floats(1e-9, 1e3))
def test_busbw_is_algbw_scaled_within_twice(n, size, seconds):
    alg, bus = coll.bandwidth("all_reduce", size, seconds, n)
    ag, agbus = coll.bandwidth("all_gather", size, seconds, n)
    assert alg == pytest.approx(size / seconds / 1e9)
    assert 0 <= bus < 2 * alg + 1e-12
    assert bus == pytest.approx(2 * agbus)  # all_reduce moves twice what all_gather does per byte


# ------------------------------------------------------------------------------------------------
# finding the ranks


def test_rank_sets_from_rank_dirs_and_numbered_files(tmp_path, dlrm_dir):
    rs = find_rank_sources(dlrm_dir)
    assert rs is not None and rs.ranks == list(range(8))
    assert rs.sources[3].name == "dlrm_eg_3.json"
    (tmp_path / "run" / "rank-1").mkdir(parents=True)
    (tmp_path / "run" / "rank-0").mkdir()
    assert find_rank_sources(tmp_path / "run").ranks == [0, 1]
    single = tmp_path / "single"
    single.mkdir()
    (single / "trace.json.gz").write_bytes(b"")
    assert find_rank_sources(single) is None
    dup = tmp_path / "dup"
    dup.mkdir()
    for name in ("et_1.json", "et_01.json"):
        (dup / name).write_text("{}")
    with pytest.raises(UsageError, match="two files for rank 1"):
        find_rank_sources(dup)


# ------------------------------------------------------------------------------------------------
# what the real traces record


def test_dlrm_rank_collectives_with_splits_pg_and_waits(dlrm_dir):
    from mystique.replay.plan import plan_from_path
    from mystique.trace import load_trace

    src = dlrm_dir / "dlrm_eg_1.json"
    trace = load_trace(src)
    plan, _ = plan_from_path(src)
    specs = list(coll.comm_specs(trace, plan).values())
    colls = [s for s in specs if s.kind != "wait"]
    assert [s.kind for s in colls].count("all_to_all_single") == 5
    assert [s.kind for s in colls].count("all_reduce") == 3
    assert [s.index for s in colls] == list(range(8))
    values = next(s for s in colls if s.in_nelems == 3392)  # the KJT values all_to_allv
    assert values.in_splits == [96, 224, 288, 1664, 592, 96, 192, 240]
    assert values.out_splits == [224] * 8 and values.out_nelems == 1792
    assert {s.seq for s in colls} == set(range(147, 155))
    # 147, 148 and 152 are waited later in the iteration: issued asynchronously
    assert {s.seq for s in colls if s.asynchronous} == {147, 148, 152}
    assert coll.process_groups(trace) == []  # 1.0.1: the default group


def test_chakra_holds_one_rank_of_two_with_its_process_group(chakra_file):
    from mystique.replay.plan import plan_from_path
    from mystique.trace import load_trace

    trace = load_trace(chakra_file)
    pgs = coll.process_groups(trace)
    assert [(p.pg_name, p.group_size, p.backend_config) for p in pgs] == [("0", 2, "cuda:nccl")]
    assert coll.world_size_of(trace) == 2
    plan, _ = plan_from_path(chakra_file)
    specs = [s for s in coll.comm_specs(trace, plan).values() if s.kind != "wait"]
    assert len(specs) >= 10 and {s.kind for s in specs} == {"all_gather"}
    assert {s.pg_name for s in specs} == {"0"}  # backend_id 82149104 -> pg "0"
    assert all(s.in_nelems == 1 and s.out_nelems == 2 and s.asynchronous for s in specs)


@examples(60)
@given(st.data())
def test_mirrored_peers_agree_on_every_all_to_all_pair(data):
    world = data.draw(st.integers(2, 6))
    template = data.draw(st.integers(0, world - 1))
    ins = data.draw(st.lists(st.integers(0, 50), min_size=world, max_size=world))
    outs = data.draw(st.lists(st.integers(0, 50), min_size=world, max_size=world))
    spec = coll.CommSpec(node_id=1, op_index=0, name="c10d::alltoall_base_", kind="all_to_all_single",
                         in_nelems=sum(ins), out_nelems=sum(outs), in_splits=ins, out_splits=outs, index=0)
    ranks = {template: spec}
    for p in range(world):
        if p != template:
            ranks[p] = coll.mirror_for_peer({1: spec}, template, p, world)[1]
    for p in range(world):
        for q in range(world):
            if p == template and q == template:
                continue  # the template talks to itself as recorded
            assert ranks[p].in_splits[q] == ranks[q].out_splits[p], (p, q)


def test_fault_spec_parsing():
    assert parse_fault("die:1:2", 1) == ("die", 2)
    assert parse_fault("die:1:2", 0) is None
    assert parse_fault("hang:0:0", 0) == ("hang", 0)
    with pytest.raises(ValueError):
        parse_fault("explode:1:2", 1)


def test_failure_message_blames_the_rank_that_never_arrived(tmp_path):
    (tmp_path / ".errors").mkdir()
    sched = ["#0 broadcast (c10d::broadcast_, 1024 float32, pg default)",
             "#1 all_reduce (c10d::allreduce_, 9 float32, pg default)"]
    for r in (0, 1):
        (tmp_path / ".errors" / f"rank-{r}.schedule.json").write_text(json.dumps(sched))
    res = LaunchResult({0: RankOutcome(0, "failed", 1, "rank 0: collective #1 all_reduce (...) failed: timeout",
                                       entered=2, left=1, current=1),
                        1: RankOutcome(1, "stopped", -15, "", entered=1, left=1, current=0)})
    msg = failure_message(res, tmp_path, 5)
    assert msg.startswith("rank 1 hung: it never reached collective #1 all_reduce")
    res = LaunchResult({0: RankOutcome(0, "failed", 1, "rank 0: wait failed", entered=2, left=1, current=1),
                        1: RankOutcome(1, "died", 17, "", entered=1, left=1, current=0)})
    msg = failure_message(res, tmp_path, 5)
    assert msg.startswith("rank 1 died (exit code 17) after collective #0 broadcast")
    assert "before collective #1 all_reduce" in msg and "hung" not in msg


# ------------------------------------------------------------------------------------------------
# real process groups: capture DDP on 2 ranks, replay it, synthetic peers, faults


@pytest.fixture(scope="module")
def ddp_capture(tmp_path_factory) -> Path:
    from click.testing import CliRunner

    from mystique.cli import cli

    out = tmp_path_factory.mktemp("cap") / "ddp"
    r = CliRunner().invoke(cli, ["-q", "capture", "llama", "-c", "debug", "--nproc", "2", "--steps", "2",
                                 "--warmup", "1", "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return out


def test_ddp_capture_writes_one_full_trace_dir_per_rank(ddp_capture):
    top = json.loads((ddp_capture / "capture.json").read_text())
    assert top["world_size"] == 2 and top["backend"] == "gloo" and top["parallel"] == "ddp"
    for r in (0, 1):
        d = ddp_capture / f"rank-{r}"
        meta = json.loads((d / "capture.json").read_text())
        assert meta["distributed"]["rank"] == r and meta["distributed"]["world_size"] == 2
        assert meta["distributed"]["process_groups"][0]["group_size"] == 2
        assert "c10d::allreduce_" in meta["distributed"]["collectives"]
        assert meta["step_time"]["median_ms"] > 0
        with gzip.open(d / "trace.json.gz", "rt") as fh:
            names = {n["name"] for n in json.load(fh)["nodes"]}
        assert "## process_group:init ##" in names and "c10d::allreduce_" in names
        assert (d / "kineto.json.gz").stat().st_size > 0
        status = {r["check"]: r["status"] for r in _read(d / "results.csv")}  # a step time has no bound
        assert status == {"uninstrumented_step_time": "info", "trace_recorded": "pass"}


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_replay_of_the_ddp_capture_runs_every_collective_on_both_ranks(ddp_capture, tmp_path, cli_run):
    out = tmp_path / "rep"
    code, stdout, stderr = cli_run("-q", "replay", str(ddp_capture), "-o", str(out), "--iters", "2", "--warmup", "0")
    assert code == 0, stderr  # timing is recorded here: a measurement, no verdict to fail
    summary = json.loads((out / "summary.json").read_text())
    for key in ("ops_total", "ops_replayed", "ops_skipped", "coverage", "coverage_by_time", "original_step_ms",
                "replay_step_ms", "ratio"):
        assert key in summary
    assert summary["world_size"] == 2 and summary["coverage"] == 1.0
    assert summary["collectives"] == {"total": 4, "replayed": 4, "coverage": 1.0,
                                      "by_kind": {"broadcast": 2, "all_reduce": 2}}
    per_rank = [summary["ranks"][str(r)]["summary"]["replay_step_ms"] for r in (0, 1)]
    assert summary["replay_step_ms"] == max(per_rank) and summary["original_step_ms"] > 0
    rows = _read(out / "collectives.csv")
    assert sorted((r["rank"], r["kind"]) for r in rows) == [("0", "all_reduce"), ("0", "broadcast"),
                                                             ("1", "all_reduce"), ("1", "broadcast")]
    ar = next(r for r in rows if r["kind"] == "all_reduce")
    assert int(ar["calls"]) >= 2 and float(ar["time_us"]) > 0 and int(ar["size_bytes"]) > 0
    assert float(ar["busbw_gbps"]) == pytest.approx(float(ar["algbw_gbps"]), rel=1e-3)  # 2(n-1)/n = 1 for n=2
    for r in (0, 1):
        ops = _read(out / f"rank-{r}" / "ops.csv")
        assert any(o["name"] == "c10d::allreduce_" and o["status"] == "replayed" for o in ops)
    results = _read(out / "results.csv")
    cov = next(r for r in results if r["check"] == "collectives_replayed")
    assert cov["status"] == "pass" and cov["suite"] == "distributed"
    # the step-time ratio against the capture's recorded medians is a measurement, never a verdict
    ratio = [r for r in results if r["check"] == "critical_path_step_time_ratio"]
    assert summary["ratio_kind"] == ("recorded" if summary["ratio"] is not None else None)
    assert all(r["status"] == "info" and "recorded (not paired)" in r["detail"] for r in ratio)
    assert len(ratio) == (summary["ratio"] is not None)
    for r in (0, 1):  # a rank of a multi-rank capture is not paired with its step (it needs its group)
        rank = summary["ranks"][str(r)]["summary"]
        assert rank["ratio_kind"] in ("recorded", None) and rank["timing"]["kind"] == "recorded"
    assert all(r["status"] != "fail" for r in results if "ratio" in r["check"])
    assert {r["subject"].split("/")[0] for r in results if r["suite"] == "replay"} == {"rank-0", "rank-1"}


def test_one_rank_trace_replays_with_a_synthetic_peer(chakra_file, tmp_path, cli_run):
    out = tmp_path / "peer"
    code, stdout, stderr = cli_run("-q", "replay", str(chakra_file), "-o", str(out), "--world-size", "2",
                                   "--iters", "2", "--warmup", "0")
    assert code == 0, stderr  # every collective and op replays; its timings are measurements, no verdict
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"]["1"]["synthetic"] is True and summary["ranks"]["0"]["synthetic"] is False
    assert summary["collectives"]["total"] == summary["collectives"]["replayed"] >= 10
    rows = _read(out / "collectives.csv")
    peer = [r for r in rows if r["rank"] == "1"]
    assert peer and all(r["synthetic"] == "True" and r["kind"] == "all_gather" for r in peer)
    assert not (out / "rank-1" / "ops.csv").read_text().count("aten::")  # the peer ran no compute


def _faulty_replay(ddp_capture, out, cli_run, monkeypatch, fault: str, timeout: str) -> tuple[int, str, float]:
    """Replay the DDP capture with the fault ``fault`` injected: ``(exit code, stderr, seconds)``."""
    monkeypatch.setenv(FAULT_ENV, fault)
    t0 = time.perf_counter()
    code, _stdout, stderr = cli_run("-q", "replay", str(ddp_capture), "-o", str(out), "--iters", "1",
                                    "--warmup", "0", "--timeout", timeout)
    return code, stderr, time.perf_counter() - t0


def test_a_rank_that_dies_is_named_with_its_collective(ddp_capture, tmp_path, cli_run, monkeypatch):
    out = tmp_path / "die"
    code, stderr, elapsed = _faulty_replay(ddp_capture, out, cli_run, monkeypatch, "die:1:1", "20")
    assert code == 1
    assert "rank 1 died (exit code 17)" in stderr and "before collective #1 all_reduce" in stderr
    assert elapsed < 120  # liveness, as for the hang below
    assert (out / "rank-0" / "error.json").exists() and (out / "rank-1" / "error.json").exists()
    results = _read(out / "results.csv")
    assert {r["subject"] for r in results if r["check"] == "rank_completed" and r["status"] == "error"} >= {"rank-1"}


def test_a_rank_that_hangs_ends_the_run_within_the_timeout(ddp_capture, tmp_path, cli_run, monkeypatch):
    out = tmp_path / "hang"
    code, stderr, elapsed = _faulty_replay(ddp_capture, out, cli_run, monkeypatch, "hang:0:1", "3")
    assert code == 1
    assert "rank 0 hung: it never reached collective #1 all_reduce" in stderr
    assert "rank(s) 1 waited in" in stderr
    # Liveness, not speed: without the watchdog the run never ends. About 11 s on a quiet 2-core host,
    # 46 s at load 9 (two rank processes spawned and torch imported twice); a hang is unbounded.
    assert elapsed < 120
    err = json.loads((out / "rank-1" / "error.json").read_text())
    assert "#1 all_reduce" in err["error"]
