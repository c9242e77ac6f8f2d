"""analysis/report/render/plots.py: readable ticks, self-contained and reproducible SVG."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from analysis.report.render import plots

ROOT = Path(__file__).resolve().parents[2]


def _texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_si_ticks() -> None:
    assert [plots.si(v) for v in (62_100.0, -1_500_000.0, 0.35, 2.0, 1_000.0, 0.0)] == [
        "62.1k",
        "-1.5M",
        "0.35",
        "2",
        "1k",
        "0",
    ]


def _cost() -> str:
    return plots.cost_per_million(
        "Cost", [plots.CostBar("inf2", 0.35, (0.3, 0.41)), plots.CostBar("g6", 62_100.0, (None, 70_000.0))]
    )


def test_axes_never_show_scientific_notation_and_cost_bars_start_at_zero() -> None:
    svg = _cost()
    labels = _texts(svg)
    assert not any("e+" in t or "e-" in t for t in labels), labels
    assert "0" in labels and any(t.endswith("k") for t in labels)  # an x axis from zero, in thousands
    cdf = plots.latency_cdf(
        "TTFT",
        "TTFT (s)",
        [plots.LatencyCdf("g6", [(0.01 * i, i / 50) for i in range(1, 51)], 0.48, (0.45, None))],
        2.0,
    )
    assert "g6 P95 0.48 s, 95% CI [0.45, ∞]" in _texts(cdf)  # an unbounded end says so
    assert "SLO: P95 ≤ 2 s" in _texts(cdf)


def test_svg_is_bare_deterministic_and_ids_are_prefixed_per_figure() -> None:
    a, b = _cost(), _cost()
    assert a == b
    assert (
        a.startswith('<svg role="img" aria-label="Cost" ')
        and "<?xml" not in a
        and "<metadata>" not in a
        and "Matplotlib v" not in a
    )
    ids = re.findall(r'\bid="([^"]+)"', a)
    assert ids and all(i.startswith("cost-") for i in ids)
    other = plots.cost_per_million("Other", [plots.CostBar("inf2", 0.35, None)])
    assert not set(ids) & set(re.findall(r'\bid="([^"]+)"', other))


def test_same_figure_in_a_fresh_process_is_byte_identical() -> None:
    code = "from tests.analysis.test_plots import _cost; import sys; sys.stdout.write(_cost())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out == _cost()


def test_tornado_orders_by_swing_and_shows_a_cell_equal_to_the_base() -> None:
    bars = [
        plots.SensitivityBar("small", 1_100.0, None, "go"),
        plots.SensitivityBar("big", -500.0, (-900.0, -100.0), "reject"),
        plots.SensitivityBar("same", 1_000.0, None, "go"),
    ]
    svg = plots.sensitivity_tornado("T", 1_000.0, bars)
    labels = _texts(svg)
    assert labels.index("big") < labels.index("small") < labels.index("same")
    assert "reject" in labels and "base (manifest) 1k USD/month" in labels


def test_a_log_latency_axis_labels_two_and_five_between_the_decades() -> None:
    # A 30 s run's TTFT axis went from 0.12 to 2.3 s with "1" its only label.
    from analysis.report.render.plots import _two_and_five

    assert [_two_and_five(v) for v in (0.2, 0.3, 0.5, 2.0, 4.0, 5.0, 20.0)] == ["0.2", "", "0.5", "2", "", "5", "20"]
