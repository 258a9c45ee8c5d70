"""Nominal peaks of known devices, with their sources: the denominators of ``fraction_of_nominal``.

Dense (no sparsity) tensor-core throughput in TFLOP/s and memory bandwidth in GB/s (1e9 bytes/s),
as NVIDIA's datasheets state them. The datasheets quote sparse figures for TF32, BF16, FP16 and FP8
with an asterisk; the dense figure is half of that and is what is listed here. CPUs have no entry:
their peak depends on the SKU, the cores and the clocks in use, so a CPU is judged against its
fleet (``--baseline``) only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Nominal:
    match: str  # lower-case substring of torch.cuda.get_device_name()
    tflops: dict[str, float]  # "tf32", "bfloat16", "float16", "float8", "float32" -> dense TFLOP/s
    memory_gbps: float
    source: str


_H100_SXM = "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM column; dense = half the sparse figure"
_H100_PCIE = "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 PCIe column; dense = half the sparse figure"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM column; dense = half the sparse figure"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB SXM column; dense figures"
_A100_40 = "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 40GB SXM column; dense figures"

# most specific first: the first entry whose `match` is in the device name wins
TABLE: tuple[Nominal, ...] = (
    Nominal("h200", {"float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0},
            4800.0, _H200),
    Nominal("h100 pcie", {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0, "float8": 1513.0},
            2000.0, _H100_PCIE),
    Nominal("h100", {"float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0},
            3350.0, _H100_SXM),
    Nominal("a100-sxm4-40gb", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0}, 1555.0,
            _A100_40),
    Nominal("a100", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0}, 2039.0, _A100),
)


def lookup(device_name: str) -> Nominal | None:
    """The nominal peaks of ``device_name`` (None for CPUs and devices not in the table)."""
    name = device_name.lower()
    return next((n for n in TABLE if n.match in name), None)
