"""Which exceptions say "this device has no kernel for that", as opposed to "something broke".

A check skips an operator or dtype the device under test does not implement; every other
exception of the device is an ``error`` row. The line between them is drawn on torch's own
messages, matched exactly, never on loose words ("not supported", "no kernel image"), so that a
broken install (a CUDA build without kernels for this GPU: "no kernel image is available for
execution on the device"), a driver failure or a kernel that raises reads as an error, not as a
device that merely lacks an operator:

* ``"<kernel>" not implemented for '<dtype>'``: ATen's dtype dispatch (``AT_DISPATCH_*``, raised as
  ``NotImplementedError`` through ``TORCH_CHECK_NOT_IMPLEMENTED``, a ``RuntimeError`` in older
  torch): the operator exists on this device, not for this dtype;
* ``Could not run '<op>' with arguments from the '<backend>' backend``: the dispatcher's
  ``NotImplementedError`` for an operator with no kernel registered for the device's backend.
"""

from __future__ import annotations

import re

_DTYPE = re.compile(r"^\"[\w.:]+\" not implemented for '[\w:]+'$")
_BACKEND = re.compile(r"^Could not run '[\w.:]+' with arguments from the '\w+' backend\b")


def unsupported(exc: BaseException) -> str | None:
    """torch's words when ``exc`` says the device has no kernel for this dtype or backend (a skip), else None."""
    if not isinstance(exc, RuntimeError):  # NotImplementedError is a RuntimeError
        return None
    lines = str(exc).strip().splitlines()
    first = lines[0].strip() if lines else ""
    m = _DTYPE.match(first) or (_BACKEND.match(first) if isinstance(exc, NotImplementedError) else None)
    return m.group(0) if m else None
