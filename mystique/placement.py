"""CPU placement of a timing process: which cores its threads run on (``--cpu-affinity``).

A host-bound step (a small model on a GPU, the GPU 12-20% busy) is timed as the launching thread's
speed: its time moves with the core the scheduler happens to put that thread on (another core's
cache, an SMT sibling shared with another thread, another NUMA node than the device's) and with the
intra-op threads that land beside it. Nothing pins it, so two processes may time one step on two
placements. ``--cpu-affinity`` says what to do:

- ``none`` (the default): the process as it was launched; the scheduler places every thread.
- ``auto``: the thread that times (the main thread) on one core chosen deterministically from the
  CPUs this process may use (:func:`choose`: among the device's NUMA-local CPUs where sysfs names
  them, the lowest-numbered CPU other than CPU 0, which takes the timer tick and most interrupts by
  default), every other thread of the process (torch's intra-op pool, the CUDA driver's threads) on
  the other allowed CPUs, off the main core's SMT siblings where enough CPUs remain for the
  intra-op threads. The same choice in every process on the same host and device, so the original
  step and the replay of paired rounds, and the replay in separate processes, run on one placement.
- ``LIST`` (a Linux CPU list, ``3`` or ``2,4-7``): the main thread on the first CPU, the others on the
  rest (on the first too when it is the only one); every CPU must be one this process may use.

Threads started after the placement inherit the creating thread's mask (the main core); callers
call :meth:`Placed.sweep` at round boundaries to move them. Where the OS has no per-thread
affinity (macOS: no ``os.sched_setaffinity``) or one CPU is allowed, ``auto`` places nothing and the
record says why; an explicit ``LIST`` there is refused (exit 3). The record
(:attr:`Placed.record`) goes into summary.json's ``timing.cpu_placement`` (capture.json's
``cpu_placement``) and a ``cpu_placement`` row of results.csv. Depends on the standard library only
(torch is imported to start the intra-op pool, where installed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import EnvironmentUnsupported, UsageError

POLICIES = ("none", "auto")
_TASKS = "/proc/self/task"
#: the CPU the auto choice avoids when it has another: Linux's default for the timer tick and IRQs
HOUSEKEEPING_CPU = 0


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``'3'``, ``'0-3'``, ``'1,4-5'`` -> the CPUs in the order given, each once; ValueError saying why."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            raise ValueError("an empty item")
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.strip().isdigit() or (sep and not hi_s.strip().isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or a range N-M")
        lo, hi = int(lo_s), int(hi_s) if sep else int(lo_s)
        if hi < lo:
            raise ValueError(f"range {part!r} runs backwards")
        if hi - lo > 65535:
            raise ValueError(f"range {part!r} is larger than any host")
        out.extend(c for c in range(lo, hi + 1) if c not in out)
    return tuple(out)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Sorted CPUs as a Linux CPU list: ``{0, 1, 2, 5}`` -> ``'0-2,5'``; ``''`` for none."""
    xs = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def parse_policy(text: str | None) -> str | tuple[int, ...]:
    """``none`` | ``auto`` | a CPU list (tuple); UsageError (one line) otherwise."""
    if text is None:
        return "none"
    t = str(text).strip().lower()
    if t in POLICIES:
        return t
    try:
        return parse_cpu_list(t)
    except ValueError as exc:
        raise UsageError(f"--cpu-affinity {text!r}: {exc}; expected none, auto or a CPU list such as 3 or 2,4-7")\
            from None


def check_policy(text: str | None) -> str | tuple[int, ...]:
    """:func:`parse_policy`, and a CPU list's CPUs checked against those this process may use (where
    the OS says): UsageError, one line, before anything runs."""
    policy = parse_policy(text)
    allow = allowed_cpus()
    if isinstance(policy, tuple) and allow is not None:
        outside = [c for c in policy if c not in allow]
        if outside:
            raise UsageError(f"--cpu-affinity {text}: CPU {format_cpu_list(outside)} is not among the CPUs this "
                             f"process may use ({format_cpu_list(allow)})")
    return policy


@dataclass(frozen=True)
class Choice:
    """Where the threads go: ``main`` (the timing thread's CPU) and ``others`` (every other thread's);
    ``applied`` False when nothing is pinned (``main`` None), ``why`` in words."""

    main: int | None
    others: tuple[int, ...]
    applied: bool
    why: str


