"""Synthetic data for storages (data recipes), and the host the replay runs on: memory, CPU
threads, the host allocator, device synchronisation."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from mystique.hostinfo import device_memory_bytes

_TILE = 1 << 22  # elements generated at random per storage; larger storages repeat them


def fill_storage(buf: torch.Tensor, recipe: dict[str, Any]) -> None:
    """Fill the flat tensor ``buf`` in place according to a data recipe.

    Recipes: ``randn`` (floats with standard deviation ``std``, default 1; 0/1 for integers), ``randint`` (``low`` <= v < ``high``;
    optional ``segments`` ``[start, count, stride, low, high]`` give views of the storage ranges of their own;
    optional ``zipf`` (an exponent) skews the values, see :func:`draw_ints`),
    ``uniform_pos`` (floats in [0.1, 1)), ``bernoulli`` (0/1, False/True), ``offsets``
    (per segment ``[start, count, stride, total, include_last]``: non-decreasing, first 0, all <=
    ``total``), ``zeros``, ``ones``; and the kinds of :data:`_WHOLE_KINDS` (table metadata of
    FBGEMM's table-batched embeddings): ``values`` (the list ``values`` repeated), ``lengths``
    (non-negative, summing to ``total``), ``randperm`` (a permutation of ``0 .. n-1``).
    """
    if buf.numel() == 0 or buf.device.type == "meta":
        return
    if recipe.get("kind") in _WHOLE_KINDS:
        with torch.no_grad():
            _WHOLE_KINDS[recipe["kind"]](buf, recipe)
        return
    _fill_random(buf, recipe)


def _fill_random(buf: torch.Tensor, recipe: dict[str, Any]) -> None:
    n = buf.numel()
    if n > _TILE and recipe.get("kind") != "offsets" and not recipe.get("segments"):
        # large storages: random data for one block, repeated (generation is far slower than copying)
        _fill_random(buf[:_TILE], recipe)
        done = _TILE
        while done < n:
            k = min(done, n - done)
            buf[done:done + k].copy_(buf[:k])
            done += k
        return
    kind = recipe.get("kind", "randn")
    dt = buf.dtype
    floating = dt.is_floating_point or dt.is_complex
    with torch.no_grad():
        if kind == "zeros":
            buf.zero_()
        elif kind == "ones":
            buf.fill_(1)
        elif kind == "randint" and dt != torch.bool:
            low, high = int(recipe.get("low", 0)), int(recipe.get("high", 2))
            if high <= low:
                high = low + 1
            if dt.is_floating_point:
                buf.copy_(torch.randint(low, high, (n,), device=buf.device).to(dt))
            else:
                info = torch.iinfo(dt) if not dt.is_complex else None
                if info is not None:
                    low, high = max(low, info.min), min(high, info.max + 1) if high <= info.max else info.max
                    high = max(high, low + 1)
                buf.copy_(draw_ints(low, high, n, buf.device, recipe.get("zipf")).to(dt))
            for start, count, stride, s_low, s_high in recipe.get("segments") or []:
                count = min(int(count), max((n - 1 - int(start)) // max(int(stride), 1) + 1, 0))
                if count > 0:
                    pos = int(start) + torch.arange(count, device=buf.device) * int(stride)
                    vals = draw_ints(int(s_low), max(int(s_high), int(s_low) + 1), count, buf.device, recipe.get("zipf"))
                    buf[pos] = vals.to(dt)
        elif kind == "offsets":
            # non-decreasing bag starts beginning at 0, one run per offsets view (segment)
            segments = recipe.get("segments") or [
                [0, n, 1, int(recipe.get("total", 0)), bool(recipe.get("include_last"))]]
            buf.zero_()
            for start, count, stride, total, include_last in segments:
                count = min(int(count), max((n - 1 - int(start)) // max(int(stride), 1) + 1, 0))
                if count <= 0:
                    continue
                total = max(int(total), 0)
                vals = torch.randint(0, total + 1, (count,), device=buf.device, dtype=torch.int64).sort().values
                vals[0] = 0
                if include_last and count > 1:
                    vals[-1] = total
                pos = int(start) + torch.arange(count, device=buf.device) * int(stride)
                buf[pos] = vals.to(dt)
        elif dt == torch.bool or kind == "bernoulli":
            buf.copy_(torch.rand(n, device=buf.device) < 0.5)
        elif kind == "uniform_pos":
            if floating:
                buf.uniform_(0.1, 1.0)
            else:
                buf.copy_(torch.randint(1, 3, (n,), device=buf.device).to(dt))
        elif floating:
            std = float(recipe.get("std", 1.0))
            if dt.is_floating_point and dt.itemsize == 1:  # float8: generate wider, then cast
                buf.copy_(torch.randn(n, device=buf.device) * std)
            else:
                buf.normal_(0.0, std)
        else:
            buf.copy_(torch.randint(0, 2, (n,), device=buf.device).to(dt))


def _fill_values(buf: torch.Tensor, recipe: dict[str, Any]) -> None:
    vals = torch.tensor([float(v) for v in recipe.get("values") or [0]], dtype=torch.float64)
    reps = -(-buf.numel() // vals.numel())
    buf.copy_(vals.repeat(reps)[:buf.numel()].to(buf.dtype))


def _fill_lengths(buf: torch.Tensor, recipe: dict[str, Any]) -> None:
    # bag lengths that add up to the values they split: ``total`` items dropped into ``n`` bags
    n, total = buf.numel(), max(int(recipe.get("total", 0)), 0)
    bags = torch.randint(0, n, (total,), device=buf.device)
    buf.copy_(torch.bincount(bags, minlength=n).to(buf.dtype))


def _fill_randperm(buf: torch.Tensor, recipe: dict[str, Any]) -> None:
    buf.copy_(torch.randperm(buf.numel(), device=buf.device).to(buf.dtype))


# recipe kinds filled whole (never tiled): their values depend on the storage's whole extent
_WHOLE_KINDS = {"values": _fill_values, "lengths": _fill_lengths, "randperm": _fill_randperm}


def draw_ints(low: int, high: int, n: int, device: torch.device, zipf: Any = None) -> torch.Tensor:
    """``n`` int64 values in ``[low, high)``: uniform, or Zipf-skewed when ``zipf`` is an exponent > 0.

    Skewed: the value of popularity rank ``r`` (0 = most popular) is drawn with weight ``(r + 1) ** -zipf``
    (inverse CDF of the continuous power law, truncated to the range), and ranks are spread over the range
    by a fixed stride coprime with its size, so that popular values are not neighbours.
    """
    size = high - low
    if not zipf or size <= 1:
        return torch.randint(low, high, (n,), device=device, dtype=torch.int64)
    a = float(zipf)
    u = torch.rand(n, device=device, dtype=torch.float64)
    top = float(size + 1)
    if abs(a - 1.0) < 1e-9:
        x = torch.exp(u * math.log(top))
    else:
        x = (u * (top ** (1.0 - a) - 1.0) + 1.0) ** (1.0 / (1.0 - a))
    rank = (x.floor().to(torch.int64) - 1).clamp_(0, size - 1)
    stride = max(1, int(size * 0.381966))
    while math.gcd(stride, size) != 1:
        stride += 1
    return (rank * stride) % size + low


def available_memory(device: torch.device) -> int | None:
    """Bytes the device can still allocate (free CUDA memory, or the host's available memory)."""
    return device_memory_bytes(device, available=True)


def replay_threads(plan: dict[str, Any], device: torch.device, requested: int | None = None) -> int | None:
    """The intra-op CPU thread count a replay on ``device`` should use (None: leave torch's setting).

    ``requested`` > 0 wins; 0 keeps torch's setting; None (the default) takes the plan's
    ``original_threads`` (``capture.json``'s ``threads``) so that kernels split their work as they did
    when the original step was timed, capped at the cores this process may run on. Accelerator
    replays keep torch's setting.
    """
    if requested is not None:
        return int(requested) if requested > 0 else None
    if device.type != "cpu":
        return None
    want = (plan.get("metadata") or {}).get("original_threads")
    if not isinstance(want, int) or isinstance(want, bool) or want < 1:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or want
    return max(1, min(want, cores))


# glibc's cap on its dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts)
_MALLOC_DYNAMIC_MMAP_MAX = 32 << 20


def prime_host_allocator(nbytes: int) -> None:
    """Allocate and free one host block of ``nbytes`` (capped just below 32 MiB), before a CPU replay.

    glibc serves blocks above its mmap threshold with a fresh ``mmap`` and raises the threshold (up
    to 32 MiB) to the largest such block freed so far. The captured step ran in a process that had
    already freed temporaries as large as its parameters, so its large intermediates were recycled
    from the heap; freeing one block as large as the plan's largest storage puts a fresh replay
    process's allocator in that state, instead of faulting those pages in every iteration.
    Elsewhere (another malloc, a caching allocator) it is one allocation and one free.
    """
    n = min(int(nbytes), _MALLOC_DYNAMIC_MMAP_MAX - (64 << 10))
    if n >= 1 << 20:
        block = torch.empty(n, dtype=torch.uint8)
        del block


# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
#: what the steady allocator sets: no mmap for large blocks, a heap top never trimmed, 64 MiB of pad
_STEADY_SETTINGS = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 64 << 20))
#: glibc's documented defaults (mallopt(3)), and the environment variable and the tunable that set them
_MALLOPT_DEFAULTS = {
    _M_MMAP_MAX: (65536, "MALLOC_MMAP_MAX_", "glibc.malloc.mmap_max"),
    _M_TRIM_THRESHOLD: (128 * 1024, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
    _M_TOP_PAD: (128 * 1024, "MALLOC_TOP_PAD_", "glibc.malloc.top_pad"),
}
_steady_lock = threading.Lock()
_steady_state: dict[str, Any] = {"depth": 0, "said": None, "restore": ()}


def _libc_mallopt() -> Any:
    """The C library's ``mallopt(int, int) -> int``, or None where there is none (not glibc)."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def allocator_start_values(environ: Any = None) -> dict[int, int]:
    """The values the process started with, of the parameters the steady allocator sets: glibc's
    tunable (``GLIBC_TUNABLES=glibc.malloc.top_pad=...``) or its ``MALLOC_*_`` variable where the
    environment sets one, else glibc's documented default."""
    env = os.environ if environ is None else environ
    tunables = dict(item.split("=", 1) for item in env.get("GLIBC_TUNABLES", "").split(":") if "=" in item)
    out = {}
    for param, (default, variable, tunable) in _MALLOPT_DEFAULTS.items():
        value = default
        for text in (env.get(variable), tunables.get(tunable)):  # the tunable taken over the variable
            try:
                value = int(text, 0) if text else value
            except ValueError:
                pass
        out[param] = value
    return out


@contextlib.contextmanager
def steady_host_allocator(mallopt: Any = None, environ: Any = None) -> Iterator[str | None]:
    """For the block, keep glibc from mapping and unmapping large blocks; yields what was set, or None
    where the C library has no ``mallopt`` (not glibc) or refused. ``mallopt`` stands in for the C
    library's function (tests).

    A step of large host tensors otherwise pays a fresh ``mmap`` (and a page fault per 4 KiB page
    touched) for every block above the mmap threshold, and ``free`` trims the heap top back to the
    OS, so the next step faults it in again. How many faults a step pays depends on the order and
    sizes of the allocations before it, not on its operators: measured on a BERT training step,
    the replay and the original step interleaved paid 24k and 16k faults a step, 3% of the step's
    time apart. With large blocks served from a heap that is never trimmed, both pay none, and a
    paired ratio compares the operators. Both sides of a paired measurement share the process, so
    both run under this setting; the timing statistics name it.

    On exit ``M_MMAP_MAX``, ``M_TRIM_THRESHOLD`` and ``M_TOP_PAD`` get back the values the process
    started with (:func:`allocator_start_values`). What cannot be restored: glibc has no getter, so a
    value set with ``mallopt`` by someone else before the block is not known and the start value
    comes back instead; and setting any of these turns off glibc's dynamic mmap threshold for the
    rest of the process (mallopt has no way to turn it on again): ``M_MMAP_THRESHOLD`` (never set
    here) stays where the dynamic adjustment had moved it (128 KiB up to 32 MiB), no longer moves,
    and the trim threshold no longer follows it at twice its value. Nested or concurrent blocks set
    the values once and restore them when the last one exits.
    """
    with _steady_lock:
        if _steady_state["depth"] == 0:
            _steady_state["said"], _steady_state["restore"] = _set_steady(mallopt or _libc_mallopt(), environ)
        _steady_state["depth"] += 1
        said = _steady_state["said"]
    try:
        yield said
    finally:
        with _steady_lock:
            _steady_state["depth"] -= 1
            if _steady_state["depth"] == 0:
                fn, values = _steady_state["restore"] or (None, {})
                for param, value in values.items():
                    fn(param, value)
                _steady_state.update(said=None, restore=())


def _set_steady(mallopt: Any, environ: Any) -> tuple[str | None, tuple]:
    """Set the steady values; (what was set in words or None, (mallopt, values to restore))."""
    if mallopt is None:
        return None, ()
    start = allocator_start_values(environ)
    done = {}
    for param, value in _STEADY_SETTINGS:
        if not mallopt(param, value):
            for p, v in done.items():  # refused: leave the process as it was
                mallopt(p, v)
            return None, ()
        done[param] = start[param]
    return ("glibc malloc without mmap or trimming for large blocks (mallopt M_MMAP_MAX=0, "
            "M_TRIM_THRESHOLD=2 GiB), restored after"), (mallopt, done)


def synchronize(device: torch.device) -> None:
    if device.type == "cpu" or device.type == "meta":
        return
    mod = getattr(torch, device.type, None)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()
