"""DLRM, the deep learning recommendation model of Naumov et al. 2019 (facebookresearch/dlrm).

Dense features go through a bottom MLP; each sparse feature is a bag of row ids pooled by an
``nn.EmbeddingBag`` (mode sum, called as ``(input, offsets)``); the bottom-MLP output and the pooled
embeddings interact by pairwise dot products (a bmm of the stacked features, keeping the lower
triangle without the diagonal); the top MLP's last Linear gives a click logit, whose sigmoid is
the click probability. Training minimises binary cross entropy with SGD (lr 0.1, as the reference
Kaggle run).

The loss is computed from the logit (``binary_cross_entropy_with_logits``, float32), the same on
every device and dtype, as mixed-precision DLRM training does it: TorchRec's ``DLRMTrain`` applies
``nn.BCEWithLogitsLoss`` to the logits of a model whose over-arch ends in a plain Linear.
facebookresearch/dlrm's ``--loss-function=bce`` (a Sigmoid layer, then ``BCELoss`` on the
probability) computes the same function in fp32, but that form cannot train under CUDA autocast:
PyTorch bans ``binary_cross_entropy`` there ("unsafe to autocast"; the AMP docs: prefer
binary_cross_entropy_with_logits), while CPU autocast runs it in fp32, so it fails on a GPU only.
The sigmoid stays in :func:`forward`, which returns probabilities for inference.

The batch holds ``dense`` (B, num_dense) float, ``indices`` (T, N) int64 and ``offsets`` (T, B)
int64 for T tables, and ``labels`` (B, 1) float. Every table gets the same number N = B * pooling
of ids per batch, split into B bags of random sizes (mean ``pooling``; one id per bag when
``pooling`` is 1, as in the one-hot Criteo data), so ``indices[t]`` / ``offsets[t]`` are exactly
the ``input`` / ``offsets`` of table t. Row ids follow a seeded, truncated Zipf popularity
(exponent ``zipf_alpha``), scattered over the table by a fixed bijection so that the popular rows
are not simply the first ones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import build_on_meta, cpu_generator, dtype_size, fill_, upcast
from .dlrm_fbgemm import SPARSE_ARCHS, dense_parameters, tbe_batch, to_fbgemm

NAME = "dlrm"
DESCRIPTION = "DLRM (bottom MLP, EmbeddingBag sum tables, dot interaction, top MLP); BCE-with-logits loss, SGD"

# Rows of the 26 categorical features of the Criteo Kaggle display-advertising data set, as the
# reference DLRM preprocessing counts them.
CRITEO_KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)


@dataclass(frozen=True)
class DLRMConfig:
    """Architecture (the reference's ``--arch-*`` flags), input statistics and the default batch.

    ``bottom_mlp`` lists the layer widths after the ``num_dense`` inputs and must end at
    ``embedding_dim``; ``top_mlp`` lists the widths after the interaction output and must end at 1.
    ``sparse_grads`` makes the tables' gradients sparse (the reference does so; dense gradients keep
    the trace free of sparse tensors for replay on any backend). ``sparse_arch`` runs the tables as
    ``nn.EmbeddingBag`` (``embedding_bag``) or in FBGEMM's table-batched embeddings: ``fbgemm``
    (trained by FBGEMM's fused SGD) or ``fbgemm-int8`` (8-bit row-wise tables, frozen); see
    :mod:`workloads.dlrm_fbgemm`.
    """

    num_dense: int = 13
    table_sizes: tuple[int, ...] = CRITEO_KAGGLE_TABLE_SIZES
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    pooling: int = 1  # mean ids per bag; 1 = exactly one id per bag
    zipf_alpha: float = 1.05
    batch_size: int = 128
    sparse_grads: bool = False
    sparse_arch: str = "embedding_bag"

    def __post_init__(self) -> None:
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(f"bottom_mlp must end at embedding_dim {self.embedding_dim}; got {self.bottom_mlp}")
        if self.top_mlp[-1] != 1:
            raise ValueError(f"top_mlp must end at 1; got {self.top_mlp}")
        if self.pooling < 1 or min(self.table_sizes) < 1:
            raise ValueError("pooling and every table size must be at least 1")
        if self.sparse_arch not in SPARSE_ARCHS:
            raise ValueError(f"sparse_arch must be one of {', '.join(SPARSE_ARCHS)}; got {self.sparse_arch!r}")
        if self.sparse_grads and self.sparse_arch != "embedding_bag":
            raise ValueError("sparse_grads applies to the embedding_bag sparse arch only")

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def interaction_dim(self) -> int:
        """Width of the top MLP's input: the bottom output plus one dot per feature pair."""
        f = self.num_tables + 1
        return self.embedding_dim + f * (f - 1) // 2


CONFIGS: dict[str, DLRMConfig] = {
    "debug": DLRMConfig(num_dense=13, table_sizes=(100, 1000, 50, 7), embedding_dim=8,
                        bottom_mlp=(32, 8), top_mlp=(32, 1), pooling=3, batch_size=16),
    "small": DLRMConfig(num_dense=13, table_sizes=(200_000, 100_000, 50_000, 20_000, 10_000, 5_000, 1_000, 100),
                        embedding_dim=64, bottom_mlp=(512, 256, 64), top_mlp=(512, 256, 1), pooling=8,
                        batch_size=4096),
    "criteo-kaggle": DLRMConfig(sparse_grads=True),  # the reference: one-hot bags, sparse table gradients
}
# the same sizes on FBGEMM's table-batched embeddings (needs fbgemm_gpu)
for _name in ("debug", "small"):
    for _arch in SPARSE_ARCHS[1:]:
        CONFIGS[f"{_name}-{_arch}"] = dataclasses.replace(CONFIGS[_name], sparse_arch=_arch)


# ----------------------------------------------------------------------------------------------
# model


def _mlp(widths: list[int], *, relu_last: bool) -> nn.Sequential:
    """Linear layers of ``widths``, each followed by a ReLU except the last when not ``relu_last``
    (the top MLP ends in a bare Linear: its output is the logit)."""
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1], bias=True))
        if relu_last or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """(dense (B, num_dense), indices (T, N), offsets (T, B)) -> click logit (B, 1).

    The probability is the logit's sigmoid (:func:`forward`); the loss takes the logit
    (:func:`loss`)."""

    def __init__(self, cfg: DLRMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bot_l = _mlp([cfg.num_dense, *cfg.bottom_mlp], relu_last=True)
        self.emb_l = nn.ModuleList(
            nn.EmbeddingBag(n, cfg.embedding_dim, mode="sum", sparse=cfg.sparse_grads) for n in cfg.table_sizes
        )
        self.top_l = _mlp([cfg.interaction_dim, *cfg.top_mlp], relu_last=False)

    def interact(self, x: Tensor, ly: list[Tensor]) -> Tensor:
        """Dot products of every pair of features (lower triangle, no diagonal), after ``x``."""
        bsz, d = x.shape
        t = torch.cat([x, *ly], dim=1).view(bsz, -1, d)  # (B, F, d), F = T + 1
        z = torch.bmm(t, t.transpose(1, 2))  # (B, F, F)
        li, lj = torch.tril_indices(t.size(1), t.size(1), offset=-1, device=x.device)  # (F(F-1)/2,) each
        zflat = z[:, li, lj]  # (B, F(F-1)/2)
        return torch.cat([x, zflat], dim=1)  # (B, d + F(F-1)/2)

    def forward(self, dense: Tensor, indices: Tensor, offsets: Tensor) -> Tensor:
        x = self.bot_l(dense)  # (B, d)
        if getattr(self.emb_l, "batched", False):  # FBGEMM's TBE: every table in one call
            ly = self.emb_l(indices, offsets)
        else:
            ly = [emb(indices[k], offsets[k]) for k, emb in enumerate(self.emb_l)]  # T x (B, d)
        return self.top_l(self.interact(x, ly))  # (B, 1)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """The reference initialisation, drawn on the CPU from ``generator``: a Linear(m -> n) weight
        N(0, sqrt(2 / (m + n))), its bias N(0, sqrt(1 / n)); a table of n rows U(-sqrt(1/n), sqrt(1/n))."""
        for mlp in (self.bot_l, self.top_l):
            for layer in mlp:
                if isinstance(layer, nn.Linear):
                    n, m = layer.weight.shape
                    fill_(layer.weight, torch.randn((n, m), generator=generator) * math.sqrt(2.0 / (m + n)))
                    fill_(layer.bias, torch.randn((n,), generator=generator) * math.sqrt(1.0 / n))
        for emb in self.emb_l:
            assert isinstance(emb, nn.EmbeddingBag)
            n = emb.num_embeddings
            bound = math.sqrt(1.0 / n)
            fill_(emb.weight, torch.rand(emb.weight.shape, generator=generator) * (2 * bound) - bound)


# ----------------------------------------------------------------------------------------------
# synthetic input


def zipf_rows(n_rows: int, count: int, alpha: float, generator: torch.Generator) -> Tensor:
    """``count`` row ids in [0, n_rows) with truncated Zipf popularity (rank r drawn with weight
    ~ (r + 1) ** -alpha, by inverting the continuous power-law CDF), each rank mapped to a row by
    the bijection r -> (r * stride + shift) mod n_rows. Returns an int64 CPU tensor (count,)."""
    u = torch.rand(count, generator=generator, dtype=torch.float64)
    top = float(n_rows + 1)
    if abs(alpha - 1.0) < 1e-9:
        x = torch.exp(u * math.log(top))
    else:
        x = ((top ** (1.0 - alpha) - 1.0) * u + 1.0) ** (1.0 / (1.0 - alpha))
    rank = (x.floor().to(torch.int64) - 1).clamp_(0, n_rows - 1)
    stride = max(1, int(n_rows * 0.6180339887))
    while math.gcd(stride, n_rows) != 1:
        stride += 1
    shift = int(torch.randint(0, n_rows, (1,), generator=generator))
    return (rank * stride + shift) % n_rows


def bag_offsets(batch: int, count: int, one_hot: bool, generator: torch.Generator) -> Tensor:
    """Offsets (batch,) int64 of ``batch`` bags sharing ``count`` ids: every bag one id when
    ``one_hot``, else each id assigned to a uniformly random bag (sizes vary, some bags empty)."""
    if one_hot:
        return torch.arange(batch, dtype=torch.int64)
    owner = torch.randint(0, batch, (count,), generator=generator)
    lengths = torch.bincount(owner, minlength=batch)  # (B,)
    return torch.cumsum(lengths, 0) - lengths  # (B,) exclusive prefix sum


# ----------------------------------------------------------------------------------------------
# the Workload protocol


def param_count(cfg: DLRMConfig) -> int:
    """Number of parameters, counted from the config without building the model."""
    def mlp(widths: list[int]) -> int:
        return sum(widths[i] * widths[i + 1] + widths[i + 1] for i in range(len(widths) - 1))

    return (mlp([cfg.num_dense, *cfg.bottom_mlp]) + mlp([cfg.interaction_dim, *cfg.top_mlp])
            + sum(cfg.table_sizes) * cfg.embedding_dim)


def build_model(cfg: DLRMConfig, *, device: torch.device, dtype: torch.dtype, seed: int) -> DLRM:
    """The model on ``device`` with floating parameters in ``dtype``, weights drawn from ``seed``
    (an FBGEMM ``sparse_arch`` gets the same weights, then its tables move into FBGEMM's TBE)."""
    model = build_on_meta(lambda: DLRM(cfg), device=device, dtype=dtype, seed=seed)
    return model if cfg.sparse_arch == "embedding_bag" else to_fbgemm(model, cfg.sparse_arch, device)


def make_batch(cfg: DLRMConfig, *, device: torch.device, seed: int,
               batch_size: int | None = None) -> dict[str, Tensor]:
    """``dense`` (B, num_dense) float32 uniform [0, 1); ``indices`` (T, B * pooling) int64 Zipf row
    ids; ``offsets`` (T, B) int64 bag starts; ``labels`` (B, 1) float32 clicks (about 1 in 4). An
    FBGEMM ``sparse_arch`` gets the same ids as FBGEMM's TBE reads them: ``indices`` (T * N,) and
    ``offsets`` (T * B + 1,) int32 (:func:`workloads.dlrm_fbgemm.tbe_batch`)."""
    bsz = batch_size or cfg.batch_size
    g = cpu_generator(seed + 1)
    count = bsz * cfg.pooling
    dense = torch.rand((bsz, cfg.num_dense), generator=g)
    indices = torch.stack([zipf_rows(n, count, cfg.zipf_alpha, g) for n in cfg.table_sizes])  # (T, N)
    offsets = torch.stack([bag_offsets(bsz, count, cfg.pooling == 1, g) for _ in cfg.table_sizes])  # (T, B)
    labels = (torch.rand((bsz, 1), generator=g) < 0.25).float()
    if cfg.sparse_arch != "embedding_bag":  # the same ids in FBGEMM's layout (workloads.dlrm_fbgemm)
        indices, offsets = tbe_batch(indices, offsets)
    return {"dense": dense.to(device), "indices": indices.to(device), "offsets": offsets.to(device),
            "labels": labels.to(device)}


def logits(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Click logits (B, 1) in the model's dtype (the model's output; ``model`` may be wrapped,
    e.g. in DDP)."""
    dtype = next(model.parameters()).dtype
    return model(batch["dense"].to(dtype), batch["indices"], batch["offsets"])


def forward(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Click probabilities (B, 1) in the model's dtype: the sigmoid of :func:`logits`."""
    return torch.sigmoid(logits(model, batch))


def loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean binary cross entropy of the clicks given the logits, computed from the logits
    (``binary_cross_entropy_with_logits``; 0-d, float32; float64 for a float64 model). Safe under
    autocast on every device, unlike ``binary_cross_entropy`` of the probabilities (module
    docstring)."""
    z = upcast(logits(model, batch))
    return F.binary_cross_entropy_with_logits(z, batch["labels"].to(z.dtype))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """Plain SGD, lr 0.1 (the reference Kaggle run); it accepts sparse table gradients. FBGEMM's
    tables are left to their fused optimizer (or frozen, 8-bit): the SGD holds the MLPs."""
    return torch.optim.SGD(dense_parameters(model), lr=0.1)


def memory_bytes(cfg: DLRMConfig, *, mode: str, dtype: torch.dtype, batch_size: int | None = None) -> int:
    """Estimated peak bytes of one step: parameters, and in train mode gradients (the whole tables
    when dense, the touched rows when sparse; SGD keeps no state) and saved activations."""
    e = dtype_size(dtype)
    bsz = batch_size or cfg.batch_size
    n_params = param_count(cfg)
    n_tables = sum(cfg.table_sizes) * cfg.embedding_dim
    ids = cfg.num_tables * bsz * cfg.pooling
    f = cfg.num_tables + 1
    widths = sum(cfg.bottom_mlp) + sum(cfg.top_mlp) + cfg.interaction_dim
    acts = bsz * (2 * widths + 3 * f * cfg.embedding_dim + 2 * f * f) * e + ids * 8 * 4
    batch = ids * 8 + cfg.num_tables * bsz * 8 + bsz * (cfg.num_dense + 1) * 4
    if mode == "train":
        table_grads = ids * cfg.embedding_dim * (e + 8) if cfg.sparse_grads else n_tables * e
        return n_params * e + (n_params - n_tables) * e + table_grads + 2 * acts + batch
    return n_params * e + acts + batch
