"""Property-based campaign: corrupted execution traces never crash the CLI.

Real traces (the ones ``../shared/traces/`` holds, and ``debug``-size captures of our own
workloads) are mutated: node ids, parents (cycles, several roots, dangling), names, schemas,
tensor fields (ids, storages, offsets, sizes, item sizes, devices), shapes, strides, dtypes and
type strings, argument values and counts, attributes (``tensor_range``, ``rf_id``, ...), whole nodes
(deleted, duplicated), the header; then the bytes (truncation, bit flips, other encodings, gzip
variants, deep nesting) and the file's name. ``mystique generate`` runs on each, in process, and
must exit 0 (a benchmark whose skipped ops are counted), 2 or 3 with one line on stderr; exit 1
("internal error") or an exception past the CLI fails the test.

The default run draws a few hundred cases (:func:`test_fuzz_fast`); ``-m slow`` runs the 10,000-case
campaign (:func:`test_fuzz_campaign`). ``python tests/test_fuzz_traces.py N`` runs N random cases
outside pytest and groups the failures by their message.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gzip
import io
import json
import marshal
import random
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mystique.trace.files import gc_paused

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "traces"
SHARED = HERE.parents[1] / "shared" / "traces"

# (archive in ../shared/traces, member): small enough to mutate case by case. The full GPT-2 and
# ResNet traces (24 MB, 14 MB) stand in through their trimmed copies in tests/data/traces.
SHARED_MEMBERS = [
    ("param__pt2_et.json.tar.gz", "pt2_et.json"),
    ("chakra__1.0.2-chakra.0.0.4.tgz", "1.0.2-chakra.0.0.4.json"),
    ("param__dlrm_pytorch_et.tar.gz", "dlrm_pytorch_et/dlrm_eg_0.json"),
    ("param__dlrm_pytorch_et.tar.gz", "dlrm_pytorch_et/dlrm_eg_5.json"),
]
DATA_FILES = ["hf_GPT2_trimmed.json.gz", "resnet_1gpu_trimmed.json.gz"]


# ------------------------------------------------------------------------------------------------
# Choices: backed by hypothesis (shrinkable) or by random.Random (the standalone campaign)


class Chooser:
    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.int(0, len(seq) - 1)]

    def bool(self, p: float = 0.5) -> bool:
        return self.int(0, 999) < int(p * 1000)


class RandomChooser(Chooser):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class DataChooser(Chooser):
    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self.data = data
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))


# ------------------------------------------------------------------------------------------------
# Pools of hostile values

NASTY_INTS = [0, 1, -1, 2, 3, -2, 7, 64, 1023, 2**31 - 1, 2**31, -(2**31), 2**32, 2**53 + 1, 2**62, 2**63 - 1,
              2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30)]
NASTY_STRINGS = ["", " ", "\n", "x", "cpu", "cuda:0", "cuda:-1", "meta", "CUDA", "nan", "<None>", "None", "1",
                 "aten::mm", "Tensor(float)", "\u2028", "\x00", "\ud800", "é", "名前", "a\nimport os\n", "'''", '"""',
                 "\\", "x" * 300, "{\"0\": [0, 1]}", "[1, 2]", "ProfilerStep#1", "## forward ##"]
