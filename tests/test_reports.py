"""Reports: results.csv (+ replay ops.csv/summary.json) -> one self-contained report.html."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mystique.reports import (
    ReportInputs,
    compare_runs,
    failed_checks,
    load_inputs,
    render_html,
    render_report,
    runs,
    status_counts,
    verdict_of,
    wilson_interval,
)

from mystique.cli import main
from mystique.errors import UsageError
from mystique.results import Results, RunContext, concat, counts, read_csv, write_csv

CPU = dict(device="cpu", device_name="AMD EPYC 7B13", torch_version="2.13.0", host="qual-01")
GPU = dict(device="cuda", device_name="NVIDIA H100 80GB HBM3", torch_version="2.13.0+cu128", host="gpu-07")
FAILING_DETAIL = "max abs err 0.031 > 0.0078 on aten::mm; reproduce: --seed 1234 --shape 64x128x32"


# ----------------------------------------------------------------------------------------------
# realistic fixture runs, produced through mystique.results.Results like the suites do


def _ctx(base: dict, run_id: str, started_at: str) -> RunContext:
    return RunContext(run_id=run_id, started_at=started_at, **base)


def numerics_rows(ctx: RunContext, *, fail_mm_bf16: bool) -> pd.DataFrame:
    r = Results(ctx, "numerics")
    bounds = {"float32": 1e-5, "bfloat16": 7.8e-3, "float16": 9.8e-4}
    errs = {
        ("aten::mm", "float32"): 2.1e-6,
        ("aten::mm", "bfloat16"): 3.1e-2 if fail_mm_bf16 else 3.9e-3,
        ("aten::mm", "float16"): 4.4e-4,
        ("aten::softmax", "bfloat16"): 1.2e-3,
        ("aten::softmax", "float16"): 2.0e-4,
        ("aten::layer_norm", "bfloat16"): 6.1e-3,
        ("aten::gelu", "float16"): 0.0,
    }
    for (op, dtype), err in errs.items():
        bound = bounds[dtype]
        ok = err <= bound
        detail = "" if ok else FAILING_DETAIL
        r.add(
            "op_error_vs_fp64",
            op,
            "max_rel_error",
            err,
            status="pass" if ok else "fail",
            threshold=bound,
            dtype=dtype,
            detail=detail,
        )
    r.add(
        "op_error_vs_fp64",
        "aten::_scaled_dot_product_flash_attention",
        "max_rel_error",
        None,
        status="skip",
        dtype="float16",
        detail="no flash attention kernel on this device",
    )
    return r.frame()


def soft_error_rows(ctx: RunContext) -> pd.DataFrame:
    r = Results(ctx, "soft_errors")
    for bit_class, (rate, lo, hi, n) in {
        "sign": (1.0, 0.963, 1.0, 100),
        "exponent": (0.86, 0.778, 0.915, 100),
        "mantissa_high": (0.93, 0.862, 0.966, 100),
        "mantissa_low": (0.12, 0.07, 0.198, 100),
    }.items():
        st_ = "pass" if rate >= 0.9 or bit_class == "mantissa_low" else "fail"
        r.add(
            "abft_detection_rate",
            bit_class,
            "detection_rate",
            rate,
            status=st_,
            threshold=0.9 if bit_class != "mantissa_low" else None,
            dtype="float32",
            detail=f"trials={n} seed=7",
        )
        r.add("abft_detection_rate", bit_class, "detection_rate_ci_low", lo, status="pass", dtype="float32")
        r.add("abft_detection_rate", bit_class, "detection_rate_ci_high", hi, status="pass", dtype="float32")
        r.add("abft_detection_rate", bit_class, "trials", n, status="pass", dtype="float32")
    # a checker whose rows carry no interval: the report computes Wilson's from its trials row (never
    # from the detail)
    r.add(
        "dmr_detection_rate",
        "exponent",
        "detection_rate",
        0.8,
        status="pass",
        dtype="bfloat16",
        detail="trials=999 seed=8",
    )
    r.add("dmr_detection_rate", "exponent", "trials", 50, status="info", dtype="bfloat16")
    for layer, pvf in {
        "layers.0.attn.q_proj": 0.31,
        "layers.0.mlp.up_proj": 0.12,
        "lm_head": 0.55,
        "layers.1.attn.o_proj": 0.07,
    }.items():
        r.add("pvf", layer, "pvf", pvf, status="pass", dtype="float32", detail="trials=200 seed=3")
    r.add(
        "abft_overhead",
        "aten::mm 1024x1024",
        "overhead",
        7.5,
        status="pass",
        unit="%",
        threshold=15,
        dtype="float32",
    )
    r.add(
        "abft_overhead",
        "aten::mm 256x256",
        "overhead",
        18.2,
        status="fail",
        unit="%",
        threshold=15,
        dtype="float32",
        detail="median of 9 interleaved repetitions; reproduce: --seed 5 --size 256",
    )
    return r.frame()


def correctness_rows(ctx: RunContext) -> pd.DataFrame:
    r = Results(ctx, "correctness")
    r.add(
        "output_matches_reference",
        "llama:debug",
        "max_abs_diff",
        0.0021,
        status="pass",
        threshold=0.01,
        dtype="float32",
    )
    r.add(
        "first_divergent_op",
        "bert:debug",
        "op_index",
        17,
        status="fail",
        dtype="bfloat16",
        detail="aten::addmm #17 diverges first: max abs diff 0.44 > 0.05; "
        "reproduce: --seed 0 --workload bert",
    )
    return r.frame()


def capture_rows(ctx: RunContext) -> pd.DataFrame:
    r = Results(ctx, "capture")
    r.add("trace_recorded", "llama:debug", "ops", 412, status="pass")
    r.add("step_time", "llama:debug", "median_ms", 12.75, status="pass", unit="ms")
    return r.frame()


def replay_rows(ctx: RunContext) -> pd.DataFrame:
    """Rows like `mystique replay` writes (mystique/replay/run.py)."""
    r = Results(ctx, "replay")
    r.add(
        "replay_coverage",
        "llama:debug",
        "coverage",
        7 / 9,
        status="pass",
        threshold=1.0,
        detail="compute ops replayed 7/7; 2 collectives skipped",
    )
    r.add("replay_coverage_by_time", "llama:debug", "coverage_by_time", 0.95, status="pass")
    r.add(
        "replay_step_time",
        "llama:debug",
        "median_ms",
        0.66,
        status="pass",
        unit="ms",
        detail="median of 10 whole iterations after 3 warm-up; seed 0",
    )
    r.add(
        "replay_step_time_ratio",
        "llama:debug",
        "ratio",
        1.08,
        status="pass",
        threshold=1.1,
        detail="replay 0.660 ms / original 0.610 ms; pass within 0.90-1.10; seed 0",
    )
    return r.frame()


OPS = [
    # index, name, overload, shapes, dtypes, original_us, replay_us, status, reason
    (0, "aten::embedding", "", "[[32000, 64], [2, 16]]", "[float32, int64]", 40.0, 45.0, "replayed", ""),
    (
        1,
        "aten::mm",
        "aten::mm.default",
        "[[32,64],[64,192]]",
        '["float32","float32"]',
        210.0,
        230.0,
        "replayed",
        "",
    ),
    (2, "aten::softmax", "int", "[[2, 4, 16, 16]]", "[float32]", 35.0, 33.0, "replayed", ""),
    (3, "aten::mm", "", "[[32, 64], [64, 64]]", "[float32, float32]", 120.0, 118.0, "replayed", ""),
    (4, "aten::gelu", "", "[[32, 256]]", "[float32]", 25.0, 60.0, "replayed", ""),
    (5, "aten::layer_norm", "", "[[2, 16, 64]]", "[float32]", 30.0, 31.0, "replayed", ""),
    (6, "aten::add", "Tensor", "[[2, 16, 64], [2, 16, 64]]", "[float32, float32]", 8.0, 9.0, "replayed", ""),
    (7, "c10d::allreduce_", "", "[[64]]", "[float32]", 12.0, None, "skipped", "collective"),
    (8, "aten::randperm", "", "[]", "[]", None, None, "skipped", "no synthetic data recipe"),
]
OPS_HEADER = [
    "index",
    "name",
    "overload",
    "input_shapes",
    "input_dtypes",
    "original_us",
    "replay_us",
    "status",
    "reason",
]


def write_replay_dir(folder: Path, ctx: RunContext) -> None:
    folder.mkdir(parents=True)
    write_csv(replay_rows(ctx), folder / "results.csv")
    ops = pd.DataFrame(OPS, columns=OPS_HEADER)
    ops.to_csv(folder / "ops.csv", index=False)
    (folder / "summary.json").write_text(
        json.dumps(
            {
                "ops_total": 9,
                "ops_replayed": 7,
                "ops_skipped": {"c10d::allreduce_": 1, "aten::randperm": 1},
                "coverage": 7 / 9,
                "coverage_by_time": 0.95,
                "original_step_ms": 0.61,
                "replay_step_ms": 0.66,
                "ratio": 0.66 / 0.61,
            }
        )
    )


def make_run(root: Path, base: dict, run_id: str, started_at: str, *, fail_mm_bf16: bool = True) -> Path:
    """One qualification run laid out as the CLI does: a folder per command, each with results.csv."""
    ctx = _ctx(base, run_id, started_at)
    root.mkdir(parents=True, exist_ok=True)
    for name, frame in (
        ("capture", capture_rows(ctx)),
        ("numerics", numerics_rows(ctx, fail_mm_bf16=fail_mm_bf16)),
        ("soft_errors", soft_error_rows(ctx)),
        ("correctness", correctness_rows(ctx)),
    ):
        (root / name).mkdir()
        write_csv(frame, root / name / "results.csv")
    write_replay_dir(root / "replay", ctx)
    return root


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A failing CPU run of every suite (read only: tests write their outputs elsewhere)."""
    return make_run(
        tmp_path_factory.mktemp("one") / "run_cpu", CPU, "a1b2c3d4e5f6", "2025-05-01T10:00:00+00:00"
    )


