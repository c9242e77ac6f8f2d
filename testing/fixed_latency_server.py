"""A lean OpenAI-style SSE server with exactly known timing, for measuring the client.

Each request's tokens are due at arrival + ttft + k x itl. The server is plain asyncio
(a Protocol, no web framework) and every token frame is pre-encoded, so it spends a few
microseconds per token and can stream tens of thousands of tokens/s from one core: the
aiohttp test fixture and the emulator cannot, and a lagging server would be charged to the
client. It records how late it actually wrote each token against its own schedule (epoll
rounds waits up to whole milliseconds), so the bench can tell server jitter from client error.

Chunked transfer encoding like vLLM/uvicorn; `Connection: close` after each stream.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import re
from dataclasses import dataclass, field
from typing import Any

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict[str, Any]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _choice(chat: bool, text: str, finish: str | None) -> dict[str, Any]:
    c: dict[str, Any] = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    c["finish_reason"] = finish
    # vLLM's chunk carries id/object/created/model too: the client parses frames of that size.
    return {
        "id": "cmpl-bench",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": "bench",
        "choices": [c],
    }


_FRAMES = {chat: _event(_choice(chat, " tok", None)) for chat in (True, False)}
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@dataclass
class ServerStats:
    requests: int = 0
    tokens: int = 0
    first_token_late_s: list[float] = field(default_factory=list)  # actual - due, per request
    token_late_s: list[float] = field(default_factory=list)  # sampled, every 16th token


class _Stream(asyncio.Protocol):
    def __init__(self, server: FixedLatencyServer) -> None:
        self.srv = server
        self.buf = b""
        self.tr: asyncio.Transport | None = None
        self.arrival = 0.0
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.started:
            return
        if not self.buf:
            self.arrival = self.srv.loop.time()
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        m = _CONTENT_LENGTH.search(self.buf, 0, end + 2)
        need = end + 4 + (int(m.group(1)) if m else 0)
        if len(self.buf) < need:
            return
        self.started = True
        body = json.loads(self.buf[end + 4 : need])
        self.chat = "messages" in body
        self.n = int(body.get("max_tokens") or 16)
        self.k = 0
        assert self.tr is not None
        self.tr.write(_HEAD)
        self.srv.stats.requests += 1
        self.srv.loop.call_at(self.arrival + self.srv.ttft_s, self._token)

    def _token(self) -> None:
        tr = self.tr
        if tr is None or tr.is_closing():
            return
        srv = self.srv
        now = srv.loop.time()
        due = self.arrival + srv.ttft_s + self.k * srv.itl_s
        if self.k == 0:
            srv.stats.first_token_late_s.append(now - due)
        elif self.k % 16 == 0:
            srv.stats.token_late_s.append(now - due)
        self.k += 1
        srv.stats.tokens += 1
        if self.k < self.n:
            tr.write(_FRAMES[self.chat])
            srv.loop.call_at(due + srv.itl_s, self._token)
            return
        usage = {"completion_tokens": self.n}  # no tokenizer here: prompt_tokens left out
        tr.write(_event(_choice(self.chat, " tok", "length")) + _event({"choices": [], "usage": usage}) + _DONE)
        tr.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.tr = None


class FixedLatencyServer:
    def __init__(self, ttft_s: float, itl_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.stats = ServerStats()
        self.loop = asyncio.new_event_loop()

    def serve(self, port: int = 0) -> int:
        srv = self.loop.run_until_complete(
            self.loop.create_server(lambda: _Stream(self), "127.0.0.1", port, backlog=4096)
        )
        self.server = srv
        return int(srv.sockets[0].getsockname()[1])


def serve_in_process(ttft_s: float, itl_s: float, ports: mp.Queue[int], conn: Any) -> None:
    """Child-process entry: put the port on `ports`; on any message from `conn`, send back
    the ServerStats and exit."""
    s = FixedLatencyServer(ttft_s, itl_s)
    ports.put(s.serve())
    loop = s.loop

    def _stop() -> None:
        conn.send(s.stats)
        loop.stop()

    loop.add_reader(conn.fileno(), _stop)
    loop.run_forever()
