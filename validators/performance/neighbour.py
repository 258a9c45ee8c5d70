"""The noisy neighbour of ``mystique fleet-campaign``: a process busy ``busy_s`` seconds of every
``period_s``, that dies with the process that started it.

Stopping it in a ``finally`` is not enough: a SIGKILL of the campaign (an OOM killer, a CI timeout,
``kill -9``) or a SIGTERM (default action: no ``finally`` runs) would leave it spinning on a CPU
forever. So the child ends itself when its parent goes, three ways, the first that applies:

* Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` set by the child first thing, so the kernel kills it
  when its parent exits (strictly, when the parent *thread* that started it exits: :func:`start` is
  called from the campaign's main thread); the child then checks the parent has not already gone
  before it was set.
* Everywhere: its stdin is a pipe whose only write end the parent holds (not inherited by other
  children: descriptors are not inheritable by default); while idle the child waits on that pipe,
  and end of file (the parent's exit closes it) ends the child at once.
* Everywhere: each busy burst checks, every few milliseconds, that ``os.getppid()`` is still the
  parent's pid (an orphan is adopted by another process).

The child runs ``python -c`` on :data:`PROGRAM` (the standard library only: nothing of ours is imported).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

#: The neighbour: ``python -c PROGRAM BUSY_S PERIOD_S PARENT_PID [pdeathsig]``.
PROGRAM = r"""
import os, select, signal, sys, time
busy, period, parent = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
if sys.argv[4:] == ["pdeathsig"] and sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
def orphaned():
    return os.getppid() != parent
def pipe_closed(timeout):
    try:
        ready, _, _ = select.select([sys.stdin], [], [], timeout)
        return bool(ready) and not os.read(sys.stdin.fileno(), 1)
    except (OSError, ValueError):  # no pipe to wait on: the pid check alone
        time.sleep(timeout)
        return False
while not orphaned():
    t = time.perf_counter()
    n = 0
    while time.perf_counter() - t < busy:
        n += 1
        if n % 4096 == 0 and orphaned():
            sys.exit(0)
    if pipe_closed(max(period - busy, 0.0)):
        sys.exit(0)
"""


def start(busy_s: float, period_s: float, *, pdeathsig: bool = True) -> subprocess.Popen:
    """Start the neighbour (see the module docstring); the caller stops it with :func:`stop`.
    ``pdeathsig=False`` leaves out the Linux mechanism (to test the portable ones)."""
    argv = [sys.executable, "-c", PROGRAM, repr(float(busy_s)), repr(float(period_s)), str(os.getpid())]
    return subprocess.Popen(argv + (["pdeathsig"] if pdeathsig else []), stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """End the neighbour: close its pipe, terminate it, and kill it if it has not gone in ``timeout`` s."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def neighbour(busy_s: float, period_s: float) -> Iterator[subprocess.Popen | None]:
    """A neighbour busy ``busy_s`` of every ``period_s`` seconds for the block (none for ``busy_s`` 0)."""
    proc = start(busy_s, period_s) if busy_s > 0 else None
    try:
        yield proc
    finally:
        if proc is not None:
            stop(proc)