@pytest.fixture(scope="module")
def one_run_page(one_run: Path) -> tuple[ReportInputs, str]:
    """The inputs of :func:`one_run` and their rendered page, rendered once for the module."""
    inputs = load_inputs([one_run])
    return inputs, render_html(inputs)


@pytest.fixture
def two_numerics(tmp_path: Path) -> list[Path]:
    """The same numerics checks on two devices; aten::mm bfloat16 passes on the first, fails on the second."""
    paths = []
    for base, rid, when, fail in (
        (CPU, "0000aaaa1111", "2025-05-01T10:00:00+00:00", False),
        (GPU, "9999bbbb2222", "2025-05-02T09:30:00+00:00", True),
    ):
        p = tmp_path / rid / "results.csv"
        p.parent.mkdir()
        write_csv(numerics_rows(_ctx(base, rid, when), fail_mm_bf16=fail), p)
        paths.append(p)
    return paths


# ----------------------------------------------------------------------------------------------
# a small HTML reader: well-formedness, tables, text

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """Parses the report, checking every non-void element is closed in order; collects tables."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.tables: list[dict] = []  # {"attrs": {...}, "rows": [[cell text, ...], ...]}
        self.row_classes: list[list[str]] = []
        self._cell: list[str] | None = None
        self.ids: list[str] = []
        self.sections: list[str] = []
        self.text: list[str] = []
        self.feed(html)
        self.close()
        if self.stack:
            self.problems.append(f"unclosed: {self.stack}")

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "section" and "id" in a:
            self.sections.append(a["id"])
        if tag == "table":
            self.tables.append({"attrs": a, "rows": [], "row_classes": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
            self.tables[-1]["row_classes"].append(a.get("class", ""))
        elif tag in ("td", "th"):
            self._cell = []
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]["rows"]:
            self.tables[-1]["rows"][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def table(self, cls: str) -> list[dict]:
        return [t for t in self.tables if cls in t["attrs"].get("class", "").split()]


def page_of(html: str) -> Page:
    p = Page(html)
    assert p.problems == [], p.problems[:5]
    return p


# ----------------------------------------------------------------------------------------------
# tests


def test_reports_never_import_torch():
    code = "import sys, mystique.reports, mystique.cli.cmd_report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_report_is_one_wellformed_offline_file(one_run: Path, tmp_path: Path):
    out = render_report([one_run], tmp_path / "report.html")
    html = out.read_text(encoding="utf-8")
    page = page_of(html)
    assert not re.search(r"https?://", html), re.search(r".{60}https?://.{60}", html)
    assert not re.search(r"<(script|link|img|iframe|object)\b", html)  # nothing to load, nothing to run
    assert not re.search(r"""\b(src|href)\s*=\s*["'](?!#)""", html)  # only in-page links
    assert len(page.ids) == len(set(page.ids)), "duplicate element ids across charts"
    assert html.count("<svg") >= 6  # replay x2, numerics, detection, pvf, overhead


