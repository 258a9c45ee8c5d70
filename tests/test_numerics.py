"""The numerics validator: healthy CPU passes, simulated broken devices fail, bounds behave."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mystique.validators import numerics
from mystique.validators.numerics import _fp, testing
from mystique.validators.numerics.accumulation import mantissa_bits, probe_rows
from mystique.validators.numerics.benchmark_shapes import benchmark_gemm_shapes
from mystique.validators.numerics.conversions import conversion_cases
from mystique.validators.numerics.op_cases import seq_matmul
from torch.utils._python_dispatch import TorchDispatchMode

from mystique.errors import UsageError
from mystique.results import COLUMNS
from mystique.targets import Target

FAST_OPS = "mm,exp,sum"


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


def _failing(df, check=None):
    f = df[df["status"] != "pass"]
    return f if check is None else f[f["check"] == check]


def test_groups_name_every_group_and_reject_unknown():
    assert numerics.groups("quick") == list(numerics.GROUPS)
    assert {"conversions", "special_values", "op_sweep", "accumulation", "model_deviation",
            "repeatability", "moe_router_flips"} == set(numerics.groups("full"))
    with pytest.raises(UsageError):
        numerics.groups("medium")
    with pytest.raises(UsageError):
        numerics.run(Target("cpu"), groups=["nope"])
    with pytest.raises(UsageError):
        numerics.run(Target("cpu"), groups=["op_sweep"], ops="mm,not_an_op")
    with pytest.raises(UsageError):
        numerics.run(Target("cpu"), groups=["accumulation"], dtypes="int8")


def test_healthy_cpu_passes_conversions_and_special_values():
    df = numerics.run(Target("cpu"), groups=["conversions", "special_values"])
    assert list(df.columns) == list(COLUMNS)
    assert set(df["suite"]) == {"numerics"}
    assert _failing(df).empty, _failing(df)[["check", "subject", "detail"]].to_string()
    # exhaustive: every 16-bit pattern, every tie and both neighbours, for both dtypes
    exact = df[(df["check"] == "conversion_exact")]
    assert set(exact["dtype"]) == {"bfloat16", "float16"}
    assert all("65536 inputs" in d for d in exact["detail"])
    subn = df[df["check"] == "subnormals"]
    assert set(subn["dtype"]) == {"bfloat16", "float16", "float32"} and (subn["value"] == 1).all()


@pytest.mark.parametrize("seed", range(10))
def test_healthy_cpu_passes_fast_groups_over_seeds(seed):
    df = numerics.run(Target("cpu"), groups=["accumulation", "op_sweep"], seed=seed, ops=FAST_OPS,
                      dtypes="bfloat16,float16,float32")
    assert len(df) > 20
    assert _failing(df).empty, _failing(df)[["check", "subject", "dtype", "detail"]].to_string()


@pytest.mark.parametrize("seed", range(3))
def test_healthy_cpu_passes_every_reduction_bound(seed):
    """The order-independent reduction bounds (numerics.bounds) admit the CPU's own kernels in every dtype."""
    df = numerics.run(Target("cpu"), groups=["op_sweep"], seed=seed,
                      ops="sum,mean,cumsum,softmax,log_softmax,layer_norm,rms_norm,cross_entropy,embedding_bag")
    assert len(df) == 30
    assert _failing(df).empty, _failing(df)[["check", "subject", "dtype", "detail"]].to_string()
    # and stay tight where the kernels accumulate in fp32: at most ~2 roundings to bf16/fp16 (a result a few
    # units of roundoff off fails); only cumsum, whose legal CUDA kernel keeps bf16/fp16 partial sums, is looser
    low = df[(df["dtype"] != "float32") & (df["subject"] != "cumsum/rows_1024")]
    u = low["dtype"].map({"bfloat16": 2.0**-8, "float16": 2.0**-11})
    assert ((low["threshold"] <= 2.5 * u) & (low["threshold"] >= u)).all(), low[["subject", "dtype", "threshold"]]


def test_round_toward_zero_conversions_fail_with_examples():
    target = Target("cpu", testing.round_toward_zero, "rtz")
    df = numerics.run(target, groups=["conversions"], seed=3)
    bad = _failing(df)
    assert {"conversion_round_nearest_even", "conversion_near_tie"} <= set(bad["check"])
    assert set(bad["dtype"]) == {"bfloat16", "float16"}
    assert all("seed=3" in d and "first mismatches" in d for d in bad["detail"])
    # exactly representable values still convert exactly under truncation
    assert not (_failing(df, "conversion_exact")).shape[0]


