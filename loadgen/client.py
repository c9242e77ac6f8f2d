"""The one streaming client: POST an OpenAI-style request with stream=true, time every token.

gevent-based (imports gevent; never import it from the analysis). One TCP connection per
request: a stream abandoned on timeout can never poison a pooled connection, and the cost
(one loopback/VPC handshake) is part of what a real client pays. The HTTP/1.1 response is
parsed by `loadgen.http1`, fed straight from `recv` so each chunk is timestamped the moment
it arrives; it costs a fraction of a general-purpose parser's per-chunk callbacks, which
matters at tens of thousands of chunks per second (bench/loadgen_capacity.py).
"""

from __future__ import annotations

import _socket
import errno
import ipaddress
import json
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gevent import get_hub
from gevent import socket as gsocket
from gevent.event import Event

from campaign.manifest import Generation
from loadgen.http1 import ResponseParser
from loadgen.prompts import Api, Prompt
from loadgen.sse import SSEParser, StreamState, Transport

PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ERR_BODY_MAX = 2048
# A token frame is ~200-400 bytes; a small buffer is cheaper to allocate on every recv (about
# 1 us less than 64 KiB here), and a level-triggered watcher calls again if more is waiting.
_RECV_BYTES = 4096


@dataclass(frozen=True)
class Exchange:
    state: StreamState
    transport: Transport
    sent_t: float
    end_t: float


def request_body(api: Api, model: str, gen: Generation, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        **prompt.payload_fields(),
        "max_tokens": max_tokens,
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "seed": gen.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Replay the trace's output length: vLLM's extension to keep generating past EOS.
        "ignore_eos": True,
    }
    if gen.top_k != -1:
        body["top_k"] = gen.top_k
    if gen.stop:
        body["stop"] = list(gen.stop)
    return body


def request_id_header(campaign: str, fleet: str, request_id: int) -> str:
    """The X-Request-Id of one scheduled request: unique within a campaign, and it names the
    record (campaign, fleet, request_id) it belongs to."""
    return f"{campaign}-{fleet}-{request_id}"


class StreamingClient:
    def __init__(self, base_url: str, *, api: Api, timeout_s: float, connect_timeout_s: float = 10.0, api_key: str | None = None):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"need an http://host:port URL, got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or 80
        self.api: Api = api
        self.path = (u.path.rstrip("/") + PATHS[api]) if u.path not in ("", "/") else PATHS[api]
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n{auth}"
        ).encode()

    def encode(self, body: dict[str, Any], request_id: str | None = None) -> bytes:
        """The request's bytes. `request_id` goes out as X-Request-Id (vLLM logs it and, with
        --enable-request-id-headers, echoes it), so server logs can be joined to records."""
        data = json.dumps(body, separators=(",", ":")).encode()
        rid = f"X-Request-Id: {request_id}\r\n" if request_id else ""
        return self._head + f"{rid}Content-Length: {len(data)}\r\n\r\n".encode() + data

    def stream(self, wire: bytes, timeout_s: float | None = None) -> Exchange:
        """Send pre-encoded request bytes (see `encode`) and read the whole stream.

        `timeout_s` overrides the client's deadline for this one request. The response is read
        from readiness callbacks in gevent's hub (`_Reader`), not by this greenlet blocking in
        `recv`: a stream costs two greenlet switches instead of two per token, which is what
        lets one core carry hundreds of streams without delaying the sending loop."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        sent_t = time.monotonic()
        deadline = sent_t + limit
        reader: _Reader | None = None
        sock: _socket.socket | None = None
        timed_out = False
        error: str | None = None
        try:
            sock = self._connect(deadline)
            _send_all(sock, wire, deadline)
            reader = _Reader(sock)
            try:
                if not reader.done.wait(max(0.0, deadline - time.monotonic())):
                    raise _DeadlinePassed
            finally:
                reader.close()
            error = reader.error
        except _DeadlinePassed:
            timed_out = True
            error = f"no complete response within {limit:g} s"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            end_t = time.monotonic()
            if sock is not None:
                sock.close()
        if reader is None:
            return Exchange(StreamState(), Transport(None, timed_out, error, False), sent_t, end_t)
        resp = reader.resp
        headers = bool(resp.headers_complete)
        status = resp.status_code if headers else None
        if headers and status != 200 and error is None:
            error = f"HTTP {status}: {reader.err_body.decode('utf-8', errors='replace').strip()[:300]}"
        return Exchange(reader.state, Transport(status, timed_out, error, headers), sent_t, end_t)

    def _addresses(self) -> list[tuple[int, tuple[Any, ...]]]:
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:  # a name (an NLB's DNS name): resolve per request, as NLB IPs change
            return [(fam, addr) for fam, _, _, _, addr in gsocket.getaddrinfo(self.host, self.port, 0, _socket.SOCK_STREAM)]
        return [(_socket.AF_INET6 if ip.version == 6 else _socket.AF_INET, (self.host, self.port))]

    def _connect(self, deadline: float) -> _socket.socket:
        last: Exception | None = None
        for family, addr in self._addresses():
            s = _socket.socket(family, _socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                err = s.connect_ex(addr)
                if err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
                    left = deadline - time.monotonic()
                    wait = min(self.connect_timeout_s, left)
                    try:
                        gsocket.wait_write(s.fileno(), timeout=max(0.0, wait))
                    except _socket.timeout:
                        if wait >= left:
                            raise _DeadlinePassed from None
                        raise TimeoutError(f"connect to {addr[0]}:{addr[1]} timed out after {self.connect_timeout_s:g} s") from None
                    err = s.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
                if err:
                    raise OSError(err, f"connect to {addr[0]}:{addr[1]}: {os.strerror(err)}")
                return s
            except BaseException as exc:
                s.close()
                if not isinstance(exc, OSError):
                    raise
                last = exc
        raise last or OSError(f"no address for {self.host}")


class _DeadlinePassed(Exception):
    """The request's overall deadline (request_timeout_s, or the SLO bound) passed."""