def test_verdict_devices_and_failures_come_first(one_run_page):
    inputs, html = one_run_page
    page = page_of(html)
    text = " ".join(" ".join(page.text).split())
    # the verdict and the device are read first
    assert text.index("FAIL") < text.index("Failures")
    for field in ("cpu", "AMD EPYC 7B13", "2.13.0", "qual-01", "a1b2c3d4e5f6", "2025-05-01T10:00:00+00:00"):
        assert field in text[: text.index("Failures")], field
    assert page.sections[:2] == ["runs", "failures"]
    # failures, each with what reproduces it, before any suite section
    failing = inputs.results[inputs.results["status"] == "fail"]
    assert len(failing) == 4
    fail_html = html[html.index('id="failures"') : html.index('id="summary"')]
    for r in failing.itertuples():
        assert r.check in fail_html and r.subject in fail_html
        # the reproduce line is the command the detail ends with; the whole detail is in the suite's table
        if "reproduce:" in r.detail:
            command = r.detail.rsplit("reproduce:", 1)[1].strip()
            assert f'reproduce:</span> <code>{command}</code>' in fail_html
        else:  # no command: said so, never a description shown as one
            assert "<code>(no command recorded; detail: " in fail_html
        assert r.detail.replace(">", "&gt;") in html[html.index('id="suite-'):]
    assert "0.0078" in fail_html and "0.031" in fail_html  # value and bound of the numerics failure


def test_every_row_appears_in_its_suite_table(one_run_page):
    inputs, html = one_run_page
    page = page_of(html)
    df = inputs.results
    for suite, g in df.groupby("suite"):
        tables = [t for t in page.table("results-all") if t["attrs"].get("data-suite") == suite]
        assert len(tables) == 1, suite
        body = tables[0]["rows"][1:]
        assert len(body) == len(g), suite
        for cells, r in zip(body, g.itertuples()):
            assert (
                cells[0] == r.check and cells[1] == r.subject and cells[2] == r.dtype and cells[3] == r.metric
            )
            assert cells[7] == r.status and cells[8] == r.detail
            if math.isfinite(r.value):
                assert float(cells[4]) == pytest.approx(r.value, rel=1e-3)
            else:
                assert cells[4] == ""


def test_suite_sections_only_for_suites_with_rows(tmp_path: Path, one_run_page):
    only = tmp_path / "only_numerics.csv"
    write_csv(numerics_rows(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), fail_mm_bf16=False), only)
    page = page_of(render_html(load_inputs([only])))
    assert [s for s in page.sections if s.startswith("suite-")] == ["suite-numerics"]
    full = page_of(one_run_page[1])
    assert [s for s in full.sections if s.startswith("suite-")] == [
        "suite-capture",
        "suite-replay",
        "suite-numerics",
        "suite-soft_errors",
        "suite-correctness",
    ]


def test_passing_run_says_pass(tmp_path: Path):
    p = tmp_path / "results.csv"
    write_csv(numerics_rows(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), fail_mm_bf16=False), p)
    html = render_html(load_inputs(p))
    assert 'id="verdict">PASS<' in html
    assert "No check failed" in html


def test_replay_section_from_summary_and_ops(one_run_page):
    html = one_run_page[1]
    page = page_of(html)
    fid = page.table("fidelity")[0]["rows"]
    assert fid[0][:4] == ["workload / benchmark", "original ms", "replay ms", "ratio"]
    assert fid[1][0] == "llama:debug" and fid[1][1] == "0.61" and fid[1][2] == "0.66"
    assert fid[1][3] == "1.08"  # the row's ratio wins over the summary's
    assert "7 / 9" in fid[1] and "95.0%" in fid[1]
    assert "c10d::allreduce_×1" in fid[1][-1]
    ops = page.table("ops")[0]["rows"]
    assert ops[1][1] == "aten::mm" and ops[1][6] == "0.23"  # slowest op first, us converted to ms
    assert ops[1][2:5] == ["default", "[[32, 64], [64, 192]]", "[float32, float32]"]  # compacted for reading
    assert len(ops) - 1 == len(OPS) - 1  # every op with a known time
    missed = page.table("not-replayed")[0]["rows"][1:]
    assert [(r[1], r[3]) for r in missed] == [
        ("c10d::allreduce_", "collective"),
        ("aten::randperm", "no synthetic data recipe"),
    ]
    types = page.table("optypes")[0]["rows"]
    assert types[1][:4] == ["aten::mm", "2", "0.33", "0.348"]
    assert "Time by operator type" in html and "Original vs replay step time" in html


