"""The report's figures, drawn with matplotlib and returned as inline SVG strings.

Why matplotlib (its SVG backend): it renders offline with no JavaScript and no network, so the
HTML report stays one self-contained file that any browser shows as is; its SVG output is
deterministic once the hash salt and the date metadata are fixed (set below), so the same
report.json always gives the same page; and it is the maintained, widely reviewed library for
axes, tick formatting and legends, which the hand-written SVG got wrong (labels like
`6.21e+04`, a bar chart on a 0..1 axis). Vega-Lite would need vl-convert's bundled JS engine
to render offline for the same result.

Every function takes small typed inputs (below), draws on its own Figure (no pyplot global
state) and returns `<svg ...>...</svg>` text with its title in `aria-label`.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Figures are built on matplotlib.figure.Figure, never through pyplot: no GUI backend, no global
# figure registry, nothing to close; savefig(format="svg") uses the SVG canvas directly.
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, ScalarFormatter

WIDTH_IN, HEIGHT_IN = 7.5, 3.6
# Tableau's ten colours (matplotlib's default cycle); a fleet keeps one colour in every figure.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

Interval = tuple[float | None, float | None]  # a 95% interval; None: that end is unbounded or unknown


@dataclass(frozen=True)
class LatencyCdf:
    """One fleet's latency CDF from its records, with the fleet P95 and its 95% interval."""

    fleet: str
    points: Sequence[tuple[float, float]]  # (latency s, cumulative fraction of requests)
    p95_s: float | None
    p95_ci_s: Interval | None


@dataclass(frozen=True)
class GoodputSteps:
    """One fleet's successful output tokens/s per time step (rate_steps)."""

    fleet: str
    steps: Sequence[
        tuple[float, float, float]
    ]  # (step start s, step length s, successful output tokens/s over the step)


def rate_steps(
    points: Sequence[tuple[float, float]], bin_s: float, bins_per_step: int
) -> list[tuple[float, float, float]]:
    """Equal bins of a rate, (bin start, rate), merged `bins_per_step` at a time into (step start,
    step length, rate over the step): each step's tokens over its length, so the tokens are kept.
    The series ends with the last completion, so a last step the bins do not fill is padded with
    empty bins (nothing completed there) rather than shortened: a short step would show the last
    few requests as a spike."""
    k = max(1, bins_per_step)
    return [(points[i][0], k * bin_s, sum(y for _, y in points[i : i + k]) / k) for i in range(0, len(points), k)]


@dataclass(frozen=True)
class CostBar:
    fleet: str
    usd_per_million: float
    interval: Interval | None


@dataclass(frozen=True)
class Payback:
    """Cumulative net savings per month after cut-over (-migration cost + months x monthly delta)."""

    curve: Sequence[tuple[float, float]]
    low: Sequence[tuple[float, float]] | None  # the same curve at the monthly delta's 95% interval ends
    high: Sequence[tuple[float, float]] | None
    migration_cost_usd: float
    payback_months: float | None
    horizon_months: float | None


@dataclass(frozen=True)
class SensitivityBar:
    label: str
    value: float  # the cell's monthly delta (USD)
    interval: Interval | None
    decision: str


@dataclass(frozen=True)
class SearchPoint:
    multiplier: float
    verdict: str  # held / missed / short / invalid


@dataclass(frozen=True)
class SearchTrack:
    fleet: str
    steps: Sequence[SearchPoint]
    held_multiplier: float | None


@dataclass(frozen=True)
class CapacityPoint:
    multiplier: float
    per_instance_tok_s: float
    slo_pass: bool
    chosen: bool


def fleet_colours(fleets: Sequence[str]) -> dict[str, str]:
    """Colour by sorted name, so a fleet has the same colour in every figure of a report."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(set(fleets)))}


def si(v: float, _pos: object = None) -> str:
    """Tick label with k / M for thousands / millions ('62.5k', not '6.25e+04'), plain below 1,000."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.4g}M"
    if a >= 1e3:
        return f"{v / 1e3:.4g}k"
    return f"{v:.4g}"


