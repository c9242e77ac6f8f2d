"""The real gevent client, driven through `python -m loadgen.probe` (pytest never imports gevent)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.loadgen.sse_server import Behaviour, SSEServer


def probe(server: SSEServer | str, manifest: Path, *args: str) -> dict[str, Any]:
    """One request through `python -m loadgen.probe` (the real client); its record as a dict.
    `server` is the test SSE server or any base URL."""
    host = server if isinstance(server, str) else server.url
    out = subprocess.run(
        [sys.executable, "-m", "loadgen.probe", "--manifest", str(manifest), "--fleet", "g6", "--host", host, *args],
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


def test_itl_counts_tokens_not_chunks(sse_server: SSEServer, example_manifest_path: Path) -> None:
    # vLLM-like stream: 12 tokens in 5 content chunks (1, 3, 2, 4, 2 tokens) and 2 empty-content
    # chunks, 30 ms apart; usage says 12. Content spans 6 gaps x 30 ms = 0.18 s, so the ITL is
    # 0.18 / 11 = 16.4 ms; the mean gap between content chunks (what was recorded) is 45 ms.
    sse_server.behaviour = Behaviour(ttft_s=0.02, itl_s=0.03, chunk_plan=(1, 3, 0, 2, 0, 4, 2))
    r = probe(sse_server, example_manifest_path, "--output-tokens", "12")
    assert r["outcome"] == "ok" and r["server_output_tokens"] == 12 and r["client_output_tokens"] == 5
    assert 0.18 / 11 <= r["itl_s"] < 0.18 / 11 + 0.012, r["itl_s"]  # never near the 45 ms chunk gap
    assert r["itl_basis"] == "server_tokens"
    assert r["itl_max_s"] >= 0.06  # the largest gap between content chunks, kept as an arrival figure


def test_itl_without_usage_falls_back_to_chunk_gaps(sse_server: SSEServer, example_manifest_path: Path) -> None:
    sse_server.behaviour = Behaviour(ttft_s=0.02, itl_s=0.03, usage=False)
    r = probe(sse_server, example_manifest_path, "--output-tokens", "4")
    assert r["outcome"] == "ok" and r["server_output_tokens"] is None
    assert 0.03 <= r["itl_s"] < 0.03 + 0.015 and r["itl_basis"] == "chunks"  # 4 chunks, 3 gaps of 30 ms: all there is


def test_usage_without_text_is_no_text_not_ok(sse_server: SSEServer, example_manifest_path: Path) -> None:
    sse_server.behaviour = Behaviour(text=False)
    r = probe(sse_server, example_manifest_path, "--output-tokens", "6")
    assert (r["outcome"], r["server_output_tokens"], r["ttft_s"], r["slo_ok"]) == ("no_text", 6, None, False)
    assert "6 output tokens" in r["error"]


@pytest.mark.parametrize(
    ("mode", "outcome", "status"),
    [
        ("error", "http_error", 503),
        ("stall", "timeout", 200),
        ("truncate", "truncated", 200),
        ("reset", "truncated", 200),
    ],
)
def test_faults_become_records(
    sse_server: SSEServer, example_manifest_path: Path, mode: str, outcome: str, status: int
) -> None:
    sse_server.behaviour = Behaviour(mode=mode, stall_s=3.0)
    r = probe(sse_server, example_manifest_path, "--output-tokens", "10", "--timeout-s", "0.5")
    assert (r["outcome"], r["http_status"]) == (outcome, status) and not r["slo_ok"] and r["error"]


def test_connection_refused(example_manifest_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert probe(f"http://127.0.0.1:{port}", example_manifest_path)["outcome"] == "connection_error"


def test_host_name_is_resolved(sse_server: SSEServer, example_manifest_path: Path) -> None:
    # "localhost" may resolve to ::1 first, where nothing listens: the client tries each address
    r = probe(sse_server, example_manifest_path, "--output-tokens", "3")
    url = sse_server.url.replace("127.0.0.1", "localhost")
    by_name = probe(url, example_manifest_path, "--output-tokens", "3")
    assert r["outcome"] == by_name["outcome"] == "ok" and by_name["client_output_tokens"] == 3


class _AnswerSource:
    """A loopback answer source as loadgen/resolver.py describes it: `answer(name)` is the body."""

    def __init__(self, answer: Any) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs, urlsplit

        asked: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = parse_qs(urlsplit(self.path).query)["name"][0]
                asked.append(name)
                body = answer(name)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.asked = asked
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/dns"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> _AnswerSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# RFC 6761 section 6.4: a name under .invalid never resolves, so only the answer source knows it.
NLB_NAME = "fleet-nlb.invalid"


def test_a_host_name_is_looked_up_at_the_answer_source_it_names(
    sse_server: SSEServer, example_manifest_path: Path
) -> None:
    from loadgen.resolver import encode_answer

    with _AnswerSource(lambda name: encode_answer(name, ["127.0.0.1"])) as src:
        url = f"http://{NLB_NAME}:{sse_server.port}"
        r = probe(url, example_manifest_path, "--output-tokens", "3", "--resolver", src.url)
    assert r["outcome"] == "ok" and r["client_output_tokens"] == 3
    assert src.asked == [NLB_NAME]


def test_an_answer_source_that_answers_badly_is_a_connection_error_naming_it(
    sse_server: SSEServer, example_manifest_path: Path
) -> None:
    with _AnswerSource(lambda name: b'{"name": "%s", "addresses": []}' % name.encode()) as src:
        r = probe(f"http://{NLB_NAME}:{sse_server.port}", example_manifest_path, "--resolver", src.url)
    assert r["outcome"] == "connection_error" and not sse_server.seen
    assert f"resolver {src.url}: addresses: expected a non-empty list" in r["error"]


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
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata: hello\r\n",
            "truncated",
            "not followed by CRLF",
        ),
    ],
)
def test_silent_or_garbled_servers_become_records(
    example_manifest_path: Path, reply: bytes | None, outcome: str, error: str
) -> None:
    srv = _RawServer(reply)
    try:
        r = probe(f"http://127.0.0.1:{srv.port}", example_manifest_path, "--timeout-s", "0.5")
    finally:
        srv.close()
    assert r["outcome"] == outcome and error in r["error"] and not r["slo_ok"]


def _full_backlog() -> tuple[Any, list[Any]]:
    """A listener whose accept queue is full: a new connect gets no SYN-ACK and hangs."""
    import socket

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fillers.append(c)
    return lst, fillers


@pytest.mark.parametrize(
    ("connect_timeout", "timeout", "outcome", "error"),
    [
        ("0.3", "5", "connection_error", "timed out after 0.3 s"),  # the connect timer fires first
        ("5", "0.3", "timeout", "no complete response within 0.3 s"),  # the request's deadline fires first
    ],
)
def test_connect_that_hangs_ends_at_the_first_timer(
    example_manifest_path: Path, connect_timeout: str, timeout: str, outcome: str, error: str
) -> None:
    lst, fillers = _full_backlog()
    try:
        r = probe(
            f"http://127.0.0.1:{lst.getsockname()[1]}",
            example_manifest_path,
            "--timeout-s",
            timeout,
            "--connect-timeout-s",
            connect_timeout,
        )
    finally:
        lst.close()
        for c in fillers:
            c.close()
    assert r["outcome"] == outcome and error in r["error"], r
    assert r["e2e_s"] < 3.0  # ended by the shorter timer, not the longer one


_BIG_REQUEST = r"""
import json, sys
from loadgen.client import StreamingClient
c = StreamingClient(sys.argv[1], api="completions", timeout_s=30)
wire = c.encode({"prompt": "x" * int(sys.argv[2])})
ex = c.stream(wire)
print(json.dumps({"status": ex.transport.http_status, "error": ex.transport.error, "tokens": ex.state.content_chunks,
                  "done": ex.state.done, "finish": ex.state.finish_reason}))
