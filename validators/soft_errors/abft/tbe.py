"""Checked forwards of FBGEMM's table-batched EmbeddingBag modules (TBE), device-agnostic.

:class:`CheckedTBE` wraps a ``SplitTableBatchedEmbeddingBagsCodegen`` (the training TBE: fp32 or fp16 rows)
or an ``IntNBitTableBatchedEmbeddingBagsCodegen`` (the inference TBE: 8-bit or 4-bit row-wise rows, fp16
scale and bias) and checks each of its forwards the way :mod:`.bag_verdict` checks one EmbeddingBag: every
table gets per-row checksums ``W 1`` and ``|W| 1`` in fp64 (computed from the module's own weights, fp32
storage), cached per weight version; each feature's bags are checked against its table's checksums, the
sum of a bag's slice of the pooled output against the bag pooled over the row sums (with the per-sample
weights, sum pooling), within the gamma bound of :func:`.bag_verdict.verify_bag_output`.

Nothing here depends on the device: the module runs where it lives (FBGEMM's CPU TBE on this host, its CUDA
one where a CUDA ``fbgemm_gpu`` is importable) and the check is torch operations on the output's device (on
the CPU the compiled verdict). The one host read per call is the ``T + 1`` offsets at the features'
boundaries, to slice each feature's bags.

The roundings of the bound: the training TBE pools fp32 (or fp16 rows read as fp32, exactly) in fp32, like
torch's lookup: ``extra`` = 4; the inference TBE dequantizes with one fused multiply-add: ``extra`` = 6
(:data:`.fbgemm.EXTRA_ROUNDINGS`); per-sample weights add two (the weight's product in the lookup's terms and
in the reference's, ``u a_b`` each). The cache key of a table's checksums is its weight tensor's storage
and version counter: an in-place update through torch (``optimizer.step()``, ``copy_``) makes new ones; an
update that bypasses the version counter, FBGEMM's fused optimizers (they write the looked-up rows in the
TBE's backward kernel), is followed by a hook on that backward (:meth:`CheckedTBE.__call__`) that recomputes
the checksums of exactly the rows the call looked up, which are the rows the update may write: a cost of the
order of the lookup's own, not a pass over the tables. Any other such update needs :meth:`CheckedTBE.refresh`
after it, else the updated rows alarm. A soft error bypasses it too: that is what the check sees (an error in
the fused update's own write of a row is taken in by that row's new checksums: the check covers the
lookups, not the optimizer).
"""

from __future__ import annotations

from typing import Any

import torch

from mystique.errors import UsageError

from .bag_verdict import EmbeddingChecks, row_sums64, verify_bag_output
from .fbgemm import EXTRA_ROUNDINGS as INT_EXTRA
from .report import CheckReport

#: roundings of the bound's ``D + extra`` term beyond the lookup's sums: float rows (as torch's lookup)
FLOAT_EXTRA = 4.0
#: the roundings per-sample weights add (see the module)
WEIGHT_ROUNDINGS = 2.0


def _kind(tbe: Any) -> str:
    name = type(tbe).__name__
    if name.startswith("SplitTableBatchedEmbeddingBags"):
        return "float"
    if name.startswith("IntNBitTableBatchedEmbeddingBags"):
        return "int"
    raise UsageError(f"CheckedTBE wraps FBGEMM's SplitTableBatchedEmbeddingBagsCodegen or "
                     f"IntNBitTableBatchedEmbeddingBagsCodegen, got {name}")


def _pooling(tbe: Any) -> str:
    mode = getattr(getattr(tbe, "pooling_mode", None), "name", str(getattr(tbe, "pooling_mode", "")))
    if mode not in ("SUM", "MEAN"):
        raise UsageError(f"CheckedTBE checks pooled lookups (sum or mean), got pooling mode {mode}")
    return mode.lower()


def int_row_checks(packed: torch.Tensor, scale_shift: torch.Tensor, bits: int, dim: int) -> EmbeddingChecks:
    """The checksums of an inference TBE table as the module stores it: ``codes`` (``bits`` each, 4-bit two to
    a byte, low nibble first) and an fp16 scale and bias per row, ``value = code * scale + bias``."""
    p = packed.to(torch.int64).cpu()
    if bits == 4:
        p = torch.stack([p & 15, p >> 4], 2).reshape(p.shape[0], -1)
    sb = scale_shift.cpu().contiguous().view(torch.float16)
    q, scale, bias = p[:, :dim].double(), sb[:, 0:1].double(), sb[:, 1:2].double()
    return EmbeddingChecks.from_rows((q * scale + bias).sum(1), (q * scale.abs() + bias.abs()).sum(1))


