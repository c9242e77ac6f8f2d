"""Fault-injection harness: real emulators with fault flags, the real Locust, the real report.

Every case replays the same short schedule (~80 requests of the conv trace in ~9 s, 32 output
tokens each, below what one emulated inf2 instance serves without queueing: see fault_manifest)
against that instance, so a case's cost per successful token can be compared with one clean
baseline run of that same schedule.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.report.build import ReportInputs, build_report
from campaign.backends.local.processes import Supervisor
from core.manifest import Manifest, load_manifest
from core.ports import free_port
from core.records import RequestRecord, RunSummary
from tests.conftest import EXAMPLE_MANIFEST
from tests.loadgen.conftest import small_manifest_data

FLEET = "inf2"
REPLAY_TIMEOUT_S = 120.0


@dataclass
class Replay:
    """What one run left behind."""

    manifest: Manifest
    workdir: Path
    records_dir: Path
    summary: RunSummary
    report: dict[str, Any]
    wall_s: float
    snapshots: dict[str, bytes] = field(default_factory=dict)  # record files as seen mid-run

    def rows(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for f in sorted(self.records_dir.glob(f"records-{FLEET}-*.jsonl")):
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    out.append(json.loads(line))  # a torn line fails the test here
        return out

    def records(self) -> list[RequestRecord]:
        return [RequestRecord.from_dict(d) for d in self.rows()]

    def logs(self) -> str:
        parts = [p.read_text(errors="replace") for p in sorted((self.workdir / "logs").glob("*.log"))]
        parts += [p.read_text(errors="replace") for p in sorted(self.records_dir.glob("locust-*.log"))]
        return "\n".join(parts)

    def fleet_report(self) -> dict[str, Any]:
        f: dict[str, Any] = self.report["fleets"][FLEET]
        return f

    def run_cost_per_million(self) -> float | None:
        """The measured run's cost / its successful tokens: compute billed for the run (60 s
        minimum, so identical across cases of this schedule) over what actually succeeded."""
        mr = self.fleet_report().get("measured_run")
        assert mr is not None, self.fleet_report()
        v: float | None = mr["cost_per_million_successful_tokens"]
        return v


@pytest.fixture(scope="session")
def fault_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = small_manifest_data(yaml.safe_load(EXAMPLE_MANIFEST.read_text()), time_scale=0.15, rate_scale=0.3)
    data["workload"]["request_class"]["max_output_tokens"] = 32
    data["loadgen"]["request_timeout_s"] = 10.0  # above the injected stall, so a stall is slow, not a timeout
    # The faults are under test, not the accelerator: the calibrated Inf2 (one padded prefill at a
    # time) queues this schedule into its timeouts, so the faulted fleet gets small prefill
    # buckets and the manifest's assumed efficiencies, well below saturation (TTFT p50 ~0.08 s).
    inf2 = next(f for f in data["fleets"] if f["name"] == FLEET)
    inf2["sequence_buckets"] = [128, 256, 512, 1024, 2048, inf2["max_model_len"]]
    inf2["efficiency"] = {"bandwidth": 0.7, "compute": 0.5}
    p = tmp_path_factory.mktemp("faults-manifest") / "m.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _snapshot(records_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in records_dir.glob(f"records-{FLEET}-*.jsonl") if p.stat().st_size > 0}


def replay(
    manifest_path: Path,
    workdir: Path,
    faults: list[str],
    *,
    workers: int = 1,
    during: Callable[[Any, Supervisor, str], None] | None = None,
    with_prometheus: bool = False,
) -> Replay:
    """Emulator (with `faults`) + Locust + report, all under one Supervisor.

    `during(fleet_run, supervisor, emulator_url)` runs once the first records are flushed:
    that is where a case kills a worker or Prometheus.
    """
    from campaign.backends.local import prometheus as prometheus_local
    from campaign.backends.local.fleets import start_emulator
    from loadgen.launch import start_fleet

    m = load_manifest(manifest_path)
    workdir.mkdir(parents=True, exist_ok=True)
    records_dir = workdir / "records"
    t0 = time.monotonic()
    snapshots: dict[str, bytes] = {}
    with Supervisor(workdir / "logs") as sup:
        url = start_emulator(sup, manifest_path.resolve(), FLEET, workdir, faults)
        metrics_port = free_port()
        prom_url = None
        if with_prometheus:
            targets = [
                prometheus_local.ScrapeTarget(
                    "server", url.removeprefix("http://"), {"campaign": m.campaign, "fleet": FLEET}
                ),
                prometheus_local.ScrapeTarget(
                    "loadgen", f"127.0.0.1:{metrics_port}", {"campaign": m.campaign, "fleet": FLEET}
                ),
            ]
            _, prom_url = prometheus_local.start(sup, workdir / "prometheus", targets)
        run = start_fleet(m, FLEET, url, records_dir, workers=workers, metrics_port=metrics_port)
        try:
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while not _snapshot(records_dir) and not run.poll():
                assert time.monotonic() < deadline, "no record flushed"
                time.sleep(0.2)
            # let a few more batches land (a second flush, 1.5 s at most), then remember what is on disk
            first, settle_by = _snapshot(records_dir), time.monotonic() + 1.5
            while _snapshot(records_dir) == first and time.monotonic() < settle_by and not run.poll():
                time.sleep(0.1)
            snapshots = _snapshot(records_dir)
            if during is not None:
                during(run, sup, prom_url or url)
            summary = run.wait(timeout=REPLAY_TIMEOUT_S)
        finally:
            if not run.poll():
                run.terminate(grace_s=5)
        report = build_report(
            ReportInputs(
                m,
                records_dir,
                prometheus_url=prom_url,
                out_dir=workdir / "report",
                instances_measured={FLEET: 1},
                with_sensitivity=False,
                # the pages only where a case reads them (the Prometheus case: the report of a run
                # whose Prometheus died still renders); the figures are what the rest compare
                with_pages=with_prometheus,
            )
        ).model_dump(mode="json")
    return Replay(m, workdir, records_dir, summary, report, time.monotonic() - t0, snapshots)


@pytest.fixture(scope="session")
def baseline(fault_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Replay:
    """The clean run every fault is compared with."""
    r = replay(fault_manifest, tmp_path_factory.mktemp("baseline"), [])
    assert r.summary.invariant_holds(), r.summary
    assert r.summary.failed == 0 and r.summary.not_sent == 0, r.summary
    assert r.run_cost_per_million() is not None
    return r


@pytest.fixture
def run_with(fault_manifest: Path, tmp_path: Path) -> Iterator[Callable[..., Replay]]:
    def go(faults: list[str], **kw: Any) -> Replay:
        return replay(fault_manifest, tmp_path / "run", faults, **kw)

    yield go
