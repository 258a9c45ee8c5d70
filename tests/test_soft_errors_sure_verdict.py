"""The detection campaign judges what the checker guarantees: each trial records whether its flip is *sure*
to raise the alarm by the check's own bound (sure_row_alarms, sure_alarms), the judged rate is over those
flips, and the output rule's rate (significant flips) is a measurement beside it.

A weakened checker (its threshold 100 times the derived one) fails the judged rates, while the output rule
does not even notice (its flips sit far above any threshold or below the check's resolution).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import defaultdict
from unittest import mock

import pandas as pd
import pytest
from mystique.reports.sections import soft_errors as soft_errors_section
from mystique.validators import soft_errors
from mystique.validators.soft_errors import campaign
from mystique.validators.soft_errors.abft.bag_verdict import EMBEDDING_LAMBDA
from mystique.validators.soft_errors.abft.report import GEMM_LAMBDA
from mystique.validators.soft_errors.checks import common

from mystique.errors import UsageError
from mystique.results import Results, RunContext
from mystique.targets import Target

#: tests/test_soft_errors_gemm_flips.py's pinned miss: a bf16 operand mantissa flip whose checksum change is
#: 0.54 of the row's bound, "significant" only by tipping one bf16 rounding of the output
MISSED_SEED = 1252937709101337556
OPS = ("gemm_bfloat16", "embedding_bag_sum")


def test_each_trial_records_whether_its_flip_is_sure_to_alarm():
    combos = campaign.detection_combos((*campaign.GEMM_OPS, *campaign.EMB_OPS, *campaign.CONTRAST_OPS))
    fn = campaign.detection_trial_fn(combos, 17, "cpu", contextlib.nullcontext)
    outs = [fn(i) for i in range(len(combos) * 2)]
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for o in outs:
        bound = o["op"] not in ("gemm_int8", *campaign.CONTRAST_OPS) and o["site"] != "bag_output"
        assert isinstance(o["sure"], bool) if bound else o["sure"] is None, o
        by_kind[f"{o['op']}/{o['site']}"].append(o)
    missed = [o for o in outs if o["sure"] and not o["detected"]]
    assert not missed, missed[:3]  # a healthy checker sees every flip its bound says it must
    for kind, group in by_kind.items():  # no empty rule: every bounded site has sure flips
        if group[0]["sure"] is not None:
            assert any(o["sure"] for o in group), kind
    assert any(o["sure"] and not o["significant"] for o in outs)  # sure, yet below the output rule's 2^-7 rms
    o = campaign.gemm_trial("gemm_bfloat16", "gemm_operand", "mantissa", "single", MISSED_SEED, "cpu",
                            contextlib.nullcontext)
    assert o["significant"] and not o["detected"] and o["sure"] is False  # below the check's resolution


def _threshold_times_100():
    """The checker of the campaign's trials with lambda (its threshold) 100 times the derived one; the
    trials' `sure` keeps the derived bound."""
    verify_gemm, bags, verify_bag = campaign.verify_gemm, campaign.Bags, campaign.verify_bag_output
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(campaign, "verify_gemm", lambda enc, c, **kw: verify_gemm(
        enc, c, **{**kw, "lam": 100 * GEMM_LAMBDA})))
    stack.enter_context(mock.patch.object(campaign, "Bags", lambda *a: dataclasses.replace(
        bags(*a), lam=100 * EMBEDDING_LAMBDA)))
    stack.enter_context(mock.patch.object(campaign, "verify_bag_output", lambda *a, **kw: verify_bag(
        *a, **{**kw, "lam": 100 * EMBEDDING_LAMBDA})))
    return stack


def _status(df: pd.DataFrame, prefix: str, metric: str) -> set[str]:
    return set(df[df.subject.str.startswith(prefix) & (df.metric == metric)].status)


def test_the_campaign_fails_when_the_checkers_threshold_is_100_times_the_derived_one(tmp_path):
    healthy = soft_errors.run(Target("cpu"), level="quick", groups=["detection_campaign"], trials=108, ops=OPS,
                              out_dir=tmp_path / "healthy")
    assert not healthy.status.isin(["fail", "error"]).any()
    with _threshold_times_100():
        df = soft_errors.run(Target("cpu"), level="quick", groups=["detection_campaign"], trials=108, ops=OPS,
                             out_dir=tmp_path / "weak")
    for prefix in ("gemm_bfloat16/", "embedding_bag_sum/embedding_row/"):
        assert "fail" in _status(df, prefix, "misses"), prefix  # sure flips missed
    assert df[(df.subject == "all") & (df.metric == "misses")].status.iloc[0] == "fail"
    # the output rule does not see it: its rates stay measurements, every significant flip here is caught
    sig = df[df.metric == "significant_detection_rate"]
    assert set(sig.status) <= {"info", "skip"} and (sig.value.dropna() == 1.0).all()


def test_a_checkpoint_written_before_sure_flips_were_recorded_is_refused_in_one_line(tmp_path):
    opts = {"level": "quick", "groups": ["detection_campaign"], "trials": 36, "ops": ("gemm_float32",),
            "checkpoint": tmp_path}
    soft_errors.run(Target("cpu"), **opts)
    path = tmp_path / "campaign_detection.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    header = {k: v for k, v in lines[0]["header"].items() if k != "sure_flips"}  # as the earlier version wrote it
    old = campaign.config_hash(header)
    records = [{k: v for k, v in r.items() if k != "sure"} | {"config": old} for r in lines[1:]]
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"config": old, "header": header}, *records]))
    with pytest.raises(UsageError, match="sure_flips: '<absent>' \\(checkpoint\\)") as err:
        soft_errors.run(Target("cpu"), **opts)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_the_report_shows_each_rate_of_a_subject_with_its_own_trials():
    res = Results(RunContext("cpu"), "soft_errors")
    common.rate_rows(res, "detection_campaign", "x", "", "detection_rate", 10, 10, target=None,
                     higher_is_better=True, detail="")
    common.rate_rows(res, "detection_campaign", "x", "", "significant_detection_rate", 11, 12, target=None,
                     higher_is_better=True, detail="", trials_metric="significant_trials")
    df = res.frame().assign(run_no=1)
    rates = [soft_errors_section._with_interval(e) for e in
             soft_errors_section.metric_groups(df, soft_errors_section._is_rate)]
    assert {e["metric"]: e["trials"] for e in rates} == {"detection_rate": 10, "significant_detection_rate": 12}
