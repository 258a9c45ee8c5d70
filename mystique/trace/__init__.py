"""PyTorch Execution Trace model and loaders (the parser is chosen by the schema version).

Public API: :func:`load_trace` (any supported schema, ``.json``/``.json.gz``/trace folder) and
the model classes; :mod:`.analysis` (iterations, operators to replay, statistics, data
dependencies) and :mod:`.kineto` (times joined by ``rf_id``) are re-exported here.
"""

from .analysis import (
    OP_STATS_COLUMNS,
    Iteration,
    all_ops,
    data_dependencies,
    iteration_spans,
    iterations,
    op_stats,
    producers,
    replay_ops,
    select_iteration,
    tensors,
)
from .kineto import KinetoTimes, load_kineto, load_kineto_device_times, read_kineto
from .loader import load_trace, parse_trace_document, supported_schemas
from .model import Arg, Node, TensorRef, Trace, is_label_name

__all__ = [
    "OP_STATS_COLUMNS",
    "Arg",
    "Iteration",
    "KinetoTimes",
    "Node",
    "TensorRef",
    "Trace",
    "all_ops",
    "data_dependencies",
    "is_label_name",
    "iteration_spans",
    "iterations",
    "load_kineto",
    "load_kineto_device_times",
    "load_trace",
    "op_stats",
    "parse_trace_document",
    "producers",
    "read_kineto",
    "replay_ops",
    "select_iteration",
    "supported_schemas",
    "tensors",
]
