"""Group ``model_deviation``: reference workloads under bf16/fp16 autocast versus fp64.

For each workload (``mystique.workloads``; config ``debug`` at quick level, ``small`` at full) the
model is built once in fp32 on the CPU from the run seed; the reference is a copy in fp64 on the
CPU, the device under test runs another copy on ``target.device`` under
``torch.autocast(dtype=bf16|fp16)`` inside ``target.active()``. Dropout is off (eval mode) so both
sides compute the same function. Rows:

* ``model_layer_deviation``: normwise relative error of each top-level block's output (children of
  the model; each element of a ModuleList/Sequential child) against fp64.
* ``model_output_deviation``: the same at the model output.
* ``model_train_deviation``: one training step (loss, backward): loss relative error and the
  normwise relative error of all gradients together.
* ``attention_backend_deviation``: the output deviation under each SDPA backend the device has,
  divided by the math backend's deviation (same dtype), as in "Is Flash Attention Stable?".

Thresholds (healthy CPUs pass them with wide margins; a bf16/fp16 forward of these models
deviates by a few units of the dtype's unit roundoff ``u``): layer and output deviation at most
``LAYER_U * u`` (u = 2^-8 bf16, 2^-11 fp16), gradients at most ``GRAD_U * u``, loss at most
``LOSS_U * u``, and a backend's deviation at most ``BACKEND_RATIO`` times the math backend's plus
``u / 4``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ._ctx import Ctx, unsupported
from ._fp import FORMATS, LOW_DTYPES, dtype_name, normwise_error

LAYER_U = 16.0
LOSS_U = 8.0
GRAD_U = 64.0
BACKEND_RATIO = 2.0


def _blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name, child in model.named_children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)) and len(child):
            out.extend((f"{name}.{i}", m) for i, m in enumerate(child))
        else:
            out.append((name, child))
    return out


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for v in x:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(x, dict):
        return _first_tensor(list(x.values()))
    return None


class _Recorder:
    """Forward hooks keeping each block's output (detached, on the CPU, as fp64)."""

    def __init__(self, model: torch.nn.Module):
        self.outputs: dict[str, torch.Tensor] = {}
        self.handles = [m.register_forward_hook(self._hook(name)) for name, m in _blocks(model)]

    def _hook(self, name: str):
        def hook(_mod, _inp, out):
            t = _first_tensor(out)
            if t is not None and t.is_floating_point():
                self.outputs[name] = t.detach().to("cpu", torch.float64)
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _batch_to(batch: dict[str, torch.Tensor], device: torch.device, fp64: bool = False) -> dict[str, torch.Tensor]:
    return {k: (v.to(device, torch.float64) if fp64 and v.is_floating_point() else v.to(device))
            for k, v in batch.items()}


def run_model_deviation(ctx: Ctx) -> None:
    """Rows ``model_layer_deviation``, ``model_output_deviation``, ``model_train_deviation``,
    ``attention_backend_deviation`` per workload and autocast dtype."""
    try:
        from mystique import workloads
    except Exception as exc:  # noqa: BLE001
        ctx.skip("model_output_deviation", "workloads", f"mystique.workloads unavailable: {exc}")
        return
    names = ctx.options.get("workloads") or workloads.names()
    config = ctx.options.get("model_config") or ("small" if ctx.full else "debug")
    dtypes = [d for d in ctx.dtypes if d in LOW_DTYPES]
    for name in names:
        try:
            mod = workloads.get(name)
            cfg = mod.CONFIGS[config]
            model32 = mod.build_model(cfg, device=torch.device("cpu"), dtype=torch.float32, seed=ctx.seed)
            batch = mod.make_batch(cfg, device=torch.device("cpu"), seed=ctx.seed)
        except Exception as exc:  # noqa: BLE001  (a workload that cannot be built is an error row, not a crash)
            ctx.error("model_output_deviation", name, exc, repro=ctx.repro(workload=name, config=config))
            continue
        model32.eval()
        ref = copy.deepcopy(model32).double()
        batch64 = _batch_to(batch, torch.device("cpu"), fp64=True)
        rec = _Recorder(ref)
        with torch.no_grad():
            ref_out = mod.forward(ref, batch64).detach().double()
        rec.close()
        ref_layers = rec.outputs
        ref.zero_grad(set_to_none=True)
        ref_loss = mod.loss(ref, batch64)
        ref_loss.backward()
        ref_grads = {n: p.grad.detach().double() for n, p in ref.named_parameters() if p.grad is not None}
        dev_model = copy.deepcopy(model32).to(ctx.device)
        dev_batch = _batch_to(batch, ctx.device)
        for dtype in dtypes:
            ctx.progress.note(f"model_deviation {name} {dtype_name(dtype)}")
            _one(ctx, mod, name, config, dev_model, dev_batch, dtype, ref_out, ref_layers, ref_loss, ref_grads)


def _forward(ctx: Ctx, mod: Any, model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype,
             backend: Any = None) -> torch.Tensor:
    def call() -> torch.Tensor:
        with torch.no_grad(), torch.autocast(ctx.device.type, dtype=dtype):
            if backend is None:
                return mod.forward(model, batch)
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(backend):
                return mod.forward(model, batch)

    return ctx.on_device(call).detach().to("cpu", torch.float64)


