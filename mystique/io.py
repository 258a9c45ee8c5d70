"""Atomic, durable output: nothing half-written, nothing of the user's lost.

Every file is written under a temporary name in its destination folder, flushed to disk
(``fsync``) and renamed into place; the folder is then synced so that the rename survives a
power cut. Output folders are staged as a hidden sibling and their files moved in only when the
command finished writing them.

"Replace our files, keep yours": every output folder gets a manifest,
``OUT/.mystique-manifest.json``, listing each file we wrote (paths relative to ``OUT``). Writing
into an existing folder (``--force``) removes only the files of the previous manifest and
replaces only the files we are about to write; a folder is never removed wholesale, so a user's
``OUT/traces/my_notes.txt`` survives. The whole destination is checked before anything moves: a
file where a folder is needed (or the reverse) is refused with a :class:`UsageError` naming the
path, and nothing is moved.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath

from .errors import UsageError

MANIFEST_NAME = ".mystique-manifest.json"
MANIFEST_FORMAT = "mystique-manifest"


def show(p: object) -> str:
    """A path for a one-line message: line breaks and control characters in a name are escaped."""
    s = str(p)
    return s if s.isprintable() else ascii(s)[1:-1]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_path(path: str | os.PathLike, flags: int) -> None:
    """fsync what ``path`` names (opened with ``flags``); a no-op where it cannot be opened or synced."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (the renames into it) to disk; a no-op where folders cannot be synced."""
    _fsync_path(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync_file(path: str | os.PathLike) -> None:
    _fsync_path(path, os.O_RDONLY)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably.

    The bytes go to a temporary file in the same folder, which is synced to disk before it is
    renamed over ``path``; the folder is synced after the rename. A reader sees the old file or
    the new one, never a mix, and after a crash the file is whole.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise UsageError(f"cannot write to {show(parent)}: {show(exc.strerror or exc)}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[object] | Mapping[str, object]]) -> str:
    """CSV text (``\\n`` line ends) with header ``columns``: the one writer of every table the suite
    writes besides results.csv (:func:`mystique.results.to_csv_text`). A row is a sequence in
    column order or a mapping (keys outside ``columns`` ignored, missing ones empty)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([row.get(c, "") for c in columns] if isinstance(row, Mapping) else row)
    return buf.getvalue()


def write_csv(path: str | os.PathLike, columns: Sequence[str],
              rows: Iterable[Sequence[object] | Mapping[str, object]]) -> Path:
    """:func:`csv_text` written atomically to ``path``."""
    return atomic_write_text(path, csv_text(columns, rows))


def check_output_dir(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Refuse, before any work starts, an output folder that cannot be written or would lose data.

    An existing non-empty folder is accepted only with ``force`` (the files of our previous run,
    listed in its manifest, and those we write are then replaced; others are kept).
    """
    out = Path(out_dir)
    if out.is_symlink() and not out.exists():
        raise UsageError(f"output path {show(out)} is a broken symbolic link")
    if out.exists() and not out.is_dir():
        raise UsageError(f"output path {show(out)} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"output folder {show(out)} exists and is not empty; pass --force to replace its files")
    probe = out if out.is_dir() else (out.parent if str(out.parent) else Path("."))
    while not probe.exists():
        if probe.is_symlink():  # a dangling link: mkdir would fail on it
            raise UsageError(f"cannot write to {show(out)}: {show(probe)} is a broken symbolic link")
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"cannot write to {show(out)}: {show(probe)} is a file, not a folder")
    try:  # the only reliable test of writability is writing
        tempfile.TemporaryDirectory(prefix=".mystique-probe.", dir=probe).cleanup()
    except OSError as exc:
        raise UsageError(f"cannot write to {show(out)}: {show(exc.strerror or exc)}") from exc
    return out


# ----------------------------------------------------------------------------------- manifest


def read_manifest(out_dir: str | os.PathLike) -> set[str]:
    """The relative paths the manifest of ``out_dir`` lists (empty when there is none or it is unreadable).

    Entries that are not plain relative paths inside the folder (absolute, ``..``, empty) are
    ignored: the manifest is a file in the user's folder, not a licence to delete elsewhere.
    """
    p = Path(out_dir) / MANIFEST_NAME
    try:
        if not p.is_file() or p.is_symlink():
            return set()
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return set()
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        return set()
    return {f for f in (_clean_rel(x) for x in files) if f is not None}


def _clean_rel(x: object) -> str | None:
    if not isinstance(x, str) or not x or "\x00" in x or "\\" in x:
        return None
    p = PurePosixPath(x)
    if p.is_absolute() or any(part in ("", ".", "..") for part in x.split("/")):
        return None
    if p.name == MANIFEST_NAME and len(p.parts) == 1:
        return None
    return p.as_posix()


def _manifest_bytes(files: Iterable[str]) -> bytes:
    doc = {"format": MANIFEST_FORMAT, "version": 1,
           "note": "files Mystique Suite wrote here; --force replaces these and keeps every other file",
           "files": sorted(set(files))}
    return (json.dumps(doc, indent=1) + "\n").encode("utf-8")


def write_manifest(out_dir: str | os.PathLike, files: Iterable[str]) -> Path:
    return atomic_write_bytes(Path(out_dir) / MANIFEST_NAME, _manifest_bytes(files))


# ----------------------------------------------------------------------------------- staging


@contextlib.contextmanager
def staged_output_dir(out_dir: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a staging folder; on success move its files into ``out_dir``, on failure drop it.

    The staging folder is a hidden sibling of ``out_dir`` so the final moves are renames on one
    file system. Moving in follows the manifest rule of this module: only our files are removed
    or replaced. When the destination cannot take the results (a file where a folder is needed,
    a folder where a file goes, a file that appeared meanwhile without ``force``), nothing is
    moved, the staging folder is kept and a :class:`UsageError` names both.
    """
    out = check_output_dir(out_dir, force)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".staging", dir=parent))
        os.chmod(stage, 0o777 & ~_umask())
    except OSError as exc:
        raise UsageError(f"cannot write to {show(out)}: {show(exc.strerror or exc)}") from exc
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    install_stage(stage, out, force)


def _walk_stage(stage: Path) -> tuple[list[str], list[str]]:
    """Relative file paths (files and links) and folder paths in ``stage``, parents first."""
    files: list[str] = []
    dirs: list[str] = []
    for root, dirnames, filenames in os.walk(stage):
        rel_root = Path(root).relative_to(stage)
        for d in list(dirnames):
            full = Path(root) / d
            if full.is_symlink():  # os.walk does not descend into links: a link is a file of ours
                dirnames.remove(d)
                filenames.append(d)
            else:
                dirs.append((rel_root / d).as_posix())
        for f in filenames:
            rel = (rel_root / f).as_posix()
            if rel == MANIFEST_NAME:
                continue
            files.append(rel)
    dirs.sort(key=lambda s: (s.count("/"), s))
    files.sort()
    return files, dirs


def _lstat(p: Path) -> os.stat_result | None:
    try:
        return os.lstat(p)
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a parent is a file: reported at that parent
        return None


def _under_real_folders(out: Path, rel: str) -> bool:
    """True when every folder between ``out`` and ``out/rel`` is a real folder (no symbolic link)."""
    cur = out
    for part in PurePosixPath(rel).parts[:-1]:
        cur = cur / part
        st = _lstat(cur)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return False
    return True


def _contents_all_ours(folder: Path, out: Path, ours: set[str]) -> bool:
    """Whether every file below ``folder`` is one of ``ours`` (paths relative to ``out``)."""
    for root, dirnames, filenames in os.walk(folder):
        for name in filenames + [d for d in dirnames if (Path(root) / d).is_symlink()]:
            rel = (Path(root) / name).relative_to(out).as_posix()
            if rel not in ours:
                return False
    return True


def _plan_install(stage: Path, out: Path, force: bool) -> tuple[list[str], list[str], list[str]]:
    """Check the destination against the staged results; return (files, dirs, our old files to remove).

    Raises :class:`UsageError` naming the first path that is in the way. Nothing is changed.
    """
    files, dirs = _walk_stage(stage)
    old = read_manifest(out) if force else set()
    remove: list[str] = []
    for rel in sorted(old):
        st = _lstat(out / rel)
        if st is not None and not stat.S_ISDIR(st.st_mode) and _under_real_folders(out, rel):
            remove.append(rel)
    removable = set(remove)
    for rel in dirs:
        dest = out / rel
        st = _lstat(dest)
        if st is None or stat.S_ISDIR(st.st_mode) or rel in removable:
            continue
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file"
        raise UsageError(f"{show(dest)} is {what} where the results need a folder; move it away or choose "
                         "another output folder")
    for rel in files:
        dest = out / rel
        st = _lstat(dest)
        if st is None or rel in removable:
            continue
        if stat.S_ISDIR(st.st_mode):
            if _contents_all_ours(dest, out, removable):
                continue
            raise UsageError(f"{show(dest)} is a folder where the results write a file; move it away or choose "
                             "another output folder")
        if not force:
            raise UsageError(f"{show(dest)} appeared while the command ran; pass --force to replace it")
    return files, dirs, remove


def _remove_empty_folders(folder: Path) -> None:
    """Remove ``folder`` when it holds nothing but empty folders (OSError otherwise: never a file)."""
    for root, dirnames, _ in os.walk(folder, topdown=False):
        for d in dirnames:
            with contextlib.suppress(OSError):
                (Path(root) / d).rmdir()
    folder.rmdir()


def install_stage(stage: Path, out: Path, force: bool = False) -> None:
    """Move the finished ``stage`` into ``out`` (see :func:`staged_output_dir`); remove ``stage``."""
    stage, out = Path(stage), Path(out)
    if _lstat(out) is None:
        files, dirs = _walk_stage(stage)
        try:
            for rel in files:
                _fsync_file(stage / rel)
            for rel in dirs:
                fsync_dir(stage / rel)
            write_manifest(stage, files)  # syncs the stage folder itself
            os.replace(stage, out)
        except OSError as exc:
            shutil.rmtree(stage, ignore_errors=True)
            raise UsageError(f"cannot write {show(out)}: {show(exc.strerror or exc)}") from exc
        fsync_dir(out.parent if str(out.parent) else Path("."))
        return
    try:
        files, dirs, remove = _plan_install(stage, out, force)
    except UsageError as exc:
        raise UsageError(f"{exc} (nothing was moved; the results are kept in {show(stage)})") from None
    moved: set[Path] = {out}
    try:
        # the manifest first lists both runs' files, so that an interrupted move leaves them all known as ours
        write_manifest(out, set(files) | set(remove))
        for rel in remove:
            os.unlink(out / rel)
            moved.add((out / rel).parent)
        for rel in sorted(remove, key=lambda s: -s.count("/")):  # folders our removed files leave empty
            folder = (out / rel).parent
            while folder != out and out in folder.parents:
                try:
                    folder.rmdir()
                except OSError:
                    break
                folder = folder.parent
        for rel in dirs:
            dest = out / rel
            if _lstat(dest) is None:
                dest.mkdir()
                moved.add(dest.parent)
        for rel in files:
            src, dest = stage / rel, out / rel
            _fsync_file(src)
            st = _lstat(dest)
            if st is not None and stat.S_ISDIR(st.st_mode):  # a folder that held only our old files
                _remove_empty_folders(dest)
            os.replace(src, dest)
            moved.add(dest.parent)
        write_manifest(out, files)
    except OSError as exc:
        raise UsageError(f"cannot move the results into {show(out)}: {show(exc.strerror or exc)} "
                         f"({show(getattr(exc, 'filename', '') or '')}); what was not moved is in {show(stage)}") from exc
    for folder in moved:
        fsync_dir(folder)
    shutil.rmtree(stage, ignore_errors=True)