"""


def test_request_larger_than_the_socket_buffers_is_sent_whole() -> None:
    # A 24 MB body cannot go out in one send(): the client must wait for writability and go on
    # where it stopped. The server only answers once it has every byte it was promised.
    import socket
    import threading

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    got: list[int] = []  # Content-Length, body bytes received

    def serve() -> None:
        conn, _ = lst.accept()
        with conn:
            threading.Event().wait(0.3)  # let the client's buffers fill first
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head, body = buf.split(b"\r\n\r\n", 1)
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            n = len(body)
            while n < length:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                n += len(chunk)
            got.extend((length, n))
            events = [
                {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
                {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
            ]
            payload = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + payload)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    size = 24 << 20
    try:
        out = subprocess.run(
            [sys.executable, "-c", _BIG_REQUEST, f"http://127.0.0.1:{lst.getsockname()[1]}", str(size)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=True,
        )
    finally:
        lst.close()
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"status": 200, "error": None, "tokens": 2, "done": True, "finish": "length"}
    body = len(json.dumps({"prompt": "x" * size}, separators=(",", ":")))
    assert got == [body, body]


_FIRST_TOKEN = r"""
import json, socket, sys, threading, time
import gevent
from gevent.event import Event
from loadgen.client import StreamingClient

lst = socket.socket()
lst.bind(("127.0.0.1", 0))
lst.listen(4)
go = threading.Event()
box = {}

