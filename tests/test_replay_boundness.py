"""What a replayed step is bound by, and the time its fidelity verdict judges (issue 33): synthetic busy
fractions and round times, no GPU and no wall-clock dependence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mystique.replay import boundness
from mystique.replay.boundness import (
    DEVICE_TIME,
    HOST_TIMELINE,
    Bound,
    basis_paired,
    bound_by,
    busy_fraction,
    measure_bound,
    union_ms,
)
from mystique.replay.fidelity import ratio_verdict
from mystique.timing import Paired


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    from mystique.capture import capture

    out = tmp_path_factory.mktemp("cap") / "tiny"
    capture("user_steps:tiny_mlp", out, steps=3, warmup=1)
    return out


def test_union_counts_overlapping_kernels_once():
    assert union_ms([(0, 2), (1, 3), (5, 6), (6, 6.5), (4, 4)]) == pytest.approx(4.5)
    assert union_ms([]) == 0.0
    assert busy_fraction([(0, 1), (2, 3)], 10.0) == pytest.approx(0.2)
    assert busy_fraction([(0, 30)], 10.0) == 1.0 and busy_fraction([(0, 1)], None) is None


@pytest.mark.parametrize("busy,bound,basis", [
    (None, "host", HOST_TIMELINE), (0.15, "host", HOST_TIMELINE), (0.5, "host", HOST_TIMELINE),
    (0.65, "mixed", DEVICE_TIME), (0.8, "device", DEVICE_TIME), (0.97, "device", DEVICE_TIME)])
def test_bound_by_thresholds(busy, bound, basis):
    b = Bound.judge(busy, None, "synthetic")
    assert bound_by(busy) == bound and (b.bound_by, b.basis) == (bound, basis)


def test_the_original_side_decides_where_known():
    assert Bound.judge(0.95, 0.2, "x").bound_by == "host" and Bound.judge(0.2, 0.95, "x").bound_by == "device"


def test_measure_bound_profiles_each_side_over_its_median_step():
    """An injected profiler: the replay's kernels cover 1.5 of its 10 ms, the original's 9 of its 10."""
    p = Paired(a_ms=[10.0] * 6, b_ms=[10.0] * 6, a_wall_ms=[10.0] * 6, b_wall_ms=[10.0] * 6)
    replay, original = (lambda: None), (lambda: None)

    def prof(fn, device, sync):
        return [(0, 1), (0.5, 1.5)] if fn is replay else [(0, 9)]

    b = measure_bound(replay, original, "cuda:0", lambda: None, p, None, profiler=prof)
    assert (b.replay_busy, b.original_busy, b.bound_by) == (pytest.approx(0.15), pytest.approx(0.9), "device")
    cpu = measure_bound(replay, original, "cpu", lambda: None, p, None, profiler=prof)
    assert (cpu.replay_busy, cpu.bound_by, cpu.basis) == (None, "host", HOST_TIMELINE)

    def broken(fn, device, sync):
        raise RuntimeError("no CUPTI")

    b = measure_bound(replay, original, "cuda", lambda: None, p, None, profiler=broken)
    assert b.basis == DEVICE_TIME and "not measured" in b.how


def _rounds(device_ratio: float, wall_ratio: float, n: int = 16) -> Paired:
    """Rounds whose CUDA-event (device) ratios sit near ``device_ratio`` and wall (host) near ``wall_ratio``."""
    jit = [0.99 + 0.02 * i / n for i in range(n)]
    return Paired(a_ms=[10 * device_ratio * j for j in jit], b_ms=[10.0] * n,
                  a_wall_ms=[10 * wall_ratio * j for j in jit], b_wall_ms=[10.0] * n, clock="cuda events")


@pytest.mark.parametrize("busy,device_ratio,wall_ratio,verdict", [
    (0.15, 0.73, 1.00, "pass"),   # host-bound: judged on the host timeline
    (0.15, 1.00, 0.73, "fail"),
    (0.95, 1.00, 0.73, "pass"),   # device-bound: judged on device time
    (0.95, 0.73, 1.00, "fail"),
])
def test_the_verdict_judges_the_time_that_bounds_the_step(busy, device_ratio, wall_ratio, verdict):
    p = basis_paired(_rounds(device_ratio, wall_ratio), Bound.judge(busy, busy, "synthetic").basis)
    assert ratio_verdict(*p.interval) == verdict


@pytest.mark.parametrize("busy,device_ratio,wall_ratio,verdict,basis", [
    (0.15, 0.73, 1.00, "pass", HOST_TIMELINE),
    (0.15, 1.00, 0.73, "fail", HOST_TIMELINE),
    (0.95, 1.00, 0.73, "pass", DEVICE_TIME),
    (0.95, 0.73, 1.00, "fail", DEVICE_TIME),
])
def test_replay_says_what_bounds_the_step_and_which_time_it_judged(trace_dir, tmp_path, cli_run, monkeypatch, busy,
                                                                    device_ratio, wall_ratio, verdict, basis):
    """End to end with injected rounds and busy fractions: summary.json's keys and timing, the rows."""
    from mystique.replay import fidelity, run
    from mystique.results import read_csv

    def fake_rounds(a, b, **kw):
        a()
        b()
        return _rounds(device_ratio, wall_ratio)

    monkeypatch.setattr(fidelity, "paired_rounds", fake_rounds)
    monkeypatch.setattr(run, "measure_bound", lambda *a, **k: Bound.judge(busy, busy, "synthetic"))
    out = tmp_path / "r"
    cli_run("-q", "replay", str(trace_dir), "-o", str(out), "--iters", "2", "--warmup", "0",
            "--original", "user_steps:tiny_mlp")
    s = json.loads((out / "summary.json").read_text())
    keys = [k for k in s if k in ("device_busy", "original_device_busy", "bound_by")]
    assert keys == ["device_busy", "original_device_busy", "bound_by"]
    assert s["device_busy"] == pytest.approx(busy) and s["bound_by"] == bound_by(busy)
    assert s["verdict"] == verdict and s["timing"]["basis"] == basis
    df = read_csv(out / "results.csv")
    row = df[(df["check"] == "replay_step_time_ratio") & (df["metric"] == "ratio")].iloc[0]
    assert row["status"] == verdict and f"judged on the {basis}" in row["detail"]
    busy_row = df[df["check"] == "replay_device_busy"].iloc[0]
    assert busy_row["status"] == "info" and busy_row["value"] == pytest.approx(busy)


