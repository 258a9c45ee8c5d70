"""`mystique qualify`: hardware qualification as one in-process pytest session.

:func:`qualify` validates the device and the injected mode first (exit 2 or 3 before anything
runs), then runs ``pytest.main`` with the plugin enabled (:mod:`mystique.validators.pytest_plugin`)
into a staging folder, which becomes ``OUT_DIR`` holding ``results.csv``, ``report.html`` (when the
reports package renders it) and ``junit.xml``.

Levels follow ``dcgmi diag -r``: ``quick`` is meant for every boot (minutes), ``full`` for
acceptance (every group at published sizes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mystique import results
from mystique.errors import EnvironmentUnsupported, MystiqueError, UsageError
from mystique.io import check_output_dir, staged_output_dir
from mystique.targets import make_target

# pytest's exit codes (pytest.ExitCode), named here so the mapping below reads plainly.
_PYTEST_OK, _PYTEST_FAILED, _PYTEST_INTERRUPTED, _PYTEST_INTERNAL, _PYTEST_USAGE, _PYTEST_NO_TESTS = range(6)


def pytest_args(stage: Path, *, device: str, inject: str | None, level: str, seed: int,
                emulate: str | None = None,
                validators: Sequence[str] | None = None, keyword: str | None = None,
                quiet: bool = False, shown_as: str | os.PathLike | None = None) -> list[str]:
    """The command line of the inner pytest session, isolated from the caller's project.

    The (empty) staging folder is the only path argument and the current folder the rootdir, so
    node ids read ``mystique::numerics::<group>``; ``-c os.devnull`` and ``--noconftest`` keep the
    current folder's pytest configuration and conftests out; the cache provider is off so nothing
    is written outside ``stage``; pytest's unraisable-exception plugin is off (at the end of each
    session it runs the garbage collector five times over the whole heap, about 0.3 s a session
    with the validators' tensors loaded, once per run of a self-test, for warnings nobody reads).
    """
    args = [
        str(stage), "--rootdir", os.getcwd(), "-c", os.devnull, "--noconftest", "-p", "no:cacheprovider",
        "-p", "no:unraisableexception",
        "-rfEs", "--mystique-device", device, "--mystique-level", level, "--mystique-seed", str(seed),
        "--mystique-report-dir", str(stage), "--junitxml", str(stage / "junit.xml"),
    ]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args += ["-p", "mystique.validators.pytest_plugin"]
    if inject:
        args += ["--mystique-inject", inject]
    if emulate:
        args += ["--mystique-emulate", emulate]
    if validators:
        args += ["--mystique-validators", ",".join(validators)]
    if keyword:
        args += ["-k", keyword]
    if quiet:
        args += ["-q"]
    if shown_as is not None:  # the staging folder becomes OUT_DIR: name that in pytest's summary
        args += ["--mystique-report-shown-as", str(shown_as)]
    return args


@dataclass(frozen=True)
class Outcome:
    """What a qualification run ended with: its exit code, row counts and the files written."""

    exit_code: int
    counts: results.Counts
    files: tuple[str, ...]

    @property
    def checks(self) -> int:
        return self.counts.checks

    @property
    def failed(self) -> int:
        return self.counts.failed


def qualify(output: str | os.PathLike, *, device: str = "cpu", inject: str | None = None,
            emulate: str | None = None, level: str = "quick",
            seed: int = 0, force: bool = False, validators: Sequence[str] | None = None,
            keyword: str | None = None, quiet: bool = False) -> Outcome:
    """Qualify ``device`` (with ``inject`` active on it); write ``output``; return the :class:`Outcome`.

    Its exit code is 0 when every check passed, 1 when any failed or errored, 4 (undecided) when the
    only bad rows are inconclusive (``output`` then holds the evidence).
    Raises UsageError (exit 2) for a bad device, inject spec, output folder or pytest argument,
    EnvironmentUnsupported (exit 3) when the device is absent or no check could run, and
    MystiqueError (exit 1) when the session was interrupted or pytest failed internally.
    """
    import pytest

    if level not in ("quick", "full"):
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    check_output_dir(output, force)
    make_target(device, inject, emulate)  # bad input and absent devices are reported before anything runs
    with staged_output_dir(output, force) as stage:
        rc = int(pytest.main(pytest_args(stage, device=device, inject=inject, emulate=emulate, level=level, seed=seed,
                                         validators=validators, keyword=keyword, quiet=quiet,
                                         shown_as=output)))
        csv = stage / "results.csv"
        df = results.read_csv(csv) if csv.exists() else results.to_frame([])
        if rc == _PYTEST_USAGE:
            raise UsageError("pytest rejected the qualification arguments (see its message above)")
        if rc == _PYTEST_NO_TESTS:
            raise UsageError(f"no qualification check matches -k {keyword!r}" if keyword
                             else "no qualification check was collected")
        if rc == _PYTEST_INTERRUPTED:
            raise MystiqueError("qualification interrupted (collection error or Ctrl-C); see the output above")
        if rc == _PYTEST_INTERNAL:
            raise MystiqueError("pytest failed internally during qualification; see the output above")
        if rc == _PYTEST_OK and not len(df) and not keyword:
            raise EnvironmentUnsupported(
                "no qualification check could run here: every validator is unavailable or skipped"
            )
    code = results.exit_code(df)
    if rc == _PYTEST_FAILED and code not in (results.FAILED, results.UNDECIDED):
        code = results.FAILED  # an item failed without a bad row (no rows, a broken validator)
    files = tuple(p for p in ("results.csv", "report.html", "junit.xml") if (Path(output) / p).exists())
    return Outcome(code, results.counts(df), files)
