"""Pure table computations behind a report: counts, runs, comparisons, intervals. Never imports torch."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..binomial import Z95 as _Z95
from ..binomial import wilson
from ..results import BAD_STATUSES, STATUSES, SUITES, counts

KEY: tuple[str, ...] = ("suite", "check", "subject", "dtype", "metric")


def wilson_interval(successes: float, trials: float, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of a binomial proportion ``successes / trials``.

    ``z`` is the normal quantile (1.96 for 95 %). With no trials nothing is known: ``(0.0, 1.0)``.
    The interval always lies in [0, 1] and contains ``successes / trials``.
    """
    if trials <= 0 or not math.isfinite(trials):
        return (0.0, 1.0)
    return wilson(min(max(successes, 0.0), trials), trials, z)


def verdict_of(df: pd.DataFrame) -> str:
    """The one word a report leads with, in this order of precedence:

    ``NO RESULTS`` (no row), ``FAIL`` (a check failed or errored), ``INCONCLUSIVE`` (the only bad
    rows are timing verdicts whose 95% interval straddles their band), ``NOTHING CHECKED`` (every
    row skipped or a measurement), else ``PASS``. FAIL is a run that exits 1, INCONCLUSIVE one that exits 4
    (undecided), NOTHING CHECKED one that exits 3 (:func:`mystique.results.exit_code`).
    """
    if not len(df):
        return "NO RESULTS"
    c = counts(df)
    if c.failed > c.inconclusive:
        return "FAIL"
    if c.inconclusive:
        return "INCONCLUSIVE"
    if not c.checks:
        return "NOTHING CHECKED"
    return "PASS"


def status_counts(df: pd.DataFrame, by: str = "suite") -> pd.DataFrame:
    """Rows counted by status per value of ``by``.

    Columns: ``by``, one per status of :data:`mystique.results.STATUSES` (``pass``, ``fail``,
    ``inconclusive``, ``skip``, ``error``, ``info``), ``checks`` (rows with a verdict: pass, fail,
    inconclusive, error; skips and measurements apart), ``bad`` (fail, inconclusive, error) and
    ``total`` (all rows), ints, in order of first appearance of ``by``.
    """
    order = list(dict.fromkeys(df[by]))
    table = pd.crosstab(df[by], df["status"]) if len(df) else pd.DataFrame()
    out = pd.DataFrame({by: order})
    for s in STATUSES:
        out[s] = [int(table.at[k, s]) if s in table.columns and k in table.index else 0 for k in order]
    _add_totals(out)
    return out


def _add_totals(out: pd.DataFrame) -> None:
    out["checks"] = out[["pass", "fail", "inconclusive", "error"]].sum(axis=1).astype(int)
    out["bad"] = out[list(BAD_STATUSES)].sum(axis=1).astype(int)
    out["total"] = out[list(STATUSES)].sum(axis=1).astype(int)


