"""The quick qualification's performance item (issue #33, :mod:`mystique.validators.performance.mode`):
a throttled or straggling device fails quick qualification; a healthy one's item is a skip and a figure.
The routing and the healthy figure run on a fake executor and the fake clock; the throttled device
in-process under ``throttle:factor=3`` (a 3x slowdown of every operator's CPU time: the paired ratio,
about 1.9, lies far above 1.05 whatever the host's speed); qualify end to end is ``-m slow``."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest
from mystique.validators import performance as perf
from mystique.validators import pytest_plugin
from mystique.validators.performance import mode as mode_group
from mystique.validators.performance import paired

from mystique.targets import make_target

STEP_S = 0.1


class _FakeExecutor:
    """An executor whose step takes ``STEP_S`` on the fake clock."""

    clock = None

    def __init__(self, plan, device, seed=0):
        pass

    def probe(self) -> None:
        pass

    def run_iteration(self) -> None:
        _FakeExecutor.clock.advance(STEP_S)


@pytest.fixture
def fake_step(monkeypatch, fake_clock):
    _FakeExecutor.clock = fake_clock
    bench = SimpleNamespace(plan=None, subject="dlrm/small/infer")
    monkeypatch.setattr(mode_group.bm, "reference", lambda *a, **k: bench)
    monkeypatch.setattr(mode_group.ex, "Executor", _FakeExecutor)
    return fake_clock


def test_qualification_runs_the_performance_mode_item_at_both_levels_and_validate_keeps_its_groups():
    assert "performance" in pytest_plugin.DEFAULT_VALIDATORS
    assert perf.qualification_groups("quick") == perf.qualification_groups("full") == ["mode"]
    assert perf.groups("quick") == ["micro", "sustained", "fleet"] and "mode" in perf.GROUPS
    assert perf.LEVELS["quick"]["mode_budget_s"] <= 5.0  # a few seconds: quick qualification stays quick


def test_a_healthy_devices_quick_item_skips_the_pair_and_measures_the_step(fake_step):
    df = perf.run(make_target("cpu"), level="quick", groups=["mode"])
    skip = df[df["check"] == "mode_slowdown"].iloc[0]
    assert skip["status"] == "skip" and "nothing injected" in skip["detail"]
    step = df[df["check"] == "mode_step_time"].iloc[0]
    assert step["status"] == "info" and step["value"] == pytest.approx(STEP_S * 1e3)
    # a budget of 4 s, a quarter of it stepping at 0.1 s a step: 10 steps, at least the median's 6
    assert "median of 10 steps" in step["detail"] and step["low"] <= step["value"] <= step["high"]
    assert set(df["status"]) == {"skip", "info"}  # the plugin reports the item skipped, never failed


def test_an_injected_mode_three_times_slower_fails_the_quick_item_on_mode_slowdown(fake_step, monkeypatch):
    from test_replay_can_fail import scripted_rounds

    monkeypatch.setattr(paired, "paired_rounds", scripted_rounds(3.0))
    df = perf.run(make_target("cpu", "throttle:factor=3"), level="quick", groups=["mode"])
    verdicts = dict(zip(df["check"], df["status"]))
    assert verdicts == {"mode_slowdown": "fail", "mode_mean_slowdown": "fail"}
    assert df[df["check"] == "mode_slowdown"].iloc[0]["low"] > 1.05


@pytest.mark.slow  # real rounds on this host's clock (a busy core leaves too few to decide); the logic: above
def test_a_device_throttled_3x_fails_the_quick_performance_item_in_process():
    """The real item: the dlrm step under ``throttle:factor=3`` paired with the device without it."""
    df = perf.run(make_target("cpu", "throttle:factor=3"), level="quick", groups=perf.qualification_groups("quick"))
    row = df[df["check"] == "mode_slowdown"].iloc[0]
    assert row["status"] == "fail", row["detail"]
    assert row["low"] > row["threshold"] == pytest.approx(1.05)


@pytest.mark.slow
def test_quick_qualification_under_throttle_fails_on_mode_slowdown(tmp_path):
    out = tmp_path / "q"
    env = {**os.environ, "MYSTIQUE_QUIET": "1"}
    done = subprocess.run([sys.executable, "-m", "mystique", "qualify", "--level", "quick", "-o", str(out),
                           "--inject", "throttle:factor=3"], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    bad = df[(df["suite"] == "performance") & (df["status"] == "fail")]
    assert "mode_slowdown" in set(bad["check"]), df[df["suite"] == "performance"].to_string()


def test_the_paired_rounds_run_their_whole_budget_so_stalls_can_accumulate(fake_step, monkeypatch):
    """A straggler stalls about once a second of operator time: the mean's interval narrows only as stalls
    accumulate, so the rounds never stop early on a narrow median interval."""
    from test_replay_can_fail import scripted_rounds

    seen = {}
    rounds = scripted_rounds(1.0)

    def spy(a, b, **kwargs):
        seen.update(kwargs)
        return rounds(a, b, **kwargs)

    monkeypatch.setattr(paired, "paired_rounds", spy)
    perf.run(make_target("cpu", "straggler"), level="quick", groups=["mode"])
    assert seen["half_width"] == paired.RUN_WHOLE_BUDGET and seen["half_width"] < 1e-9
    assert seen["time_cap_s"] == pytest.approx(float(perf.LEVELS["quick"]["mode_budget_s"]))
