"""Soft errors: run() groups, PVF ranking, SDC screening and the CLI."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mystique.validators import soft_errors
from mystique.validators.groups import GroupContext
from mystique.validators.soft_errors import overhead, sdc
from mystique.validators.soft_errors.checks import abft_gemm, common
from mystique.validators.soft_errors.checks import overhead as overhead_group
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.cli import main
from mystique.faults import BitFlipMode, FaultSpec, bitflip_mode
from mystique.progress import Progress
from mystique.results import COLUMNS, Results, RunContext, read_csv
from mystique.targets import Target

SMALL = {"trials": 120, "fp_trials": 90, "pvf_trials": 4, "sdc_runs": 3, "workload_seeds": 1}


def _context(res: Results, target: Target, seed: int) -> GroupContext:
    """What run() hands a check group, for calling one group directly."""
    return GroupContext(target, res, seed, "quick", Progress("soft_errors"))


def corrupt_mm():
    """--inject factory used by the CLI test: flips exponent bits in about 1% of every mm output."""
    return BitFlipMode(rate=0.01, bit_class="exponent", seed=1, ops="mm")


def test_groups_name_every_check_group():
    assert soft_errors.groups("quick") == ["abft_gemm", "abft_grouped_gemm", "abft_embedding_bag", "abft_fbgemm",
                                          "false_positives", "detection_campaign", "pvf", "sdc_screen"]
    assert soft_errors.groups("full") == [*soft_errors.groups("quick"), "overhead", "overhead_fbgemm"]
    with pytest.raises(Exception, match="level"):
        soft_errors.groups("nope")


def test_run_on_a_healthy_cpu_passes_and_reports_rates_with_intervals(tmp_path):
    df = soft_errors.run(Target("cpu"), groups=["abft_gemm", "abft_embedding_bag", "false_positives",
                                                "detection_campaign"], out_dir=tmp_path, workloads=("dlrm",), **SMALL)
    assert list(df.columns) == list(COLUMNS) and (df.suite == "soft_errors").all()
    assert not df.status.isin(["fail", "error"]).any(), df[df.status != "pass"][["check", "subject", "metric", "detail"]]
    fp = df[(df.check == "false_positives") & (df.subject == "checked_ops")].set_index("metric").value
    assert fp["false_positive_rate"] == 0 and fp["trials"] == 90 and 0 < fp["false_positive_rate_ci_high"] < 0.05
    det = df[(df.check == "detection_campaign") & (df.subject == "all")].set_index("metric").value
    assert det["detection_rate"] == 1.0 and det["trials"] > 40 and det["detection_rate_ci_low"] > 0.9
    # measurements are info, checks carry a verdict: interval bounds, trial counts and target-less rates;
    # at the quick level a rate its few trials cannot decide is a measurement and 'misses' is the check
    st_ = df.set_index(["check", "subject", "metric"]).status
    assert st_["detection_campaign", "all", "detection_rate"] == "info"
    assert st_["detection_campaign", "all", "misses"] == "pass" and st_["false_positives", "checked_ops", "alarms"] == "pass"
    rate = df[(df.check == "detection_campaign") & (df.subject == "all") & (df.metric == "detection_rate")].iloc[0]
    assert rate.low == det["detection_rate_ci_low"] and rate.high == 1.0 and "3838 trials" in rate.detail
    assert (df[df.metric.isin(["trials", "significant_fraction"])].status == "info").all()
    ci = df[df.metric.isin(["detection_rate_ci_low", "false_positive_rate_ci_high"])]
    assert (ci.status == "info").sum() > 10 and set(ci.status) <= {"info", "skip"}  # (skip: no significant flip)
    res = Results(RunContext("cpu"), "soft_errors")  # a rate without a target: a contrast
    common.rate_rows(res, "detection_campaign", "x", "", "detection_rate", 3, 4, target=None, higher_is_better=True,
                     detail="")
    assert [r["status"] for r in res.rows] == ["info"] * 4
    assert set(df[df.threshold.notna()].status) <= {"pass", "skip"} and "info" not in set(df[df.threshold.notna()].status)
    assert {"bit_class/exponent", "bit_class/mantissa", "bit_class/sign"} <= set(df.subject)
    assert (tmp_path / "campaign_detection.jsonl").exists() and (tmp_path / "campaign_false_positives.jsonl").exists()


class _RectangleInt8(TorchDispatchMode):
    """A device whose int8 GEMM adds +7/-7 at the corners of a 2x2 rectangle of its product: every row and
    column sum is unchanged, so the exact int8 checksums see nothing, but the product is wrong."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.startswith("_int_mm"):
            out = out.clone()
            out[0, 0] += 7
            out[1, 1] += 7
            out[0, 1] -= 7
            out[1, 0] -= 7
        return out


