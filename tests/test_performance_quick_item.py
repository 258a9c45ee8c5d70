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
    # a few seconds: quick qualification stays quick (the cap: a clear case stops at a quarter of it)
    assert perf.LEVELS["quick"]["mode_budget_s"] <= 6.0


def test_a_healthy_devices_quick_item_skips_the_pair_and_measures_the_step(fake_step):
    df = perf.run(make_target("cpu"), level="quick", groups=["mode"])
    skip = df[df["check"] == "mode_slowdown"].iloc[0]
    assert skip["status"] == "skip" and "nothing injected" in skip["detail"]
    step = df[df["check"] == "mode_step_time"].iloc[0]
    assert step["status"] == "info" and step["value"] == pytest.approx(STEP_S * 1e3)
    # a budget of 6 s, a quarter of it stepping at 0.1 s a step: 15 steps, at least the median's 6
    assert "median of 15 steps" in step["detail"] and step["low"] <= step["value"] <= step["high"]
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


def _deciding_rounds(series, warmup_s: float = 0.05):
    """A ``timing.paired_rounds`` that feeds rounds ``series(i) -> (a_ms, b_ms)`` to its ``decide`` hook (0.1 s
    each on the hook's clock) until it says stop: the adaptive stop on a synthetic series."""
    from mystique import timing

    seen = {}

    def paired_rounds(a, b, *, decide, time_cap_s, **kwargs):
        seen.update(kwargs, time_cap_s=time_cap_s)
        out = timing.Paired(warmup_rounds=2, warmup_s=warmup_s, warmup_settled=True)
        for i in range(100_000):
            x, y = series(i)
            out.a_ms.append(x)
            out.b_ms.append(y)
            out.a_wall_ms.append(x)
            out.b_wall_ms.append(y)
            why = decide(out, 0.1 * (i + 1))
            if why:
                out.stop = why
                break
        out.seconds = warmup_s + 0.1 * out.rounds
        return out

    return paired_rounds, seen


def _jitter(i: int) -> float:
    return 1.0 + 0.01 * ((i * 7) % 5 - 2)


def test_a_straggler_is_caught_at_the_first_look_and_a_clean_mode_passes_only_at_the_cap(fake_step, monkeypatch):
    """Stalls every fifth round (ratio ~3 there), 0.1 s a round: the first look is due at a quarter of the
    6 s budget (15 rounds) and waits for the 24 rounds a look needs (paired.MIN_FIRST); there the median passes
    and the summed-time ratio fails. A mode that costs nothing passes
    the median early but the mean only at the budget's end (a stall it has not seen yet could still come)."""
    budget = float(perf.LEVELS["quick"]["mode_budget_s"])
    rounds, seen = _deciding_rounds(lambda i: ((3.0 if i % 5 == 1 else 1.0) * _jitter(i), _jitter(i + 1)), 10.0)
    monkeypatch.setattr(paired, "paired_rounds", rounds)
    df = perf.run(make_target("cpu", "straggler"), level="quick", groups=["mode"])
    v = dict(zip(df["check"], df["status"]))
    assert v == {"mode_slowdown": "pass", "mode_mean_slowdown": "fail"}, df["detail"].tolist()
    mean = df[df["check"] == "mode_mean_slowdown"].iloc[0]
    assert "after 24 rounds" in mean["detail"] and "look 1 of at most 3" in mean["detail"]
    assert "98.33% bootstrap interval" in mean["detail"] and mean["low"] > 1.05
    assert seen["half_width"] == paired.RUN_WHOLE_BUDGET and seen["time_cap_s"] == pytest.approx(budget)

    rounds, _ = _deciding_rounds(lambda i: (_jitter(i), _jitter(i + 1)), 10.0)
    monkeypatch.setattr(paired, "paired_rounds", rounds)
    df = perf.run(make_target("cpu", "straggler"), level="quick", groups=["mode"])
    assert set(df["status"]) == {"pass"}
    assert "after 60 rounds" in df.iloc[0]["detail"]  # the mean's pass waits for the last look: the cap


def test_a_slow_step_whose_budget_holds_eight_rounds_fails_on_the_median(fake_step, monkeypatch):
    """Found by the slow suite: a 3x throttled step held 8 rounds in its budget, every ratio near 3, and both
    rows were undecided because 24 rounds were asked of both. The median's order-statistic interval decides
    from 7 rounds at 98.33%; only the bootstrap of the summed times waits for 24 (it stays undecided)."""
    from mystique import timing

    budget = float(perf.LEVELS["quick"]["mode_budget_s"])
    step_s = budget / 8  # the rounds' own time cap ends them after 8 rounds

    def paired_rounds(a, b, *, decide, time_cap_s, **kwargs):
        out = timing.Paired(warmup_rounds=2, warmup_s=0.05, warmup_settled=True)
        i = 0
        while step_s * i < time_cap_s:
            x, y = 3.0 * _jitter(i), _jitter(i + 1)
            out.a_ms.append(x)
            out.b_ms.append(y)
            out.a_wall_ms.append(x)
            out.b_wall_ms.append(y)
            i += 1
            if decide(out, step_s * i):
                break
        out.stop = "time cap"
        out.seconds = 0.05 + step_s * out.rounds
        return out

    monkeypatch.setattr(paired, "paired_rounds", paired_rounds)
    df = perf.run(make_target("cpu", "throttle"), level="quick", groups=["mode"])
    v = dict(zip(df["check"], df["status"]))
    assert v == {"mode_slowdown": "fail", "mode_mean_slowdown": "inconclusive"}, df["detail"].tolist()
    assert "after 8 rounds" in df.iloc[0]["detail"]


def test_a_marginal_mode_runs_the_whole_budget_and_stays_undecided(fake_step, monkeypatch):
    rounds, _ = _deciding_rounds(lambda i: (1.05 * _jitter(i), _jitter(i + 1)), 10.0)
    monkeypatch.setattr(paired, "paired_rounds", rounds)
    df = perf.run(make_target("cpu", "throttle"), level="quick", groups=["mode"])
    assert set(df["status"]) == {"inconclusive"} and "after 60 rounds" in df.iloc[0]["detail"]
    assert "the time cap, undecided" in df.iloc[0]["detail"] and "looks at 1.5, 3, 6 s" in df.iloc[0]["detail"]