class CheckedTBE:
    """``CheckedTBE(tbe)(indices, offsets, per_sample_weights=None)`` -> ``(output, CheckReport)``: the module's
    own forward, its output unchanged, and the verdict of every feature's bags (see the module).

    ``report.rows`` are the alarmed bags in the TBE's numbering (feature ``f``'s bag ``b`` is ``f B + b``).
    """

    def __init__(self, tbe: Any, lam: float | None = None) -> None:
        self.tbe, self.kind, self.mode, self.lam = tbe, _kind(tbe), _pooling(tbe), lam
        specs = tbe.embedding_specs
        self.dims = [int(s[1] if self.kind == "float" else s[2]) for s in specs]
        self.bits = [0 if self.kind == "float" else {"INT8": 8, "INT4": 4}.get(s[3].name, 0) for s in specs]
        if self.kind == "int" and not all(self.bits):
            raise UsageError(f"CheckedTBE checks INT8 and INT4 inference tables, got "
                             f"{[s[3].name for s in specs]}")
        self.features = [int(t) for t in getattr(tbe, "feature_table_map", range(len(specs)))]
        self._cache: tuple[tuple, list[EmbeddingChecks]] | None = None

    def _weights(self) -> list[Any]:
        if self.kind == "float":
            return list(self.tbe.split_embedding_weights())
        return [tuple(w) for w in self.tbe.split_embedding_weights(split_scale_shifts=True)]

    def checks(self) -> list[EmbeddingChecks]:
        """Every table's checksums, computed once per weight version (see the module)."""
        ws = self._weights()
        key = tuple((t.data_ptr(), t._version) for w in ws for t in (w if isinstance(w, tuple) else (w,)))
        if self._cache is None or self._cache[0] != key:
            with torch.no_grad():
                made = [EmbeddingChecks.of(w.detach().float()) if self.kind == "float" else
                        int_row_checks(w[0], w[1], bits, d) for w, bits, d in zip(ws, self.bits, self.dims, strict=True)]
            self._cache = (key, [EmbeddingChecks(c.rowsum.to(_device(ws[i])), c.absum.to(_device(ws[i])))
                                 for i, c in enumerate(made)])
        return self._cache[1]

    def refresh(self) -> None:
        """Recompute the checksums at the next call (after an update that bypassed the version counter)."""
        self._cache = None

    def __call__(self, indices: torch.Tensor, offsets: torch.Tensor,
                 per_sample_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, CheckReport]:
        if indices.dim() != 1 or offsets.dim() != 1:
            raise UsageError("a TBE takes 1-D indices and offsets (every feature's bag starts, then the end)")
        nf = len(self.features)
        if (offsets.numel() - 1) % nf:
            raise UsageError(f"{offsets.numel()} offsets for {nf} features: a TBE takes features x bags + 1")
        if per_sample_weights is not None and self.mode != "sum":
            raise UsageError("per-sample weights need sum pooling")
        checks = self.checks()
        args = (indices, offsets) if per_sample_weights is None else (indices, offsets, per_sample_weights)
        out = self.tbe(*args)
        bounds = self._bounds(offsets)
        if self.fused_update() and out.grad_fn is not None:  # (its backward writes the looked-up rows)
            key = self._cache[0] if self._cache is not None else None
            out.grad_fn.register_hook(lambda *_: self._refresh_rows(key, indices, bounds))
        return out, self.verify(out, indices, offsets, per_sample_weights, checks, bounds)

    def fused_update(self) -> bool:
        """Whether the module's backward updates its rows itself (a training TBE with a fused optimizer)."""
        opt = getattr(self.tbe, "optimizer", None)
        return self.kind == "float" and opt is not None and getattr(opt, "name", str(opt)) != "NONE"

    def _bounds(self, offsets: torch.Tensor) -> list[int]:
        nf = len(self.features)
        b = (offsets.numel() - 1) // nf
        return offsets[::b].tolist() if b else [0] * (nf + 1)  # (the one host read: T + 1 offsets)

    def _refresh_rows(self, key: tuple | None, indices: torch.Tensor, bounds: list[int]) -> None:
        """After a fused update: the checksums of the rows ``indices`` looked up, recomputed from the rows as
        they are now (the cached ones, if still those of ``key``; else the next call computes them all)."""
        if self._cache is None or self._cache[0] != key:
            return
        ws, checks = self._weights(), self._cache[1]
        rows: dict[int, list[torch.Tensor]] = {}
        for f, t in enumerate(self.features):
            rows.setdefault(t, []).append(indices[bounds[f]:bounds[f + 1]])
        with torch.no_grad():
            for t, parts in rows.items():
                r = torch.unique(torch.cat(parts).long().to(checks[t].rowsum.device))
                rs, ab = row_sums64(ws[t].index_select(0, r.to(ws[t].device)).float())
                checks[t].rowsum.index_copy_(0, r, rs.to(checks[t].rowsum.device, torch.float32).reshape(-1, 1))
                checks[t].absum.index_copy_(0, r, ab.to(checks[t].absum.device, torch.float32).reshape(-1, 1))

    def verify(self, out: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
               per_sample_weights: torch.Tensor | None = None, checks: list[EmbeddingChecks] | None = None,
               bounds: list[int] | None = None) -> CheckReport:
        """The verdict on a (bags x sum of the features' D) output of the module for these arguments."""
        checks = self.checks() if checks is None else checks
        nf = len(self.features)
        b = (offsets.numel() - 1) // nf
        bounds = self._bounds(offsets) if bounds is None else bounds
        extra = (FLOAT_EXTRA if self.kind == "float" else INT_EXTRA) + \
            (WEIGHT_ROUNDINGS if per_sample_weights is not None else 0.0)
        op = f"tbe_{'fp' if self.kind == 'float' else 'int'}_{self.mode}"
        dtype = "float32" if self.kind == "float" else "uint8"
        u_out = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}.get(out.dtype, 0.0)  # (a half output's rounding)
        alarm, checked, worst, rows, col = False, True, 0.0, [], 0
        with torch.no_grad():
            for f, t in enumerate(self.features):
                d = self.dims[t]
                lo, hi = bounds[f], bounds[f + 1]
                idx = indices[lo:hi].long()
                off = offsets[f * b:(f + 1) * b].long() - lo
                psw = None if per_sample_weights is None else per_sample_weights[lo:hi].float()
                rep = verify_bag_output(out.detach()[:, col:col + d].float().contiguous(), checks[t], idx, off,
                                        self.mode, psw, extra=extra, u_out=u_out, lam=self.lam, op=op, dtype=dtype,
                                        shape=(checks[t].rowsum.shape[0], d, b))
                col += d
                alarm |= rep.alarm
                checked &= rep.checked
                worst = max(worst, rep.max_ratio)
                rows += [f * b + r for r in rep.rows]
        return CheckReport(op, dtype, alarm, worst, checked, rows[:16], [], None, (nf, b, col))