NASTY_FLOATS = [0.0, -0.0, 0.5, -1.5, 1e308, -1e308, 1e-320, float("nan"), float("inf"), float("-inf"), 3.0]
TYPE_STRINGS = [
    "Tensor(float)", "Tensor(double)", "Tensor(c10::Half)", "Tensor(c10::BFloat16)", "Tensor(long int)",
    "Tensor(int)", "Tensor(bool)", "Tensor(unsigned char)", "Tensor(signed char)", "Tensor(short int)",
    "Tensor(c10::complex<float>)", "Tensor(c10::complex<c10::Half>)", "Tensor(c10::Float8_e4m3fn)",
    "Tensor(c10::Float4_e2m1fn_x2)", "Tensor(c10::qint8)", "Tensor(c10::quint4x2)", "Tensor(c10::bits8)",
    "Tensor(c10::dummy_uint1_7_t<3>)", "Tensor(long unsigned int)", "Tensor(nullptr (uninitialized))",
    "Tensor(weird)", "Tensor", "Tensor()", "Tensor(float", "Tensor(float))", "Int", "Double", "Bool", "String",
    "None", "Device", "Layout", "ScalarType", "MemoryFormat", "Generator", "Stream", "Storage", "Scalar",
    "GenericList[Tensor(float),Int]", "GenericList[Tensor(float)]", "GenericList[Int]", "GenericList[]",
    "GenericList[GenericList[Tensor(float)]]", "Tuple[String,String]", "Tuple[", "]", "GenericList[Int", "[",
    "Optional[Tensor(float)]", "GenericList[Tensor(float),Tensor(float),Tensor(float)]", "", "int[]",
    "Tensor(c10::complex<double>)", "Tensor(c10::Float8_e8m0fnu)", "Tensor(unsigned int)",
]
OP_NAMES = [
    "aten::mm", "aten::add", "aten::add_", "aten::addmm", "aten::embedding", "aten::embedding_bag",
    "aten::_embedding_bag", "aten::index", "aten::index_put_", "aten::gather", "aten::scatter_add_",
    "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::one_hot", "aten::_foreach_add_",
    "aten::_foreach_addcdiv_", "aten::pow", "aten::log", "aten::binary_cross_entropy", "aten::view",
    "aten::as_strided", "aten::empty", "aten::empty_strided", "aten::zeros", "aten::copy_", "aten::cat",
    "aten::stack", "aten::t", "aten::transpose", "aten::reshape", "aten::expand", "aten::set_",
    "aten::resize_", "aten::to", "aten::_to_copy", "aten::lift_fresh", "aten::item", "aten::_local_scalar_dense",
    "aten::conv2d", "aten::convolution_backward", "aten::native_layer_norm", "aten::linear", "aten::matmul",
    "aten::bmm", "aten::softmax", "aten::dropout", "aten::randperm", "aten::arange", "aten::full",
    "aten::scalar_tensor", "aten::nonexistent", "aten::", "aten::mm.out", "aten::mm.default", "prims::add",
    "prims::nonexistent", "c10d::allreduce_", "c10d::broadcast_", "record_param_comms", "fbgemm::foo",
    "torchvision::nms", "nosuchns::op", "torch::autograd::AccumulateGrad", "autograd::engine::evaluate_function: X",
    "ProfilerStep#0", "ProfilerStep#5", "ProfilerStep#-1", "ProfilerStep#99999999999999999999", "ProfilerStep#",
    "## forward ##", "[pytorch|profiler|execution_trace|thread]", "[pytorch|profiler|execution_trace|process]",
    "profiler::_record_function_enter_new", "cudaStreamSynchronize", "", "\n", "aten::mm\nimport os", "a::b::c",
    "::", "aten::mm ", "Optimizer.step#Adam.step", "aten::_fused_adam_", "aten::detach", "aten::zero_",
    "aten::fill_", "aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::multinomial", "aten::nonzero",
    "aten::masked_select", "aten::unique", "aten::repeat_interleave", "aten::split", "aten::chunk",
    "aten::unbind", "aten::max_pool2d_with_indices", "aten::_pin_memory", "aten::record_stream",
]
SCHEMAS = [
    "aten::mm(Tensor self, Tensor mat2) -> Tensor",
    "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, "
    "bool sparse=False) -> Tensor",
    "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
    "aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "aten::as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)",
    "aten::set_.source_Storage(Tensor(a!) self, Storage source) -> Tensor(a!)",
    "aten::resize_(Tensor(a!) self, SymInt[] size, *, MemoryFormat? memory_format=None) -> Tensor(a!)",
    "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
    "aten::nonexistent(Tensor self) -> Tensor",
    "nosuchns::op(Tensor self) -> Tensor",
    "garbage", "aten::mm(", "aten::mm(Tensor self, Tensor mat2) ->", "(Tensor self) -> Tensor", "",
    "aten::mm(Tensor self, Tensor mat2, Tensor a, Tensor b, Tensor c) -> Tensor",
    "aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None) -> Tensor",
]
HOSTILE_NAMES = ["trace.json", "a\nb.json", 'q"uote\'s.json', 'x"""y.json', "back\\slash.json", "t\rr.json",
                 "名前.json", "sp ace.json", "-o.json", "--force.json", "x\u2028y.json", "#comment.json",
                 "{source}.json", "%s.json", "a\n\"\"\"\nimport os; os.system('echo pwned')\n#.json"]


def nasty_value(c: Chooser, depth: int = 0) -> Any:
    k = c.int(0, 11 if depth < 2 else 6)
    if k == 0:
        return None
    if k == 1:
        return c.bool()
    if k in (2, 3):
        return c.choice(NASTY_INTS)
    if k == 4:
        return c.choice(NASTY_FLOATS)
    if k in (5, 6):
        return c.choice(NASTY_STRINGS)
    if k in (7, 8):
        return [nasty_value(c, depth + 1) for _ in range(c.int(0, 3))]
    if k == 9:
        return {c.choice(["values", "shapes", "types", "name", "value", "0", ""]): nasty_value(c, depth + 1)}
    if k == 10:  # a tensor-looking list
        return [c.choice(NASTY_INTS), c.choice(NASTY_INTS), c.choice(NASTY_INTS), c.choice(NASTY_INTS),
                c.choice([0, 1, 2, 4, 8, 16, 3, -4, 2**40]), c.choice(["cpu", "cuda:0", None, 3, "", "meta"])]
    nested: Any = 0
    for _ in range(c.choice([33, 100, 400, 900])):  # json.dumps recurses: deeper text comes from mutate_bytes
        nested = [nested]
    return nested


# ------------------------------------------------------------------------------------------------
# Locating things in a decoded document (both the 1.0.1 flat and the chakra layouts)


def _nodes(doc: dict) -> list:
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    return nodes if isinstance(nodes, list) else []


def _blocks(node: dict) -> list[dict]:
    """The argument blocks of a node as dicts with values/shapes/types/strides keys (views on the node)."""
    out = []
    if not isinstance(node, dict):
        return out
    for side in ("inputs", "outputs"):
        b = node.get(side)
        if isinstance(b, dict):
            out.append(b)
    if "input_types" in node or "output_types" in node:  # 1.0.1: flat keys, adapted through a proxy
        for side, short in (("inputs", "input"), ("outputs", "output")):
            proxy = _FlatBlock(node, side, short)
            out.append(proxy)
    return out


