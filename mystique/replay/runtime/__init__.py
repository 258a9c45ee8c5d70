"""The replay runtime: runs a Mystique replay plan (``benchmark.json``) with synthetic data on any
torch device.

Standalone: it depends on torch, the standard library and :mod:`mystique.hostinfo` only, and
``mystique generate`` concatenates its modules (in :data:`MODULES` order) into every standalone
``benchmark.py``. Its parts:

* :mod:`.format`: the plan format (header, tables, schedule) and the JSON encoding of arguments;
* :mod:`.policy`: the operator policy: which operators an untrusted plan may call, from their schemas;
* :mod:`.schemas`: operator schemas, the namespace allow-list and overload resolution;
* :mod:`.bindings`: the Python binding eager code calls for an overload, verified on meta tensors;
* :mod:`.storage`: data recipes that fill storages, and the host (memory, threads, allocator);
* :mod:`.substitutes`: generic forms of operators that exist only for one backend;
* :mod:`.interpret`: the plan interpreter core that the executor, the correctness validator and
  the ONNX export share (materialising tensors, decoding an op's call, binding its results);
* :mod:`.codegen`: the source of one op's call, and of the compiled iteration;
* :mod:`.executor`: the :class:`Executor` (probe, compiled iteration, pacing, timing);
* :mod:`.main`: ``benchmark.py``'s command line.
"""

from .bindings import binding_call, python_binding
from .codegen import CompiledOp, IterationWriter, make_call
from .executor import PACINGS, CollectiveHandler, Executor, OpStatus, RefusedOperator, UnknownPacing
from .format import (
    LAYOUTS,
    MEMORY_FORMATS,
    PLAN_FORMAT,
    PLAN_VERSION,
    SCALAR_TYPES,
    InsufficientMemory,
    ReplayError,
    TensorSlot,
    check_plan,
    contiguous_strides,
    decode_value,
    dtype_from_name,
    encode_value,
    extent,
    load_plan,
    op_input_ids,
    op_output_ids,
    op_tensor_ids,
    schedule,
    walk_tensor_ids,
)
from .interpret import (
    PlanInterpreter,
    decode_call,
    fill_slots,
    flat_results,
    flatten_outputs,
    flatten_result,
    free_lists,
)
from .main import main
from .policy import POLICY_RULES, schema_refusal
from .schemas import (
    ALLOWED_OP_NAMESPACES,
    COLLECTIVE_NAMES,
    COLLECTIVE_PREFIXES,
    CUSTOM_OP_MODULES,
    NOOP_NAMES,
    Schema,
    SchemaArg,
    import_namespace,
    op_refusal,
    overload_schemas,
    parse_schema,
    plan_refusal,
    policy_refusal,
    resolve_overload,
)
from .storage import (
    available_memory,
    draw_ints,
    fill_storage,
    prime_host_allocator,
    replay_threads,
    steady_host_allocator,
    synchronize,
)
from .substitutes import DEVICE_SUBSTITUTES, substitute

# The runtime's modules in dependency order: how generate concatenates them into benchmark.py.
MODULES: tuple[str, ...] = ("format", "policy", "schemas", "bindings", "storage", "substitutes", "interpret", "codegen",
                            "executor", "main")

__all__ = [
    "ALLOWED_OP_NAMESPACES", "COLLECTIVE_NAMES", "COLLECTIVE_PREFIXES", "CUSTOM_OP_MODULES", "DEVICE_SUBSTITUTES",
    "LAYOUTS", "MEMORY_FORMATS", "MODULES", "NOOP_NAMES", "PACINGS", "PLAN_FORMAT", "PLAN_VERSION", "POLICY_RULES", "SCALAR_TYPES",
    "CollectiveHandler", "CompiledOp", "Executor", "IterationWriter", "PlanInterpreter", "InsufficientMemory", "OpStatus", "RefusedOperator", "ReplayError", "Schema", "SchemaArg",
    "TensorSlot", "UnknownPacing", "available_memory", "binding_call", "check_plan", "contiguous_strides",
    "decode_call", "decode_value", "draw_ints", "dtype_from_name", "encode_value", "extent", "fill_slots", "fill_storage", "flat_results", "flatten_outputs",
    "flatten_result", "free_lists", "import_namespace",
    "load_plan", "main", "make_call", "op_input_ids", "op_output_ids", "op_refusal", "op_tensor_ids", "overload_schemas",
    "parse_schema", "plan_refusal", "policy_refusal", "prime_host_allocator", "steady_host_allocator", "python_binding", "replay_threads", "resolve_overload", "schedule",
    "schema_refusal", "substitute", "synchronize", "walk_tensor_ids",
]
