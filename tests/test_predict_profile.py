"""The device profile's GEMM throughput across sizes and layouts (issue #35): where a dtype has no native
kernel (bf16 on a CPU without AVX512-BF16) a GEMM's throughput moves 2-15x with its size and layout, so
one figure per dtype mispredicted a bf16 step 4x. ``validate performance`` samples a curve per dtype and
layout (``gemm_curve`` rows) and ``predict`` reads each GEMM's throughput off it, interpolated in log
FLOPs (:func:`mystique.predict.whatif.interpolate`). Synthetic profiles and a fake clock: no test here
depends on this host's speed."""

from __future__ import annotations

import math

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st

from mystique.errors import UsageError
from mystique.predict.opmodel import TensorShape, Work, gemm_layout, op_work
from mystique.predict.whatif import Profile, interpolate, op_time, read_profile
from mystique.results import Results, RunContext, write_csv


def _profile_csv(path, rows):
    """A results.csv of ``(check, subject, dtype, TFLOP/s)`` GEMM rows, as ``validate performance`` writes them."""
    res = Results(RunContext(device="cpu", device_name="Some CPU", torch_version="2"), "performance")
    for check, subject, dtype, v in rows:
        res.add(check, subject, "tflops", v, status="info", unit="TFLOP/s", dtype=dtype)
    res.add("memory_bandwidth", "copy", "gbps", 20.0, status="info", unit="GB/s", dtype="float32")
    write_csv(res.frame(), path)
    return path


def _f(n):
    return 2.0 * n**3


# --- the curve ----------------------------------------------------------------------------------------


def test_a_single_size_profile_is_one_throughput_per_dtype_as_before(tmp_path):
    """An old profile (one gemm_throughput row per dtype) reads as before sizes were sampled: each dtype's
    one figure at every size, and a retargeted GEMM's work scales by the ratio of the two figures."""
    p = read_profile(_profile_csv(tmp_path / "r.csv", [("gemm_throughput", "gemm_1024", "float32", 0.2),
                                                       ("gemm_throughput", "gemm_256", "bfloat16", 0.05)]))
    for flops in (1e3, _f(256), _f(1024), 1e15):
        assert p.tflops_at("float32", "nt", flops) == 0.2 and p.tflops_at("bfloat16", "tn", flops) == 0.05
    w32, w16 = Work(_f(64), 0, "float32", "nn"), Work(_f(64), 0, "bfloat16", "nn")
    assert op_time(110.0, 10.0, "gemm", w32, w16, 1, 1, p, p) == pytest.approx(10.0 + 100.0 * 0.2 / 0.05)


def test_a_small_gemm_takes_the_small_sizes_throughput_and_a_large_one_the_large():
    """bf16 measured at 0.001 TFLOP/s at n=64 and 0.01 at n=1024 (fp32: 0.1 at both): retargeting a 64^3 GEMM
    to bf16 multiplies its work by 100, a 1024^3 one by 10. With one figure per dtype (the best, 0.01) the
    small one was predicted 10x too fast."""
    curve = {("float32", "nn"): ((_f(64), 0.1), (_f(1024), 0.1)), ("bfloat16", "nn"): ((_f(64), 0.001), (_f(1024), 0.01))}
    p = Profile("cpu", {"float32": 0.1, "bfloat16": 0.01}, gemm_curves=curve)
    for n, slower in ((64, 100.0), (1024, 10.0)):
        w0, w1 = Work(_f(n), 0, "float32", "nn"), Work(_f(n), 0, "bfloat16", "nn")
        assert op_time(100.0, 0.0, "gemm", w0, w1, 1, 1, p, p) == pytest.approx(100.0 * slower)
    # halfway in log FLOPs (n=256): the geometric mean of the two throughputs, sqrt(0.001 * 0.01)
    assert p.tflops_at("bfloat16", "nn", _f(256)) == pytest.approx(math.sqrt(0.001 * 0.01))


def test_a_gemm_reads_its_own_layouts_curve_and_nn_where_its_layout_was_not_sampled():
    curve = {("bfloat16", "nn"): ((_f(256), 0.001),), ("bfloat16", "tn"): ((_f(256), 0.012),)}
    p = Profile("cpu", gemm_curves=curve)
    assert p.tflops_at("bfloat16", "tn", _f(256)) == 0.012
    assert p.tflops_at("bfloat16", "nt", _f(256)) == 0.001 and p.tflops_at("bfloat16", "", 1.0) == 0.001
    assert p.tflops_at("float16", "nn", 1.0) is None