class _FlatBlock:
    """values/shapes/types/strides of a 1.0.1 node, read and written through the flat keys."""

    def __init__(self, node: dict, side: str, short: str) -> None:
        self.node, self.keys = node, {"values": side, "shapes": f"{short}_shapes", "types": f"{short}_types",
                                      "strides": f"{short}_strides"}

    def get(self, key: str, default: Any = None) -> Any:
        return self.node.get(self.keys[key], default)

    def __setitem__(self, key: str, value: Any) -> None:
        self.node[self.keys[key]] = value

    def __contains__(self, key: str) -> bool:
        return self.keys[key] in self.node

    def pop(self, key: str, default: Any = None) -> Any:
        return self.node.pop(self.keys[key], default)


def _tensor_slots(values: Any, types: Any) -> list[tuple[list, int]]:
    """(container, index) of every tensor value (a 6-list whose type starts with Tensor)."""
    out: list[tuple[list, int]] = []

    def visit(container: list, i: int, typ: Any) -> None:
        v = container[i]
        if isinstance(typ, str) and typ.startswith("Tensor") and isinstance(v, list) and len(v) == 6:
            out.append((container, i))
        elif isinstance(v, list) and isinstance(typ, str) and "[" in typ:
            inner = typ[typ.index("[") + 1:-1].split(",")
            for j in range(len(v)):
                visit(v, j, inner[j] if j < len(inner) else inner[-1] if inner else "")

    if isinstance(values, list) and isinstance(types, list):
        for i in range(min(len(values), len(types))):
            visit(values, i, types[i])
    return out


def _all_tensors(doc: dict) -> list[tuple[list, int]]:
    out = []
    for n in _nodes(doc):
        for b in _blocks(n):
            out.extend(_tensor_slots(b.get("values"), b.get("types")))
    return out


def _pick_node(doc: dict, c: Chooser) -> dict | None:
    nodes = [n for n in _nodes(doc) if isinstance(n, dict)]
    if not nodes:
        return None
    # favour operator nodes: they reach the plan builder
    ops = [n for n in nodes if isinstance(n.get("name"), str) and "::" in n["name"]]
    return c.choice(ops if ops and c.bool(0.8) else nodes)


def _parent_key(node: dict) -> str:
    return "parent" if "parent" in node or "ctrl_deps" not in node else "ctrl_deps"


def _attr_set(node: dict, name: str, value: Any) -> None:
    attrs = node.get("attrs")
    if isinstance(attrs, list):
        for a in attrs:
            if isinstance(a, dict) and a.get("name") == name:
                a["value"] = value
                return
        attrs.append({"name": name, "type": "string", "value": value})
    else:
        node[name] = value


# ------------------------------------------------------------------------------------------------
# Mutations of the decoded document


def m_tensor_field(doc: dict, c: Chooser) -> str:
    slots = _all_tensors(doc)
    if not slots:
        return "none"
    container, i = c.choice(slots)
    t = list(container[i])
    k = c.int(0, 5)
    if k == 5:
        t[5] = c.choice(["cpu", "cuda:0", "cuda:7", "meta", "", None, 3, "xla:0", "cuda:-1", "CPU", "\n", ["cpu"]])
    elif c.bool(0.85):
        t[k] = c.choice(NASTY_INTS)
    else:
        t[k] = nasty_value(c)
    container[i] = t
    return f"tensor[{k}]"


def m_storage_alias(doc: dict, c: Chooser) -> str:
    slots = _all_tensors(doc)
    if len(slots) < 2:
        return "none"
    (ca, ia), (cb, ib) = c.choice(slots), c.choice(slots)
    a, b = list(ca[ia]), cb[ib]
    what = c.int(0, 2)
    if what == 0:
        a[1] = b[1]  # share a storage with a tensor of another dtype/size
    elif what == 1:
        a[0], a[1] = b[0], b[1]  # same tensor id, other metadata
    else:
        a = list(b)  # the same tensor value in another place
    ca[ia] = a
    return f"alias{what}"


def _pick_block_entry(doc: dict, c: Chooser, key: str) -> tuple[Any, int] | None:
    cands = []
    for n in _nodes(doc):
        for b in _blocks(n):
            v = b.get(key)
            if isinstance(v, list) and v:
                cands.append(v)
    if not cands:
        return None
    lst = c.choice(cands)
    return lst, c.int(0, len(lst) - 1)


def m_shape(doc: dict, c: Chooser, key: str = "shapes") -> str:
    got = _pick_block_entry(doc, c, key)
    if got is None:
        return "none"
    lst, i = got
    entry = lst[i]
    if isinstance(entry, list) and entry and all(isinstance(x, list) for x in entry) and c.bool():
        lst, i = entry, c.int(0, len(entry) - 1)
        entry = lst[i]
    k = c.int(0, 6)
    if isinstance(entry, list) and entry and k <= 2:
        entry = list(entry)
        entry[c.int(0, len(entry) - 1)] = c.choice(NASTY_INTS) if k < 2 else nasty_value(c)
    elif k == 3 and isinstance(entry, list):
        entry = list(entry) + [c.choice([1, 2, 0, -1, 2**40])]
    elif k == 4 and isinstance(entry, list) and entry:
        entry = list(entry)[:-1]
    elif k == 5:
        entry = nasty_value(c)
    else:
        entry = [c.choice(NASTY_INTS) for _ in range(c.int(0, 5))]
    lst[i] = entry
    return f"{key}{k}"


