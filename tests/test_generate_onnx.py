"""`mystique generate --format onnx`: model.onnx beside the plan, or a clear refusal naming operators."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    from mystique.capture import capture

    root = tmp_path_factory.mktemp("cap")
    return {m: capture("bert", root / m, config="debug", mode=m, steps=1, warmup=0) for m in ("infer", "train")}


def test_inference_benchmark_exports_a_checked_model(captures, tmp_path, cli_run):
    import onnx

    out = tmp_path / "b"
    rc, _, err = cli_run("-q", "generate", str(captures["infer"]), "-o", str(out), "--format", "json,py,onnx")
    assert rc == 0, err
    assert {"benchmark.json", "benchmark.py", "model.onnx", "export_report.json"} <= {p.name for p in out.iterdir()}
    onnx.checker.check_model(onnx.load(str(out / "model.onnx")), full_check=True)


def test_training_benchmark_is_refused_naming_the_operators(captures, tmp_path, cli_run):
    out = tmp_path / "b"
    rc, _, err = cli_run("-q", "generate", str(captures["train"]), "-o", str(out), "--format", "json,onnx")
    assert rc == 2
    assert "without an ONNX form" in err and "aten::" in err and "staging" not in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []
