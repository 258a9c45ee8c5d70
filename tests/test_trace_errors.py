"""Malformed execution traces are refused with a UsageError that names what and where."""

from __future__ import annotations

import copy
import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from mystique.errors import UsageError
from mystique.trace import load_kineto, load_trace

ATTRS = [{"name": "rf_id", "type": "uint64", "value": 0}, {"name": "op_schema", "type": "string", "value": ""}]


def _node(nid, name, parent, inputs=None, outputs=None, attrs=None):
    return {
        "id": nid, "name": name, "ctrl_deps": parent,
        "inputs": inputs or {"values": [], "shapes": [], "types": [], "strides": []},
        "outputs": outputs or {"values": [], "shapes": [], "types": [], "strides": []},
        "attrs": attrs if attrs is not None else ATTRS,
    }


def valid_doc() -> dict:
    mm_in = {
        "values": [[10, 11, 0, 6, 4, "cpu"], [12, 13, 0, 6, 4, "cpu"], [[14, 15, 0, 4, 4, "cpu"]]],
        "shapes": [[2, 3], [3, 2], [[2, 2]]],
        "types": ["Tensor(float)", "Tensor(float)", "GenericList[Tensor(float)]"],
        "strides": [[3, 1], [2, 1], [[2, 1]]],
    }
    return {
        "schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "2026-01-01 00:00:00", "start_ts": 5,
        "nodes": [
            _node(123, "aten::mm", 2, inputs=mm_in,
                  attrs=ATTRS + [{"name": "tensor_range", "type": "string", "value": ""}]),
            _node(2, "[pytorch|profiler|execution_trace|thread]", 1),
            _node(1, "[pytorch|profiler|execution_trace|process]", 1),
        ],
        "finish_ts": 9,
    }


