"""Progress lines on stderr for long commands (one line per step, readable in CI logs too)."""

from __future__ import annotations

import os
import sys
import time

_ENABLED = os.environ.get("MYSTIQUE_QUIET", "") in ("", "0")


def set_enabled(enabled: bool) -> None:
    global _ENABLED
    _ENABLED = enabled


def enabled() -> bool:
    """Whether progress lines are printed (False under ``-q`` or ``MYSTIQUE_QUIET=1``)."""
    return _ENABLED


class Progress:
    """``with Progress("replay", total=10) as p: p.step("aten::mm")`` prints ``[replay 1/10] aten::mm``."""

    def __init__(self, label: str, total: int | None = None, stream=None):
        self.label = label
        self.total = total
        self.count = 0
        self.stream = stream
        self.t0 = time.perf_counter()

    def step(self, message: str = "", advance: int = 1) -> None:
        self.count += advance
        self.note(message)

    def note(self, message: str) -> None:
        if not _ENABLED:
            return
        where = f" {self.count}/{self.total}" if self.total else (f" {self.count}" if self.count else "")
        elapsed = time.perf_counter() - self.t0
        stream = self.stream or sys.stderr
        print(f"[{self.label}{where} {elapsed:.1f}s] {message}", file=stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        return None
