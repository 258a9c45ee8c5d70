"""The cross-device correctness validator: healthy CPU passes, injected faults are localised exactly,
the user's mode never touches the reference or fp64 computations, and the CLI maps it all to exit codes."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
import torch
from mystique.validators import correctness
from mystique.validators.correctness import benchmarks, engine
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_map

from mystique.errors import EnvironmentUnsupported, UsageError
from mystique.results import COLUMNS, read_csv
from mystique.targets import Target, make_target

MATMUL = ("aten::linear", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


@pytest.fixture(scope="module")
def mlp_bench(tmp_path_factory) -> Path:
    """A user's benchmark: the tiny MLP training step of tests/user_steps.py (GELU, foreach AdamW)."""
    from mystique.capture import capture
    from mystique.progress import set_enabled
    from mystique.replay import generate

    set_enabled(False)
    root = tmp_path_factory.mktemp("mlp")
    capture("user_steps:tiny_mlp", root / "trace", steps=1, warmup=0)
    generate(str(root / "trace"), str(root / "mlp_bench"), formats="json")
    set_enabled(True)
    return root / "mlp_bench"


def _plan(workload: str, mode: str, tmp_path: Path) -> dict:
    return benchmarks.reference(workload, "debug", mode, "float32", tmp_path).plan


def _first_index(plan: dict, names: tuple[str, ...]) -> int:
    return next(op["index"] for op in plan["ops"] if op["name"] in names)


def _rows(df: pd.DataFrame, check: str) -> pd.DataFrame:
    return df[df["check"] == check].set_index("subject")


