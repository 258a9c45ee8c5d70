"""Pinned values: a replay reproduces recorded routing and document boundaries exactly.

The replay runs every op on synthetic data, so ops that compute routing (a router's top-k, the
argsort and ``bincount`` of expert ids, the ``cumsum`` of their loads) compute other values than the
captured step did: a grouped GEMM would split its rows among experts differently. A capture keeps the
values of the integral inputs of :data:`mystique.trace.values.VALUE_OPS` (``values.json``); here each
becomes a *pinned* input: a new external tensor of the recorded shape and dtype, filled with the
recorded values (storage recipe ``values``), which the op reads instead of the value the replay
computed. The ops that computed it still run (their cost stays in the step); only the consumer's
view of the data is the recorded one. The plan's ``metadata["pins"]`` lists them (node id, op,
argument, pinned tensor, the recorded values), and ``metadata["routing"]`` names the transform
applied to routing pins (``recorded``, ``uniform``, ``skewed:ALPHA``: :func:`transform_routing`).

Routing pins are the ``offs`` of ``aten::_grouped_mm`` (cumulative tokens per expert): their
consecutive differences are the tokens each expert multiplies. :func:`routing_summary` reports the
recorded, planned and replayed tokens per expert of each pinned grouped GEMM, read back from the
tensors the replayed ops were given after the timed iterations (summary.json ``routing``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from .runtime.format import contiguous_strides

#: pinned inputs that are routing: op name -> argument (its values: cumulative tokens per group)
ROUTING_ARGS = {"aten::_grouped_mm": "offs"}
ROUTINGS = ("recorded", "uniform", "skewed:ALPHA")
_SKEWED = re.compile(r"skewed:(\d+(?:\.\d*)?|\.\d+)")


def pin_values(ops: list[dict[str, Any]], tensors: list[dict[str, Any]], storages: list[dict[str, Any]],
               values: dict[int, dict[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Pin the recorded ``values`` (node id -> input index -> entry, :func:`read_values`) into the
    called ``ops`` (each with its parsed ``_schema``); returns the pins (``metadata["pins"]``). An
    entry whose dtype or shape disagrees with the op's tensor is left out."""
    pins: list[dict[str, Any]] = []
    for op in ops:
        rec = values.get(op.get("node_id"))
        sch = op.get("_schema")
        if not rec or sch is None or op.get("action") != "call":
            continue
        for idx, e in sorted(rec.items()):
            if idx >= len(sch.args):
                continue
            name = sch.args[idx].name
            if name in op["kwargs"]:
                container, key = op["kwargs"], name
            elif idx < len(op["args"]):
                container, key = op["args"], idx
            else:
                continue
            enc = container[key]
            if not (isinstance(enc, dict) and "t" in enc):
                continue
            t = tensors[enc["t"]]
            if t["dtype"] != e["dtype"] or list(t["shape"]) != list(e["shape"]):
                continue
            container[key] = {"t": _pinned_tensor(tensors, storages, t, e["values"])}
            pins.append({"node_id": op["node_id"], "op": op["name"], "arg": name, "tensor": container[key]["t"],
                         "recorded": list(e["values"])})
    return pins


def _pinned_tensor(tensors: list[dict[str, Any]], storages: list[dict[str, Any]], like: dict[str, Any],
                   vals: list[int]) -> int:
    sid = len(storages)
    itemsize = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8}.get(like["dtype"], 8)
    storages.append({"id": sid, "nbytes": max(1, len(vals)) * itemsize, "dtype": like["dtype"],
                     "device": like.get("device"), "external": True, "anchor": None,
                     "recipe": {"kind": "values", "values": list(vals)}, "trace_storage_id": None, "pinned": True})
    tid = len(tensors)
    tensors.append({"id": tid, "storage": sid, "offset": 0, "shape": list(like["shape"]),
                    "strides": contiguous_strides(like["shape"]), "dtype": like["dtype"], "device": like.get("device"),
                    "source": "external", "trace_id": None})
    return tid


def is_routing(pin: dict[str, Any]) -> bool:
    return ROUTING_ARGS.get(pin.get("op")) == pin.get("arg")


