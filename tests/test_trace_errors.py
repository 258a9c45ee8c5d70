"""Malformed execution traces are refused with a UsageError that names what and where."""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import re
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
    refused(write(tmp_path, doc), r"inputs\[0\] has shape \[2, 'x'\], expected a list of integers")


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


# --- issue 19: bad input is one line and exit 2, never "internal error" --------------------------------


def _generate(path: Path, out: Path, *extra: str) -> tuple[int, str]:
    from mystique.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["-q", "generate", str(path), "-o", str(out), *extra])
    return rc, err.getvalue()


def _one_line_exit_2(rc: int, err: str) -> None:
    assert rc == 2, err
    assert err.startswith("mystique: error: ") and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err


def test_deeply_nested_json_is_bad_input(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text('{"schema": "1.1.1-chakra.0.0.4", "nodes": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(p, "nested too deeply")
    rc, err = _generate(p, tmp_path / "o")
    _one_line_exit_2(rc, err)
    assert not (tmp_path / "o").exists()


def test_nested_argument_lists_are_bounded(tmp_path):
    doc = valid_doc()
    value, typ = 1, "Int"
    for _ in range(200):
        value, typ = [value], f"GenericList[{typ}]"
    doc["nodes"][0]["inputs"] = {"values": [value], "shapes": [[]], "types": [typ], "strides": [[]]}
    refused(write(tmp_path, doc), r"inputs\[0\](\[0\])* nests lists more than 32 levels deep")


def test_a_huge_integer_literal_is_bad_input(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text('{"schema": "1.1.1-chakra.0.0.4", "pid": ' + "9" * 5000 + ', "nodes": []}')
    refused(p, r"not a usable JSON trace: Exceeds the limit")


@pytest.mark.parametrize("k, value, needle", [
    (2, -1, "offset is -1, expected a non-negative 64-bit integer"),
    (3, -6, "numel is -6"),
    (4, -4, "itemsize is -4"),
    (4, 2**20, "itemsize is 1048576 bytes, expected at most 64"),
    (2, 2**63, "offset is 9223372036854775808"),
    (0, 2**64, "tensor_id is 18446744073709551616, expected a 64-bit integer"),
])
def test_negative_or_overflowing_tensor_fields(tmp_path, k, value, needle):
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["values"][0][k] = value
    refused(write(tmp_path, doc), re.escape(needle))


@pytest.mark.parametrize("key, value", [("shapes", [2, -3]), ("shapes", [2**63, 1]), ("strides", [3, -1]),
                                        ("strides", [2**64, 1])])
def test_negative_or_overflowing_shapes_and_strides(tmp_path, key, value):
    doc = valid_doc()
    doc["nodes"][0]["inputs"][key][0] = value
    refused(write(tmp_path, doc), r"inputs\[0\] has (shape|strides) .*expected non-negative 64-bit integers")


def test_a_scalar_typed_argument_with_a_list_value_is_refused(tmp_path):
    """Found by the fuzz campaign: ``Int`` with a list value reached the plan builder, which took the
    list's items for typed arguments (internal error: AttributeError: 'int' object has no attribute 'value')."""
    doc = valid_doc()
    doc["nodes"][0]["inputs"]["types"][1] = "Int"
    doc["nodes"][0]["inputs"]["values"][1] = [1, 2]
    refused(write(tmp_path, doc), r"inputs\[1\] is 'Int' but its value is \[1, 2\], expected a single value")
    rc, err = _generate(write(tmp_path, doc), tmp_path / "o")
    _one_line_exit_2(rc, err)


GZ_LIMIT = "MYSTIQUE_MAX_TRACE_BYTES"


def test_a_decompression_bomb_is_refused_without_exhausting_memory(tmp_path, monkeypatch):
    import resource

    payload = json.dumps(valid_doc()).encode()
    bomb = gzip.compress(payload[:-1] + b" " * (64 * 1024**2) + b"}", compresslevel=9)  # 64 MiB of spaces
    p = tmp_path / "trace.json.gz"
    p.write_bytes(bomb)
    assert len(bomb) < 200_000
    monkeypatch.setenv(GZ_LIMIT, "16M")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    msg = refused(p, r"decompresses to more than the limit of 16 MiB; set MYSTIQUE_MAX_TRACE_BYTES to raise it")
    assert "trace.json.gz" in msg
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 48 * 1024  # never held the 64 MiB
    rc, err = _generate(p, tmp_path / "o")
    _one_line_exit_2(rc, err)
    monkeypatch.setenv(GZ_LIMIT, "128M")  # raised: the same file loads
    assert load_trace(p).root_id == 1


def test_the_size_cap_applies_to_plain_json_and_has_a_2_gib_default(tmp_path, monkeypatch):
    from mystique.trace.files import DEFAULT_MAX_TRACE_BYTES, max_trace_bytes

    monkeypatch.delenv(GZ_LIMIT, raising=False)
    assert max_trace_bytes() == DEFAULT_MAX_TRACE_BYTES == 2 * 1024**3
    p = write(tmp_path, valid_doc())
    monkeypatch.setenv(GZ_LIMIT, "100")
    refused(p, r"trace.json: the trace is larger than the limit of 100 bytes")
    for bad in ("-1", "lots", "0"):
        monkeypatch.setenv(GZ_LIMIT, bad)
        refused(p, r"MYSTIQUE_MAX_TRACE_BYTES=.* is not a positive size")
    monkeypatch.setenv(GZ_LIMIT, "1k")
    assert max_trace_bytes() == 1024


@pytest.mark.parametrize("data", [
    b"\x1f\x8b",  # a gzip magic and nothing else
    gzip.compress(b'{"nodes": []}', mtime=0) + b"trailing garbage",  # mtime=0: the same ids in every process
    gzip.compress(b'{"nodes": []}', mtime=0)[:-4],  # no length trailer
])
def test_corrupt_gzip_variants(tmp_path, data):
    p = tmp_path / "trace.json.gz"
    p.write_bytes(data)
    refused(p, r"truncated or corrupt gzip data")


def test_concatenated_gzip_members_are_one_document(tmp_path):
    raw = json.dumps(valid_doc()).encode()
    p = tmp_path / "trace.json.gz"
    p.write_bytes(gzip.compress(raw[:50]) + gzip.compress(raw[50:]))
    assert load_trace(p).root_id == 1


@pytest.mark.parametrize("name", ["line\nbreak.json", "cr\rreturn.json", "sep\u2028.json"])
def test_errors_naming_a_hostile_file_or_node_name_stay_on_one_line(tmp_path, name):
    doc = valid_doc()
    doc["nodes"][0]["name"] = "aten::mm\nmystique: error: forged"
    doc["nodes"][0]["inputs"]["values"][0][2] = -1
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    rc, err = _generate(p, tmp_path / "o")
    _one_line_exit_2(rc, err)
    assert "offset is -1" in err and "forged" in err  # shown, escaped
    doc = valid_doc()
    p.write_text(json.dumps(doc))
    rc, err = _generate(p, tmp_path / "o2", "--iteration", "3")  # analysis names the file too
    _one_line_exit_2(rc, err)
    assert "no ProfilerStep#3" in err


def test_kineto_events_with_unhashable_thread_ids_are_tolerated():
    """Found by the fuzz campaign: a Kineto event whose pid or tid is a list or object crashed the plan
    builder (internal error: TypeError: unhashable type: 'list')."""
    from mystique.trace.kineto import parse_kineto_document

    doc = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": [1], "tid": {"t": 2}, "ts": 10, "dur": 5,
         "args": {"Record function id": 7, "External id": 3}},
        {"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": [1], "tid": [[2]], "ts": 11, "dur": 1,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 0, "ts": 12, "dur": 2, "args": {"correlation": 9}},
    ]}
    times = parse_kineto_document(doc)
    assert times.cpu_us == {7: 5.0}