def _bad(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"].isin(("fail", "error"))]


def test_groups_options_and_bad_input(tmp_path):
    assert correctness.groups("quick") == ["operator_replay", "workload_output", "repeatability"]
    assert correctness.groups("full") == correctness.groups("quick")
    with pytest.raises(UsageError):
        correctness.groups("medium")
    cpu = Target("cpu")
    for kwargs in ({"groups": ["nope"]}, {"level": "slow"}, {"workloads": "llama,gpt"}, {"colour": 1},
                   {"reference_device": "gpu7"}, {"config": "huge", "groups": ["workload_output"]},
                   {"benchmark": tmp_path / "missing"}):
        with pytest.raises(UsageError):
            correctness.run(cpu, **kwargs)
    (tmp_path / "notes.json").write_text("{}")
    with pytest.raises(UsageError):
        correctness.run(cpu, benchmark=tmp_path / "notes.json")
    if not torch.cuda.is_available():
        with pytest.raises(EnvironmentUnsupported):
            correctness.run(cpu, reference_device="cuda")


class _Identity(TorchDispatchMode):
    """A healthy custom backend: the CPU's own kernels through a dispatch mode (so the reference is the
    same device without the mode, a meaningful comparison)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


HEALTHY = Target("cpu", _Identity, "identity")


def test_healthy_cpu_passes_every_group_with_tables_and_skips(tmp_path):
    df = correctness.run(HEALTHY, seed=0, out_dir=tmp_path, workloads="bert,llama")
    assert list(df.columns) == list(COLUMNS) and set(df["suite"]) == {"correctness"}
    assert _bad(df).empty, _bad(df)[["check", "subject", "detail"]].to_string()
    first = _rows(df, "first_divergent_op")
    expected = {f"{w}/debug/{m}" for w in ("bert", "llama") for m in ("infer", "train")}
    expected |= {f"{w}/debug/infer/bfloat16" for w in ("bert", "llama")}
    assert set(first.index) == expected and (first["status"] == "pass").all()
    assert first["detail"].str.contains("reference cpu (same device, reference without the fault)", regex=False).all()
    compared = _rows(df, "ops_compared")
    assert (compared["value"] > 40).all() and (compared["status"] == "info").all()  # a measurement
    assert set(_rows(df, "workload_output_error").index) == {"bert/debug", "llama/debug"}
    assert (_rows(df, "replay_repeatability")["value"] == 0).all()
    assert (_rows(df, "workload_repeatability")["value"] == 1).all()
    skipped = df[df["check"] == "op_skipped"]
    assert not (skipped["subject"] == "aten::dropout").any()  # BERT's dropout has p = 0: no draw, compared
    # the per-op tables and the cached reference benchmarks land in out_dir
    with open(tmp_path / "correctness_ops" / "bert-debug-train.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(_plan("bert", "train", tmp_path / "x")["ops"])
    assert {r["status"] for r in table} <= {"pass", "skip", "noop"}
    dropout = [r for r in table if r["name"] == "aten::dropout"]
    assert dropout and {r["status"] for r in dropout} == {"pass"}
    assert any(p.name == "benchmark.json" for p in (tmp_path / "reference_benchmarks").rglob("*"))


@pytest.mark.parametrize("seed", [1, 2])
def test_healthy_cpu_operator_replay_passes_on_other_seeds(seed):
    df = correctness.run(HEALTHY, seed=seed, groups=["operator_replay"], workloads="bert,dlrm,llama")
    assert _bad(df).empty, _bad(df)[["check", "subject", "detail"]].to_string()
    assert df["detail"].str.contains(f"seed {seed}").any()


def test_wrong_gelu_fails_at_the_first_gelu_and_only_where_gelu_runs(tmp_path):
    df = correctness.run(make_target("cpu", "wrong_gelu"), groups=["operator_replay"], workloads="bert,llama")
    first = _rows(df, "first_divergent_op")
    for mode in ("infer", "train"):
        idx = _first_index(_plan("bert", mode, tmp_path), ("aten::gelu",))
        row = first.loc[f"bert/debug/{mode}"]
        assert row["status"] == "fail" and int(row["value"]) == idx
        assert f"op {idx} aten::gelu" in row["detail"] and "seed 0" in row["detail"] and "cpu+wrong_gelu" in row["detail"]
    assert (first.loc[["llama/debug/infer", "llama/debug/train"], "status"] == "pass").all()  # SiLU, no GELU
    worst = df[(df["check"] == "op_error_vs_fp64") & (df["status"] == "fail")]
    assert len(worst) and worst["subject"].str.match(r"^\d+:aten::gelu(_backward)?$").all()
    assert (worst["value"] > worst["threshold"]).all()


def test_stuck_lane_fails_at_the_first_matrix_multiply(tmp_path):
    df = correctness.run(make_target("cpu", "stuck_lane"), groups=["operator_replay"], workloads="llama")
    first = _rows(df, "first_divergent_op")
    idx = _first_index(_plan("llama", "infer", tmp_path), MATMUL)
    assert first.loc["llama/debug/infer", "status"] == "fail"
    assert int(first.loc["llama/debug/infer", "value"]) == idx
    assert (_rows(df, "max_error_ratio")["status"] == "fail").all()


def test_bitflips_in_exponents_fail_at_the_first_matrix_multiply(tmp_path):
    target = make_target("cpu", "bitflip:rate=0.01,bits=exponent")
    df = correctness.run(target, groups=["operator_replay", "workload_output"], workloads="llama")
    first = _rows(df, "first_divergent_op")
    assert int(first.loc["llama/debug/infer", "value"]) == _first_index(_plan("llama", "infer", tmp_path), MATMUL)
    assert _rows(df, "workload_output_error").loc["llama/debug", "status"] == "fail"


class _NarrowMatmulFault(TorchDispatchMode):
    """Corrupts only matrix products whose result has 8 columns: the second Linear of the tiny MLP."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("mm", "addmm") and out.shape[-1] == 8:
            out = out * 1.01
        return out


def test_divergence_is_localised_without_cascading(mlp_bench):
    df = correctness.run(Target("cpu", _NarrowMatmulFault, "narrow"), benchmark=mlp_bench,
                         groups=["operator_replay"])
    plan = benchmarks.load(mlp_bench).plan
    idx = next(op["index"] for op in plan["ops"]
               if op["name"] == "aten::linear" and plan["tensors"][op["args"][1]["t"]]["shape"][0] == 8)
    first = _rows(df, "first_divergent_op").loc["mlp_bench"]
    assert first["status"] == "fail" and int(first["value"]) == idx and idx > 0
    # the loss and the backward consume the corrupted logits on the target but are fed the
    # reference's logits in lockstep: exactly one op diverges
    assert "1 of " in first["detail"]


class _PlusOne(TorchDispatchMode):
    """A user's mode that adds 1 to every floating result and records what it saw."""

    calls = 0
    saw_float64 = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def look(x):
            if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
                type(self).saw_float64 = True
            return x

        tree_map(look, (args, kwargs))
        type(self).calls += 1
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("linear", "addmm", "mm", "gelu"):
            out = tree_map(lambda x: x + 1 if isinstance(x, torch.Tensor) and x.is_floating_point() else x, out)
        return out


def test_the_users_mode_never_runs_on_the_reference_or_fp64(mlp_bench, tmp_path, monkeypatch):
    seen = {"reference": 0, "fp64": 0, "target": 0}

    def guarded(kind, real):
        def call(*a, **k):
            assert _get_current_dispatch_mode() is None, f"a dispatch mode is active during a {kind} computation"
            seen[kind] += 1
            return real(*a, **k)
        return call

    real_target = engine.call_target

    def counting_target(target, fn, args, kwargs):
        seen["target"] += 1
        return real_target(target, fn, args, kwargs)

    monkeypatch.setattr(engine, "call_reference", guarded("reference", engine.call_reference))
    monkeypatch.setattr(engine, "call_fp64", guarded("fp64", engine.call_fp64))
    monkeypatch.setattr(engine, "call_target", counting_target)
    _PlusOne.calls, _PlusOne.saw_float64 = 0, False
    df = correctness.run(Target("cpu", _PlusOne, "plus_one"), benchmark=mlp_bench, out_dir=tmp_path,
                         groups=["operator_replay", "workload_output"], workloads="dlrm")
    assert seen["reference"] > 0 and seen["fp64"] > 0 and seen["target"] > 0 and _PlusOne.calls > 0
    assert not _PlusOne.saw_float64  # the fp64 golden never went through the mode
    first = _rows(df, "first_divergent_op").loc["mlp_bench"]
    assert first["status"] == "fail" and int(first["value"]) == 0  # op 0 is the first Linear
    with open(tmp_path / "correctness_ops" / "mlp_bench.csv", newline="") as fh:
        table = [r for r in csv.DictReader(fh) if r["err_reference"]]
    # were the mode applied to the reference or the golden, their errors would be of order 1
    assert table and max(float(r["err_reference"]) for r in table) < 1e-5
    assert _rows(df, "workload_output_error").loc["dlrm/debug", "status"] == "fail"


def test_reordered_reductions_pass_the_comparison_but_fail_repeatability(mlp_bench):
    target = make_target("cpu", "nondeterministic_reduction")
    df = correctness.run(target, benchmark=mlp_bench, groups=["operator_replay", "repeatability"],
                         workloads="bert")
    assert _rows(df, "first_divergent_op").loc["mlp_bench", "status"] == "pass"
    ratio = _rows(df, "max_error_ratio").loc["mlp_bench"]
    assert 0 < ratio["value"] <= 1  # not bitwise equal, yet within the bound
    rep = _rows(df, "replay_repeatability").loc["mlp_bench"]
    assert rep["status"] == "fail" and rep["value"] > 0 and "op 0 aten::linear" in rep["detail"]
    assert _rows(df, "workload_repeatability").loc["bert/debug", "status"] == "fail"


def test_cli_exit_codes_and_outputs(mlp_bench, tmp_path, cli_run):
    out = tmp_path / "bad"
    code, stdout, _ = cli_run("validate", "correctness", "-o", str(out), "--benchmark", str(mlp_bench),
                              "--inject", "wrong_gelu", "--group", "operator_replay")
    assert code == 1 and "failed" in stdout
    df = pd.read_csv(out / "results.csv")
    plan = benchmarks.load(mlp_bench).plan
    first = df[df["check"] == "first_divergent_op"].iloc[0]
    assert first["status"] == "fail" and int(first["value"]) == _first_index(plan, ("aten::gelu",))
    assert (out / "correctness_ops" / "mlp_bench.csv").is_file()
    # throttle slows the device and leaves every result as it was: compared with the same device without it
    code, _, _ = cli_run("validate", "correctness", "-o", str(tmp_path / "good"), "--benchmark", str(mlp_bench),
                         "--group", "operator_replay", "--group", "repeatability", "--workloads", "dlrm",
                         "--threads", "0", "--inject", "throttle")
    assert code == 0
    good = pd.read_csv(tmp_path / "good" / "results.csv")
    empty = good[(good["check"] == "op_skipped") & (good["subject"] == "aten::empty")]
    assert len(empty) and empty["detail"].str.contains("undefined memory").all()  # AdamW's state
    code, _, stderr = cli_run("validate", "correctness", "-o", str(tmp_path / "x"), "--reference-device", "gpu7")
    assert code == 2 and "unknown device" in stderr and not (tmp_path / "x").exists()
    code, _, _ = cli_run("validate", "correctness", "-o", str(tmp_path / "y"), "--workloads", "gpt")
    assert code == 2


class _GeluRaises(TorchDispatchMode):
    """A backend without a GELU kernel: the dispatcher's NotImplementedError for a missing backend kernel."""

    error: Exception = NotImplementedError("Could not run 'aten::gelu' with arguments from the 'CPU' backend. This "
                                          "could be because the operator doesn't exist for this backend")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "gelu":
            raise self.error
        return func(*args, **(kwargs or {}))


class _GeluBroken(_GeluRaises):
    """A backend whose GELU kernel raises."""

    error = RuntimeError("gelu is not available on this backend")


class _GeluGivesUp(_GeluRaises):
    """A backend whose GELU raises a NotImplementedError of its own: not torch's missing kernel (issue 30.13)."""

    error = NotImplementedError("gelu is not available on this backend")


def test_missing_kernels_are_skipped_and_raising_kernels_fail(mlp_bench):
    plan = benchmarks.load(mlp_bench).plan
    gelu = _first_index(plan, ("aten::gelu",))
    df = correctness.run(Target("cpu", _GeluRaises, "no_gelu"), benchmark=mlp_bench, groups=["operator_replay"])
    assert _bad(df).empty
    skipped = df[(df["check"] == "op_skipped") & (df["subject"] == "aten::gelu")]
    assert len(skipped) == 1 and "no kernel for cpu" in skipped.iloc[0]["detail"]
    for mode, kind in ((_GeluBroken, "RuntimeError"), (_GeluGivesUp, "NotImplementedError")):
        df = correctness.run(Target("cpu", mode, "bad_gelu"), benchmark=mlp_bench, groups=["operator_replay"])
        errors = _rows(df, "target_op_errors").loc["mlp_bench"]
        assert errors["status"] == "fail" and errors["value"] == 1
        assert f"op {gelu} aten::gelu" in errors["detail"] and kind in errors["detail"]
        assert _rows(df, "first_divergent_op").loc["mlp_bench", "status"] == "pass"  # nothing computed wrong


def test_zero_ops_compared_is_not_a_pass_and_exits_3(mlp_bench, monkeypatch):
    """Issue 30.7: with every op skipped, target_op_errors passed ("every compared op ran") and the run
    exited 0. Nothing compared is no evidence: every row is a skip or a measurement and the run exits 3."""
    from mystique import results

    def no_kernel(target, fn, args, kwargs):  # a backend with no kernel at all
        raise NotImplementedError(f"Could not run '{fn}' with arguments from the 'CPU' backend.")

    monkeypatch.setattr(engine, "call_target", no_kernel)
    df = correctness.run(make_target("cpu", "throttle"), benchmark=mlp_bench, groups=["operator_replay"])
    errors = _rows(df, "target_op_errors").loc["mlp_bench"]
    assert errors["status"] == "skip" and "no operator ran" in errors["detail"]
    assert set(df["status"]) <= {"skip", "info"}
    assert results.exit_code(df) == results.NOTHING_CHECKED == 3


def test_a_device_compared_with_itself_is_refused(mlp_bench, tmp_path, cli_run):
    """Issue 30.9: --device cpu with the default --reference-device cpu compared the CPU with itself and
    passed whatever it computed."""
    with pytest.raises(UsageError, match="--reference-device must differ from --device"):
        correctness.run(Target("cpu"), reference_device="cpu", benchmark=mlp_bench, groups=["operator_replay"])
    code, _, stderr = cli_run("validate", "correctness", "-o", str(tmp_path / "same"), "--benchmark", str(mlp_bench),
                              "--reference-device", "cpu")
    assert code == 2 and not (tmp_path / "same").exists()
    line, = [x for x in stderr.splitlines() if x.strip()]
    assert line.startswith("mystique: error: --reference-device must differ from --device (both cpu)")
    # by default a lone CPU has no second device: the operator comparison is a skip that says so
    code, _, _ = cli_run("-q", "validate", "correctness", "-o", str(tmp_path / "lone"), "--benchmark", str(mlp_bench),
                         "--group", "operator_replay")
    assert code == 3
    df = read_csv(tmp_path / "lone" / "results.csv")
    assert set(df["status"]) == {"skip"} and df["detail"].str.contains("no second device").all()
    # repeatability runs on the target alone: no reference, nothing refused
    df = correctness.run(Target("cpu"), reference_device="cpu", benchmark=mlp_bench, groups=["repeatability"])
    assert _rows(df, "replay_repeatability").loc["mlp_bench", "status"] == "pass"


def test_with_a_fault_or_emulation_the_same_device_is_the_reference_and_rows_say_so(mlp_bench):
    df = correctness.run(make_target("cpu", "wrong_gelu"), reference_device="cpu", benchmark=mlp_bench,
                         groups=["operator_replay"])
    first = _rows(df, "first_divergent_op").loc["mlp_bench"]
    assert first["status"] == "fail" and "reference cpu (same device, reference without the fault)" in first["detail"]
    df = correctness.run(make_target("cpu", None, "cuda"), benchmark=mlp_bench, groups=["operator_replay"])
    assert "same device, reference without the emulation" in _rows(df, "first_divergent_op").loc["mlp_bench",
                                                                                                  "detail"]


def test_a_lone_cpu_skips_the_op_comparison_and_judges_workloads_against_fp64(monkeypatch):
    """Quick qualification on a lone CPU (no reference device given): no cross-device verdict; the workload's
    forward is judged against its fp64 golden alone (floor(float32, K, s)), which a wrong result fails."""
    from mystique.validators.correctness import workload

    df = correctness.run(Target("cpu"), groups=["operator_replay", "workload_output"], workloads="dlrm")
    first = _rows(df, "first_divergent_op").loc["operator_replay"]
    assert first["status"] == "skip" and first["detail"].startswith("no second device")
    out = _rows(df, "workload_output_error").loc["dlrm/debug"]
    assert out["status"] == "pass" and "judged against the fp64 golden alone" in out["detail"]
    assert 0 < out["value"] < out["threshold"]
    real = workload.call_target

    def off_by_a_thousandth(target, fn, args, kwargs):
        return real(target, fn, args, kwargs) * 1.001

    monkeypatch.setattr(workload, "call_target", off_by_a_thousandth)
    df = correctness.run(Target("cpu"), groups=["workload_output"], workloads="dlrm")
    assert _rows(df, "workload_output_error").loc["dlrm/debug", "status"] == "fail"
