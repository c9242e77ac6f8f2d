"""report.html in a real browser: headless Chromium (Debian's), one page load from file://.

Without Chromium or Playwright it fails, naming what is missing (`make test` installs both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis.model import Report
from testing.report_browser import chromium_available, load
from tests.analysis.report_pages import FULL_REPORT_FIGURES, PageText
from tests.real_parts import missing

pytestmark = pytest.mark.browser


@pytest.fixture
def browser_ready() -> None:
    why = chromium_available()
    if why is not None:
        missing(why)


@pytest.mark.timeout(120)
def test_report_renders_every_figure_and_section_with_no_error_and_no_network(
    browser_ready: None, tmp_path: Path, full_pages: tuple[dict[str, Any], Path]
) -> None:
    _, out = full_pages
    seen = load(out / "report.html", png=tmp_path / "report.png")
    assert len(seen.figures) == FULL_REPORT_FIGURES
    assert all(w > 200 and h > 100 for w, h in seen.figures), seen.figures
    assert seen.console_errors == [] and seen.page_errors == []
    assert seen.requests and all(u.startswith("file://") for u in seen.requests), seen.requests
    assert seen.headings == PageText((out / "report.html").read_text()).headings  # every section rendered, in order
    assert (tmp_path / "report.png").stat().st_size > 10_000


@pytest.mark.timeout(180)
def test_the_first_screen_answers_and_every_figure_links_to_its_provenance(
    browser_ready: None, tmp_path: Path, recorded_pages: tuple[Report, Path]
) -> None:
    """The recorded example run's report.html at 1280x800: the verdict and why, the delta and the payback with their
    intervals and what would settle the verdict are drawn inside the first viewport; every in-page link resolves."""
    from tests.analysis.test_report_first_screen import first_screen_strings

    r, out = recorded_pages
    seen = load(out / "report.html", top_png=tmp_path / "first-screen.png", width=1280, height=800)
    assert seen.console_errors == [] and seen.page_errors == []
    missing = [x for x in first_screen_strings(r) if " ".join(x.split()) not in seen.top_text]
    assert not missing, f"not on the first screen: {missing}\n{seen.top_text}"
    assert "What would change the verdict" in seen.top_text
    top, bottom = seen.boxes["#verdict"]  # the verdict box, whole, on the first screen
    assert 0 <= top < bottom <= 800, seen.boxes
    assert seen.links and seen.broken_links == [], seen.broken_links
    assert seen.figures_unlinked == [] and len(seen.figures) >= 6
    assert seen.first_link_lands is True  # following a figure's link shows its provenance entry
    assert (tmp_path / "first-screen.png").stat().st_size > 10_000