def _device(w: Any) -> torch.device:
    return (w[0] if isinstance(w, tuple) else w).device


def example_tbe(kind: str, tables: tuple[tuple[int, int], ...], mode: str, device: str | torch.device,
                seed: int = 0) -> Any:
    """A TBE over ``tables`` ((rows, dim) each) on ``device``: ``kind`` fp32 (the training TBE, random normal rows)
    or int8 / int4 (the inference TBE, FBGEMM's random rows); ``mode`` sum or mean pooling (the check group's
    and the tests' modules). Needs ``fbgemm_gpu``."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode

    dev = torch.device(device)
    loc = EmbeddingLocation.DEVICE if dev.type == "cuda" else EmbeddingLocation.HOST
    pooling = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[mode]
    if kind == "fp32":
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        cd = ComputeDevice.CUDA if dev.type == "cuda" else ComputeDevice.CPU
        tbe = SplitTableBatchedEmbeddingBagsCodegen([(r, d, loc, cd) for r, d in tables],
                                                    weights_precision=SparseType.FP32, pooling_mode=pooling,
                                                    optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for w in tbe.split_embedding_weights():
                w.copy_(torch.randn(w.shape, generator=g))
        return tbe
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    bits = {"int8": SparseType.INT8, "int4": SparseType.INT4}[kind]
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen([(f"t{i}", r, d, bits, loc) for i, (r, d) in enumerate(tables)],
                                                  device=dev, output_dtype=SparseType.FP32, pooling_mode=pooling)
    tbe.fill_random_weights()
    return tbe