def _two_and_five(v: float, _pos: object = None) -> str:
    """Minor tick label on a log axis: 0.2, 0.5, 2, 5... labelled, the other minor ticks not."""
    if v <= 0:
        return ""
    lead = v / 10 ** math.floor(math.log10(v))
    return si(v) if round(lead, 6) in (2.0, 5.0) else ""


def _plain(ax_axis: object) -> None:
    """Plain decimal ticks: no offset, no scientific notation."""
    fmt = ScalarFormatter(useOffset=False)
    fmt.set_scientific(False)
    ax_axis.set_major_formatter(fmt)  # type: ignore[attr-defined]


def _figure(height_in: float = HEIGHT_IN, *, fit_labels: bool = False) -> tuple[Figure, Axes]:
    """A figure with one axes. Its margins are fixed (the tick labels are short: '100%', '1.75k',
    'x0.5'), except with `fit_labels` (category labels of any length on the y axis), where
    constrained layout sizes them: it draws the figure twice, doubling the render time."""
    fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained" if fit_labels else None)
    if not fit_labels:
        fig.subplots_adjust(left=0.1, right=0.97, bottom=0.55 / height_in, top=1 - 0.32 / height_in)
    ax = fig.add_subplot()
    ax.grid(True, color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    return fig, ax


def to_svg(fig: Figure, title: str, key: str) -> str:
    """The figure as an `<svg>` element: no XML prolog or DOCTYPE, no creator URL or date, text as text.

    `key` salts the ids matplotlib gives clip paths, so two figures inlined in one page never
    share an id, and the same figure always gets the same ones."""
    buf = io.StringIO()
    with rc_context({"svg.hashsalt": f"inf2-vs-g6:{key}", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Title": title})
    text = buf.getvalue()
    svg = re.sub(
        r"\s*<metadata>.*?</metadata>", "", text[text.index("<svg") :], count=1, flags=re.S
    )  # namespace URLs only
    # matplotlib numbers its element ids per figure (figure_1, axes_1, ...): prefix them, and every
    # reference to them, so the ids stay unique in a page that inlines several figures.
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{slug}-\1"', svg)
    svg = re.sub(r'(href="#|url\(#)([^")]+)', rf"\1{slug}-\2", svg)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{_attr(title)}" ', 1)


def _attr(s: str) -> str:
    return s.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def _ends(iv: Interval | None, lo_default: float, hi_default: float) -> tuple[float, float]:
    low, high = iv if iv else (None, None)
    return (lo_default if low is None else low), (hi_default if high is None else high)


def latency_cdf(title: str, xlabel: str, cdfs: Sequence[LatencyCdf], slo_s: float) -> str:
    """Per fleet: the CDF, its P95 with the 95% interval as a band at the 95% line, and the SLO's P95 target.

    The x axis is logarithmic when the latencies span more than a decade (a saturated fleet's
    tail would squash the other fleet's curve into the first tick), linear otherwise."""
    fig, ax = _figure()
    colours = fleet_colours([c.fleet for c in cdfs])
    xs = [x for c in cdfs for x, _ in c.points if x > 0] + [slo_s]
    log = min(xs) > 0 and max(xs) / min(xs) > 10
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(si))
        # A span of one or two decades has one or two powers of ten on it: label 2x and 5x too.
        ax.xaxis.set_minor_formatter(FuncFormatter(_two_and_five))
    else:
        _plain(ax.xaxis)
    right = max(xs) * (1.15 if log else 1.05)
    for c in cdfs:
        col = colours[c.fleet]
        if c.points:
            ax.step(
                [x for x, _ in c.points],
                [y for _, y in c.points],
                where="post",
                color=col,
                linewidth=1.8,
                label=c.fleet,
            )
        if c.p95_s is not None:
            low, high = _ends(c.p95_ci_s, c.p95_s, right)
            open_end = " (upper end unbounded)" if c.p95_ci_s and c.p95_ci_s[1] is None else ""
            # A band at the P95's own height, not a full-height span: two fleets' intervals (an
            # unbounded one reaches the right edge) would otherwise cover each other's curves.
            ax.fill_between([low, high], 0.93, 0.97, color=col, alpha=0.25, linewidth=0)
            ax.errorbar(
                [c.p95_s],
                [0.95],
                xerr=[[c.p95_s - low], [high - c.p95_s]],
                fmt="o",
                color=col,
                capsize=3,
                markersize=4,
                label=f"{c.fleet} P95 {si(c.p95_s)} s, 95% CI [{si(low)}, {'∞' if open_end else si(high)}]",
            )
    ax.axvline(slo_s, color="#333333", linestyle="--", linewidth=1.2, label=f"SLO: P95 ≤ {si(slo_s)} s")
    ax.axhline(0.95, color="#999999", linestyle=":", linewidth=1)
    ax.set_xlim(right=right)
    ax.set_ylim(0, 1.02)
    ax.set(title=title, xlabel=xlabel, ylabel="fraction of requests")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.0%}"))
    ax.legend(fontsize=8, loc="lower right")
    return to_svg(fig, title, title)


def goodput_over_time(title: str, series: Sequence[GoodputSteps], window_end_s: float | None = None) -> str:
    """SLO-compliant output tokens/s per fleet and time step (by completion time), fleets side by side
    in each step; steps after `window_end_s` hold the drain (requests sent in the window that
    completed after it), shaded."""
    fig, ax = _figure()
    colours = fleet_colours([s.fleet for s in series])
    n = max(len(series), 1)
    right = max((x + w for s in series for x, w, _ in s.steps), default=1.0)
    left = min((x for s in series for x, _, _ in s.steps), default=0.0)
    for i, s in enumerate(series):
        col = colours[s.fleet]
        if s.steps:
            ax.bar(
                [x + w * i / n for x, w, _ in s.steps],
                [y for _, _, y in s.steps],
                width=[w / n for _, w, _ in s.steps],
                align="edge",
                color=col,
                alpha=0.85,
                label=s.fleet,
            )
    if window_end_s is not None and window_end_s < right:
        ax.axvspan(
            window_end_s,
            right,
            color="#888888",
            alpha=0.12,
            linewidth=0,
            label="drain: sent in the window, completed after it",
        )
    ax.set_xlim(left, right)
    ax.set(title=title, xlabel="run time (s)", ylabel="successful output tokens/s")
    top = max((y for s in series for _, _, y in s.steps), default=0.0)
    ax.set_ylim(0, top * 1.25 or 1.0)  # headroom: the legend sits above the bars
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    _plain(ax.xaxis)
    ax.legend(fontsize=8, loc="upper left", ncols=3)
    return to_svg(fig, title, title)


def cost_per_million(title: str, bars: Sequence[CostBar]) -> str:
    """One horizontal bar per fleet from zero, with its 95% interval as a whisker and the value written beside it."""
    fig, ax = _figure(max(1.6, 0.55 * len(bars) + 1.2), fit_labels=True)
    colours = fleet_colours([b.fleet for b in bars])
    top = max([b.usd_per_million for b in bars] + [h for b in bars if b.interval for h in b.interval if h is not None])
    for i, b in enumerate(bars):
        ax.barh(i, b.usd_per_million, color=colours[b.fleet], height=0.55)
        text = f"{si(b.usd_per_million)} USD"
        if b.interval:
            low, high = _ends(b.interval, b.usd_per_million, b.usd_per_million)
            ax.errorbar(
                [b.usd_per_million],
                [i],
                xerr=[[b.usd_per_million - low], [high - b.usd_per_million]],
                fmt="none",
                ecolor="#222222",
                capsize=4,
            )
            text += f"  (95% CI {si(low) if b.interval[0] is not None else 'unknown'}–{si(high) if b.interval[1] is not None else 'unknown'})"
        right = max([b.usd_per_million] + [h for h in (b.interval or ()) if h is not None])
        ax.text(right + top * 0.03, i, text, fontsize=8, va="center")
    ax.set_yticks(range(len(bars)), [b.fleet for b in bars])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.45)
    ax.xaxis.set_major_formatter(FuncFormatter(si))
    ax.set(title=title, xlabel="USD per 1M successful output tokens")
    return to_svg(fig, title, title)


