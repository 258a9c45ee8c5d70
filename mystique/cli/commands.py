"""Registers every command module on the group (each module imports only click at load time)."""

import importlib

_MODULES = (
    "cmd_info",
    "cmd_capture",
    "cmd_replay",
    "cmd_validate",
    "cmd_onnx",
    "cmd_validate_numerics",
    "cmd_validate_soft_errors",
    "cmd_validate_correctness",
    "cmd_qualify",
    "cmd_selftest",
    "cmd_report",
    "cmd_demo",
    "cmd_overhead",
)

for _name in _MODULES:
    try:
        importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as _exc:  # a part not built yet
        if _exc.name != f"{__package__}.{_name}":
            raise
