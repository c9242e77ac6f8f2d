"""bench/reference_server.py, the loadgen ceiling bench's ground truth, against the real client."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT))
from bench import reference_server as refsrv

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
    out = subprocess.run([sys.executable, "-c", _STREAMS, server.url, "12", "30"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    streams = {s["id"]: s for s in json.loads(out.stdout.strip().splitlines()[-1])}
    truth = server.truth()
    rows = {r["id"]: r for r in truth["requests"]}
    assert set(streams) == set(rows) and len(rows) == 12
    assert truth["tokens"] == 12 * 30 and truth["dropped"] == 0
    for rid, s in streams.items():
        g = rows[rid]
        assert s["error"] is None and s["done"] and s["finish"] == "length"
        assert len(s["times"]) == s["usage"] == g["tokens"] == 30  # a timestamp for every token frame, each counted once
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
