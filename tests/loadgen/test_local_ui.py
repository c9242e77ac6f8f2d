"""The live Locust web UI locally (`campaign local --ui`): the same replay, watched in a real
browser mid-run, with the rows the cloud master's UI shows; the records are as complete as a
headless run's."""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from core.manifest import load_manifest
from core.ports import free_port
from loadgen import launch
from loadgen.launch import start_fleet
from testing.report_browser import CHROMIUM, FLAGS, chromium_available
from tests.loadgen.conftest import small_manifest_data, write
from tests.loadgen.sse_server import SSEServer
from tests.real_parts import missing

pytestmark = pytest.mark.browser


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats/requests", timeout=5) as r:
        return dict(json.loads(r.read()))


@pytest.mark.timeout(180)
def test_the_local_ui_shows_the_replay_live(
    sse_server: SSEServer, manifest_data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real time on purpose: the subject is the live UI of a running replay, seen by a real browser.
    why = chromium_available()
    if why is not None:
        missing(why)
    from playwright.sync_api import sync_playwright

    # 60 trace seconds at time_scale 0.2: a 12 s replay, long enough to look at it running (its
    # rows show within its first seconds); the UI then stays up 5 s, not the CLI's 10, for a
    # browser that is still loading the page when the replay ends.
    monkeypatch.setattr(launch, "LOCAL_UI_LINGER_S", 5)
    manifest = write(tmp_path, small_manifest_data(manifest_data, time_scale=0.2))
    port = free_port()
    run = start_fleet(load_manifest(manifest), "g6", sse_server.url, tmp_path / "rec", ui_port=port)
    try:
        rows: set[str] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not {"SSE ttft", "SSE itl", "SLO goodput"} <= rows:
            with contextlib.suppress(OSError):  # the UI is not up yet
                rows = {f"{s['method']} {s['name']}" for s in _stats(port)["stats"] if s["num_requests"] > 0}
            time.sleep(0.1)
        assert {"SSE ttft", "SSE itl", "SLO goodput"} <= rows, rows
        assert not run.poll(), "the replay should still be running while it is watched"
        with tempfile.TemporaryDirectory(prefix="ui-browser-") as profile, sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=list(FLAGS),
                viewport={"width": 1280, "height": 800},
            )
            try:
                page = ctx.new_page()
                page.goto(f"http://127.0.0.1:{port}/", wait_until="networkidle")
                page.wait_for_function("() => document.body.innerText.includes('ttft')", timeout=20_000)
                text = page.inner_text("body")
                page.screenshot(path=str(tmp_path / "locust-ui.png"))
            finally:
                ctx.close()
        assert "ttft" in text and "goodput" in text
        assert (tmp_path / "locust-ui.png").stat().st_size > 10_000
    finally:
        summary = run.wait(timeout=120)
    assert summary.invariant_holds() and summary.scheduled == summary.completed + summary.failed + summary.not_sent
    assert summary.completed > 0
