"""The adaptive stop of timing verdicts (:mod:`mystique.stopping`, issues #31, #32, #33): rounds run until the
interval decides, looked at only at pre-declared doubling checkpoints with Bonferroni-adjusted intervals.
Synthetic series on a fake clock: no test here depends on this host's speed."""

from __future__ import annotations

import random

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique import stopping
from mystique.stopping import Looks, Stopper, above_limit_verdict
from mystique.timing import median_interval

LIMIT = 1.05


def _median_stopper(ratios: list[float], looks: Looks, limit: float = LIMIT) -> Stopper:
    return Stopper(looks, {"ratio": (lambda level: median_interval(ratios, level), limit)})


def _run(draw, looks: Looks, clock, round_s: float = 0.01, limit: float = LIMIT) -> tuple[Stopper, list[float]]:
    """Rounds drawing ratios from ``draw()``, each taking ``round_s`` on the fake clock, until the stopper stops."""
    ratios: list[float] = []
    s = _median_stopper(ratios, looks, limit)

    def step() -> None:
        ratios.append(draw())
        clock.advance(round_s)

    return stopping.run(step, s, clock), ratios


def test_the_looks_are_doubling_checkpoints_at_a_bonferroni_level():
    looks = Looks(first=12, time_cap_s=4.0)
    assert looks.checkpoints == (12, 24, 48, 96) and looks.max_rounds == 96
    assert looks.look_level == pytest.approx(0.9875)  # 1 - 0.05 / 4
    assert "98.75%" in looks.describe() and "12, 24, 48, 96" in looks.describe()
    with pytest.raises(ValueError):
        Looks(first=0, time_cap_s=1.0)


@pytest.mark.parametrize("lo, hi, verdict", [(1.06, 1.2, "fail"), (0.9, 1.05, "pass"), (1.0, 1.06, "inconclusive"),
                                             (float("nan"), 1.0, "inconclusive")])
def test_a_verdict_is_read_from_the_interval_against_the_limit(lo, hi, verdict):
    assert above_limit_verdict(lo, hi, LIMIT) == verdict


def test_a_clear_slowdown_stops_failed_at_the_first_checkpoint(fake_clock):
    rng = random.Random(1)
    s, ratios = _run(lambda: 1.5 * (1 + 0.02 * rng.gauss(0, 1)), Looks(first=12, time_cap_s=10.0), fake_clock)
    assert s.stop == "decided" and len(s.history) == 1 and len(ratios) == 12
    assert s.final.verdicts == {"ratio": "fail"} and s.final.intervals["ratio"][0] > LIMIT
    assert "look 1 of at most 4" in s.describe()


def test_a_null_case_stops_passed_at_the_first_checkpoint(fake_clock):
    rng = random.Random(2)
    s, ratios = _run(lambda: 1.0 + 0.02 * rng.gauss(0, 1), Looks(first=12, time_cap_s=10.0), fake_clock)
    assert s.stop == "decided" and s.final.verdicts == {"ratio": "pass"} and len(ratios) == 12


def test_a_marginal_case_runs_to_the_round_cap_and_stays_undecided(fake_clock):
    rng = random.Random(3)
    s, ratios = _run(lambda: LIMIT + 0.02 * rng.gauss(0, 1), Looks(first=12, time_cap_s=100.0), fake_clock)
    assert s.stop == "round cap" and len(ratios) == 96 and [h.rounds for h in s.history] == [12, 24, 48, 96]
    assert s.final.verdicts == {"ratio": "inconclusive"} and "undecided" in s.describe()


def test_the_time_cap_takes_the_place_of_the_next_look(fake_clock):
    """Rounds of 0.1 s under a 3 s cap: looks at 12 and 24 rounds, then the cap at 30 (never a 5th look)."""
    rng = random.Random(4)
    s, ratios = _run(lambda: LIMIT + 0.02 * rng.gauss(0, 1), Looks(first=12, time_cap_s=3.0), fake_clock, 0.1)
    assert s.stop == "time cap" and [h.rounds for h in s.history] == [12, 24, 30] and len(ratios) == 30
    assert len(s.history) <= s.plan.looks


def test_a_slow_clear_case_decides_at_the_time_cap_before_the_first_checkpoint(fake_clock):
    s, ratios = _run(lambda: 2.0, Looks(first=12, time_cap_s=0.5), fake_clock, 0.1)
    assert s.stop == "decided" and len(ratios) == 8 and s.final.verdicts == {"ratio": "fail"}  # min_decisive


