"""pytest plugin for hardware qualification, inert until ``--mystique-device`` is given.

Registered through the ``pytest11`` entry point. Importing it is cheap (no torch).
"""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("mystique", "Mystique Suite hardware qualification")
    group.addoption("--mystique-device", default=None, metavar="DEV",
                    help="Qualify this torch device (enables the plugin).")
    group.addoption("--mystique-inject", default=None, metavar="SPEC",
                    help="Dispatch mode active on the device under test (fault simulation or package.module:factory).")
    group.addoption("--mystique-level", default="quick", choices=("quick", "full"),
                    help="quick: every boot; full: acceptance (default: quick).")
    group.addoption("--mystique-report-dir", default=None, metavar="DIR",
                    help="Where results.csv and report.html are written.")
