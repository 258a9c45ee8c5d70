"""Facts about the host the suite runs on, read one way everywhere: memory and CPU threads.

Depends on the standard library and torch only: the generated ``benchmark.py`` carries this
module's text (see ``mystique.replay.generate``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def host_memory_bytes(available: bool = False) -> int | None:
    """Total (or currently available, ``MemAvailable``) host memory in bytes, where the OS tells."""
    key = "MemAvailable:" if available else "MemTotal:"
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES" if available else "SC_PHYS_PAGES")
        return os.sysconf("SC_PAGE_SIZE") * pages
    except (ValueError, OSError, AttributeError):
        return None


def device_memory_bytes(device: torch.device | str, available: bool = False) -> int | None:
    """Memory of ``device`` in bytes (total, or free now): host memory for the CPU,
    ``torch.cuda.mem_get_info`` for CUDA; None where the backend does not say."""
    device = torch.device(device)
    if device.type == "cpu":
        return host_memory_bytes(available)
    if device.type == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(device.index if device.index is not None else 0)
        return int(free if available else total)
    return None


@contextlib.contextmanager
def torch_threads(n: int | None, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the block with ``n`` intra-op CPU threads (restored after); a no-op for ``n=None`` or a
    device other than the CPU."""
    if n is None or torch.device(device).type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)
