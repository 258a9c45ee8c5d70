"""Reading trace documents from disk: finding the file a path names, the size cap, gzip and JSON.

Shared by the execution-trace loader (:mod:`.loader`) and the Kineto reader (:mod:`.kineto`).
Every problem is a :class:`UsageError` naming the file.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import re
import shutil
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..io import show as show_path

TRACE_FILE_NAMES = ("trace.json", "trace.json.gz")
#: Largest trace (decompressed) read by default: 2 GiB. The JSON document takes several times its
#: size in memory, and a gzip file of a few MB can expand to any size (a decompression bomb), so the
#: size is checked while decompressing. ``MYSTIQUE_MAX_TRACE_BYTES`` raises (or lowers) it.
DEFAULT_MAX_TRACE_BYTES = 2 * 1024**3
MAX_TRACE_BYTES_ENV = "MYSTIQUE_MAX_TRACE_BYTES"


def in_folder(path: str | os.PathLike, names: Sequence[str]) -> Path:
    """``path`` itself, or, when it is a folder, the first of ``names`` that is a file in it
    (:class:`UsageError` when none is)."""
    p = Path(path)
    if not p.is_dir():
        return p
    for name in names:
        if (p / name).is_file():
            return p / name
    raise UsageError(f"{show_path(p)}: folder holds no {' or '.join(names)}")


def beside(trace_path: str | os.PathLike, names: Sequence[str]) -> Path | None:
    """The first of ``names`` that is a file in the folder of ``trace_path`` (the path itself when it
    is a folder), or None: the files a capture writes next to its trace."""
    p = Path(trace_path)
    folder = p if p.is_dir() else p.parent
    return next((folder / n for n in names if (folder / n).is_file()), None)


def resolve_trace_path(path: str | os.PathLike) -> Path:
    """Return the ET file that ``path`` names: the file itself, or ``trace.json[.gz]`` in a folder.

    Raises :class:`UsageError` when nothing is there or ``path`` is a tar archive.
    """
    p = in_folder(path, TRACE_FILE_NAMES)
    if not p.exists():
        raise UsageError(f"{show_path(p)}: no such file or folder")
    if not p.is_file():
        raise UsageError(f"{show_path(p)}: not a regular file")
    low = p.name.lower()
    if low.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
        raise UsageError(f"{show_path(p)}: is a tar archive; extract it first (tar xzf {show_path(p.name)}) and pass the .json inside")
    return p


def max_trace_bytes() -> int:
    """The size cap of a trace, decompressed (``MYSTIQUE_MAX_TRACE_BYTES``, default 2 GiB).

    The variable takes a number of bytes with an optional K, M, G or T suffix (powers of 1024).
    """
    raw = os.environ.get(MAX_TRACE_BYTES_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_TRACE_BYTES
    m = re.fullmatch(r"\s*(\d{1,20})\s*([kmgt]?)i?b?\s*", raw.lower())
    if not m or int(m.group(1)) <= 0:
        raise UsageError(f"{MAX_TRACE_BYTES_ENV}={raw!r} is not a positive size (bytes, or e.g. 4G)")
    return int(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")


def _too_big(path: Path, what: str, cap: int, compressed: bool) -> UsageError:
    how = "decompresses to more than" if compressed else "is larger than"
    return UsageError(f"{show_path(path)}: the {what} {how} the limit of {_size(cap)}; set {MAX_TRACE_BYTES_ENV} "
                      "to raise it")


def _size(n: int) -> str:
    for unit, k in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= k:
            return f"{n / k:.4g} {unit}"
    return f"{n} bytes"


def _gunzip(path: Path, data: bytes, what: str, cap: int) -> bytes:
    """Decompress every gzip member of ``data``, refusing more than ``cap`` bytes of output."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        if data[pos:pos + 2] != b"\x1f\x8b":
            if pos and not data[pos:].strip(b"\x00"):  # zero padding after the last member
                break
            raise UsageError(f"{show_path(path)}: truncated or corrupt gzip data (garbage after the compressed data)")
        d = zlib.decompressobj(wbits=31)
        chunk: bytes | memoryview = memoryview(data)[pos:]
        while not d.eof:
            piece = d.decompress(chunk, cap + 1 - len(out))
            out += piece
            if len(out) > cap:
                raise _too_big(path, what, cap, compressed=True)
            rest = d.unconsumed_tail
            if not piece and len(rest) == len(chunk):  # no progress: the input is exhausted
                break
            chunk = rest
        if not d.eof:
            raise UsageError(f"{show_path(path)}: truncated or corrupt gzip data (the compressed stream ends early)")
        pos = len(data) - len(d.unused_data)
    return bytes(out)


def read_json_document(path: Path, what: str = "trace", max_bytes: int | None = None) -> Any:
    """Read a ``.json`` or gzip-compressed JSON file (detected by content, not by name).

    Raises :class:`UsageError` for unreadable files, truncated/corrupt gzip, tar archives, files
    larger (once decompressed) than ``max_bytes`` (default :func:`max_trace_bytes`), invalid
    JSON and JSON nested too deeply to decode, naming the file and the position of the problem.
    """
    cap = max_trace_bytes() if max_bytes is None else max_bytes
    try:
        if path.stat().st_size > cap:
            raise _too_big(path, what, cap, compressed=False)
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{show_path(path)}: cannot read {what}: {exc.strerror or exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = _gunzip(path, raw, what, cap)
        except (EOFError, zlib.error) as exc:
            raise UsageError(f"{show_path(path)}: truncated or corrupt gzip data ({exc})") from exc
    if len(raw) > 262 and raw[257:262] == b"ustar":
        raise UsageError(f"{show_path(path)}: is a tar archive; extract it first and pass the .json inside")
    if not raw.strip():
        raise UsageError(f"{show_path(path)}: empty file, expected a JSON {what}")
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{show_path(path)}: not a JSON {what} (not UTF-8 text: {exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{show_path(path)}: not a valid JSON {what}: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError:
        raise UsageError(f"{show_path(path)}: not a usable JSON {what}: nested too deeply to decode") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UsageError(f"{show_path(path)}: not a usable JSON {what}: {str(exc).splitlines()[0]}") from None


def is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: building ~10^5 objects otherwise triggers collections
    that rescan the whole decoded JSON (halves the load time of a 27k-node trace)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: zlib level of the traces capture writes. torch's own ``export_chrome_trace`` to a ``.gz`` path
#: gzips line by line at level 9: 0.89 s for a 6.6 MB light profile (llama debug train) against 0.09 s
#: in 1 MiB blocks at level 6, for a file 11% larger (this 2-core host); every capture writes two.
GZIP_LEVEL = 6


def gzip_file(src: Path, dst: Path) -> None:
    """Compress ``src`` into ``dst`` (gzip at :data:`GZIP_LEVEL`, 1 MiB blocks), then remove ``src``."""
    with open(src, "rb") as fin, gzip.open(dst, "wb", compresslevel=GZIP_LEVEL) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    src.unlink()


def export_chrome_trace(prof: Any, path: Path) -> None:
    """``prof.export_chrome_trace`` (a ``torch.profiler`` profile) to ``path``; a ``.gz`` path is
    exported uncompressed beside it, then compressed by :func:`gzip_file`."""
    if path.suffix != ".gz":
        prof.export_chrome_trace(str(path))
        return
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    gzip_file(raw, path)
