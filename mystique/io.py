"""Atomic output: nothing half-written, nothing the user had overwritten unless asked.

Every file is written under a temporary name in its destination folder and renamed into place.
Output folders are staged as a hidden sibling and their files moved in only when the command
finished writing them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def check_output_dir(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Refuse, before any work starts, an output folder that cannot be written or would lose data.

    An existing non-empty folder is accepted only with ``force`` (its files named like ours are
    then replaced; others are kept).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"output path {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"output folder {out} exists and is not empty; pass --force to replace its files")
    probe = out if out.is_dir() else (out.parent if str(out.parent) else Path("."))
    while not probe.exists():
        probe = probe.parent
    try:  # the only reliable test of writability is writing
        tempfile.TemporaryDirectory(prefix=".mystique-probe.", dir=probe).cleanup()
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror or exc}") from exc
    return out


@contextlib.contextmanager
def staged_output_dir(out_dir: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a staging folder; on success move its files into ``out_dir``, on failure drop it.

    The staging folder is a hidden sibling of ``out_dir`` so the final moves are renames on one
    file system.
    """
    out = check_output_dir(out_dir, force)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".staging", dir=parent))
        os.chmod(stage, 0o777 & ~_umask())
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror or exc}") from exc
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    try:
        if not out.exists():
            os.replace(stage, out)
            return
        for item in sorted(stage.iterdir()):
            dest = out / item.name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(item, dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
