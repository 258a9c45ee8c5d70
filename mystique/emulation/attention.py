"""SDPA backends without a kernel for the inputs: CUDA's flash and cuDNN attention have no fp32 kernel.

On CUDA, ``sdp::select_sdp_backend`` (ATen ``transformers/cuda/sdp_utils.cpp``) tries the enabled
backends in priority order; flash attention and cuDNN attention accept only fp16/bf16 on sm80+
(``check_dtypes_low_precision``), memory-efficient attention also fp32, math everything. When no
enabled backend can run, it re-runs each check with ``debug=true`` (each failed check is a
``TORCH_WARN``, i.e. a Python ``UserWarning``) and raises ``RuntimeError("No available kernel.
Aborting execution.")``. PyTorch's CPU flash kernel accepts fp32, so on the host
``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` with fp32 inputs runs where CUDA refuses.

This module reproduces that refusal (:data:`DIFFERENCES`, on ``aten._scaled_dot_product_flash_attention_for_cpu``,
the op the dispatcher sees when SDPA picks the CPU flash kernel) and answers the question "has
this backend a kernel for these inputs?" (:func:`refusal`) the same way for a real CUDA device
(``torch.backends.cuda.can_use_*`` with ``debug=True``) and for the emulated one, so a validator
asking first and a validator just calling see the same device.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
from torch.nn.attention import sdpa_kernel

from .difference import PASS, Difference
from .mode import active_profile

NO_KERNEL = "No available kernel. Aborting execution."
# SDPA's own "nothing can run" refusals: CUDA's select_sdp_backend, and the CPU's (sdp_utils_cpp.cpp).
_REFUSALS = (NO_KERNEL, "No viable backend for scaled_dot_product_attention was found")
_LOW = ("float16", "bfloat16")
# c10 prints a TypeMeta by its C++ name; check_tensor_dtype prints ScalarTypes joined.
_CPP_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16"}
_ALLOWED = {  # backend name -> (dtypes, how c10 prints them), for sm80+ (the H100)
    "FLASH_ATTENTION": (_LOW, "Half, BFloat16"),
    "CUDNN_ATTENTION": (_LOW, "Half, BFloat16"),
    "EFFICIENT_ATTENTION": (("float16", "float32", "bfloat16"), "Half, Float, BFloat16"),
}
_HEADERS = {"FLASH_ATTENTION": "Flash attention kernel not used because:",
            "EFFICIENT_ATTENTION": "Memory efficient kernel not used because:",
            "CUDNN_ATTENTION": "cuDNN attention kernel not used because:"}
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?\s*$")


def _dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def dtype_message(backend_name: str, q: Any, k: Any, v: Any) -> str | None:
    """``check_tensor_dtype``'s warning for ``backend_name`` on CUDA sm80+, or None when the dtypes are fine."""
    allowed, printed = _ALLOWED.get(backend_name, (None, ""))
    names = [_dtype_name(t) for t in (q, k, v)]
    if allowed is None or (names[0] in allowed and names.count(names[0]) == 3):
        return None
    cpp = [_CPP_NAMES.get(n, n) for n in names]
    return (f"Expected query, key and value to all be of dtype: {{{printed}}}. Got Query dtype: {cpp[0]}, "
            f"Key dtype: {cpp[1]}, and Value dtype: {cpp[2]} instead.")


def is_refusal(exc: BaseException) -> bool:
    """True exactly for SDPA's "no kernel for these inputs" RuntimeError (CUDA's or the CPU's)."""
    return isinstance(exc, RuntimeError) and str(exc).strip().startswith(_REFUSALS)


def _clean(message: Any) -> str:
    return _TRIGGERED.sub("", str(message)).strip()


def reason_from_warnings(caught: list, backend: Any = None) -> str:
    """torch's reasons from recorded warnings: the section of ``backend`` when it has one, else all."""
    texts = [_clean(w.message) for w in caught if issubclass(w.category, UserWarning)]
    texts = [t for t in texts if t]
    name = getattr(backend, "name", None)
    header = _HEADERS.get(name or "")
    if header and header in texts:
        section = []
        for t in texts[texts.index(header) + 1:]:
            if t in _HEADERS.values():
                break
            section.append(t)
        if section:
            return f"{header} {' '.join(section)}"
    return " ".join(texts)


