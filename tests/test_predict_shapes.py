"""The device profile measured at a step's own GEMM shapes (issue #35): a GEMM's throughput depends on its
``M``, ``N``, ``K`` and layout, not on its FLOPs alone, so ``validate performance --shapes-from CAPTURE``
writes ``gemm_shape`` rows and ``predict`` prices a GEMM of that shape, layout and dtype by its row, by the
curves otherwise (:meth:`mystique.predict.whatif.Profile.gemm_rate`). Synthetic profiles, plans and a fake
clock: no test here depends on this host's speed."""

from __future__ import annotations

import pytest
from hyp import examples
from hypothesis import given
from hypothesis import strategies as st
from test_predict_profile import _profile_csv

from mystique.errors import UsageError
from mystique.predict.graph import OpTiming
from mystique.predict.opmodel import TensorShape, Work, gemm_dims
from mystique.predict.whatif import Profile, op_time, priced_by_shape, read_profile, roofline_us
from mystique.results import Results, RunContext

BERT_FFN = (1, 1024, 8192, 256)  # bert's (1024x256)(256x8192), layout nt
F = 2.0 * 1024 * 8192 * 256


_csv = _profile_csv  # (a results.csv of GEMM rows, as validate performance writes them)


def _ts(shape, dtype="float32", strides=None):
    return TensorShape(tuple(shape), dtype, strides)


# --- a GEMM's product shape ---------------------------------------------------------------------------


@pytest.mark.parametrize("base, ins, out, dims", [
    ("mm", [(1024, 256), (256, 8192)], (1024, 8192), (1, 1024, 8192, 256)),
    ("addmm", [(8192,), (1024, 256), (256, 8192)], (1024, 8192), (1, 1024, 8192, 256)),
    ("linear", [(8, 128, 256), (8192, 256), (8192,)], (8, 128, 8192), (1, 1024, 8192, 256)),  # x folded, W.T
    ("bmm", [(16, 128, 64), (16, 64, 128)], (16, 128, 128), (16, 128, 128, 64)),
    ("matmul", [(8, 128, 256), (256, 64)], (8, 128, 64), (1, 1024, 64, 256)),  # a 2-D right operand folds the left
    ("matmul", [(2, 8, 128, 64), (2, 8, 64, 128)], (2, 8, 128, 128), (16, 128, 128, 64)),
    ("mm", [(1024, 256), (255, 8192)], (1024, 8192), None),  # K does not chain
    ("linear", [(8, 256), (16, 256)], (8, 99), None),  # the output is not M x N
    ("matmul", [(256,), (256, 64)], (64,), None),  # a matrix-vector product
    ("convolution", [(8, 3, 32, 32), (16, 3, 3, 3)], (8, 16, 30, 30), None),
])
def test_a_gemms_dims_are_its_products_batch_m_n_k(base, ins, out, dims):
    assert gemm_dims(base, [_ts(s) for s in ins], [_ts(out)]) == dims


# --- predict prices a GEMM by its shape's row --------------------------------------------------------


def _profile(shape_rows=()):
    """fp32 86 GFLOP/s and bf16 6.4 along the cubes' curves (this host's); the shape rows on top."""
    curves = {(d, lay): ((1e6, v), (1e10, v)) for d, v in (("float32", 0.086), ("bfloat16", 0.0064), ("float16", 0.003))
              for lay in ("nn", "nt", "tn")}
    return Profile("cpu", gemm_curves=curves, gemm_shapes=dict(shape_rows))