def test_the_profile_reads_curve_rows_and_prefers_undisturbed_points(tmp_path):
    p = read_profile(_profile_csv(tmp_path / "r.csv", [
        ("gemm_throughput", "gemm_256", "bfloat16", 0.002), ("gemm_curve", "gemm_64_nn", "bfloat16", 0.004),
        ("gemm_curve", "gemm_64_tn", "bfloat16", 0.01), ("gemm_curve_disturbed", "gemm_64_tn", "bfloat16", 0.5),
        ("gemm_curve_disturbed", "gemm_128_tn", "bfloat16", 0.02), ("gemm_throughput", "aten::mm 4096", "float32", 1.0)]))
    assert p.gemm_curves[("bfloat16", "nn")] == ((_f(64), 0.004), (_f(256), 0.002))
    # the busy host's point at 64 gives way to the undisturbed one; at 128 it is all there is
    assert p.gemm_curves[("bfloat16", "tn")] == ((_f(64), 0.01), (_f(128), 0.02))
    assert p.tflops_at("float32", "nn", 1.0) == 1.0  # a row without a size: one figure, as before


curves = st.lists(st.tuples(st.floats(1e3, 1e13), st.floats(1e-5, 1e3)), min_size=1, max_size=6,
                  unique_by=lambda t: round(math.log(t[0]), 3)).map(lambda xs: tuple(sorted(xs)))


@examples(100)
@given(curves, st.floats(1e2, 1e14))
def test_interpolation_is_exact_at_the_samples_bounded_by_its_neighbours_and_clamped(points, flops):
    """Laws: the curve goes through every sampled point; between two it stays within their throughputs;
    outside them it is the nearest end's."""
    for f, v in points:
        assert interpolate(points, f) == pytest.approx(v, rel=1e-9)
    got = interpolate(points, flops)
    below = [v for f, v in points if f <= flops]
    above = [v for f, v in points if f >= flops]
    if not below:
        assert got == points[0][1]
    elif not above:
        assert got == points[-1][1]
    else:
        lo, hi = sorted((below[-1], above[0]))
        assert lo * (1 - 1e-9) <= got <= hi * (1 + 1e-9)


@examples(60)
@given(st.floats(0.0, 1.0), st.floats(1e-4, 1.0), st.lists(st.floats(1e4, 1e12), min_size=2, max_size=5,
                                                             unique=True), st.floats(0, 1))
def test_a_power_law_gemm_is_reproduced_between_its_samples(a, c, fs, where):
    """Law: when a GEMM's time is ``t = c F^a`` (a = 0: a fixed cost; a = 1: a fixed throughput), its
    throughput ``F / t`` is recovered exactly anywhere between the sampled sizes."""
    fs = sorted(fs)
    points = tuple((f, f / (c * f**a)) for f in fs)
    f = math.exp(math.log(fs[0]) + where * (math.log(fs[-1]) - math.log(fs[0])))
    assert interpolate(points, f) == pytest.approx(f / (c * f**a), rel=1e-9)


@examples(60)
@given(curves, st.floats(0.01, 100.0), st.floats(1e3, 1e13))
def test_a_target_k_times_faster_at_every_size_takes_one_kth_of_the_gemm_work(points, k, flops):
    """Law: scaling the target's throughput curve by k divides a GEMM's predicted work by k (its fixed part
    stays), at any size."""
    base = Profile("a", gemm_curves={("float32", "nn"): points})
    fast = Profile("b", gemm_curves={("float32", "nn"): tuple((f, v * k) for f, v in points)})
    w = Work(flops, 0, "float32", "nn")
    slow_t = op_time(1000.0, 10.0, "gemm", w, w, 1, 1, base, base)
    fast_t = op_time(1000.0, 10.0, "gemm", w, w, 1, 1, base, fast)
    assert fast_t - 10.0 == pytest.approx((slow_t - 10.0) / k, rel=1e-9)


# --- layouts ------------------------------------------------------------------------------------------


def _op(name, *shapes_strides):
    tensors = {i: {"id": i, "shape": list(s), "strides": list(st_), "dtype": "float32"}
               for i, (s, st_) in enumerate(shapes_strides)}
    n = len(shapes_strides)
    return {"name": name, "args": [{"t": i} for i in range(n - 1)], "outputs": [{"t": n - 1}]}, tensors


@pytest.mark.parametrize("name, a, b, layout", [
    ("aten::mm", ((8, 4), (4, 1)), ((4, 6), (6, 1)), "nn"),
    ("aten::mm", ((8, 4), (1, 8)), ((4, 6), (6, 1)), "tn"),  # dY.T @ x: a weight's gradient
    ("aten::mm", ((8, 4), (4, 1)), ((4, 6), (1, 4)), "nt"),
    ("aten::linear", ((2, 8, 4), (32, 4, 1)), ((6, 4), (4, 1)), "nt"),  # x @ W.T with W row-major
    ("aten::linear", ((8, 4), (4, 1)), ((6, 4), (1, 6)), "nn"),  # W column-major: W.T is row-major
    ("aten::bmm", ((3, 8, 4), (32, 1, 8)), ((3, 4, 6), (24, 6, 1)), "tn"),
    ("aten::mm", ((1, 4), (1, 1)), ((4, 6), (6, 1)), "nn"),  # one row: either order
])
def test_a_gemms_layout_follows_its_operands_strides(name, a, b, layout):
    out = ((a[0][-2] if name != "aten::linear" else a[0][-2], 6), (6, 1))
    op, tensors = _op(name, a, b, out)
    assert op_work(op, tensors).layout == layout
    assert gemm_layout(name.split("::")[1], [TensorShape(a[0], "float32", a[1]), TensorShape(b[0], "float32", b[1])]) == layout


