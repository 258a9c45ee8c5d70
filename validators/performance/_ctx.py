"""The state one performance run shares between its groups (a leaf module: no import of the package)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mystique.validators.groups import GroupContext


@dataclass(frozen=True)
class Measured:
    """A figure with its 95% interval, as the fleet comparison needs it (``higher_better``:
    throughput; else a time)."""

    value: float
    lo: float
    hi: float
    higher_better: bool
    unit: str = ""


@dataclass
class PerformanceContext(GroupContext):
    """:class:`GroupContext` plus the level's settings and the figures measured so far
    (``(check, subject, dtype, metric)`` -> :class:`Measured`), which the ``fleet`` group compares."""

    settings: dict[str, Any] = field(default_factory=dict)
    measured: dict[tuple[str, str, str, str], Measured] = field(default_factory=dict)
    device_name: str = ""
    step_times: dict[str, Any] = field(default_factory=dict)  # workload -> its steps (a timed.Calls)

    def record(self, check: str, subject: str, dtype: str, metric: str, m: Measured, detail: str) -> None:
        """One ``info`` row of a measured figure (its interval in ``low`` and ``high``), kept for the fleet group."""
        self.measured[(check, subject, dtype, metric)] = m
        self.record_only(check, subject, dtype, metric, m, detail)

    def record_only(self, check: str, subject: str, dtype: str, metric: str, m: Measured, detail: str) -> None:
        """The row of :meth:`record`, not kept for the fleet group (a figure the host disturbed)."""
        self.res.add(check, subject, metric, m.value, status="info", unit=m.unit, dtype=dtype, low=m.lo, high=m.hi,
                     detail=f"95% interval [{m.lo:.6g}, {m.hi:.6g}] {m.unit}; {detail}")
