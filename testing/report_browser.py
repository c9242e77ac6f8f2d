"""Open a report.html in headless Chromium (Debian's `chromium`, driven by Playwright) and say what the
browser saw: the figures' rendered sizes, console and page errors, every request the page made;
optionally a full-page PNG screenshot.

    python -m testing.report_browser [REPORT_HTML] [--png OUT.png]

Without REPORT_HTML it takes the newest runs/*/report.html; the PNG goes beside it by default.
The browser is the system's (no download: `apt-get install chromium`), launched with a fresh
profile and the flags that keep it off the network: a report must render from file:// alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# No sandbox (containers run as root), no GPU, and nothing that phones home: QUIC, first-run,
# background networking, component updates and sync are the requests a fresh profile would make.
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@dataclass
class PageReport:
    """What one page load showed."""

    figures: list[tuple[float, float]] = field(
        default_factory=list
    )  # each <figure> <svg>'s rendered width, height (CSS px)
    headings: list[str] = field(default_factory=list)  # h1/h2/h3 text, in order
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the document included
    top_text: str = ""  # the text drawn wholly inside the first viewport (the first screen), whitespace collapsed
    links: list[str] = field(default_factory=list)  # every in-page link's href ('#...')
    broken_links: list[str] = field(default_factory=list)  # of those, the ones no element's id matches
    figures_unlinked: list[str] = field(
        default_factory=list
    )  # figures (aria-label) whose caption links to no provenance entry
    first_link_lands: bool | None = None  # following the first figure's provenance link scrolls its entry into view
    boxes: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # selector -> its first element's (top, bottom), CSS px


def chromium_available() -> str | None:
    """Why the browser cannot run here, or None when it can."""
    if not Path(CHROMIUM).is_file() and shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (requirements.txt)"
    return None


# Text nodes whose box lies wholly inside the viewport, in document order.
_TOP_TEXT = """() => {
  const out = [], walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const range = document.createRange(); range.selectNodeContents(n);
    const b = range.getBoundingClientRect();
    if (b.height > 0 && b.top >= 0 && b.bottom <= window.innerHeight && n.textContent.trim()) out.push(n.textContent);
  }
  return out.join(' ');
}"""
_LINKS = """() => [...document.querySelectorAll('a[href^="#"]')].map(a => a.getAttribute('href'))"""
_UNLINKED = """() => [...document.querySelectorAll('figure')].filter(f => !f.querySelector('figcaption a[href^="#prov-"]'))
  .map(f => (f.querySelector('svg') || f).getAttribute('aria-label') || '?')"""


def load(
    report: Path,
    png: Path | None = None,
    width: int = 1280,
    height: int = 800,
    top_png: Path | None = None,
    measure: tuple[str, ...] = ("#verdict",),
) -> PageReport:
    """Load `report` from file:// once; requests to anything but file:// are recorded and aborted.
    `png`: a full-page screenshot; `top_png`: the first screen only (width x height); `measure`: CSS
    selectors whose first element's top and bottom to record (before any scrolling)."""
    from playwright.sync_api import sync_playwright

    seen = PageReport()
    with tempfile.TemporaryDirectory(prefix="report-browser-") as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=list(FLAGS),
            viewport={"width": width, "height": height},
        )
        try:
            page = ctx.new_page()
            page.on("console", lambda m: seen.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen.page_errors.append(str(e)))

            def route(r: object) -> None:
                url = r.request.url  # type: ignore[attr-defined]
                seen.requests.append(url)
                if url.startswith("file://"):
                    r.continue_()  # type: ignore[attr-defined]
                else:
                    r.abort()  # type: ignore[attr-defined]

            page.route("**/*", route)
            page.goto(report.resolve().as_uri(), wait_until="load")
            size = "els => els.map(e => { const b = e.getBoundingClientRect(); return [b.width, b.height]; })"
            boxes = page.eval_on_selector_all("figure svg", size)
            seen.figures = [(float(w), float(h)) for w, h in boxes]
            seen.headings = [
                t.strip() for t in page.eval_on_selector_all("h1, h2, h3", "els => els.map(e => e.textContent)")
            ]
            seen.top_text = " ".join(str(page.evaluate(_TOP_TEXT)).split())
            for sel in measure:
                box = page.evaluate(
                    "s => { const e = document.querySelector(s); if (!e) return null; "
                    "const b = e.getBoundingClientRect(); return [b.top, b.bottom]; }",
                    sel,
                )
                if box is not None:
                    seen.boxes[sel] = (float(box[0]), float(box[1]))
            if top_png is not None:
                page.screenshot(path=str(top_png))
            if png is not None:
                page.screenshot(path=str(png), full_page=True)
            seen.links = [str(h) for h in page.evaluate(_LINKS)]
            seen.broken_links = [
                h for h in seen.links if not page.evaluate("id => !!document.getElementById(id)", unquote(h[1:]))
            ]
            seen.figures_unlinked = [str(x) for x in page.evaluate(_UNLINKED)]
            first = page.locator('figcaption a[href^="#prov-"]').first
            if first.count():
                target = unquote(str(first.get_attribute("href"))[1:])
                first.click()
                seen.first_link_lands = bool(
                    page.evaluate(
                        "id => { const b = document.getElementById(id).getBoundingClientRect(); "
                        "return b.top >= 0 && b.top < window.innerHeight; }",
                        target,
                    )
                )
        finally:
            ctx.close()
    return seen


def newest_report(root: Path = Path("runs")) -> Path | None:
    found = sorted(root.glob("*/report.html"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", nargs="?", type=Path, help="report.html (default: the newest runs/*/report.html)")
    ap.add_argument("--png", type=Path, help="screenshot path (default: report.png beside the report)")
    args = ap.parse_args(argv)
    report = args.report or newest_report()
    if report is None or not report.is_file():
        print(f"no report: {report or 'runs/*/report.html'} not found (run `make demo` first)", file=sys.stderr)
        return 2
    why = chromium_available()
    if why:
        print(why, file=sys.stderr)
        return 2
    png = args.png or report.with_name("report.png")
    seen = load(report, png)
    outside = [u for u in seen.requests if not u.startswith("file://")]
    print(f"{report}: {len(seen.figures)} figures, sizes (px) {', '.join(f'{w:.0f}x{h:.0f}' for w, h in seen.figures)}")
    print(
        f"console errors {len(seen.console_errors)}, page errors {len(seen.page_errors)}, requests outside file:// {len(outside)}"
    )
    print(
        f"in-page links {len(seen.links)}, broken {len(seen.broken_links)}; figures without a provenance link {len(seen.figures_unlinked)}"
    )
    for x in seen.console_errors + seen.page_errors + outside:
        print(f"  {x}")
    print(f"screenshot: {png}")
    for x in seen.broken_links + seen.figures_unlinked:
        print(f"  {x}")
    return 1 if seen.console_errors or seen.page_errors or outside or seen.broken_links else 0


if __name__ == "__main__":
    sys.exit(main())