def runs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run, a run being the rows sharing ``(run_id, device)``, oldest first.

    Columns: ``run``, ``run_id``, ``device``, ``device_name``, ``torch_version``, ``host``,
    ``first`` and ``last`` (started_at range), ``suites`` (comma list), one count per status
    (``pass``, ``fail``, ``inconclusive``, ``skip``, ``error``, ``info``), ``checks``, ``bad`` and
    ``total`` as in :func:`status_counts`, and ``label`` (``device · date · run id``, unique).
    """
    cols = [
        "run",
        "run_id",
        "device",
        "device_name",
        "torch_version",
        "host",
        "first",
        "last",
        "suites",
        *STATUSES,
        "checks",
        "bad",
        "total",
        "label",
    ]
    if not len(df):
        return pd.DataFrame(columns=cols)
    records = []
    for (run_id, device), g in df.groupby(["run_id", "device"], sort=False):
        rec = {
            "run_id": run_id,
            "device": device,
            "device_name": ", ".join(x for x in dict.fromkeys(g["device_name"]) if x),
            "torch_version": ", ".join(x for x in dict.fromkeys(g["torch_version"]) if x),
            "host": ", ".join(x for x in dict.fromkeys(g["host"]) if x),
            "first": min(g["started_at"]),
            "last": max(g["started_at"]),
            "suites": ", ".join(dict.fromkeys(g["suite"])),
        }
        for s in STATUSES:
            rec[s] = int((g["status"] == s).sum())
        records.append(rec)
    out = (
        pd.DataFrame(records).sort_values(["first", "run_id", "device"], kind="stable").reset_index(drop=True)
    )
    _add_totals(out)
    out.insert(0, "run", range(1, len(out) + 1))
    labels = [f"{r.device or '?'} · {r.first[:10] or '?'} · {r.run_id[:8]}" for r in out.itertuples()]
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            labels[i] = f"{lab} #{seen[lab]}"
    out["label"] = labels
    return out[cols]


def with_run_labels(df: pd.DataFrame, run_table: pd.DataFrame) -> pd.Series:
    """The run label of each row of ``df`` (a Series aligned with ``df``)."""
    lookup = {(r.run_id, r.device): r.label for r in run_table.itertuples()}
    return pd.Series([lookup.get((a, b), "") for a, b in zip(df["run_id"], df["device"])], index=df.index)


def compare_runs(df: pd.DataFrame, run_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Join the rows of several runs on ``(suite, check, subject, dtype, metric)`` and compute deltas.

    Repeated keys within one run are told apart by ``occurrence`` (0, 1, ...). Only keys present
    in at least two runs are kept. The baseline of a key is its oldest run. Long format, one row
    per (key, run), sorted: keys that got worse, then other status changes, then the rest, each in
    suite order (``mystique.results.SUITES``) and order of first appearance.

    Columns: ``suite``, ``check``, ``subject``, ``dtype``, ``metric``, ``occurrence``, ``unit``,
    ``run`` (label), ``run_no`` (1 = oldest),
    ``value``, ``status``, ``baseline_value``, ``baseline_status``, ``delta`` (value - baseline),
    ``rel_delta`` (delta / abs(baseline), NaN when the baseline is 0 or unknown), ``is_baseline``,
    ``status_changed``, ``worsened`` (not bad at baseline: pass, skip or a measurement (info); bad
    here: fail, inconclusive or error) and ``key_changed`` (some run of the key changed status).
    A measurement (``info``) is neither a pass nor a failure: its runs differ by value; a change
    from ``inconclusive`` to ``fail`` is a status change, not a worsening (both are bad).
    """
    cols = [
        *KEY,
        "occurrence",
        "unit",
        "run",
        "run_no",
        "value",
        "status",
        "baseline_value",
        "baseline_status",
        "delta",
        "rel_delta",
        "is_baseline",
        "status_changed",
        "worsened",
        "key_changed",
    ]
    run_table = runs(df) if run_table is None else run_table
    if len(run_table) < 2:
        return pd.DataFrame(columns=cols)
    work = df.copy()
    work["run"] = with_run_labels(work, run_table)
    order = {lab: i + 1 for i, lab in enumerate(run_table["label"])}
    work["run_no"] = work["run"].map(order).astype(int)
    work["occurrence"] = work.groupby([*KEY, "run"], sort=False).cumcount()
    keys = [*KEY, "occurrence"]
    suite_rank = {name: i for i, name in enumerate(SUITES)}
    work["_s"] = work["suite"].map(lambda x: suite_rank.get(x, len(suite_rank)))
    work["_pos"] = work.groupby(keys, sort=False).ngroup()
    nruns = work.groupby(keys, sort=False)["run_no"].transform("nunique")
    work = work[nruns >= 2].sort_values(["_s", "_pos", "run_no"], kind="stable")
    if not len(work):
        return pd.DataFrame(columns=cols)
    first = work.groupby(keys, sort=False).head(1).set_index(keys)[["value", "status"]]
    first.columns = ["baseline_value", "baseline_status"]
    work = work.join(first, on=keys)
    work["delta"] = work["value"] - work["baseline_value"]
    base = work["baseline_value"].abs()
    work["rel_delta"] = np.where(
        (base > 0) & np.isfinite(base), work["delta"] / base.where(base > 0, 1.0), np.nan
    )
    work["is_baseline"] = work.groupby(keys, sort=False).cumcount() == 0
    work["status_changed"] = work["status"] != work["baseline_status"]
    work["worsened"] = ~work["baseline_status"].isin(BAD_STATUSES) & work["status"].isin(BAD_STATUSES)
    work["key_changed"] = work.groupby(keys, sort=False)["status_changed"].transform("any")
    key_worse = work.groupby(keys, sort=False)["worsened"].transform("any")
    work = work.assign(_w=~key_worse, _c=~work["key_changed"])
    work = work.sort_values(["_w", "_c", "_s", "_pos", "run_no"], kind="stable")
    return work[cols].reset_index(drop=True)
