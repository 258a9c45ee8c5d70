"""The one shape of a validator's check groups.

A validator (``validators.<name>``) exposes ``groups(level)`` and ``run(target, **options) ->
DataFrame``. Inside, each check group is a function ``run_<group>(ctx: GroupContext) -> None``
that adds rows to ``ctx.res``; a validator that needs more state per run subclasses
:class:`GroupContext` (numerics adds its dtypes, for example). A new check goes in a group
function of its validator; a new group is one more entry in that validator's group table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mystique.progress import Progress
from mystique.results import Results
from mystique.targets import Target


@dataclass
class GroupContext:
    """One validator run, as every group function receives it."""

    target: Target
    res: Results
    seed: int
    level: str
    progress: Progress
    options: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None

    @property
    def full(self) -> bool:
        return self.level == "full"