def test_abft_gemm_clean_row_fails_when_the_product_differs_from_the_golden_beyond_its_bound():
    res = Results(RunContext("cpu"), "soft_errors")
    abft_gemm.run_abft_gemm(_context(res, Target("cpu", _RectangleInt8, "rectangle"), 0))
    clean = {r["dtype"]: r for r in res.rows if r["metric"] == "clean_alarm"}
    assert clean["int8"]["status"] == "fail", clean["int8"]["detail"]
    assert "differs from the CPU golden beyond its bound" in clean["int8"]["detail"]
    assert "bound 0 (exact int32 product)" in clean["int8"]["detail"]
    assert {clean[d]["status"] for d in ("float32", "bfloat16", "float16")} == {"pass"}
    healthy = Results(RunContext("cpu"), "soft_errors")
    abft_gemm.run_abft_gemm(_context(healthy, Target("cpu"), 3))
    rows = [r for r in healthy.rows if r["metric"] == "clean_alarm"]
    assert [r["status"] for r in rows] == ["pass"] * 4
    assert all("max |c - golden| / bound" in r["detail"] for r in rows)


def test_golden_bound_of_a_float_product_is_the_gemm_error_bound():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 40, generator=g), torch.randn(40, 8, generator=g)
    golden = a @ b
    ratio, where, text = abft_gemm.golden_deviation(golden, golden, a, b, "float32", "")
    assert ratio == 0 and where is None and "gamma_40(u=2^-24) [device]" in text
    bound = (a.double().abs() @ b.double().abs()) * 2 * (40 * 2.0**-24) / (1 - 40 * 2.0**-24)
    bad = golden.clone()
    bad[3, 5] += 2 * float(bound[3, 5])
    ratio, where, _ = abft_gemm.golden_deviation(bad, golden, a, b, "float32", "")
    assert where == (3, 5) and 1.9 < ratio < 2.1
    ok = golden.clone()
    ok[3, 5] += 0.5 * float(bound[3, 5])
    assert abft_gemm.golden_deviation(ok, golden, a, b, "float32", "")[0] < 0.6


def test_pvf_ranks_the_parameter_groups_of_the_debug_dlrm():
    df = soft_errors.run(Target("cpu"), groups=["pvf"], workloads=("dlrm",), pvf_trials=6)
    ranks = df[df.metric == "pvf_rank"]
    assert len(ranks) >= 4 and sorted(ranks.value) == list(range(1, len(ranks) + 1))
    pvf = df[df.metric == "pvf"].set_index("subject").value
    ordered = pvf[ranks.sort_values("value").subject].tolist()
    assert ordered == sorted(ordered, reverse=True)
    assert any(s.startswith("dlrm/emb_l.") for s in pvf.index) and pvf.max() > 0
    lo = df[df.metric == "pvf_ci_low"].set_index("subject").value
    hi = df[df.metric == "pvf_ci_high"].set_index("subject").value
    assert ((lo <= pvf) & (pvf <= hi)).all()
    measured = df[df.check == "pvf"]
    assert (measured.status == "info").all()  # a PVF is a measurement, not a check
    control = df[df.check == "pvf_control"]  # the one check: the unflipped device reproduces the golden
    assert list(control.status) == ["pass"] and list(control.value) == [0.0]