def _cuda_query(backend: Any, q: Any, k: Any, v: Any, causal: bool) -> str | None:
    """Ask a real CUDA device through ``torch.backends.cuda.can_use_*`` (debug=True), under ``sdpa_kernel``."""
    fn = {"FLASH_ATTENTION": "can_use_flash_attention", "EFFICIENT_ATTENTION": "can_use_efficient_attention",
          "CUDNN_ATTENTION": "can_use_cudnn_attention"}.get(backend.name)
    can_use = getattr(torch.backends.cuda, fn, None) if fn else None
    if can_use is None:  # math, or a torch without this query: the call itself will tell
        return None
    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, False)
    except TypeError:  # torch before enable_gqa
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal)
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
        warnings.simplefilter("always")
        ok = bool(can_use(params, True))
    if ok:
        return None
    why = reason_from_warnings(caught) or f"torch.backends.cuda.{fn} returned False"
    return f"{_HEADERS[backend.name]} {why}"


def refusal(backend: Any, q: Any, k: Any, v: Any, is_causal: bool = False, device_type: str | None = None) -> str | None:
    """Why ``backend`` has no kernel for these inputs on the device under test, or None when it may have one.

    ``device_type`` is the type the device under test behaves as (``Target.device_type``). Tensors
    on a CUDA device are asked through ``torch.backends.cuda.can_use_*``; tensors on another
    device standing in for CUDA (``--emulate cuda``, or code inside an active emulation mode) get
    the emulated answer (the dtype rule of sm80+); anything else returns None and the call itself
    decides (recognise its refusal with :func:`is_refusal`).
    """
    name = getattr(backend, "name", str(backend))
    if name == "MATH":
        return None
    actual = q.device.type
    if actual == "cuda":
        return _cuda_query(backend, q, k, v, is_causal)
    profile = active_profile() or (device_type if device_type and device_type != actual else None)
    if profile == "cuda":
        why = dtype_message(name, q, k, v)
        return f"{_HEADERS.get(name, name)} {why} (emulated cuda)" if why else None
    return None


def _flash_cpu(func: Any, args: tuple, kwargs: dict) -> Any:
    """The CPU flash kernel called with inputs CUDA's flash kernel refuses.

    CUDA would fall back to another enabled backend that accepts them (memory-efficient attention
    takes fp32; math takes anything) and the host's kernel stands in for it; with none enabled it
    warns as ``select_sdp_backend`` does and raises its RuntimeError.
    """
    q, k, v = args[0], args[1], args[2]
    if dtype_message("FLASH_ATTENTION", q, k, v) is None:
        return PASS
    eff_ok = torch.backends.cuda.mem_efficient_sdp_enabled() and dtype_message("EFFICIENT_ATTENTION", q, k, v) is None
    if eff_ok or torch.backends.cuda.math_sdp_enabled():
        return PASS
    eff = ("Memory Efficient attention has been runtime disabled."
           if not torch.backends.cuda.mem_efficient_sdp_enabled() else dtype_message("EFFICIENT_ATTENTION", q, k, v))
    cudnn = ("cuDNN attention has been runtime disabled." if not torch.backends.cuda.cudnn_sdp_enabled()
             else dtype_message("CUDNN_ATTENTION", q, k, v))
    for header, why in ((_HEADERS["EFFICIENT_ATTENTION"], eff),
                        (_HEADERS["FLASH_ATTENTION"], dtype_message("FLASH_ATTENTION", q, k, v)),
                        (_HEADERS["CUDNN_ATTENTION"], cudnn)):
        warnings.warn(header, UserWarning, stacklevel=2)
        warnings.warn(str(why), UserWarning, stacklevel=2)
    raise RuntimeError(NO_KERNEL)


DIFFERENCES = [
    Difference(
        name="sdpa_flash_no_fp32",
        summary="SDPA's flash kernel refuses fp32/fp64 inputs (falls back to an enabled memory-efficient or math "
                "backend; with none enabled, UserWarnings then RuntimeError 'No available kernel. Aborting "
                "execution.')",
        documented="ATen transformers/cuda/sdp_utils.cpp: can_use_flash_attention -> check_dtypes_low_precision "
                   "({Half, BFloat16} on sm80+), select_sdp_backend's debug re-run and TORCH_CHECK; PyTorch test "
                   "test_transformers.py::test_flash_fail_fp32; observed on an H100 (evidence h100-2026-11-25)",
        ops=frozenset({"_scaled_dot_product_flash_attention_for_cpu"}),
        run=_flash_cpu,
    ),
]
