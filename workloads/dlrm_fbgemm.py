"""DLRM's sparse arch on FBGEMM: the tables of :mod:`workloads.dlrm` as one table-batched embedding
(TBE) module, as production DLRM (TorchRec) runs them.

``DLRMConfig.sparse_arch`` picks the variant:

* ``fbgemm``: FBGEMM's training TBE (``SplitTableBatchedEmbeddingBagsCodegen``, fp32/fp16/bf16
  tables) with its fused optimizer: exact SGD at the workload's learning rate, applied to the looked-up
  rows inside the backward pass, so the step's torch optimizer holds the MLPs only. In eval mode
  (inference) the current tables are copied into FBGEMM's inference TBE with fp32 rows (the training
  lookup has no kernel outside autograd). Equal to the ``nn.EmbeddingBag`` variant from the same
  weights (tests/test_fbgemm.py).
* ``fbgemm-int8``: FBGEMM's inference TBE (``IntNBitTableBatchedEmbeddingBagsCodegen``) over the same
  tables quantized 8-bit row-wise (per row: ``scale = (max - min) / 255``, ``bias = min``, both fp16):
  the tables are frozen (a training step updates the MLPs only).

The model is built as the ``nn.EmbeddingBag`` variant (same seed, same weights) and its tables then
move into the TBE module (:func:`to_fbgemm`). The TBE module takes the batch's ``indices`` (T, N) and
``offsets`` (T, B) and returns the T pooled (B, D) features, like the bags. Needs ``fbgemm_gpu``
(``pip install -e '.[fbgemm]'``); without it building these variants raises a clear error.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor, nn

SPARSE_ARCHS = ("embedding_bag", "fbgemm", "fbgemm-int8")
LEARNING_RATE = 0.1  # the workload's SGD rate (workloads.dlrm.make_optimizer)


def require_fbgemm() -> None:
    """Import FBGEMM (registers ``torch.ops.fbgemm``); ValueError saying how to get it when it does not load."""
    why = "not installed" if importlib.util.find_spec("fbgemm_gpu") is None else ""
    if not why:
        try:
            import fbgemm_gpu  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - a release built for another torch fails in many ways
            why = f"does not load ({type(exc).__name__}: {str(exc)[:120]})"
    if why:
        raise ValueError(f"the FBGEMM DLRM variants need fbgemm_gpu, which is {why}: pip install -e '.[fbgemm]' "
                         "(fbgemm-gpu-cpu paired with your torch; docs/design.md, FBGEMM)")


def tbe_batch(indices: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """TBE's inputs from per-table ``indices`` (T, N) and ``offsets`` (T, B): the indices table after
    table (T * N,) and ``T * B + 1`` bag starts into them, int32 (the batch of the FBGEMM variants,
    made before the step so that the trace's lookups read the batch itself)."""
    t, n = indices.shape
    starts = offsets + torch.arange(t, device=offsets.device, dtype=offsets.dtype).unsqueeze(1) * n
    end = torch.full((1,), t * n, dtype=offsets.dtype, device=offsets.device)
    return indices.reshape(-1).int(), torch.cat([starts.reshape(-1), end]).int()


def quantize_rows(table: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """``table`` (R, D) float -> (codes (R, D) int64 in [0, 2^bits), scale_bias (R, 2) fp16), on the
    table's device: row-wise min/max quantization as FBGEMM stores it (value = code * scale + bias,
    ``scale = (max - min) / (2^bits - 1)``, ``bias = min``)."""
    t = table.detach().float()
    top = (1 << bits) - 1
    lo, hi = t.min(1).values, t.max(1).values
    scale_bias = torch.stack([(hi - lo) / top, lo], 1).to(torch.float16)
    s = scale_bias[:, 0:1].float().clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round((t - scale_bias[:, 1:2].float()) / s).clamp_(0, top).to(torch.int64)
    return codes, scale_bias


def quantize_rows_int8(table: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`quantize_rows` at 8 bits, codes as uint8 (FBGEMM's 8-bit row layout)."""
    codes, scale_bias = quantize_rows(table, 8)
    return codes.to(torch.uint8), scale_bias


def dequantize_rows_int8(codes: Tensor, scale_bias: Tensor) -> Tensor:
    sb = scale_bias.float()
    return codes.float() * sb[:, :1] + sb[:, 1:]


class TBETables(nn.Module):
    """``(indices (T * N,), offsets (T * B + 1,)) -> T x (B, D)`` pooled sums by one FBGEMM TBE
    module (the batch of :func:`tbe_batch`)."""

    batched = True  # workloads.dlrm.DLRM calls it once for every table

    def __init__(self, tbe: nn.Module, dims: list[int]) -> None:
        super().__init__()
        self.tbe, self.dims = tbe, dims

    def forward(self, indices: Tensor, offsets: Tensor) -> list[Tensor]:
        return list(torch.split(self.tbe(indices, offsets), self.dims, dim=1))


def _sparse_type(dtype: torch.dtype):
    from fbgemm_gpu.split_embedding_configs import SparseType
    return {torch.float32: SparseType.FP32, torch.float16: SparseType.FP16,
            torch.bfloat16: SparseType.BF16}.get(dtype, SparseType.FP32)


def training_tables(bags: list[nn.EmbeddingBag], device: torch.device) -> TBETables:
    """The bags' tables in FBGEMM's training TBE with its fused exact SGD (same weights)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    on_gpu = device.type == "cuda"
    loc, comp = (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if on_gpu else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    dtype = bags[0].weight.dtype
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(b.num_embeddings, b.embedding_dim, loc, comp) for b in bags], optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=LEARNING_RATE, pooling_mode=PoolingMode.SUM, weights_precision=_sparse_type(dtype),
        output_dtype=_sparse_type(dtype), device=device)
    with torch.no_grad():
        for dst, b in zip(tbe.split_embedding_weights(), bags):
            dst.copy_(b.weight)
    return TrainingTables(tbe, [b.embedding_dim for b in bags])


def inference_tbe(tables: list[Tensor], device: torch.device, int8: bool, pooling: str = "sum") -> nn.Module:
    """FBGEMM's inference TBE over ``tables`` ((R, D) each): fp32 rows, or quantized 8-bit row-wise
    (``int8``); output fp32."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    loc = EmbeddingLocation.DEVICE if device.type == "cuda" else EmbeddingLocation.HOST
    mode = PoolingMode.MEAN if pooling == "mean" else PoolingMode.SUM
    kind = SparseType.INT8 if int8 else SparseType.FP32
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(f"t{k}", t.shape[0], t.shape[1], kind, loc) for k, t in enumerate(tables)],
        device=device, output_dtype=SparseType.FP32, pooling_mode=mode)
    tbe.fill_random_weights()  # allocates; every row is overwritten below
    with torch.no_grad():
        for (rows, sb), t in zip(tbe.split_embedding_weights(split_scale_shifts=True), tables):
            if int8:
                q, scale_bias = quantize_rows_int8(t)
                rows.copy_(q)
                sb.view(torch.float16).copy_(scale_bias)
            else:
                rows.view(torch.float32).copy_(t.detach().float())
    return tbe


class TrainingTables(TBETables):
    """The training TBE; in eval mode its tables' current values in an fp32 inference TBE."""

    def train(self, mode: bool = True) -> TrainingTables:
        super().train(mode)
        self.inference = None if mode else inference_tbe(
            list(self.tbe.split_embedding_weights()), self.tbe.current_device, int8=False)
        return self

    def forward(self, indices: Tensor, offsets: Tensor) -> list[Tensor]:
        if self.training or getattr(self, "inference", None) is None:
            return super().forward(indices, offsets)
        return list(torch.split(self.inference(indices, offsets), self.dims, dim=1))


def to_fbgemm(model: nn.Module, arch: str, device: torch.device) -> nn.Module:
    """``model`` (a DLRM with ``nn.EmbeddingBag`` tables in ``emb_l``) with its tables moved into the
    TBE of ``arch`` (``fbgemm`` or ``fbgemm-int8``)."""
    require_fbgemm()
    bags = list(model.emb_l)
    if arch == "fbgemm":
        model.emb_l = training_tables(bags, device)
    else:
        tbe = inference_tbe([b.weight for b in bags], device, int8=True)
        model.emb_l = TBETables(tbe, [b.embedding_dim for b in bags])
    return model


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters a torch optimizer steps: all but the TBE's (its fused optimizer, or frozen)."""
    return [p for n, p in model.named_parameters() if ".emb_l.tbe." not in f".{n}"]
