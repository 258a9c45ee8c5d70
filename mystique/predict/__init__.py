"""What-if from traces: the execution graph of a captured step, a discrete-event simulation of it,
what-ifs (operator classes scaled, a device profile, ``--dtype``/``--batch-scale``) and the check of
each prediction by running it (``mystique predict``). Modules: :mod:`.graph` (the graph from a
capture or a benchmark), :mod:`.kernels` (device work from a Kineto trace), :mod:`.opmodel`
(operator classes, FLOPs and bytes), :mod:`.sim` (the simulation), :mod:`.whatif`, :mod:`.verify`,
:mod:`.run` (the command)."""

from .run import BOUNDS, PredictOptions, predict
from .sim import CLASSES, Graph, Simulated, Task, simulate

__all__ = ["BOUNDS", "CLASSES", "Graph", "PredictOptions", "Simulated", "Task", "predict", "simulate"]
