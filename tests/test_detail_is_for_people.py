"""A row's ``detail`` is one line for people: no verdict or chart reads a figure out of it.

Figures live in columns (``value``, ``threshold``, ``low``, ``high``, ``metric``); the source scan
below fails when a module of the suite applies a regular expression to the detail column again, and
the report tests show that rewording every detail changes no chart or verdict.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pandas as pd
import pytest

from mystique import results

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("mystique", "validators", "reports")
#: methods of ``re`` and of compiled patterns that apply a regular expression to their argument
RE_METHODS = {"search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split"}
#: pandas ``.str`` methods that take a regular expression (unless told ``regex=False``)
STR_REGEX_METHODS = {"extract", "extractall", "match", "fullmatch", "findall", "contains", "count", "replace",
                     "split", "rsplit"}


def _names_detail(node: ast.AST, aliases: frozenset[str] = frozenset()) -> bool:
    """Whether an expression reads something called detail (a variable, an attribute, a column), or a
    name in ``aliases`` (loop variables over details)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and ("detail" in n.id.lower() or n.id in aliases):
            return True
        if isinstance(n, ast.Attribute) and n.attr == "detail":
            return True
        if isinstance(n, ast.Constant) and n.value == "detail":
            return True
    return False


def _detail_aliases(tree: ast.AST) -> frozenset[str]:
    """Names a loop or comprehension binds while iterating over details (``for d in df["detail"]``)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.For, ast.comprehension)) and _names_detail(n.iter):
            out |= {t.id for t in ast.walk(n.target) if isinstance(t, ast.Name)}
    return frozenset(out)


def _regex_off(call: ast.Call) -> bool:
    return any(k.arg == "regex" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def regex_on_detail(source: str) -> list[int]:
    """Line numbers of the calls in ``source`` that apply a regular expression to a detail."""
    tree = ast.parse(source)
    aliases = _detail_aliases(tree)

    def reads_detail(node: ast.AST) -> bool:
        return _names_detail(node, aliases)

    hits = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        method, receiver = call.func.attr, call.func.value
        on_str = isinstance(receiver, ast.Attribute) and receiver.attr == "str"
        if on_str and method in STR_REGEX_METHODS:
            # pandas: series.str.METHOD(pattern) takes a regex unless regex=False
            if reads_detail(receiver.value) and not _regex_off(call):
                hits.append(call.lineno)
        elif method in RE_METHODS and not on_str:
            args = list(call.args) + [k.value for k in call.keywords]
            # re.search(pattern, detail) / PATTERN.search(detail); str.split of a detail is no regex
            if isinstance(receiver, ast.Name) and receiver.id == "re":
                if any(reads_detail(a) for a in args[1:]):
                    hits.append(call.lineno)
            elif method != "split" and not reads_detail(receiver) and any(reads_detail(a) for a in args):
                hits.append(call.lineno)
    return sorted(set(hits))


@pytest.mark.parametrize("snippet", [
    "m = _INTERVAL.search(detail or '')",
    "hit = _TRIALS.search(e['detail'])",
    "statuses = [(m[1] if (m := _VERDICT.search(d)) else 'info') for d in g['detail']]",
    "for text in df['detail']:\n    hit = _T.search(text)",
    "m = re.search(r'caught by (.*)', row.detail)",
    "x = df['detail'].str.extract(r'trials=(\\d+)')",
    "x = df['detail'].str.contains('verdict: fail')",
])
def test_the_scan_finds_a_regex_over_a_detail(snippet):
    assert len(regex_on_detail(snippet)) == 1


@pytest.mark.parametrize("snippet", [
    "bad = out['detail'].astype(str).str.contains(REPRODUCE, regex=False)",
    "i = text.rfind(detail)",
    "head = row['detail'].split('; rows in')[0]",
    "m = _DEVICE_RE.fullmatch(device)",
])
def test_the_scan_leaves_plain_string_work_alone(snippet):
    assert regex_on_detail(snippet) == []


def test_no_module_applies_a_regex_to_the_detail_column():
    found = [f"{p.relative_to(ROOT)}:{line}" for top in SCANNED for p in sorted((ROOT / top).rglob("*.py"))
             for line in regex_on_detail(p.read_text())]
    assert not found, f"a regular expression over a detail (put the figure in a column): {found}"


# ----------------------------------------------------------------------------------------------
# the report reads columns


def _section_charts(module, df: pd.DataFrame) -> list[str]:
    from mystique.reports.blocks import Ids
    from mystique.reports.sections.base import SuiteRows

    blocks = module.blocks(SuiteRows(df.assign(run="r", run_no=1), multi=False, ids=Ids()))
    return [str(b["svg"]) for b in blocks if b["kind"] == "chart"]


def _performance_rows(with_interval: bool = True) -> pd.DataFrame:
    res = results.Results(results.RunContext(device="cpu", device_name="Model X"), "performance")
    for w, m in (("dlrm", 12.5), ("bert", 30.1)):
        lo, hi = (m * 0.98, m * 1.03) if with_interval else (None, None)
        res.add("step_time", w, "median_ms", m, low=lo, high=hi, unit="ms", status="info", dtype="float32",
                detail=f"95% interval [{m * 0.5:.6g}, {m * 2:.6g}] ms")
    for i, mhz in enumerate([3000.0, 2990.0, 2400.0]):
        res.add("clock_trace", "dlrm", "cpu_mhz", mhz, unit="mhz", status="info", detail=f"t={i * 7:.2f} s; /proc")
    for what in ("device_medians", "pooled_steps"):
        for n, slow in ((1, 1.0), (64, 1.1 if what == "device_medians" else 1.3)):
            res.add("sync_slowdown", f"dlrm N={n}", f"expected_slowdown_{what}", slow, status="info",
                    detail="Model X; device medians (3 samples); E[max]")
    for run, (r, lo, hi) in {"healthy-00": (1.0, 0.98, 1.02), "faulty-00": (1.4, 1.3, 1.5),
                             "faulty-01": (1.07, 1.03, 1.09)}.items():
        res.add("campaign_slowdown", f"{run}: dlrm", "median_ms", r, threshold=1.08, low=lo, high=hi, unit="x",
                status="info", detail="the fleet comparison's verdict: pass; whatever")
        res.add("campaign_pass_bound", f"{run}: dlrm", "median_ms", 1.05, unit="x", status="info")
    return res.frame()


def test_rewording_details_changes_no_performance_chart():
    from mystique.reports.sections import performance

    df = _performance_rows()
    charts = _section_charts(performance, df)
    assert len(charts) == 4  # step times, clocks, the synchronous job, the campaign
    assert _section_charts(performance, df.assign(detail="x")) == charts
    # the step-time chart draws the intervals of the columns: without them it is another chart
    assert _section_charts(performance, _performance_rows(with_interval=False))[0] != charts[0]


def test_the_campaign_chart_colours_each_run_by_its_columns():
    from mystique.reports.sections.performance import campaign_verdicts

    df = _performance_rows().assign(run_no=1)
    slow = df[df["check"] == "campaign_slowdown"]
    # faulty-01 straddles the limit: inconclusive; healthy-00 lies at or below the pass bound
    assert campaign_verdicts(slow, df[df["check"] == "campaign_pass_bound"]) == ["pass", "fail", "inconclusive"]
    old = slow.assign(low=math.nan, high=math.nan)  # a file from before the low and high columns
    assert campaign_verdicts(old, df.iloc[0:0]) == ["info", "info", "info"]


def test_detection_rate_intervals_come_from_columns_never_the_detail():
    from mystique.reports.blocks import Ids
    from mystique.reports.sections import soft_errors
    from mystique.reports.sections.base import SuiteRows

    res = results.Results(results.RunContext(device="cpu"), "soft_errors")
    res.add("abft_detection_rate", "sign", "detection_rate", 0.9, low=0.8, high=0.95, status="info",
            detail="trials=7, Wilson 95% interval [0.1, 0.2]")
    res.add("abft_detection_rate", "sign", "trials", 100, status="info")
    res.add("dmr_detection_rate", "sign", "detection_rate", 0.5, status="info", detail="trials=40")
    df = res.frame().assign(run="r", run_no=1)
    [_, table] = soft_errors.blocks(SuiteRows(df, multi=False, ids=Ids()))[:2]
    cells = {r["cells"][0]["text"]: [c["text"] for c in r["cells"]] for r in table["rows"]}
    assert cells["abft_detection_rate"][3:7] == ["100", "0.9", "0.8", "0.95"]
    assert cells["dmr_detection_rate"][3:7] == ["", "0.5", "", ""]  # no trials row: no interval, whatever it says
