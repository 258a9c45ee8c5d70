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

Bounds of the deviation rows, derived per workload, dtype and row from the fp64 reference (no
tuned multiple of ``u``; u = 2^-8 bf16, 2^-11 fp16, u32 = 2^-24; every row's detail states its S):

* Rounding model (first order, Higham, *Accuracy and Stability*, 2nd ed., sec. 2.2, and the
  probabilistic model of Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019): under autocast every
  rounding is ``fl(v) = v (1 + delta)``, |delta| <= u_site, the deltas independent and mean zero.
  The sites and their u_site, for the forward and the backward alike: the operands of a GEMM-class
  op (mm, addmm, bmm, baddbmm, convolution, SDPA) not already in the dtype (autocast's casts: u);
  its result (u + gamma_K(u32), K its reduction length: fp32 accumulation, then one rounding);
  every other op whose floating inputs are all in the dtype (it computes in the dtype: u); every
  op on fp32 values, and the norms, softmaxes and losses autocast keeps in fp32 (u32). Data
  movement and views round nothing.
* To first order the device's deviation is e = sum_i a_i delta_i (a_i the fp64 sensitivity of the
  row's tensor to site i). S^2 = E||sum_i a_i u_i s_i||^2 with random signs s_i = +-1 is
  ``sum_i u_i^2 ||a_i||^2``; it is estimated as the mean square deviation of ``DRAWS`` reruns of
  the fp64 reference in which every site is multiplied by ``1 + u_site s`` (:class:`_RoundingModel`).
  This is the layer's condition factor times the precision, measured, and it grows with the depth
  and the reduction lengths of everything upstream of the row.
* ||e|| is a function of independent deltas whose change in one delta_i moves it by at most
  ``2 u_i ||a_i||``; E||e|| <= S, and McDiarmid's inequality gives ``||e|| <= (1 + sqrt(2 ln(1/p))) S``
  except with probability p = ``P_FAIL`` (1e-6, as the op sweep): the bound of every
  ``model_layer_deviation``, ``model_output_deviation`` and ``model_train_deviation`` row (loss and
  gradients: one training step, forward and backward sites alike) is ``LAM * S / ||reference||``.

A mixture of experts (a workload module with ``recorded_routing``/``pinned_routing``: Llama 4) is
compared with its routing pinned: every run of the device under test and every fp64 rerun of the
rounding model sends each token to the experts the fp64 reference chose, with the router's own
scores for them. Top-k is discontinuous: a near-tie that rounding flips moves a token's output by a
whole expert's difference, which no first-order rounding bound covers (S is a linearisation); the
pinned comparison measures the arithmetic (router scores, expert GEMMs, combine) on the same
choice, and ``moe_router_flips`` judges the choice itself (a flip passes only within the rounding
bound of the two scores). A fault in the experts' GEMMs still fails here; a wrong router score
beyond its bound fails there.

A backend's deviation is at most ``BACKEND_RATIO`` times the math backend's plus
``u / 4``. A model whose forward makes no scaled-dot-product-attention call (DLRM) has
no backend to compare: its ``attention_backend_deviation`` rows are ``skip`` (not applicable).
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from mystique import workloads
from mystique.dtypes import HALF_DTYPES
from mystique.dtypes import name as dtype_name
from mystique.hostinfo import torch_threads

from .. import golden_cache
from ..unsupported import unsupported
from ._ctx import Ctx
from ._fp import FORMATS, U32, gamma, normwise_error
from .bounds import P_FAIL
from .op_cases import sdpa_backends

BACKEND_RATIO = 2.0
GOLDEN_THREADS = 1
"""CPU threads of the fp64 reference and its reruns (thousands of tiny ops one at a time, where a second
thread's wake-ups dominate: llama4 debug's reruns took 8x the wall time with 2 threads at load 6 on a
2-core host, 1.6 s against 11 s); the device under test keeps the process's threads."""
DRAWS = 8
"""fp64 reruns under the rounding model per workload and dtype (they estimate S^2, a mean square)."""
LAM = 1.0 + math.sqrt(2.0 * math.log(1.0 / P_FAIL))
"""McDiarmid's factor on S: ``||e|| <= LAM * S`` except with probability ``P_FAIL``."""

_GEMMS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "_convolution",
    "convolution_backward", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"})
_FP32_OPS = frozenset({
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
    "native_batch_norm", "_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss",
    "mse_loss_backward", "binary_cross_entropy_with_logits", "binary_cross_entropy", "binary_cross_entropy_backward"})
_EXACT_OPS = frozenset({
    "clone", "_to_copy", "copy", "cat", "stack", "index", "index_select", "gather", "embedding", "new_zeros",
    "new_empty", "new_ones", "zeros_like", "ones_like", "empty_like", "full_like", "scalar_tensor", "lift_fresh_copy",
    "masked_fill", "where", "constant_pad_nd", "select_backward", "slice_backward", "relu", "threshold_backward",
    "amax", "max", "repeat", "triu", "tril", "arange", "zeros", "ones", "full", "empty", "fill", "eq", "ne", "lt",
    "gt", "le", "ge", "neg", "abs", "_unsafe_view", "tril_indices", "triu_indices", "promote_types"})


class _RoundingModel(TorchDispatchMode):
    """Runs fp64 code with each rounding site of a ``dtype`` autocast perturbed by ``1 + u_site s``, s = +-1.

    Which values are "in the dtype" is tracked through the run: GEMM-class results are, so are the
    results (and views) of ops whose floating inputs all are; parameters and inputs are not.
    """

    def __init__(self, dtype: torch.dtype, gen: torch.Generator):
        super().__init__()
        self.u = FORMATS[dtype].u
        self.gen = gen
        self.low = WeakIdKeyDictionary()

    def _perturb(self, t: Any, rel: float) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or not t.numel() or rel == 0.0:
            return t
        s = torch.randint(0, 2, t.shape, generator=self.gen, dtype=torch.float64).mul_(2).sub_(1)
        return t * (1.0 + rel * s).to(t.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        floats = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        low_in = bool(floats) and all(t in self.low for t in floats)
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns) or name in _EXACT_OPS:
            out, rel, low = func(*args, **kwargs), 0.0, low_in
        elif name in _GEMMS:
            k = max([d for t in floats for d in t.shape[-2:]] or [1])
            args = tuple(a if (not isinstance(a, torch.Tensor) or a in self.low) else self._perturb(a, self.u)
                         for a in args)
            out, rel, low = func(*args, **kwargs), self.u + gamma(k, U32), True
        elif name in _FP32_OPS:
            out, rel, low = func(*args, **kwargs), U32, False
        else:
            out, rel, low = func(*args, **kwargs), (self.u if low_in else U32), low_in
        outs = out if isinstance(out, (tuple, list)) else (out,)
        res = [self._perturb(o, rel) for o in outs]
        if low:
            for o in res:
                if isinstance(o, torch.Tensor):
                    self.low[o] = True
        return type(out)(res) if isinstance(out, (tuple, list)) else res[0]


def _sq(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm((a.double() - b.double()).reshape(-1))) ** 2


def _grad_vector(model: torch.nn.Module, keys: list[str]) -> torch.Tensor:
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return torch.cat([grads[k].detach().double().reshape(-1) for k in keys])


Pins = dict[str, torch.Tensor] | None
"""The fp64 reference's top-k expert ids per MoE layer (module name -> (T, k)); None: no routing."""


def _pinned(mod: Any, model: torch.nn.Module, pins: Pins) -> Any:
    """A context running ``model`` with its routing pinned to ``pins`` (nothing to pin: a null context)."""
    return mod.pinned_routing(model, pins) if pins else contextlib.nullcontext()


def _reference_routing(mod: Any, ref: torch.nn.Module) -> Any:
    """A context recording the routing choice of each MoE layer of ``ref`` (``recorded_routing``), or None
    when ``mod`` routes nothing (or cannot pin a routing)."""
    record = getattr(mod, "recorded_routing", None)
    return record(ref) if record is not None and hasattr(mod, "pinned_routing") else None


def _derived_bounds(ctx: Ctx, mod: Any, ref: torch.nn.Module, batch64: dict[str, torch.Tensor], dtype: torch.dtype,
                    ref_out: torch.Tensor, ref_layers: dict[str, torch.Tensor], ref_loss: torch.Tensor,
                    ref_grads: dict[str, torch.Tensor], pins: Pins = None) -> dict[str, tuple[float, float]]:
    """Row key ('output', 'layer:NAME', 'loss', 'gradients') -> (bound LAM*S/||ref||, S/||ref||); the
    reruns route as the reference did (``pins``), so S is the arithmetic's alone."""
    gen = ctx.generator(salt=19_000 + FORMATS[dtype].p)
    model = copy.deepcopy(ref)
    keys = sorted(ref_grads)
    g_ref = torch.cat([ref_grads[k].reshape(-1) for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)
    refs = {"output": ref_out, "loss": ref_loss.detach().double(), "gradients": g_ref,
            **{f"layer:{k}": v for k, v in ref_layers.items()}}
    sq = dict.fromkeys(refs, 0.0)
    for _ in range(DRAWS):
        rec = _Recorder(model)
        try:
            with torch.no_grad(), _pinned(mod, model, pins), _RoundingModel(dtype, gen):
                out = mod.forward(model, batch64).detach()
        finally:
            rec.close()
        sq["output"] += _sq(out, ref_out)
        for k, v in ref_layers.items():
            got = rec.outputs.get(k)
            sq[f"layer:{k}"] += _sq(got, v) if got is not None and got.shape == v.shape else math.inf
        model.zero_grad(set_to_none=True)
        with _pinned(mod, model, pins), _RoundingModel(dtype, gen):
            loss = mod.loss(model, batch64)
            loss.backward()
        sq["loss"] += _sq(loss.detach(), refs["loss"])
        sq["gradients"] += _sq(_grad_vector(model, keys), g_ref) if keys else 0.0
        model.zero_grad(set_to_none=True)
    out_b = {}
    for k, ref_t in refs.items():
        s_abs = math.sqrt(sq[k] / DRAWS)
        den = float(torch.linalg.vector_norm(ref_t.double().reshape(-1)))
        s_rel = s_abs / den if den > 0 else (0.0 if s_abs == 0 else math.inf)
        out_b[k] = (LAM * s_rel, s_rel)
    return out_b


def _how(b: tuple[float, float], u: float) -> str:
    return (f"bound {LAM:.2f}*S = {b[0] / u:.3g}u, S = {b[1] / u:.3g}u: rms deviation of {DRAWS} fp64 reruns with "
            f"every autocast rounding a random relative +-u (u32 for fp32 values), McDiarmid p={P_FAIL:g}")


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


def _reference(mod: Any, model32: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    """The fp64 reference of ``model32`` on ``batch``: (model, batch, routing pins, output, block outputs,
    loss, gradients), routed as its own forward routes (its choice recorded in that forward and pinned
    after it, so every later run routes alike)."""
    ref = copy.deepcopy(model32).double()
    batch64 = _batch_to(batch, torch.device("cpu"), fp64=True)
    recording = _reference_routing(mod, ref)
    rec = _Recorder(ref)
    with torch.no_grad(), recording or contextlib.nullcontext() as seen:
        ref_out = mod.forward(ref, batch64).detach().double()
    rec.close()
    pins = ({name: calls[0] for name, calls in seen.items()} or None) if seen is not None else None
    ref.zero_grad(set_to_none=True)
    with _pinned(mod, ref, pins):
        ref_loss = mod.loss(ref, batch64)
        ref_loss.backward()
    ref_grads = {n: p.grad.detach().double() for n, p in ref.named_parameters() if p.grad is not None}
    return ref, batch64, pins, ref_out, rec.outputs, ref_loss, ref_grads


def run_model_deviation(ctx: Ctx) -> None:
    """Rows ``model_layer_deviation``, ``model_output_deviation``, ``model_train_deviation``,
    ``attention_backend_deviation`` per workload and autocast dtype."""
    # the validators' default workloads (an MoE's routing is pinned to fp64's; its flips: moe_router_flips)
    names = ctx.options.get("workloads") or sorted(workloads.WORKLOADS)
    config = ctx.options.get("model_config") or ("small" if ctx.full else "debug")
    dtypes = [d for d in ctx.dtypes if d in HALF_DTYPES]
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
        with torch_threads(GOLDEN_THREADS):
            ref, batch64, pins, ref_out, ref_layers, ref_loss, ref_grads = _reference(mod, model32, batch)
        dev_model = copy.deepcopy(model32).to(ctx.device)
        dev_batch = _batch_to(batch, ctx.device)
        for dtype in dtypes:
            ctx.progress.note(f"model_deviation {name} {dtype_name(dtype)}")
            try:
                with torch_threads(GOLDEN_THREADS):
                    derived = golden_cache.golden(
                        ("numerics.model_deviation.bounds", name, config, ctx.seed, dtype_name(dtype), DRAWS),
                        _derived_bounds, ctx, mod, ref, batch64, dtype, ref_out, ref_layers, ref_loss, ref_grads, pins)
            except Exception as exc:  # noqa: BLE001  (a reference that cannot be rerun is an error row)
                ctx.error("model_output_deviation", name, exc, dtype=dtype, repro=ctx.repro(workload=name, config=config))
                continue
            with _pinned(mod, dev_model, pins):
                _one(ctx, mod, name, config, dev_model, dev_batch, dtype, ref_out, ref_layers, ref_loss, ref_grads,
                     derived, _routing_note(pins))


def _routing_note(pins: Pins) -> str:
    if not pins:
        return ""
    tokens = sum(int(t.shape[0]) for t in pins.values())
    layers = f"{len(pins)} MoE layer" + ("s" if len(pins) != 1 else "")
    return (f"; routing pinned to fp64's top-k ({layers}, {tokens} token choices: near-tie flips "
            "are judged by moe_router_flips)")


def _forward(ctx: Ctx, mod: Any, model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype,
             backend: Any = None) -> torch.Tensor:
    def call() -> torch.Tensor:
        with torch.no_grad(), torch.autocast(ctx.device.type, dtype=dtype):
            if backend is None:
                return mod.forward(model, batch)
            with sdpa_kernel(backend):
                return mod.forward(model, batch)

    return ctx.on_device(call).detach().to("cpu", torch.float64)


def _one(ctx: Ctx, mod: Any, name: str, config: str, model: torch.nn.Module, batch: dict[str, torch.Tensor],
         dtype: torch.dtype, ref_out: torch.Tensor, ref_layers: dict[str, torch.Tensor], ref_loss: torch.Tensor,
         ref_grads: dict[str, torch.Tensor], derived: dict[str, tuple[float, float]], note: str = "") -> None:
    u = FORMATS[dtype].u
    repro = ctx.repro(workload=name, config=config, autocast=dtype_name(dtype))
    rec = _Recorder(model)
    try:
        out = _forward(ctx, mod, model, batch, dtype)
    except RuntimeError as exc:
        rec.close()
        why = unsupported(exc)
        if why:
            ctx.skip("model_output_deviation", name, why[:160], dtype=dtype)
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
        b = derived[f"layer:{layer}"]
        ctx.bound("model_layer_deviation", f"{name}/{layer}", "rel_error", normwise_error(got, ref_t), b[0],
                  dtype=dtype, detail=f"output {tuple(ref_t.shape)}; {_how(b, u)}", repro=repro)
    out_err = normwise_error(out, ref_out)
    b = derived["output"]
    ctx.bound("model_output_deviation", name, "rel_error", out_err, b[0], dtype=dtype,
              detail=f"{config} config, output {tuple(ref_out.shape)}{note}; {_how(b, u)}", repro=repro)
    _train(ctx, mod, name, model, batch, dtype, ref_loss, ref_grads, repro, derived)
    _backends(ctx, mod, name, model, batch, dtype, ref_out, out_err, repro)


def _train(ctx: Ctx, mod: Any, name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype,
           ref_loss: torch.Tensor, ref_grads: dict[str, torch.Tensor], repro: str,
           derived: dict[str, tuple[float, float]]) -> None:
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
              derived["loss"][0], dtype=dtype, detail=_how(derived["loss"], u), repro=repro)
    keys = sorted(ref_grads)
    if sorted(grads) != keys:
        ctx.fact("model_train_deviation", f"{name}/gradients", "rel_error", float("nan"), ok=False, dtype=dtype,
                 detail="the device produced gradients for other parameters", repro=repro)
        return
    g_dev = torch.cat([grads[k].reshape(-1) for k in keys])
    g_ref = torch.cat([ref_grads[k].reshape(-1) for k in keys])
    ctx.bound("model_train_deviation", f"{name}/gradients", "rel_error", normwise_error(g_dev, g_ref),
              derived["gradients"][0], dtype=dtype,
              detail=f"{len(keys)} parameters, {g_ref.numel()} values; {_how(derived['gradients'], u)}", repro=repro)


class _SdpaCalls(TorchFunctionMode):
    """Counts the scaled-dot-product-attention calls of the enclosed code (``F.`` or ``aten.``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in getattr(func, "__name__", ""):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _backends(ctx: Ctx, mod: Any, name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor],
              dtype: torch.dtype, ref_out: torch.Tensor, default_err: float, repro: str) -> None:
    u = FORMATS[dtype].u
    try:
        with _SdpaCalls() as sdpa:
            math_out = _forward(ctx, mod, model, batch, dtype, SDPBackend.MATH)
    except RuntimeError as exc:
        ctx.skip("attention_backend_deviation", f"{name}/math", str(exc).splitlines()[0][:160], dtype=dtype)
        return
    math_err = normwise_error(math_out, ref_out)
    for be in sdpa_backends(ctx.device):
        if be == SDPBackend.MATH:
            continue
        subject = f"{name}/{be.name.lower()}"
        if not sdpa.calls:  # not applicable: the backend would have nothing to change
            ctx.skip("attention_backend_deviation", subject,
                     f"not applicable: {name}'s forward makes no scaled_dot_product_attention call, so no "
                     "attention backend can change its output", dtype=dtype, metric="deviation_ratio_vs_math")
            continue
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