def test_pvf_control_fails_on_a_device_that_changes_the_output_without_any_flip():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Negate(TorchDispatchMode):  # flips every addmm's sign: DLRM's predictions change
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return -out if func.__name__.startswith("addmm") else out

    df = soft_errors.run(Target("cpu", Negate, "negate"), groups=["pvf"], workloads=("dlrm",), pvf_trials=1)
    control = df[df.check == "pvf_control"]
    assert list(control.status) == ["fail"] and "does NOT reproduce" in control.detail.iloc[0]


def test_sdc_screen_reports_the_first_mismatch_of_a_corrupted_run():
    modes: list[BitFlipMode] = []

    def factory():  # corrupt only the second run, one element, bit 30
        mode = BitFlipMode(rate=1.0 if len(modes) == 1 else 0.0, bits=[30], seed=2, max_flips=1)
        modes.append(mode)
        return mode

    kernel = sdc.default_kernels("quick")[2]
    res = sdc.screen(kernel, seed=5, runs=4, device="cpu", active=Target("cpu", factory).active)
    rec = modes[1].records[0]
    assert res.mismatched_runs == [1] and res.golden_bad_runs == [1]
    fm = res.first_mismatch
    assert fm["run"] == 1 and fm["index"] == rec.index and fm["xor"] == "0x40000000"
    assert fm["expected"] == rec.original and fm["actual"] == rec.corrupted
    clean = sdc.screen(kernel, seed=5, runs=3, device="cpu", active=Target("cpu").active)
    assert clean.ok and clean.golden_ratio < 1


def test_cli_writes_results_and_exits_0_when_healthy(tmp_path):
    out = tmp_path / "ok"
    rc = main(["-q", "validate", "soft-errors", "-o", str(out), "--group", "abft_gemm", "--group", "abft_embedding_bag"])
    assert rc == 0
    df = read_csv(out / "results.csv")
    assert set(df.check) == {"abft_gemm", "abft_embedding_bag"} and (df.status == "pass").all()


def test_cli_exits_1_when_an_injected_fault_is_detected(tmp_path):
    out = tmp_path / "bad"
    rc = main(["-q", "validate", "soft-errors", "-o", str(out), "--group", "abft_gemm",
               "--inject", "test_soft_errors_run:corrupt_mm"])
    assert rc == 1
    df = read_csv(out / "results.csv")
    alarms = df[(df.metric == "clean_alarm") & (df.status == "fail")]
    assert set(alarms.dtype) >= {"float32"} and (df.device == "cpu+test_soft_errors_run:corrupt_mm").all()