def m_type(doc: dict, c: Chooser) -> str:
    got = _pick_block_entry(doc, c, "types")
    if got is None:
        return "none"
    lst, i = got
    lst[i] = c.choice(TYPE_STRINGS) if c.bool(0.9) else nasty_value(c)
    return "type"


def m_value(doc: dict, c: Chooser) -> str:
    got = _pick_block_entry(doc, c, "values")
    if got is None:
        return "none"
    lst, i = got
    v = lst[i]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and c.bool(0.6):
        lst[i] = c.choice(NASTY_INTS + NASTY_FLOATS)
    elif isinstance(v, list) and v and c.bool(0.5):
        v = list(v)
        j = c.int(0, len(v) - 1)
        v[j] = nasty_value(c) if c.bool() else c.choice(NASTY_INTS)
        lst[i] = v
    else:
        lst[i] = nasty_value(c)
    return "value"


def m_arity(doc: dict, c: Chooser) -> str:
    """Drop, duplicate or swap an argument consistently in values/shapes/types/strides (or not)."""
    node = _pick_node(doc, c)
    if node is None:
        return "none"
    blocks = _blocks(node)
    if not blocks:
        return "none"
    b = c.choice(blocks)
    keys = [k for k in ("values", "shapes", "types", "strides") if isinstance(b.get(k), list)]
    if not keys:
        return "none"
    n = min(len(b.get(k)) for k in keys)
    op = c.int(0, 3)
    consistent = c.bool(0.8)
    for k in keys if consistent else [c.choice(keys)]:
        lst = list(b.get(k))
        if op == 0 and n:
            del lst[c.int(0, n - 1) if consistent else 0]
        elif op == 1 and n:
            lst.append(lst[0])
        elif op == 2 and n > 1:
            lst[0], lst[1] = lst[1], lst[0]
        else:
            lst = []
        b[k] = lst
    return f"arity{op}{'c' if consistent else 'x'}"


def m_id(doc: dict, c: Chooser) -> str:
    node = _pick_node(doc, c)
    nodes = _nodes(doc)
    if node is None:
        return "none"
    k = c.int(0, 3)
    if k == 0 and nodes:
        other = c.choice(nodes)
        node["id"] = other.get("id") if isinstance(other, dict) else 0
    elif k == 1:
        node["id"] = c.choice(NASTY_INTS)
    elif k == 2:
        node["id"] = nasty_value(c)
    else:
        node.pop("id", None)
    return f"id{k}"


def m_parent(doc: dict, c: Chooser) -> str:
    node = _pick_node(doc, c)
    nodes = [n for n in _nodes(doc) if isinstance(n, dict)]
    if node is None:
        return "none"
    key = _parent_key(node)
    k = c.int(0, 5)
    if k == 0:
        node[key] = node.get("id")  # a second root
    elif k == 1 and nodes:
        node[key] = c.choice(nodes).get("id")  # possibly a descendant: a cycle
    elif k == 2:
        node[key] = c.choice(NASTY_INTS)
    elif k == 3:
        node[key] = [node.get(key)] if c.bool() else []
    elif k == 4:
        node[key] = nasty_value(c)
    else:
        node.pop(key, None)
    return f"parent{k}"


def m_name(doc: dict, c: Chooser) -> str:
    node = _pick_node(doc, c)
    if node is None:
        return "none"
    node["name"] = c.choice(OP_NAMES) if c.bool(0.9) else nasty_value(c)
    return "name"


def m_schema(doc: dict, c: Chooser) -> str:
    node = _pick_node(doc, c)
    if node is None:
        return "none"
    _attr_set(node, "op_schema", c.choice(SCHEMAS) if c.bool(0.85) else nasty_value(c))
    return "schema"


def m_attr(doc: dict, c: Chooser) -> str:
    node = _pick_node(doc, c)
    if node is None:
        return "none"
    name = c.choice(["rf_id", "seq_id", "tid", "fw_parent", "scope", "kernel_backend", "kernel_file",
                     "tensor_range", "tensor_range", "fw_tid", "op_schema", "pg_name", "collective_name",
                     "in_msg_nelems", "in_split_size", "out_split_size", "dtype", "pg_size", "rank"])
    if name == "tensor_range" and c.bool(0.7):
        rng = {str(c.choice([0, 1, 2, 3, -1, 99, 2**70])): [c.choice(NASTY_INTS + NASTY_FLOATS),
                                                            c.choice(NASTY_INTS + NASTY_FLOATS)]
               for _ in range(c.int(0, 3))}
        value: Any = json.dumps(rng) if c.bool() else rng
    elif name in ("collective_name", "kernel_backend", "pg_name", "dtype") and c.bool():
        value = c.choice(["all_reduce", "all_to_allv", "broadcast", "triton", "", "Float", "weird"])
    else:
        value = nasty_value(c)
    attrs = node.get("attrs")
    if isinstance(attrs, list) and c.bool(0.1):
        attrs.append(nasty_value(c))  # a malformed attribute entry
    else:
        _attr_set(node, name, value)
    return f"attr:{name}"