def test_a_look_with_too_few_rounds_for_its_level_decides_nothing(fake_clock):
    """One round's interval is a point: with first=1 the looks at 1, 2 and 4 rounds stay inconclusive."""
    looks = Looks(first=1, time_cap_s=1e9)
    assert looks.min_decisive == 8  # 0.5^8 <= 0.0125/2 < 0.5^7
    s, ratios = _run(lambda: 2.0, looks, fake_clock)
    assert [h.rounds for h in s.history] == [1, 2, 4, 8] and [h.verdicts["ratio"] for h in s.history] == [
        "inconclusive", "inconclusive", "inconclusive", "fail"] and s.stop == "decided"


def test_every_statistic_must_decide_unless_one_fails_and_failing_is_enough(fake_clock):
    ratios: list[float] = []
    straddles = (lambda level: (1.0, 1.1), LIMIT)
    fails = (lambda level: (1.2, 1.3), LIMIT)
    s = Stopper(Looks(first=8, time_cap_s=10.0, looks=2), {"a": straddles, "b": fails})
    assert s.after_round(8, 0.1) is None and s.after_round(16, 0.2) == "round cap"
    s = Stopper(Looks(first=8, time_cap_s=10.0, looks=2), {"a": straddles, "b": fails}, stop_on_fail=True)
    assert s.after_round(8, 0.1) == "decided" and s.final.verdicts == {"a": "inconclusive", "b": "fail"}
    assert not ratios


NULL_SERIES = 600


@examples(1)
@given(seed=st.integers(0, 2**31))
def test_the_false_failure_rate_of_the_rule_stays_at_its_nominal_level(seed):
    """Series whose true median ratio sits exactly on the limit (the worst case for a false failure): the
    rule fails at most alpha/2 = 2.5% of them (binomial 3-sigma slack), where a look after every round at
    95% fails many more (the inflation the rule exists to avoid)."""
    rng = random.Random(seed)
    looks = Looks(first=12, time_cap_s=1e9)
    fails = peeking_fails = 0
    for _ in range(NULL_SERIES):
        xs = [LIMIT * rng.lognormvariate(0.0, 0.03) for _ in range(looks.max_rounds)]
        s = _median_stopper([], looks)
        seen: list[float] = []
        s.statistics = {"ratio": (lambda level, seen=seen: median_interval(seen, level), LIMIT)}
        for n, x in enumerate(xs, start=1):
            seen.append(x)
            if s.after_round(n, 0.0):
                break
        fails += s.final.verdicts["ratio"] == "fail"
        # optional stopping: a 95% look after every round from the 12th, stopping at the first failure
        peeking_fails += any(median_interval(xs[:n], 0.95)[0] > LIMIT for n in range(12, looks.max_rounds + 1))
    nominal = 0.025
    slack = 3 * (nominal * (1 - nominal) / NULL_SERIES) ** 0.5
    assert fails / NULL_SERIES <= nominal + slack, fails
    assert peeking_fails / NULL_SERIES > nominal + slack, peeking_fails  # the rule is what keeps it nominal


def test_a_late_pass_statistic_stops_the_rounds_only_by_failing_or_at_the_last_look():
    """A mean that rare events move: its early pass may only mean no event has come yet."""
    calm = (lambda level: (0.98, 1.01), LIMIT)
    s = Stopper(Looks(first=8, time_cap_s=10.0, looks=3), {"mean": calm}, late_pass=frozenset({"mean"}))
    assert s.after_round(8, 1.0) is None and s.after_round(16, 2.0) is None
    assert s.after_round(32, 3.0) == "decided" and s.final.verdicts == {"mean": "pass"}
    s = Stopper(Looks(first=8, time_cap_s=2.0, looks=3), {"mean": calm}, late_pass=frozenset({"mean"}))
    assert s.after_round(8, 1.0) is None and s.after_round(9, 2.5) == "decided"  # the time cap is the last look
    s = Stopper(Looks(first=8, time_cap_s=10.0, looks=3), {"mean": ((lambda level: (1.2, 1.5)), LIMIT)},
                late_pass=frozenset({"mean"}))
    assert s.after_round(8, 1.0) == "decided" and s.final.verdicts == {"mean": "fail"}


def test_looks_by_time_come_at_a_quarter_half_and_all_of_the_cap(fake_clock):
    """Rounds of unknown pace (0.1 s here): looks at the first round past 1.5, 3 and 6 s; no round cap."""
    looks = Looks(first=12, time_cap_s=6.0, looks=3, by_time=True)
    assert looks.times == (1.5, 3.0, 6.0) and looks.checkpoints == () and "looks at 1.5, 3, 6 s" in looks.describe()
    rng = random.Random(5)
    s, ratios = _run(lambda: LIMIT + 0.02 * rng.gauss(0, 1), looks, fake_clock, 0.1)
    assert [h.rounds for h in s.history] == [15, 30, 60] and s.stop == "time cap"
    s, ratios = _run(lambda: 1.5, looks, fake_clock, 0.1)
    assert s.stop == "decided" and len(ratios) == 15
