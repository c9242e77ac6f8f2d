"""Against runtime.emulator (skipped until it exists): the real conv trace, 60 s window."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.launch import run_fleet
from loadgen.recording import read_records
from tests.conftest import ROOT
from tests.loadgen.conftest import small_manifest_data, write

pytestmark = pytest.mark.skipif(
    not (ROOT / "runtime" / "emulator" / "__main__.py").is_file(), reason="runtime.emulator not present yet"
)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory, _example_data: dict[str, Any]) -> Iterator[tuple[Path, str]]:
    """One emulator for the module's tests (its start is seconds on a loaded machine); each test
    reads only what its own requests left on it."""
    tmp_path = tmp_path_factory.mktemp("emulator")
    data = small_manifest_data(_example_data, time_scale=0.2)  # 60 s of trace in 12 s
    data["loadgen"]["request_timeout_s"] = 30.0
    m = write(tmp_path, data)
    port_file = tmp_path / "port"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime.emulator",
            "--manifest",
            str(m),
            "--fleet",
            "g6",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        url = re.search(r"http://\S+", line)
        assert url, line
        yield m, url.group(0)
    finally:
        p.terminate()
        p.wait(10)


def _metric_mean(text: str, name: str) -> float:
    total = sum(float(x) for x in re.findall(rf"^{re.escape(name)}_sum\{{[^}}]*\}} (\S+)", text, re.M))
    count = sum(float(x) for x in re.findall(rf"^{re.escape(name)}_count\{{[^}}]*\}} (\S+)", text, re.M))
    assert count > 0, name
    return total / count


def test_conv_window_against_emulator(emulator: tuple[Path, str], tmp_path: Path) -> None:
    manifest, url = emulator
    s = run_fleet(manifest, "g6", url, tmp_path / "run")
    assert s.invariant_holds() and s.completed == s.scheduled > 50, s.invalid_reasons
    recs = list(read_records(sorted((tmp_path / "run").glob("records-g6-*.jsonl"))))
    assert all(r.server_prompt_tokens == r.input_tokens for r in recs)
    assert s.token_count_mismatch_rate == 0.0
    metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    server_ttft = _metric_mean(metrics, "vllm:time_to_first_token_seconds")
    server_itl = _metric_mean(metrics, "vllm:inter_token_latency_seconds")
    client_ttft = sum(r.ttft_s or 0 for r in recs) / len(recs)
    gaps = sum(r.client_output_tokens - 1 for r in recs)
    client_itl = sum((r.itl_s or 0) * (r.client_output_tokens - 1) for r in recs) / gaps
    # The client sees the server's latency plus send lag and loopback: close, never below it.
    assert server_ttft - 0.005 <= client_ttft <= server_ttft + 0.05, (client_ttft, server_ttft)
    assert abs(client_itl - server_itl) <= 0.1 * server_itl + 0.002, (client_itl, server_itl)
    # Per request, joined on the X-Request-Id the loadgen sends: the client's TTFT from its send
    # contains the server's from arrival (one clock: CLOCK_MONOTONIC is shared by processes).
    from loadgen.openai_request import request_id_header

    truth = {
        g["id"]: g
        for g in json.loads(urllib.request.urlopen(f"{url}/emulator/requests", timeout=10).read())["requests"]
    }
    campaign = recs[0].campaign
    diffs = []
    for r in recs:
        g = truth[request_id_header(campaign, "g6", r.request_id)]
        assert g["tokens"] == r.client_output_tokens
        diffs.append((r.ttft_s or 0) - (r.send_lag_s or 0) - (g["first_token_written"] - g["arrival"]))
    diffs.sort()
    assert diffs[0] > -0.001 and diffs[len(diffs) // 2] < 0.02, (diffs[0], diffs[len(diffs) // 2])
    assert "exactly as the manifest's tokenizer does" in (tmp_path / "run" / "locust-g6-standalone.log").read_text()
    assert all(r.client_prompt_tokens == r.server_prompt_tokens for r in recs) and s.prompt_token_mismatch_rate == 0.0


def test_a_template_the_server_does_not_use_stops_the_run_before_it_sends(
    emulator: tuple[Path, str], tmp_path: Path
) -> None:
    manifest, url = emulator
    data = yaml.safe_load(manifest.read_text())
    # One extra word in the loadgen's copy of the template: every prompt would be a token long.
    data["tokenizer"]["chat_template"] = "note " + data["tokenizer"]["chat_template"]
    wrong = write(tmp_path, data, "wrong.yaml")
    before = json.loads(urllib.request.urlopen(f"{url}/emulator/requests", timeout=10).read())["requests"]
    s = run_fleet(wrong, "g6", url, tmp_path / "run")
    assert not s.valid
    assert any("setup failed" in r and "the server counts" in r for r in s.invalid_reasons), s.invalid_reasons
    sent = json.loads(urllib.request.urlopen(f"{url}/emulator/requests", timeout=10).read())["requests"]
    assert sent == before  # /tokenize is not generation: nothing was replayed (the module's emulator is shared)
    # ... and every scheduled request still has its record, not_sent with the cause: the replay
    # invariant (scheduled = ok + errors + not_sent) holds for a stopped run too.
    from core.manifest import load_manifest
    from core.schedule import build_schedule

    scheduled = [r.request_id for r in build_schedule(load_manifest(wrong))]
    recs = list(read_records(sorted((tmp_path / "run").glob("records-g6-*.jsonl"))))
    assert sorted(r.request_id for r in recs) == sorted(scheduled)
    assert all(
        r.outcome == "not_sent" and "setup failed" in (r.error or "") and "the server counts" in (r.error or "")
        for r in recs
    )