def m_structure(doc: dict, c: Chooser) -> str:
    nodes = _nodes(doc)
    if not nodes:
        return "none"
    k = c.int(0, 4)
    i = c.int(0, len(nodes) - 1)
    if k == 0:
        del nodes[i]
    elif k == 1:
        nodes.append(json.loads(json.dumps(nodes[i])))
    elif k == 2:
        dup = json.loads(json.dumps(nodes[i]))
        if isinstance(dup, dict):
            dup["id"] = max((n.get("id") for n in nodes if isinstance(n, dict) and type(n.get("id")) is int),
                            default=0) + 1
        nodes.append(dup)
    elif k == 3:
        nodes[i] = nasty_value(c)
    else:
        j = c.int(0, len(nodes) - 1)
        nodes[i], nodes[j] = nodes[j], nodes[i]
    return f"struct{k}"


def m_header(doc: dict, c: Chooser) -> str:
    k = c.int(0, 4)
    if k == 0:
        doc["schema"] = c.choice(["1.0.1", "1.0.2-chakra.0.0.4", "1.1.1-chakra.0.0.4", "1.0.3", "2.0.0", "",
                                  " 1.1.0 ", "1.1.1-chakra.", "1.0.1\n"]) if c.bool(0.8) else nasty_value(c)
    elif k == 1:
        doc[c.choice(["pid", "time", "start_ts", "finish_ts", "extra"])] = nasty_value(c)
    elif k == 2:
        doc["nodes"] = nasty_value(c) if c.bool(0.3) else doc.get("nodes")
    elif k == 3:
        doc.pop(c.choice(["schema", "nodes", "pid"]), None)
    else:
        doc[c.choice(NASTY_STRINGS)] = nasty_value(c)
    return f"header{k}"


def m_steps(doc: dict, c: Chooser) -> str:
    """Profiler steps: rename, duplicate, or move iteration markers."""
    steps = [n for n in _nodes(doc) if isinstance(n, dict) and str(n.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        node = _pick_node(doc, c)
        if node is None:
            return "none"
        steps = [node]
    node = c.choice(steps)
    node["name"] = c.choice(["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#7", "ProfilerStep#-3",
                             "ProfilerStep#99999999999999999999", "ProfilerStep#٣", "ProfilerStep#1\n",
                             "ProfilerStep#", "ProfilerStep#x"])
    return "steps"


MUTATIONS: list[tuple[Callable[[dict, Chooser], str], int]] = [
    (m_tensor_field, 14), (m_storage_alias, 6), (m_shape, 12), (lambda d, c: m_shape(d, c, "strides"), 6),
    (m_type, 10), (m_value, 10), (m_arity, 6), (m_id, 4), (m_parent, 5), (m_name, 8), (m_schema, 6),
    (m_attr, 7), (m_structure, 4), (m_header, 2), (m_steps, 2),
]
_WEIGHTED = [f for f, w in MUTATIONS for _ in range(w)]


# ------------------------------------------------------------------------------------------------
# Mutations of the bytes


def _deep_text(c: Chooser) -> bytes:
    n = c.choice([100, 990, 1500, 5000, 100_000])
    return b"[" * n + b"]" * n


def mutate_bytes(raw: bytes, c: Chooser) -> tuple[bytes, str]:
    k = c.int(0, 16)
    if k == 0:
        return raw[: c.int(0, max(len(raw) - 1, 0))], "truncate"
    if k == 1:
        b = bytearray(raw)
        for _ in range(c.int(1, 8)):
            if b:
                b[c.int(0, len(b) - 1)] = c.int(0, 255)
        return bytes(b), "flip"
    if k == 2:
        pos = c.int(0, len(raw))
        return raw[:pos] + bytes([c.int(0, 255)]) * c.int(1, 3) + raw[pos:], "insert"
    if k == 3:
        enc = c.choice(["utf-16", "utf-16-le", "utf-32", "utf-8-sig", "latin-1"])
        try:
            return raw.decode("utf-8").encode(enc), enc
        except UnicodeError:
            return raw, "enc-failed"
    if k == 4:
        return gzip.compress(raw, mtime=0), "gzip"
    if k == 5:
        z = gzip.compress(raw, mtime=0)
        return z[: c.int(0, len(z) - 1)], "gzip-truncate"
    if k == 6:
        z = bytearray(gzip.compress(raw, mtime=0))
        for _ in range(c.int(1, 4)):
            z[c.int(0, len(z) - 1)] = c.int(0, 255)
        return bytes(z), "gzip-flip"
    if k == 7:
        half = c.int(0, len(raw))
        return gzip.compress(raw[:half], mtime=0) + gzip.compress(raw[half:], mtime=0), "gzip-members"
    if k == 8:
        return gzip.compress(raw, mtime=0) + c.choice([b"\x00" * 8, b"garbage", b"\x1f\x8b"]), "gzip-trailer"
    if k == 9:
        return gzip.compress(gzip.compress(raw, mtime=0), mtime=0), "gzip-gzip"
    if k == 10:  # a value replaced by text: NaN, Infinity, a huge number, deep nesting, an invalid escape
        token = c.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000, b"-0", b'"\\ud800"',
                          b'"\\u0000"', _deep_text(c), b"1.0", b"true", b'"\xff\xfe"'])
        pos = raw.find(b"[", c.int(0, max(len(raw) - 1, 0)))
        if pos < 0:
            return raw, "none"
        end = raw.find(b"]", pos)
        return raw[:pos] + token + raw[end + 1:], "token"
    if k == 11:
        return b"\xef\xbb\xbf" + raw, "bom"
    if k == 12:
        return raw.replace(b'"name": "', b'"name": "\\n', 1), "newline-name"
    if k == 13:
        return raw + c.choice([b"\n{}", b"]", b"\x00", b" "]), "trailing"
    if k == 14:
        return _deep_text(c), "deep"
    if k == 15:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            info = tarfile.TarInfo("trace.json")
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
        return buf.getvalue(), "tar"
    return c.choice([b"", b"{}", b"[]", b"null", b"0", b'{"nodes": []}', b'{"schema": "1.1.1", "nodes": []}',
                     b'{"schema": "1.1.1-chakra.0.0.4", "nodes": [{}]}', b"\x1f\x8b", b"\x00" * 64]), "tiny"


