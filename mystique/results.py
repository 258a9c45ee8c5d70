"""The results schema of docs/design.md: the one place that builds, validates, reads and writes it.

Every suite records its checks through :class:`Results`; every CSV is written by
:func:`write_csv` (atomically) and read back by :func:`read_csv`. This module never imports
torch, so reports can use it.

Columns, in order: ``run_id, started_at, host, device, device_name, torch_version, suite, check,
subject, dtype, metric, value, unit, threshold, low, high, status, detail``. ``low`` and ``high``
are the 95% interval of ``value`` where it has one (empty otherwise); a verdict reads them, never
the sentence in ``detail``. Files written before they existed load with both empty.
"""

from __future__ import annotations

import io
import math
import os
import re
import socket
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import UsageError
from .io import atomic_write_text

COLUMNS: tuple[str, ...] = (
    "run_id",
    "started_at",
    "host",
    "device",
    "device_name",
    "torch_version",
    "suite",
    "check",
    "subject",
    "dtype",
    "metric",
    "value",
    "unit",
    "threshold",
    "low",
    "high",
    "status",
    "detail",
)
SUITES: tuple[str, ...] = (
    "capture", "replay", "numerics", "soft_errors", "correctness", "onnx", "distributed", "performance", "selftest",
    "predict",
)
# Columns added after the first release: a file that lacks them loads with them empty.
OPTIONAL_COLUMNS: tuple[str, ...] = ("low", "high")
NUMERIC_COLUMNS: tuple[str, ...] = ("value", "threshold", "low", "high")
# Checks end pass, fail, inconclusive (a timing interval straddling its band), skip or error; a
# measurement (a PVF, a trial count, a time, a bandwidth) is `info`: shown, never counted as a check.
STATUSES: tuple[str, ...] = ("pass", "fail", "inconclusive", "skip", "error", "info")
CHECK_STATUSES: tuple[str, ...] = ("pass", "fail", "inconclusive", "skip", "error")
BAD_STATUSES: tuple[str, ...] = ("fail", "inconclusive", "error")
_SNAKE = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*$")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class RunContext:
    """What is the same for every row of one command run."""

    device: str
    device_name: str = ""
    torch_version: str = ""
    run_id: str = field(default_factory=new_run_id)
    started_at: str = field(default_factory=utc_now)
    host: str = field(default_factory=socket.gethostname)

    @classmethod
    def for_target(cls, target: Any, run_id: str | None = None) -> RunContext:
        """Context for a :class:`mystique.targets.Target` (imports torch through the target)."""
        import torch

        info = target.info()
        kwargs = {"run_id": run_id} if run_id else {}
        return cls(device=target.label, device_name=info.name, torch_version=torch.__version__, **kwargs)


def _clean_number(value: Any) -> float:
    if value is None or value == "":
        return math.nan
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"value {value!r} is not a number") from exc


class Results:
    """Rows of one suite in one run. ``add`` validates each row as it is recorded."""

    def __init__(self, ctx: RunContext, suite: str):
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; expected one of {', '.join(SUITES)}")
        self.ctx = ctx
        self.suite = suite
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        check: str,
        subject: str,
        metric: str,
        value: Any,
        *,
        status: str,
        unit: str = "",
        threshold: Any = None,
        dtype: str = "",
        detail: str = "",
        low: Any = None,
        high: Any = None,
    ) -> dict[str, Any]:
        if not _SNAKE.match(check):
            raise ValueError(f"check {check!r} is not snake_case")
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
        row = asdict(self.ctx)
        row.update(
            suite=self.suite,
            check=check,
            subject=str(subject),
            dtype=str(dtype or "").replace("torch.", ""),
            metric=str(metric),
            value=_clean_number(value),
            unit=str(unit or ""),
            threshold=_clean_number(threshold),
            low=_clean_number(low),
            high=_clean_number(high),
            status=status,
            detail=" ".join(str(detail or "").split()),
        )
        self.rows.append(row)
        return row

    def frame(self) -> pd.DataFrame:
        return to_frame(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    return validate(df)


def concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f.columns)]
    if not frames:
        return to_frame([])
    return validate(pd.concat(frames, ignore_index=True))


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check columns, order, statuses and numeric fields; return a normalised copy.

    Raises ``ValueError`` naming the first problem.
    """
    absent = [c for c in OPTIONAL_COLUMNS if c not in df.columns]
    if absent:
        df = df.assign(**{c: math.nan for c in absent})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"results table lacks column(s): {', '.join(missing)}")
    extra = [c for c in df.columns if c not in COLUMNS]
    if extra:
        raise ValueError(f"results table has unknown column(s): {', '.join(map(str, extra))}")
    out = df.loc[:, list(COLUMNS)].copy()
    for col in COLUMNS:
        if col in NUMERIC_COLUMNS:
            try:
                out[col] = pd.to_numeric(out[col].replace("", math.nan), errors="raise").astype(float)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"column {col} holds a non-number: {exc}") from exc
        else:
            # one line per field: a bare carriage return inside a quoted field breaks CSV readers
            out[col] = out[col].fillna("").astype(str).str.replace(r"[\r\n]+", " ", regex=True)
    bad = ~out["status"].isin(STATUSES)
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise ValueError(f"row {i + 1}: status {out['status'].iloc[i]!r} is not one of {', '.join(STATUSES)}")
    bad = ~out["suite"].isin(SUITES)
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise ValueError(f"row {i + 1}: suite {out['suite'].iloc[i]!r} is not one of {', '.join(SUITES)}")
    return out


def to_csv_text(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    validate(df).to_csv(buf, index=False, float_format="%.9g")
    return buf.getvalue()


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Validate and write a results table atomically."""
    return atomic_write_text(path, to_csv_text(df))


