"""A real vLLM killed in the middle of a replay (runs after the other real_engine modules:
it kills the session's server, so it must stay the last file here in collection order).

What must hold: the run ends by itself (no hang waiting on a dead server), every scheduled
request is accounted for (scheduled = completed + failed + not-sent), the records flushed
before the kill are kept whole, and the failures say what happened: a connection-level error
naming the server, not a silent empty stream.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from core.manifest import load_manifest
from core.records import Outcome
from loadgen.launch import start_fleet
from loadgen.recording import read_records
from tests.real_engine.conftest import RealServer, WriteManifest

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]


def _records(out: Path, fleet: str) -> list:
    return list(read_records(sorted(out.glob(f"records-{fleet}-*.jsonl"))))


def test_server_killed_mid_run(real_server: RealServer, write_real_manifest: WriteManifest, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # The session's 50 s window in 20 s, its requests 2.5 times as dense (about 0.8 a second): enough
    # completed before the kill, more sent after it, and the run (which replays its schedule to the
    # end, every send after the kill refused) waits less alone at the end of `make test`.
    manifest = write_real_manifest(workload={"time_scale": 0.4, "warmup_s": 2.0})
    run = start_fleet(load_manifest(manifest), real_server.fleet, real_server.url, out)
    deadline = time.monotonic() + 120
    before: list = []
    while time.monotonic() < deadline and run.poll() is False:
        before = [r for r in _records(out, real_server.fleet) if r.outcome == Outcome.OK.value and not r.warmup]
        if len(before) >= 3:
            break
        time.sleep(0.5)
    assert len(before) >= 3, "no completed request was flushed before the kill"
    os.killpg(real_server.proc.proc.pid, signal.SIGKILL)  # the engine and its workers, no goodbye
    s = run.wait(timeout=300)
    assert s.invariant_holds(), s
    recs = _records(out, real_server.fleet)
    assert len(recs) == s.scheduled
    by_id = {r.request_id: r for r in recs}
    for r in before:  # flushed before the kill: kept, unchanged
        assert by_id[r.request_id] == r
    failed = [r for r in recs if r.outcome not in (Outcome.OK.value, Outcome.NOT_SENT.value)]
    assert failed and s.failed == len(failed), s
    for r in failed:  # in flight: reset or cut mid-stream; sent after: refused
        assert r.outcome in (Outcome.CONNECTION_ERROR.value, Outcome.TRUNCATED.value), r
        assert r.error and any(w in r.error.lower() for w in ("refused", "reset", "closed", "ended", "no response")), r