def payback(title: str, p: Payback) -> str:
    """Cumulative net savings over the months after cut-over, with the monthly delta's interval shaded,
    break-even at zero, the payback month and the horizon marked."""
    fig, ax = _figure()
    months = [x for x, _ in p.curve]
    ax.plot(months, [y for _, y in p.curve], color="#1f77b4", linewidth=1.8, label="cumulative net savings")
    if p.low and p.high:
        ax.fill_between(
            months,
            [y for _, y in p.low],
            [y for _, y in p.high],
            color="#1f77b4",
            alpha=0.15,
            linewidth=0,
            label="95% CI of the monthly delta",
        )
    ax.axhline(0, color="#333333", linewidth=1)
    ax.axhline(
        -p.migration_cost_usd,
        color="#d62728",
        linestyle=":",
        linewidth=1.2,
        label=f"migration cost {si(p.migration_cost_usd)} USD",
    )
    if p.payback_months is not None and months and p.payback_months <= months[-1]:
        ax.plot(
            [p.payback_months],
            [0],
            marker="o",
            color="#2ca02c",
            linestyle="none",
            label=f"payback {p.payback_months:.1f} months",
        )
    if p.horizon_months is not None:
        ax.axvline(
            p.horizon_months,
            color="#555555",
            linestyle="--",
            linewidth=1.2,
            label=f"horizon {p.horizon_months:g} months",
        )
    ax.set(title=title, xlabel="months after cut-over", ylabel="USD")
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.legend(fontsize=8, loc="best")
    return to_svg(fig, title, title)