def test_numerics_ratios_and_soft_error_intervals(one_run_page):
    page = page_of(one_run_page[1])
    num = page.table("numerics")[0]["rows"]
    assert num[1][0] == "aten::mm" and num[1][1] == "bfloat16"  # the worst ratio leads
    assert float(num[1][6]) == pytest.approx(0.031 / 7.8e-3, rel=1e-3)
    assert len(num) - 1 == 7  # the skipped row has no value, so no ratio
    det = {(r[0], r[1]): r for r in page.table("detection")[0]["rows"][1:]}
    assert det[("abft_detection_rate", "mantissa_high")][4:7] == ["0.93", "0.862", "0.966"]
    lo, hi = wilson_interval(40, 50)
    dmr = det[("dmr_detection_rate", "exponent")]
    assert (
        dmr[3] == "50"
        and float(dmr[5]) == pytest.approx(lo, rel=1e-3)
        and float(dmr[6]) == pytest.approx(hi, rel=1e-3)
    )
    pvf = page.table("pvf")[0]["rows"]
    assert [r[1] for r in pvf[1:]] == [
        "lm_head",
        "layers.0.attn.q_proj",
        "layers.0.mlp.up_proj",
        "layers.1.attn.o_proj",
    ]
    over = page.table("overheads")[0]["rows"]
    assert over[1][1] == "aten::mm 256x256" and over[1][7] == "fail"
    div = page.table("divergence")[0]["rows"]
    assert div[1][0] == "fail" and "aten::addmm #17" in div[1][-1]


def test_two_runs_show_deltas_and_status_change(two_numerics: list[Path]):
    inputs = load_inputs(two_numerics)
    html = render_html(inputs)
    page = page_of(html)
    assert "comparison" in page.sections
    rows = page.table("comparison")[0]["rows"]
    header = rows[0]
    assert header[5:] == ["[1] value", "[2] value", "[2] Δ", "[2] Δ%"]
    first = rows[1]
    assert page.table("comparison")[0]["row_classes"][1] == "worse"  # the pass→fail change leads
    assert first[1:5] == ["op_error_vs_fp64", "aten::mm", "bfloat16", "max_rel_error"]
    assert first[5] == "0.0039 pass" and first[6] == "0.031 fail"
    assert float(first[7]) == pytest.approx(0.031 - 0.0039, rel=1e-3)
    assert first[8] == "+695%"
    assert "pass → fail" in html
    for dev in ("AMD EPYC 7B13", "NVIDIA H100 80GB HBM3"):
        assert dev in html
    assert len(rows) == 2  # only the row that differs is in the first table
    # identical rows are tucked away, with a zero delta
    same_rows = page.table("same")[0]["rows"]
    assert len(same_rows) - 1 == len(inputs.results) // 2 - 1
    same = [r for r in same_rows[1:] if r[2] == "aten::softmax" and r[3] == "float16"][0]
    assert same[7] == "0" and same[8] == "+0%"


def test_compare_runs_joins_on_key_and_baselines_oldest(two_numerics: list[Path]):
    df = read_csv(two_numerics)
    table = runs(df)
    assert list(table["device"]) == ["cpu", "cuda"]
    comp = compare_runs(df, table)
    assert len(comp) == 2 * len(df) // 2
    worse = comp[comp["worsened"]]
    assert len(worse) == 1 and worse.iloc[0]["subject"] == "aten::mm" and worse.iloc[0]["run_no"] == 2
    assert comp.iloc[0]["key_changed"]
    base = comp[comp["is_baseline"]]
    assert (base["delta"].fillna(0) == 0).all() and (base["run_no"] == 1).all()
    # a single run has nothing to compare
    assert compare_runs(read_csv(two_numerics[0])).empty


def test_status_counts_by_suite(one_run: Path):
    df = load_inputs(one_run).results
    c = status_counts(df).set_index("suite")
    assert (
        c.loc["numerics", "fail"] == 1 and c.loc["numerics", "skip"] == 1 and c.loc["numerics", "pass"] == 6
    )
    assert (c["total"] == df.groupby("suite").size().reindex(c.index)).all()


@given(n=st.integers(0, 10_000), data=st.data(), z=st.sampled_from([1.0, 1.959963984540054, 2.576]))
def test_wilson_interval_contains_estimate_within_unit(n, data, z):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson_interval(k, n, z)
    assert 0.0 <= lo <= hi <= 1.0
    if n:
        assert lo <= k / n <= hi
        # symmetric: failures' interval mirrors successes'
        lo2, hi2 = wilson_interval(n - k, n, z)
        assert lo2 == pytest.approx(1 - hi, abs=1e-12) and hi2 == pytest.approx(1 - lo, abs=1e-12)
    else:
        assert (lo, hi) == (0.0, 1.0)


def test_wilson_interval_known_value():
    # 81 of 263: Wilson 95% interval (0.2553, 0.3662), as published in Newcombe (1998), example (i)
    lo, hi = wilson_interval(81, 263)
    assert lo == pytest.approx(0.2553, abs=1e-4) and hi == pytest.approx(0.3662, abs=1e-4)


def test_text_is_escaped(tmp_path: Path):
    r = Results(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), "onnx")
    r.add("export_ok", "<script>alert(1)</script>", "ops", 3, status="fail", detail="a & b <i>x</i> $x$")
    p = tmp_path / "results.csv"
    write_csv(r.frame(), p)
    html = render_html(load_inputs(p))
    page_of(html)
    assert "<script>" not in html and "&lt;script&gt;" in html and "a &amp; b &lt;i&gt;" in html
    assert 'id="suite-onnx"' in html  # any other suite gets the generic table


def test_report_is_deterministic(one_run: Path, one_run_page):
    assert render_html(load_inputs(one_run)) == one_run_page[1]