def test_a_cpu_replay_is_host_bound_and_keeps_its_wall_time_verdict(trace_dir, tmp_path, cli_run, monkeypatch):
    from mystique.replay import fidelity
    from mystique.results import read_csv

    def fake_rounds(a, b, **kw):
        a()
        b()
        p = _rounds(1.0, 1.0)
        p.clock = "wall"
        return p

    monkeypatch.setattr(fidelity, "paired_rounds", fake_rounds)
    out = tmp_path / "r"
    cli_run("-q", "replay", str(trace_dir), "-o", str(out), "--iters", "2", "--warmup", "0",
            "--original", "user_steps:tiny_mlp")
    s = json.loads((out / "summary.json").read_text())
    assert (s["device_busy"], s["bound_by"], s["timing"]["basis"], s["verdict"]) == (None, "host", HOST_TIMELINE,
                                                                                       "pass")
    row = read_csv(out / "results.csv").query("check == 'replay_device_busy'").iloc[0]
    assert row["status"] == "info" and "n/a" in row["detail"]


def test_thresholds_are_stated_in_the_module_doc():
    assert "0.8" in boundness.__doc__ and "0.5" in boundness.__doc__


def test_the_report_shows_the_busy_fraction_and_what_bounds_the_step(trace_dir, tmp_path, cli_run, monkeypatch):
    from mystique.replay import fidelity, run

    def fake_rounds(a, b, **kw):
        a()
        b()
        return _rounds(0.73, 1.0)

    monkeypatch.setattr(fidelity, "paired_rounds", fake_rounds)
    monkeypatch.setattr(run, "measure_bound", lambda *a, **k: Bound.judge(0.15, 0.18, "synthetic"))
    out = tmp_path / "r"
    cli_run("-q", "replay", str(trace_dir), "-o", str(out), "--iters", "2", "--warmup", "0",
            "--original", "user_steps:tiny_mlp")
    html = tmp_path / "report.html"
    code, _, _ = cli_run("report", str(out / "results.csv"), "-o", str(html))
    text = html.read_text()
    assert code == 0 and "device busy" in text and "host (judged on host timeline)" in text
    assert "judged on the host timeline (host-bound step)" in text


def test_the_replay_path_is_the_compiled_iteration_in_every_process_and_is_recorded(trace_dir, tmp_path, cli_run,
                                                                                   monkeypatch):
    """Two executors of one plan (two processes alike) take the same path: every whole iteration after the
    probe is compiled; summary.json's timing says so, and a step forced onto the per-op loop says that."""
    from mystique.replay import fidelity
    from mystique.replay.plan import plan_from_path
    from mystique.replay.runtime import Executor

    plan, _ = plan_from_path(trace_dir, None, ())
    counts = []
    for _ in range(2):
        e = Executor(plan.data, "cpu", seed=0)
        e.probe()
        e.time_iterations(3, 1)
        counts.append(dict(e.path_counts))
    assert counts[0] == counts[1] == {"compiled": 4, "per_op": 0}
    slow = Executor(plan.data, "cpu", seed=0)
    slow.fast = False
    slow.probe()
    slow.time_iterations(2, 0)
    assert slow.path_counts == {"compiled": 0, "per_op": 2}

    def fake_rounds(a, b, **kw):
        a()
        b()
        return _rounds(1.0, 1.0)

    monkeypatch.setattr(fidelity, "paired_rounds", fake_rounds)
    out = tmp_path / "r"
    cli_run("-q", "replay", str(trace_dir), "-o", str(out), "--iters", "2", "--warmup", "0",
            "--original", "user_steps:tiny_mlp")
    t = json.loads((out / "summary.json").read_text())["timing"]
    assert t["replay_path"]["compiled"] >= 1 and t["replay_path"]["per_op"] == 0
    assert t["cpu_affinity"] is None or t["cpu_affinity"] >= 1