def sensitivity_tornado(title: str, base: float, bars: Sequence[SensitivityBar]) -> str:
    """One bar per cell from the base (manifest) monthly delta to the cell's, widest swing on top,
    with the cell's 95% interval and its decision. Only cells with a figure are drawn: the caller
    lists the others (not measured, no commitment) beside the figure."""
    rows = sorted(bars, key=lambda b: abs(b.value - base), reverse=True)
    fig, ax = _figure(max(2.0, 0.34 * len(rows) + 1.3), fit_labels=True)
    for i, b in enumerate(rows):
        colour = "#2ca02c" if b.value >= base else "#d62728"
        ax.barh(i, b.value - base, left=base, color=colour, height=0.6, alpha=0.85)
        ax.plot([b.value], [i], marker="|", markersize=12, color=colour)  # a cell equal to the base still shows
        if b.interval and b.interval[0] is not None and b.interval[1] is not None:
            ax.errorbar(
                [b.value],
                [i],
                xerr=[[b.value - b.interval[0]], [b.interval[1] - b.value]],
                fmt="none",
                ecolor="#222222",
                capsize=2,
                linewidth=0.8,
            )
        ax.text(1.01, i, b.decision, transform=ax.get_yaxis_transform(), fontsize=8, va="center")
    ax.axvline(base, color="#333333", linewidth=1.2, label=f"base (manifest) {si(base)} USD/month")
    ax.axvline(0, color="#999999", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)), [b.label for b in rows], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(si))
    ax.set(title=title, xlabel="monthly delta, baseline - candidate (USD; > 0: the candidate saves)")
    ax.legend(fontsize=8, loc="lower right")
    return to_svg(fig, title, title)