def choose(allowed: Iterable[int], *, threads: int = 1, near: Iterable[int] | None = None,
           siblings: Mapping[int, Iterable[int]] | None = None, asked: Sequence[int] | None = None) -> Choice:
    """The placement of ``auto`` (``asked`` None) or of a CPU list, on a process allowed ``allowed``.

    ``threads``: torch's intra-op thread count (the main thread is one of them); ``near``: the CPUs
    local to the device (its NUMA node), None where unknown; ``siblings``: each CPU's SMT siblings
    (itself included, as sysfs lists them). Pure: the same inputs give the same choice. ValueError
    when ``asked`` names a CPU outside ``allowed``.
    """
    allow = sorted(set(allowed))
    if not allow:
        return Choice(None, (), False, "this process may run on no CPU the OS names")
    if asked is not None:
        outside = [c for c in asked if c not in allow]
        if outside:
            raise ValueError(f"CPU {format_cpu_list(outside)} is not among the CPUs this process may use "
                             f"({format_cpu_list(allow)})")
        rest = tuple(sorted(set(asked[1:]) - {asked[0]})) or (asked[0],)
        return Choice(asked[0], rest, True, f"as asked: the main thread on CPU {asked[0]}, the others on "
                      f"{format_cpu_list(rest)}")
    if len(allow) == 1:
        return Choice(None, (), False, f"one CPU allowed ({allow[0]}): nothing to place, every thread shares it")
    local = sorted(set(allow) & set(near or ()))
    cands = local or allow
    where = ("among the device's NUMA-local CPUs " + format_cpu_list(local)) if local else "among the allowed CPUs"
    pick = [c for c in cands if c != HOUSEKEEPING_CPU] or cands
    main = pick[0]
    rest = [c for c in allow if c != main]
    sib = set((siblings or {}).get(main, ())) - {main}
    off = [c for c in rest if c not in sib]
    need = max(threads - 1, 1)
    others = off if len(off) >= need else rest
    why = (f"auto: the main thread on CPU {main}, the lowest-numbered {where}"
           + (f" other than CPU {HOUSEKEEPING_CPU} (the timer tick's and interrupts' default)"
              if HOUSEKEEPING_CPU in cands and main != HOUSEKEEPING_CPU else "")
           + f"; the other threads on {format_cpu_list(others)}")
    if sib:
        why += (f", off its SMT sibling(s) {format_cpu_list(sib)}" if others is off else
                f", its SMT sibling(s) {format_cpu_list(sib)} included: {threads} intra-op threads need them")
    if threads > len(others) + 1:
        why += f" ({threads} intra-op threads on {len(others) + 1} CPUs: some share)"
    return Choice(main, tuple(others), True, why)


def allowed_cpus() -> tuple[int, ...] | None:
    """The CPUs this process may run on, or None where the OS does not say."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def smt_siblings(cpus: Iterable[int], read: Callable[[str], str | None] = _read) -> dict[int, tuple[int, ...]]:
    """Each CPU's SMT siblings from sysfs (``thread_siblings_list``); CPUs sysfs does not describe are left out."""
    out: dict[int, tuple[int, ...]] = {}
    for c in cpus:
        text = read(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        try:
            out[c] = parse_cpu_list(text) if text else ()
        except ValueError:
            continue
    return {c: s for c, s in out.items() if s}


def device_local_cpus(device: str, read: Callable[[str], str | None] = _read) -> tuple[int, ...] | None:
    """The CPUs of a CUDA device's NUMA node (sysfs ``local_cpulist`` of its PCI address); None on
    other devices or where torch or sysfs do not say."""
    if not str(device).startswith("cuda"):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        dev = torch.device(device)
        props = torch.cuda.get_device_properties(dev.index if dev.index is not None else torch.cuda.current_device())
        domain, bus, slot = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    except Exception:  # noqa: BLE001 - locality is a preference, never a failure
        return None
    if not all(isinstance(v, int) for v in (domain, bus, slot)):
        return None
    text = read(f"/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{slot:02x}.0/local_cpulist")
    try:
        return parse_cpu_list(text) if text else None
    except ValueError:
        return None


def _warm_pool() -> None:
    """Start torch's intra-op pool at its current size before the main thread is pinned (threads
    inherit the mask of the thread that starts them)."""
    try:
        import torch

        torch.ones(1 << 20).add_(1).sum()
    except Exception:  # noqa: BLE001 - no torch: no pool to start
        pass


def _thread_ids() -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(_TASKS))
    except OSError:
        return []