def test_a_shape_row_prices_the_gemms_of_its_shape_layout_and_dtype_and_no_others():
    """bert's FFN GEMM measured at its shape (fp32 0.039, bf16 0.0053 TFLOP/s): retargeted to bf16 it takes
    0.039/0.0053 = 7.4x its fp32 work, not the curves' 0.086/0.0064 = 13.4x. The same FLOPs in another layout
    or shape, and another dtype, still read the curves."""
    p = _profile({("float32", "nt", *BERT_FFN): 0.039, ("bfloat16", "nt", *BERT_FFN): 0.0053})
    w32, w16 = Work(F, 0, "float32", "nt", dims=BERT_FFN), Work(F, 0, "bfloat16", "nt", dims=BERT_FFN)
    assert op_time(110.0, 10.0, "gemm", w32, w16, 1, 1, p, p) == pytest.approx(10.0 + 100.0 * 0.039 / 0.0053)
    assert p.gemm_rate(w16) == (0.0053, True)
    curve = 10.0 + 100.0 * 0.086 / 0.0064
    for dims, layout in ((BERT_FFN, "tn"), ((1, 8192, 1024, 256), "nt"), (None, "nt")):
        a, b = Work(F, 0, "float32", layout, dims=dims), Work(F, 0, "bfloat16", layout, dims=dims)
        assert op_time(110.0, 10.0, "gemm", a, b, 1, 1, p, p) == pytest.approx(curve), (dims, layout)
    f16 = Work(F, 0, "float16", "nt", dims=BERT_FFN)
    assert p.gemm_rate(f16) == (pytest.approx(0.003), False)
    # one side measured at its shape and not the other (a --batch-scale GEMM's new shape): both read the curves,
    # whose bias at a shape cancels in the ratio only when both sides carry it
    only16 = _profile({("bfloat16", "nt", *BERT_FFN): 0.0053})
    assert op_time(110.0, 10.0, "gemm", w32, w16, 1, 1, only16, only16) == pytest.approx(curve)
    only32 = _profile({("float32", "nt", *BERT_FFN): 0.039})
    assert op_time(110.0, 10.0, "gemm", w32, w16, 1, 1, only32, only32) == pytest.approx(curve)


shape_dims = st.tuples(st.integers(1, 64), st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096))


@examples(60)
@given(shape_dims, st.sampled_from(["nn", "nt", "tn", "tt"]), st.floats(1e-4, 1.0), st.floats(1e-4, 1.0),
       st.floats(0.0, 50.0))
def test_without_shape_rows_a_gemm_is_priced_as_before_shapes_were_measured(dims, layout, v32, v16, fixed):
    """Law: on a profile without gemm_shape rows a GEMM's predicted time does not depend on its dims being
    known: every GEMM reads the curves at its FLOPs, as before."""
    p = Profile("cpu", gemm_curves={("float32", "nn"): ((1e3, v32), (1e12, v32 * 3)),
                                    ("bfloat16", "nn"): ((1e3, v16), (1e12, v16 / 2))})
    flops = 2.0 * dims[0] * dims[1] * dims[2] * dims[3]
    with_dims = [Work(flops, 0, d, layout, products=dims[0], dims=dims) for d in ("float32", "bfloat16")]
    without = [Work(flops, 0, d, layout, products=dims[0]) for d in ("float32", "bfloat16")]
    assert op_time(100.0 + fixed, fixed, "gemm", *with_dims, 1, 1, p, p) == op_time(100.0 + fixed, fixed, "gemm",
                                                                                    *without, 1, 1, p, p)


def test_the_profile_reads_shape_rows_and_prefers_undisturbed_ones(tmp_path):
    p = read_profile(_csv(tmp_path / "r.csv", [
        ("gemm_shape", "gemm_m1024n8192k256_nt", "bfloat16", 0.0053),
        ("gemm_shape_disturbed", "gemm_m1024n8192k256_nt", "bfloat16", 0.5),
        ("gemm_shape_disturbed", "gemm_b16m128n128k64_tn", "float32", 0.02),
        ("gemm_shape", "gemm_m1024n8192k256", "float32", 9.0)]))  # no layout: not a shape row
    assert p.gemm_shapes == {("bfloat16", "nt", 1, 1024, 8192, 256): 0.0053, ("float32", "tn", 16, 128, 128, 64): 0.02}
    assert p.has_dtype("bfloat16") and not p.has_dtype("float16")


def _timing(cls="gemm", host=100.0):
    return OpTiming(0, "aten::linear", cls, "host:1", host, 0.0)


def test_the_prediction_says_how_many_gemms_and_what_share_its_shape_rows_priced():
    p = _profile({("float32", "nt", *BERT_FFN): 0.039, ("bfloat16", "nt", *BERT_FFN): 0.0053})
    hit = (Work(F, 0, "float32", "nt", dims=BERT_FFN), Work(F, 0, "bfloat16", "nt", dims=BERT_FFN))
    miss = (Work(F, 0, "float32", "tn", dims=BERT_FFN), Work(F, 0, "bfloat16", "tn", dims=BERT_FFN))
    step = type("S", (), {"ops": [_timing(), _timing(), _timing("memory")]})()
    new = [_timing(host=300.0), _timing(host=100.0), _timing("memory")]
    note = priced_by_shape(step, [hit, miss, (Work(0, 8, "float32"), Work(0, 4, "bfloat16"))], new, p, p)
    assert note.startswith("1 of 2 GEMMs (75.0% of their predicted time) priced by their own shapes' gemm_shape rows")
    assert priced_by_shape(step, [hit, miss, hit], new, _profile(), _profile()) == ""  # no rows: as before