# --- the validator's curve rows -----------------------------------------------------------------------


def test_the_sweep_measures_each_size_and_layout_and_skips_what_would_exceed_its_budget(fake_clock, monkeypatch):
    """A GEMM that "takes" 1e-9 n^3 s on the fake clock: at 1 s per point over 4 calls (0.25 s a call)
    the sizes 64..512 fit (0.13 s at 512); 1024 (1.07 s) is predicted from 512 and skipped unrun."""
    from mystique.validators.performance import LEVELS, PerformanceContext, curve

    from mystique.progress import Progress
    from mystique.targets import make_target

    ran = []

    def fake_gemm(dtype, layout, dims, device, seed):
        n = dims[1]  # (1, n, n, n)

        def fn():
            ran.append((n, layout))
            fake_clock.advance(1e-9 * n**3)
        return fn

    monkeypatch.setattr(curve, "layout_gemm", fake_gemm)
    target = make_target("cpu")
    res = Results(RunContext.for_target(target), "performance")
    s = {**LEVELS["quick"], "micro_budget_s": 4.0, "min_reps": 4, "gemm_sizes_cpu": (64, 128, 256, 512, 1024)}
    ctx = PerformanceContext(target=target, res=res, seed=0, level="quick", progress=Progress("t"), settings=s,
                             device_name="cpu")
    curve.run_gemm_curve(ctx, "float32", None, 1024, 1024)
    df = res.frame()
    measured = df[df["status"] == "info"]
    assert set(zip(measured["subject"], measured["dtype"])) == {(f"gemm_{n}_{lay}", "float32") for n in (64, 128, 256, 512)
                                                                 for lay in ("nn", "nt", "tn")}
    for r in measured.itertuples():  # 2n^3 flops in 1e-9 n^3 s: 2e9 flop/s whatever n
        assert r.value == pytest.approx(2e9 / 1e12) and r.check == "gemm_curve"
    skipped = df[df["status"] == "skip"]
    assert sorted(skipped["subject"]) == ["gemm_1024_nt", "gemm_1024_tn"]  # nn at 1024 is gemm_throughput's
    assert all("clamps at the largest size" in d for d in skipped["detail"]) and (1024, "nt") not in ran


def test_a_profile_without_the_dtype_a_gemm_needs_is_refused_in_one_line(tmp_path):
    from mystique.predict.whatif import check_dtypes

    p = read_profile(_profile_csv(tmp_path / "r.csv", [("gemm_throughput", "gemm_1024", "float32", 0.2)]))
    pairs = [(Work(1e9, 0, "float32", "nn"), Work(1e9, 0, "bfloat16", "nn"))]
    with pytest.raises(UsageError, match=r"no GEMM throughput for bfloat16") as e:
        check_dtypes(pairs, p, p)
    assert "\n" not in str(e.value) and "r.csv" in str(e.value)
    check_dtypes([(pairs[0][0], pairs[0][0])], p, p)  # fp32 to fp32 needs only fp32


# --- attention and batched GEMMs ----------------------------------------------------------------------


