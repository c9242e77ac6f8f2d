"""Injected faults: every run still accounts for every scheduled request, keeps every record it
flushed, and its cost per successful token never comes out lower than a clean run's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

from campaign.backends.local.processes import Supervisor
from core.schedule import build_schedule
from tests.faults.conftest import Replay
from tests.real_parts import program

pytestmark = pytest.mark.faults


def _accounted(r: Replay) -> None:
    """scheduled = completed + failed + not_sent, one record per scheduled request."""
    s = r.summary
    assert s.invariant_holds(), s
    assert s.scheduled == len(build_schedule(r.manifest))
    ids = Counter(x["request_id"] for x in r.rows())
    assert sorted(ids) == sorted(q.request_id for q in build_schedule(r.manifest))
    assert max(ids.values()) == 1


def _nothing_flushed_lost(r: Replay) -> None:
    assert r.snapshots, "no record file was seen mid-run"
    for name, seen in r.snapshots.items():
        now = (r.records_dir / name).read_bytes()
        assert now.startswith(seen), f"{name}: records flushed mid-run were rewritten or lost"
    r.records()  # every line parses into the record contract


def _no_bare_traceback(r: Replay) -> None:
    logs = r.logs()
    assert "Traceback" not in logs, logs[logs.index("Traceback") - 2000 : logs.index("Traceback") + 3000]


def _costs_no_lower(r: Replay, baseline: Replay, *, strictly: bool) -> None:
    got, base = r.run_cost_per_million(), baseline.run_cost_per_million()
    assert base is not None
    if got is not None:  # None: nothing succeeded at all, which is "infinitely" dearer
        if strictly:
            assert got > base, (got, base)
        else:
            assert got >= base * 0.97, (got, base)  # the same work: equal up to the window's length
    # The monthly figure sizes a fleet from the measured goodput: fewer good tokens never make it cheaper.
    head, base_head = (
        r.fleet_report()["cost_per_million_successful_tokens"],
        baseline.fleet_report()["cost_per_million_successful_tokens"],
    )
    if head is not None and base_head is not None:
        assert head >= base_head * (0.999 if strictly else 0.97), (head, base_head)
    assert r.report["decision"]["state"] in {"go", "defer", "reject"} and r.report["decision"]["reasons"]


def _outcomes(r: Replay) -> Counter[str]:
    return Counter(x["outcome"] for x in r.rows())


def test_error_rate_5_percent(run_with: Any, baseline: Replay) -> None:
    r = run_with(["--error-rate", "0.05", "--fault-seed", "1"])
    _accounted(r)
    _nothing_flushed_lost(r)
    _no_bare_traceback(r)
    errs = [x for x in r.rows() if x["outcome"] == "http_error"]
    assert 0 < len(errs) <= 0.15 * r.summary.scheduled, _outcomes(r)
    assert all(x["http_status"] == 500 and x["error"] for x in errs)
    assert r.summary.failed == len(errs) and r.summary.not_sent == 0
    assert r.fleet_report()["successful_output_tokens"] < baseline.fleet_report()["successful_output_tokens"]
    assert r.fleet_report()["error_rate"] > 0
    _costs_no_lower(r, baseline, strictly=True)


def test_mid_stream_stalls(run_with: Any, baseline: Replay) -> None:
    r = run_with(["--stall-rate", "0.2", "--stall-s", "4", "--fault-seed", "2"])
    _accounted(r)
    _nothing_flushed_lost(r)
    _no_bare_traceback(r)
    stalled = [x for x in r.rows() if x["outcome"] == "ok" and (x["itl_max_s"] or 0) >= 3.5]
    assert stalled, _outcomes(r)
    # A stalled stream completes, but the stall breaks its ITL SLO: its tokens are not successful.
    assert not any(x["slo_ok"] for x in stalled)
    assert r.summary.failed == 0 and r.summary.completed == r.summary.scheduled
    assert r.fleet_report()["successful_output_tokens"] < baseline.fleet_report()["successful_output_tokens"]
    _costs_no_lower(r, baseline, strictly=True)


def test_truncated_streams(run_with: Any, baseline: Replay) -> None:
    r = run_with(["--truncate-rate", "0.1", "--fault-seed", "3"])
    _accounted(r)
    _nothing_flushed_lost(r)
    _no_bare_traceback(r)
    cut = [x for x in r.rows() if x["outcome"] == "truncated"]
    assert cut, _outcomes(r)
    assert all(x["finish_reason"] is None and not x["slo_ok"] for x in cut)
    assert r.summary.failed == len(cut)
    assert r.fleet_report()["successful_output_tokens"] < baseline.fleet_report()["successful_output_tokens"]
    _costs_no_lower(r, baseline, strictly=True)


def test_connection_resets(run_with: Any, baseline: Replay) -> None:
    r = run_with(["--reset-rate", "0.1", "--fault-seed", "4"])
    _accounted(r)
    _nothing_flushed_lost(r)
    _no_bare_traceback(r)
    # A reset after the headers is a stream that ended early (loadgen/sse.py classify): truncated,
    # with the socket error kept; connection_error is for an exchange that never got headers.
    reset = [x for x in r.rows() if x["outcome"] == "truncated" and "reset" in (x["error"] or "").lower()]
    assert reset, _outcomes(r)
    assert all(x["http_status"] == 200 and not x["slo_ok"] for x in reset)
    assert r.summary.failed == len(reset)
    assert r.fleet_report()["successful_output_tokens"] < baseline.fleet_report()["successful_output_tokens"]
    _costs_no_lower(r, baseline, strictly=True)


def test_loadgen_worker_killed_mid_run(run_with: Any, baseline: Replay) -> None:
    killed: list[subprocess.Popen[bytes]] = []

    def kill_one_worker(run: Any, sup: Supervisor, url: str) -> None:
        worker = run.procs[-1]  # procs: master, worker0, worker1
        assert worker.poll() is None, "the worker finished before it could be killed: the schedule is too short"
        os.kill(worker.pid, signal.SIGKILL)
        killed.append(worker)

    r = run_with([], workers=2, during=kill_one_worker)
    assert killed and killed[0].returncode == -signal.SIGKILL
    s = r.summary
    assert not s.valid
    why = "; ".join(s.invalid_reasons)
    assert "exited -9" in why and "have no record" in why, why
    # The survivor's share is whole; the dead worker's flushed records are still there and parse.
    _nothing_flushed_lost(r)
    ids = Counter(x["request_id"] for x in r.rows())
    assert max(ids.values()) == 1
    assert s.completed + s.failed + s.not_sent == len(ids) < s.scheduled
    assert any(g["what"].startswith("run_summary.") and "invalid" in g["reason"] for g in r.report["gaps"])
    # The master notices the dead worker and stops once the survivor is done, instead of
    # idling until Locust's safety-net --run-time (span + request timeout + 60 s).
    assert r.wall_s < baseline.wall_s + 30, (r.wall_s, baseline.wall_s)
    _costs_no_lower(r, baseline, strictly=True)


@pytest.mark.prometheus
def test_prometheus_stopped_mid_run(run_with: Any, baseline: Replay) -> None:
    program("prometheus")

    def stop_prometheus(run: Any, sup: Supervisor, prom_url: str) -> None:
        (prom,) = [c for c in sup.children if c.name == "prometheus"]
        os.kill(prom.proc.pid, signal.SIGKILL)
        prom.proc.wait(10)

    t0 = time.monotonic()
    r = run_with([], during=stop_prometheus, with_prometheus=True)
    assert time.monotonic() - t0 < 90
    _accounted(r)
    _nothing_flushed_lost(r)
    prom = r.report["prometheus"]
    assert prom is not None and "unreachable" in prom["error"], prom
    assert any(g["what"] == "prometheus" and "unreachable" in g["reason"] for g in r.report["gaps"])
    assert (r.workdir / "report" / "report.html").read_text().lower().startswith("<!doctype html>")
    # Losing the histograms loses no tokens: the cost comes from the records and stays put.
    _costs_no_lower(r, baseline, strictly=False)
