"""The one streaming client: POST an OpenAI-style request with stream=true, time every token.

gevent-based (imports gevent; never import it from the analysis). One TCP connection per
request: a stream abandoned on timeout can never poison a pooled connection, and the cost
(one loopback/VPC handshake) is part of what a real client pays. The HTTP/1.1 response is
parsed by geventhttpclient's llhttp parser, fed straight from `recv` so each chunk is
timestamped the moment it arrives (its `read()` waits for a full block: useless for timing).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import gevent
from gevent import socket
from geventhttpclient.response import HTTPResponse

from campaign.manifest import Generation
from loadgen.prompts import Api, Prompt
from loadgen.sse import SSEParser, StreamState, Transport

PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ERR_BODY_MAX = 2048


@dataclass(frozen=True)
class Exchange:
    state: StreamState
    transport: Transport
    sent_t: float
    end_t: float


class _Response(HTTPResponse):
    """Routes body bytes to a callback as the parser sees them (chunked framing removed)."""

    def __init__(self, on_body: Any) -> None:
        super().__init__(method="POST")
        self._sink = on_body

    def _on_body(self, buf: bytearray) -> None:
        self._sink(bytes(buf))


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

    def encode(self, body: dict[str, Any]) -> bytes:
        data = json.dumps(body, separators=(",", ":")).encode()
        return self._head + f"Content-Length: {len(data)}\r\n\r\n".encode() + data

    def stream(self, wire: bytes, timeout_s: float | None = None) -> Exchange:
        """Send pre-encoded request bytes (see `encode`) and read the whole stream.

        `timeout_s` overrides the client's deadline for this one request."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        state = StreamState()
        parser = SSEParser()
        err_body = bytearray()
        now = [0.0]
        resp: _Response | None = None

        def on_body(data: bytes) -> None:
            if resp is not None and resp.status_code == 200:
                for ev in parser.feed(data):
                    state.on_event(ev, now[0])
            elif len(err_body) < _ERR_BODY_MAX:
                err_body.extend(data[: _ERR_BODY_MAX - len(err_body)])

        resp = _Response(on_body)
        timer = gevent.Timeout(limit)
        sock: socket.socket | None = None
        timed_out = False
        error: str | None = None
        sent_t = time.monotonic()
        timer.start()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
            sock.settimeout(None)  # the overall deadline (timer) governs from here
            sock.sendall(wire)
            while not resp.message_complete:
                data = sock.recv(65536)
                now[0] = time.monotonic()
                if not data:
                    with contextlib.suppress(Exception):  # judged below by message_complete
                        resp.feed(b"")  # EOF: completes a close-delimited body
                    if not resp.message_complete:
                        error = "connection closed before the response ended"
                    break
                resp.feed(data)
        except gevent.Timeout as t:
            if t is not timer:
                raise
            timed_out = True
            error = f"no complete response within {limit:g} s"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            timer.close()
            end_t = time.monotonic()
            if sock is not None:
                sock.close()
        headers = bool(resp.headers_complete)
        status = resp.status_code if headers else None
        if headers and status != 200 and error is None:
            error = f"HTTP {status}: {err_body.decode('utf-8', errors='replace').strip()[:300]}"
        return Exchange(state, Transport(status, timed_out, error, headers), sent_t, end_t)