def test_a_device_roofline_moves_bytes_at_the_operators_dtype_bandwidth():
    """The roofline of a host step onto a device reads the bandwidth of the operator's dtype, as op_time does:
    2 MB of bf16 at 10 GB/s take 200 us (the fp32 20 GB/s gave 100)."""
    p = Profile("gpu", mem_gbps=20.0, mem_gbps_dtype={"bfloat16": 10.0})
    assert roofline_us("memory", Work(0, 2e6, "bfloat16"), p) == pytest.approx(200.0)
    assert roofline_us("memory", Work(0, 2e6, "float32"), p) == pytest.approx(100.0)


def test_the_report_charts_the_shape_rows(tmp_path):
    from mystique.reports.html import render_html

    from mystique.results import read_csv

    html = render_html(read_csv(_csv(tmp_path / "r.csv", [("gemm_shape", "gemm_m1024n8192k256_nt", "bfloat16", 0.0053)])))
    assert "gemm shape (TFLOP/s)" in html and "gemm_m1024n8192k256_nt" in html


# --- the validator's shape rows -------------------------------------------------------------------------


class _Plan:
    def __init__(self, ops, tensors):
        self.ops, self.tensors = ops, tensors


def _plan(*gemms):
    """A plan of ``aten::mm`` ops ``(M, K, N)`` (fp32, row-major) for read_shapes."""
    ops, tensors = [], []
    for i, (m, k, n) in enumerate(gemms):
        ids = [3 * i, 3 * i + 1, 3 * i + 2]
        for tid, (r, c) in zip(ids, ((m, k), (k, n), (m, n))):
            tensors.append({"id": tid, "shape": [r, c], "strides": [c, 1], "dtype": "float32"})
        ops.append({"index": i, "name": "aten::mm", "args": [{"t": ids[0]}, {"t": ids[1]}], "outputs": [{"t": ids[2]}]})
    return _Plan(ops, tensors)


def test_the_steps_shapes_are_read_distinct_most_flops_first(monkeypatch):
    from mystique.validators.performance.shapes import read_shapes

    from mystique.replay import plan as plan_mod

    plans = {"a": _plan((64, 64, 64), (1024, 256, 8192), (64, 64, 64)), "b": _plan((64, 64, 64), (8, 8, 8))}
    monkeypatch.setattr(plan_mod, "plan_from_path", lambda p: (plans[str(p)], "trace"))
    got = read_shapes(["a", "b"])
    assert [(s.subject, s.count, s.seen_in) for s in got] == [("gemm_m1024n8192k256_nn", 1, "a"),
                                                               ("gemm_m64n64k64_nn", 3, "a"), ("gemm_m8n8k8_nn", 1, "b")]


@pytest.mark.parametrize("dims", [(2**31, 4, 4), (2**20, 2**20, 4)])
def test_an_absurd_shape_in_a_trace_is_refused_in_one_line(monkeypatch, dims):
    """A dimension no BLAS takes (2^31), or an operand no device holds (2^40 elements), is refused naming the
    file and the op, before anything is measured."""
    from mystique.validators.performance.shapes import read_shapes

    from mystique.replay import plan as plan_mod

    monkeypatch.setattr(plan_mod, "plan_from_path", lambda p: (_plan((8, 8, 8), dims), "trace"))
    with pytest.raises(UsageError, match=r"--shapes-from evil: aten::mm \(op 1\) has an absurd GEMM shape") as e:
        read_shapes(["evil"])
    assert "\n" not in str(e.value)


def _ctx(settings):
    from mystique.validators.performance import LEVELS, PerformanceContext

    from mystique.progress import Progress
    from mystique.targets import make_target

    target = make_target("cpu")
    res = Results(RunContext.for_target(target), "performance")
    s = {**LEVELS["quick"], "micro_budget_s": 4.0, "min_reps": 4, **settings}
    return PerformanceContext(target=target, res=res, seed=0, level="quick", progress=Progress("t"), settings=s,
                              device_name="cpu"), res