def test_cli_refuses_a_checkpoint_of_another_device_model_or_device_with_exit_2(tmp_path, capsys, monkeypatch):
    """--checkpoint resumes only the same campaign: another device model, fault or emulation is refused
    (exit 2, naming what differs, nothing written), never answered with the old outcomes."""
    import dataclasses

    from mystique import targets

    ck = tmp_path / "ck"
    args = ["-q", "validate", "soft-errors", "--group", "false_positives", "--fp-trials", "18", "--workloads", "dlrm",
            "--checkpoint", str(ck)]
    assert main([*args, "-o", str(tmp_path / "a")]) == 0
    assert [p.name for p in ck.glob("campaign_*")] == ["campaign_false_positives.jsonl"]
    assert main([*args, "-o", str(tmp_path / "b")]) == 0  # the same settings resume
    detail = read_csv(tmp_path / "b" / "results.csv").set_index("metric").detail["false_positive_rate"]
    assert "18 resumed" in detail
    capsys.readouterr()
    real = targets.device_info
    monkeypatch.setattr(targets, "device_info", lambda d: dataclasses.replace(real(d), name="Another CPU model"))
    assert main([*args, "-o", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "device_name" in err and "'Another CPU model' (this run)" in err and not (tmp_path / "c").exists()
    monkeypatch.undo()
    assert main([*args, "--inject", "test_soft_errors_run:corrupt_mm", "-o", str(tmp_path / "d")]) == 2
    assert "label: 'cpu' (checkpoint) vs 'cpu+test_soft_errors_run:corrupt_mm' (this run)" in capsys.readouterr().err
    assert main([*args, "--seed", "1", "-o", str(tmp_path / "e")]) == 2
    assert "seed: 0 (checkpoint) vs 1 (this run)" in capsys.readouterr().err


def test_cli_rejects_bad_input_with_exit_2(tmp_path, capsys):
    assert main(["validate", "soft-errors", "-o", str(tmp_path / "x"), "--workloads", "resnet"]) == 2
    assert "unknown workload" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["validate", "soft-errors", "-o", str(tmp_path / "y"), "--inject", "nope"]) == 2


def test_cli_overhead_options_choose_the_sizes_and_tables_that_are_timed(tmp_path):
    out = tmp_path / "ov"
    rc = main(["-q", "validate", "soft-errors", "-o", str(out), "--group", "overhead", "--overhead-sizes", "32,48",
               "--overhead-tables", "300x8,200x16x4x5", "--overhead-reps", "3"])
    df = read_csv(out / "results.csv")
    # which sizes and tables were timed, how often, and that each ratio got a verdict; the verdicts
    # themselves depend on this host's speed (3 reps): the overhead logic is tested on synthetic series
    assert rc in (0, 1, 4) and set(df.check) == {"overhead"}  # 4: only undecided ratios
    judged = df[df.metric == "abft_overhead"]
    assert len(judged) and set(judged.status) <= {"pass", "fail", "inconclusive", "info"}  # info: no target (GPU rows)
    assert (judged.threshold.notna() == (judged.status != "info")).all()
    subjects = set(df.subject)
    assert {"gemm_32", "gemm_48", "embedding_bag_300x8_b2048_l40", "embedding_bag_200x16_b4_l5"} <= subjects
    assert not any(s.endswith("_1024") for s in subjects)
    assert "median of 3 paired ratios" in df.set_index("subject").detail["gemm_32"]


@pytest.mark.parametrize("args, message", [
    (["--overhead-sizes", "0,12"], "--overhead-sizes needs positive integers"),
    (["--overhead-tables", "100x64x8"], "is not ROWSxDIM or ROWSxDIMxBAGSxLEN"),
    (["--overhead-reps", "1"], "--overhead-reps"),
])
def test_cli_rejects_bad_overhead_options_with_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "bad"
    assert main(["validate", "soft-errors", "-o", str(out), "--group", "overhead", *args]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_bitflip_mode_registers_as_a_fault_spec():
    spec = FaultSpec("bitflip", "flip bits", "SDC", bitflip_mode,
                     {"rate": 1e-6, "bit_class": "any", "seed": 0, "ops": "", "bits": "", "calls": ""})
    mode = spec.build(**{**spec.params, "rate": 1.0, "bits": "30", "ops": "mm+addmm", "calls": "0"})
    a = torch.ones(2, 2)
    with mode:
        y = a @ a
    # 2.0 is 0x40000000: flipping bit 30 of every element of the mm output leaves +0.0
    assert torch.equal(y, torch.zeros(2, 2)) and len(mode.records) == 4
    assert all(r.bits == [30] and r.original == 2.0 for r in mode.records)


@pytest.mark.slow
def test_thirty_thousand_clean_checked_ops_raise_no_alarm(tmp_path):
    df = soft_errors.run(Target("cpu"), groups=["false_positives"], fp_trials=30000, workloads=("dlrm", "bert", "llama"),
                         out_dir=tmp_path)
    fp = df[(df.subject == "checked_ops")].set_index("metric").value
    assert fp["trials"] == 30000 and fp["false_positive_rate"] == 0 and fp["false_positive_rate_ci_high"] < 1.3e-4
    assert not df.status.isin(["fail", "error"]).any()


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=120, unique=True))
def test_median_interval_holds_the_median_with_at_least_95_percent_binomial_coverage(values):
    from mystique.validators.soft_errors import overhead

    lo, hi = overhead.median_interval(values)
    xs, n = sorted(values), len(values)
    assert lo <= statistics.median(values) <= hi
    k = xs.index(lo)  # 0-based rank of the lower end; the upper end is the mirror rank
    assert hi == xs[n - 1 - k]
    miss = sum(math.comb(n, j) for j in range(k + 1)) / 2.0**n  # P(Binomial(n, 1/2) <= k)
    if n >= 6:
        assert 1 - 2 * miss >= 0.95  # [x_(k), x_(n-1-k)] covers the median
        tighter = miss + math.comb(n, k + 1) / 2.0**n
        assert 1 - 2 * tighter < 0.95  # and is the narrowest such pair of ranks


