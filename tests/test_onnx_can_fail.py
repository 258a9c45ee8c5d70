"""ONNX checks that no other test drove to ``fail``, each with a corrupted export or a skewed output
(issue #30: every check can fail; the registry is tests/check_reproducers.py). The validator runs
on the target without its injected mode (ONNX Runtime is compared with torch on the same host), so
the faults here are the validator's inputs, patched."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from mystique.validators import onnx_runtime  # noqa: E402

from mystique import onnx_export  # noqa: E402
from mystique.errors import UsageError  # noqa: E402
from mystique.targets import Target  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


def _rows(df, check):
    return df[df["check"] == check]


def test_onnx_export_fails_when_the_exporter_refuses_the_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise UsageError("cannot export dlrm/debug to ONNX: operators without an ONNX form: aten::nope")

    monkeypatch.setattr(onnx_export, "export_workload", refuse)
    df = onnx_runtime.run(Target("cpu"), workloads=("dlrm",), low_precision=())
    rows = _rows(df, "onnx_export")
    assert rows["status"].tolist() == ["fail"] and "aten::nope" in rows["detail"].iloc[0]


def test_onnx_checker_and_shape_inference_fail_on_a_model_that_adds_an_integer_to_a_float(monkeypatch):
    """The exported file gains, before it is checked, a node adding an int64 constant to its float input."""
    import onnx

    real = onnx_export.check_model

    def corrupted(path):
        model = onnx.load(str(path), load_external_data=False)
        model.graph.initializer.append(onnx.helper.make_tensor("bogus_int", onnx.TensorProto.INT64, [1], [1]))
        model.graph.node.append(onnx.helper.make_node("Add", [model.graph.input[0].name, "bogus_int"], ["bogus"]))
        onnx.save(model, str(path))
        return real(path)

    monkeypatch.setattr(onnx_export, "check_model", corrupted)
    df = onnx_runtime.run(Target("cpu"), workloads=("dlrm",), low_precision=())
    for check in ("onnx_checker", "onnx_shape_inference"):
        rows = _rows(df, check)
        assert rows["status"].tolist() == ["fail"], rows.to_string()


def test_low_precision_errors_fail_when_the_half_precision_outputs_are_off(monkeypatch):
    """torch's and ONNX Runtime's float16 outputs 50% too large: both fp64-golden comparisons fail."""
    real_forward, real_ort = onnx_runtime._torch_forward, onnx_runtime._Run.run_ort

    def skewed_forward(case, device, blocks):
        out, caught = real_forward(case, device, blocks)
        return (out * 1.5 if out.dtype != onnx_runtime.torch.float32 else out), caught

    def skewed_ort(self, path, feeds, provider, subject, dtype):
        outs = real_ort(self, path, feeds, provider, subject, dtype)
        return outs if outs is None or dtype == "float32" else [o * 1.5 for o in outs]

    monkeypatch.setattr(onnx_runtime, "_torch_forward", skewed_forward)
    monkeypatch.setattr(onnx_runtime._Run, "run_ort", skewed_ort)
    df = onnx_runtime.run(Target("cpu"), workloads=("dlrm",), low_precision=("float16",), intermediates=False)
    for check in ("torch_lowp_error_vs_fp64", "onnx_lowp_error_vs_fp64"):
        rows = _rows(df, check)
        assert len(rows) and set(rows["status"]) == {"fail"}, df[["check", "status", "detail"]].to_string()
    assert set(_rows(df, "onnx_output_deviation")["status"]) == {"pass"}  # float32 untouched
