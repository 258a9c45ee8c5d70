"""The performance validator (issue 22): its statistics, the slowness fault simulations, the
fleet comparison and summary, the CLI and the report section (the fleet-detection campaign:
test_fleet_campaign.py)."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mystique.validators.performance import fleet, nominal, stats, timed
from mystique.validators.performance.stats import quantile

from mystique import results
from mystique.cli import main
from mystique.faults import slowness
from mystique.timing import median_interval

finite = st.floats(min_value=0.01, max_value=1e6, allow_nan=False, allow_infinity=False)


# -- statistics -----------------------------------------------------------------------------------

@given(st.lists(finite, min_size=1, max_size=300))
def test_the_median_interval_is_the_suites_median_interval(xs):
    assert stats.quantile_interval(xs, 0.5) == median_interval(xs)


@given(st.lists(finite, min_size=1, max_size=200), st.sampled_from([0.05, 0.25, 0.5, 0.95, 0.99]))
def test_a_quantile_lies_inside_its_interval(xs, q):
    lo, hi = stats.quantile_interval(xs, q)
    order_stat = sorted(xs)[max(1, math.ceil(q * len(xs))) - 1]  # the inverse of the empirical CDF at q
    assert lo in xs and hi in xs and lo <= order_stat <= hi


@given(st.lists(finite, min_size=1, max_size=100), st.integers(1, 100_000))
def test_expected_max_grows_with_n_and_is_bounded_by_the_largest_sample(xs, n):
    e1, en = stats.expected_max(xs, 1), stats.expected_max(xs, n)
    assert e1 == pytest.approx(sum(xs) / len(xs), rel=1e-9)
    assert e1 * (1 - 1e-9) <= en <= max(xs) * (1 + 1e-9)
    assert stats.expected_max(xs, n + 1) >= en * (1 - 1e-9)


@given(st.integers(1, 100_000))
def test_expected_max_of_a_two_point_distribution_is_exact(n):
    # P(max = 2) = 1 - (1/2)^n
    assert stats.expected_max([1.0, 2.0], n) == pytest.approx(2.0 - 0.5**n, rel=1e-12)


@given(st.lists(finite, min_size=6, max_size=400))
def test_the_means_batch_interval_contains_the_mean(xs):
    lo, hi = stats.batch_mean_interval(xs)
    m = sum(xs) / len(xs)
    assert lo <= m * (1 + 1e-9) and m * (1 - 1e-9) <= hi


def test_the_means_batch_interval_covers_the_true_mean_95_percent_of_the_time():
    import numpy as np

    rng = np.random.default_rng(7)
    hits = sum(lo <= 10.0 <= hi for lo, hi in (stats.batch_mean_interval(rng.normal(10.0, 1.0, 120))
                                               for _ in range(3000)))
    assert 0.935 <= hits / 3000 <= 0.965


def test_a_stragglers_stalls_lift_the_means_interval_above_the_typical_step():
    """Stalls in a fifteenth of the steps make the mean, and all its interval, slower than a typical
    stretch; the median of batch means, which the mean was once given, would leave most of them out."""
    import numpy as np

    rng = np.random.default_rng(3)
    steps = rng.normal(17.0, 0.3, 300)
    steps[rng.choice(300, 20, replace=False)] += 150.0
    lo, hi = stats.batch_mean_interval(list(steps))
    assert lo <= steps.mean() <= hi and lo > 1.2 * 17.0
    assert stats.batch_interval(list(steps), stats.statistics.fmean)[0] < 1.2 * 17.0 < lo


def test_too_short_a_series_has_no_interval_of_its_mean():
    assert stats.batch_mean_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == (-math.inf, math.inf)


@given(st.lists(st.floats(min_value=90, max_value=110), min_size=5, max_size=40), st.floats(0.1, 100))
def test_the_fleet_verdict_does_not_depend_on_the_unit(peers, scale):
    a = fleet.judge(130.0, 125.0, 135.0, peers, higher_better=False)
    b = fleet.judge(130.0 * scale, 125.0 * scale, 135.0 * scale, [p * scale for p in peers], higher_better=False)
    assert a[0] == b[0] and a[1] == pytest.approx(b[1]) and a[2] == pytest.approx(b[2])


def test_the_fleet_fails_a_slow_device_passes_a_typical_one_and_doubts_an_unsure_one():
    peers = [100.0 + 0.5 * i for i in range(-5, 6)]
    assert fleet.judge(120.0, 118.0, 122.0, peers, higher_better=False)[0] == "fail"
    assert fleet.judge(100.5, 99.0, 102.0, peers, higher_better=False)[0] == "pass"
    assert fleet.judge(108.0, 104.0, 112.0, peers, higher_better=False)[0] == "inconclusive"
    # a rate: lower is slower
    assert fleet.judge(80.0, 79.0, 81.0, peers, higher_better=True)[0] == "fail"
    assert fleet.judge(101.0, 99.5, 102.0, peers, higher_better=True)[0] == "pass"


@pytest.mark.parametrize("n", [3, 6, 10, 19, 40])
def test_a_healthy_member_of_a_normal_fleet_is_flagged_at_the_three_sigma_rate(n):
    """The limit is a prediction bound: over normal fleets of n peers a new healthy member lies above
    M + k S about 0.135% of the time (Phi(-3)); the known-spread 3 x MAD rule flagged 2.6%, 1.2% and 0.5% at 10, 19 and 40 peers."""
    import numpy as np
    from mystique.validators.performance import spread

    rng = np.random.default_rng(n)
    trials = 40000
    fleets, new = rng.standard_normal((trials, n)), rng.standard_normal(trials)
    centre, scale, _, efficiency = zip(*(spread.fleet_spread(f) for f in fleets))
    limits = np.array(centre) + spread.prediction_factor(n, efficiency[0]) * np.array(scale)
    rate = float(np.mean(new > limits))
    assert 0.4 * spread.TAIL < rate < 1.6 * spread.TAIL, (rate, spread.TAIL)
    mad = np.median(fleets, axis=1) + 3 * 1.4826 * np.median(np.abs(fleets - np.median(fleets, axis=1)[:, None]), axis=1)
    assert float(np.mean(new > mad)) > 1.6 * spread.TAIL  # the old rule's flaw, which this test would catch


def test_qn_is_a_robust_standard_deviation():
    import numpy as np
    from mystique.validators.performance import spread

    rng = np.random.default_rng(0)
    est = [spread.qn_scale(rng.normal(0, 2.0, 25)) for _ in range(4000)]
    assert float(np.mean(est)) == pytest.approx(2.0, rel=0.03)
    clean = list(rng.normal(100, 1, 21))
    assert spread.qn_scale(clean + [1e6] * 5) < 3 * spread.qn_scale(clean)  # outliers do not carry it
    assert math.isnan(spread.qn_scale([1.0])) and spread.prediction_factor(1) == math.inf


def test_a_fleet_too_small_to_bound_a_member_is_inconclusive_not_a_pass():
    """20% slower than 3 peers that agree within 1%: a 3-peer spread cannot bound a healthy member at 3
    sigma (the prediction limit is wide), yet the device is far beyond 3 such spreads: inconclusive.
    With 40 such peers the same device fails, and one within 3 spreads passes."""
    few = [99.0, 100.0, 101.0]
    status, _, limit, detail = fleet.judge(120.0, 118.0, 122.0, few, higher_better=False)
    assert status == "inconclusive" and limit > 1.2 and "passes at or below" in detail
    many = [99.0 + 2.0 * i / 39 for i in range(40)]
    assert fleet.judge(120.0, 118.0, 122.0, many, higher_better=False)[0] == "fail"
    assert fleet.judge(100.5, 100.0, 101.0, few, higher_better=False)[0] == "pass"


def test_a_noisy_fleet_widens_its_own_limit():
    tight = fleet.judge(110.0, 109.0, 111.0, [100.0, 100.5, 99.5, 100.2, 99.8], higher_better=False)
    noisy = fleet.judge(110.0, 109.0, 111.0, [100.0, 108.0, 92.0, 104.0, 96.0], higher_better=False)
    assert tight[0] == "fail" and noisy[0] == "pass" and noisy[2] > tight[2]


def test_nominal_peaks_match_device_names():
    assert nominal.lookup("NVIDIA H100 80GB HBM3").memory_gbps == 3350.0
    assert nominal.lookup("NVIDIA H100 PCIe").tflops["bfloat16"] == 756.0
    assert nominal.lookup("NVIDIA H200").memory_gbps == 4800.0
    assert nominal.lookup("NVIDIA A100-SXM4-80GB").tflops["bfloat16"] == 312.0
    assert nominal.lookup("AMD EPYC 7B13 64-Core Processor") is None


# -- slowness fault simulations ---------------------------------------------------------------------

def test_throttle_slows_the_stated_fraction_of_calls_by_the_stated_factor(monkeypatch):
    import torch

    waits = []
    monkeypatch.setattr(slowness, "busy_wait", lambda s, clock: waits.append(s))
    monkeypatch.setattr(slowness, "_timed", lambda f, a, k: (f(*a, **k), 0.002, time.perf_counter))
    x = torch.randn(8, 8)
    want = x @ x
    for _ in range(400):  # a fresh mode per call: the draws continue across them
        with slowness.ThrottleMode(factor=1.5, fraction=0.5, seed=7):
            got = x @ x
        assert torch.equal(got, want)
    assert 140 <= len(waits) <= 260 and all(w == pytest.approx(0.001) for w in waits)


def test_on_the_cpu_the_throttle_counts_and_spins_on_the_threads_cpu_time():
    """A busy host's time slices are neither counted in an operator's time nor multiplied by the factor."""
    import torch

    x = torch.ones(64, 64)
    out, dt, clock = slowness._timed(torch.mm, (x, x), {})
    assert clock is time.thread_time and 0 <= dt and torch.equal(out, x @ x)
    t0 = time.thread_time()
    time.sleep(0.05)  # sleeping takes no CPU time: a wait on this clock ignores it
    assert time.thread_time() - t0 < 0.02


def test_a_straggler_stalls_once_per_every_s_of_operator_time(monkeypatch):
    import torch

    stalls = []
    monkeypatch.setattr(slowness.time, "sleep", stalls.append)
    monkeypatch.setattr(slowness, "_timed", lambda f, a, k: (f(*a, **k), 0.01, time.perf_counter))
    x = torch.randn(4, 4)
    for _ in range(2000):  # 20 s of operator time: about 20 stalls of 0.15 s
        with slowness.StragglerMode(every_s=1.0, stall_ms=150.0, seed=3):
            x + x
    assert 8 <= len(stalls) <= 35 and set(stalls) == {0.15}


@pytest.mark.parametrize("spec, message", [("throttle:factor=0.5", "at least 1"),
                                           ("throttle:fraction=2", "within 0..1"),
                                           ("straggler:every_s=0", "must be > 0")])
def test_bad_slowness_parameters_exit_2(spec, message, tmp_path, capsys):
    code = main(["validate", "performance", "-o", str(tmp_path / "o"), "--inject", spec])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


# -- the validator and its commands -------------------------------------------------------------------

def test_micro_measures_gemm_memory_and_skips_transfers_on_the_host():
    from mystique.validators.performance import LEVELS, PerformanceContext
    from mystique.validators.performance.micro import run_micro

    from mystique.progress import Progress
    from mystique.targets import make_target

    target = make_target("cpu")
    res = results.Results(results.RunContext.for_target(target), "performance")
    s = {**LEVELS["quick"], "micro_budget_s": 0.05, "min_reps": 3, "gemm_n_cpu": 128, "mem_bytes_cpu": 1 << 20,
         "sdpa_lengths_cpu": (128,)}
    ctx = PerformanceContext(target=target, res=res, seed=0, level="quick", progress=Progress("t"), settings=s,
                             device_name="cpu")
    run_micro(ctx)
    df = res.frame()
    df["check"] = df["check"].str.removesuffix("_disturbed")  # a busy host's figures keep their place
    gemm = df[df["check"] == "gemm_throughput"]
    assert {"float32", "bfloat16"} <= set(gemm["dtype"]) and (gemm["value"] > 0).all()
    assert set(df.loc[df["check"] == "memory_bandwidth", "subject"]) == {"copy", "triad"}
    assert all("calls undisturbed" in d for d in gemm["detail"])
    assert df.loc[df["check"] == "transfer_bandwidth", "status"].tolist() == ["skip"]
    assert all("95% interval [" in d for d in gemm["detail"])
    # the throughput curves predict reads: each layout from the sweep's smallest size up to the level's GEMM
    # (128 here), and attention forward and backward; a point one call of which would overrun its budget
    # on this host is a skip row that says so (what is measured and skipped: the fake clock's test in
    # test_predict_profile.py)
    curve = df[df["check"].isin(("gemm_curve", "attention_curve")) & (df["dtype"] == "float32")]
    assert {"gemm_64_nn", "gemm_64_nt", "gemm_64_tn", "sdpa_fwd_b1h8l128d64"} <= set(curve["subject"])
    assert all(r.status == "info" and r.value > 0 or r.status == "skip" and "clamps at the largest size" in r.detail
               for r in curve.itertuples())


SUSTAINED = ["--group", "sustained", "--workloads", "dlrm", "--duration", "2"]


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("perf") / "healthy"
    code = main(["-q", "validate", "performance", "-o", str(out), *SUSTAINED])
    assert code in (0, 1, 4)  # a drift row may be undecided (4) on a busy host; the rows are what is tested
    return out


def test_sustained_rows_hold_the_distribution_drift_and_clocks(healthy_run):
    df = results.read_csv(healthy_run / "results.csv")
    guard = df[df["check"] == "host_contention"].iloc[0]
    enough = guard["status"] == "pass"
    check = "step_time" if enough else "step_time_disturbed"  # a busy host's figures are not compared
    metrics = set(df.loc[df["check"] == check, "metric"])
    assert {"median_ms", "p05_ms", "p95_ms", "p99_ms", "mean_ms"} <= metrics
    assert {"step_cv", "stalls", "throughput_drift", "clock_drop", "host_contention"} <= set(df["check"])
    assert "mode_slowdown" not in set(df["check"])  # nothing injected: nothing to pair
    steps = pd.read_csv(healthy_run / "step_times.csv")
    assert len(steps) == int(re.search(r"of (\d+) calls undisturbed", guard["detail"])[1])
    assert guard["value"] == steps["undisturbed"].sum()
    assert (steps["undisturbed"] == (steps["waited_s"] <= timed.EPS * steps["seconds"])).all()
    median = df[(df["check"] == check) & (df["metric"] == "median_ms")]["value"].iloc[0]
    chosen = steps.loc[steps["undisturbed"] == 1, "seconds"] if enough else steps["seconds"]
    assert median == pytest.approx(quantile(list(chosen * 1e3), 0.5))  # the figure is over the undisturbed steps


@pytest.mark.slow  # end to end on this host's clock; the verdict logic: the synthetic fleets below
def test_a_throttled_device_fails_paired_and_against_its_fleet(healthy_run, tmp_path):
    out = tmp_path / "slow"
    code = main(["-q", "validate", "performance", "-o", str(out), *SUSTAINED, "--group", "fleet",
                 "--inject", "throttle:factor=3", "--baseline", str(healthy_run)])
    df = results.read_csv(out / "results.csv")
    assert code == 1
    assert df.loc[df["check"] == "mode_slowdown", "status"].tolist() == ["fail"]
    base = results.read_csv(healthy_run / "results.csv")
    busy = [d for d in (base, df) if (d.loc[d["check"] == "host_contention", "status"] != "pass").any()]
    # a figure the host disturbed is never compared: a benchmark run on a busy host proves nothing here
    assert not busy, "the host was too busy for undisturbed steps (host_contention inconclusive): run it on a quiet host"
    row = df[(df["check"] == "fleet_step_time") & (df["metric"] == "median_ms_slowdown")].iloc[0]
    assert row["status"] == "fail" and row["value"] > 2 and "reproduce: mystique validate performance" in row["detail"]


@pytest.mark.parametrize("args, message", [
    (["--baseline", "/no/such/folder"], "no results.csv there"),
    (["--workloads", "resnet"], "unknown workload"),
    (["--duration", "0"], "--duration"),
])
def test_bad_performance_input_exits_2_with_one_line(args, message, tmp_path, capsys):
    code = main(["validate", "performance", "-o", str(tmp_path / "o"), "--group", "sustained", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err


def _fleet_rows(tmp_path: Path, medians: list[float], width: dict[int, float] | None = None) -> list[str]:
    """One results.csv per device; device i's interval is its figure +- ``width.get(i, 1%)``."""
    paths = []
    for i, m in enumerate(medians):
        w = (width or {}).get(i, 0.01)
        ctx = results.RunContext(device="cpu", device_name="Model X", torch_version="t", host=f"h{i:02d}")
        res = results.Results(ctx, "performance")
        res.add("step_time", "dlrm/small/infer", "median_ms", m, status="info", unit="ms", dtype="float32",
                low=m * (1 - w), high=m * (1 + w), detail=f"95% interval [{m * (1 - w):.6g}, {m * (1 + w):.6g}] ms")
        res.add("gemm_throughput", "gemm_1024", "tflops", 1.0 / m, status="info", unit="TFLOP/s", dtype="float32",
                low=(1 - w) / m, high=(1 + w) / m, detail=f"95% interval [{(1 - w) / m:.6g}, {(1 + w) / m:.6g}] TFLOP/s")
        folder = tmp_path / f"dev{i:02d}"
        folder.mkdir()
        results.write_csv(res.frame(), folder / "results.csv")
        paths.append(str(folder))
    return paths