def read_csv(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> pd.DataFrame:
    """Read one or more results.csv files into one validated table (UsageError on bad input)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    frames = []
    for p in paths:
        try:
            df = pd.read_csv(p, dtype=str, keep_default_na=False)
        except FileNotFoundError as exc:
            raise UsageError(f"results file {p} does not exist") from exc
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise UsageError(f"{p} is not a results CSV: {str(exc).splitlines()[0] if str(exc) else exc}") from exc
        try:
            frames.append(validate(df))
        except ValueError as exc:
            raise UsageError(f"{p}: {exc}") from exc
    return concat(frames)


@dataclass(frozen=True)
class Counts:
    """How a results table reads to a person: checks (not measurements), failures, measurements."""

    checks: int  # rows with a verdict: pass, fail, inconclusive, error (skips are counted apart)
    failed: int  # fail + error + inconclusive: the bad rows
    inconclusive: int  # undecided: an interval straddling its band (counted in failed, said apart)
    skipped: int
    measurements: int  # info rows

    @property
    def decided_failures(self) -> int:
        """fail and error rows: the bad rows that are not merely undecided."""
        return self.failed - self.inconclusive

    @property
    def line(self) -> str:
        """``N checks, M failed, K measurements`` (with undecided ones and skips when any): failed counts
        fail and error rows, undecided the inconclusive ones."""
        undecided = f", {self.inconclusive} undecided" if self.inconclusive else ""
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return (f"{self.checks} checks, {self.decided_failures} failed{undecided}{skipped}, "
                f"{self.measurements} measurements")


def counts(df: pd.DataFrame) -> Counts:
    status = df["status"] if len(df) else pd.Series([], dtype=str)
    n = {s: int((status == s).sum()) for s in STATUSES}
    return Counts(
        checks=n["pass"] + n["fail"] + n["inconclusive"] + n["error"],
        failed=n["fail"] + n["error"] + n["inconclusive"],
        inconclusive=n["inconclusive"],
        skipped=n["skip"],
        measurements=n["info"],
    )


REPRODUCE = "reproduce:"


def with_reproduce(df: pd.DataFrame, command: str) -> pd.DataFrame:
    """``df`` with ``; reproduce: COMMAND`` ending the detail of every failed, errored or
    inconclusive row that does not name its command yet (the report shows it as the reproduce line)."""
    if not len(df):
        return df
    out = df.copy()
    bad = out["status"].isin(BAD_STATUSES) & ~out["detail"].astype(str).str.contains(REPRODUCE, regex=False)
    out.loc[bad, "detail"] = [f"{d}; {REPRODUCE} {command}" if d else f"{REPRODUCE} {command}"
                              for d in out.loc[bad, "detail"]]
    return out


FAILED = 1  # exit code of a run in which a check failed or errored
NOTHING_CHECKED = 3  # exit code of a run in which no row carries a verdict (every row skipped or info)
UNDECIDED = 4  # exit code of a run whose only bad rows are inconclusive (no fail, no error)
#: the exit codes of a run that ran and judged (or could not judge) the device: 0, failed, undecided
VERDICT_CODES: tuple[int, ...] = (0, FAILED, UNDECIDED)


def exit_code(df: pd.DataFrame) -> int:
    """1 when any check failed or errored; 4 (undecided) when the only bad rows are inconclusive; 3 when
    nothing was checked (every row skipped or a measurement, or no row); else 0."""
    c = counts(df)
    if c.decided_failures:
        return FAILED
    if c.inconclusive:
        return UNDECIDED
    if not c.checks:
        return NOTHING_CHECKED
    return 0


def nothing_checked_line(df: pd.DataFrame) -> str:
    """The one line said when :func:`exit_code` is 3."""
    c = counts(df)
    return (f"nothing was checked: {c.skipped} skipped, {c.measurements} measurements, no check with a verdict "
            "(see the skip reasons in results.csv)")
