"""The soft-error validator's check groups, one module each; every group is a function
``run_<group>(ctx: GroupContext) -> None`` adding rows to ``ctx.res``. A new check goes in its
group's module; a new group is a module here and one entry of :data:`RUNNERS`."""

from collections.abc import Callable

from ...groups import GroupContext
from .abft_embedding_bag import run_abft_embedding_bag
from .abft_fbgemm import run_abft_fbgemm, run_overhead_fbgemm
from .abft_gemm import run_abft_gemm
from .abft_grouped_gemm import run_abft_grouped_gemm
from .detection_campaign import run_detection_campaign
from .false_positives import run_false_positives
from .overhead import run_overhead
from .pvf import run_pvf
from .sdc_screen import run_sdc_screen

RUNNERS: dict[str, Callable[[GroupContext], None]] = {
    "abft_gemm": run_abft_gemm,
    "abft_grouped_gemm": run_abft_grouped_gemm,
    "abft_embedding_bag": run_abft_embedding_bag,
    "abft_fbgemm": run_abft_fbgemm,
    "false_positives": run_false_positives,
    "detection_campaign": run_detection_campaign,
    "pvf": run_pvf,
    "sdc_screen": run_sdc_screen,
    "overhead": run_overhead,
    "overhead_fbgemm": run_overhead_fbgemm,
}