def test_overhead_is_the_median_of_paired_ratios_not_a_ratio_of_medians():
    from mystique.validators.soft_errors import overhead

    # a host that slows down halfway: each round's pair shares the slowdown
    base = [1.0] * 5 + [3.0] * 6
    checked = [1.02] * 5 + [3.06] * 6
    t = overhead.Timings({"b": base, "c": checked}, {"b": base, "c": checked}, 11, "test", 1e-9)
    assert t.overhead("c", "b") == pytest.approx(0.02)
    lo, hi = t.interval("c", "b")
    assert lo == pytest.approx(0.02) and hi == pytest.approx(0.02)


def test_time_interleaved_runs_every_function_once_per_round_in_seeded_random_orders():
    from mystique.validators.soft_errors import overhead

    def record(seed: int) -> tuple[list[str], list[int], overhead.Timings]:
        calls: list[str] = []
        prepared: list[int] = []
        fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b", "c", "d")}
        t = overhead.time_interleaved(fns, 24, device="cpu", threads=1, sync=lambda: None,
                                      prepare=prepared.append, seed=seed)
        return calls, prepared, t

    calls, prepared, t = record(3)
    assert prepared == [-1, *range(24)]
    assert calls[:8] == ["a", "a", "b", "b", "c", "c", "d", "d"]  # warm-up
    rounds = [calls[8 + 4 * r: 12 + 4 * r] for r in range(24)]
    assert all(sorted(r) == ["a", "b", "c", "d"] for r in rounds)  # each once per round
    followers = {(r[i], r[i + 1]) for r in rounds for i in range(3)}
    assert len({tuple(r) for r in rounds}) > 6 and len(followers) == 12  # no fixed neighbour
    assert record(3)[0] == calls and record(4)[0] != calls  # reproducible from the seed
    assert t.reps == 24 and set(t.median) == {"a", "b", "c", "d"} and t.clock == "thread CPU time"


