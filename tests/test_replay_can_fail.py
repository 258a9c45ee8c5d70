"""Replay checks driven to ``fail`` from injected timings (issue #30: every check can fail; the
registry is tests/check_reproducers.py). The paired rounds are scripted: this host's speed decides nothing."""

from __future__ import annotations

from mystique import timing
from mystique.replay.overhead import dispatch_overhead


def scripted_rounds(ratio: float, rounds: int = 24):
    """A ``timing.paired_rounds`` whose side a takes ``ratio`` times side b in every round (1% jitter)."""
    def paired_rounds(a, b, **kwargs):
        b_ms = [1.0 + 0.01 * (i % 3) for i in range(rounds)]
        a_ms = [ratio * x for x in b_ms]
        return timing.Paired(a_ms=a_ms, b_ms=b_ms, a_wall_ms=a_ms, b_wall_ms=b_ms, warmup_rounds=2,
                             warmup_settled=True, stop="half-width")
    return paired_rounds


def test_dispatch_overhead_ratio_fails_when_the_replay_takes_twice_the_eager_time(monkeypatch):
    monkeypatch.setattr(timing, "paired_rounds", scripted_rounds(2.0))
    df, _stats = dispatch_overhead("cpu", n_ops=8, steps=("add",), time_cap_s=0.05, half_width=0.5)
    row = df[(df["check"] == "dispatch_overhead_ratio") & (df["metric"] == "ratio")].iloc[0]
    assert row["status"] == "fail" and row["low"] > row["threshold"] == 1.0