def chunk(payload):
    return b"%x\r\n%s\r\n" % (len(payload), payload)

def event(obj):
    return chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

def serve():
    c, _ = lst.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += c.recv(65536)
    box["request_seen"] = time.monotonic()
    c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    box["first_write"] = time.monotonic()
    c.sendall(event({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}))
    go.wait(10)
    box["last_write"] = time.monotonic()
    c.sendall(event({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]})
              + event({"choices": [], "usage": {"completion_tokens": 2}}) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    c.close()

threading.Thread(target=serve, daemon=True).start()
client = StreamingClient(f"http://127.0.0.1:{lst.getsockname()[1]}", api="completions", timeout_s=10)
client.kernel_stamps = client.kernel_stamps and sys.argv[1] == "kernel"
done, out = Event(), []
st = client.open(client.encode({"prompt": "x", "max_tokens": 2, "stream": True}), lambda ex: (out.append(ex), done.set()))
st.begin()
priority_waiting = st._watcher.priority
time.sleep(0.5)  # the hub is blocked: the head and the first token arrive meanwhile, unread
unblocked = time.monotonic()
while not st.state.chunk_times:
    gevent.sleep(0.001)
priority_streaming = st._watcher.priority
go.set()
done.wait(10)
ex = out[0]
print(json.dumps({**box, "unblocked": unblocked, "sent": ex.sent_t, "times": ex.state.chunk_times, "kernel": client.kernel_stamps,
                  "priorities": [priority_waiting, priority_streaming], "error": ex.transport.error,
                  "tokens": [ex.state.content_chunks, ex.state.server_output_tokens], "done": ex.state.done}))
"""


@pytest.mark.parametrize("stamps", ["kernel", "read"])
def test_first_token_is_stamped_when_it_arrived_not_when_the_loop_read_it(stamps: str) -> None:
    # The hub is kept from running for 0.5 s while the first token arrives. With the kernel's
    # receive time (Linux) its stamp is the arrival, not the read 0.5 s later; the bytes of a
    # read are never stamped before their newest byte was written. Also: the request is on the
    # wire when begin() returns (the server saw it while the hub was blocked), and a stream waits
    # for its first token at a higher priority than it streams at.
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_TOKEN, stamps], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if stamps == "kernel" and not r["kernel"]:
        pytest.skip("no kernel receive timestamps on this platform")
    assert r["error"] is None and r["tokens"] == [2, 2] and r["done"]
    assert r["sent"] <= r["request_seen"] < r["unblocked"]  # sent from begin(), not a loop iteration later
    assert r["priorities"] == [1, 0]
    first, last = r["times"]
    if stamps == "kernel":
        assert r["first_write"] <= first < r["first_write"] + (r["unblocked"] - r["first_write"]) / 2
    else:
        assert first >= r["unblocked"]  # the read's own time: what the kernel's stamp replaces
    assert last >= r["last_write"]


_BUSY_LOOP = r"""
import json, socket, sys, threading, time
import gevent
from gevent.event import Event
import loadgen.client as lc

