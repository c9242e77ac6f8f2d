"""Headless Locust runs (real `locust` CLI as subprocesses) against the test SSE server."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

from core.manifest import Manifest, load_manifest
from core.schedule import build_schedule
from core.tokenizer import for_manifest
from loadgen.launch import run_fleet, start_fleet
from loadgen.recording import read_records
from loadgen.replay_options import ReplayOptions
from tests.loadgen.conftest import small_manifest_data, write
from tests.loadgen.sse_server import Behaviour, SSEServer


def _records(d: Path) -> list[Any]:
    return sorted(read_records(sorted(d.glob("records-g6-w*.jsonl"))), key=lambda r: r.request_id)


def test_one_worker_and_two_workers_replay_the_same_requests(
    sse_server: SSEServer, small_manifest: Path, tmp_path: Path
) -> None:
    sched = build_schedule(load_manifest(small_manifest))
    one = run_fleet(small_manifest, "g6", sse_server.url, tmp_path / "one")
    two = run_fleet(small_manifest, "g6", sse_server.url, tmp_path / "two", workers=2)
    for s in (one, two):
        assert s.invariant_holds() and s.valid, s.invalid_reasons
        assert s.scheduled == len(sched) == s.completed
    r1, r2 = _records(tmp_path / "one"), _records(tmp_path / "two")
    key = [(r.request_id, r.input_tokens, r.max_tokens, r.scheduled_s, r.warmup) for r in r1]
    assert key == [(r.request_id, r.input_tokens, r.max_tokens, r.scheduled_s, r.warmup) for r in r2]
    assert {r.worker for r in r2} == {"w0", "w1"} and {r.worker for r in r1} == {"w0"}
    assert all(r.server_prompt_tokens == r.input_tokens for r in r1 if r.input_tokens > 8)
    # The client's count of what it sent agrees with the server's, short prompts included.
    assert all(r.client_prompt_tokens == r.server_prompt_tokens for r in r1 + r2)
    assert one.prompt_token_mismatch_rate == two.prompt_token_mismatch_rate == 0.0
    assert (tmp_path / "two" / "summary-g6.json").is_file()
    assert sum(r.warmup for r in r1) == one.warmup_excluded > 0
    # Open loop, on time: nothing goes out before its scheduled time (a timer armed on the
    # event loop's stale clock would fire early), and each worker sends in schedule order.
    assert all(r.send_lag_s is not None and r.send_lag_s >= 0 for r in r1 + r2)
    for recs in (r1, [r for r in r2 if r.worker == "w0"], [r for r in r2 if r.worker == "w1"]):
        by_time = sorted(recs, key=lambda r: (r.scheduled_s, r.request_id))
        assert [r.sent_s for r in by_time] == sorted(r.sent_s for r in recs)


def test_faulty_server_gives_failure_records_not_a_crash(
    sse_server: SSEServer, small_manifest: Path, tmp_path: Path
) -> None:
    # A stall past the 2 s request timeout times out; 3 s keeps a second's margin for a late timer
    # and frees the server's handlers sooner than a longer stall would.
    sse_server.behaviour = Behaviour(mode="mixed", stall_s=3.0)
    s = run_fleet(small_manifest, "g6", sse_server.url, tmp_path / "f")
    assert s.invariant_holds() and s.failed > 0 and s.completed > 0
    outcomes = Counter(r.outcome for r in _records(tmp_path / "f"))
    assert {"ok", "http_error", "timeout", "truncated"} <= set(outcomes)
    assert sum(outcomes.values()) == s.scheduled


def test_duration_cut_and_lag_bound(sse_server: SSEServer, manifest_data: dict[str, Any], tmp_path: Path) -> None:
    data = small_manifest_data(manifest_data)
    data["loadgen"]["max_schedule_lag_p99_s"] = 1e-6  # no real client meets this: must be flagged
    m = write(tmp_path, data)
    s = run_fleet(m, "g6", sse_server.url, tmp_path / "d", options=ReplayOptions(duration_s=2.0))
    recs = _records(tmp_path / "d")
    assert s.invariant_holds() and s.not_sent > 0 and len(recs) == s.scheduled
    assert all(r.outcome == "not_sent" for r in recs if r.scheduled_s > 2.0)
    assert not s.valid and any("schedule lag p99" in x for x in s.invalid_reasons)
    assert s.schedule_lag_p99_s > 0 and s.client_cpu_percent > 0


def test_terminate_keeps_flushed_records(sse_server: SSEServer, manifest_data: dict[str, Any], tmp_path: Path) -> None:
    m = write(tmp_path, small_manifest_data(manifest_data, time_scale=1.0))  # 60 s replay
    before = len(sse_server.seen)
    run = start_fleet(load_manifest(m), "g6", sse_server.url, tmp_path / "t")
    # Stop mid-replay, not mid-setup: a fixed 5 s sleep ended some runs before the worker had
    # prepared its prompts on a loaded machine (no worker summary at all).
    deadline = time.monotonic() + 60
    while len(sse_server.seen) < before + 3 and time.monotonic() < deadline and not run.poll():
        time.sleep(0.05)
    # The test server answers in ~0.1 s (20 ms TTFT, 16 tokens 5 ms apart): by now the first of the
    # three has completed, and the 60 s schedule has most of its requests still unsent.
    time.sleep(0.5)
    s = run.terminate()
    recs = _records(tmp_path / "t")
    assert s.invariant_holds() and s.not_sent > 0 and s.completed > 0
    assert len(recs) == s.scheduled
    assert {r.request_id for r in recs} == set(range(s.scheduled))


def test_setup_failure_stops_the_run_once_and_names_the_cause(
    sse_server: SSEServer, small_manifest: Path, tmp_path: Path
) -> None:
    # The metrics port is taken: the worker cannot set up. It must stop at once, send nothing,
    # and say why, instead of retrying the task in a loop until --run-time.
    before = len(sse_server.seen)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = start_fleet(load_manifest(small_manifest), "g6", sse_server.url, tmp_path / "s", metrics_port=port)
        s = run.wait(timeout=60)
    assert [p.returncode for p in run.procs] == [3]
    assert not s.valid and any("setup failed, nothing was sent" in r and "in use" in r for r in s.invalid_reasons), (
        s.invalid_reasons
    )
    assert len(sse_server.seen) == before
    assert run.logs[0].read_text().count("setup failed") == 1


def test_workers_given_the_resolver_in_their_environment_spread_over_the_nlb_name(
    manifest: Manifest, small_manifest: Path, tmp_path: Path
) -> None:
    # As a Fargate task gets it: LOADGEN_RESOLVER in the environment only, the host an NLB name
    # that no system resolver knows (RFC 6761: .invalid), answered by the offline NLB DNS stand-in
    # with one node address per AZ. Every node serves; each worker's requests take them in turn.
    from testing.nlb_dns import NlbDns, NlbDnsServer, Target, loopback_nodes

    name, azs = "fleet-nlb.invalid", ["az-a", "az-b", "az-c"]
    nodes = loopback_nodes(azs)
    server = SSEServer(
        for_manifest(manifest),
        manifest.tokenizer.chat_template,
        dict(manifest.tokenizer.special_tokens),
        hosts=tuple(nodes.values()),
    ).start()
    dns = NlbDns(name, nodes, cross_zone=False, targets=[Target("g6", az, True) for az in azs])
    try:
        with NlbDnsServer({name: dns}) as src:
            s = run_fleet(
                small_manifest,
                "g6",
                f"http://{name}:{server.port}",
                tmp_path / "r",
                workers=2,
                options=ReplayOptions(tokenizer_check=False),  # /tokenize would go through the system resolver
                extra_env={"LOADGEN_RESOLVER": src.url},
            )
    finally:
        server.stop()
    assert s.valid and s.completed == s.scheduled, s.invalid_reasons
    assert name in src.asked
    counts = server.served_by
    assert set(counts) == set(nodes.values()) and sum(counts.values()) == s.scheduled
    assert max(counts.values()) - min(counts.values()) <= 2  # round robin per worker: at most one apart each


def test_workers_paused_past_three_heartbeats_still_replay_the_whole_schedule(
    sse_server: SSEServer, small_manifest: Path, tmp_path: Path
) -> None:
    """A worker whose event loop is held (its setup reading the trace on 2 loaded cores, or the
    process not scheduled) sends no heartbeat. Locust's master marks a worker missing after 3
    missed heartbeats of 1 s and, with every worker missing, stops the run: CI's rehearsal once
    ended with no record at all that way. Both workers are stopped for 6 s once they joined."""
    run = start_fleet(load_manifest(small_manifest), "g6", sse_server.url, tmp_path / "p", workers=2)
    master_log, workers = run.logs[0], run.procs[1:]
    deadline = time.monotonic() + 60
    while "2 workers connected" not in master_log.read_text(errors="replace"):
        assert time.monotonic() < deadline and not run.poll(), master_log.read_text(errors="replace")
        time.sleep(0.05)
    for w in workers:
        os.kill(w.pid, signal.SIGSTOP)
    try:
        time.sleep(6.0)
    finally:
        for w in workers:
            os.kill(w.pid, signal.SIGCONT)
    s = run.wait(timeout=120)
    log = master_log.read_text(errors="replace")
    # Every request sent and recorded. The pause normally falls before the replay starts; on a loaded
    # machine it may fall in it, and then its requests go out late (the lag bound may mark the run)
    # and one in flight may time out: both are records, and nothing else may mark the run.
    assert s.not_sent == 0 and s.completed + s.failed == s.scheduled, (s.invalid_reasons, log[-3000:])
    assert [r for r in s.invalid_reasons if not r.startswith("schedule lag")] == [], s.invalid_reasons
    assert "went missing" not in log, log[-3000:]
