"""The full-size reference traces from ../shared/traces: GPT-2 (27k nodes, 1.1.0) and ResNet
(14k nodes, 1.1.1 with strides and collectives), extracted once per session."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from mystique.trace import Trace, iteration_spans, load_trace, op_stats, replay_ops, select_iteration

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
ARCHIVES = {
    "gpt2": ("param__hf_GPT2_et.json.tar.gz", "hf_GPT2_et.json"),
    "resnet": ("param__resnet_1gpu_et.json.tar.gz", "resnet_1gpu_et.json"),
}


@pytest.fixture(scope="session")
def shared_traces(tmp_path_factory) -> dict[str, Trace]:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"reference traces not available: {SHARED_TRACES} is absent")
    out = tmp_path_factory.mktemp("shared_et")
    loaded: dict[str, Trace] = {}
    for key, (archive, member) in ARCHIVES.items():
        src = SHARED_TRACES / archive
        if not src.is_file():
            pytest.skip(f"reference trace archive {src} is absent")
        with tarfile.open(src) as tf:
            tf.extract(member, out, filter="data")
        loaded[key] = load_trace(out / member)
        (out / member).unlink()
    return loaded


def _no_op_inside_another(trace: Trace, ops) -> bool:
    chosen = {n.id for n in ops}
    return not any(a.id in chosen for n in ops for a in trace.ancestors(n.id))


def test_gpt2_loads_and_replays_one_iteration(shared_traces):
    tr = shared_traces["gpt2"]
    assert tr.schema == "1.1.0-chakra.0.0.4" and len(tr.nodes) == 27156
    spans = iteration_spans(tr)
    assert [(s.step, s.complete) for s in spans] == [(0, True), (1, False)]
    ops = replay_ops(tr)
    assert select_iteration(tr).step == 0
    assert len(ops) == 8581
    assert all(n.is_op and spans[0].contains(n.id) for n in ops)
    assert [n.id for n in ops] == sorted(n.id for n in ops)
    assert _no_op_inside_another(tr, ops)
    names = {n.name for n in ops}
    # forward, backward (autograd thread) and the Adam step are all in the iteration
    assert {"aten::embedding", "aten::layer_norm", "aten::addmm", "aten::native_layer_norm_backward",
            "aten::embedding_backward", "aten::_foreach_addcdiv_", "aten::_foreach_lerp_"} <= names
    assert {n.tid for n in ops} == {1, 2}
    assert replay_ops(tr, 1) == []


def test_resnet_iterations_and_collectives(shared_traces):
    tr = shared_traces["resnet"]
    assert tr.schema == "1.1.1-chakra.0.0.4" and len(tr.nodes) == 14392
    assert [s.step for s in iteration_spans(tr)] == [6, 7, 8]
    per_step = {s: replay_ops(tr, s) for s in (6, 7, 8)}
    assert {len(v) for v in per_step.values()} == {1237}, "three identical training steps"
    assert [n.name for n in per_step[6]] == [n.name for n in per_step[8]]
    ops = replay_ops(tr)
    assert ops == per_step[7]
    assert _no_op_inside_another(tr, ops)
    names = [n.name for n in ops]
    assert names.count("aten::conv2d") == 53 and names.count("aten::convolution_backward") == 53
    assert "c10d::allreduce_" in names and "aten::_foreach_add_" in names
    df = op_stats(tr)
    assert int(df.set_index("name").loc["aten::conv2d", "count"]) == 53
    assert int(df["count"].sum()) == 1237
