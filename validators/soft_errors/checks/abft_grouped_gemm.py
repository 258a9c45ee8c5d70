"""Check group ``abft_grouped_gemm``: ABFT on a mixture of experts' grouped GEMM (issue 34).

Llama 4's expert GEMMs run as one ``torch._grouped_mm``: the rows of ``x`` grouped per expert (group
g ends at ``offs[g]``) times expert g's weight ``w[g]``. Each group is an ordinary GEMM, so the
checked GEMM's encoding applies per group (:func:`checked_grouped_mm`): weighted row checksums of
``x_g @ w[g]`` from the operands, verified against the device's grouped output slice with the fp32
GEMM bound of :func:`..abft.verify_gemm` (lambda and the rounding of a K-term fp32 accumulation).
Empty groups (an expert no token chose) produce nothing and are not checked.

Rows (per dtype the device's grouped GEMM runs: float32, bfloat16): ``clean_alarm`` (no group may
alarm on a clean product) and ``injected_detected`` (an exponent flip in one group's output is
detected and located in that group; bf16: of the group's largest element, as ``abft_gemm`` does for
a rounded output, since a smaller one's flip may stay within the row's rounding bound). The loads are skewed and include an empty expert, as routing
gives them.
"""

from __future__ import annotations

import random

import torch

from mystique.faults.bits import flip_random, hash_seed

from ...groups import GroupContext
from ..abft import CheckReport, encode_gemm, verify_gemm
from ..inject import flip_tensor

LOADS = (40, 0, 17, 7)  # tokens per expert: skewed, one expert empty
K, N = 80, 48


def checked_grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                       out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[tuple[int, CheckReport]]]:
    """``torch._grouped_mm(x, w, offs=offs)`` (or the given ``out``, a product already computed) and,
    per non-empty group, ``(group, report)`` of its rows checked against checksums of ``x_g @ w[g]``
    (fp32 encoding; a bf16/fp16 output is checked with its rounding in the threshold)."""
    c = torch._grouped_mm(x, w, offs=offs) if out is None else out
    reports = []
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            enc = encode_gemm(x[start:end].float(), w[g].float())
            u_out = 0.0 if c.dtype == torch.float32 else torch.finfo(c.dtype).eps / 2
            reports.append((g, verify_gemm(enc, c[start:end].float(), dtype=x.dtype, u_out=u_out,
                                           op="grouped_gemm")))
        start = end
    return c, reports


def run_abft_grouped_gemm(ctx: GroupContext) -> None:
    dev = torch.device(ctx.target.device)
    g = torch.Generator().manual_seed(ctx.seed)
    ends = torch.tensor(LOADS).cumsum(0).to(torch.int32)
    for dt in (torch.float32, torch.bfloat16):
        name = str(dt).removeprefix("torch.")
        x = torch.randn(int(ends[-1]), K, generator=g).to(dt).to(dev)
        w = (torch.randn(len(LOADS), K, N, generator=g) / K ** 0.5).to(dt).to(dev)
        offs = ends.to(dev)
        try:
            with ctx.target.active():
                c, reps = checked_grouped_mm(x, w, offs)
        except (RuntimeError, NotImplementedError) as exc:
            ctx.res.add("abft_grouped_gemm", "grouped_mm", "clean_alarm", None, status="skip", dtype=name,
                        detail=f"the device has no grouped GEMM in {name}: {str(exc).splitlines()[0][:120]}")
            continue
        alarms = [grp for grp, r in reps if r.alarm]
        ctx.res.add("abft_grouped_gemm", "grouped_mm", "clean_alarm", float(len(alarms)), threshold=0, dtype=name,
                    status="fail" if alarms else "pass",
                    detail=f"{len(reps)} non-empty expert group(s) of loads {list(LOADS)} checked; alarms in "
                           f"groups {alarms}; seed={ctx.seed}")
        # one exponent flip in the largest group's output, between the product and its check
        group = max(range(len(LOADS)), key=lambda e: LOADS[e])
        start = int(ends[group]) - LOADS[group]
        hit = c[start:start + LOADS[group]].clone()
        if dt == torch.float32:
            rec = flip_tensor(hit, seed=ctx.seed, site="gemm_output", name=f"grouped_{name}", bit_class="exponent")
        else:  # a rounded half output: its largest element, whose exponent flip moves it by >= |c_ij| / 2, above
            # the rounding bound of its row (u_out sum_j |c_ij|), which a smaller element's flip may stay under
            rec = flip_random(hit, random.Random(hash_seed(ctx.seed, "abft_grouped_gemm", name)), bit_class="exponent",
                              site="gemm_output", target=f"grouped_{name}", seed=ctx.seed,
                              index=int(hit.float().abs().argmax()))
        c[start:start + LOADS[group]] = hit
        _, reps = checked_grouped_mm(x, w, offs, out=c)
        i, j = divmod(rec.index, N)
        found = [(grp, r.location) for grp, r in reps if r.alarm]
        ok = found == [(group, (i, j))]
        ctx.res.add("abft_grouped_gemm", "grouped_mm", "injected_detected", float(ok), threshold=1, dtype=name,
                    status="pass" if ok else "fail",
                    detail=f"{rec.describe()} in expert group {group} at ({i}, {j}); alarms (group, location): "
                           f"{found}; seed={ctx.seed}")
