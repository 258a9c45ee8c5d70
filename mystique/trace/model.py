"""Typed, schema-independent model of a PyTorch Execution Trace.

Every schema parser (1.0.1 flat ... 1.1.1-chakra) produces these objects; replay, generation and
analysis read only these. This module needs no torch.

Tensor values in the ET are ``[tensor_id, storage_id, offset, numel, itemsize, device]``
(offset in elements, from 1.0.2; 1.0.1 has the same tuple). ``dtype`` is the torch dtype name
taken from the type string (``Tensor(float)`` -> ``float32``, ``Tensor(c10::BFloat16)`` ->
``bfloat16``, ``Tensor(nullptr (uninitialized))`` -> ``undefined``; see :mod:`.types`).

Ordering: node ids come from one counter taken when an operator starts, so id order is the
execution (start) order across threads, and every child's id exceeds its parent's; the file
itself lists nodes as they finish (children first). ``Node.children`` is in id order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorRef:
    """A tensor argument: identity (tensor and storage ids), view (offset, shape, strides), type."""

    tensor_id: int
    storage_id: int
    offset: int  # storage offset, in elements
    numel: int
    itemsize: int  # bytes per element
    device: str | None  # as recorded, e.g. "cuda:0", "cpu"
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # None when the schema does not record strides
    dtype: str  # torch dtype name: "float32", "bfloat16", "int64", "bool", ...
    # (min, max) of an integral input tensor, when the trace records ``tensor_range``
    value_range: tuple[float, float] | None = None


@dataclass(frozen=True)
class Arg:
    """One input or output of a node.

    ``kind`` is the ET type with element types stripped: ``Tensor``, ``GenericList``, ``Int``,
    ``Double``, ``Bool``, ``String``, ``None``, ``Device``, ``Layout``, ``ScalarType``,
    ``MemoryFormat``, ``Generator``, ``Stream``, ``Storage`` or what the trace says.
    ``value`` is a :class:`TensorRef` for tensors, a list of :class:`Arg` for lists, a Python
    scalar/str/None otherwise. ``type`` is the original type string.
    """

    kind: str
    value: Any
    type: str
    shape: Any = None  # raw recorded shape entry


@dataclass
class Node:
    id: int
    name: str  # "aten::mm", "ProfilerStep#3", "## forward ##", "record_param_comms", ...
    parent: int | None  # call-stack parent (ctrl_deps / parent); None for the root
    inputs: list[Arg] = field(default_factory=list)
    outputs: list[Arg] = field(default_factory=list)
    op_schema: str = ""  # "aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)"
    rf_id: int | None = None  # record-function id: joins with the Kineto trace
    seq_id: int | None = None
    tid: int | None = None
    fw_parent: int | None = None
    scope: int | None = None
    kernel_backend: str = ""  # "triton" for PT2 kernels
    kernel_file: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)  # every attribute as recorded
    children: list[int] = field(default_factory=list)  # filled by the loader, in execution order

    @property
    def is_label(self) -> bool:
        """A label node that only groups other nodes: the opposite of :attr:`is_op`."""
        return not self.is_op

    @property
    def is_op(self) -> bool:
        """An operator call, as opposed to a label node.

        True for nodes with an ``op_schema``, compiled kernels (``kernel_backend``, e.g. Triton),
        ``record_param_comms`` and namespaced names (``aten::*``, ``c10d::*``, custom
        ``ns::op``), except the autograd/DDP/profiler labels that also contain ``::``
        (``autograd::engine::evaluate_function: ...``, ``torch::autograd::AccumulateGrad``, ...).
        """
        if self.op_schema or self.kernel_backend:
            return True
        if self.name == "record_param_comms":
            return True
        return "::" in self.name and not is_label_name(self.name)


@dataclass
class Trace:
    """A loaded execution trace: ``nodes`` by id, the root (the process node that names itself
    as its parent), the header fields, and the file it came from."""

    schema: str  # the schema version string as recorded, e.g. "1.1.1-chakra.0.0.4"
    nodes: dict[int, Node]  # id -> node
    root_id: int
    pid: int | None = None
    time: str | None = None
    start_ts: int | None = None
    finish_ts: int | None = None
    source: str = ""  # the path it was read from
    metadata: dict[str, Any] = field(default_factory=dict)  # any other top-level keys

    @property
    def root(self) -> Node:
        return self.nodes[self.root_id]

    def preorder(self, start: int | None = None) -> Iterator[Node]:
        """Yield the subtree of ``start`` (default: the root) in execution order, parents first."""
        nodes = self.nodes
        stack = [self.root_id if start is None else start]
        while stack:
            node = nodes[stack.pop()]
            yield node
            stack.extend(reversed(node.children))

    def ancestors(self, node_id: int) -> Iterator[Node]:
        """Yield the parent, grandparent, ... of ``node_id`` up to the root."""
        parent = self.nodes[node_id].parent
        while parent is not None:
            node = self.nodes[parent]
            yield node
            parent = node.parent


# Prefixes of record-function names that label a region instead of calling an operator.
LABEL_PREFIXES: tuple[str, ...] = (
    "## ",  # user annotations: "## forward ##", "## process_group:init ##"
    "##",
    "ProfilerStep#",
    "Optimizer.",  # "Optimizer.step#Adam.step", "Optimizer.zero_grad#..."
    "[pytorch|profiler",  # process and thread nodes
    "autograd::engine::",  # "autograd::engine::evaluate_function: MmBackward0"
    "torch::autograd::",  # AccumulateGrad, CppNode<...>, GraphRoot
    "torch::distributed::",  # DDP reducer regions
    "FSDP::",  # FSDP2 regions: "FSDP::pre_forward", "FSDP::post_backward_reduce", ...
    "torch.distributed.",
    "enumerate(DataLoader)",
    "DistributedDataParallel.",
    "Torch-Compiled Region",
    "TorchDynamo ",
    "CompiledFunction",
    "AOTDispatcher ",
    "Pregraph bytecode",
)


def is_label_name(name: str) -> bool:
    """True for names that label a region: ``## forward ##``, ``ProfilerStep#3``, autograd
    engine and DDP regions, profiler thread/process nodes, ``nccl:all_reduce`` (a single-colon
    backend label inside ``record_param_comms``), autograd function names (``MmBackward0``)."""
    if name.startswith(LABEL_PREFIXES):
        return True
    if "::" in name:
        return False
    if name == "record_param_comms":
        return False
    # no namespace: autograd node names, module labels, "nccl:all_reduce", "detach_" hooks ...
    return True
