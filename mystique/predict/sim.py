"""A discrete-event simulation of an execution graph (:class:`Graph`): when each task starts and ends,
the step time, the critical path and the time per operator class.

A graph is a list of tasks, each on one *lane* (a host thread ``host:T`` or a device stream
``stream:S``) that runs its tasks one at a time in list order, with dependencies on earlier tasks:
``(task, None)`` waits for that task's end, ``(task, offset_us)`` for the moment ``offset_us`` after its
start (a kernel launched part-way through its host operator). The simulation processes the events in
list order, which is a valid event order because every dependency points backwards and each lane is
FIFO: a task starts when its lane is free and every dependency has fired, and ends ``dur_us`` later.
For in-order lanes this is exactly what a heap-ordered event loop computes, in one pass (10,000 tasks
in milliseconds). No task runs before time 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: operator classes, in the order tables list them (``whatif`` scales them)
CLASSES = ("gemm", "attention", "memory", "communication", "host")


@dataclass
class Task:
    """One unit of work on one lane: an operator's host time, a kernel, a host gap, a sync wait."""

    name: str
    cls: str  # one of CLASSES
    lane: str  # "host:<thread>" or "stream:<id>"
    dur_us: float
    deps: tuple[tuple[int, float | None], ...] = ()
    op: int | None = None  # index of the operator it belongs to (plan order), None for gaps

    def __post_init__(self) -> None:
        if self.cls not in CLASSES:
            raise ValueError(f"unknown operator class {self.cls!r}")
        if not self.dur_us >= 0:
            raise ValueError(f"task {self.name!r}: duration {self.dur_us!r} is not a non-negative number")


@dataclass
class Graph:
    """Tasks in a valid order (dependencies point to earlier tasks), and what the graph came from."""

    tasks: list[Task] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def add(self, task: Task) -> int:
        for d, _ in task.deps:
            if not 0 <= d < len(self.tasks):
                raise ValueError(f"task {task.name!r} depends on task {d}, not an earlier one")
        self.tasks.append(task)
        return len(self.tasks) - 1

    def lanes(self) -> list[str]:
        return list(dict.fromkeys(t.lane for t in self.tasks))


@dataclass
class Simulated:
    """The simulation of a graph: per-task start and end (us), the step time, the critical path."""

    start: list[float]
    end: list[float]
    step_us: float
    critical: list[tuple[int, float, float]]  # (task, from, to) along the critical path, in time order
    idle_us: float  # time on the critical path where no task ran (waits before the first task)

    def busy_by_class(self, graph: Graph) -> dict[str, float]:
        """Summed task time per class (us): what each class costs, overlapped or not."""
        out = dict.fromkeys(CLASSES, 0.0)
        for t in graph.tasks:
            out[t.cls] += t.dur_us
        return out

    def critical_by_class(self, graph: Graph) -> dict[str, float]:
        """Time per class along the critical path (us): sums to the step time less idle time."""
        out = dict.fromkeys(CLASSES, 0.0)
        for i, a, b in self.critical:
            out[graph.tasks[i].cls] += b - a
        return out


def simulate(graph: Graph) -> Simulated:
    """Run the graph (see the module docstring)."""
    tasks = graph.tasks
    n = len(tasks)
    start = [0.0] * n
    end = [0.0] * n
    # what fired last before each task could start: (task, time on that task) or None (time 0)
    why: list[tuple[int, float] | None] = [None] * n
    lane_last: dict[str, int] = {}
    for i, t in enumerate(tasks):
        s, w = 0.0, None
        prev = lane_last.get(t.lane)
        if prev is not None and end[prev] > s:
            s, w = end[prev], (prev, end[prev])
        for d, off in t.deps:
            at = end[d] if off is None else start[d] + min(max(off, 0.0), tasks[d].dur_us)
            if at > s:
                s, w = at, (d, at)
        start[i], end[i], why[i] = s, s + t.dur_us, w
        lane_last[t.lane] = i
    step = max(end) if n else 0.0
    critical: list[tuple[int, float, float]] = []
    idle = 0.0
    if n:
        cur, t_at = max(range(n), key=lambda k: (end[k], k)), step
        while True:
            critical.append((cur, start[cur], t_at))
            w = why[cur]
            if w is None:
                idle += start[cur]
                break
            cur, t_at = w
        critical.reverse()
    return Simulated(start, end, step, critical, idle)


def critical_path_us(sim: Simulated) -> float:
    """Length of the critical path's task time (the step time less idle waits at its start)."""
    return sum(b - a for _, a, b in sim.critical)


__all__ = ["CLASSES", "Graph", "Simulated", "Task", "critical_path_us", "simulate"]


def chain(durations: Sequence[float], cls: str = "memory", lane: str = "host:0") -> Graph:
    """A graph of one lane running ``durations`` one after another (tests, examples)."""
    g = Graph(source="chain")
    for k, d in enumerate(durations):
        g.add(Task(f"op{k}", cls, lane, float(d), op=k))
    return g