def test_attention_reads_its_own_curves_and_the_gemms_where_the_profile_has_none(tmp_path):
    """bf16 attention on a CPU without native bf16: its forward as fast as fp32's, its backward 6x slower,
    its GEMMs 50x. The attention rows price it; an older profile without them prices it as a GEMM."""
    rows = [("gemm_throughput", "gemm_256", "float32", 0.08), ("gemm_throughput", "gemm_256", "bfloat16", 0.0016)]
    old = read_profile(_profile_csv(tmp_path / "old.csv", rows))
    new = read_profile(_profile_csv(tmp_path / "new.csv", rows + [
        ("attention_curve", "sdpa_fwd_b1h8l128d64", "float32", 0.05), ("attention_curve", "sdpa_fwd_b1h8l128d64", "bfloat16", 0.05),
        ("attention_curve", "sdpa_bwd_b1h8l128d64", "float32", 0.03), ("attention_curve", "sdpa_bwd_b1h8l128d64", "bfloat16", 0.005)]))
    assert new.gemm_curves[("bfloat16", "sdpa_bwd")] == ((8.0 * 8 * 128 * 128 * 64, 0.005),)
    fwd32, fwd16 = Work(3.4e7, 0, "float32", "sdpa"), Work(3.4e7, 0, "bfloat16", "sdpa")
    bwd32, bwd16 = Work(6.7e7, 0, "float32", "sdpa_bwd"), Work(6.7e7, 0, "bfloat16", "sdpa_bwd")
    assert op_time(100.0, 0.0, "attention", fwd32, fwd16, 1, 1, new, new) == pytest.approx(100.0)
    assert op_time(100.0, 0.0, "attention", bwd32, bwd16, 1, 1, new, new) == pytest.approx(600.0)
    assert op_time(100.0, 0.0, "attention", bwd32, bwd16, 1, 1, old, old) == pytest.approx(5000.0)
    # a backward without rows of its own reads the forward's
    fwd_only = Profile("p", gemm_curves={("bfloat16", "sdpa"): ((1.0, 0.05),), ("bfloat16", "nn"): ((1.0, 0.001),)})
    assert fwd_only.tflops_at("bfloat16", "sdpa_bwd", 1e9) == 0.05


def test_a_batched_gemm_is_priced_at_the_size_of_one_product():
    """dlrm's interaction bmm, 4096 products of 64x9x9 (10 kFLOP each, 42 MFLOP in all): its throughput is a
    10 kFLOP GEMM's (the curve's small end), not a 42 MFLOP one's."""
    op, tensors = _op("aten::bmm", ((4096, 64, 9), (576, 9, 1)), ((4096, 9, 9), (81, 9, 1)), ((4096, 64, 9), (576, 9, 1)))
    w = op_work(op, tensors)
    assert (w.products, w.flops) == (4096, 2.0 * 4096 * 64 * 9 * 9) and w.unit_flops == 2.0 * 64 * 9 * 9
    p = Profile("p", gemm_curves={("float32", "nn"): ((1e3, 0.001), (2e4, 0.001), (1e8, 0.1))})
    fast = Profile("q", gemm_curves={("float32", "nn"): ((1e3, 0.002), (2e4, 0.002), (1e8, 0.1))})
    assert op_time(100.0, 0.0, "gemm", w, w, 1, 1, p, fast) == pytest.approx(50.0)  # the small end doubled
    # read at its 42 MFLOP in all it would have been nearly unchanged
    whole = Work(w.flops, 0, "float32", "nn")
    assert op_time(100.0, 0.0, "gemm", whole, whole, 1, 1, p, fast) > 85.0
    mm, t2 = _op("aten::mm", ((256, 64), (64, 1)), ((64, 9), (9, 1)), ((256, 9), (9, 1)))
    assert op_work(mm, t2).products == 1


def test_a_memory_bound_op_moves_its_bytes_at_its_dtypes_bandwidth(tmp_path):
    """A triad at 20 GB/s in fp32 and 10 GB/s in bf16 (the same elements per second: each converted on a
    device without bf16 arithmetic): an op whose 100 us are all bytes takes as long in bf16, half its bytes at
    half the bandwidth. A profile without the bf16 triad predicts half, as before."""
    res = Results(RunContext(device="cpu", device_name="Some CPU", torch_version="2"), "performance")
    res.add("memory_bandwidth", "triad", "gbps", 20.0, status="info", unit="GB/s", dtype="float32")
    res.add("memory_bandwidth", "triad", "gbps", 10.0, status="info", unit="GB/s", dtype="bfloat16")
    write_csv(res.frame(), tmp_path / "r.csv")
    p = read_profile(tmp_path / "r.csv")
    assert (p.mem_gbps, p.bandwidth("bfloat16"), p.bandwidth("float16")) == (20.0, 10.0, 20.0)
    w0, w1 = Work(0, 2e6, "float32"), Work(0, 1e6, "bfloat16")  # 2 MB at 20 GB/s: 100 us
    assert op_time(100.0, 0.0, "memory", w0, w1, 10, 10, p, p) == pytest.approx(100.0)
    old = Profile("p", mem_gbps=20.0)
    assert op_time(100.0, 0.0, "memory", w0, w1, 10, 10, old, old) == pytest.approx(50.0)


def test_the_report_charts_the_curves(tmp_path):
    from mystique.reports.html import render_html

    from mystique.results import read_csv

    path = _profile_csv(tmp_path / "r.csv", [("gemm_curve", "gemm_64_tn", "bfloat16", 0.01),
                                             ("attention_curve", "sdpa_bwd_b1h8l128d64", "bfloat16", 0.005)])
    html = render_html(read_csv(path))
    assert "gemm curve (TFLOP/s)" in html and "attention curve (TFLOP/s)" in html and "sdpa_bwd_b1h8l128d64" in html