# ------------------------------------------------------------------------------------------------
# Mutations of a captured trace folder's companions: kineto.json.gz and capture.json


def mutate_kineto(doc: Any, c: Chooser) -> tuple[Any, str]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not events or c.bool(0.1):
        return nasty_value(c), "kineto-doc"
    for _ in range(c.int(1, 6)):
        i = c.int(0, len(events) - 1)
        ev = events[i]
        if not isinstance(ev, dict) or c.bool(0.05):
            events[i] = nasty_value(c)
            continue
        key = c.choice(["ph", "cat", "name", "dur", "ts", "pid", "tid", "args", "args", "args"])
        if key == "args" and isinstance(ev.get("args"), dict):
            ak = c.choice(["Record function id", "External id", "correlation", "Record function id"])
            ev["args"][ak] = c.choice(NASTY_INTS + NASTY_FLOATS) if c.bool(0.7) else nasty_value(c)
        elif key in ("dur", "ts"):
            ev[key] = c.choice(NASTY_INTS + NASTY_FLOATS) if c.bool(0.7) else nasty_value(c)
        elif key in ("ph", "cat"):
            ev[key] = c.choice(["X", "B", "E", "i", "cpu_op", "kernel", "cuda_runtime", "user_annotation",
                                "gpu_memcpy", None, 3, ""])
        elif key == "name":
            ev[key] = c.choice(["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#99999999999999999999",
                                "aten::mm", "", None, 7])
        else:
            ev[key] = nasty_value(c)
    return doc, "kineto-events"


def mutate_capture(raw: bytes, c: Chooser) -> tuple[bytes, str]:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = {}
    k = c.int(0, 3)
    if k == 0 or not isinstance(doc, dict):
        return json.dumps(nasty_value(c)).encode(), "capture-doc"
    if k == 1:
        return _deep_text(c), "capture-deep"
    for _ in range(c.int(1, 4)):
        key = c.choice(["step_time", "workload", "config", "mode", "target", "function", "threads", "device_name",
                        "kind", "distributed", "seed", "dtype", "device"])
        if key == "step_time" and isinstance(doc.get(key), dict) and c.bool():
            doc[key]["median_ms"] = c.choice(NASTY_INTS + NASTY_FLOATS + [True, "1"])
        else:
            doc[key] = nasty_value(c)
    return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"), "capture-fields"


# ------------------------------------------------------------------------------------------------
# Seeds


@dataclass
class Seed:
    name: str
    frozen: bytes  # the decoded document, marshalled (a fresh copy per case, 5x faster than JSON)
    node_count: int
    capture_json: bytes | None = None  # a captured trace folder's companions, mutated too
    kineto: bytes | None = None  # the Kineto document, marshalled

    def document(self) -> dict:
        return marshal.loads(self.frozen)


def _seed(name: str, raw: bytes, folder: Path | None = None) -> Seed:
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    seed = Seed(name, marshal.dumps(doc), len(doc["nodes"]))
    if folder is not None:
        seed.capture_json = (folder / "capture.json").read_bytes()
        seed.kineto = marshal.dumps(json.loads(gzip.decompress((folder / "kineto.json.gz").read_bytes())))
    return seed


def load_seeds(capture_dir: Path | None = None, workloads: Sequence[tuple[str, str]] = ()) -> list[Seed]:
    seeds: list[Seed] = []
    if SHARED.is_dir():
        for archive, member in SHARED_MEMBERS:
            src = SHARED / archive
            if not src.is_file():
                continue
            with tarfile.open(src) as tf:
                fh = tf.extractfile(member)
                if fh is not None:
                    seeds.append(_seed(f"shared:{member}", fh.read()))
    for name in DATA_FILES:
        seeds.append(_seed(f"data:{name}", (DATA / name).read_bytes()))
    if not any(s.name.startswith("shared:") for s in seeds):
        seeds.append(_seed("data:pt2_et.json", (DATA / "pt2_et.json").read_bytes()))
    if capture_dir is not None and workloads:
        from mystique.capture import capture

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            for wl, mode in workloads:
                out = capture_dir / f"{wl}-{mode}"
                if not out.exists():
                    capture(wl, out, config="debug", mode=mode, steps=1, warmup=0)
                seeds.append(_seed(f"capture:{wl}-{mode}", (out / "trace.json.gz").read_bytes(), out))
    return seeds


# ------------------------------------------------------------------------------------------------
# One case


