"""Group ``repeatability``: the same op on the same inputs, run N times, gives bit-identical results.

Policy. Ops whose every sane implementation is a fixed schedule without atomics (GEMMs,
convolution forward, softmax, norms, reductions, attention forward, embedding_bag forward) must be
bit-identical run to run: a difference there is a fault (or a silent data corruption) and fails.
Ops that PyTorch documents as nondeterministic on some devices because they use atomic adds
(``index_add_``, ``scatter_add_``, embedding_bag backward) are reported as facts (status pass,
the detail says nondeterministic), unless ``torch.use_deterministic_algorithms(True)`` is in
effect, in which case they must be identical too. Quick runs each op 5 times, full 20 times
(option ``repeats``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mystique.dtypes import INT_OF_WIDTH
from mystique.dtypes import name as dtype_name

from ._ctx import Ctx

MAY_VARY = ("index_add", "scatter_add", "embedding_bag_backward")


def _cases(g: torch.Generator, dtype: torch.dtype, full: bool) -> dict[str, tuple[dict[str, torch.Tensor], callable]]:
    n = 512 if full else 256

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    idx = torch.randint(0, 64, (4 * n,), generator=g)
    return {
        "mm": ({"a": r(n, n), "b": r(n, n)}, lambda a, b: a @ b),
        "bmm": ({"a": r(8, 64, n), "b": r(8, n, 64)}, lambda a, b: torch.bmm(a, b)),
        "conv2d": ({"x": r(2, 16, 16, 16), "w": r(32, 16, 3, 3)}, lambda x, w: F.conv2d(x, w, padding=1)),
        "softmax": ({"x": r(64, n)}, lambda x: torch.softmax(x, -1)),
        "layer_norm": ({"x": r(64, n)}, lambda x: F.layer_norm(x, (n,))),
        "sum": ({"x": r(16, 16 * n)}, lambda x: x.sum(-1)),
        "cumsum": ({"x": r(16, n)}, lambda x: torch.cumsum(x, -1)),
        "scaled_dot_product_attention": ({"q": r(2, 4, 64, 32), "k": r(2, 4, 64, 32), "v": r(2, 4, 64, 32)},
                                         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "embedding_bag": ({"w": r(64, 32), "i": idx, "o": torch.arange(0, 4 * n, 8)},
                          lambda w, i, o: F.embedding_bag(i, w, o, mode="sum")),
        "index_add": ({"x": r(64, 32), "i": idx, "s": r(4 * n, 32)},
                      lambda x, i, s: x.index_add(0, i, s)),
        "scatter_add": ({"x": r(64, 32), "i": idx.reshape(-1, 1).expand(-1, 32).contiguous(), "s": r(4 * n, 32)},
                        lambda x, i, s: x.scatter_add(0, i, s)),
        "embedding_bag_backward": ({"w": r(64, 32), "i": idx, "o": torch.arange(0, 4 * n, 8)}, _ebag_grad),
    }


def _ebag_grad(w: torch.Tensor, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    w = w.detach().requires_grad_(True)
    out = F.embedding_bag(i, w, o, mode="sum")
    (grad,) = torch.autograd.grad(out, w, torch.ones_like(out))
    return grad


def run_repeatability(ctx: Ctx) -> None:
    """Rows ``repeatability``: metric ``distinct_results`` (1 = bit-identical) per op and dtype."""
    repeats = int(ctx.options.get("repeats") or (20 if ctx.full else 5))
    strict = torch.are_deterministic_algorithms_enabled()
    for dtype in [d for d in (torch.bfloat16, torch.float32) if d in ctx.dtypes] or list(ctx.dtypes[:1]):
        for op, (inputs, fn) in _cases(ctx.generator(31337), dtype, ctx.full).items():
            dev = {k: ctx.to_device(v) for k, v in inputs.items()}
            repro = ctx.repro(op=op, dtype=dtype_name(dtype), repeats=repeats,
                              shapes=",".join("x".join(map(str, v.shape)) for v in inputs.values()))
            outs = ctx.attempt("repeatability", op, lambda fn=fn, dev=dev: [
                ctx.on_device(lambda: fn(**dev)).detach().cpu() for _ in range(repeats)], dtype=dtype, repro=repro)
            if outs is None:
                continue
            distinct: list[torch.Tensor] = []
            for o in outs:
                if not any(_bit_equal(o, d) for d in distinct):
                    distinct.append(o)
            n = len(distinct)
            may_vary = op in MAY_VARY and not strict
            if n == 1:
                detail = f"bit-identical over {repeats} runs"
            else:
                nd = int((~_bit_mask(outs[0], distinct[1])).sum())
                detail = (f"nondeterministic: {n} distinct results over {repeats} runs ({nd} values differ)"
                          + ("; allowed: the op uses atomic adds" if may_vary else ""))
            ctx.fact("repeatability", op, "distinct_results", n, ok=n == 1 or may_vary, dtype=dtype,
                     threshold=None if may_vary else 1, detail=detail, repro=repro)


def _bit_mask(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ib = INT_OF_WIDTH[8 * a.element_size()]
    return a.contiguous().view(ib) == b.contiguous().view(ib)


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(_bit_mask(a, b).all())
