"""Parameter Vulnerability Factor: the probability that one bit flip in a parameter group changes
the output of a workload, estimated by fault injection with Wilson intervals.

"Changes the output" (stated per workload):

* DLRM: some click probability crosses 0.5, or moves by more than ``DLRM_TOL`` (0.01), or is not finite;
* BERT: the top-1 token changes at some masked position (labels != -100);
* Llama: the top-1 next token at the last position of some sequence changes.

A parameter group is the set of parameters owned directly by one module (a Linear, a norm, one
embedding table). Each trial picks an element of the group uniformly, a bit uniformly among the
dtype's bits, flips it, runs the forward pass on the device under test and restores the element.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from .inject import flip_parameter, hash_seed

DLRM_TOL = 0.01


def parameter_groups(model: nn.Module) -> dict[str, list[tuple[str, torch.Tensor]]]:
    """Module name -> its own (name, parameter) pairs, for modules that own parameters directly."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for mname, mod in model.named_modules():
        own = [(f"{mname}.{p}" if mname else p, t) for p, t in mod.named_parameters(recurse=False)]
        if own:
            groups[mname or "<root>"] = own
    return groups


def output_changed(workload: str, golden: torch.Tensor, out: torch.Tensor, batch: dict[str, torch.Tensor]) -> bool:
    """Whether ``out`` differs from ``golden`` by the workload's definition (module docstring); the verdict is
    one device flag read once (one synchronisation per trial on a GPU)."""
    bad = ~torch.isfinite(out).all()
    if workload == "dlrm":
        g, o = golden.float().flatten(), out.float().flatten()
        bad = bad | ((g > 0.5) != (o > 0.5)).any() | ((o - g).abs().max() > DLRM_TOL)
    elif workload == "bert":
        mask = batch["labels"] != -100
        bad = bad | ((golden.argmax(-1) != out.argmax(-1)) & mask).any()  # (no boolean indexing: no sync)
    else:
        bad = bad | (golden[:, -1].argmax(-1) != out[:, -1].argmax(-1)).any()
    return bool(bad)


def pvf_trial_fn(workload: str, model: nn.Module, batch: dict[str, torch.Tensor], golden: torch.Tensor,
                 forward: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor],
                 groups: dict[str, list[tuple[str, torch.Tensor]]], seed: int,
                 active: Callable[[], AbstractContextManager[Any]]) -> Callable[[int], dict[str, Any]]:
    """Trial ``i`` flips one random bit in group ``i % len(groups)`` and reports whether the output changed."""
    names = sorted(groups)

    def fn(i: int) -> dict[str, Any]:
        gname = names[i % len(names)]
        s = hash_seed(seed, "pvf", workload, i)
        rng = random.Random(s)
        params = groups[gname]
        sizes = [t.numel() for _, t in params]
        pick = rng.randrange(sum(sizes))
        which = 0
        while pick >= sizes[which]:
            pick -= sizes[which]
            which += 1
        pname = params[which][0]
        with torch.no_grad(), flip_parameter(model, pname, seed=s, index=pick, bit_class="any") as rec:
            with active():
                out = forward(model, batch)
            changed = output_changed(workload, golden, out, batch)
        return {"group": gname, "param": pname, "index": rec.index, "bits": rec.bits, "seed": s,
                "original": rec.original, "corrupted": rec.corrupted, "changed": changed}

    return fn
