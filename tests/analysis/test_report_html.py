"""report.html holds everything report.md holds, with matplotlib figures, self-contained."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.analysis.report_pages import FULL_REPORT_FIGURES, PageText


def _md_headings(md: str) -> list[str]:
    return [
        " ".join(line.lstrip("#").replace("**", "").replace("`", "").split())
        for line in md.splitlines()
        if line.startswith("#")
    ]


def _md_cells(md: str) -> list[str]:
    """Every cell of every Markdown table, without its bold / code marks."""
    out = []
    for line in md.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            out += [
                " ".join(c.replace("**", "").replace("`", "").split()) for c in line.strip().strip("|").split(" | ")
            ]
    return [c for c in out if c]


@pytest.mark.parametrize("pages", ["full_pages", "gate_reject_pages"], ids=["full", "gate-reject"])
def test_every_markdown_heading_and_table_cell_is_in_the_html(request: pytest.FixtureRequest, pages: str) -> None:
    _, out = request.getfixturevalue(pages)
    md, page = (out / "report.md").read_text(), PageText((out / "report.html").read_text())
    headings = _md_headings(md)
    assert len(headings) >= 4
    missing = [h for h in headings if h not in page.headings]
    assert not missing, f"Markdown sections missing from the HTML: {missing}"
    cells = set(page.cells)
    absent = [c for c in _md_cells(md) if c not in cells]
    assert not absent, f"Markdown table cells missing from the HTML: {absent[:10]}"


def test_full_report_holds_ledger_placement_sensitivity_reasons_gaps_and_provenance(
    full_pages: tuple[dict[str, Any], Path],
) -> None:
    r, out = full_pages
    page = PageText((out / "report.html").read_text())
    text = page.all_text
    for item in r["migration"]["items_usd"]:
        assert item in page.cells
    for name, f in r["fleets"].items():
        for az, n in f["size"]["per_az"].items():
            assert f"{az} {n}" in text, (name, az)
        assert f"{f['size']['busy_instances']} busy + {f['size']['headroom_instances']} headroom" in text
    # Every reason of every cell is on the page: in its own cell where it differs from the base's,
    # else in the base's (a cell sharing reasons with the base says "as base" and what differs).
    base = r["sensitivity"]["base"]["reasons"]
    assert "; ".join(base) in page.cells
    for cell in r["sensitivity"]["cells"]:
        for reason in cell["reasons"]:
            assert reason in base or any(reason in c for c in page.cells), (cell["label"], reason)
    for g in r["gaps"]:
        assert g["reason"] in text
    for key, p in r["provenance"].items():
        assert f"{key}: {p['source']} - {p['detail']}" in text
    assert all(reason in text for reason in r["decision"]["reasons"])


def test_figures_are_inline_svg_with_unique_ids_and_no_external_reference(
    full_pages: tuple[dict[str, Any], Path],
) -> None:
    _, out = full_pages
    page = (out / "report.html").read_text()
    figures = re.findall(r"<figure>(.*?)</figure>", page, flags=re.S)
    assert len(figures) == FULL_REPORT_FIGURES
    assert all(f.count("<svg ") == 1 and "Source: " in f for f in figures)
    assert "<script" not in page and " src=" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'href="(?!#)', page), "a link or reference leaves the page"
    assert "<metadata>" not in page and "<?xml" not in page and "<!DOCTYPE svg" not in page
    dupes = [i for i, n in Counter(re.findall(r'\bid="([^"]+)"', page)).items() if n > 1]
    assert not dupes, f"ids repeated across figures: {dupes[:5]}"
    refs = set(re.findall(r'(?:href="#|url\(#)([^")]+)', page))
    assert refs and refs <= set(re.findall(r'\bid="([^"]+)"', page)), (
        "a figure references an id that is not in the page"
    )


def test_tornado_draws_only_cells_with_a_figure_and_lists_the_others(full_pages: tuple[dict[str, Any], Path]) -> None:
    r, out = full_pages
    left = [c for c in r["sensitivity"]["cells"] if c["monthly_delta_usd"] is None]
    drawn = [c for c in r["sensitivity"]["cells"] if c["monthly_delta_usd"] is not None]
    assert left and drawn  # covered / renewal: no commitment in the example manifest
    page = (out / "report.html").read_text()
    fig = next(f for f in re.findall(r"<figure>(.*?)</figure>", page, flags=re.S) if 'aria-label="Sensitivity' in f)
    svg, caption = fig.split("<figcaption>")
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert all(c["label"] in labels for c in drawn)
    assert not any(c["label"] in labels for c in left)
    assert all(f"{c['label']} ({c['decision']})" in caption for c in left)


def test_gate_reject_report_has_no_figures_and_says_not_decided(gate_reject_pages: tuple[dict[str, Any], Path]) -> None:
    r, out = gate_reject_pages
    assert r["decision"]["state"] == "reject"
    page = (out / "report.html").read_text()
    assert "<figure>" not in page and "<b>not decided</b>" in page
    cells = PageText(page).cells
    assert "fixture json-answer: schema invalid" in cells
    # each layer the gate evaluated, with its result and figures, and the failed layer named
    at = cells.index("fixtures")
    assert cells[at - 1 : at + 4] == [
        "inf2",
        "fixtures",
        "FAIL",
        "pass_rate 0.500, min_pass_rate 1.000",
        "fixture json-answer: schema invalid",
    ]
    assert "task_acceptance" in cells and "not evaluated" in cells and "the scorer exited 1" in cells
    assert "(failed layer: inf2: fixtures)" in page
    assert "output_length_ks (against g6, p_value 0.500)" in cells  # a nested figure reads as text, not a Python dict
