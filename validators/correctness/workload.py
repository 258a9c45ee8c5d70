"""Whole-workload output comparison: a reference workload's forward on the target, the reference
device and in fp64 on the CPU, from the same weights and batch.

The model and batch are built once on the CPU from the seed (so every device sees the same
numbers) and copied: to the target (forward inside ``target.active()``), to the reference device,
and to the CPU in float64 (the golden). The target's output passes when its normwise relative
error against the golden is at most

    bound = max(2 * err_reference, floor(float32, K, s))

(without a second device ``bound = floor(float32, K, s)``: the golden alone) with
:func:`.tolerance.floor_bound`: ``K`` the longest dot product of the model (the largest
input width of its weight matrices) and ``s`` the model's measured sensitivity, the normwise
change of the fp64 output when every weight and floating input is multiplied by ``1 + u * r``
(``u = 2^-24``, ``r`` uniform in [-1, 1]). The rounding errors a correct float32 device makes
inside each layer act like such perturbations, ``sqrt(K)`` of them per dot product.

:func:`repeat_workload` runs the target's forward twice for the repeatability check.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from mystique import workloads
from mystique.dtypes import unit_roundoff
from mystique.replay.runtime import flatten_result

from .engine import call_fp64, call_reference, call_target
from .tolerance import bitwise_equal, error_bound, floor_bound, normwise_error


@dataclass
class WorkloadOutcome:
    """The comparison of one workload's forward: errors vs fp64, the bound and what it used."""

    name: str
    config: str
    err_target: float
    err_reference: float
    sensitivity: float
    k: int
    bound: float
    bitwise: bool
    output_shape: list[int]


def _batch_to(batch: dict[str, torch.Tensor], device: torch.device, float64: bool = False) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in batch.items():
        v = v.to(device)
        if float64 and v.dtype.is_floating_point:
            v = v.to(torch.float64)
        out[k] = v
    return out


def _perturb_(model: torch.nn.Module, batch: dict[str, torch.Tensor], u: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in list(model.parameters()) + list(model.buffers()):
            if p.dtype.is_floating_point and p.numel():
                r = torch.rand(p.shape, generator=gen, dtype=torch.float64)
                p.mul_((1.0 + u * (2.0 * r - 1.0)).to(p.dtype))
        for v in batch.values():
            if v.dtype.is_floating_point and v.numel():
                r = torch.rand(v.shape, generator=gen, dtype=torch.float64)
                v.mul_((1.0 + u * (2.0 * r - 1.0)).to(v.dtype))


def longest_dot(model: torch.nn.Module) -> int:
    """The largest input width (last dimension) of the model's weight matrices (1 if none)."""
    widths = [p.shape[-1] for p in model.parameters() if p.dim() >= 2]
    return int(max(widths, default=1))


def _first_tensor(out: Any) -> torch.Tensor:
    for v in flatten_result(out if not isinstance(out, dict) else list(out.values())):
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"the workload's forward returned no tensor ({type(out).__name__})")


def _build(name: str, config: str, seed: int) -> tuple[Any, torch.nn.Module, dict[str, torch.Tensor]]:
    mod = workloads.get(name)
    cfg = mod.CONFIGS[config]
    cpu = torch.device("cpu")
    model = mod.build_model(cfg, device=cpu, dtype=torch.float32, seed=seed).eval()
    return mod, model, mod.make_batch(cfg, device=cpu, seed=seed)


def repeat_workload(name: str, config: str, target: Any, seed: int) -> tuple[bool, list[int]]:
    """Run workload ``name`` forward twice on the target from the same weights and batch.

    Returns ``(bitwise_equal, output_shape)``.
    """
    mod, base, batch = _build(name, config, seed)
    tdev = torch.device(target.device)
    m_t, b_t = base.to(tdev), _batch_to(batch, tdev)
    first = _first_tensor(call_target(target, mod.forward, [m_t, b_t], {})).detach().cpu()
    again = _first_tensor(call_target(target, mod.forward, [m_t, b_t], {})).detach().cpu()
    return bitwise_equal(first, again), list(first.shape)


def compare_workload(name: str, config: str, target: Any, reference_device: str | None, seed: int) -> WorkloadOutcome:
    """Run workload ``name`` (``config``) forward on the target, the reference device and in fp64.

    ``reference_device`` None (no second device): no reference run; the target is judged against
    the fp64 golden alone, ``bound = floor(float32, K, s)`` (``err_reference`` NaN). Returns a
    :class:`WorkloadOutcome` (errors vs fp64, the bound and what it was made of).
    """
    mod, base, batch = _build(name, config, seed)
    cpu = torch.device("cpu")
    tdev = torch.device(target.device)

    m_t = copy.deepcopy(base).to(tdev)
    out_t = _first_tensor(call_target(target, mod.forward, [m_t, _batch_to(batch, tdev)], {}))
    out_t = out_t.detach().cpu()
    del m_t

    out_r = None
    if reference_device is not None:
        rdev = torch.device(reference_device)
        m_r = copy.deepcopy(base).to(rdev)
        out_r = _first_tensor(call_reference(mod.forward, [m_r, _batch_to(batch, rdev)], {})).detach().cpu()
        del m_r

    m_d = copy.deepcopy(base).to(torch.float64)
    out_d = _first_tensor(call_fp64(mod.forward, [m_d, _batch_to(batch, cpu, float64=True)], {}))
    m_p = copy.deepcopy(base).to(torch.float64)
    b_p = _batch_to(batch, cpu, float64=True)
    gen = torch.Generator().manual_seed(seed + 1)
    _perturb_(m_p, b_p, unit_roundoff(torch.float32), gen)
    out_p = _first_tensor(call_fp64(mod.forward, [m_p, b_p], {}))
    sens = normwise_error(out_p, out_d)
    k = longest_dot(base)
    if out_r is None:  # no second device: the golden alone, and the floor a correct device meets
        scale = float(torch.linalg.vector_norm(out_d))
        err_t = normwise_error(out_t, out_d, scale=scale) if out_t.shape == out_d.shape else float("inf")
        return WorkloadOutcome(name, config, err_t, float("nan"), sens, k, floor_bound(torch.float32, k, sens),
                               False, list(out_d.shape))
    ref_norm = float(torch.linalg.vector_norm(out_r.double()))
    err_r = normwise_error(out_r, out_d, scale=ref_norm)
    err_t = normwise_error(out_t, out_d, scale=ref_norm) if out_t.shape == out_d.shape else float("inf")
    bound = error_bound(err_r, floor_bound(out_r.dtype, k, sens))
    return WorkloadOutcome(name, config, err_t, err_r, sens, k, bound, bitwise_equal(out_t, out_r),
                           list(out_r.shape))
