"""PyTorch Execution Trace model and loaders (the parser is chosen by the schema version)."""

from .model import Arg, Node, TensorRef, Trace

__all__ = ["Arg", "Node", "TensorRef", "Trace"]