def test_bad_inputs_are_one_line_usage_errors(tmp_path: Path, one_run: Path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    no_csv = tmp_path / "nothing_here"
    no_csv.mkdir()
    bad_summary = tmp_path / "bad_summary"
    write_replay_dir(bad_summary, _ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"))
    (bad_summary / "summary.json").write_text("{not json")
    bad_ops = tmp_path / "bad_ops"
    write_replay_dir(bad_ops, _ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"))
    (bad_ops / "ops.csv").write_text("name,original_us\naten::mm,3\n")
    for bad, words in (
        (tmp_path / "missing.csv", "does not exist"),
        (empty, "not a results CSV"),
        (wrong, "lacks column"),
        (no_csv, "holds no results.csv"),
        (bad_summary, "not a replay summary"),
        (bad_ops, "replay time column"),
    ):
        with pytest.raises(UsageError) as err:
            render_report([bad], tmp_path / "r.html")
        assert words in str(err.value) and "\n" not in str(err.value)
        assert not (tmp_path / "r.html").exists()


def test_existing_report_needs_force(one_run: Path, tmp_path: Path):
    out = tmp_path / "report.html"
    out.write_text("keep me")
    with pytest.raises(UsageError, match="--force"):
        render_report([one_run], out)
    assert out.read_text() == "keep me"
    render_report([one_run], out, force=True)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_cli_report(one_run: Path, tmp_path: Path, capsys):
    out = tmp_path / "out" / "report.html"
    assert (
        main(
            [
                "report",
                str(one_run / "numerics" / "results.csv"),
                str(one_run / "replay"),
                "-o",
                str(out),
                "--title",
                "Nightly qualification",
            ]
        )
        == 0
    )
    html = out.read_text()
    assert "<title>Nightly qualification: FAIL</title>" in html
    assert 'id="suite-replay"' in html and 'id="suite-numerics"' in html and 'id="suite-capture"' not in html
    assert main(["report", str(one_run), "-o", str(out)]) == 2  # exists, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["report", str(one_run), "-o", str(out), "--force"]) == 0
    assert 'id="suite-capture"' in out.read_text()


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, capsys):
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("run_id,suite\nx,numerics\n")
    assert main(["report", str(wrong), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mystique: error:") and "lacks column" in err and len(err.splitlines()) == 1
    assert main(["report", str(tmp_path / "nope.csv"), "-o", str(tmp_path / "r.html")]) == 2
    assert not (tmp_path / "r.html").exists()


def test_header_only_results_render_no_results(tmp_path: Path):
    p = tmp_path / "results.csv"
    write_csv(Results(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), "numerics").frame(), p)
    html = render_html(load_inputs(p))
    page_of(html)
    assert 'id="verdict">NO RESULTS<' in html and 'id="suite-' not in html


def test_render_html_takes_a_results_frame(tmp_path: Path):
    frame = numerics_rows(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), fail_mm_bf16=True)
    html = render_html(frame, title="From a frame")
    assert "<title>From a frame: FAIL</title>" in html and FAILING_DETAIL.replace(">", "&gt;") in html
    with pytest.raises(ValueError, match="lacks column"):
        render_html(frame.drop(columns=["detail"]))


def test_overflowed_and_nan_errors_lead_the_numerics_view(tmp_path: Path):
    r = Results(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), "numerics")
    r.add(
        "normwise_error", "aten::mm", "normwise_rel_err", 1e-3, status="pass", threshold=1e-2, dtype="float16"
    )
    r.add(
        "normwise_error",
        "aten::exp",
        "normwise_rel_err",
        math.inf,
        status="fail",
        threshold=1e-2,
        dtype="float16",
        detail="normwise_rel_err=inf exceeds bound 0.01; seed=3 level=quick",
    )
    r.add(
        "normwise_error",
        "aten::log",
        "normwise_rel_err",
        math.nan,
        status="fail",
        threshold=1e-2,
        dtype="bfloat16",
        detail="normwise_rel_err=nan exceeds bound 0.01; seed=3 level=quick",
    )
    p = tmp_path / "results.csv"
    write_csv(r.frame(), p)
    html = render_html(load_inputs(p))
    rows = page_of(html).table("numerics")[0]["rows"][1:]
    assert [(x[0], x[6]) for x in rows] == [("aten::exp", "inf"), ("aten::log", ""), ("aten::mm", "0.1")]
    chart_svg = html[html.index('id="suite-numerics"') :]
    assert "> inf<" in chart_svg and "> nan<" in chart_svg


def test_folders_expand_to_their_results_once(one_run: Path, tmp_path: Path):
    from mystique.reports.inputs import discover

    found = discover([one_run, one_run / "numerics" / "results.csv"])
    assert [p.relative_to(one_run).parts[0] for p in found] == [
        "capture",
        "correctness",
        "numerics",
        "replay",
        "soft_errors",
    ]
    text = (one_run / "numerics" / "results.csv").read_text()
    for folder in ("a", ".a.staging"):  # a half-written output folder (hidden staging) is not read
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "results.csv").write_text(text)
    assert discover([tmp_path]) == [tmp_path / "a" / "results.csv"]
    inputs = load_inputs([tmp_path, tmp_path / "a" / "results.csv"])
    assert len(inputs.results) == len(read_csv(one_run / "numerics" / "results.csv"))
    assert inputs.replays == ()


# ----------------------------------------------------------------------------------------------
# statuses info (measurements) and inconclusive (a timing interval straddling its band)


def performance_rows(ctx: RunContext, *, ratio_status: str = "inconclusive", gemm_status: str = "pass") -> pd.DataFrame:
    """Timing verdicts with their intervals as measurements, like the performance suite records them."""
    r = Results(ctx, "performance")
    r.add("replay_step_time_ratio", "llama:debug", "ratio", 1.09, status=ratio_status, threshold=1.1,
          detail="95% interval 1.04-1.16 straddles the band 0.90-1.10; 15 paired rounds; seed 0")
    r.add("replay_step_time_ratio", "llama:debug", "ratio_ci_low", 1.04, status="info")
    r.add("replay_step_time_ratio", "llama:debug", "ratio_ci_high", 1.16, status="info")
    r.add("gemm_throughput", "aten::mm 4096", "tflops", 61.2, status=gemm_status, threshold=50, unit="TFLOP/s")
    r.add("memory_bandwidth", "copy 1 GiB", "bandwidth", 1843.0, status="info", unit="GB/s")
    r.add("flash_attention_time", "sdpa", "median_ms", None, status="skip", detail="no flash kernel here")
    return r.frame()


def _summary_by_suite(page: Page) -> dict[str, dict[str, str]]:
    rows = page.table("by-suite")[0]["rows"]
    return {r[0]: dict(zip(rows[0][1:], r[1:])) for r in rows[1:]}


