"""Adaptive stop of a timing verdict: add rounds until its interval decides, looking only at a few
pre-declared checkpoints, each at a Bonferroni-adjusted level (no torch).

A timing verdict is read from a 95% interval of a statistic (a median paired ratio, a ratio of
sums) against a limit: ``fail`` when the interval lies entirely above it, ``pass`` when it lies at
or below it, ``inconclusive`` when it straddles it. Running a fixed number of rounds wastes time on
a clear case and leaves a marginal one undecided; stopping as soon as a 95% interval decides
("optional stopping", a look after every round) inflates the error rate: each look is another
chance for a 2.5% tail to lie past the limit, and over unboundedly many looks the interval of a
statistic whose true value sits on the limit crosses it with probability tending to one (the law of
the iterated logarithm).

The rule here (:class:`Looks`) fixes the looks before any round is timed:

* ``K`` looks (``looks``, 4 by default) at the checkpoints ``n_j = first x 2^j`` rounds,
  ``j = 0..K-1`` (doubling: a clear case stops at ``first`` rounds, a marginal one gets up to
  ``2^(K-1)`` times as many), and a time cap: a look at the cap replaces the next checkpoint, so no
  series is ever looked at more than ``K`` times;
* every look computes each statistic's interval at the level ``1 - alpha/K`` (``alpha = 1 - 0.95``;
  98.75% for ``K = 4``), two-sided with equal tails;
* the rounds stop at the first look where every statistic is decided, and at the last checkpoint or
  the time cap; a statistic still straddling its limit there is ``inconclusive`` (undecided).

Derivation (the union bound). A statistic's verdict is wrong only if, at the look where the rounds
stopped, its interval missed the true value on the side of the limit: a ``fail`` needs
``lo > limit >= true value``, a ``pass`` needs ``hi <= limit < true value``. Let ``E_j`` be the event
that the interval at look ``j`` misses the true value below (``lo_j > true``); each interval covers
at level ``1 - alpha/K`` with equal tails, so ``P(E_j) <= alpha/(2K)`` whatever the looks before it
showed, and ``P(false fail) <= P(E_1 or ... or E_K) <= sum_j P(E_j) <= K x alpha/(2K) = alpha/2``:
the 2.5% of one fixed-size 95% interval, however the looks are correlated and whichever look the
rule stops at (stopping only removes later looks from the union). The same holds for a false pass.
The price: each look's interval is wider than a 95% one (the normal quantile 2.50 instead of 1.96
for ``K = 4``: 28% wider, about 1.6 times the rounds for the same width), paid only by the cases
that need the later looks. The bound is as good as the per-look interval's coverage: exact (and
conservative) for the distribution-free median interval, approximate for a bootstrap one, which
cannot know of an event its rounds have not seen yet (a stall rarer than a look's rounds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

LEVEL = 0.95
LOOKS = 4

#: a statistic's interval at a given level, from the rounds so far
Interval = Callable[[float], tuple[float, float]]


def above_limit_verdict(lo: float, hi: float, limit: float) -> str:
    """``fail`` when ``[lo, hi]`` lies wholly above ``limit``, ``pass`` when at or below it,
    ``inconclusive`` when it straddles it (or is undefined)."""
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(limit)):
        return "inconclusive"
    if lo > limit:
        return "fail"
    if hi <= limit:
        return "pass"
    return "inconclusive"


@dataclass(frozen=True)
class Looks:
    """The pre-declared looks: ``looks`` checkpoints at ``first x 2^j`` rounds and a time cap; or, with
    ``by_time``, at ``time_cap_s / 2^(looks-1-j)`` seconds (the first round past each), for rounds whose
    pace is not known in advance (no round cap then: the last look is at the time cap). The union bound
    holds for any ``looks`` looks; a look at a time rather than a count is at a round count that the
    rounds' durations chose, which are nearly independent of the ratio a round measures."""

    first: int
    time_cap_s: float
    looks: int = LOOKS
    level: float = LEVEL
    by_time: bool = False
    min_rounds: int = 0

    def __post_init__(self) -> None:
        if self.first < 1 or self.looks < 1 or not 0.0 < self.level < 1.0 or not self.time_cap_s > 0:
            raise ValueError(f"bad looks: first={self.first}, looks={self.looks}, level={self.level}, "
                             f"time_cap_s={self.time_cap_s}")

    @property
    def look_level(self) -> float:
        """The level of each look's interval: ``1 - (1 - level) / looks`` (Bonferroni over the looks)."""
        return 1.0 - (1.0 - self.level) / self.looks

    @property
    def min_decisive(self) -> int:
        """The fewest rounds whose median interval has the look level: the extremes of ``n`` values bound
        the median with ``alpha/(2K)`` on each side only once ``0.5^n <= alpha/(2K)`` (8 rounds at 98.75%).
        A look with fewer rounds decides nothing (its verdicts are inconclusive) and the time cap waits
        for them: a single round's "interval" is a point, not a 95% statement. ``min_rounds`` raises it
        for a statistic that needs more (a bootstrap of a handful of heavy-tailed rounds undercovers)."""
        return max(1, self.min_rounds, math.ceil(math.log2(2.0 / (1.0 - self.look_level)) - 1e-12))

    @property
    def checkpoints(self) -> tuple[int, ...]:
        """The rounds of the looks (none ``by_time``)."""
        return () if self.by_time else tuple(self.first * 2**j for j in range(self.looks))

    @property
    def times(self) -> tuple[float, ...]:
        """The seconds of the looks ``by_time`` (the last is the time cap)."""
        return tuple(self.time_cap_s / 2 ** (self.looks - 1 - j) for j in range(self.looks)) if self.by_time else ()

    @property
    def max_rounds(self) -> int | float:
        return math.inf if self.by_time else self.checkpoints[-1]

    def describe(self) -> str:
        if self.by_time:
            at = ", ".join(f"{t:g}" for t in self.times) + " s"
        else:
            at = ", ".join(str(c) for c in self.checkpoints) + f" rounds or the {self.time_cap_s:g} s cap"
        return (f"adaptive stop: looks at {at}, each at "
                f"{self.look_level:.2%} (Bonferroni over {self.looks} looks: {self.level:.0%} overall)")


