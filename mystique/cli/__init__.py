"""The ``mystique`` command: one click group; heavy imports happen inside the commands.

Exit codes: 0 every check passed; 1 checks failed; 2 bad usage or bad input; 3 the environment
cannot do it (device absent, optional package missing, too little memory) or nothing was checked;
4 undecided (the only bad rows are inconclusive: an interval straddling its band).
"""

from __future__ import annotations

import sys

from .group import EXIT_CODES, MystiqueGroup, cli, one_line

# isort: split
# each command module registers its commands on `cli` (from .group) when imported
from . import (  # noqa: F401
    cmd_capture,
    cmd_demo,
    cmd_fleet,
    cmd_fleet_campaign,
    cmd_info,
    cmd_onnx,
    cmd_overhead,
    cmd_predict,
    cmd_qualify,
    cmd_replay,
    cmd_report,
    cmd_selftest,
    cmd_validate,
    cmd_validate_correctness,
    cmd_validate_numerics,
    cmd_validate_performance,
    cmd_validate_soft_errors,
)

__all__ = ["EXIT_CODES", "MystiqueGroup", "cli", "main", "one_line", "run"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code (no ``sys.exit``)."""
    try:
        cli.main(args=sys.argv[1:] if argv is None else list(argv), prog_name="mystique", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def run() -> None:
    sys.exit(main())
