"""A real Prometheus server on loopback for the local campaign, when one is installed.

It scrapes each emulator's /metrics (server-side vLLM histograms) and each load generator's
exporter (client-side histograms), so the analysis reads histograms exactly as it would from
a cloud campaign's Prometheus.
"""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from campaign.backends.local.processes import Managed, ProcessFailed, Supervisor
from core.ports import free_port

SCRAPE_INTERVAL_S = 1.0  # short runs need fine resolution; a minute-long campaign has ~60 points


@dataclass(frozen=True)
class ScrapeTarget:
    job: str  # "server" or "loadgen"
    address: str  # host:port
    labels: Mapping[str, str]


def binary() -> str | None:
    return shutil.which("prometheus")


def render_config(targets: Sequence[ScrapeTarget]) -> str:
    lines = [
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL_S:g}s",
        f"  evaluation_interval: {SCRAPE_INTERVAL_S:g}s",
        "scrape_configs:",
    ]
    for job in sorted({t.job for t in targets}):
        lines += [f"  - job_name: {job}", "    static_configs:"]
        for t in (t for t in targets if t.job == job):
            lines.append(f"      - targets: ['{t.address}']")
            if t.labels:
                lines.append("        labels:")
                lines += [f"          {k}: '{v}'" for k, v in sorted(t.labels.items())]
    return "\n".join(lines) + "\n"


def start(
    sup: Supervisor, workdir: Path, targets: Sequence[ScrapeTarget], timeout_s: float = 30.0
) -> tuple[Managed, str]:
    """Start Prometheus; return the process and its base URL once /-/ready answers."""
    exe = binary()
    if exe is None:
        raise ProcessFailed("prometheus is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(render_config(targets))
    port = free_port()
    proc = sup.start(
        "prometheus",
        [
            exe,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ProcessFailed(f"prometheus exited with code {proc.proc.returncode}:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise ProcessFailed(f"prometheus not ready after {timeout_s:.0f} s:\n{proc.tail()}")
