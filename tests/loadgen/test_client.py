"""The real gevent client, driven through `python -m loadgen.probe` (pytest never imports gevent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.loadgen.sse_server import Behaviour, SSEServer


def probe(server: SSEServer, manifest: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "loadgen.probe", "--manifest", str(manifest), "--fleet", "g6", "--host", server.url, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ok_stream_exact_prompt_tokens_and_timing(sse_server: SSEServer, example_manifest_path: Path) -> None:
    sse_server.behaviour = Behaviour(ttft_s=0.05, itl_s=0.01)
    r = probe(sse_server, example_manifest_path, "--input-tokens", "300", "--output-tokens", "12")
    assert r["outcome"] == "ok" and r["finish_reason"] == "length"
    assert r["server_prompt_tokens"] == 300  # counted by the server through the manifest's template
    assert r["client_output_tokens"] == r["server_output_tokens"] == 12
    assert 0.05 <= r["ttft_s"] < 0.5 and 0.01 <= r["itl_s"] < 0.1
    body = sse_server.seen[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["role"] == "user" and body["max_tokens"] == 12


def test_completions_api(sse_server: SSEServer, example_manifest_path: Path) -> None:
    r = probe(sse_server, example_manifest_path, "--api", "completions", "--input-tokens", "40", "--output-tokens", "3")
    assert r["outcome"] == "ok" and r["server_prompt_tokens"] == 40 and "prompt" in sse_server.seen[-1]


def test_client_queueing_is_in_ttft(sse_server: SSEServer, example_manifest_path: Path) -> None:
    sse_server.behaviour = Behaviour(ttft_s=0.02, itl_s=0.005)
    r = probe(sse_server, example_manifest_path, "--delay-s", "0.4", "--output-tokens", "3")
    assert r["send_lag_s"] >= 0.4 and r["ttft_s"] >= 0.42
    assert r["ttft_s"] - r["send_lag_s"] < 0.3


def test_token_count_disagreement_recorded(sse_server: SSEServer, example_manifest_path: Path) -> None:
    sse_server.behaviour = Behaviour(mode="multi")  # two tokens per SSE chunk
    r = probe(sse_server, example_manifest_path, "--output-tokens", "10")
    assert (r["client_output_tokens"], r["server_output_tokens"], r["outcome"]) == (5, 10, "ok")


@pytest.mark.parametrize(
    ("mode", "outcome", "status"),
    [("error", "http_error", 503), ("stall", "timeout", 200), ("truncate", "truncated", 200), ("reset", "truncated", 200)],
)
def test_faults_become_records(sse_server: SSEServer, example_manifest_path: Path, mode: str, outcome: str, status: int) -> None:
    sse_server.behaviour = Behaviour(mode=mode, stall_s=3.0)
    r = probe(sse_server, example_manifest_path, "--output-tokens", "10", "--timeout-s", "0.5")
    assert (r["outcome"], r["http_status"]) == (outcome, status) and not r["slo_ok"] and r["error"]


def test_connection_refused(example_manifest_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-m", "loadgen.probe", "--manifest", str(example_manifest_path), "--fleet", "g6", "--host", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout)["outcome"] == "connection_error"


def test_host_name_is_resolved(sse_server: SSEServer, example_manifest_path: Path) -> None:
    # "localhost" may resolve to ::1 first, where nothing listens: the client tries each address
    r = probe(sse_server, example_manifest_path, "--output-tokens", "3")
    url = sse_server.url.replace("127.0.0.1", "localhost")
    out = subprocess.run(
        [sys.executable, "-m", "loadgen.probe", "--manifest", str(example_manifest_path), "--fleet", "g6", "--host", url, "--output-tokens", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    by_name = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["outcome"] == by_name["outcome"] == "ok" and by_name["client_output_tokens"] == 3


class _RawServer:
    """Accepts connections, reads the request, then sends `reply` (or nothing) and holds on."""

    def __init__(self, reply: bytes | None) -> None:
        import socket
        import threading

        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            c.recv(65536)
            if self.reply is not None:
                c.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize(
    ("reply", "outcome", "error"),
    [
        (None, "timeout", "no complete response within 0.5 s"),  # accepts, never answers
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "connection_error", "bad status line"),  # not HTTP
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata: hello\r\n", "truncated", "not followed by CRLF"),
    ],
)
def test_silent_or_garbled_servers_become_records(example_manifest_path: Path, reply: bytes | None, outcome: str, error: str) -> None:
    srv = _RawServer(reply)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "loadgen.probe", "--manifest", str(example_manifest_path), "--fleet", "g6",
             "--host", f"http://127.0.0.1:{srv.port}", "--timeout-s", "0.5"],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
        )
    finally:
        srv.close()
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["outcome"] == outcome and error in r["error"] and not r["slo_ok"]
