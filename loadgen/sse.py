"""Incremental Server-Sent Events parsing and per-stream timing (pure: no I/O, no gevent).

The transport feeds raw bytes with the time they arrived; `StreamState` turns the OpenAI
streaming chunks into token arrival times, finish reason and server usage, and `classify`
maps what happened to a `core.records.Outcome`.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from core.records import Outcome


class SSEEvent(NamedTuple):
    data: str
    event: str = "message"


class SSEParser:
    """WHATWG SSE framing: lines end in LF, CRLF or CR; a blank line dispatches the event.

    Bytes may arrive split anywhere (even inside a UTF-8 sequence or a CRLF), so undecoded
    bytes are buffered until a whole line is present. This runs once per streamed token, so
    the common LF-only case is a single `split` (an LF byte never occurs inside a UTF-8
    sequence, so each line decodes on its own); CR line ends take the general scan.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event = ""
        self._cr_pending = False  # last chunk ended in CR: a following LF belongs to it

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._cr_pending:
            self._cr_pending = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        events: list[SSEEvent] = []
        if b"\r" not in buf:
            lines = buf.split(b"\n")
            self._buf = lines.pop()
            for raw in lines:
                ev = self._line(raw)
                if ev is not None:
                    events.append(ev)
            return events
        start = 0
        n = len(buf)
        while True:
            lf = buf.find(b"\n", start)
            cr = buf.find(b"\r", start)
            if lf < 0 and cr < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt : nxt + 1] == b"\n":
                    nxt += 1
                elif nxt == n:
                    self._cr_pending = True
            else:
                end, nxt = lf, lf + 1
            ev = self._line(buf[start:end])
            if ev is not None:
                events.append(ev)
            start = nxt
        self._buf = buf[start:]
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            if not self._data:
                self._event = ""
                return None
            ev = SSEEvent("\n".join(self._data), self._event or "message")
            self._data, self._event = [], ""
            return ev
        if raw.startswith(b"data: "):  # the usual form: skip the general field split
            self._data.append(raw[6:].decode("utf-8", errors="replace"))
            return None
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    @property
    def pending(self) -> bool:
        """Bytes or data lines not yet dispatched (a stream cut mid-event)."""
        return bool(self._buf.strip()) or bool(self._data)


def feed_events(parser: SSEParser, state: StreamState, chunk: bytes, now: float) -> None:
    """`state.on_event(ev, now)` for every event `parser.feed(chunk)` dispatches, without the
    parser where that changes nothing: when the parser holds nothing back and `chunk` is whole
    one-line `data: ` events, LF-terminated (what vLLM and most servers send, usually one per
    read), each event's line goes straight to `state.on_data`. Anything else (a line or event
    split across reads, CR line ends, comments, other fields, multi-line data) takes the parser."""
    if (
        chunk.startswith(b"data: ")
        and chunk.endswith(b"\n\n")
        and not (parser._buf or parser._data or parser._event or parser._cr_pending)
        and b"\r" not in chunk
    ):
        if chunk.find(b"\n") == len(chunk) - 2:  # one event: the usual read
            state.on_data(chunk[6:-2], now)
            return
        events = chunk[:-2].split(b"\n\n")
        for ev in events:
            if not ev.startswith(b"data: ") or b"\n" in ev:
                break
        else:
            on_data = state.on_data
            for ev in events:
                on_data(ev[6:], now)
            return
    on_event = state.on_event
    for ev_ in parser.feed(chunk):
        on_event(ev_, now)