def test_bf16_accumulating_gemm_fails_probe_and_bounds():
    target = Target("cpu", testing.bf16_accumulation, "bf16acc")
    df = numerics.run(target, groups=["accumulation", "op_sweep"], ops="mm", dtypes="bfloat16", seed=5)
    probe = df[(df["check"] == "accumulator_precision") & (df["subject"] == "mm")]
    assert probe["status"].tolist() == ["fail"] and probe["value"].iloc[0] == 8
    cw = df[(df["check"] == "componentwise_error") & (df["subject"] == "mm/positive_k1024")]
    assert cw["status"].tolist() == ["fail"]
    assert "seed=5" in cw["detail"].iloc[0] and "32x1024,1024x32" in cw["detail"].iloc[0]
    # sum is untouched by this mode and keeps its fp32 accumulator
    s = df[(df["check"] == "accumulator_precision") & (df["subject"] == "sum")]
    assert s["status"].tolist() == ["pass"]


class _SequentialHalfSum(TorchDispatchMode):
    """bf16/fp16 ``sum`` over the last dim added term by term in the dtype (every partial sum rounded)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        x = args[0] if args else None
        if func is torch.ops.aten.sum.dim_IntList and isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16,
                                                                                                   torch.float16):
            acc = torch.zeros(x.shape[:-1], dtype=x.dtype)
            for j in range(x.shape[-1]):
                acc = acc + x[..., j]
            return acc
        return func(*args, **(kwargs or {}))


def test_order_dependence_beyond_the_fp32_accumulation_bound_fails():
    """Issue 30.4: order_dependence was a fact that always passed. Two summation orders of one sum each lie
    within the fp32-accumulation bound b of the exact result, so they differ by at most 2b: low-precision
    partial sums (a bf16 GEMM accumulator, a sum kept in the dtype) change with the order far beyond that."""
    df = numerics.run(Target("cpu", testing.bf16_accumulation, "bf16acc"), groups=["accumulation"], seed=1)
    order = df[df["check"] == "order_dependence"].set_index(["subject", "dtype"])
    assert order.loc[("mm", "bfloat16"), "status"] == "fail" and order.loc[("mm", "bfloat16"), "value"] > 1
    assert order.loc[("mm", "bfloat16"), "threshold"] == 1.0 and "seed=1" in order.loc[("mm", "bfloat16"), "detail"]
    assert order.loc[("sum", "bfloat16"), "status"] == "pass"  # the mode leaves sum alone
    df = numerics.run(Target("cpu", _SequentialHalfSum, "seqsum"), groups=["accumulation"], seed=1)
    order = df[df["check"] == "order_dependence"].set_index(["subject", "dtype"])
    assert order.loc[("sum", "bfloat16"), "status"] == "fail" and order.loc[("sum", "float16"), "status"] == "fail"
    assert (order.xs("mm", level="subject")["status"] == "pass").all()


def test_a_fact_states_its_own_verdict():
    """Issue 30.4: ``Ctx.fact`` defaulted ``ok`` to True, so a fact nobody judged passed."""
    import inspect

    from mystique.validators.numerics._ctx import Ctx

    assert inspect.signature(Ctx.fact).parameters["ok"].default is inspect.Parameter.empty


_NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"


class _Raises(TorchDispatchMode):
    """The device raises ``error`` from every call of the op named ``op``."""

    op, error = "exp", RuntimeError(_NO_KERNEL_IMAGE)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == self.op:
            raise self.error
        return func(*args, **(kwargs or {}))


def _raising(op: str, error: BaseException) -> type:
    return type("Raising", (_Raises,), {"op": op, "error": error})


@pytest.mark.parametrize("error, status", [
    (RuntimeError(_NO_KERNEL_IMAGE), "error"),  # a broken CUDA install, not a missing operator
    (RuntimeError("exp: operation not supported"), "error"),
    (NotImplementedError("the backend gave up"), "error"),
    (NotImplementedError("\"exp_vml_cpu\" not implemented for 'BFloat16'"), "skip"),
    (NotImplementedError("Could not run 'aten::exp' with arguments from the 'PrivateUse1' backend. This could be "
                         "because the operator doesn't exist for this backend"), "skip"),
])
def test_only_torchs_not_implemented_is_a_skip_in_the_op_sweep(error, status):
    """Issue 30.13: any error text with "not supported" or "no kernel image" was a skip."""
    df = numerics.run(Target("cpu", _raising("exp", error), "raising"), groups=["op_sweep"], ops="exp",
                      dtypes="bfloat16")
    rows = df[df["subject"].str.startswith("exp/")]
    assert len(rows) and set(rows["status"]) == {status}, rows[["check", "subject", "status", "detail"]]


def test_a_special_value_case_that_raises_is_an_error_not_an_unsupported_case():
    """Issue 30.13: a special-value case that raised anything was "unsupported on device" and the row passed."""
    df = numerics.run(Target("cpu", _raising("maximum", RuntimeError(_NO_KERNEL_IMAGE)), "raising"),
                      groups=["special_values"], dtypes="float16")
    nan = df[df["check"] == "nan_propagation"]
    assert nan["status"].tolist() == ["error"] and "no kernel image" in nan["detail"].iloc[0]
    assert "case=maximum" in nan["detail"].iloc[0]
    assert set(df.loc[df["check"] != "nan_propagation", "status"]) == {"pass"}  # the other checks never call it
    missing = "\"maximum_cpu\" not implemented for 'Half'"
    df = numerics.run(Target("cpu", _raising("maximum", NotImplementedError(missing)), "no_max"),
                      groups=["special_values"], dtypes="float16")
    nan = df[df["check"] == "nan_propagation"].iloc[0]
    assert nan["status"] == "pass" and "unsupported on device: maximum" in nan["detail"]


def test_flushing_fp16_subnormals_fails_only_fp16():
    target = Target("cpu", testing.flush_fp16_subnormals, "ftz")
    df = numerics.run(target, groups=["conversions", "special_values"])
    bad = _failing(df)
    assert set(bad["dtype"]) == {"float16"}
    sub = df[(df["check"] == "subnormals") & (df["dtype"] == "float16")]
    assert sub["status"].tolist() == ["fail"] and "flushed in" in sub["detail"].iloc[0]
    assert "conversion_exact" in set(bad["check"])


@pytest.mark.parametrize("dtype,bound", [("bfloat16", 1.0), ("float16", 1.0), ("float32", 2.0)])
def test_results_pushed_past_the_ulp_bound_fail(dtype, bound):
    pushes = int(bound) + 3  # a few ulps past the bound
    target = Target("cpu", lambda: testing.PushUlps("exp", pushes), "push")
    df = numerics.run(target, groups=["op_sweep"], ops="exp,log", dtypes=dtype, seed=11)
    ulp_rows = df[df["check"] == "max_ulp_error"].set_index("subject")
    assert ulp_rows.loc["exp/domain", "status"] == "fail"
    assert ulp_rows.loc["exp/domain", "threshold"] == bound
    assert ulp_rows.loc["exp/domain", "value"] >= pushes - 0.5
    assert "seed=11" in ulp_rows.loc["exp/domain", "detail"] and "worst_input=" in ulp_rows.loc["exp/domain", "detail"]
    assert ulp_rows.loc["log/domain", "status"] == "pass"  # only the pushed op fails


def test_goldens_are_never_computed_under_the_target_mode():
    seen: list[torch.dtype] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor):
                    seen.append(t.dtype)
            return out

    df = numerics.run(Target("cpu", Spy, "spy"), groups=["op_sweep", "accumulation"], ops="mm,softmax")
    assert _failing(df).empty
    assert seen and torch.float64 not in seen


def test_nondeterministic_gemm_fails_repeatability():
    class Jitter(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.mm.default:
                Jitter.calls += 1
                flat = out.reshape(-1)
                flat[Jitter.calls % flat.numel()] += 1.0
            return out

    df = numerics.run(Target("cpu", Jitter, "jitter"), groups=["repeatability"], seed=2)
    mm = df[(df["subject"] == "mm")]
    assert set(mm["status"]) == {"fail"} and (mm["value"] > 1).all()
    assert "seed=2" in mm["detail"].iloc[0]
    assert _failing(df)["subject"].unique().tolist() == ["mm"]


def test_model_deviation_healthy_cpu_passes_per_block():
    df = numerics.run(Target("cpu"), groups=["model_deviation"], workloads=["llama"], dtypes="bfloat16")
    assert _failing(df).empty, _failing(df)[["check", "subject", "detail"]].to_string()
    layers = df[df["check"] == "model_layer_deviation"]["subject"].tolist()
    assert "llama/layers.0" in layers and "llama/output" in layers
    assert {"model_output_deviation", "model_train_deviation", "attention_backend_deviation"} <= set(df["check"])

    att = df[df["check"] == "attention_backend_deviation"]
    assert not att.empty and set(att["status"]) <= {"pass"}  # llama calls SDPA: its backends are compared


def test_attention_backend_deviation_is_skipped_for_a_model_without_attention():
    """DLRM has no attention: the comparison is not applicable, a ``skip`` with the reason, never a pass."""
    df = numerics.run(Target("cpu"), groups=["model_deviation"], workloads=["dlrm"], dtypes="bfloat16")
    att = df[df["check"] == "attention_backend_deviation"]
    assert not att.empty and set(att["status"]) == {"skip"}, att[["subject", "status", "detail"]].to_string()
    assert att["detail"].str.contains("no scaled_dot_product_attention call").all()
    assert att["subject"].str.startswith("dlrm/").all()


# ------------------------------------------------------------------------- laws of the helpers

@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-3.0e38, max_value=3.0e38, allow_nan=False, allow_subnormal=False).map(lambda v: float(np.float32(v))),
       st.sampled_from([torch.bfloat16, torch.float16]))
def test_correct_rounding_is_within_half_an_ulp(x, dtype):
    fmt = _fp.FORMATS[dtype]
    t = torch.tensor([x], dtype=torch.float32)
    r = t.to(dtype)
    if abs(x) > fmt.max or not torch.isfinite(r).all() or abs(x) < fmt.tiny:
        return
    assert float(_fp.ulp_error(r, t.double(), dtype).max()) <= 0.5


def test_conversion_expectations_are_even_and_bracket_the_ties():
    for dtype in (torch.bfloat16, torch.float16):
        cases = conversion_cases(dtype)
        x, e = cases["tie"]
        assert len(cases["near_tie"][0]) == 2 * len(x) and (e % 2 == 0).all()
        assert len(cases["exact"][0]) == 65536
        # the tie above the largest finite number rounds to infinity (pattern 0x7f80 / 0x7c00)
        top = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}[dtype]
        assert top in set(e.tolist())
        # torch's own CPU conversion agrees with the integer expectations on a sample
        sample = np.concatenate([x[::97], cases["near_tie"][0][::89]])
        exp = np.concatenate([e[::97], cases["near_tie"][1][::89]])
        got = torch.from_numpy(sample).to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
        assert torch.equal(got, torch.from_numpy(exp))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.integers(0, 2**31))
def test_sequential_reference_gemm_obeys_the_gamma_bound(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    exact = a.double() @ b.double()
    err, _ = _fp.componentwise_error(seq_matmul(a, b), exact, a.double().abs() @ b.double().abs())
    assert err <= _fp.gamma(k, _fp.U32) + _fp.U32


def test_probe_reads_the_accumulator_width():
    for dtype, bits in ((torch.bfloat16, 8), (torch.float16, 11)):
        rows, exact = probe_rows(dtype)
        fmt = _fp.FORMATS[dtype]
        # simulate a p-bit sequential accumulator in fp64 with explicit rounding to p bits
        def round_p(v: float, p: int) -> float:
            if v == 0:
                return 0.0
            e = math.floor(math.log2(abs(v)))
            q = 2.0 ** (e - p + 1)
            return round(v / q) * q

        for p in (bits, 24):
            out = []
            for r in rows.double().tolist():
                acc = 0.0
                for v in r:
                    acc = round_p(acc + v, p)
                out.append(acc)
            assert mantissa_bits(torch.tensor(out), exact) == p
        assert fmt.p == bits


def test_benchmark_shapes_are_read_best_effort(tmp_path):
    doc = {"version": 1, "ops": [
        {"name": "aten::mm", "inputs": [{"shape": [64, 512]}, {"shape": [512, 128]}]},
        {"name": "aten::addmm", "inputs": [{"shape": [128]}, {"shape": [64, 256]}, {"shape": [256, 128]}]},
        {"name": "aten::relu", "inputs": [{"shape": [64, 128]}]},
        {"name": "aten::linear", "inputs": [{"shape": [2, 8, 256]}, {"shape": [1024, 256]}]},
    ]}
    (tmp_path / "benchmark.json").write_text(json.dumps(doc))
    assert benchmark_gemm_shapes(tmp_path, full=False) == [(64, 512, 128), (64, 256, 128), (16, 256, 512)]
    with pytest.raises(UsageError):
        benchmark_gemm_shapes(tmp_path / "missing", full=False)
    df = numerics.run(Target("cpu"), groups=["op_sweep"], ops="mm", dtypes="bfloat16", benchmark=str(tmp_path))
    assert "mm/benchmark_0" in set(df["subject"]) and _failing(df).empty