def _send_all(sock: _socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            try:
                gsocket.wait_write(sock.fileno(), timeout=max(0.0, deadline - time.monotonic()))
            except _socket.timeout:
                raise _DeadlinePassed from None


class _Reader:
    """One response, driven by readiness callbacks that run in the hub (never block here).

    Each callback reads what the kernel holds, stamps it with the monotonic clock, and feeds
    the HTTP/1.1 parser (chunked framing) and then the SSE parser. `done` is set once the response ended,
    the peer closed, or something failed."""

    __slots__ = ("done", "err_body", "error", "now", "parser", "resp", "sock", "state", "watcher")

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.state = StreamState()
        self.parser = SSEParser()
        self.err_body = bytearray()
        self.resp = ResponseParser(self._on_body)
        self.now = 0.0
        self.error: str | None = None
        self.done = Event()
        self.watcher = get_hub().loop.io(sock.fileno(), 1)  # 1 = readable
        self.watcher.start(self.on_readable)

    def close(self) -> None:
        """Idempotent. Stops the watcher first: a level-triggered watcher on a socket at EOF
        would otherwise call back on every loop iteration until the greenlet wakes."""
        self.watcher.stop()
        self.watcher.close()

    def _on_body(self, data: bytes) -> None:
        if self.resp.status_code == 200:
            on_event, now = self.state.on_event, self.now
            for ev in self.parser.feed(data):
                on_event(ev, now)
        elif len(self.err_body) < _ERR_BODY_MAX:
            self.err_body.extend(data[: _ERR_BODY_MAX - len(self.err_body)])

    def on_readable(self) -> None:
        resp = self.resp
        try:
            data = self.sock.recv(_RECV_BYTES)
            self.now = time.monotonic()
            if data:
                resp.feed(data)
                if not resp.message_complete:
                    return
                self._finish()
                return
            resp.feed_eof()  # completes a close-delimited body
            if not resp.message_complete:
                self.error = "connection closed before the response ended"
        except BlockingIOError:
            return  # spurious readiness
        except Exception as exc:  # a reset, or bytes the parser rejects: this stream fails, the hub goes on
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        self._finish()

    def _finish(self) -> None:
        self.watcher.stop()
        self.done.set()