lst = socket.socket()
lst.bind(("127.0.0.1", 0))
lst.listen(16)
conns, ready, slow_started, box = {}, threading.Event(), threading.Event(), {}

def chunk(payload):
    return b"%x\r\n%s\r\n" % (len(payload), payload)

def token(text, finish=None):
    return chunk(b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}).encode() + b"\n\n")

def end(n):
    return chunk(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % n) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"

def serve():
    while len(conns) < 5:
        c, _ = lst.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        req = b""
        while b"\r\n\r\n" not in req:
            req += c.recv(65536)
        rid = req.split(b"X-Request-Id: ")[1].split(b"\r\n")[0].decode()
        conns[rid] = c
        c.sendall(HEAD + (token("x") if rid.startswith("busy") else b""))  # the busy ones are streaming already
    ready.wait(10)
    for i in range(4):  # while the hub is blocked: four streams readable at once, one loop iteration
        conns[f"busy{i}"].sendall(token("slow"))
    slow_started.wait(10)
    box["t1"] = time.monotonic()
    conns["first"].sendall(token("a"))  # arrives while the first slow read runs
    time.sleep(0.15)
    box["t2"] = time.monotonic()
    conns["first"].sendall(token("b", "length") + end(2))
    time.sleep(0.3)
    for i in range(4):
        conns[f"busy{i}"].sendall(token("x", "length") + end(3))

_feed = lc.feed_events
def slow_feed(parser, state, chunk, now):
    if b'"slow"' in chunk:
        slow_started.set()
        time.sleep(0.08)  # a heavy read: the iteration of four of them lasts 320 ms
    _feed(parser, state, chunk, now)
lc.feed_events = slow_feed

threading.Thread(target=serve, daemon=True).start()
client = lc.StreamingClient(f"http://127.0.0.1:{lst.getsockname()[1]}", api="completions", timeout_s=10)
if sys.argv[1] == "no-poll":
    client.poll_waiting = lambda now: None
out, done = {}, Event()
def finished(rid, ex):
    out[rid] = ex
    if len(out) == 5:
        done.set()
for rid in ["busy0", "busy1", "busy2", "busy3", "first"]:
    client.open(client.encode({"prompt": "x", "max_tokens": 2, "stream": True}, rid), lambda ex, rid=rid: finished(rid, ex)).begin()
while len(conns) < 5:
    gevent.sleep(0.01)
gevent.sleep(0.05)  # every head and the busy ones' first tokens read
ready.set()
time.sleep(0.1)  # the hub is blocked while the four slow frames arrive
done.wait(10)
ex = out["first"]
print(json.dumps({**box, "times": ex.state.chunk_times, "kernel": client.kernel_stamps, "error": ex.transport.error,
                  "busy_ok": [out[f"busy{i}"].transport.error is None and out[f"busy{i}"].state.content_chunks == 3 for i in range(4)]}))
"""


@pytest.mark.parametrize("poll", ["poll", "no-poll"])
def test_a_first_token_is_read_between_the_reads_of_a_long_iteration(poll: str) -> None:
    # Four streaming streams become readable together and each of their reads takes 80 ms; a
    # fifth stream's first token arrives during the first of them, its second 150 ms later. The
    # waiting stream is read between two slow reads, so its first token has its own stamp;
    # left to the next loop iteration (no-poll) it is read after its second, which stamps both.
    # The gaps are wide for a loaded machine: at 30 ms reads and a 45 ms gap, `make test` once
    # stamped the first token 66 us after its second (the reading thread held off the CPU for
    # the whole gap); the iteration (320 ms) still outlasts the second token by 170 ms.
    out = subprocess.run(
        [sys.executable, "-c", _BUSY_LOOP, poll], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if not r["kernel"]:
        pytest.skip("no kernel receive timestamps on this platform: the read's time stamps every token")
    assert r["error"] is None and len(r["times"]) == 2 and all(r["busy_ok"])
    first, second = r["times"]
    assert second >= r["t2"]
    if poll == "poll":
        assert r["t1"] <= first < r["t2"]
    else:
        assert first >= r["t2"]  # what the poll prevents


_SPREAD = r"""
import json, socket, sys, threading, time
import gevent
from gevent.event import Event
from testing.nlb_dns import NlbDns, NlbDnsServer, Target, loopback_nodes
from loadgen.client import StreamingClient, http_resolver

