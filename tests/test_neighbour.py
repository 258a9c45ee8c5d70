"""The fleet campaign's noisy neighbour dies with the process that started it (issue 30, item 15)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from mystique.validators.performance import neighbour

PARENT = """
import os, signal, sys
from mystique.validators.performance import neighbour
busy, pdeathsig, sig = float(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
proc = neighbour.start(busy, 1.0, pdeathsig=pdeathsig)
print(proc.pid, proc.poll() is None, flush=True)
os.kill(os.getpid(), sig)
"""


def _gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie no one has reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False


def _wait_gone(pid: int, bound_s: float = 10.0) -> bool:
    """Poll until ``pid`` is gone or ``bound_s`` passes (a liveness bound, not a speed assertion)."""
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and pipes")
@pytest.mark.parametrize(("busy", "pdeathsig", "sig"), [
    (0.05, True, signal.SIGKILL),   # Linux: the kernel kills it with its parent
    (0.05, False, signal.SIGKILL),  # portable: end of file on the parent's pipe while idle
    (1.0, False, signal.SIGKILL),   # portable: always busy, the parent pid checked within the burst
    (0.05, True, signal.SIGTERM),   # a terminated parent runs no finally either
])
def test_the_neighbour_dies_when_its_parent_is_killed(busy, pdeathsig, sig):
    done = subprocess.run([sys.executable, "-c", PARENT, str(busy), "1" if pdeathsig else "0", str(int(sig))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -sig, done.stderr
    pid_text, was_running = done.stdout.split()
    pid = int(pid_text)
    assert was_running == "True"
    try:
        assert _wait_gone(pid), f"the neighbour {pid} outlived its parent"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_neighbour_context_stops_it_on_exit():
    with neighbour.neighbour(0.01, 0.5) as proc:
        assert proc is not None and proc.poll() is None
    assert proc.returncode is not None
    with neighbour.neighbour(0.0, 0.5) as none:
        assert none is None