def test_summary_and_headline_count_checks_and_measurements_apart(tmp_path: Path):
    ctx = _ctx(CPU, "r1", "2025-05-01T10:00:00+00:00")
    df = concat([performance_rows(ctx), numerics_rows(ctx, fail_mm_bf16=True)])
    c = status_counts(df).set_index("suite")
    perf = c.loc["performance"]
    assert (perf["pass"], perf["inconclusive"], perf["info"], perf["skip"], perf["checks"], perf["bad"]) == (
        1, 1, 3, 1, 2, 1)
    assert perf["total"] == 6
    page = page_of(render_html(df))
    summary = _summary_by_suite(page)
    assert list(summary) == ["Numerics", "Performance"]
    assert summary["Performance"] == {"pass": "1", "fail": "0", "inconclusive": "1", "error": "0", "skip": "1",
                                      "checks": "2", "measurements": "3"}
    assert summary["Numerics"]["checks"] == "7" and summary["Numerics"]["measurements"] == "0"
    assert page.table("by-suite")[0]["row_classes"][1:] == ["row-fail", "row-inconclusive"]
    # the headline reads like counts(df).line: 9 checks (not 15 rows), failures with the inconclusive
    # one named inside, measurements apart
    line = counts(df).line
    assert line == "9 checks, 1 failed, 1 undecided, 2 skipped, 3 measurements"
    html = render_html(df)
    head = html[html.index('id="headline"'): html.index("</p>", html.index('id="headline"'))]
    texts = re.findall(r'<span class="count[^"]*">([^<]*)</span>', head)
    assert texts == ["9 checks", "7 passed", "1 failed", "1 undecided", "2 skipped", "3 measurements", "1 run"]
    # every part of counts(df).line is in the headline, in its order
    assert [t for t in texts if t != "7 passed" and t != "1 run"] == line.split(", ")
    # the runs table counts them too
    runs_row = page.table("runs")[0]
    header = runs_row["rows"][0]
    got = dict(zip(header, runs_row["rows"][1]))
    assert (got["inconclusive"], got["measurements"], got["fail"]) == ("1", "3", "1")


def test_only_inconclusive_rows_make_an_inconclusive_verdict(tmp_path: Path):
    ctx = _ctx(CPU, "r1", "2025-05-01T10:00:00+00:00")
    df = concat([performance_rows(ctx), numerics_rows(ctx, fail_mm_bf16=False)])
    assert verdict_of(df) == "INCONCLUSIVE"
    html = render_html(df)
    page = page_of(html)
    assert 'id="verdict">INCONCLUSIVE<' in html and "v-inconclusive" in html
    assert "<title>" in html and ": INCONCLUSIVE</title>" in html
    # listed among the failures, with its own badge and the detail that reproduces it
    fail_html = html[html.index('id="failures"'): html.index('id="summary"')]
    assert 'class="failure st-inconclusive"' in fail_html and 'badge st-inconclusive">inconclusive<' in fail_html
    assert "straddles the band" in fail_html and "No check failed" not in fail_html
    assert "Failures (1)" in " ".join(page.text)
    # its section shows measurements by that name, not as passes
    sec = html[html.index('id="suite-performance"'):]
    assert '<span class="count st-info">3 measurements</span>' in sec
    assert '<span class="count st-pass">1 passed</span>' in sec
    # a failure anywhere makes it FAIL; an error too
    assert verdict_of(concat([df, numerics_rows(ctx, fail_mm_bf16=True)])) == "FAIL"
    assert verdict_of(performance_rows(ctx, ratio_status="error")) == "FAIL"
    assert verdict_of(performance_rows(ctx, ratio_status="pass")) == "PASS"


def test_nothing_checked_when_every_row_is_skipped_or_a_measurement(tmp_path: Path):
    r = Results(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), "performance")
    r.add("memory_bandwidth", "copy 1 GiB", "bandwidth", 1843.0, status="info", unit="GB/s")
    r.add("gemm_throughput", "aten::mm 4096", "tflops", None, status="skip", detail="no cuda device")
    assert verdict_of(r.frame()) == "NOTHING CHECKED"
    html = render_html(r.frame())
    page_of(html)
    assert 'id="verdict">NOTHING CHECKED<' in html and "v-nothing-checked" in html
    assert "Nothing was checked: 1 skipped, 1 measurements" in html
    assert "No check failed" not in html
    assert verdict_of(Results(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), "numerics").frame()) == "NO RESULTS"
    only_info = r.frame()[r.frame()["status"] == "info"]
    assert verdict_of(only_info) == "NOTHING CHECKED"


def test_compare_runs_treats_inconclusive_as_bad_and_info_as_neither():
    a = performance_rows(_ctx(CPU, "r1", "2025-05-01T10:00:00+00:00"), ratio_status="pass")
    b = performance_rows(_ctx(CPU, "r2", "2025-05-02T10:00:00+00:00"), ratio_status="inconclusive",
                         gemm_status="fail")
    b.loc[b["metric"] == "bandwidth", "value"] = 1500.0  # a measurement that moved
    df = concat([a, b])
    comp = compare_runs(df).set_index(["metric", "run_no"])
    assert comp.loc[("ratio", 2), "worsened"] and comp.loc[("ratio", 2), "status_changed"]
    assert comp.loc[("tflops", 2), "worsened"]
    assert not comp.loc[("bandwidth", 2), "worsened"] and not comp.loc[("bandwidth", 2), "status_changed"]
    assert comp.loc[("bandwidth", 2), "delta"] == pytest.approx(1500.0 - 1843.0)
    # inconclusive -> fail is a change between two bad statuses, not a worsening
    c = performance_rows(_ctx(CPU, "r3", "2025-05-03T10:00:00+00:00"), ratio_status="fail")
    comp = compare_runs(concat([b, c])).set_index(["metric", "run_no"])
    assert comp.loc[("ratio", 2), "status_changed"] and not comp.loc[("ratio", 2), "worsened"]
    # in the page: the measurement shows its value alone; the pass -> inconclusive change is for the worse
    html = render_html(df)
    rows = {r[4]: r for r in page_of(html).table("comparison")[0]["rows"][1:]}
    assert rows["bandwidth"][5:7] == ["1843", "1500"]
    assert rows["ratio"][5:7] == ["1.09 pass", "1.09 inconclusive"]
    assert '<li class="worse">performance/replay_step_time_ratio llama:debug ratio: pass → inconclusive in [2]</li>' in html


