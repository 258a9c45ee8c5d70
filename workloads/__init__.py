"""Reference workloads (Llama 3, DLRM, BERT, Llama 4) and their registry.

Each workload module (``llama.py``, ``dlrm.py``, ``bert.py``, ``llama4.py``) defines a config dataclass, a dict
``CONFIGS`` of named sizes (``debug``, ``small`` and the published ones), the model, a seeded
synthetic batch and a loss. This package needs only torch.

The API every other part uses::

    WORKLOADS                             -> ("llama", "dlrm", "bert", "llama4")  (the registry, in its order)
    names()                               -> ["bert", "dlrm", "llama", "llama4"]  (sorted)
    get(name)                             -> Workload (the module-level adapter)
    make_step(name, config, mode, device=..., dtype=..., seed=..., batch_size=None) -> Step
"""

from __future__ import annotations

from .base import MODES, REGISTERED, WORKLOADS, Step, Workload, WorkloadTooLarge, get, make_step, names

__all__ = ["MODES", "REGISTERED", "WORKLOADS", "Step", "Workload", "WorkloadTooLarge", "get", "make_step", "names"]
