"""Server truth per step against a real Prometheus (Debian `prometheus`) scraping two replicas that
export vLLM's own histogram names: the run saves metrics/<fleet>/<step>.json, the report gives each
step's server P95s with provenance `pulled` and the client-server gap, a short step is "too short
for server truth", and `report --run-dir` gives the same figures from the saved files with no
Prometheus at all."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from analysis.errors import SourceUnavailable
from analysis.measure.server_truth import TOO_SHORT
from analysis.sources.prometheus import PrometheusSource
from campaign.stages.run import RunFacts, report_from_run_dir, run_report, save_server_series
from core.manifest import Manifest
from core.ports import free_port
from tests.analysis.synth import manifest, steady, write_jsonl
from tests.real_parts import program

pytestmark = pytest.mark.prometheus

PROM = shutil.which("prometheus")
BUCKETS = (0.1, 0.5, 1.0)


@pytest.fixture
def small(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 1.0
    return manifest(manifest_data)


def _serve_text_format(reg: CollectorRegistry) -> ThreadingHTTPServer:
    """/metrics in the text format, as vLLM and the emulator (runtime/emulator/app.py) serve it:
    prometheus_client's own server answers Prometheus's OpenMetrics request with the colons of
    vLLM's names turned into underscores, which would not be vLLM's series."""

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    # shutdown() waits for the loop's next poll: 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def vllm_replicas(tmp_path: Path) -> Iterator[tuple[str, list[Histogram], list[Histogram]]]:
    """Two g6 replicas behind the `server` job (as the local campaign scrapes them), 1 s scrapes."""
    if PROM is None:
        program("prometheus")  # fails, naming how to install it
    ttft, itl, servers, targets = [], [], [], []
    for _ in range(2):
        reg = CollectorRegistry()
        ttft.append(Histogram("vllm:time_to_first_token_seconds", "ttft", buckets=BUCKETS, registry=reg))
        itl.append(Histogram("vllm:inter_token_latency_seconds", "itl", buckets=(0.02, 0.04), registry=reg))
        server = _serve_text_format(reg)
        servers.append(server)
        targets.append(f"127.0.0.1:{server.server_port}")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: server\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n        labels: {{fleet: g6}}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            PROM,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prom.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        src, deadline = PrometheusSource(url), time.time() + 30
        while True:  # both replicas scraped, with zero counts
            try:
                if len(src.query('up{job="server"} == 1', time.time())) == 2:
                    break
            except SourceUnavailable:
                pass
            if time.time() > deadline:
                pytest.fail("prometheus did not scrape both replicas: " + (tmp_path / "prom.log").read_text()[-2000:])
            time.sleep(0.3)
        yield url, ttft, itl
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for s in servers:
            s.shutdown()


def _records(m: Manifest, d: Path, fleet: str, n: int, wall_start: float) -> None:
    recs = steady(m, fleet, n, 500, ttft=0.9, itl=0.05)  # the client's P95s: 0.9 s and 0.05 s
    write_jsonl(d / f"records-{fleet}-w0.jsonl", [dataclasses.replace(r, wall_start=wall_start) for r in recs])


def test_per_step_server_p95s_pulled_with_the_gap_and_recomputed_offline(
    tmp_path: Path, small: Manifest, vllm_replicas: tuple[str, list[Histogram], list[Histogram]]
) -> None:
    m = small
    url, (fast, slow), (itl_a, itl_b) = vllm_replicas
    run = tmp_path / "run"
    t0 = time.time()
    _records(m, run / "records", "g6", 8, t0)  # the replay: an 8 s window (8 scrapes)
    _records(m, run / "records", "inf2", 8, t0)  # a fleet nobody scrapes
    step = run / "capacity" / "g6" / "x2"
    _records(m, step, "g6", 2, t0 + 1)  # a 2 s step: under 6 scrapes
    time.sleep(0.5)
    for _ in range(90):
        fast.observe(0.05)
        itl_a.observe(0.01)
    for _ in range(10):
        slow.observe(0.8)
        itl_b.observe(0.03)
    time.sleep(max(t0 + 8 + 2.5 - time.time(), 0))  # a scrape past the last completion
    facts = RunFacts({"inf2": 1, "g6": 1}, prometheus_url=url, scrape_interval_s=1.0)
    facts.write(run)
    assert save_server_series(m, run, facts, {"g6/x2": step}, log=lambda _: None) == 3
    assert sorted(p.relative_to(run).as_posix() for p in (run / "metrics").rglob("*.json")) == [
        "metrics/g6/replay.json",
        "metrics/g6/x2.json",
        "metrics/inf2/replay.json",
    ]

    live = run_report(m, run, run, None, facts, {"g6/x2": step}, None, full=False)
    assert live.prometheus is not None and live.prometheus.steps is not None
    by_label = {s.label: s for s in live.prometheus.steps["g6"]}
    replay = by_label["replay"]
    assert replay.source == "pulled" and replay.status == "ok"
    # merged across both replicas: 90 under 0.1 s, 10 in (0.5, 1] -> 0.5 + 0.5 * 5 / 10
    assert replay.p95_ttft_s == pytest.approx(0.75, abs=0.03)
    # the client's 0.9 s lies in that bucket (0.5, 1]: the two agree within it, no signed gap
    assert replay.ttft_bucket_s == (0.5, 1.0) and replay.ttft_gap_s is None
    assert replay.p95_itl_s is not None and 0.02 < replay.p95_itl_s <= 0.04
    assert replay.itl_bucket_s == (0.02, 0.04) and replay.itl_gap_s == pytest.approx(0.05 - replay.p95_itl_s)
    short = by_label["g6/x2"]
    assert short.status == "too_short" and short.note.startswith(TOO_SHORT) and short.p95_ttft_s is None
    (inf2,) = live.prometheus.steps["inf2"]
    assert inf2.status == "target_down" and inf2.p95_ttft_s is None

    # `report --run-dir`, no Prometheus given: the same figures from the saved series alone
    offline = report_from_run_dir(m, run, tmp_path / "again")
    assert offline.prometheus is not None and offline.prometheus.steps == live.prometheus.steps
    assert offline.provenance["prometheus.steps.g6"].source == "pulled"