def test_each_shape_is_measured_in_each_dtype_until_the_budget_is_spent(fake_clock, monkeypatch):
    """GEMMs that "take" 1e-10 s a FLOP in fp32 and 1e-9 in bf16 on the fake clock, 4 calls and 1 s a point, a
    9 s budget: the 1 GFLOP shape runs in both dtypes (bf16: a 1 s first call and 4 more, 6.1 s spent in all),
    the 0.5 GFLOP one in fp32 (7.2 s), not in bf16: its 5 calls foreseen at the slowest bf16 rate, 2.5 s, are
    over the 1.8 s left, so it is a skip row, unrun. The rows' rates are the fake clock's, 0.01 and 0.001 TFLOP/s."""
    import torch
    from mystique.validators.performance import shapes as S

    ran = []

    def fake(dtype, layout, dims, device, seed):
        shape = S.GemmShape(layout, dims, 1, 0.0, "")

        def fn():
            ran.append((shape.subject, dtype))
            fake_clock.advance((1e-10 if dtype == torch.float32 else 1e-9) * shape.flops)
        return fn

    monkeypatch.setattr(S, "layout_gemm", fake)
    big, small = S.GemmShape("nt", (1, 1000, 500, 1000), 2, 2e9, "cap"), S.GemmShape("nn", (1, 500, 500, 1000), 1, 5e8, "cap")
    ctx, res = _ctx({"gemm_shapes": [big, small], "shape_budget_s": 9.0})
    S.run_gemm_shapes(ctx, [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
    df = res.frame()
    info = df[df.status == "info"]
    assert sorted(zip(info.subject, info.dtype, info.value)) == [
        (big.subject, "bfloat16", pytest.approx(0.001)), (big.subject, "float32", pytest.approx(0.01)),
        (small.subject, "float32", pytest.approx(0.01))]
    assert set(info.check) == {"gemm_shape"}
    skip = df[df.status == "skip"]
    assert list(zip(skip.subject, skip.dtype)) == [(small.subject, "bfloat16")] and "shape budget" in skip.detail.iloc[0]
    assert (small.subject, torch.bfloat16) not in ran


def test_shapes_over_the_count_or_memory_cap_are_skip_rows(fake_clock, monkeypatch):
    import torch
    from mystique.validators.performance import shapes as S

    monkeypatch.setattr(S, "layout_gemm", lambda dtype, layout, dims, device, seed: lambda: fake_clock.advance(1e-3))
    shapes = [S.GemmShape("nn", (1, 8, 8, 8), 1, 1e3 - i, "cap") for i in range(3)]
    huge = S.GemmShape("nn", (1, 2**15, 2**15, 2**15), 1, 1e15, "cap")  # 12 GiB of fp32 operands
    ctx, res = _ctx({"gemm_shapes": [huge, *shapes], "shape_max": 3, "shape_max_bytes_cpu": 2 << 30})
    S.run_gemm_shapes(ctx, [("float32", torch.float32)])
    df = res.frame()
    skip = df[df.status == "skip"]
    assert list(skip.subject) == ["1 shapes", huge.subject] and "GiB" in skip.detail.iloc[1]
    assert len(df[df.status == "info"]) == 2


# --- the CLI ---------------------------------------------------------------------------------------------


def test_shapes_from_reaches_the_micro_group_and_a_bad_path_is_exit_2(tmp_path, cli_run, monkeypatch):
    from mystique.validators import performance

    from mystique.replay import plan as plan_mod

    seen = []
    monkeypatch.setitem(performance.RUNNERS, "micro", lambda ctx: seen.append(ctx.settings["gemm_shapes"]))
    monkeypatch.setattr(plan_mod, "plan_from_path", lambda p: (_plan((64, 32, 16)), "trace"))
    code, out, err = cli_run("validate", "performance", "--device", "cpu", "--group", "micro", "--shapes-from", "A",
                             "--shapes-from", "B", "-o", str(tmp_path / "ok"))
    assert code in (0, 3), (out, err)
    assert [(s.subject, s.count) for s in seen[0]] == [("gemm_m64n16k32_nn", 2)]
    monkeypatch.undo()
    (tmp_path / "junk").write_bytes(b"\x00 not a trace")
    for bad in (str(tmp_path / "missing"), str(tmp_path / "junk")):
        code, out, err = cli_run("validate", "performance", "--device", "cpu", "--group", "micro", "--shapes-from", bad,
                                 "-o", str(tmp_path / "o"), "--force")
        assert code == 2 and err.count("\n") == 1 and "--shapes-from" in err and "Traceback" not in err, (bad, out, err)
