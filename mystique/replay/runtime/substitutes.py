"""Device substitutes: operators that exist only for one backend, replaced by their generic form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _accelerator_available() -> bool:
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        try:
            return bool(acc.is_available())
        except RuntimeError:
            return False
    return torch.cuda.is_available()


def _pin_identity(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    return self


def _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    out, mean, invstd = torch.ops.aten.native_batch_norm.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, invstd, torch.empty((0,), dtype=torch.uint8, device=input.device)


def _bn_forward3(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    return torch.ops.aten.native_batch_norm.default(input, weight, bias, running_mean, running_var,
                                                    training, momentum, eps)


def _bn_backward(input, grad_output, weight, running_mean, running_var, save_mean, save_var, epsilon,  # noqa: A002
                 reserveSpace=None):  # noqa: N803
    return torch.ops.aten.native_batch_norm_backward.default(
        grad_output, input, weight, running_mean, running_var, save_mean, save_var, True, epsilon,
        [True, True, True])


def _cudnn_conv(self, weight, padding, stride, dilation, groups, benchmark=False, deterministic=False,
                allow_tf32=False):
    n = weight.dim() - 2
    return torch.ops.aten.convolution.default(self, weight, None, list(stride), list(padding), list(dilation),
                                              False, [0] * n, groups)


def _cudnn_conv_t(self, weight, padding, output_padding, stride, dilation, groups, benchmark=False,
                  deterministic=False, allow_tf32=False):
    return torch.ops.aten.convolution.default(self, weight, None, list(stride), list(padding), list(dilation),
                                              True, list(output_padding), groups)


def _flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        query, key, value, dropout_p, is_causal, scale=scale)
    return out, lse


# op (without overload) -> (device types it runs on natively, substitute)
DEVICE_SUBSTITUTES: dict[str, tuple[tuple[str, ...], Callable[..., Any]]] = {
    "aten::cudnn_batch_norm": (("cuda",), _bn_forward),
    "aten::cudnn_batch_norm_backward": (("cuda",), _bn_backward),
    "aten::miopen_batch_norm": (("cuda",), _bn_forward3),
    "aten::miopen_batch_norm_backward": (("cuda",), _bn_backward),
    "aten::cudnn_convolution": (("cuda",), _cudnn_conv),
    "aten::cudnn_convolution_transpose": (("cuda",), _cudnn_conv_t),
    "aten::_scaled_dot_product_flash_attention": (("cuda",), _flash_cpu),
}


def substitute(qualified: str, device: torch.device) -> Callable[..., Any] | None:
    """A replacement for an operator that the replay device has no kernel for (None: keep it)."""
    name = qualified.split(".", 1)[0]
    if name in ("aten::pin_memory", "aten::_pin_memory") and not _accelerator_available():
        return _pin_identity
    entry = DEVICE_SUBSTITUTES.get(name)
    if entry is not None and device.type not in entry[0]:
        return entry[1]
    return None
