"""The one cache shape of the checked operators: a dict of memoized values that empties itself when full.

The hot paths memoize what depends only on a shape or a tensor's identity (check weights, threshold
constants, compiled-call plans) so that a checked call does no Python-level work it did before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

#: Entries a cache holds before it is emptied (shapes seen by one process are few).
MAX_CACHED = 512


class BoundedCache(dict):
    """A dict of memoized values, emptied when it holds ``limit`` entries."""

    def __init__(self, limit: int = MAX_CACHED) -> None:
        super().__init__()
        self.limit = limit

    def lookup(self, key: Hashable, make: Callable[..., Any], *args: Any) -> Any:
        """The value of ``key``, made by ``make(*args)`` (and kept) where it is missing."""
        hit = self.get(key)
        if hit is None:
            if len(self) >= self.limit:
                self.clear()
            hit = self[key] = make(*args)
        return hit