def loads(offs: list[int]) -> list[int]:
    """Tokens per group from cumulative ends (``offs``)."""
    return [int(b - a) for a, b in zip([0, *offs[:-1]], offs)]


def parse_routing(text: str) -> tuple[str, float | None]:
    """``recorded``, ``uniform`` or ``skewed:ALPHA`` (ALPHA > 0) as ``(kind, alpha)``; ValueError
    naming the forms otherwise."""
    if text in ("recorded", "uniform"):
        return text, None
    m = _SKEWED.fullmatch(text)
    if m and float(m.group(1)) > 0:
        return "skewed", float(m.group(1))
    raise ValueError(f"--routing must be one of {', '.join(ROUTINGS)} (ALPHA a number > 0); got {text!r}")


def target_loads(n_groups: int, total: int, kind: str, alpha: float | None) -> list[int]:
    """``total`` tokens spread over ``n_groups`` experts: ``uniform`` as evenly as integers allow,
    ``skewed`` with expert e's share proportional to ``(e + 1) ** -alpha`` (a Zipf law: expert 0 the
    most loaded), rounded by largest remainders so that they add up to ``total``."""
    weights = [1.0] * n_groups if kind == "uniform" else [(e + 1) ** -float(alpha or 1.0) for e in range(n_groups)]
    s = sum(weights)
    exact = [total * w / s for w in weights]
    out = [math.floor(x) for x in exact]
    for e in sorted(range(n_groups), key=lambda e: (out[e] - exact[e], e))[:total - sum(out)]:
        out[e] += 1
    return out


def transform_routing(plan: Any, text: str) -> int:
    """Give every routing pin of ``plan`` the loads ``text`` names (:func:`parse_routing`), keeping each
    pin's total; returns the pins changed. ``recorded`` restores the recorded values."""
    kind, alpha = parse_routing(text)
    storages = {s["id"]: s for s in plan.data["storages"]}
    tensors = {t["id"]: t for t in plan.data["tensors"]}
    changed = 0
    for pin in plan.metadata.get("pins") or []:
        if not is_routing(pin):
            continue
        rec = [int(v) for v in pin["recorded"]]
        if kind == "recorded" or not rec:
            new = rec
        else:
            ends, acc = [], 0
            for n in target_loads(len(rec), rec[-1], kind, alpha):
                acc += n
                ends.append(acc)
            new = ends
        storages[tensors[pin["tensor"]]["storage"]]["recipe"] = {"kind": "values", "values": new}
        changed += 1
    plan.metadata["routing"] = text if kind != "skewed" else f"skewed:{alpha:g}"
    return changed


DOC_LENGTHS = ("recorded", "uniform:MIN-MAX", "longtail:MIN:ALPHA")
_UNIFORM_DOCS = re.compile(r"uniform:(\d+)-(\d+)")
_LONGTAIL_DOCS = re.compile(r"longtail:(\d+):(\d+(?:\.\d*)?|\.\d+)")


def is_doc_ids(pin: dict[str, Any], shape: list[int]) -> bool:
    """A pinned operand of the document mask's comparison: (B, S, 1) or (B, 1, S) document ids."""
    return pin.get("op") == "aten::eq" and len(shape) == 3 and 1 in shape[1:] and max(shape[1:]) > 1


def parse_doc_lengths(text: str) -> Any:
    """``recorded`` (None), ``uniform:MIN-MAX`` or ``longtail:MIN:ALPHA`` as a
    :class:`mystique.workloads.packing.DocLengths`; ValueError naming the forms otherwise."""
    from ..workloads.packing import DocLengths

    if text == "recorded":
        return None
    m, t = _UNIFORM_DOCS.fullmatch(text), _LONGTAIL_DOCS.fullmatch(text)
    try:
        if m:
            return DocLengths("uniform", min_len=int(m.group(1)), max_len=int(m.group(2)))
        if t:
            return DocLengths("longtail", min_len=int(t.group(1)), alpha=float(t.group(2)))
    except ValueError:
        pass
    raise ValueError(f"--doc-lengths must be one of {', '.join(DOC_LENGTHS)} (1 <= MIN <= MAX, ALPHA > 0); got {text!r}")


