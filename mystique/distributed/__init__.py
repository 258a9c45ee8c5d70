"""Multi-rank capture and replay on one host: a launcher, per-rank process groups, a watchdog, a merge.

Where each part lives:

- :mod:`.sources`: where a multi-rank trace comes from (``rank-K/`` dirs, per-rank ET files, torchrun);
- :mod:`.launch`: process spawning, the rendezvous store, the watchdog and its failure message;
- :mod:`.capture`: ``mystique capture --nproc N`` (one trace dir per rank, DDP/FSDP);
- :mod:`.replay`: ``mystique replay`` of a multi-rank trace (one process per rank, synthetic peers);
- :mod:`.merge`: the replay's run-wide ``collectives.csv``, ``summary.json`` and ``results.csv``;
- :mod:`.fidelity`: the captured step and its replay timed side by side in the same ranks;
- :mod:`.collectives`: what a trace's collectives were (:class:`CommSpec`, bandwidth conventions);
- :mod:`.runner` and :mod:`.issue`: replaying them with ``torch.distributed`` (one issue function
  per collective kind).
"""

from .capture import PARALLEL, capture_distributed, capture_rank, model_device_index, wrap_step
from .collectives import COLLECTIVE_COLUMNS, CommSpec, ProcessGroupSpec, bandwidth, bus_factor, comm_specs
from .fidelity import STEP_RATIO_HIGH, STEP_RATIO_LOW, measure_fidelity
from .issue import CollectiveFailed
from .launch import (
    DEFAULT_TIMEOUT_S,
    DistributedFailure,
    LaunchResult,
    RankOutcome,
    default_backend,
    failure_message,
)
from .merge import merge_replay
from .replay import drop_unrunnable_inputs, replay_distributed
from .runner import FAULT_ENV, CollectiveRunner, parse_fault
from .sources import RankSet, find_rank_sources, torchrun_env

__all__ = [
    "COLLECTIVE_COLUMNS", "DEFAULT_TIMEOUT_S", "FAULT_ENV", "PARALLEL", "STEP_RATIO_HIGH", "STEP_RATIO_LOW",
    "CollectiveFailed", "CollectiveRunner", "CommSpec", "DistributedFailure", "LaunchResult", "ProcessGroupSpec",
    "RankOutcome", "RankSet", "bandwidth", "bus_factor", "capture_distributed", "capture_rank", "comm_specs",
    "default_backend", "drop_unrunnable_inputs", "failure_message", "find_rank_sources", "measure_fidelity",
    "merge_replay", "model_device_index", "parse_fault", "replay_distributed", "torchrun_env", "wrap_step",
]