FLEET = [100.0 + (i % 5) * 0.4 for i in range(11)] + [130.0]
VERDICT_COLUMNS = ["subject", "metric", "value", "threshold", "low", "high", "status"]


def test_rewording_the_details_cannot_change_a_fleet_verdict(tmp_path):
    from mystique.validators.performance.summary import summarise

    paths = _fleet_rows(tmp_path, FLEET + [106.0], width={12: 0.06})  # the last: slow, but unsure
    reworded = []
    for p in paths:  # the same rows, every sentence replaced
        (tmp_path / "x" / Path(p).name).mkdir(parents=True)
        results.write_csv(results.read_csv(Path(p) / "results.csv").assign(detail="x"),
                          tmp_path / "x" / Path(p).name / "results.csv")
        reworded.append(str(tmp_path / "x" / Path(p).name))
    plain, other = summarise(paths), summarise(reworded)
    out = plain[plain["check"] == "fleet_outlier"]
    pd.testing.assert_frame_equal(out[VERDICT_COLUMNS].reset_index(drop=True),
                                  other[other["check"] == "fleet_outlier"][VERDICT_COLUMNS].reset_index(drop=True))
    assert set(out.loc[out["subject"].str.contains("@h12/"), "status"]) == {"inconclusive"}  # its interval decides
    assert (out["status"] == "fail").sum() == 2 and out[["low", "high"]].notna().all().all()