def test_overhead_group_times_the_product_paths_with_an_aa_control(monkeypatch):
    from mystique.validators.soft_errors.checks import overhead as overhead_group

    # one round per look would be a point, not an interval: a targeted shape runs to the rounds its looks'
    # level needs (8), then stops at a cap of no time; the verdicts' logic is tests/test_stopping.py
    monkeypatch.setattr(overhead_group, "CAP_S", 1e-9)
    df = soft_errors.run(Target("cpu"), groups=["overhead"], overhead_sizes=(48, 1024), overhead_reps=1,
                         overhead_tables=((500, 16, 8, 4),))
    assert not df.status.isin(["error", "skip"]).any(), df[["subject", "detail"]]
    ov = df[df.metric == "abft_overhead"].set_index("subject")
    shape = "500x16_b8_l4"
    assert set(ov.index) == {"gemm_48", "linear_48", "protect_linear_48", "gemm_1024", "linear_1024",
                             "protect_linear_1024", f"embedding_bag_{shape}", f"embedding_bag_8bit_{shape}",
                             f"protect_embedding_bag_{shape}", "device_linear_float32_48", "device_linear_bfloat16_48",
                             "protect_device_linear_float32_48", "protect_device_linear_bfloat16_48"}
    device_rows = ov[ov.index.str.contains("device_linear")]  # the GPU targets' rows: measurements on the CPU
    assert device_rows.threshold.isna().all() and (device_rows.status == "info").all()
    assert ov.threshold.isna()[["gemm_48", "linear_48"]].all() and (ov.status[["gemm_48", "linear_48"]] == "info").all()
    targeted = ov[ov.threshold.notna()]
    assert set(targeted.status) <= {"pass", "fail", "inconclusive"}
    assert targeted.detail.str.contains("verdict from the 99.17% interval").all()  # the adaptive stop's six looks
    assert targeted.detail.str.contains("adaptive stop: looks at").all()
    assert targeted.detail.str.contains("after 8 rounds").all()
    assert (ov.threshold[["gemm_1024", "linear_1024", "protect_linear_1024"]] == 0.05).all()
    assert (ov.threshold[[f"embedding_bag_{shape}", f"protect_embedding_bag_{shape}"]] == 0.26).all()  # the CPU target
    aa = df[df.metric == "aa_relative_difference"].subject
    assert set(aa) == {"timing_resolution_48", "timing_resolution_1024", f"timing_resolution_{shape}",
                       "timing_resolution_float32_48", "timing_resolution_bfloat16_48"}
    detail = ov.detail["gemm_1024"]
    assert "thread CPU time, 1 thread(s)" in detail and "load average" in detail and "A/A resolution" in detail
    first = overhead.TABLE_ROUNDS  # tables: more rounds (the first look's)
    assert f"looks at {first}, {2 * first}, {4 * first}" in ov.detail[f"embedding_bag_{shape}"]
    floors = df[df.metric == "abft_floor"].set_index("subject")
    assert set(floors.index) == {"gemm_passes_floor_48", "gemm_passes_floor_1024",
                                 f"embedding_bag_gather_floor_{shape}", f"embedding_bag_8bit_gather_floor_{shape}"}
    assert floors.threshold.isna().all() and (floors.status == "info").all()  # measurements, no verdict
    assert (df[df.metric == "aa_relative_difference"].status == "info").all()


@pytest.mark.parametrize("checked, status", [
    ([1.01, 1.02, 1.03, 1.02, 1.01, 1.02, 1.03, 1.02, 1.01], "pass"),  # whole interval within +5%
    ([1.08, 1.09, 1.10, 1.09, 1.08, 1.09, 1.10, 1.09, 1.08], "fail"),  # whole interval above
    ([1.01, 1.09, 1.02, 1.08, 1.03, 1.07, 1.04, 1.08, 1.09], "inconclusive"),  # median 1.07, interval across 5%
    ([1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.11], "pass"),  # an outlier round moves neither
])
def test_overhead_verdicts_come_from_the_interval_not_the_median_alone(checked, status):
    base = [1.0] * len(checked)
    t = overhead.Timings({"b": base, "c": checked}, {"b": base, "c": checked}, len(base), "test", 1e-9)
    res = Results(RunContext("cpu"), "soft_errors")
    overhead_group.overhead_rows(res, t, "9", (("gemm", "c", "b", "float32", "demo"),), (("floor", "c", "b", "demo"),),
                                 0.05, "common")
    rows = {r["metric"]: r for r in res.rows}
    lo, hi = t.interval("c", "b")
    assert rows["abft_overhead"]["status"] == status and rows["abft_floor"]["status"] == "info"
    assert (status == "pass") == (hi <= 0.05) and (status == "fail") == (lo > 0.05)


def test_embedding_bag_overhead_target_is_26_percent_on_a_cpu_and_10_on_an_accelerator():
    from mystique.validators.soft_errors.overhead import embedding_bag_target

    assert embedding_bag_target("cpu") == 0.26
    assert embedding_bag_target("cuda") == embedding_bag_target("cuda:1") == embedding_bag_target("xpu") == 0.10