@dataclass
class StreamState:
    """What one streamed response delivered, with monotonic arrival times."""

    # Arrival time of each chunk that carried text. A chunk is not a token: vLLM packs several
    # tokens into one (detokenizer hold-back, stop-string buffering) and sends empty-content
    # chunks, so token counts come from the server's usage (see loadgen.recording).
    chunk_times: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    server_prompt_tokens: int | None = None
    server_output_tokens: int | None = None
    server_error: str | None = None
    bad_chunks: int = 0

    def on_event(self, ev: SSEEvent, now: float) -> None:
        data = ev.data.strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj: Any = orjson.loads(data)  # a few times faster than json: this runs per token
        except orjson.JSONDecodeError:
            self.bad_chunks += 1
            return
        self._on_object(obj, now)

    def on_data(self, raw: bytes, now: float) -> None:
        """`on_event` for an event whose data is the one line `raw` (bytes, not decoded): the
        same outcome, with the decoding and stripping left out where they change nothing. A JSON
        object orjson reads from the bytes as they are is the object `on_event` reads from their
        decoded, stripped text (orjson rejects invalid UTF-8, and the only whitespace it skips is
        JSON's, which strip() removes too); anything else takes `on_event` itself."""
        if raw[:1] == b"{":
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
            else:
                self._on_object(obj, now)
                return
        elif raw == b"[DONE]":
            self.done = True
            return
        self.on_event(SSEEvent(raw.decode("utf-8", errors="replace")), now)

    def _on_object(self, obj: Any, now: float) -> None:
        if not isinstance(obj, dict):
            self.bad_chunks += 1
            return
        err = obj.get("error")
        if err is not None:  # vLLM reports mid-stream failures as a data event ("error": null is none)
            self.server_error = str(err.get("message", err) if isinstance(err, dict) else err)[:500]
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            self.server_prompt_tokens = pt if isinstance(pt, int) else self.server_prompt_tokens
            self.server_output_tokens = ct if isinstance(ct, int) else self.server_output_tokens
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                self.chunk_times.append(now)
                self.text_parts.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    @property
    def content_chunks(self) -> int:
        return len(self.chunk_times)

    def gaps(self) -> list[float]:
        """Gaps between content chunks: how output arrived, not the inter-token latency."""
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

    def max_gap(self) -> float | None:
        """max(gaps()) without building the list (once per request, over every token)."""
        t = self.chunk_times
        return max(map(operator.sub, t[1:], t[:-1])) if len(t) > 1 else None


@dataclass(frozen=True)
class Transport:
    """How the exchange ended at the HTTP level (filled by the client)."""

    http_status: int | None = None
    timed_out: bool = False
    error: str | None = None  # exception text; None when the body was read to its end
    headers_received: bool = False
    slo_abandoned: bool = False  # the timeout that ended it was the request's SLO deadline (Outcome.SLO_ABANDONED)


def classify(t: Transport, s: StreamState, max_tokens: int) -> tuple[Outcome, str | None]:
    """Outcome and a short reason. Order matters: the most specific failure wins."""
    if t.timed_out and t.slo_abandoned:
        return Outcome.SLO_ABANDONED, f"abandoned: it could no longer meet its SLO ({t.error or 'deadline'})"
    if t.timed_out:
        return Outcome.TIMEOUT, t.error or "request timeout"
    if not t.headers_received:
        return Outcome.CONNECTION_ERROR, t.error or "no response"
    if t.http_status != 200:
        return Outcome.HTTP_ERROR, t.error or f"HTTP {t.http_status}"
    if s.server_error is not None:
        return Outcome.HTTP_ERROR, f"server error in stream: {s.server_error}"
    if t.error is not None or s.finish_reason is None or not s.done:
        why = t.error or ("no finish_reason" if s.finish_reason is None else "no [DONE]")
        return Outcome.TRUNCATED, f"stream ended early: {why}"
    if s.content_chunks == 0 and s.server_output_tokens:
        n = s.server_output_tokens
        return Outcome.NO_TEXT, f"usage reports {n} output tokens but no chunk carried text (special tokens only?)"
    out = s.server_output_tokens if s.server_output_tokens is not None else s.content_chunks
    if out == 0:
        return Outcome.QUALITY_FAIL, "empty completion"
    if s.finish_reason == "length" and out != max_tokens:
        return Outcome.QUALITY_FAIL, f"finish_reason length after {out} of {max_tokens} tokens"
    return Outcome.OK, None
