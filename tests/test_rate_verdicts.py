"""Rates judged from their 95% Wilson interval (mystique.binomial), the soft-error rate rows built on
it, the flips a detection rate is judged on (sure to alarm by the check's bound, else significant) and
the full level's top-up that runs the trials a verdict needs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mystique.validators import soft_errors
from mystique.validators.groups import GroupContext
from mystique.validators.soft_errors.checks import common, detection_campaign
from mystique.validators.soft_errors.checks.detection_campaign import topup_plan

from mystique.binomial import Z95, rate_verdict, trials_to_pass, wilson
from mystique.progress import Progress
from mystique.results import Results, RunContext
from mystique.targets import Target

Z2 = Z95**2


def _rows(hits: int, n: int, target: float | None = 0.999, higher_is_better: bool = True,
          screen: bool = False) -> dict[str, dict]:
    res = Results(RunContext("cpu"), "soft_errors")
    common.rate_rows(res, "detection_campaign", "x", "", "detection_rate", hits, n, target=target,
                     higher_is_better=higher_is_better, detail="d", screen=screen)
    return {r["metric"]: r for r in res.rows}


# ------------------------------------------------------------------------------- the verdict rule


def test_six_of_six_caught_does_not_pass_a_target_of_0999():
    assert rate_verdict(6, 6, 0.999, True) == "inconclusive"
    row = _rows(6, 6)["detection_rate"]
    assert row["status"] == "inconclusive" and row["value"] == 1.0
    assert row["low"] == pytest.approx(6 / (6 + Z2)) and row["high"] == 1.0  # the interval, in its columns
    assert "3838 trials in all" in row["detail"]


def test_one_miss_in_ten_fails():
    assert rate_verdict(9, 10, 0.999, True) == "fail"
    rows = _rows(9, 10)
    assert rows["detection_rate"]["status"] == "fail" and rows["detection_rate"]["high"] < 0.999
    rows = _rows(9, 10, screen=True)  # a screen fails it too, on the rate and on its miss
    assert rows["detection_rate"]["status"] == "fail" and rows["misses"]["status"] == "fail"


def test_enough_trials_without_a_miss_pass_and_one_fewer_does_not():
    assert _rows(3838, 3838)["detection_rate"]["status"] == "pass"
    assert _rows(3837, 3837)["detection_rate"]["status"] == "inconclusive"
    assert rate_verdict(3837, 3838, 0.999, True) == "inconclusive"  # one miss: more trials needed
    assert trials_to_pass(3837, 3838, 0.999, True) > 3838


def test_false_positive_rates_pass_on_their_upper_bound():
    assert rate_verdict(0, 3838, 1e-3, False) == "pass"  # high = z^2 / (n + z^2) <= 1e-3
    assert rate_verdict(0, 3837, 1e-3, False) == "inconclusive"
    assert rate_verdict(10, 1000, 1e-3, False) == "fail"
    assert trials_to_pass(0, 0, 1e-3, False) == 3838
    assert trials_to_pass(0, 10, 0.0, False) is None  # a rate of 0 is not shown by any campaign
    rows = _rows(0, 2000, target=0.0, higher_is_better=False, screen=True)
    assert rows["detection_rate"]["status"] == "info" and rows["misses"]["status"] == "pass"
    assert "cannot be shown by any finite number of trials" in rows["detection_rate"]["detail"]
    rows = _rows(1, 2000, target=0.0, higher_is_better=False, screen=True)
    assert rows["detection_rate"]["status"] == "fail" and rows["misses"]["status"] == "fail"


def test_a_screen_reports_an_undecided_rate_as_a_measurement_and_checks_its_misses():
    rows = _rows(18, 18, screen=True)
    rate, misses = rows["detection_rate"], rows["misses"]
    assert rate["status"] == "info" and math.isnan(rate["threshold"]) and rate["low"] < 0.999
    assert misses["status"] == "pass" and misses["value"] == 0 and misses["threshold"] == 0
    rows = _rows(17, 18, screen=True)
    assert rows["misses"]["status"] == "fail" and rows["misses"]["value"] == 1
    assert "misses" not in _rows(18, 18, screen=False)  # a decided level has no screen
    assert [r["status"] for r in _rows(3, 4, target=None).values()] == ["info"] * 4


# ------------------------------------------------------------------------------- laws


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**6), data=st.data())
def test_the_wilson_interval_holds_the_point_estimate(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson(k, n)
    assert 0 <= lo <= k / n <= hi <= 1


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**7))
def test_the_lower_bound_at_zero_misses_is_n_over_n_plus_z2_and_grows_with_n(n):
    lo, _ = wilson(n, n)
    assert lo == pytest.approx(n / (n + Z2), rel=1e-12)
    assert wilson(n + 1, n + 1)[0] > lo


@settings(max_examples=200, deadline=None)
@given(t=st.floats(0.5, 0.99999))
def test_trials_needed_at_zero_misses_follow_the_closed_form(t):
    need = trials_to_pass(0, 0, t, True)
    assert need == math.ceil(t * Z2 / (1 - t)) or abs(need - t * Z2 / (1 - t)) < 1e-6  # n / (n + z^2) >= t
    assert rate_verdict(need, need, t, True) == "pass" and rate_verdict(need - 1, need - 1, t, True) != "pass"


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 20000), misses=st.integers(0, 20), t=st.sampled_from([0.9, 0.99, 0.999]),
       higher=st.booleans())
def test_trials_needed_is_the_fewest_that_pass_with_no_further_bad_outcome(n, misses, t, higher):
    bad = min(misses, n)
    target = t if higher else 1 - t
    hits = n - bad if higher else bad
    need = trials_to_pass(hits, n, target, higher)
    assert need is not None and need >= n

    def verdict(m: int) -> str:
        return rate_verdict(hits + (m - n) if higher else hits, m, target, higher)

    assert verdict(need) == "pass"
    assert need == n or verdict(need - 1) != "pass"


# ------------------------------------------------------------------------------- the full level's top-up


def _outcome(op: str, site: str, cls: str, significant: bool, detected: bool) -> dict:
    return {"op": op, "site": site, "bit_class": cls, "pattern": "single", "significant": significant,
            "detected": detected}


def test_topup_plans_the_trials_that_decide_each_undecided_row():
    combos = [("gemm_float32", "gemm_output", "mantissa", p) for p in ("single", "burst", "multiple")]
    combos += [("gemm_int8", "gemm_output", "low", "single"), ("gemm_bfloat16_rounded_check", "gemm_output",
                                                               "sign", "single")]
    outs = [_outcome("gemm_float32", "gemm_output", "mantissa", i % 4 == 0, True) for i in range(400)]  # 100 sig
    outs += [_outcome("gemm_int8", "gemm_output", "low", True, i > 0) for i in range(10)]  # 1 miss in 10: fail
    outs += [_outcome("gemm_bfloat16_rounded_check", "gemm_output", "sign", True, False)] * 5  # contrast
    plan = topup_plan(combos, outs, 0.999, 10**9)
    assert set(plan) == {0, 1, 2}  # neither the failed row nor the contrast is topped up
    share = 101 / 402
    assert sum(plan.values()) >= (3838 - 100) * 1.15 / share
    assert len(set(plan.values())) == 1  # spread evenly over the row's patterns
    assert topup_plan(combos, outs, 0.999, 100) == {}  # over budget: nothing planned
    decided = [_outcome("gemm_float32", "gemm_output", "mantissa", True, True)] * 3838
    assert topup_plan(combos, decided, 0.999, 10**9) == {}


def test_the_full_level_decides_every_rate(tmp_path, monkeypatch):
    # a target whose trials stay small here: 73 judged flips per row without a miss
    monkeypatch.setattr(detection_campaign, "DETECTION_TARGET", 0.95)
    df = soft_errors.run(Target("cpu"), level="full", groups=["detection_campaign"], out_dir=tmp_path, trials=36,
                         ops=("embedding_bag_sum",))
    rates = df[df.metric == "detection_rate"]
    assert len(rates) == 6 + 1 + 3 + 1 and set(rates.status) == {"pass"}, rates[["subject", "status", "detail"]]
    assert (rates.low >= 0.95).all() and (df[df.metric == "trials"].value >= 73).all()
    assert "misses" not in set(df.metric)  # the full level judges the rates themselves
    assert (tmp_path / "campaign_detection_topup1.jsonl").exists()
    assert "top-up trials" in rates[rates.subject == "all"].detail.iloc[0]


# ------------------------------------------------------------------------------- the judged flips


def _flip(op: str, site: str, sure: bool | None, significant: bool, detected: bool) -> dict:
    return {"op": op, "site": site, "bit_class": "mantissa", "pattern": "single", "seed": 1, "shape": [4, 4, 4],
            "bits": [3], "delta": 0.1, "significant": significant, "detected": detected, "sure": sure}


def _judge(outs: list[dict], level: str, op: str = "gemm_bfloat16", site: str = "gemm_operand") -> dict[str, dict]:
    """The rows detection_campaign writes for one (op, site, bit class) of ``outs``, by metric."""
    res = Results(RunContext("cpu"), "soft_errors")
    ctx = GroupContext(Target("cpu"), res, 0, level, Progress("soft_errors"))
    detection_campaign._combination_rows(ctx, f"{op}/{site}/mantissa", op, site, outs, level == "quick")
    return {r["metric"]: r for r in res.rows}


#: what the full campaign's gemm_bfloat16 operand mantissa row holds: flips sure to alarm, all caught, and
#: a few significant ones below the check's resolution (they tip one bf16 rounding), missed
SURE_CAUGHT = [_flip("gemm_bfloat16", "gemm_operand", True, True, True)] * 3838
BELOW_RESOLUTION = [_flip("gemm_bfloat16", "gemm_operand", False, True, False)] * 8
SURE_BENIGN = [_flip("gemm_bfloat16", "gemm_operand", True, False, True)] * 5


def test_a_row_is_judged_on_its_sure_flips_and_reports_the_output_rule_as_a_measurement():
    rows = _judge(SURE_CAUGHT + BELOW_RESOLUTION + SURE_BENIGN, "full")
    rate = rows["detection_rate"]
    assert rate["status"] == "pass" and rate["value"] == 1.0 and rows["trials"]["value"] == 3838 + 5
    assert "sure to alarm" in rate["detail"]
    sig = rows["significant_detection_rate"]  # the output rule: 8 misses in 3846, a measurement
    assert sig["status"] == "info" and sig["value"] == pytest.approx(3838 / 3846) and math.isnan(sig["threshold"])
    assert rows["significant_trials"]["value"] == 3846 and sig["high"] < 0.999  # it would fail as a verdict
    below = rows["below_resolution_fraction"]
    assert below["status"] == "info" and below["value"] == pytest.approx(8 / 3846)
    # the same outcomes recorded without `sure` (no bound known) are judged by the output rule
    old = _judge([{k: v for k, v in o.items() if k != "sure"} for o in SURE_CAUGHT + BELOW_RESOLUTION], "full")
    assert old["detection_rate"]["status"] == "fail" and "significant flips (the output rule)" in \
        old["detection_rate"]["detail"] and "significant_detection_rate" not in old


def test_a_missed_sure_flip_fails_and_one_below_the_resolution_does_not():
    missed = [_flip("gemm_float32", "gemm_output", True, True, False)]
    caught = [_flip("gemm_float32", "gemm_output", True, True, True)] * 9
    full = _judge(caught + missed, "full", "gemm_float32", "gemm_output")
    assert full["detection_rate"]["status"] == "fail"
    quick = _judge(caught + missed + BELOW_RESOLUTION[:2], "quick", "gemm_float32", "gemm_output")
    assert quick["misses"]["status"] == "fail" and quick["misses"]["value"] == 1  # the sure miss only
    quick = _judge(caught + BELOW_RESOLUTION[:2], "quick", "gemm_float32", "gemm_output")
    assert quick["misses"]["status"] == "pass" and quick["detection_rate"]["status"] == "info"
    assert quick["significant_detection_rate"]["value"] == pytest.approx(9 / 11)


def test_int8_gemm_and_bag_outputs_keep_the_output_rule():
    for op, site, why in (("gemm_int8", "gemm_output", "int8 GEMM checked exactly"),
                          ("embedding_bag_sum", "bag_output", "no bound of the table's checksums applies")):
        outs = [_flip(op, site, None, True, True)] * 9 + [_flip(op, site, None, True, False)] + \
            [_flip(op, site, None, False, False)] * 4
        rows = _judge(outs, "full", op, site)
        assert rows["detection_rate"]["status"] == "fail" and rows["trials"]["value"] == 10  # the significant ones
        assert why in rows["detection_rate"]["detail"] and "significant flips (the output rule)" in \
            rows["detection_rate"]["detail"]
        assert "significant_detection_rate" not in rows and "below_resolution_fraction" not in rows


def test_topup_counts_the_judged_flips():
    combos = [("gemm_float32", "gemm_output", "mantissa", "single")]
    sure_not_sig = [_flip("gemm_float32", "gemm_output", True, False, True)] * 3838
    assert topup_plan(combos, sure_not_sig, 0.999, 10**9) == {}  # decided on its sure flips
    below = [_flip("gemm_float32", "gemm_output", False, True, False)] * 3838
    plan = topup_plan(combos, below, 0.999, 10**9)  # none judged yet: planned at the floor share
    assert plan[0] >= 3838 * 1.15 / 0.02
