"""Autocast policy: CUDA refuses ``binary_cross_entropy`` under autocast; CPU runs it in fp32.

PyTorch registers, for the CUDA autocast dispatch key, a kernel for ``aten::binary_cross_entropy``
that only raises (``binary_cross_entropy_banned`` in ``aten/src/ATen/autocast_mode.cpp``): the op
on probabilities, and ``nn.BCELoss`` that wraps it, are "unsafe to autocast" because their backward
can produce gradients that fp16 cannot represent; the AMP docs (CUDA op-specific behaviour, "Prefer
binary_cross_entropy_with_logits over binary_cross_entropy") tell users to take the logits instead.
The CPU autocast key lists the same op under its fp32 policy, so on the host it simply runs. A
training step that trains fine under CPU autocast (DLRM's old ``sigmoid`` + BCE loss) therefore
fails on a healthy CUDA device with this message; this module makes the emulated device fail the same way.

Only the forward is banned: CUDA registers no autocast kernel for ``binary_cross_entropy_backward``
(and the engine runs backward with the autocast state of the ``backward()`` call), so the backward
is left to the host. The ban does not depend on dtypes: CUDA's autocast kernel runs for any CUDA
tensor while CUDA autocast is enabled, fp32 and fp64 inputs included.

Where the op was called matters, not where the mode runs: a ``TorchDispatchMode`` is entered with
every dispatch key above Python excluded, autocast included, so ``torch.is_autocast_enabled()``
inside ``__torch_dispatch__`` is always False. :func:`autocast_enabled_at_call` reads the
thread-local dispatch state PyTorch snapshots when the op entered the dispatcher, restored by
``torch.overrides.enable_reentrant_dispatch()`` (``torch._C._RestorePythonTLSSnapshot``). Only the
``default`` overload is banned (CUDA registers no kernel for ``out=`` calls, which autocast never
casts). The device type is that of the op's tensors (``cpu`` here:
the emulated device runs on the host, so the code under test enables ``torch.autocast("cpu")``
where a GPU run enables ``torch.autocast("cuda")``).

Not emulated: the op lists on which the two backends' autocast policies differ only in precision.
CUDA autocast runs its fp32 list (``AT_FORALL_FP32`` / ``AT_FORALL_FP32_SET_OPT_DTYPE`` in
``autocast_mode.h``: ``softmax``, ``log_softmax``, ``layer_norm``, ``pow``, ``rsqrt``, ``exp``,
``sum``, ``cumsum``, the losses, ...) in fp32 and hands fp32 on, where CPU autocast leaves most of
them in the input dtype; it also casts ``mv``, ``addmv``, ``addr`` to fp16/bf16, which CPU autocast
leaves alone. In the reference workloads every op of the CUDA fp32 list already receives fp32
inputs (they upcast RMSNorm, residuals and losses themselves) or rounds once to the same result
(the LayerNorm of BERT's MLM head), and none calls ``mv``, ``addmv`` or ``addr``: emulating these
lists would change no result the numerics checks see, so they are left out.
"""

from __future__ import annotations

from typing import Any

import torch

from .difference import PASS, Difference

# The message of binary_cross_entropy_banned in aten/src/ATen/autocast_mode.cpp, verbatim.
BCE_UNSAFE_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


def autocast_enabled_at_call(device_type: str) -> bool:
    """Whether autocast for ``device_type`` was enabled where the op now in ``__torch_dispatch__``
    was called. Outside a dispatch handler (no snapshot to restore) it is the current state."""
    try:
        with torch.overrides.enable_reentrant_dispatch():
            return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # "Accessing torch dispatch state outside of '__torch_dispatch__'"
        return torch.is_autocast_enabled(device_type)


def _device_type(args: tuple, kwargs: dict) -> str | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device.type
    return None


def _bce_banned(func: Any, args: tuple, kwargs: dict) -> Any:
    if getattr(func, "_overloadname", "default") != "default":  # binary_cross_entropy.out: not banned
        return PASS
    dev = _device_type(args, kwargs)
    if dev is not None and autocast_enabled_at_call(dev):
        raise RuntimeError(BCE_UNSAFE_MESSAGE)
    return PASS


DIFFERENCES: list[Difference] = [
    Difference(
        name="autocast_bans_binary_cross_entropy",
        summary="binary_cross_entropy (F.binary_cross_entropy, nn.BCELoss) raises inside an autocast region "
                "(CUDA's autocast bans it; CPU autocast runs it in fp32)",
        documented=("PyTorch aten/src/ATen/autocast_mode.cpp: TORCH_LIBRARY_IMPL(aten, Autocast, m) registers "
                    "binary_cross_entropy_banned for aten::binary_cross_entropy (message verbatim in "
                    "BCE_UNSAFE_MESSAGE), while TORCH_LIBRARY_IMPL(aten, AutocastCPU, m) lists "
                    "KERNEL_CPU(binary_cross_entropy, fp32); docs torch.amp, 'CUDA Op-Specific Behavior: Prefer "
                    "binary_cross_entropy_with_logits over binary_cross_entropy'; seen on an H100 2026-11-25 "
                    "(issue 17: model_train_deviation dlrm bf16/fp16 errors)"),
        ops=frozenset({"binary_cross_entropy"}),
        run=_bce_banned,
    ),
]
