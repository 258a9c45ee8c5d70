"""`mystique selftest`: does the suite tell a healthy device from a broken one, here?

A qualification suite earns trust on a device only when (a) the healthy device passes it and (b)
every fault it claims to catch makes it fail. :func:`selftest` runs the quick qualification
(:func:`mystique.validators.qualify.qualify`) once on the healthy device, then once under each
built-in fault simulation (``mystique faults``) and each ``--inject SPEC`` given, each run in its
own folder, and records rows of suite ``selftest``:

* ``healthy_false_failures`` (one check): the failed checks of the healthy run; threshold 0.
* ``fault_caught`` (one check per fault): the failed checks of the run under that fault; pass when
  at least one check failed; the detail names the checks that caught it (``suite.check x count``).
* ``run_time`` (measurements, ``info``): the wall time of each run.

With the default validators, the healthy run, the slowness faults (``throttle``, ``straggler``) and
each ``--inject SPEC`` also get a short performance step (:data:`PERFORMANCE_STEP`: the sustained
group of :mod:`.performance`, whose paired rows compare the device with and without the mode);
its rows join that run's results. The slowness faults change speed, not numbers: their runs are
the performance step alone (no numerics, soft-error or correctness qualification), which keeps the
self-test quick.

Exit 0 only when the healthy run passes and every fault is caught.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mystique.reports import render_report

from mystique import faults, results
from mystique.errors import MystiqueError, UsageError
from mystique.io import atomic_write_text, check_output_dir, staged_output_dir
from mystique.progress import Progress
from mystique.targets import make_target

from .performance import run as performance_run
from .qualify import qualify

HEALTHY = "healthy"


@dataclass(frozen=True)
class RunOutcome:
    """One qualification run of the self-test: its name, fault spec, rows and time."""

    name: str
    inject: str | None
    frame: Any  # results DataFrame
    seconds: float
    error: str = ""

    @property
    def failed_rows(self) -> Any:
        df = self.frame
        return df[df["status"].isin(results.BAD_STATUSES)] if len(df) else df

    def caught_by(self) -> dict[str, int]:
        """``suite.check`` -> how many of its rows failed."""
        out: dict[str, int] = {}
        for _, row in self.failed_rows.iterrows():
            key = f"{row['suite']}.{row['check']}"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def fault_specs(extra: Sequence[str] = (), only: Sequence[str] | None = None) -> list[str]:
    """The built-in fault simulations (or ``only`` of them), then the user's ``--inject`` specs."""
    names = sorted(faults.FAULTS)
    if only:
        unknown = [n for n in only if n not in faults.FAULTS]
        if unknown:
            raise UsageError(f"unknown fault simulation(s) {', '.join(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in set(only)]
    specs = names + [s.strip() for s in extra if s.strip()]
    if len(set(specs)) != len(specs):
        raise UsageError("a fault simulation is named twice")
    return specs


def _folder(spec: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)
    return f"fault-{safe}"[:120]


# The performance step of the self-test: the sustained group on one workload for a few seconds, on the
# healthy device and under each slowness fault (and each --inject SPEC); the paired mode rows catch
# a slow mode (8 s: too short for a drift verdict, the drift row is a measurement). Short, so that the
# self-test stays quick.
PERFORMANCE_STEP = {"groups": ["sustained"], "workloads": "dlrm", "duration": 8.0}


def _performance(out: Path, *, device: str, inject: str | None, emulate: str | None, level: str, seed: int) -> Any:
    """The performance rows of one self-test run (:data:`PERFORMANCE_STEP`), reproduce line added."""
    step = PERFORMANCE_STEP
    df = performance_run(make_target(device, inject, emulate), level=level, seed=seed, out_dir=out / "performance",
                         **step)
    words = ["mystique", "validate", "performance", "--device", device, "--level", level, "--seed", str(seed),
             "--group", "sustained", "--workloads", step["workloads"], "--duration", str(step["duration"])]
    words += (["--inject", inject] if inject else []) + (["--emulate", emulate] if emulate else [])
    return results.with_reproduce(df, " ".join(words) + " -o OUT")


def _wants_performance(spec: str | None, validators: Sequence[str] | None) -> bool:
    """Whether a self-test run gets the performance step: by default, the healthy run, the slowness
    faults and the user's own modes (the other simulations change numbers, not speed)."""
    if validators is not None:
        return False  # the caller chose the validators: `performance` among them runs through qualify
    return spec is None or spec in faults.SLOWNESS_FAULTS or spec.split(":", 1)[0] not in faults.FAULTS


def _run_one(stage: Path, name: str, folder: str, *, device: str, inject: str | None, emulate: str | None,
             level: str, seed: int, validators: Sequence[str] | None) -> RunOutcome:
    t0 = time.perf_counter()
    out = stage / folder
    perf = _wants_performance(inject, validators)
    log = io.StringIO()  # pytest's own report of the run: kept beside its results, not on the terminal
    try:
        if perf and inject in faults.SLOWNESS_FAULTS:  # speed only: the performance step is its qualification
            out.mkdir(parents=True, exist_ok=True)
        else:
            try:
                with contextlib.redirect_stdout(log):
                    qualify(out, device=device, inject=inject, emulate=emulate, level=level, seed=seed,
                            validators=validators, quiet=True)
            finally:
                if out.is_dir():
                    atomic_write_text(out / "pytest.log", log.getvalue())
        csv = out / "results.csv"
        df = results.read_csv(csv) if csv.exists() else results.to_frame([])
        if perf:
            df = results.concat([df, _performance(out, device=device, inject=inject, emulate=emulate, level=level,
                                                  seed=seed)])
            results.write_csv(df, csv)
        return RunOutcome(name, inject, df, time.perf_counter() - t0)
    except UsageError:
        raise
    except MystiqueError as exc:  # the run could not finish: neither a pass nor a catch
        return RunOutcome(name, inject, results.to_frame([]), time.perf_counter() - t0, error=str(exc))


def selftest(output: str | os.PathLike, *, device: str = "cpu", emulate: str | None = None,
             inject: Sequence[str] = (), faults: Sequence[str] | None = None, level: str = "quick",
             seed: int = 0, validators: Sequence[str] | None = None, force: bool = False) -> tuple[int, Any]:
    """Run the self-test into ``output``; return (exit code, the selftest rows).

    ``output`` gets ``results.csv`` (the selftest rows), ``report.html``, and one folder per run
    (``healthy/``, ``fault-NAME/``) with that run's ``results.csv``, ``report.html``, ``junit.xml`` and
    ``pytest.log``.
    """
    if level not in ("quick", "full"):
        raise UsageError(f"unknown level {level!r}; expected quick or full")
    specs = fault_specs(inject, faults)
    check_output_dir(output, force)
    target = make_target(device, None, emulate)  # bad input and absent devices: before anything runs
    for spec in specs:
        make_target(device, spec, emulate)
    runs: list[tuple[str, str, str | None]] = [(HEALTHY, HEALTHY, None)] + [(s, _folder(s), s) for s in specs]
    progress = Progress("selftest", total=len(runs))
    with staged_output_dir(output, force) as stage:
        outcomes: list[RunOutcome] = []
        for name, folder, spec in runs:
            progress.step(f"qualification ({level}) on {target.label}" + (f" under fault {spec}" if spec else ", healthy"))
            outcomes.append(_run_one(stage, name, folder, device=device, inject=spec, emulate=emulate, level=level,
                                     seed=seed, validators=validators))
            o = outcomes[-1]
            progress.note(f"{name}: {results.counts(o.frame).line}" + (f"; {o.error}" if o.error else "")
                          + f" ({o.seconds:.1f} s)")
        df = rows(target, outcomes, level=level, seed=seed, emulate=emulate)
        results.write_csv(df, stage / "results.csv")
        tables = [p for p in (stage / "results.csv", stage / HEALTHY / "results.csv") if p.exists()]
        render_report([str(p) for p in tables], str(stage / "report.html"),
                      title=f"Mystique Suite self-test on {target.label}")
    return results.exit_code(df), df


def rows(target: Any, outcomes: Sequence[RunOutcome], *, level: str, seed: int, emulate: str | None) -> Any:
    """The selftest rows of ``outcomes`` (the first is the healthy run)."""
    ctx = results.RunContext.for_target(target)
    res = results.Results(ctx, "selftest")
    emu = f" --emulate {emulate}" if emulate else ""
    repro = f"mystique selftest --device {target.device}{emu} --level {level} --seed {seed}"
    healthy, faulty = outcomes[0], outcomes[1:]
    if healthy.error:
        res.add("healthy_false_failures", target.label, "failed_checks", None, status="error", threshold=0,
                detail=f"the healthy qualification did not finish: {healthy.error}; {repro}")
    else:
        caught = healthy.caught_by()
        c = results.counts(healthy.frame)
        which = "; ".join(f"{k} x{v}" for k, v in caught.items())
        res.add("healthy_false_failures", target.label, "failed_checks", c.failed, threshold=0,
                status="pass" if c.failed == 0 and c.checks else ("fail" if c.failed else "skip"),
                detail=(f"{c.line} on the healthy device" + (f"; failing: {which}" if which else "")
                        + f"; rows in {HEALTHY}/results.csv; {repro}"))
    for o in faulty:
        subject = o.inject or o.name
        if o.error:
            res.add("fault_caught", subject, "failed_checks", None, status="error", threshold=1,
                    detail=f"the qualification under this fault did not finish: {o.error}; {repro} --inject {subject}")
            continue
        caught = o.caught_by()
        c = results.counts(o.frame)
        which = "; ".join(f"{k} x{v}" for k, v in caught.items())
        res.add("fault_caught", subject, "failed_checks", c.failed, threshold=1,
                status="pass" if c.failed else "fail",
                detail=(f"caught by {which}" if which else f"NOT caught: {c.line}")
                + f"; rows in {_folder(subject)}/results.csv; reproduce: mystique qualify --device {target.device}{emu} "
                  f"--level {level} --seed {seed} --inject {subject} -o OUT")
    for o in outcomes:
        res.add("run_time", o.inject or o.name, "seconds", o.seconds, unit="s", status="info",
                detail=f"wall time of the quick qualification run ({results.counts(o.frame).line})")
    return res.frame()