@dataclass
class Case:
    seed: str
    mutations: list[str] = field(default_factory=list)
    file_name: str = "trace.json"
    options: list[str] = field(default_factory=list)
    draw: int | None = None  # the standalone campaign's random seed of this case


@dataclass
class Outcome:
    code: int
    stderr: str
    stdout: str
    problem: str = ""  # why the case violates the contract ("" when it does not)


GENERATE_OPTIONS = [[], [], [], [], ["--dtype", "bfloat16"], ["--obfuscate"], ["--keep", "aten::"],
                    ["--drop", "mm|add"], ["--iteration", "0"], ["--iteration", "7"], ["--batch-scale", "2"],
                    ["--format", "json"], ["--device", "cuda:3"]]


def make_case(seeds: Sequence[Seed], c: Chooser, folder: Path) -> tuple[Case, Path]:
    """Draw a case and write its trace file into ``folder``; returns the case and the file."""
    seed = c.choice(seeds)
    case = Case(seed.name)
    doc = seed.document()
    for _ in range(c.int(1, 3)):
        fn = c.choice(_WEIGHTED)
        case.mutations.append(fn(doc, c))
    raw = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    if c.bool(0.25):
        raw, what = mutate_bytes(raw, c)
        case.mutations.append(f"bytes:{what}")
    case.file_name = c.choice(HOSTILE_NAMES) if c.bool(0.1) else c.choice(["trace.json", "trace.json.gz", "x.json"])
    case.options = list(c.choice(GENERATE_OPTIONS))
    path = folder / case.file_name
    if seed.capture_json is not None and c.bool(0.5):  # a captured trace folder with its companions
        tdir = folder / "tdir"
        tdir.mkdir()
        path = tdir / c.choice(["trace.json", "trace.json.gz"])
        cap = seed.capture_json
        if c.bool(0.3):
            cap, what = mutate_capture(cap, c)
            case.mutations.append(what)
        (tdir / "capture.json").write_bytes(cap)
        if seed.kineto is not None:
            kin: Any = marshal.loads(seed.kineto)
            if c.bool(0.4):
                kin, what = mutate_kineto(kin, c)
                case.mutations.append(what)
            kraw = json.dumps(kin, allow_nan=True).encode("utf-8", "surrogatepass")
            if c.bool(0.1):
                kraw, what = mutate_bytes(kraw, c)
                case.mutations.append(f"kineto-bytes:{what}")
            (tdir / "kineto.json.gz").write_bytes(gzip.compress(kraw, mtime=0))
        case.file_name = f"tdir/{path.name}"
        path.write_bytes(raw)
        if c.bool():
            path = tdir  # the folder itself names the trace
        return case, path
    path.write_bytes(raw)
    return case, path


def run_generate(path: Path, out: Path, options: Sequence[str]) -> Outcome:
    from mystique.cli import main

    err, so = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(so):
        try:
            code = main(["-q", "generate", str(path), "-o", str(out), *options])
        except BaseException as exc:  # noqa: BLE001 - anything past the CLI is the defect we look for
            return Outcome(-1, err.getvalue(), so.getvalue(), f"raised past the CLI: {type(exc).__name__}: {exc}")
    return Outcome(code, err.getvalue(), so.getvalue())


def check_outcome(o: Outcome, out: Path) -> str:
    """Why the outcome breaks the contract, or ""."""
    if o.problem:
        return o.problem
    lines = o.stderr.splitlines()
    if o.code in (2, 3):
        if len(lines) != 1 or not o.stderr.endswith("\n"):
            return f"exit {o.code} with {len(lines)} stderr lines: {o.stderr[:300]!r}"
        if not lines[0].startswith("mystique: error: ") or "internal error" in lines[0]:
            return f"exit {o.code} but stderr is {lines[0][:300]!r}"
        if out.exists():
            return f"exit {o.code} left the output folder {out} behind"
        return ""
    if o.code != 0:
        return f"exit {o.code}: {o.stderr.strip()[:400]}"
    if "Traceback" in o.stderr:
        return f"exit 0 with a traceback on stderr: {o.stderr[:300]!r}"
    try:
        plan = json.loads((out / "benchmark.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"exit 0 without a readable benchmark.json: {exc}"
    ops = plan["ops"]
    meta = plan["metadata"]
    if meta["ops_total"] != len(ops):
        return f"ops_total {meta['ops_total']} != {len(ops)} ops"
    skipped = sum(1 for op in ops if op["action"] == "skip")
    if sum(s["count"] for s in meta["skipped"].values()) != skipped:
        return "skipped ops are not all counted in metadata.skipped"
    for t in plan["tensors"]:
        if any((not isinstance(d, int)) or d < 0 for d in t["shape"]) or int(t["offset"]) < 0:
            return f"benchmark tensor with a negative or non-integer shape/offset: {t}"
    for s in plan["storages"]:
        if int(s["nbytes"]) < 0:
            return f"benchmark storage with negative nbytes: {s}"
    from mystique.replay.plan import plan_problem

    problem = plan_problem(plan)
    if problem:  # what generate writes, replay must load
        return f"benchmark.json does not load back: {problem}"
    if (out / "benchmark.py").exists():
        src = (out / "benchmark.py").read_text(encoding="utf-8")
        try:
            tree = ast.dump(ast.parse(src, "benchmark.py"))
        except SyntaxError as exc:
            return f"benchmark.py does not compile: {exc}"
        if tree != _reference_program():
            return "benchmark.py is not the standard program: code was injected from the trace"
    return ""


def _reference_program() -> str:
    """The syntax tree of every benchmark.py: the replay engine and its main (plans differ only in data)."""
    from mystique.replay.generate import runtime_source

    return _reference_program_of(runtime_source())


@functools.lru_cache(maxsize=2)
def _reference_program_of(runtime: str) -> str:
    from mystique.replay.generate import benchmark_py
    from mystique.replay.plan import Plan

    return ast.dump(ast.parse(benchmark_py(Plan({"metadata": {"source": "trace.json"}, "ops": []}))))


@dataclass
class Tally:
    codes: Counter = field(default_factory=Counter)
    seeds: Counter = field(default_factory=Counter)
    problems: dict[str, list[tuple[Case, str]]] = field(default_factory=dict)
    cases: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.cases} cases in {self.seconds:.1f} s: "
                + ", ".join(f"exit {k}: {v}" for k, v in sorted(self.codes.items()))
                + f"; contract violations: {sum(len(v) for v in self.problems.values())}")