def test_a_fleet_of_files_without_interval_columns_reads_no_interval_from_details(tmp_path):
    """A results.csv from before the low and high columns: its figures have no interval, whatever its
    detail says, so no device is flagged with confidence, and each row says why."""
    from mystique.validators.performance.summary import summarise

    paths = _fleet_rows(tmp_path, FLEET)
    for p in paths:  # rewrite each file as the schema before low and high was
        f = Path(p) / "results.csv"
        pd.read_csv(f).drop(columns=["low", "high"]).to_csv(f, index=False)
    out = summarise(paths)
    out = out[out["check"] == "fleet_outlier"]
    assert len(out) == 24 and set(out["status"]) == {"inconclusive"}  # not a point: no interval at all
    assert out["low"].isna().all() and all("no 95% interval recorded" in d for d in out["detail"])


def test_fleet_names_the_outlier_and_states_the_synchronous_slowdown(tmp_path):
    paths = _fleet_rows(tmp_path, FLEET)
    code = main(["-q", "fleet", *paths, "-o", str(tmp_path / "fleet")])
    df = results.read_csv(tmp_path / "fleet" / "results.csv")
    assert code == 1
    out = df[df["check"] == "fleet_outlier"]
    failed = set(out.loc[out["status"] == "fail", "subject"])
    assert {f.split("@")[1].split("/")[0] for f in failed} == {"h11"} and len(failed) == 2  # step time and GEMM
    sync = df[df["check"] == "sync_slowdown"]
    assert set(sync["subject"]) >= {"dlrm/small/infer N=1", "dlrm/small/infer N=100000"}
    big = sync.loc[sync["subject"] == "dlrm/small/infer N=100000", "value"].iloc[0]
    dist = df[(df["check"] == "fleet_distribution") & (df["subject"] == "step_time:dlrm/small/infer")]
    assert big == pytest.approx(130.0 / dist["value"].iloc[0], rel=1e-6)  # the largest of 12 devices, nearly surely
    html = (tmp_path / "fleet" / "report.html").read_text()
    assert html.count("<svg") >= 3 and "synchronous job of N devices" in html


