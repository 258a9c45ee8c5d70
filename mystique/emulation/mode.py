"""The dispatch mode that runs the device under test as an emulated foreign device."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from ..faults.schema import op_name
from .difference import PASS, Difference


class EmulationMode(TorchDispatchMode):
    """Dispatch every op; the first difference that claims it computes it, else the host does."""

    def __init__(self, profile: str, diffs: list[Difference]):
        super().__init__()
        self.profile = profile
        self.differences = list(diffs)
        self._by_op: dict[str, list[Difference]] = {}
        for d in self.differences:
            for op in d.ops:
                self._by_op.setdefault(op, []).append(d)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for d in self._by_op.get(op_name(func), ()):
            out = d.run(func, args, kwargs)
            if out is not PASS:
                return out
        return func(*args, **kwargs)


def active_profile() -> str | None:
    """The profile of the innermost active :class:`EmulationMode`, or None.

    Validators ask this where a foreign device's behaviour is a *query*, not an op (``may this
    device use TF32?``, ``does this SDPA backend have a kernel for fp32?``).
    """
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, EmulationMode):
            return mode.profile
    return None