class Placed:
    """A placement applied to this process's threads (use as a context manager: :func:`placed`).

    ``record`` is what summary.json and capture.json keep: ``policy``, ``applied``, ``main_cpu``,
    ``other_cpus``, ``allowed_cpus``, ``near_device``, ``threads_moved`` and ``why``."""

    def __init__(self, policy: str | tuple[int, ...], device: str = "cpu", threads: int | None = None) -> None:
        self.policy = policy
        self.choice: Choice | None = None
        self.saved: dict[int, set[int]] = {}
        self.main_tid = threading.get_native_id()
        self.placed: set[int] = set()
        allow = allowed_cpus()
        near = device_local_cpus(device) if policy != "none" else None
        self.record: dict[str, Any] = {
            "policy": policy if isinstance(policy, str) else "list",
            "asked": policy if isinstance(policy, str) else format_cpu_list(policy),
            "applied": False, "main_cpu": None, "other_cpus": None,
            "allowed_cpus": format_cpu_list(allow) if allow is not None else None,
            "near_device": format_cpu_list(near) if near else None, "threads_moved": 0,
        }
        if policy == "none":
            self.record["why"] = "none: the process as launched, the scheduler places every thread"
            return
        if allow is None or not hasattr(os, "sched_setaffinity") or not os.path.isdir(_TASKS):
            if not isinstance(policy, str):
                raise EnvironmentUnsupported(f"--cpu-affinity {self.record['asked']}: this OS offers no per-thread "
                                             "CPU affinity (os.sched_setaffinity and /proc/self/task)")
            self.record["why"] = ("auto: not applied, this OS offers no per-thread CPU affinity "
                                  "(os.sched_setaffinity and /proc/self/task): the scheduler places every thread")
            return
        if threads is None:
            try:
                import torch

                threads = torch.get_num_threads()
            except Exception:  # noqa: BLE001
                threads = 1
        try:
            self.choice = choose(allow, threads=threads, near=near, siblings=smt_siblings(allow),
                                 asked=None if isinstance(policy, str) else policy)
        except ValueError as exc:
            raise UsageError(f"--cpu-affinity {self.record['asked']}: {exc}") from None
        self.record["why"] = self.choice.why
        if not self.choice.applied:
            return
        self.record.update(main_cpu=self.choice.main, other_cpus=format_cpu_list(self.choice.others))

    def apply(self) -> None:
        """Pin the main thread and move every other thread (the intra-op pool started first)."""
        if self.choice is None or not self.choice.applied:
            return
        _warm_pool()
        try:
            self.saved[self.main_tid] = set(os.sched_getaffinity(self.main_tid))
            os.sched_setaffinity(self.main_tid, {self.choice.main})
        except OSError as exc:
            self.record.update(applied=False, why=f"{self.choice.why}; not applied: {exc.strerror or exc}")
            self.choice = None
            return
        self.record["applied"] = True
        self.sweep()

    def sweep(self) -> int:
        """Move the threads started since the last sweep (other than the main one) to the other CPUs;
        returns how many moved."""
        if self.choice is None or not self.record["applied"]:
            return 0
        moved = 0
        for tid in _thread_ids():
            if tid == self.main_tid or tid in self.placed:
                continue
            try:
                self.saved.setdefault(tid, set(os.sched_getaffinity(tid)))
                os.sched_setaffinity(tid, set(self.choice.others))
            except OSError:  # the thread ended meanwhile
                continue
            self.placed.add(tid)
            moved += 1
        self.record["threads_moved"] += moved
        return moved

    def restore(self) -> None:
        """Every thread back on the mask it had (threads started meanwhile: the main thread's old mask)."""
        if not self.saved:
            return
        base = self.saved.get(self.main_tid)
        for tid in _thread_ids():
            mask = self.saved.get(tid, base)
            if mask:
                try:
                    os.sched_setaffinity(tid, mask)
                except OSError:
                    continue
        self.saved.clear()
        self.placed.clear()

    def __enter__(self) -> Placed:
        self.apply()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


def placed(policy: str | tuple[int, ...], device: str = "cpu", threads: int | None = None) -> Placed:
    """The placement ``policy`` (:func:`parse_policy`) of this process's threads for a timed block on
    ``device``: ``with placed(p, dev) as pl: ...`` (``pl.record`` says where they ran)."""
    return Placed(policy, device, threads)


def placement_words(record: dict[str, Any] | None) -> str:
    """One human phrase: 'main thread on CPU 1, other threads on 0 (auto)' / 'not pinned (none)'."""
    if not record:
        return "not recorded"
    if record.get("applied"):
        return (f"main thread on CPU {record['main_cpu']}, other threads on {record['other_cpus']} "
                f"({record['policy']}; {record.get('threads_moved', 0)} thread(s) moved)")
    return f"not pinned ({record.get('why') or record.get('policy')})"
