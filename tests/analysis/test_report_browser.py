"""report.html in a real browser: headless Chromium (Debian's), one page load from file://.

Skipped without Chromium or Playwright, except where BROWSER_REQUIRED=1 (CI), which fails instead."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.report_browser import chromium_available, load
from tests.analysis.report_pages import FULL_REPORT_FIGURES, PageText, full_report

pytestmark = pytest.mark.browser


@pytest.fixture
def browser_ready() -> None:
    why = chromium_available()
    if why is None:
        return
    if os.environ.get("BROWSER_REQUIRED") == "1":
        pytest.fail(f"BROWSER_REQUIRED=1 but {why}")
    pytest.skip(why)


@pytest.mark.timeout(120)
def test_report_renders_every_figure_and_section_with_no_error_and_no_network(
    browser_ready: None, tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    _, out = full_report(tmp_path, manifest_data)
    seen = load(out / "report.html", png=tmp_path / "report.png")
    assert len(seen.figures) == FULL_REPORT_FIGURES
    assert all(w > 200 and h > 100 for w, h in seen.figures), seen.figures
    assert seen.console_errors == [] and seen.page_errors == []
    assert seen.requests and all(u.startswith("file://") for u in seen.requests), seen.requests
    assert seen.headings == PageText((out / "report.html").read_text()).headings  # every section rendered, in order
    assert (tmp_path / "report.png").stat().st_size > 10_000
