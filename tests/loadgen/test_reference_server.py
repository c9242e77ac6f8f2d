"""testing/reference_server.py, the loadgen ceiling bench's ground truth, against the real client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import reference_server as refsrv
from tests.conftest import ROOT

_STREAMS = r"""
import json, sys
import gevent
from gevent.event import Event
from loadgen.client import StreamingClient

client = StreamingClient(sys.argv[1], api="completions", timeout_s=20)
n, tokens = int(sys.argv[2]), int(sys.argv[3])
left, out = [n], []
done = Event()

def finished(ex, rid):
    out.append({"id": rid, "sent": ex.sent_t, "times": ex.state.chunk_times, "usage": ex.state.server_output_tokens,
                "finish": ex.state.finish_reason, "done": ex.state.done, "error": ex.transport.error})
    left[0] -= 1
    if not left[0]:
        done.set()

for i in range(n):
    rid = f"t-{i}"
    wire = client.encode({"prompt": "a b c", "max_tokens": tokens, "stream": True}, rid)
    client.open(wire, lambda ex, rid=rid: finished(ex, rid)).begin()
    gevent.sleep(0.003)
done.wait(30)
print(json.dumps(out))
"""


CLOCK_CONVERSION_S = 2e-4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[refsrv.ServerProcess]:
    s = refsrv.start(0.02, 0.004, tmp_path, core=None, spin=False)
    yield s
    s.close()


def test_every_token_and_every_first_token_time_against_the_servers_truth(server: refsrv.ServerProcess) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _STREAMS, server.url, "12", "30"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    streams = {s["id"]: s for s in json.loads(out.stdout.strip().splitlines()[-1])}
    truth = server.truth()
    rows = {r["id"]: r for r in truth["requests"]}
    assert set(streams) == set(rows) and len(rows) == 12
    assert truth["tokens"] == 12 * 30 and truth["dropped"] == 0
    for rid, s in streams.items():
        g = rows[rid]
        assert s["error"] is None and s["done"] and s["finish"] == "length"
        assert (
            len(s["times"]) == s["usage"] == g["tokens"] == 30
        )  # a timestamp for every token frame, each counted once
        assert s["sent"] <= g["arrival"] and g["arrival"] + 0.02 <= g["first_write"]  # never before its due time
        # the client's stamp is never before the server wrote the token, up to the kernel stamp's
        # conversion from CLOCK_REALTIME (two clock reads a few microseconds apart: 7 us seen here)
        assert s["times"][0] >= g["first_write"] - CLOCK_CONVERSION_S
        assert s["times"] == sorted(s["times"])
    assert server.truth()["requests"] == []  # a drain forgets what it returned


def test_anything_but_a_post_is_answered_and_closed(server: refsrv.ServerProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/metrics", timeout=10)  # vllm bench serve asks for it
    assert e.value.code == 404
    assert server.truth()["requests"] == []


class _FakeSocket:
    """What the server's write loop sees of a client: a send that takes at most `take` bytes (the
    kernel's buffer full) or fails (the client gone)."""

    def __init__(self, fd: int, take: int | None = None, fail: bool = False) -> None:
        self.fd, self.take, self.fail = fd, take, fail
        self.got = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return self.fd

    def send(self, data: bytes) -> int:
        if self.fail:
            raise ConnectionResetError
        n = len(data) if self.take is None else min(self.take, len(data))
        self.got += data[:n]
        return n

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def inproc() -> Iterator[refsrv.ReferenceServer]:
    s = refsrv.ReferenceServer(0.0, 1.0)  # 1 s ITL: the test places each stream's due times itself
    yield s
    s.lsock.close()
    s._ep.close()


def _streaming(server: refsrv.ReferenceServer, sock: _FakeSocket, tokens: int) -> refsrv._Conn:
    """A stream whose first token is written and whose second is due now (the write loop's
    common case)."""
    c = refsrv._Conn(sock)  # type: ignore[arg-type]
    c.n, c.k, c.frame = tokens, 1, refsrv.TOKEN_FRAME[False]
    c.due0 = time.monotonic() - 1.5 * server.itl_s
    server._conns[c.fd] = c
    return c


def test_a_short_send_keeps_every_byte_in_order(inproc: refsrv.ReferenceServer) -> None:
    sock = _FakeSocket(100_000, take=100)
    c = _streaming(inproc, sock, 10)
    inproc._write_due([c], int(time.monotonic() * 1000))
    assert (
        bytes(sock.got) == c.frame[:100] and c.out == c.frame[100:] and c.k == 2
    )  # the token is written, its rest kept
    assert list(inproc._wheel.values()) == [[c]]  # back on the wheel for its next token
    sock.take = None
    c.due0 -= inproc.itl_s  # the third token is due
    inproc._write_due(inproc._wheel.pop(min(inproc._wheel)), int(time.monotonic() * 1000))
    assert bytes(sock.got) == c.frame * 2 and c.out == b"" and c.k == 3  # the rest first, then the next frame
    assert inproc.tokens == 2 and inproc.dropped == 0 and list(inproc._wheel.values()) == [[c]]


def test_a_client_gone_mid_stream_is_dropped_and_closed(inproc: refsrv.ReferenceServer) -> None:
    sock = _FakeSocket(100_001, fail=True)
    c = _streaming(inproc, sock, 10)
    inproc._write_due([c], int(time.monotonic() * 1000))
    assert inproc.dropped == 1 and sock.closed and c.fd not in inproc._conns
    assert not any(inproc._wheel.values()) and inproc.tokens == 0