# ----------------------------------------------------------------------------------------------
# the self-test section

SELFTEST_REPRO = "mystique qualify --device cpu --level quick --seed 0"
#: fault -> (status, catching rows, the start of the detail `mystique selftest` writes)
SELFTEST_FAULTS = {
    "bitflip_mm": ("pass", 4, "caught by numerics.op_error_vs_fp64 x3; soft_errors.abft_detection_rate x1"),
    "nan_softmax": ("pass", 3, "caught by correctness.output_matches_reference x2; numerics.op_error_vs_fp64 x1"),
    "stuck_bit": ("fail", 0, "NOT caught: 21 checks, 0 failed, 6 measurements"),
    "mypkg.faults:dropout": ("error", None, "the qualification under this fault did not finish: device lost"),
}
#: run -> the failed_check rows of it (suite.check -> rows) that `mystique selftest` writes
SELFTEST_HITS = {
    "bitflip_mm": {"numerics.op_error_vs_fp64": 3, "soft_errors.abft_detection_rate": 1},
    "nan_softmax": {"correctness.output_matches_reference": 2, "numerics.op_error_vs_fp64": 1},
}


def selftest_rows(ctx: RunContext, *, false_failures: int = 0) -> pd.DataFrame:
    """Rows shaped like validators/selftest.py's ``rows``: healthy run, one row per fault, run times."""
    r = Results(ctx, "selftest")
    failing = "; failing: numerics.op_error_vs_fp64 x2" if false_failures else ""
    r.add("healthy_false_failures", "cpu", "false_failures", false_failures, threshold=0,
          status="fail" if false_failures else "pass",
          detail=f"21 checks, {false_failures} failed, 6 measurements on the healthy device{failing}; "
          "rows in healthy/results.csv; mystique selftest --device cpu --level quick --seed 0")
    for spec, (status, n, what) in SELFTEST_FAULTS.items():
        tail = "" if status == "error" else f"; rows in fault-{spec}/results.csv"
        r.add("fault_caught", spec, "catching_rows", n, threshold=1, status=status,
              detail=f"{what}{tail}; reproduce: {SELFTEST_REPRO} --inject {spec} -o OUT")
    hits = {**SELFTEST_HITS, **({"healthy": {"numerics.op_error_vs_fp64": false_failures}} if false_failures else {})}
    for name, checks in hits.items():
        for key, n in checks.items():
            r.add("failed_check", name, key, n, unit="rows", status="info", detail="failed rows")
    for i, name in enumerate(["healthy", *SELFTEST_FAULTS]):
        r.add("run_time", name, "seconds", 10.5 + i, unit="s", status="info", detail="wall time of the run")
    return r.frame()


def test_the_selftest_matrix_reads_failed_check_rows_never_details():
    df = selftest_rows(_ctx(CPU, "5e1f00000001", "2025-06-01T08:00:00+00:00"), false_failures=2)
    assert failed_checks(df) == {**SELFTEST_HITS, "healthy": {"numerics.op_error_vs_fp64": 2}}
    assert failed_checks(df.assign(detail="caught by a.b x9; failing: c.d x1")) == failed_checks(df)
    # a self-test written before the failed_check rows: its details name checks, the matrix reads none
    assert failed_checks(df[df["check"] != "failed_check"]) == {}


def test_selftest_section_leads_with_a_fault_by_check_matrix(tmp_path: Path):
    ctx = _ctx(CPU, "5e1f00000001", "2025-06-01T08:00:00+00:00")
    selftest = selftest_rows(ctx)
    healthy = numerics_rows(_ctx(CPU, "4ea1000000001", "2025-06-01T08:00:05+00:00"), fail_mm_bf16=False)
    (tmp_path / "healthy").mkdir()
    write_csv(selftest, tmp_path / "results.csv")
    write_csv(healthy, tmp_path / "healthy" / "results.csv")
    html = render_html(load_inputs([tmp_path / "results.csv", tmp_path / "healthy" / "results.csv"]))
    page = page_of(html)
    # first among the suite sections, and in the summary
    assert [s for s in page.sections if s.startswith("suite-")] == ["suite-selftest", "suite-numerics"]
    assert list(_summary_by_suite(page)) == ["Self-test", "Numerics"]
    text = " ".join(" ".join(page.text).split())
    assert ("Healthy device (cpu): 0 false failures; faults caught: 2 of 4 (not caught: stuck_bit; "
            "did not finish: mypkg.faults:dropout).") in text
    [matrix] = page.table("selftest")
    header, *body = matrix["rows"]
    checks = ["numerics.op_error_vs_fp64", "soft_errors.abft_detection_rate", "correctness.output_matches_reference"]
    assert header == ["qualification run", "status", "failed checks", *checks, "run time (s)"]
    grid = {r[0]: r for r in body}
    assert [r[0] for r in body] == ["healthy", "bitflip_mm", "nan_softmax", "stuck_bit", "mypkg.faults:dropout"]
    assert grid["healthy"] == ["healthy", "pass", "0", "", "", "", "10.5"]
    assert grid["bitflip_mm"] == ["bitflip_mm", "pass", "4", "3", "1", "", "11.5"]
    assert grid["nan_softmax"] == ["nan_softmax", "pass", "3", "1", "", "2", "12.5"]
    assert grid["stuck_bit"] == ["stuck_bit", "fail", "0", "", "", "", "13.5"]  # not caught: a failure
    assert grid["mypkg.faults:dropout"] == ["mypkg.faults:dropout", "error", "", "", "", "", "14.5"]
    assert matrix["row_classes"][1:] == ["row-pass", "row-pass", "row-pass", "row-fail", "row-error"]
    # the fault not caught leads the failures, with what reproduces it
    fail_html = html[html.index('id="failures"'): html.index('id="summary"')]
    assert fail_html.index("stuck_bit") < fail_html.index("mypkg.faults:dropout")
    assert f"{SELFTEST_REPRO} --inject stuck_bit -o OUT" in fail_html
    assert 'id="verdict">FAIL<' in html


