"""Device substitutes: operators that exist only for one backend, replaced by their generic form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .schemas import import_namespace


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


# FBGEMM's training lookups before its PT2 interface (the traces of PARAM's DLRM, torchrec < 1.0):
# ``fbgemm::split_embedding_codegen_lookup_<optimizer>_function(placeholder_autograd_tensor, dev_weights,
# uvm_weights, lxu_cache_weights, weights_placements, ...)``. FBGEMM 1.x registers the same lookup with
# its fused optimizer on the host as ``..._function_cpu(host_weights, weights_placements, ...)``: the
# same arguments without the placeholder, the cache and the uvm copies (the device copy, or the uvm
# one when the device copy is empty, becomes the host copy), each optimizer state likewise.
_LEGACY_TBE_PREFIX, _LEGACY_TBE_SUFFIX = "fbgemm::split_embedding_codegen_lookup_", "_function"
_LEGACY_TBE_STATE_AT = 20  # first argument of the optimizer states (momentum1_dev, ...)


def _host_copy(dev: Any, uvm: Any) -> Any:
    return uvm if isinstance(dev, torch.Tensor) and dev.numel() == 0 and isinstance(uvm, torch.Tensor) else dev


def _legacy_tbe_args(args: tuple[Any, ...]) -> list[Any]:
    """The ``_cpu`` lookup's positional arguments from the legacy lookup's."""
    a = list(args)
    out = [_host_copy(a[1], a[2]), *a[4:16], *a[17:20]]
    i = _LEGACY_TBE_STATE_AT
    while i + 3 < len(a) and all(isinstance(x, torch.Tensor) for x in a[i:i + 4]):
        out += [_host_copy(a[i], a[i + 1]), a[i + 2], a[i + 3]]  # (dev, uvm, placements, offsets)
        i += 4
    return out + a[i:]


def _legacy_tbe(optimizer: str) -> Callable[..., Any] | None:
    try:
        cpu_op = getattr(torch.ops.fbgemm, f"split_embedding_codegen_lookup_{optimizer}_function_cpu").default
    except (AttributeError, RuntimeError):
        return None

    def lookup(*args: Any, **kwargs: Any) -> Any:
        return cpu_op(*_legacy_tbe_args(args), **kwargs)
    return lookup


def legacy_substitute(name: str) -> Callable[..., Any] | None:
    """A replacement for an operator the installed library registers under another name (None: none)."""
    if not (name.startswith(_LEGACY_TBE_PREFIX) and name.endswith(_LEGACY_TBE_SUFFIX)):
        return None
    import_namespace("fbgemm")
    if hasattr(torch.ops.fbgemm, name.split("::", 1)[1]):
        return None  # an FBGEMM that still registers the legacy name runs it itself
    return _legacy_tbe(name[len(_LEGACY_TBE_PREFIX):-len(_LEGACY_TBE_SUFFIX)])


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
    return legacy_substitute(name) if name.startswith("fbgemm::") else None
