"""Group ``moe_router_flips``: a mixture of experts' routing under bf16/fp16 autocast versus fp64.

A router's top-k is discontinuous: a token whose two best experts score nearly alike may pick the
other one under rounding, and its output then changes by a whole expert's difference, far beyond
any rounding bound of the model's output. Such a flip is not an error when the scores' rounding
can explain it; a flip the rounding cannot explain is.

For each MoE layer of Llama 4 (``debug`` at quick level, ``small`` at full; the batch widened to
``TOKENS`` tokens so that near-ties occur), the device runs the forward under
``torch.autocast(dtype)`` inside ``target.active()``; hooks keep each router's input ``x`` (the
device's own, fp32) and its logits. The reference is the fp64 router applied to that same input,
``L = x W^T`` (so upstream deviations, judged by ``model_deviation``, are not counted twice). The
device's logits of token t and expert e differ from ``L`` by at most (first order, Higham sec. 3.1,
rounding model ``fl(v) = v (1 + delta)``):

    b_e = c * (|x| |W|^T)_e + u * (|L_e| + c * (|x| |W|^T)_e),   c = (1 + u)^2 (1 + gamma_K(u32)) - 1

(both operands rounded to the dtype, the K-term product accumulated in fp32, the result rounded to
the dtype). A token whose device top-k set differs from the reference's is a *near-tie flip* when
every swapped pair (e_ref lost, e_dev gained) has ``L[e_ref] - L[e_dev] <= b[e_ref] + b[e_dev]``: the
bounds of the two scores can close the gap. Rows per dtype:

* ``moe_router_flips`` (check): flips beyond that bound; pass at 0 (the bound holds for every
  rounding, not with a probability: one unexplained flip is a wrong score);
* ``moe_router_flip_rate``, ``moe_router_near_tie_flips`` (info): all flips over the tokens routed,
  and those the rounding explains.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from mystique.workloads import llama4

from mystique.dtypes import HALF_DTYPES

from ._ctx import Ctx
from ._fp import FORMATS, U32, gamma

TOKENS = 256  # tokens per MoE layer routed at quick level (debug: 16 sequences of 16)


def run_moe_router_flips(ctx: Ctx) -> None:
    config = "small" if ctx.full else "debug"
    cfg = llama4.CONFIGS[config]
    batch_size = max(1, TOKENS // cfg.seq_len) * (4 if ctx.full else 1)
    model = llama4.build_model(cfg, device=torch.device("cpu"), dtype=torch.float32, seed=ctx.seed).eval()
    batch = llama4.make_batch(cfg, device=ctx.device, seed=ctx.seed, batch_size=batch_size)
    dev_model = copy.deepcopy(model).to(ctx.device)
    routers = [layer.feed_forward.router for layer in dev_model.layers if layer.moe]
    subject = f"llama4/{config}"
    for dt in ctx.dtypes:
        if dt not in HALF_DTYPES:
            continue
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        hooks = [r.register_forward_hook(lambda _m, inp, out, seen=seen: seen.append((inp[0].detach(), out.detach())))
                 for r in routers]
        repro = ctx.repro(dtype=str(dt).removeprefix("torch."), config=config)

        def forward(dt: torch.dtype = dt) -> Any:
            with torch.no_grad(), torch.autocast(ctx.device.type, dtype=dt):
                return llama4.forward(dev_model, batch)

        try:
            done = ctx.attempt("moe_router_flips", subject, lambda: ctx.on_device(forward), dtype=dt, repro=repro)
        finally:
            for h in hooks:
                h.remove()
        if done is None:
            continue
        flips, near, tokens = 0, 0, 0
        for (x, logits), router in zip(seen, routers):
            f, n = _flips(x, logits, router.weight.detach(), cfg.top_k, dt)
            flips, near, tokens = flips + f, near + n, tokens + x.shape[0]
        ctx.bound("moe_router_flips", subject, "flips_beyond_bound", float(flips - near), 0.0, dtype=dt,
                  detail=f"{flips} top-{cfg.top_k} flip(s) in {tokens} routed tokens of {len(seen)} MoE layer(s), "
                         f"{near} explained by the rounding bound of the scores (first-order bound of the router "
                         "GEMM: operands rounded to the dtype, fp32 accumulation, result rounded); pass at 0",
                  repro=repro)
        ctx.res.add("moe_router_flip_rate", subject, "rate", flips / tokens if tokens else 0.0, status="info",
                    dtype=str(dt).removeprefix("torch."), detail=f"{flips} of {tokens} tokens routed otherwise than fp64")
        ctx.res.add("moe_router_near_tie_flips", subject, "flips", float(near), status="info",
                    dtype=str(dt).removeprefix("torch."),
                    detail="flips whose fp64 score gap the two scores' rounding bounds can close")


def _flips(x: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor, k: int, dt: torch.dtype) -> tuple[int, int]:
    """(tokens whose device top-k set differs from fp64's, those of them explained by the bound)."""
    x64, w64 = x.double().cpu(), weight.double().cpu()
    ref = x64 @ w64.T  # (T, E)
    u = FORMATS[dt].u
    c = (1 + u) ** 2 * (1 + gamma(x.shape[-1], U32)) - 1
    mag = x64.abs() @ w64.abs().T
    bound = c * mag + u * (ref.abs() + c * mag)
    dev_top = logits.float().cpu().topk(k, dim=-1).indices
    ref_top = ref.topk(k, dim=-1).indices
    flips = near = 0
    for t in range(ref.shape[0]):
        gained = set(dev_top[t].tolist()) - set(ref_top[t].tolist())
        if not gained:
            continue
        lost = set(ref_top[t].tolist()) - set(dev_top[t].tolist())
        flips += 1
        near += all(float(ref[t, a] - ref[t, b]) <= float(bound[t, a] + bound[t, b]) for a in lost for b in gained)
    return flips, near