def test_a_duplicate_id_message_escapes_a_newline_in_a_node_name(tmp_path):
    """Found by the fuzz campaign: the message named both nodes raw, so a name with a newline split it."""
    doc = valid_doc()
    dup = copy.deepcopy(doc["nodes"][0])
    dup["name"] = "aten::add\nmystique: error: forged"
    doc["nodes"].append(dup)
    msg = refused(write(tmp_path, doc), r"duplicate node id 123 \(aten::mm and aten::add\\nmystique: error: forged\)")
    assert "\n" not in msg


@pytest.mark.parametrize("k, shape, strides", [
    (2, [4], [1]),  # offset 2^62 elements of 4 bytes
    (None, [2**40, 2**40], [2**40, 1]),  # 2^80 elements
    (None, [2**31, 2**31], [0, 0]),  # an expanded view of 2^62 elements
    # Found by the fuzz campaign: no elements (a 0 size) but a 2^62 size or stride loaded, and the
    # plan generated from it did not load back ("tensor 0 has shape [0, 0, 0, 0, ...]").
    (None, [0, 0, 0, 0, 2**62], [1, 1, 1, 1, 1]),
    (None, [0, 4], [2**62, 1]),
])
def test_a_tensor_beyond_any_device_is_refused(tmp_path, k, shape, strides):
    """Found by the fuzz campaign: a storage offset of 2^62 passed the loader and overflowed torch's size
    arithmetic in generate --batch-scale (internal error: RuntimeError: Storage size calculation overflowed)."""
    doc = valid_doc()
    ins = doc["nodes"][0]["inputs"]
    if k is not None:
        ins["values"][0][k] = 2**62
    ins["shapes"][0], ins["strides"][0] = shape, strides
    refused(write(tmp_path, doc), r"inputs\[0\] (spans .* more than 1 EiB|has shape .*: more than 2\^60 elements"
                                  r"|has (shape|strides) .*: a size or stride beyond 2\^60)")
    rc, err = _generate(write(tmp_path, doc), tmp_path / "o", "--batch-scale", "2")
    _one_line_exit_2(rc, err)


@pytest.mark.parametrize("text", ['{"0": [0, ' + "9" * 5000 + "]}", "[" * 5000 + "]" * 5000])
def test_an_unusable_tensor_range_string_is_bad_input(tmp_path, text):
    """Found by the fuzz campaign: tensor_range is JSON inside a string, decoded on its own; a 5000-digit
    number in it ended in "internal error: ValueError: Exceeds the limit (4300 digits)"."""
    doc = valid_doc()
    doc["nodes"][0]["attrs"][-1]["value"] = text
    refused(write(tmp_path, doc), r"attribute tensor_range is not usable JSON \((ValueError|RecursionError)\)")