def test_selftest_healthy_false_failures_show_in_its_row(tmp_path: Path):
    df = selftest_rows(_ctx(CPU, "5e1f00000001", "2025-06-01T08:00:00+00:00"), false_failures=2)
    df = df[(df["check"] != "fault_caught") | (df["status"] == "pass")]  # every fault caught
    html = render_html(df)
    rows = {r[0]: r for r in page_of(html).table("selftest")[0]["rows"][1:]}
    assert rows["healthy"][:4] == ["healthy", "fail", "2", "2"]
    assert '<td class="num false-hit"' in html and 'class="note selftest-verdict bad"' in html
    assert "Healthy device (cpu): 2 false failures; faults caught: 2 of 2." in html
    good = selftest_rows(_ctx(CPU, "5e1f00000001", "2025-06-01T08:00:00+00:00"))
    good = good[(good["check"] != "fault_caught") | (good["status"] == "pass")]
    assert 'class="note selftest-verdict good"' in render_html(good)
    assert verdict_of(good) == "PASS"


# ----------------------------------------------------------------------------------------------
# paired rounds of a replay (summary.json "timing")


def _paired_replay_dir(folder: Path, *, kind: str) -> Path:
    """A replay folder like `mystique replay` writes: results.csv (with per-op rows nested under the
    workload's subject) and a summary.json whose timing is paired (20 rounds) or recorded."""
    ctx = _ctx(CPU, "p1", "2025-05-01T10:00:00+00:00")
    folder.mkdir(parents=True)
    rows = Results(ctx, "replay")
    rows.add("replay_step_time_ratio", "dlrm/debug/infer", "ratio", 1.02, status="pass")
    rows.add("replay_op_time_error", "dlrm/debug/infer/aten::linear", "abs_error", 0.1, status="info")
    write_csv(rows.frame(), folder / "results.csv")
    original = [1.0 + 0.01 * (i % 5) for i in range(20)]
    replay = [o * (1.0 + 0.004 * ((i * 7) % 11 - 5)) for i, o in enumerate(original)]
    ratios = [a / b for a, b in zip(replay, original)]
    summary = {"ops_total": 29, "ops_replayed": 29, "coverage": 1.0, "coverage_by_time": 1.0,
               "original_step_ms": 1.02, "replay_step_ms": 1.03, "ratio_kind": kind}
    if kind == "paired":
        summary.update(ratio=1.004, ratio_low=0.992, ratio_high=1.012, half_width=0.01, verdict="pass",
                       timing={"kind": "paired", "rounds": 20, "replay_ms": replay, "original_ms": original,
                               "ratios": ratios, "half_width": 0.01, "stop": "half-width", "warmup_rounds": 4,
                               "clock": "thread_cpu", "threads": 2, "pacing": "none"})
    else:
        summary.update(ratio=0.87, ratio_low=None, ratio_high=None, verdict=None,
                       timing={"kind": "recorded", "why_not_paired": "the original model is not importable here",
                               "replay_ms": [1.0] * 5, "clock": "wall", "threads": 2})
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def _figures(html: str) -> list[str]:
    return re.findall(r'<figure class="chart">.*?</figure>', html, flags=re.S)


def test_paired_replay_charts_its_rounds(tmp_path: Path):
    html = render_html(load_inputs([_paired_replay_dir(tmp_path / "r", kind="paired")]))
    page = page_of(html)
    assert not page.problems
    figs = [f for f in _figures(html) if "Paired rounds of dlrm/debug/infer" in f]
    assert len(figs) == 1
    svg = figs[0]
    uid = re.search(r'id="(c\d+)-rounds"', svg)[1]
    points = svg[svg.index(f'id="{uid}-rounds"'):]
    assert points[: points.index("</g>")].count("<use") == 20  # one marker per round
    for part in ("median", "interval", "band"):
        assert f'id="{uid}-{part}"' in svg, part
    caption = re.search(r"<figcaption>(.*?)</figcaption>", svg, flags=re.S)[1]
    assert caption.startswith(
        "dlrm/debug/infer: 20 paired rounds (warm-up 4), ratio 1.004 [0.992, 1.012], verdict pass, "
        "stopped: half-width, clock thread_cpu, 2 threads."
    )
    assert "0.90-1.10 verdict band" in caption
    assert "is recorded" not in html
    # the per-op subjects nested under the workload do not split its fidelity row
    _head, *fid = page.table("fidelity")[0]["rows"]
    assert [r[0] for r in fid] == ["dlrm/debug/infer"] and "29 / 29" in fid[0]


def test_recorded_replay_notes_its_ratio_without_a_chart(tmp_path: Path):
    html = render_html(load_inputs([_paired_replay_dir(tmp_path / "r", kind="recorded")]))
    assert not page_of(html).problems
    assert not any("Paired rounds" in f for f in _figures(html))
    assert ("dlrm/debug/infer: ratio 0.870 is recorded (replay against the step time the trace recorded), "
            "not paired (the original model is not importable here); no interval, no verdict.") in html


def test_a_failures_reproduce_line_is_the_command_its_detail_ends_with():
    """Issue 19.5: a replay failure's reproduce line was its description ("replay 25.321 ms / ...")."""
    from mystique.results import Results, RunContext

    res = Results(RunContext(device="cpu", device_name="x", torch_version="2"), "replay")
    res.add("replay_step_time_ratio", "tiny", "ratio", 1.4, threshold=1.1, status="fail",
            detail="replay 25.321 ms / original 22.891 ms; seed 0; reproduce: mystique replay BENCH -o OUT --seed 0")
    res.add("replay_coverage", "tiny", "coverage", 0.5, threshold=1.0, status="fail", detail="half the ops")
    html = render_html(res.frame())
    fail_html = html[html.index('id="failures"'): html.index('id="summary"')]
    assert 'reproduce:</span> <code>mystique replay BENCH -o OUT --seed 0</code>' in fail_html
    assert "<code>replay 25.321 ms" not in fail_html
    assert "<code>(no command recorded; detail: half the ops)</code>" in fail_html
