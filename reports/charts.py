"""Charts as inline SVG strings, drawn with matplotlib's Agg backend.

Each function returns the markup of one ``<svg>`` element ready to be placed in an HTML5 page: no
XML prolog, no namespace URLs, no metadata, text kept as text (``svg.fonttype='none'``) so no
font is embedded or fetched, and element ids prefixed so several charts share one page.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

STATUS_COLORS = {
    "pass": "#2e7d32",
    "fail": "#c62828",
    "inconclusive": "#9a6700",
    "skip": "#9e9e9e",
    "error": "#ef6c00",
    "info": "#37659e",
}
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
)
MAX_BARS = 40
_RC = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def _short(label: str, width: int = 48) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _to_svg(fig: Figure, title: str, uid: str) -> str:
    prefix = f"{uid}-"
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"mystique-{uid}"}):
        fig.savefig(
            buf,
            format="svg",
            bbox_inches="tight",
            metadata={"Creator": None, "Date": None, "Format": None, "Type": None},
        )
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = svg.replace("xlink:href=", "href=")
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m[1]}"', svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m[1]}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m[1]})", svg)
    title_xml = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    svg = svg.replace("<svg", f'<svg class="chart" role="img" aria-label="{title_xml}"', 1)
    return svg.strip()


def _figure(n_rows: int, width: float = 7.5, per_row: float = 0.26, base: float = 1.1):
    """A figure on the Agg canvas (never pyplot: no global state) sized for ``n_rows`` bars."""
    fig = Figure(figsize=(width, base + per_row * max(n_rows, 1)))
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _style(ax) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)


#: a legend to the right of the axes
_LEGEND_RIGHT = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7, "frameon": False}


def _finish(fig: Figure, ax, labels: Sequence[str], *, title: str, xlabel: str, uid: str,
            ylim: tuple[float, float] | None = None, legend: dict | None = None) -> str:
    """The common end of a chart of one row per label: row labels top to bottom (the y axis inverted,
    or set to ``ylim``), axis label, title, ``legend`` (``ax.legend`` arguments), style; the svg."""
    ax.set_yticks(range(len(labels)), [_short(s) for s in labels])
    if ylim is None:
        ax.invert_yaxis()
    else:
        ax.set_ylim(*ylim)
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left")
    if legend is not None:
        ax.legend(**legend)
    _style(ax)
    return _to_svg(fig, title, uid)


def grouped_bars(
    labels: Sequence[str], series: dict[str, Sequence[float]], *, xlabel: str, title: str, uid: str = "c0"
) -> str:
    """Horizontal grouped bars: one group per label, one bar per series (NaN bars left out)."""
    with matplotlib.rc_context(_RC):
        fig, ax = _figure(len(labels) * max(len(series), 1) * 0.6 + 1)
        y = np.arange(len(labels))
        k = max(len(series), 1)
        h = 0.8 / k
        for i, (name, vals) in enumerate(series.items()):
            vals = np.asarray(vals, dtype=float)
            pos = y - 0.4 + h * (i + 0.5)
            ok = np.isfinite(vals)
            bars = ax.barh(pos[ok], vals[ok], height=h, label=name, color=PALETTE[i % len(PALETTE)])
            ax.bar_label(bars, fmt="%.3g", padding=2, fontsize=7)
        legend = {"loc": "lower right", "bbox_to_anchor": (1.0, 1.0), "ncol": len(series), "fontsize": 8,
                  "frameon": False}
        return _finish(fig, ax, labels, title=title, xlabel=xlabel, uid=uid, legend=legend)


def stacked_breakdown(
    bars: dict[str, dict[str, float]], *, xlabel: str, title: str, top: int = 10, uid: str = "c0"
) -> str:
    """Horizontal stacked bars, one per entry of ``bars`` (label -> {category: amount}).

    The ``top`` categories by total amount keep their own colour; the rest are summed as "other".
    """
    totals: dict[str, float] = {}
    for parts in bars.values():
        for cat, v in parts.items():
            if math.isfinite(v):
                totals[cat] = totals.get(cat, 0.0) + v
    cats = [c for c, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:top]]
    has_other = len(totals) > len(cats)
    with matplotlib.rc_context(_RC):
        fig, ax = _figure(len(bars) + 4, per_row=0.32)
        labels = list(bars)
        left = np.zeros(len(labels))
        for i, cat in enumerate([*cats, *(["other"] if has_other else [])]):
            vals = np.array(
                [
                    sum(v for c, v in bars[lab].items() if c not in cats and math.isfinite(v))
                    if cat == "other"
                    else (bars[lab].get(cat, 0.0) if math.isfinite(bars[lab].get(cat, 0.0)) else 0.0)
                    for lab in labels
                ]
            )
            color = "#c7c7c7" if cat == "other" else PALETTE[i % len(PALETTE)]
            ax.barh(labels, vals, left=left, label=_short(cat, 32), color=color, height=0.6)
            left += vals
        return _finish(fig, ax, labels, title=title, xlabel=xlabel, uid=uid, legend=_LEGEND_RIGHT)


def ratio_bars(
    labels: Sequence[str],
    ratios: Sequence[float],
    statuses: Sequence[str],
    *,
    title: str,
    xlabel: str = "value / threshold",
    uid: str = "c0",
) -> str:
    """Horizontal bars of ratios on a log axis with the bound (1) marked; bars coloured by status.

    Zero ratios are drawn at the axis floor; infinite or NaN ratios (an error that overflowed or a
    NaN result) run to the right edge, labelled ``inf`` / ``nan``.
    """
    r = np.asarray(ratios, dtype=float)
    finite = np.isfinite(r)
    positive = r[finite & (r > 0)]
    floor = positive.min() / 2 if len(positive) else 1e-3
    cap = max(10.0, positive.max() * 4 if len(positive) else 10.0)
    shown = np.where(finite, np.where(r > 0, r, floor), cap)
    with matplotlib.rc_context(_RC):
        fig, ax = _figure(len(labels))
        colors = [STATUS_COLORS.get(s, "#607d8b") for s in statuses]
        ax.barh(range(len(labels)), shown, color=colors, height=0.65, left=0)
        for i in np.flatnonzero(~finite):
            ax.text(cap, i, " nan" if np.isnan(r[i]) else " inf", va="center", fontsize=7, color="#c62828")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        lo = min(floor, shown.min() if len(shown) else 1.0) / 1.5
        hi = max(2.0, shown.max() * 1.5 if len(shown) else 2.0)
        ax.set_xlim(lo, hi)
        ax.axvline(1.0, color="#c62828", lw=1.2, ls="--")
        ax.text(1.0, -0.9, " bound", color="#c62828", fontsize=7, va="bottom")
        return _finish(fig, ax, labels, title=title, xlabel=xlabel, uid=uid, ylim=(len(labels) - 0.5, -1.2))


def interval_points(
    labels: Sequence[str],
    values: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    groups: Sequence[str],
    *,
    title: str,
    xlabel: str,
    xlim: tuple[float, float] | None = (0, 1),
    targets: Sequence[float] | None = None,
    uid: str = "c0",
) -> str:
    """Points with asymmetric error bars (``lows``..``highs``), one row per label, coloured by group.

    ``targets`` (NaN where none) are drawn as small vertical ticks.
    """
    v = np.asarray(values, dtype=float)
    lo = np.asarray(lows, dtype=float)
    hi = np.asarray(highs, dtype=float)
    with matplotlib.rc_context(_RC):
        fig, ax = _figure(len(labels))
        y = np.arange(len(labels))
        for i, g in enumerate(dict.fromkeys(groups)):
            m = np.array([x == g for x in groups])
            err = np.vstack([np.clip(v[m] - lo[m], 0, None), np.clip(hi[m] - v[m], 0, None)])
            ax.errorbar(
                v[m],
                y[m],
                xerr=err,
                fmt="o",
                ms=4,
                capsize=3,
                color=PALETTE[i % len(PALETTE)],
                label=_short(g, 40),
            )
        if targets is not None:
            t = np.asarray(targets, dtype=float)
            ok = np.isfinite(t)
            if ok.any():
                ax.scatter(t[ok], y[ok], marker="|", s=120, color="#c62828", label="threshold", zorder=3)
        if xlim:
            ax.set_xlim(xlim[0] - 0.02, xlim[1] + 0.02)
        return _finish(fig, ax, labels, title=title, xlabel=xlabel, uid=uid, ylim=(len(labels) - 0.5, -0.5),
                       legend=_LEGEND_RIGHT)


def ranking_bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    xlabel: str,
    statuses: Sequence[str] | None = None,
    limit: float | None = None,
    uid: str = "c0",
) -> str:
    """Horizontal bars in the given order (largest first is the caller's choice), value labels at the end;
    ``limit``: a dashed vertical line there (the threshold the bars are judged against)."""
    vals = np.asarray(values, dtype=float)
    with matplotlib.rc_context(_RC):
        fig, ax = _figure(len(labels))
        colors = [STATUS_COLORS.get(s, PALETTE[0]) for s in statuses] if statuses else PALETTE[0]
        bars = ax.barh(range(len(labels)), np.nan_to_num(vals), color=colors, height=0.65)
        ax.bar_label(bars, fmt="%.3g", padding=2, fontsize=7)
        if limit is not None and math.isfinite(limit):
            ax.axvline(limit, color=STATUS_COLORS["fail"], lw=1.0, ls="--").set_gid("limit")
        return _finish(fig, ax, labels, title=title, xlabel=xlabel, uid=uid)


def paired_rounds(
    ratios: Sequence[float],
    *,
    median: float,
    low: float,
    high: float,
    band: tuple[float, float],
    replay_ms: Sequence[float] = (),
    original_ms: Sequence[float] = (),
    title: str,
    uid: str = "c0",
) -> str:
    """The paired ratio (replay / original) of each round as points, with the median line, its 95%
    interval (``low``..``high``, shaded) and the verdict ``band`` (dashed edges, lightly shaded).

    With ``replay_ms`` / ``original_ms`` a second, smaller panel below shows both step times per round.
    Element ids ``rounds``, ``median``, ``interval`` and ``band`` (prefixed by ``uid``) mark the parts.
    """
    r = np.asarray(ratios, dtype=float)
    x = np.arange(1, len(r) + 1)
    times = len(replay_ms) > 0 or len(original_ms) > 0
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, 3.9 if times else 2.6))
        FigureCanvasAgg(fig)
        if times:
            ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2], "hspace": 0.12})
        else:
            ax, ax2 = fig.subplots(), None
        b_lo, b_hi = band
        ax.axhspan(b_lo, b_hi, color="#2e7d32", alpha=0.08, lw=0).set_gid("band")
        for edge in (b_lo, b_hi):
            ax.axhline(edge, color="#2e7d32", lw=0.9, ls="--")
        ax.text(1.0, b_hi, f" verdict band {b_lo:g}-{b_hi:g}", transform=ax.get_yaxis_transform(),
                color="#2e7d32", fontsize=7, va="center", ha="left")
        if math.isfinite(low) and math.isfinite(high):
            ax.axhspan(low, high, color=PALETTE[0], alpha=0.22, lw=0, label="95% interval").set_gid("interval")
        if math.isfinite(median):
            ax.axhline(median, color=PALETTE[0], lw=1.4, label=f"median {median:.3g}").set_gid("median")
        ok = np.isfinite(r)
        ms = 3.5 if len(r) <= 100 else 2.0
        (pts,) = ax.plot(x[ok], r[ok], "o", ms=ms, color="#37474f", label="round", zorder=3)
        pts.set_gid("rounds")
        shown = [v for v in (*r[ok], low, high, median) if math.isfinite(v)]
        lo_y = min([b_lo, *shown])
        hi_y = max([b_hi, *shown])
        pad = (hi_y - lo_y) * 0.08 or 0.05
        ax.set_ylim(lo_y - pad, hi_y + pad)
        ax.set_ylabel("replay / original")
        ax.set_title(title, loc="left")
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize=7, frameon=False)
        _style(ax)
        ax.grid(True, axis="y", alpha=0.3)
        if ax2 is not None:
            for i, (name, vals) in enumerate((("replay", replay_ms), ("original", original_ms))):
                v = np.asarray(vals, dtype=float)
                if len(v):
                    ax2.plot(np.arange(1, len(v) + 1), v, "o-", ms=ms * 0.7, lw=0.8, color=PALETTE[i], label=name)
            ax2.set_ylabel("step ms")
            ax2.legend(**_LEGEND_RIGHT)
            _style(ax2)
            ax2.grid(True, axis="y", alpha=0.3)
            ax2.set_xlabel("round")
        else:
            ax.set_xlabel("round")
        (ax2 or ax).xaxis.get_major_locator().set_params(integer=True)
        return _to_svg(fig, title, uid)


def line_series(series: dict[str, tuple[Sequence[float], Sequence[float]]], *, title: str, xlabel: str,
                ylabel: str, uid: str = "c0") -> str:
    """One line per series (``name -> (xs, ys)``) on shared axes, e.g. clocks or power over time."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, 2.6))
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        for i, (name, (xs, ys)) in enumerate(series.items()):
            ax.plot(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), marker=".", ms=3, lw=1,
                    color=PALETTE[i % len(PALETTE)], label=_short(name, 40))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, loc="left")
        ax.legend(**_LEGEND_RIGHT)
        _style(ax)
        return _to_svg(fig, title, uid)