def test_fleet_refuses_a_missing_results_file(tmp_path, capsys):
    code = main(["fleet", str(tmp_path / "none"), "-o", str(tmp_path / "f")])
    assert code == 2 and "no results.csv there" in capsys.readouterr().err


def test_the_report_draws_step_times_and_clocks(healthy_run, tmp_path):
    from mystique.reports import render_report

    html = Path(render_report([str(healthy_run / "results.csv")], str(tmp_path / "r.html"))).read_text()
    assert "Median step time under sustained load" in html
    assert "during the sustained run" in html or "clock_drop" in html


def test_performance_qualifies_by_default_with_its_quick_mode_item():
    from mystique.validators import performance, pytest_plugin

    assert "performance" in pytest_plugin.MARKERS and "performance" in pytest_plugin.DEFAULT_VALIDATORS
    assert performance.qualification_groups("quick") == ["mode"]  # seconds, not the sustained minutes


# -- targets that need time or hardware ---------------------------------------------------------------

@pytest.mark.cuda
def test_gpu_micro_checks_reach_80_percent_of_nominal(tmp_path):
    code = main(["-q", "validate", "performance", "-o", str(tmp_path / "g"), "--device", "cuda", "--group", "micro"])
    df = results.read_csv(tmp_path / "g" / "results.csv")
    assert code in (0, 3)
    frac = df[df["check"] == "fraction_of_nominal"]
    if not len(frac):
        pytest.skip("this GPU has no nominal entry")
    bf16 = frac[(frac["subject"].str.startswith("gemm_throughput")) & (frac["dtype"] == "bfloat16")]["value"]
    mem = frac[frac["subject"].str.startswith("memory_bandwidth")]["value"]
    assert bf16.max() >= 0.8 and mem.max() >= 0.8, frac[["subject", "dtype", "value"]].to_string()