def write(tmp_path: Path, doc, name: str = "trace.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def refused(path: Path, pattern: str) -> str:
    with pytest.raises(UsageError, match=pattern) as info:
        load_trace(path)
    return str(info.value)


def test_the_valid_document_loads(tmp_path):
    tr = load_trace(write(tmp_path, valid_doc()))
    assert tr.root_id == 1 and tr.nodes[1].children == [2] and tr.nodes[2].children == [123]
    assert tr.nodes[123].inputs[2].value[0].value.shape == (2, 2)


def test_not_json(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text('{"schema": "1.1.1-chakra.0.0.4", "nodes": [')
    msg = refused(p, r"not a valid JSON trace")
    assert "trace.json" in msg and "line 1" in msg


def test_empty_file(tmp_path):
    p = tmp_path / "trace.json"
    p.write_bytes(b"")
    refused(p, r"empty file")


def test_binary_garbage(tmp_path):
    p = tmp_path / "trace.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    refused(p, r"not a (valid )?JSON trace")


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps(valid_doc()).encode())
    p = tmp_path / "trace.json.gz"
    p.write_bytes(data[: len(data) // 2])
    refused(p, r"trace.json.gz: truncated or corrupt gzip")


def test_tarball_is_refused_by_name_and_by_content(tmp_path):
    payload = json.dumps(valid_doc()).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("trace.json")
        info.size = len(payload)
        tf.addfile(info, io.BytesIO(payload))
    (tmp_path / "et.tar.gz").write_bytes(buf.getvalue())
    refused(tmp_path / "et.tar.gz", r"is a tar archive; extract it first")
    (tmp_path / "disguised.json.gz").write_bytes(buf.getvalue())
    refused(tmp_path / "disguised.json.gz", r"is a tar archive")


def test_missing_path_and_folder_without_trace(tmp_path):
    refused(tmp_path / "nope.json", r"no such file or folder")
    refused(tmp_path, r"folder holds no trace.json or trace.json.gz")


def test_top_level_not_an_object(tmp_path):
    refused(write(tmp_path, [1, 2]), r"expected a JSON object at the top level, found list")


def test_missing_nodes(tmp_path):
    doc = valid_doc()
    del doc["nodes"]
    refused(write(tmp_path, doc), r"trace.json: no 'nodes' list")


def test_unknown_schema_names_it_and_the_supported_ones(tmp_path):
    doc = valid_doc()
    doc["schema"] = "2.0.0-chakra.0.0.9"
    msg = refused(write(tmp_path, doc), r"unsupported execution trace schema '2.0.0-chakra.0.0.9'")
    for v in ("1.0.1", "1.0.2", "1.1.0", "1.1.1"):
        assert v in msg
    del doc["schema"]
    refused(write(tmp_path, doc), r"no 'schema' version string")


def test_node_without_id(tmp_path):
    doc = valid_doc()
    del doc["nodes"][0]["id"]
    refused(write(tmp_path, doc), r"trace.json: nodes\[0\] \(aten::mm\) has no 'id'")


def test_node_with_non_integer_id(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["id"] = "123"
    refused(write(tmp_path, doc), r"nodes\[0\] has a non-integer id '123'")


def test_tensor_of_wrong_length(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["values"][1] = [12, 13, 0, 6]
    msg = refused(write(tmp_path, doc), "x")
    assert msg.endswith("trace.json: node 123 (aten::mm): inputs[1] is a tensor of 4 fields, expected 6")


def test_tensor_in_a_list_of_wrong_length(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["values"][2] = [[14, 15, 0, 4, 4, "cpu", 7]]
    refused(write(tmp_path, doc), r"node 123 \(aten::mm\): inputs\[2\]\[0\] is a tensor of 7 fields, expected 6")


def test_tensor_with_bad_field(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["values"][0][3] = "six"
    refused(write(tmp_path, doc), r"inputs\[0\] is a tensor whose numel is 'six'")


def test_bad_shape(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["shapes"][0] = [2, "x"]
    refused(write(tmp_path, doc), r"inputs\[0\] has shape \[2, \"x\"\], expected a list of integers")


def test_values_and_types_disagree(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["types"].pop()
    refused(write(tmp_path, doc), r"node 123 \(aten::mm\): inputs has 3 values but 2 types")


def test_list_type_names_a_different_count(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["types"][2] = "GenericList[Tensor(float),Int,Int]"
    refused(write(tmp_path, doc), r"inputs\[2\] is a list of 1 values but its type .* names 3")


def test_parent_missing(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["ctrl_deps"] = 99
    refused(write(tmp_path, doc), r"trace.json: node 123 \(aten::mm\): parent 99 is not in the trace")


def test_duplicate_ids(tmp_path):
    doc = valid_doc()
    dup = copy.deepcopy(doc["nodes"][0])
    dup["name"] = "aten::add"
    doc["nodes"].append(dup)
    refused(write(tmp_path, doc), r"duplicate node id 123 \(aten::mm and aten::add\)")


def test_no_root_and_two_roots(tmp_path):
    doc = valid_doc()
    doc["nodes"][2]["ctrl_deps"] = 2
    refused(write(tmp_path, doc), r"no root node|cycle")
    doc = valid_doc()
    doc["nodes"][1]["ctrl_deps"] = 2
    refused(write(tmp_path, doc), r"2 root nodes \(1 .*, 2 .*\); expected one")


def test_parent_cycle(tmp_path):
    doc = valid_doc()
    doc["nodes"].append(_node(7, "aten::a", 8))
    doc["nodes"].append(_node(8, "aten::b", 7))
    refused(write(tmp_path, doc), r"2 nodes are not reachable from the root 1, e.g. node 7 \(aten::a\)")


def test_bad_attrs(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["attrs"] = [{"value": 1}]
    refused(write(tmp_path, doc), r"node 123 \(aten::mm\): attrs\[0\] is")
    doc = valid_doc()
    doc["nodes"][0]["attrs"] = [{"name": "rf_id", "type": "uint64", "value": "x"}]
    refused(write(tmp_path, doc), r"attribute rf_id is 'x', expected an integer")


def test_bad_tensor_range(tmp_path):
    doc = valid_doc()
    doc["nodes"][0]["attrs"][-1]["value"] = "{not json"
    refused(write(tmp_path, doc), r"attribute tensor_range is not valid JSON")
    doc["nodes"][0]["attrs"][-1]["value"] = '{"9": [0, 1]}'
    refused(write(tmp_path, doc), r"tensor_range names input tensor 9, but the node has 3 input tensors")
    doc["nodes"][0]["attrs"][-1]["value"] = '{"0": [0]}'
    refused(write(tmp_path, doc), r"tensor_range\[0\] is \[0\], expected \[min, max\]")


def test_flat_101_node_without_parent(tmp_path):
    doc = {"schema": "1.0.1", "nodes": [
        {"name": "[pytorch|profiler|execution_graph|process]", "id": 1, "parent": 1, "inputs": [],
         "input_shapes": [], "input_types": [], "outputs": [], "output_shapes": [], "output_types": []},
        {"name": "aten::relu", "id": 5, "inputs": [], "input_shapes": [], "input_types": [],
         "outputs": [], "output_shapes": [], "output_types": []},
    ]}
    refused(write(tmp_path, doc), r"node 5 \(aten::relu\): has no 'parent' id")


def test_kineto_errors(tmp_path):
    with pytest.raises(UsageError, match="no such Kineto trace file"):
        load_kineto(tmp_path / "missing.json")
    p = write(tmp_path, {"nodes": []}, "kineto.json")
    with pytest.raises(UsageError, match="no 'traceEvents' list"):
        load_kineto(p)
    p.write_text("{")
    with pytest.raises(UsageError, match="not a valid JSON Kineto trace"):
        load_kineto(p)