@dataclass(frozen=True)
class Look:
    """One look: the rounds and seconds so far, each statistic's interval and verdict."""

    rounds: int
    seconds: float
    intervals: Mapping[str, tuple[float, float]]
    verdicts: Mapping[str, str]

    @property
    def decided(self) -> bool:
        return all(v in ("pass", "fail") for v in self.verdicts.values())


@dataclass
class Stopper:
    """Watches a growing series of rounds and says when to stop (:class:`Looks`' rule).

    ``statistics`` maps a name to ``(interval, limit)``: ``interval(level)`` computes that statistic's
    interval from the rounds so far (the caller's series). Call :meth:`after_round` after every round
    with the rounds and seconds so far; it looks only at a checkpoint or at the time cap, and returns
    why to stop (``decided``, ``round cap``, ``time cap``) or None. :attr:`final` is the last look.
    ``stop_on_fail``: one ``fail`` decides too (the others may stay inconclusive): where any failed
    statistic fails the whole item, the rest cannot change its verdict. ``late_pass``: statistics whose
    ``pass`` does not stop the rounds (only a ``fail`` does, or the last look): a mean that rare events
    move, whose interval cannot know of an event its rounds have not seen yet, so an early look's pass
    may only mean none has happened so far (a fail has seen them: it stops)."""

    plan: Looks
    statistics: Mapping[str, tuple[Interval, float]]
    stop_on_fail: bool = False
    late_pass: frozenset[str] = frozenset()
    #: a statistic that needs more rounds than the plan's ``min_decisive`` to decide (a bootstrap of a
    #: handful of heavy-tailed rounds undercovers; the median's order-statistic interval does not)
    min_rounds: Mapping[str, int] = field(default_factory=dict)
    history: list[Look] = field(default_factory=list)
    stop: str = ""

    def _needs(self, name: str) -> int:
        return max(self.plan.min_decisive, self.min_rounds.get(name, 0))

    def look(self, rounds: int, seconds: float) -> Look:
        level = self.plan.look_level
        intervals, verdicts = {}, {}
        for name, (interval, limit) in self.statistics.items():
            lo, hi = interval(level)
            intervals[name] = (lo, hi)
            verdicts[name] = above_limit_verdict(lo, hi, limit) if rounds >= self._needs(name) else "inconclusive"
        got = Look(rounds, seconds, intervals, verdicts)
        self.history.append(got)
        return got

    def after_round(self, rounds: int, seconds: float) -> str | None:
        needs = max([self.plan.min_decisive, *(self._needs(n) for n in self.statistics)])
        if self.plan.by_time:  # a look due by time waits for the rounds every statistic needs
            due = [t for t in self.plan.times if t <= seconds]
            at_checkpoint = len(due) > len(self.history) and rounds >= needs
        else:
            at_checkpoint = rounds in self.plan.checkpoints
        at_cap = seconds >= self.plan.time_cap_s and (rounds >= min(needs, self.plan.max_rounds)
                                                      or (self.plan.by_time and seconds >= 2 * self.plan.time_cap_s))
        if not (at_checkpoint or at_cap):
            return None
        got = self.look(rounds, seconds)
        settled = all(v == "fail" or (v == "pass" and k not in self.late_pass) for k, v in got.verdicts.items())
        if settled or (self.stop_on_fail and "fail" in got.verdicts.values()):
            self.stop = "decided"
        elif got.decided:  # a late pass at the cap or the last checkpoint
            self.stop = "decided" if rounds >= self.plan.max_rounds or at_cap else ""
        elif rounds >= self.plan.max_rounds:
            self.stop = "round cap"
        elif at_cap:
            self.stop = "time cap"
        return self.stop or None

    @property
    def final(self) -> Look:
        if not self.history:
            raise RuntimeError("no look was taken")
        return self.history[-1]

    def describe(self) -> str:
        """How the rounds stopped, for a row's detail."""
        f = self.final
        why = {"decided": "decided", "round cap": "the round cap, undecided",
               "time cap": "the time cap, undecided"}.get(self.stop, self.stop or "not stopped")
        return (f"stopped at look {len(self.history)} of at most {self.plan.looks} ({why}) after {f.rounds} rounds "
                f"in {f.seconds:.1f} s; {self.plan.describe()}")


def run(step: Callable[[], None], stopper: Stopper, clock: Callable[[], float]) -> Stopper:
    """Call ``step()`` (one round; the caller keeps the series the statistics read) until ``stopper`` says
    stop; ``clock`` is the seconds clock the time cap is read on. Returns ``stopper``."""
    t0 = clock()
    rounds = 0
    while True:
        step()
        rounds += 1
        if stopper.after_round(rounds, clock() - t0):
            return stopper
