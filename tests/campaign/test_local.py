"""`python -m campaign local` end to end, as a user runs it: real emulators, real Locust."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from campaign.cli.report_cmds import EXIT_BY_STATE
from campaign.stages.run import report_from_run_dir
from core.manifest import load_manifest
from testing.cloud_offline import VOLATILE
from testing.json_diff import report_differences
from tests.conftest import ROOT, write_manifest

pytestmark = pytest.mark.slow


def _short_manifest(tmp_path: Path, data: dict[str, Any]) -> Path:
    # Short outputs keep the drain after the last arrival to seconds (the emulated inf2 decodes
    # about 8 tokens a second at batch 1: 48 tokens kept every request 6 s in flight, and the
    # replay's first 8 s had no answer); the real trace's arrivals stay, played twice as fast so a
    # short replay still sends a dozen requests per fleet. The gate's fixtures are short for the
    # same reason: they run one after another on each fleet (10 s of the run at 32 and 24 tokens).
    data["workload"]["request_class"]["max_output_tokens"] = 16
    for fx in data["quality"]["fixtures"]:
        fx["max_tokens"] = min(fx["max_tokens"], 8)
    data["workload"]["time_scale"] = 0.5
    data["workload"]["warmup_s"] = 1
    data["workload"]["capacity_sweep"] = {"multipliers": [1, 4], "step_s": 3}
    data["workload"].pop("capacity_search", None)
    data["quality"]["distribution"]["min_samples"] = 5  # a 9 s replay (18 trace seconds) sends about a dozen per fleet
    return write_manifest(tmp_path, data)


def _leftovers(marker: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and p.pid != os.getpid():
            out.append(f"{p.pid}: {cmd}")
    return out


def _records(out: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted((out / "records").glob("records-*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def test_local_campaign_writes_a_report_with_both_fleets(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # Real time on purpose: the one end-to-end run of the local live path (emulators, Locust,
    # Prometheus, the report) as a user starts it; its logic is tested in simulated time elsewhere.
    manifest = _short_manifest(tmp_path, manifest_data)
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "campaign", "local", str(manifest), "--duration", "9", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=280,
    )
    report = json.loads((out / "report.json").read_text())
    assert r.returncode == EXIT_BY_STATE[report["decision"]["state"]], r.stdout[-3000:] + r.stderr[-3000:]
    assert set(report["fleets"]) == {"inf2", "g6"}
    assert report["decision"]["state"] in {"go", "defer", "reject"}
    assert report["decision"]["reasons"]
    for name in ("inf2", "g6"):
        f = report["fleets"][name]
        assert f["successful_requests"] > 0 and f["p95_ttft_s"] > 0
    assert (out / "report.html").read_text().lower().startswith("<!doctype html>")
    rows = _records(out)
    # The same schedule went to both fleets.
    ids = {name: sorted(x["request_id"] for x in rows if x["fleet"] == name) for name in ("inf2", "g6")}
    assert ids["inf2"] == ids["g6"] and ids["inf2"]
    assert all(x["manifest_digest"] == report["manifest_digest"] for x in rows)
    assert "quality gate inf2: pass" in r.stdout and "decision:" in r.stdout
    for name in ("inf2", "g6"):  # the capacity sweep ran and fed the report
        steps = report["fleets"][name]["capacity"]["steps"]
        assert len([s for s in steps if s.get("label", s.get("step")) != "replay"]) == 2, steps
        assert (out / "capacity" / "x4" / f"records-{name}-w0.jsonl").is_file()
    # the server's histograms per step, saved in the run directory and read back by the report
    steps = report["prometheus"]["steps"]
    for name in ("inf2", "g6"):
        assert {p.stem for p in (out / "metrics" / name).glob("*.json")} >= {"replay", "x4"}
        replay = next(s for s in steps[name] if s["label"] == "replay")
        assert replay["source"] == "pulled" and replay["status"] == "ok", replay
        # a signed gap, or none where the client's P95 lies inside the server's bucket, which it names
        lo, hi = replay["ttft_bucket_s"]
        client = report["fleets"][name]["p95_ttft_s"]
        assert replay["p95_ttft_s"] > 0 and (replay["ttft_gap_s"] is not None or lo <= client <= (hi or client)), replay
    assert _leftovers(str(out)) == []
    # Invariant (issue 47, 3): a rebuild changes nothing. `report --run-dir` over the run's
    # directory, its emulators and Prometheus stopped, gives its report.json field by field (in a
    # copy, rebuilt in place: the paths it states are the run's own).
    copy = tmp_path / "rebuilt"
    shutil.copytree(out, copy)
    again = report_from_run_dir(load_manifest(manifest), copy, copy).model_dump(mode="json")
    compared, diff = report_differences(report, again, VOLATILE)
    assert compared > 100 and not diff, "; ".join(diff[:10])


def test_ctrl_c_stops_every_process_and_keeps_records(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # Real processes on purpose: the subject is a real SIGINT reaching every child of a real run.
    manifest = _short_manifest(tmp_path, manifest_data)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "campaign", "local", str(manifest), "--out", str(out), "--skip-capacity"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        # A shell without job control starts background commands with SIGINT ignored, and a child
        # inherits that (Python then installs no KeyboardInterrupt handler): `make test &` lost
        # this test its Ctrl-C. The terminal's default disposition, whoever launched pytest.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        f.stat().st_size > 0 for f in (out / "records").glob("records-*.jsonl")
    ):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert _records(out), "no record was flushed before the interrupt"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "records flushed so far" in stderr
    time.sleep(0.5)
    assert _leftovers(str(out)) == []
    rows = _records(out)  # every line still parses: nothing torn, nothing lost
    assert rows and {x["fleet"] for x in rows} <= {"inf2", "g6"}
    assert not (out / "report.json").exists()


def test_second_run_does_not_collide(tmp_path: Path) -> None:
    # Ports come from the OS per run, so two campaigns never fight over one.
    from core.ports import free_port

    assert len({free_port() for _ in range(20)}) > 1


def test_cpu_engines_and_their_load_generators_never_share_a_core() -> None:
    from campaign.backends.local.fleets import core_plan

    wide = core_plan(["inf2", "g6"], 8)  # a core per engine and spare ones: side by side, clients on the spare cores
    assert wide.concurrent == 2 and wide.engine_core == {"inf2": 0, "g6": 1}
    assert wide.client_cpus == {"inf2": set(range(2, 8)), "g6": set(range(2, 8))}
    two = core_plan(["inf2", "g6"], 2)  # this machine: one fleet at a time, its client on the idle engine's core
    assert two.concurrent == 1 and two.engine_core == {"inf2": 0, "g6": 1}
    assert two.client_cpus == {"inf2": {1}, "g6": {0}}
    three = core_plan(["inf2", "g6"], 3)
    assert three.concurrent == 1 and three.client_cpus == {"inf2": {1, 2}, "g6": {0, 2}}
    for plan in (wide, two, three):
        assert all(plan.engine_core[f] not in plan.client_cpus[f] for f in plan.engine_core)
    one = core_plan(["inf2", "g6"], 1)  # fewer cores than engines: nothing pinned, one at a time
    assert (
        one.concurrent == 1
        and one.engine_core == {"inf2": None, "g6": None}
        and one.client_cpus == {"inf2": set(), "g6": set()}
    )