NAME = "fleet-nlb.invalid"
AZS = ["az-a", "az-b", "az-c", "az-d"]
NODES = loopback_nodes(AZS)  # 127.0.0.2 .. 127.0.0.5, one NLB node per AZ
HELD = NODES["az-d"]  # its answers wait until `release`: a stream still running when its AZ leaves DNS

def chunk(p):
    return b"%x\r\n%s\r\n" % (len(p), p)

REPLY = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
         + chunk(b'data: {"choices":[{"index":0,"text":"a","finish_reason":"length"}]}\n\n')
         + chunk(b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
served = {}  # request id -> the address it was sent to (the server's local address)
release = threading.Event()

def handle(c):
    with c:
        req = b""
        while b"\r\n\r\n" not in req:
            req += c.recv(65536)
        rid = req.split(b"X-Request-Id: ")[1].split(b"\r\n")[0].decode()
        ip = c.getsockname()[0]
        served[rid] = ip
        if ip == HELD:
            release.wait(10)
        c.sendall(REPLY)

def listen(ip, port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(128)
    return s

def serve(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()

first = listen(NODES["az-a"], 0)
port = first.getsockname()[1]
for s in [first] + [listen(NODES[az], port) for az in AZS[1:]]:  # every node on the listener's port
    threading.Thread(target=serve, args=(s,), daemon=True).start()

dns = NlbDns(NAME, NODES, cross_zone=False, targets=[Target("g6", az, True) for az in AZS])
results = {}

def send(client, rids):
    done = Event()
    def finished(rid, ex):
        results[rid] = ex.transport.error
        if all(r in results for r in rids):
            done.set()
    for rid in rids:
        client.open(client.encode({"prompt": "x", "max_tokens": 1, "stream": True}, rid),
                    lambda ex, rid=rid: finished(rid, ex)).begin()
    return done

with NlbDnsServer({NAME: dns}) as src:
    client = StreamingClient(f"http://{NAME}:{port}", api="completions", timeout_s=10, resolver=http_resolver(src.url))
    client.resolve()  # once, as the replayer does before its clock starts
    release.set()
    send(client, [f"a{i}" for i in range(40)]).wait(10)
    release.clear()
    held = send(client, [f"h{i}" for i in range(4)])  # one of them lands on the held node
    while sum(r.startswith("h") for r in served) < 4:
        gevent.sleep(0.01)
    dns.set_targets([Target("g6", az, az != "az-d") for az in AZS])  # az-d's only target fails
    client.resolve()  # the replayer's periodic lookup
    after = [a[1][0] for a in client.addresses]
    send(client, [f"b{i}" for i in range(40)]).wait(10)
    release.set()
    held.wait(10)
print(json.dumps({"served": served, "errors": results, "after": after, "held": HELD}))
"""


def test_connections_spread_over_every_address_of_the_name_and_leave_a_dropped_one() -> None:
    # An NLB name answers one node address per AZ (testing/nlb_dns.py): 40 requests after one lookup
    # go to each of the four nodes in turn, not all to the first address. Once an AZ leaves the
    # answer, new requests go only to the others, and the stream already on its node finishes.
    out = subprocess.run([sys.executable, "-c", _SPREAD], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    served, held = r["served"], r["held"]
    assert set(r["errors"]) == set(served) and not any(r["errors"].values()), r["errors"]
    by_phase = {p: Counter(ip for rid, ip in served.items() if rid.startswith(p)) for p in "ahb"}
    assert by_phase["a"] == {f"127.0.0.{i}": 10 for i in range(2, 6)}
    assert held not in r["after"] and len(r["after"]) == 3
    assert sorted(by_phase["b"]) == sorted(r["after"]) and sorted(by_phase["b"].values()) == [13, 13, 14]
    assert by_phase["h"][held] == 1  # ... and it completed (no error above) after its AZ left DNS