def _one(ctx: Ctx, mod: Any, name: str, config: str, model: torch.nn.Module, batch: dict[str, torch.Tensor],
         dtype: torch.dtype, ref_out: torch.Tensor, ref_layers: dict[str, torch.Tensor], ref_loss: torch.Tensor,
         ref_grads: dict[str, torch.Tensor]) -> None:
    u = FORMATS[dtype].u
    repro = ctx.repro(workload=name, config=config, autocast=dtype_name(dtype))
    rec = _Recorder(model)
    try:
        out = _forward(ctx, mod, model, batch, dtype)
    except RuntimeError as exc:
        rec.close()
        if unsupported(exc):
            ctx.skip("model_output_deviation", name, str(exc).splitlines()[0][:160], dtype=dtype)
        else:
            ctx.error("model_output_deviation", name, exc, dtype=dtype, repro=repro)
        return
    rec.close()
    for layer, ref_t in ref_layers.items():
        got = rec.outputs.get(layer)
        if got is None or got.shape != ref_t.shape:
            ctx.fact("model_layer_deviation", f"{name}/{layer}", "rel_error", float("nan"), ok=False, dtype=dtype,
                     detail="block output missing or of another shape on the device", repro=repro)
            continue
        ctx.bound("model_layer_deviation", f"{name}/{layer}", "rel_error", normwise_error(got, ref_t), LAYER_U * u,
                  dtype=dtype, detail=f"output {tuple(ref_t.shape)}; bound {LAYER_U:g}*u", repro=repro)
    out_err = normwise_error(out, ref_out)
    ctx.bound("model_output_deviation", name, "rel_error", out_err, LAYER_U * u, dtype=dtype,
              detail=f"{config} config, output {tuple(ref_out.shape)}; bound {LAYER_U:g}*u", repro=repro)
    _train(ctx, mod, name, model, batch, dtype, ref_loss, ref_grads, repro)
    _backends(ctx, mod, name, model, batch, dtype, ref_out, out_err, repro)


def _train(ctx: Ctx, mod: Any, name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype,
           ref_loss: torch.Tensor, ref_grads: dict[str, torch.Tensor], repro: str) -> None:
    u = FORMATS[dtype].u
    model.zero_grad(set_to_none=True)

    def step() -> torch.Tensor:
        with torch.autocast(ctx.device.type, dtype=dtype):
            loss = mod.loss(model, batch)
        loss.backward()
        return loss.detach()

    try:
        loss = ctx.on_device(step).to("cpu", torch.float64)
    except RuntimeError as exc:
        ctx.error("model_train_deviation", name, exc, dtype=dtype, repro=repro)
        return
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    ctx.bound("model_train_deviation", f"{name}/loss", "rel_error", normwise_error(loss, ref_loss.detach()),
              LOSS_U * u, dtype=dtype, detail=f"bound {LOSS_U:g}*u", repro=repro)
    keys = sorted(ref_grads)
    if sorted(grads) != keys:
        ctx.fact("model_train_deviation", f"{name}/gradients", "rel_error", float("nan"), ok=False, dtype=dtype,
                 detail="the device produced gradients for other parameters", repro=repro)
        return
    g_dev = torch.cat([grads[k].reshape(-1) for k in keys])
    g_ref = torch.cat([ref_grads[k].reshape(-1) for k in keys])
    ctx.bound("model_train_deviation", f"{name}/gradients", "rel_error", normwise_error(g_dev, g_ref), GRAD_U * u,
              dtype=dtype, detail=f"{len(keys)} parameters, {g_ref.numel()} values; bound {GRAD_U:g}*u",
              repro=repro)


def _backends(ctx: Ctx, mod: Any, name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor],
              dtype: torch.dtype, ref_out: torch.Tensor, default_err: float, repro: str) -> None:
    from torch.nn.attention import SDPBackend

    from .opsweep import sdpa_backends

    u = FORMATS[dtype].u
    try:
        math_out = _forward(ctx, mod, model, batch, dtype, SDPBackend.MATH)
    except RuntimeError as exc:
        ctx.skip("attention_backend_deviation", f"{name}/math", str(exc).splitlines()[0][:160], dtype=dtype)
        return
    math_err = normwise_error(math_out, ref_out)
    for be in sdpa_backends(ctx.device):
        if be == SDPBackend.MATH:
            continue
        subject = f"{name}/{be.name.lower()}"
        try:
            out = _forward(ctx, mod, model, batch, dtype, be)
        except RuntimeError as exc:
            ctx.skip("attention_backend_deviation", subject, f"backend refused: {str(exc).splitlines()[0][:140]}",
                     dtype=dtype, metric="deviation_ratio_vs_math")
            continue
        err = normwise_error(out, ref_out)
        same = torch.equal(out, math_out)
        ratio = err / math_err if math_err > 0 else (0.0 if err == 0 else float("inf"))
        thr = BACKEND_RATIO + (u / 4) / max(math_err, 1e-300)
        ctx.bound("attention_backend_deviation", subject, "deviation_ratio_vs_math", ratio, thr, dtype=dtype,
                  detail=(f"deviation {err:.3g} vs math {math_err:.3g}; bound {BACKEND_RATIO:g}x math + u/4"
                          + ("; output identical to math (the model may not reach SDPA)" if same else "")),
                  repro=repro)