def transform_doc_lengths(plan: Any, text: str, seed: int = 0) -> int:
    """Give every pinned document-id operand of ``plan`` documents of the lengths ``text`` names
    (:func:`parse_doc_lengths`, drawn from ``seed``; every pin of one batch shape gets the same ids,
    as every layer's mask reads the same batch); returns the pins changed."""
    import torch

    from ..workloads.packing import doc_ids

    spec = parse_doc_lengths(text)
    storages = {s["id"]: s for s in plan.data["storages"]}
    tensors = {t["id"]: t for t in plan.data["tensors"]}
    drawn: dict[tuple[int, int], list[int]] = {}
    changed = 0
    for pin in plan.metadata.get("pins") or []:
        shape = tensors[pin["tensor"]]["shape"]
        if not is_doc_ids(pin, shape):
            continue
        key = (shape[0], max(shape[1:]))
        if spec is None:
            vals = list(pin["recorded"])
        else:
            if key not in drawn:
                drawn[key] = doc_ids(spec, key[0], key[1], torch.Generator().manual_seed(seed)).flatten().tolist()
            vals = drawn[key]
        storages[tensors[pin["tensor"]]["storage"]]["recipe"] = {"kind": "values", "values": vals}
        changed += 1
    plan.metadata["doc_lengths"] = text
    return changed


def _documents(plan: Any, executor: Any) -> dict[str, Any] | None:
    """Per sequence, the replayed document lengths of the first pinned document ids (and the recorded)."""
    tensors = {t["id"]: t for t in plan.data["tensors"]}
    for pin in plan.metadata.get("pins") or []:
        shape = tensors[pin["tensor"]]["shape"]
        if is_doc_ids(pin, shape):
            got = executor.pinned_values(pin["tensor"])
            n = max(shape[1:])
            return {"transform": plan.metadata.get("doc_lengths") or "recorded",
                    "recorded": _runs(pin["recorded"], n), "replayed": _runs(got, n) if got is not None else None}
    return None


def _runs(ids: list[int], n: int) -> list[list[int]]:
    """Lengths of the runs of equal ids in each sequence of ``n`` positions."""
    out = []
    for k in range(0, len(ids), n):
        seq, lengths = ids[k:k + n], []
        for i, v in enumerate(seq):
            if i and v == seq[i - 1]:
                lengths[-1] += 1
            else:
                lengths.append(1)
        out.append(lengths)
    return out


def routing_summary(plan: Any, executor: Any) -> dict[str, Any] | None:
    """summary.json's ``routing``: per routing pin the recorded, planned and replayed tokens per
    expert (replayed: read from the tensor the executor gave the op, after the timed iterations),
    whether every replayed load equals the planned one and whether the plan keeps the recorded
    routing; the count of other pinned values (document ids). None for a plan without pins."""
    pins = plan.metadata.get("pins") or []
    if not pins:
        return None
    storages = {s["id"]: s for s in plan.data["storages"]}
    tensors = {t["id"]: t for t in plan.data["tensors"]}
    sites = []
    for pin in pins:
        if not is_routing(pin):
            continue
        planned = storages[tensors[pin["tensor"]]["storage"]]["recipe"].get("values") or []
        got = executor.pinned_values(pin["tensor"])
        sites.append({"node_id": pin["node_id"], "recorded": loads(pin["recorded"]), "planned": loads(planned),
                      "replayed": loads(got) if got is not None else None})
    return {
        "transform": plan.metadata.get("routing") or "recorded",
        "sites": len(sites),
        "replayed_equals_planned": all(s["replayed"] == s["planned"] for s in sites),
        "planned_equals_recorded": all(s["planned"] == s["recorded"] for s in sites),
        "max_load_ratio": _max_load_ratio(sites),
        "other_pins": len(pins) - len(sites),
        "documents": _documents(plan, executor),  # packed documents' lengths per sequence, where pinned
        "tokens_per_expert": sites,
    }


def _max_load_ratio(sites: list[dict[str, Any]]) -> float | None:
    """Sum over sites of the largest planned load over that of the recorded one (1: as recorded)."""
    rec = sum(max(s["recorded"], default=0) for s in sites)
    return sum(max(s["planned"], default=0) for s in sites) / rec if rec else None
