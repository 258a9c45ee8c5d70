"""Goldens shared by the runs of one self-test: computed once, with no mode active, reused after.

The self-test (:mod:`.selftest`) qualifies one device many times, healthy and under each fault.
What a golden is (an fp64 result, a bound derived from fp64 reruns) depends on the seed, the
workload, the dtype and torch, never on the mode of the device under test, which is active only
inside ``target.active()``. Recomputing it in every run is the same work each time, so inside
:func:`shared` a validator asks :func:`golden` for it by a key naming everything it depends on:

* the first ask computes it; the value is kept (a deep copy) only when the scope fills
  (``fill=True``: the self-test fills from its healthy run alone) and no dispatch or function
  mode was active while it was computed (a golden made under a mode is used once and forgotten);
* a later ask gets a deep copy of the kept value (a run cannot change what the next one reads);
* outside :func:`shared` nothing is kept: every call computes (a plain ``qualify`` or ``validate``
  run behaves as before).

The key also holds the process state a CPU result can depend on (:func:`_state`): threads, the
default dtype, deterministic algorithms, TF32 and matmul precision, so a changed setting is a miss.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

T = TypeVar("T")


@dataclass
class Store:
    """The goldens of one scope and how often each was reused (for tests and the self-test's log)."""

    fill: bool = True
    values: dict[Hashable, Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0


_STORE: Store | None = None


@contextlib.contextmanager
def shared(store: Store | None = None, *, fill: bool = True) -> Iterator[Store]:
    """Within: :func:`golden` keeps and reuses values in ``store`` (a new one by default). ``fill``
    False: read what is kept, keep nothing new (the self-test's fault runs)."""
    global _STORE
    prev = _STORE
    _STORE = store if store is not None else Store()
    saved_fill = _STORE.fill
    _STORE.fill = fill
    try:
        yield _STORE
    finally:
        _STORE.fill = saved_fill
        _STORE = prev


def mode_active() -> bool:
    """Whether any torch dispatch or function mode is active (the device under test's, or another)."""
    return bool(_get_current_dispatch_mode_stack()) or bool(_get_current_function_mode_stack())


def _state() -> tuple[Any, ...]:
    return (torch.__version__, torch.get_num_threads(), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())


def golden(key: Hashable, compute: Callable[..., T], *args: Any) -> T:
    """``compute(*args)``, or a copy of the value kept under ``key`` in the current :func:`shared` scope."""
    store = _STORE
    if store is None:
        return compute(*args)
    full = (key, _state())
    if full in store.values:
        store.hits += 1
        return copy.deepcopy(store.values[full])
    store.misses += 1
    if not store.fill or mode_active():
        return compute(*args)
    value = compute(*args)
    if not mode_active():
        store.values[full] = copy.deepcopy(value)
    return value
