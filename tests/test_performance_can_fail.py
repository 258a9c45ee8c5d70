"""Performance checks driven to their bad verdict from injected readings, written through real
``Results`` so the session's recorder sees them (issue #30: every check can fail; the registry is
tests/check_reproducers.py). Timing on this host decides nothing here: every series is given."""

from __future__ import annotations

import pandas as pd
import pytest
from mystique.validators.performance import campaign as perf_campaign
from mystique.validators.performance import sustained
from mystique.validators.performance._ctx import Measured, PerformanceContext
from mystique.validators.performance.compare import run_fleet
from mystique.validators.performance.fleet import COMPARED
from mystique.validators.performance.timed import Calls

from mystique import results
from mystique.progress import Progress
from mystique.targets import Target

SUBJECT = "dlrm/small/infer"
MODEL = "Model X"


def _ctx(**options) -> PerformanceContext:
    res = results.Results(results.RunContext(device="cpu", device_name=MODEL), "performance")
    return PerformanceContext(Target("cpu"), res, 0, "quick", Progress("performance", stream=None), options,
                              settings={"drift_tolerance": 0.1}, device_name=MODEL)


def _rows(ctx: PerformanceContext, check: str) -> list[dict]:
    return [r for r in ctx.res.rows if r["check"] == check and r["status"] != "info"]


def test_throughput_drift_fails_when_the_last_third_of_a_long_run_is_much_slower():
    """600 steps over 100 s whose last third takes 1.8x the first (a device capping its clocks)."""
    ctx = _ctx()
    times = [1e-3] * 200 + [1.4e-3] * 200 + [1.8e-3] * 200
    sustained._drift_row(ctx, SUBJECT, times, 100.0)
    row, = _rows(ctx, "throughput_drift")
    assert row["status"] == "fail" and row["low"] > row["threshold"]


class _Sampler:
    source, static, failure, available = "sysfs scaling_cur_freq", "", "", True


def test_clock_drop_fails_when_the_clock_falls_a_quarter_during_the_run():
    ctx = _ctx()
    clocks = [2000.0] * 9 + [1800.0] * 9 + [1500.0] * 9
    sustained._clock_rows(ctx, SUBJECT, _Sampler(), [(0.25 * i, {"cpu_mhz": v}) for i, v in enumerate(clocks)])
    row, = _rows(ctx, "clock_drop")
    assert row["status"] == "fail" and row["value"] == pytest.approx(0.75)


def test_host_contention_is_inconclusive_when_no_step_ran_undisturbed():
    """A host busy through the whole run leaves no undisturbed step: the figures cannot be compared.
    (The check's bad outcome is ``inconclusive``, never ``fail``: a busy host is not the device's fault;
    tests/check_reproducers.py FAILS_AS says so.)"""
    ctx = _ctx()
    calls = Calls(seconds=[1e-3] * 50, waited=[1e-3] * 50, starts=[i * 1e-3 for i in range(50)], source="scripted",
                  min_undisturbed=30)
    sustained.contention_row(ctx, SUBJECT, calls)
    row, = _rows(ctx, "host_contention")
    assert row["status"] == "inconclusive" and row["value"] == 0


def _peer_file(tmp_path, i: int, figures: dict[tuple[str, str], float]) -> str:
    ctx = results.RunContext(device="cpu", device_name=MODEL, torch_version="t", host=f"peer{i}")
    res = results.Results(ctx, "performance")
    for (check, metric), value in figures.items():
        res.add(check, SUBJECT, metric, value, status="info", dtype="float32", low=value * 0.99, high=value * 1.01)
    path = tmp_path / f"peer{i}.csv"
    results.write_csv(res.frame(), path)
    return str(path)


def test_every_fleet_figure_fails_on_a_device_twice_as_slow_as_its_peers(tmp_path):
    """Ten peers measured 100 (throughputs) or 10 ms (times) each within 1%; this device half as fast on
    every compared figure, with a tight interval: each ``fleet_<check>`` row fails."""
    typical = {key: (100.0 if higher else 10.0) for key, higher in COMPARED.items()}
    peers = [_peer_file(tmp_path, i, {k: v * (1 + 0.002 * (i - 5)) for k, v in typical.items()})
             for i in range(10)]
    ctx = _ctx(baseline=peers)
    for (check, metric), higher in COMPARED.items():
        value = typical[(check, metric)] * (0.5 if higher else 2.0)
        ctx.measured[(check, SUBJECT, "float32", metric)] = Measured(value, value * 0.99, value * 1.01, higher)
    run_fleet(ctx)
    verdicts = {(r["check"], r["metric"]): r["status"] for r in ctx.res.rows if r["check"].startswith("fleet_")
                and r["check"] != "fleet_peers"}
    assert verdicts == {(f"fleet_{c}", f"{m}_slowdown"): "fail" for c, m in COMPARED}


def _run_frame(median_ms: float) -> pd.DataFrame:
    res = results.Results(results.RunContext(device="cpu", device_name=MODEL), "performance")
    res.add("step_time", SUBJECT, "median_ms", median_ms, status="info", dtype="float32", low=median_ms * 0.995,
            high=median_ms * 1.005)
    return res.frame()


def test_campaign_flagged_fails_when_the_fault_goes_unseen_and_a_healthy_run_is_flagged():
    """Ten healthy runs at 10 ms (one of them at 20 ms) and ten 'throttled' runs no slower than the
    healthy ones: a healthy run is flagged and no faulty one is, so both campaign rows fail."""
    healthy = [_run_frame(10.0 * (1 + 0.001 * i)) for i in range(9)] + [_run_frame(20.0)]
    faulty = [_run_frame(10.0 * (1 + 0.001 * i)) for i in range(10)]
    df = perf_campaign._rows(Target("cpu"), {"healthy": healthy, "faulty": faulty}, "throttle", 0.05, 4.0, "dlrm",
                             0.5, 2.0, "at-once")
    flagged = df[df["check"] == "campaign_flagged"].set_index("subject")
    healthy_row, throttle_row = flagged.loc["healthy (10 runs)"], flagged.loc["throttle (10 runs)"]
    assert healthy_row["status"] == "fail" and healthy_row["value"] >= 1
    assert throttle_row["status"] == "fail" and throttle_row["value"] == 0


def test_mode_slowdowns_fail_when_the_injected_mode_doubles_every_step(monkeypatch):
    """Paired rounds (scripted) in which the device under its mode takes twice the reference's time:
    the median ratio and the summed-time ratio both lie above 1 + margin with confidence."""
    from mystique.validators.performance import paired
    from test_replay_can_fail import scripted_rounds

    monkeypatch.setattr(paired, "paired_rounds", scripted_rounds(2.0))
    ctx = _ctx()
    ctx.target = Target("cpu", lambda: None, "slow_mode")
    ctx.settings["mode_margin"] = 0.05
    paired.run_paired(ctx, SUBJECT, None, 1.0)
    verdicts = {r["check"]: r["status"] for r in _rows(ctx, "mode_slowdown") + _rows(ctx, "mode_mean_slowdown")}
    assert verdicts == {"mode_slowdown": "fail", "mode_mean_slowdown": "fail"}