def one_case(seeds: Sequence[Seed], c: Chooser, tally: Tally | None = None,
             draw: int | None = None) -> tuple[Case, Outcome, str]:
    with tempfile.TemporaryDirectory(prefix="mystique-fuzz-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        with gc_paused():  # copying a seed builds 10^5 objects: collections would rescan them all
            case, path = make_case(seeds, c, folder)
        case.draw = draw
        out = folder / "bench"
        outcome = run_generate(path, out, case.options)
        with gc_paused():
            problem = check_outcome(outcome, out)
        left = [p.name for p in folder.iterdir() if p.name not in (case.file_name, "bench", "tdir")]
        if not problem and left:
            problem = f"left files behind: {left}"
        if tally is not None:
            tally.cases += 1
            tally.codes[outcome.code] += 1
            tally.seeds[case.seed] += 1
            tally.seconds += time.perf_counter() - t0
            if problem:
                key = problem[:100] if problem.startswith(("exit 1", "raised past")) else problem.split(":")[0][:80]
                tally.problems.setdefault(key, []).append((case, problem))
        return case, outcome, problem


# ------------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module")
def fast_seeds(tmp_path_factory) -> list[Seed]:
    # the smaller seeds (under 1 MB of JSON each): the default run stays well under a minute
    return load_seeds(tmp_path_factory.mktemp("fuzz-captures"), [("dlrm", "train"), ("llama", "infer"),
                                                                  ("bert", "infer")])


@pytest.fixture(scope="module")
def all_seeds(tmp_path_factory) -> list[Seed]:
    wl = [(w, m) for w in ("llama", "dlrm", "bert") for m in ("train", "infer")]
    return load_seeds(tmp_path_factory.mktemp("fuzz-captures"), wl)


def _campaign(seeds: list[Seed], n: int, derandomize: bool) -> Tally:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    tally = Tally()

    @settings(max_examples=n, deadline=None, derandomize=derandomize, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def prop(data):
        case, outcome, problem = one_case(seeds, DataChooser(data), tally)
        assert not problem, f"{case}: {problem}\nstderr: {outcome.stderr[:2000]}"

    prop()
    return tally


def test_fuzz_fast(fast_seeds):
    """A few hundred cases in the default run (a fixed sequence: a red run reproduces); the 10,000-case
    campaign with fresh seeds runs under -m slow."""
    tally = _campaign(fast_seeds, 250, derandomize=True)
    print(f"\nfuzz (fast): {tally.line()}\nper seed: {dict(tally.seeds)}")
    assert tally.cases >= 250
    assert tally.codes[0] > 0 and tally.codes[2] > 0  # both outcomes are exercised


@pytest.mark.slow
def test_fuzz_campaign(all_seeds):
    """The campaign: 10,000 cases over every seed (hypothesis explores afresh on each run)."""
    tally = _campaign(all_seeds, 10_000, derandomize=False)
    print(f"\nfuzz (campaign): {tally.line()}\nper seed: {dict(tally.seeds)}")
    assert tally.cases >= 10_000


def main(argv: Sequence[str]) -> int:
    """``python tests/test_fuzz_traces.py N [SEED]``: N random cases, failures grouped by message."""
    n = int(argv[0]) if argv else 200
    base = int(argv[1]) if len(argv) > 1 else 0
    cap = Path(tempfile.gettempdir()) / "mystique-fuzz-captures"
    cap.mkdir(exist_ok=True)
    seeds = load_seeds(cap, [(w, m) for w in ("llama", "dlrm", "bert") for m in ("train", "infer")])
    print(f"seeds: {', '.join(f'{s.name} ({s.node_count} nodes)' for s in seeds)}", flush=True)
    tally = Tally()
    for i in range(n):
        one_case(seeds, RandomChooser(base + i), tally, draw=base + i)
        if (i + 1) % 500 == 0:
            print(f"  {tally.line()}", flush=True)
    print(tally.line())
    for _key, items in sorted(tally.problems.items(), key=lambda kv: -len(kv[1])):
        case, problem = items[0]
        print(f"\n[{len(items)}] {problem[:600]}\n    e.g. {case}")
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main(sys.argv[1:]))
