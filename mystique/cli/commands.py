"""Registers every command module on the group."""

from . import cmd_capture, cmd_info  # noqa: F401
