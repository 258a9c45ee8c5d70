"""Where a multi-rank trace comes from: one source per rank, and whether we run under torchrun.

A multi-rank trace is a folder of ``rank-K/`` trace dirs, or a folder of per-rank ET files whose
names end in the rank number (PARAM's ``dlrm_eg_0.json`` ... ``dlrm_eg_7.json``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import MystiqueError, UsageError
from ..trace import load_trace
from .collectives import world_size_of

RANK_DIR = re.compile(r"^rank-(\d+)$")
RANK_FILE = re.compile(r"^(?P<stem>.*?)(?P<rank>\d+)\.json(\.gz)?$")


@dataclass
class RankSet:
    """The per-rank sources of a multi-rank trace: ``{rank: path}`` (trace dir, ET file or benchmark)."""

    sources: dict[int, Path]
    origin: Path
    recorded_world: int | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.sources)


def torchrun_env() -> tuple[int, int] | None:
    """``(rank, world_size)`` when launched by torchrun (``RANK``/``WORLD_SIZE`` set, world > 1)."""
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if r is None or w is None or not r.isdigit() or not w.isdigit():
        return None
    if int(w) <= 1:
        return None
    return int(r), int(w)


def find_rank_sources(path: str | os.PathLike) -> RankSet | None:
    """The per-rank sources under ``path``, or None when it is not a multi-rank trace.

    A folder of ``rank-K/`` subfolders, or a folder of ET files named ``<stem>K.json[.gz]`` with
    one common stem (PARAM's ``dlrm_eg_0.json`` ... ``dlrm_eg_7.json``). UsageError for a folder
    whose rank files repeat a rank.
    """
    p = Path(path)
    if not p.is_dir():
        return None
    dirs = {int(m.group(1)): d for d in p.iterdir() if d.is_dir() and (m := RANK_DIR.match(d.name))}
    if dirs:
        return RankSet(dict(sorted(dirs.items())), p)
    if (p / "trace.json").exists() or (p / "trace.json.gz").exists() or (p / "benchmark.json").exists():
        return None
    stems: dict[str, dict[int, Path]] = {}
    for f in p.iterdir():
        m = RANK_FILE.match(f.name)
        if f.is_file() and m and not f.name.startswith("._") and not f.name.startswith("kineto"):
            ranks = stems.setdefault(m.group("stem"), {})
            r = int(m.group("rank"))
            if r in ranks:
                raise UsageError(f"{p}: two files for rank {r}: {ranks[r].name} and {f.name}")
            ranks[r] = f
    if len(stems) != 1:
        return None
    (files,) = stems.values()
    if len(files) < 2:
        return None
    return RankSet(dict(sorted(files.items())), p)


def recorded_world(rs: RankSet) -> int | None:
    """The world size the lowest rank's trace recorded (None for a benchmark or when unknown)."""
    src = rs.sources[min(rs.sources)]
    if src.is_dir() and (src / "benchmark.json").exists():
        return None
    try:
        return world_size_of(load_trace(src))
    except MystiqueError:
        return None
