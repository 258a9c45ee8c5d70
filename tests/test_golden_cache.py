"""The self-test's shared goldens (validators/golden_cache.py): kept only from mode-free computations in
a filling scope, handed out as copies, and equal to the goldens a run computes afresh."""

from __future__ import annotations

import torch
from mystique.validators import golden_cache, numerics

from mystique.targets import make_target


def _counter():
    calls = []

    def compute(x):
        calls.append(x)
        return {"t": torch.full((3,), float(x), dtype=torch.float64)}

    return calls, compute


def test_outside_a_scope_every_ask_computes():
    calls, compute = _counter()
    golden_cache.golden("k", compute, 1)
    golden_cache.golden("k", compute, 1)
    assert calls == [1, 1]


def test_a_filling_scope_computes_once_and_hands_out_copies():
    calls, compute = _counter()
    with golden_cache.shared() as store:
        first = golden_cache.golden("k", compute, 2)
        first["t"].zero_()  # a run changing what it got must not change what the next run reads
        again = golden_cache.golden("k", compute, 2)
    assert calls == [2]
    assert store.hits == 1 and torch.equal(again["t"], torch.full((3,), 2.0, dtype=torch.float64))


def test_a_reading_scope_keeps_nothing_new():
    calls, compute = _counter()
    store = golden_cache.Store()
    with golden_cache.shared(store, fill=False):
        golden_cache.golden("k", compute, 3)
        golden_cache.golden("k", compute, 3)
    assert calls == [3, 3] and not store.values


def test_a_golden_computed_under_a_mode_is_not_kept():
    calls, compute = _counter()
    target = make_target("cpu", "bitflip:rate=1")
    with golden_cache.shared() as store:
        with target.active():
            assert golden_cache.mode_active()
            golden_cache.golden("k", compute, 4)
        golden_cache.golden("k", compute, 4)
    assert calls == [4, 4] and len(store.values) == 1


def test_a_changed_thread_count_is_a_miss():
    calls, compute = _counter()
    threads = torch.get_num_threads()
    with golden_cache.shared():
        golden_cache.golden("k", compute, 5)
        torch.set_num_threads(1 if threads != 1 else 2)
        try:
            golden_cache.golden("k", compute, 5)
        finally:
            torch.set_num_threads(threads)
    assert calls == [5, 5]


def _deviation(target, store=None, fill=True):
    opts = {"workloads": ["dlrm"], "dtypes": ["bfloat16"]}
    if store is None:
        return numerics.run(target, groups=["model_deviation"], **opts)
    with golden_cache.shared(store, fill=fill):
        return numerics.run(target, groups=["model_deviation"], **opts)


def test_cached_model_deviation_bounds_equal_fresh_ones_under_a_fault():
    """The healthy run fills the store; a fault run reading it gets the thresholds it would compute itself."""
    store = golden_cache.Store()
    _deviation(make_target("cpu"), store, fill=True)
    assert store.values, "the healthy run kept no golden"
    faulty = make_target("cpu", "stuck_lane")
    cached = _deviation(faulty, store, fill=False)
    assert store.hits >= 1
    fresh = _deviation(faulty)
    cols = ["check", "subject", "dtype", "metric", "value", "threshold", "status"]
    assert cached[cols].equals(fresh[cols])
    assert (cached["status"] == "fail").any()  # the fault is still seen through cached bounds
