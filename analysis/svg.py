"""Minimal inline-SVG charts (line, bar, tornado): no network, no CDN, no plotting library."""

from __future__ import annotations

import html
from collections.abc import Sequence

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 300, 70, 20, 30, 45
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def _scale(v: float, lo: float, hi: float, a: float, b: float) -> float:
    return a if hi == lo else a + (v - lo) * (b - a) / (hi - lo)


def _frame(title: str, xlabel: str, ylabel: str, xlo: float, xhi: float, ylo: float, yhi: float) -> list[str]:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{_esc(title)}">',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{_esc(title)}</text>',
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#333"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#333"/>',
        f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="12">{_esc(xlabel)}</text>',
        f'<text x="14" y="{H / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 {H / 2})">{_esc(ylabel)}</text>',
    ]
    for i in range(5):
        xv = xlo + (xhi - xlo) * i / 4
        yv = ylo + (yhi - ylo) * i / 4
        x = _scale(xv, xlo, xhi, PAD_L, W - PAD_R)
        y = _scale(yv, ylo, yhi, H - PAD_B, PAD_T)
        out.append(f'<text x="{x:.1f}" y="{H - PAD_B + 15}" text-anchor="middle" font-size="10">{xv:.3g}</text>')
        out.append(f'<text x="{PAD_L - 5}" y="{y + 3:.1f}" text-anchor="end" font-size="10">{yv:.3g}</text>')
    return out


def line_chart(
    title: str, xlabel: str, ylabel: str, series: dict[str, Sequence[tuple[float, float]]], *,
    vlines: Sequence[tuple[float, str]] = (), hlines: Sequence[tuple[float, str]] = (),
) -> str:
    pts = [p for s in series.values() for p in s]
    xs = [p[0] for p in pts] + [v for v, _ in vlines]
    ys = [p[1] for p in pts] + [v for v, _ in hlines]
    if not pts:
        return f"<p>{_esc(title)}: no data</p>"
    xlo, xhi, ylo, yhi = min(xs), max(xs), min(min(ys), 0.0), max(ys)
    out = _frame(title, xlabel, ylabel, xlo, xhi, ylo, yhi)
    order = sorted(series)  # colour by name, so a fleet has one colour in every chart
    for i, (name, s) in enumerate(series.items()):
        c = PALETTE[order.index(name) % len(PALETTE)]
        path = " ".join(f"{_scale(x, xlo, xhi, PAD_L, W - PAD_R):.1f},{_scale(y, ylo, yhi, H - PAD_B, PAD_T):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{path}"/>')
        out.append(f'<text x="{W - PAD_R - 5}" y="{PAD_T + 14 * (i + 1)}" text-anchor="end" font-size="11" fill="{c}">{_esc(name)}</text>')
    for v, label in vlines:
        x = _scale(v, xlo, xhi, PAD_L, W - PAD_R)
        out.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" stroke="#555" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x + 3:.1f}" y="{PAD_T + 10}" font-size="10">{_esc(label)}</text>')
    for v, label in hlines:
        y = _scale(v, ylo, yhi, H - PAD_B, PAD_T)
        out.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="#555" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{PAD_L + 4}" y="{y - 3:.1f}" font-size="10">{_esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(title: str, ylabel: str, bars: Sequence[tuple[str, float]]) -> str:
    if not bars:
        return f"<p>{_esc(title)}: no data</p>"
    yhi = max(v for _, v in bars) or 1.0
    out = _frame(title, "", ylabel, 0, 1, 0, yhi)
    bw = (W - PAD_L - PAD_R) / (len(bars) * 1.5)
    order = sorted(name for name, _ in bars)
    for i, (name, v) in enumerate(bars):
        x = PAD_L + bw * 0.5 + i * bw * 1.5
        y = _scale(v, 0, yhi, H - PAD_B, PAD_T)
        c = PALETTE[order.index(name) % len(PALETTE)]
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{H - PAD_B - y:.1f}" fill="{c}"/>')
        out.append(f'<text x="{x + bw / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" font-size="11">{_esc(name)}: {v:.4g}</text>')
    out.append("</svg>")
    return "\n".join(out)


def tornado_chart(title: str, xlabel: str, rows: Sequence[tuple[str, float, float, float]]) -> str:
    """rows: (label, low, high, base), widest first."""
    if not rows:
        return f"<p>{_esc(title)}: no data</p>"
    lo = min(r[1] for r in rows)
    hi = max(r[2] for r in rows)
    base = rows[0][3]
    h = PAD_T + PAD_B + 26 * len(rows)
    left, right = 150, W - PAD_R
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="{_esc(title)}">',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{_esc(title)}</text>',
        f'<text x="{(left + right) / 2}" y="{h - 8}" text-anchor="middle" font-size="12">{_esc(xlabel)}</text>',
    ]
    for i, (label, a, b, _) in enumerate(rows):
        y = PAD_T + 26 * i
        x0, x1 = _scale(a, lo, hi, left, right), _scale(b, lo, hi, left, right)
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end" font-size="11">{_esc(label)}</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1):.1f}" height="18" fill="#1f77b4"/>')
        out.append(f'<text x="{x1 + 3:.1f}" y="{y + 15}" font-size="10">{a:.4g} .. {b:.4g}</text>')
    xb = _scale(base, lo, hi, left, right)
    out.append(f'<line x1="{xb:.1f}" y1="{PAD_T}" x2="{xb:.1f}" y2="{h - PAD_B + 5}" stroke="#d62728"/>')
    out.append(f'<text x="{xb + 3:.1f}" y="{h - PAD_B + 15}" font-size="10" fill="#d62728">base {base:.4g}</text>')
    out.append("</svg>")
    return "\n".join(out)