VERDICT_MARKERS = {"held": ("o", True), "missed": ("X", True), "short": ("s", False), "invalid": ("D", False)}


def search_path(title: str, tracks: Sequence[SearchTrack]) -> str:
    """Each fleet's capacity search step by step: the multiplier tried (log2 axis), the marker its
    verdict, and the highest multiplier that held below the lowest miss as a dotted line."""
    fig, ax = _figure()
    colours = fleet_colours([t.fleet for t in tracks])
    for k, t in enumerate(tracks):
        col = colours[t.fleet]
        dodge = 0.08 * (
            k - (len(tracks) - 1) / 2
        )  # fleets that tried the same multiplier at the same step stay visible
        xs = [i + dodge for i in range(1, len(t.steps) + 1)]
        ax.plot(xs, [s.multiplier for s in t.steps], color=col, linewidth=1.2, label=t.fleet)
        for x, s in zip(xs, t.steps, strict=True):
            marker, filled = VERDICT_MARKERS.get(s.verdict, ("o", False))
            ax.plot(
                [x],
                [s.multiplier],
                marker=marker,
                markersize=7,
                color=col,
                markerfacecolor=col if filled else "white",
                linestyle="none",
            )
        if t.held_multiplier is not None:
            ax.axhline(
                t.held_multiplier,
                color=col,
                linestyle=":",
                linewidth=1,
                label=f"{t.fleet} held up to x{t.held_multiplier:.4g}",
            )
    for verdict, (marker, filled) in VERDICT_MARKERS.items():
        ax.plot(
            [],
            [],
            marker=marker,
            color="#555555",
            markerfacecolor="#555555" if filled else "white",
            linestyle="none",
            label=verdict,
        )
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"x{v:.4g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))
    steps = max((len(t.steps) for t in tracks), default=1)
    ax.set_xticks(range(1, steps + 1))
    ax.set(title=title, xlabel="search step", ylabel="offered rate (x the manifest's)")
    ax.legend(fontsize=8, loc="best", ncols=2)
    return to_svg(fig, title, title)


def capacity_steps(title: str, fleets: Mapping[str, Sequence[CapacityPoint]]) -> str:
    """Per-instance SLO-compliant goodput against the offered rate: filled where the step held the
    fleet SLO, hollow where it missed, a star on the step chosen as the capacity."""
    fig, ax = _figure()
    colours = fleet_colours(list(fleets))
    for name, pts in fleets.items():
        col = colours[name]
        ordered = sorted(pts, key=lambda p: p.multiplier)
        ax.plot(
            [p.multiplier for p in ordered],
            [p.per_instance_tok_s for p in ordered],
            color=col,
            linewidth=1.2,
            label=name,
        )
        for p in ordered:
            ax.plot(
                [p.multiplier],
                [p.per_instance_tok_s],
                marker="*" if p.chosen else "o",
                markersize=12 if p.chosen else 6,
                color=col,
                markerfacecolor=col if p.slo_pass else "white",
                linestyle="none",
            )
    ax.plot([], [], marker="o", color="#555555", linestyle="none", label="held the SLO")
    ax.plot([], [], marker="o", color="#555555", markerfacecolor="white", linestyle="none", label="missed the SLO")
    ax.plot([], [], marker="*", color="#555555", markersize=12, linestyle="none", label="chosen capacity")
    mults = [p.multiplier for pts in fleets.values() for p in pts]
    if mults and min(mults) > 0 and max(mults) / min(mults) > 4:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"x{v:.4g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"x{v:.4g}"))
    top = max((p.per_instance_tok_s for pts in fleets.values() for p in pts), default=0.0)
    ax.set_ylim(0, top * 1.15 or 1.0)  # headroom: the chosen step's star is often the highest point
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.set(title=title, xlabel="offered rate (x the manifest's)", ylabel="SLO-compliant tok/s per instance")
    ax.legend(fontsize=8, loc="best", ncols=2)
    return to_svg(fig, title, title)


def finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)
