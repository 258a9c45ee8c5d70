"""Errors that map onto the exit codes of docs/design.md.

0: every check passed. 1: checks failed. 2: bad usage or bad input. 3: the environment cannot
do it (device absent, optional package missing, not enough memory).
"""

from __future__ import annotations


class MystiqueError(Exception):
    """Base of the errors the CLI turns into one line on stderr and an exit code."""

    exit_code = 1


class UsageError(MystiqueError):
    """Bad usage or bad input: unknown names, malformed files, unwritable paths (exit 2)."""

    exit_code = 2


class EnvironmentUnsupported(MystiqueError):
    """The environment cannot do it: device absent, package missing, too little memory (exit 3)."""

    exit_code = 3
