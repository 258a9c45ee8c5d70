"""The suite sections of the report: one module per suite, each with ``blocks(rows: SuiteRows)``.

A suite's part of the page is its section's blocks (charts, tables, notes), then the table of all
its rows; a suite without a section module gets the table alone. A new suite's section is one
module here and one entry in :data:`SECTIONS`. Never imports torch.
"""

from . import correctness, numerics, performance, predict, replay, selftest, soft_errors
from .base import SuiteRows, rows_table

#: suite -> the module that draws its section
SECTIONS = {
    "replay": replay,
    "numerics": numerics,
    "soft_errors": soft_errors,
    "correctness": correctness,
    "performance": performance,
    "selftest": selftest,
    "predict": predict,
}

__all__ = ["SECTIONS", "SuiteRows", "rows_table"]