# -- evidence on accelerators (the first H100 runs) ---------------------------------------------------

class _Rows:
    def __init__(self):
        self.rows = []

    def add(self, check, subject, metric, value, **kw):
        self.rows.append({"check": check, "subject": subject, "metric": metric, "value": value, **kw})


class _Ctx:
    def __init__(self, tol=0.1):
        self.settings = {"drift_tolerance": tol}
        self.res = _Rows()


def _decaying(n=600, factor=1.8):
    """Step seconds whose last third is ``factor`` times slower than the first (the H100's dlrm steps)."""
    return [1e-3] * (n // 3) + [1.4e-3] * (n - 2 * (n // 3)) + [factor * 1e-3] * (n // 3)


@pytest.mark.parametrize("busy, status", [(None, "fail"), (0.97, "fail"), (0.30, "info"),
                                          (1 / 1.1 - 0.01, "info"), (1 / 1.1 + 0.01, "fail")])
def test_a_step_the_device_idles_in_has_no_drift_verdict(busy, status):
    """On an H100 the 1 ms dlrm step drifted 1.8x with the GPU busy ~25% and its clocks flat: a step the
    device idles in waits on its host. Below 1/(1+tol) busy a device slowing by tol may not show at all."""
    from mystique.validators.performance.sustained import _drift_row

    ctx = _Ctx()
    _drift_row(ctx, "dlrm/small/infer", _decaying(), 20.0, busy)
    row, = ctx.res.rows
    assert row["status"] == status
    if status == "info":
        assert "waited on its host" in row["detail"] and "clock_drop" in row["detail"]


def test_clock_evidence_names_the_clock_power_and_throttle_reasons():
    from mystique.validators.performance import clocks

    samples = [(0.0, {"sm_clock_mhz": 1980.0, "power_w": 300.0, "temperature_c": 40.0, "throttle_reasons": 0.0}),
               (0.1, {"sm_clock_mhz": 1500.0, "power_w": 690.0, "temperature_c": 50.0, "throttle_reasons": 4.0}),
               (0.2, {"sm_clock_mhz": 1470.0, "power_w": 699.0, "temperature_c": 51.0, "throttle_reasons": 4.0})]
    text = clocks.describe(samples, "NVML")
    assert "SM clock median 1500 MHz (1470-1980)" in text and "power median 690 W" in text
    assert "sw_power_cap" in text and "3 samples, NVML" in text
    assert clocks.throttle_names(samples[:1]) == []
    assert clocks.describe([], "no NVML") == "no clock evidence (no NVML)"


def test_nvml_finds_the_gpu_by_bus_id_and_falls_back_to_the_index(monkeypatch):
    """torch numbers the devices CUDA_VISIBLE_DEVICES leaves, NVML all of them: the bus id is asked first."""
    import sys
    import types

    from mystique.validators.performance import clocks

    asked = []

    class NVMLError(Exception):
        pass

    def by_bus(bus):
        asked.append(("bus", bus))
        if bus == "bad":
            raise NVMLError("not found")
        return "handle-bus"

    def by_index(i):
        asked.append(("index", i))
        return "handle-index"

    fake = types.SimpleNamespace(nvmlInit=lambda: None, NVMLError=NVMLError, nvmlDeviceGetHandleByPciBusId=by_bus,
                                 nvmlDeviceGetHandleByIndex=by_index)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert clocks._Nvml(3, "00000000:19:00.0").handle == "handle-bus"
    assert clocks._Nvml(3, "bad").handle == "handle-index"
    assert clocks._Nvml(3, None).handle == "handle-index"
    assert asked == [("bus", "00000000:19:00.0"), ("bus", "bad"), ("index", 3), ("index", 3)]


# -- clock_drop: every verdict from injected readings (issue 30.5) ------------------------------------

class _Sampler:
    """A clock sampler's outcome, injected: what it read from, whether that source is static, and
    whether sampling failed."""

    def __init__(self, source="sysfs scaling_cur_freq", static="", failure=""):
        self.source, self.static, self.failure = source, static, failure
        self.available = True


def _clocks(values, metric="cpu_mhz"):
    return [(0.25 * i, {metric: v}) for i, v in enumerate(values)]


def _clock_drop(sampler, samples):
    from mystique.validators.performance.sustained import _clock_rows

    ctx = _Ctx()
    _clock_rows(ctx, "dlrm/small/infer", sampler, samples)
    row, = [r for r in ctx.res.rows if r["check"] == "clock_drop"]
    return row


@pytest.mark.parametrize("values, status", [
    ([2000.0] * 9 + [1990.0] * 9 + [1980.0] * 9, "pass"),  # a steady clock
    ([2000.0] * 9 + [1800.0] * 9 + [1500.0] * 9, "fail"),  # 25% down: thermal capping
])
def test_clock_drop_judges_a_live_clock(values, status):
    row = _clock_drop(_Sampler(), _clocks(values))
    assert row["status"] == status and row["threshold"] == pytest.approx(0.9)


def test_a_failed_clock_reading_is_an_error_not_a_pass():
    """A NaN reading (the reader failed) made the ratio NaN, and ``nan < 0.9`` is False: it passed."""
    row = _clock_drop(_Sampler(), _clocks([2000.0] * 9 + [math.nan] * 9))
    assert row["status"] == "error" and "9 of 18 cpu_mhz readings failed" in row["detail"]
    row = _clock_drop(_Sampler(failure="sampling stopped: NVMLError: GPU is lost"),
                      _clocks([1980.0] * 9, "sm_clock_mhz"))
    assert row["status"] == "error" and "GPU is lost" in row["detail"]


def test_a_clock_the_host_cannot_show_moving_is_a_skip(monkeypatch):
    """On a VM without cpufreq the clock is /proc/cpuinfo's constant: the ratio is 1.0 whatever the device
    does, which passed. The sampler says its source is static, and the check skips with that reason."""
    from mystique.validators.performance import clocks

    monkeypatch.setattr(clocks, "cpu_mhz", lambda: (2596.1, clocks.PROC_CPUINFO))
    sampler = clocks.ClockSampler("cpu")
    assert sampler.available and "no cpufreq" in sampler.static
    row = _clock_drop(sampler, _clocks([2596.1] * 27))
    assert row["status"] == "skip" and "no cpufreq" in row["detail"] and row["value"] is None
    monkeypatch.setattr(clocks, "cpu_mhz", lambda: (2000.0, "sysfs scaling_cur_freq"))
    assert clocks.ClockSampler("cpu").static == ""  # cpufreq's current frequency is live


def test_a_cpu_clock_reading_that_fails_mid_run_reads_nan(monkeypatch):
    from mystique.validators.performance import clocks

    monkeypatch.setattr(clocks, "cpu_mhz", lambda: (2000.0, "sysfs scaling_cur_freq"))
    sampler = clocks.ClockSampler("cpu")
    monkeypatch.setattr(clocks, "cpu_mhz", lambda: (None, "no CPU frequency readable"))
    assert math.isnan(sampler._read()["cpu_mhz"])

