"""The one shape of a validator's check groups, and the one front door that runs them.

A validator (``validators.<name>``) exposes ``groups(level)`` and ``run(target, **options) ->
DataFrame``. Inside, each check group is a function ``run_<group>(ctx: GroupContext) -> None``
that adds rows to ``ctx.res``; a validator that needs more state per run subclasses
:class:`GroupContext` (numerics adds its dtypes, for example). A new check goes in a group
function of its validator; a new group is one more entry in that validator's ``RUNNERS`` table.

Every validator's ``run`` picks its groups with :func:`select_groups` and runs them with
:func:`run_groups`, so every suite means the same by a selection and treats a failing group alike:

* ``groups=None``: the level's default groups (``groups(level)``); an empty selection (``[]``,
  ``()``) is a :class:`UsageError` (asking for no group is a mistake, not a request for all of
  them); an unknown name is a :class:`UsageError` naming the known ones; repeats run once.
* A group that raises :class:`UsageError` or ``MemoryError`` ends the run (bad input; a process
  out of memory). One that raises :class:`EnvironmentUnsupported` (or a workload too large for the
  device) adds a ``group_skipped`` row and the next group runs; any other exception adds a
  ``group_error`` row (status ``error``, subject the group, detail ``Type: first line (seed=...,
  level=...)``) and the next group runs. The CLI and the pytest plugin end such a row's detail
  with ``reproduce: COMMAND``, as every failed row's.
* A group that adds no row adds a ``group_skipped`` row saying so, so every group asked for shows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mystique import workloads
from mystique.errors import EnvironmentUnsupported, UsageError
from mystique.progress import Progress
from mystique.results import Results
from mystique.targets import Target

ERROR_CHECK = "group_error"
SKIP_CHECK = "group_skipped"


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


def select_groups(suite: str, given: Iterable[str] | None, known: Sequence[str],
                  default: Sequence[str]) -> list[str]:
    """The groups a run of ``suite`` runs: ``default`` for None, else ``given`` checked against ``known``.

    Raises UsageError for an empty selection or unknown names; repeats are dropped, order kept.
    """
    if given is None:
        return list(default)
    if isinstance(given, str):
        given = [given]
    chosen = list(dict.fromkeys(str(g) for g in given))
    if not chosen:
        raise UsageError(f"no {suite} group given; known: {', '.join(known)} (omit the selection for the "
                         "level's default groups)")
    unknown = [g for g in chosen if g not in known]
    if unknown:
        raise UsageError(f"unknown {suite} group(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return chosen


def select_workloads(value: Any) -> tuple[str, ...]:
    """Reference workloads from ``value`` (names or a comma list), in the order given; None: all of
    :data:`mystique.workloads.WORKLOADS` (the defaults); any registered workload may be named
    (``llama4`` too). UsageError for unknown names or an empty list."""
    known = workloads.REGISTERED
    if value is None:
        return workloads.WORKLOADS
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(str(x).strip() for x in items if str(x).strip()))
    unknown = [n for n in names if n not in known] or ([] if names else ["(none given)"])
    if unknown:
        raise UsageError(f"unknown workload(s) {', '.join(unknown)}; expected some of {', '.join(known)}")
    return names


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def run_groups(runners: Mapping[str, Callable[[Any], None]], ctx: GroupContext, names: Iterable[str], *,
               scope: Callable[[str], AbstractContextManager[Any]] | None = None) -> None:
    """Run ``runners[name](ctx)`` for each of ``names`` in order, each inside ``scope(name)`` when given
    (threads, for example), with the error policy of the module docstring."""
    where = f"seed={ctx.seed}" + (f", level={ctx.level}" if ctx.level else "")
    for name in names:
        ctx.progress.step(f"group {name}")
        before = len(ctx.res)
        try:
            with scope(name) if scope is not None else contextlib.nullcontext():
                runners[name](ctx)
        except UsageError:
            raise
        except (EnvironmentUnsupported, workloads.WorkloadTooLarge) as exc:
            ctx.res.add(SKIP_CHECK, name, "ran", 0, status="skip", detail=f"{_first_line(exc)} ({where})")
            continue
        except MemoryError:
            raise
        except Exception as exc:  # one group failing must not hide the others
            ctx.res.add(ERROR_CHECK, name, "ran", 0, status="error",
                        detail=f"{type(exc).__name__}: {_first_line(exc)} ({where})")
            continue
        if len(ctx.res) == before:
            ctx.res.add(SKIP_CHECK, name, "ran", 0, status="skip", detail=f"nothing to check ({where})")
