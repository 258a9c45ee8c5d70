"""The HTML report: one self-contained page from results.csv files. Never imports torch.

- :func:`render_report` reads results.csv files (or folders of them, with the ops.csv and
  summary.json that replay runs leave beside them) and writes one self-contained report.html.
- :func:`render_html` is the pure part: :class:`ReportInputs` in, the page's markup out.
- :func:`load_inputs` reads and validates the files (through :func:`mystique.results.read_csv`).

Where things live: :mod:`.inputs` (reading), :mod:`.tables` (counts, runs, comparisons),
:mod:`.html` (page assembly), :mod:`.sections` (one module per suite: a new suite's section is one
module there and one entry in its ``SECTIONS``), :mod:`.blocks` (cells and tables), :mod:`.charts`
(inline SVG), ``templates/`` (markup and style).

Statuses as shown: ``pass``, ``fail``, ``error``, ``skip`` as they are; ``inconclusive`` (a timing
interval straddling its band) counts as not passing, with its own colour and label, and is listed
among the failures; ``info`` rows are measurements, shown and counted apart, never as passed checks.
The verdict (:func:`verdict_of`): NO RESULTS, FAIL, INCONCLUSIVE (only inconclusive rows are bad),
NOTHING CHECKED (every row skipped or a measurement) or PASS.
"""

from .html import render_html, render_report
from .inputs import ReplayArtifacts, ReportInputs, load_inputs, read_ops, read_summary
from .sections.selftest import failed_checks
from .tables import compare_runs, runs, status_counts, verdict_of, wilson_interval

__all__ = [
    "ReplayArtifacts",
    "ReportInputs",
    "compare_runs",
    "failed_checks",
    "load_inputs",
    "read_ops",
    "read_summary",
    "render_html",
    "render_report",
    "runs",
    "status_counts",
    "verdict_of",
    "wilson_interval",
]
