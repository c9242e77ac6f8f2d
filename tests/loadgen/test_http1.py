"""The client's HTTP/1.1 response parser, checked against llhttp (geventhttpclient's parser)
as an independent oracle on generated responses split at arbitrary points."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from geventhttpclient.response import HTTPResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.http1 import HTTPParseError, ResponseParser


def _ours(chunks: list[bytes], eof: bool = True) -> tuple[int | None, bool, bytes]:
    body = bytearray()
    p = ResponseParser(body.extend)
    for c in chunks:
        p.feed(c)
    if eof:
        p.feed_eof()
    return p.status_code, p.message_complete, bytes(body)


class _Oracle(HTTPResponse):
    def __init__(self) -> None:
        super().__init__(method="POST")
        self.got = bytearray()

    def _on_body(self, buf: bytearray) -> None:
        self.got.extend(buf)


def _llhttp(wire: bytes) -> tuple[int | None, bool, bytes]:
    r = _Oracle()
    r.feed(wire)
    with contextlib.suppress(Exception):
        r.feed(b"")
    return (r.status_code if r.headers_complete else None), bool(r.message_complete), bytes(r.got)


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    status = draw(st.sampled_from([200, 200, 200, 400, 404, 500, 503]))
    interim = draw(st.booleans())
    framing = draw(st.sampled_from(["chunked", "length", "close"]))
    body_parts = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=6))
    head = b"HTTP/1.1 100 Continue\r\n\r\n" if interim else b""
    head += f"HTTP/1.1 {status} Whatever Reason\r\nContent-Type: text/event-stream\r\nX-Dup: a\r\nx-dup: b\r\n".encode()
    body = b"".join(body_parts)
    if framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        out = head
        for part in body_parts:
            ext = draw(st.sampled_from([b"", b";name=value", b";x"]))
            hexd = f"{len(part):x}".encode()
            hexd = hexd.upper() if draw(st.booleans()) else hexd
            out += hexd + ext + b"\r\n" + part + b"\r\n"
        trailer = draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"]))
        return out + b"0\r\n" + trailer + b"\r\n"
    if framing == "length":
        return head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    return head + b"\r\n" + body


@settings(max_examples=300, deadline=None)
@given(responses(), st.lists(st.integers(min_value=0, max_value=600), max_size=8))
def test_matches_llhttp_whatever_the_split(wire: bytes, cuts: list[int]) -> None:
    pts = sorted({c for c in cuts if c <= len(wire)})
    chunks = [wire[a:b] for a, b in zip([0, *pts], [*pts, len(wire)], strict=True)]
    want = _llhttp(wire)
    assert want[1], "oracle did not complete: the generator made a bad response"
    assert _ours(chunks) == want
    assert _ours([wire[i : i + 1] for i in range(len(wire))]) == want  # byte at a time


def test_one_chunk_per_feed_fast_path_and_completion() -> None:
    body = bytearray()
    p = ResponseParser(body.extend)
    p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert p.headers_complete and p.status_code == 200 and p.headers["transfer-encoding"] == "chunked"
    for i in range(3):
        frame = f"data: {i}\n\n".encode()
        p.feed(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
        assert not p.message_complete
    p.feed(b"0\r\n\r\n")
    assert p.message_complete and body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


def test_whitespace_before_a_chunk_extension_is_allowed() -> None:
    # RFC 9112 7.1.1 allows BWS before ";" (llhttp rejects it; the oracle test leaves it out)
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3 ;a=b\r\nabc\r\n0\r\n\r\n"
    assert _ours([wire], eof=False) == (200, True, b"abc")


def test_truncated_bodies_stay_incomplete_at_eof() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"
    assert _ours([chunked]) == (200, False, b"hel")
    length = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    assert _ours([length]) == (200, False, b"abc")
    assert _ours([b"HTTP/1.1 200 OK\r\nContent-Le"]) == (None, False, b"")
    assert _ours([b"HTTP/1.1 200 OK\r\n\r\nuntil close"]) == (200, True, b"until close")
    assert _ours([b"HTTP/1.1 204 No Content\r\n\r\n"], eof=False) == (204, True, b"")


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"HTTP/1.1 2000 OK\r\n\r\n", "bad status line"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n", "not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc", "after the end"),
    ],
)
def test_malformed_responses_name_the_problem(wire: bytes, message: str) -> None:
    with pytest.raises(HTTPParseError, match=message):
        _ours([wire], eof=False)
    # ... also when the bad part arrives on its own (the fast path must not accept it)
    cut = wire.index(b"\r\n\r\n") + 4
    with pytest.raises(HTTPParseError, match=message):
        _ours([wire[:cut], wire[cut:]], eof=False)


def test_a_read_holding_many_chunks_is_one_body_delivery() -> None:
    # A client that fell behind reads many frames at once, split anywhere: each read's body must
    # come out whole and in order, in one on_body call (its bytes share one timestamp), and a
    # read that begins inside a chunk must not push the rest of it to the next read.
    frames = [f"data: {i}\n\n".encode() * (1 + i % 3) for i in range(60)]
    wire = b"".join(f"{len(f):x}\r\n".encode() + f + b"\r\n" for f in frames) + b"0\r\n\r\n"
    calls: list[bytes] = []
    p = ResponseParser(calls.append)
    p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    cuts = [0, 1, 700, 701, 703, 2000, 2001, 2002, len(wire)]  # mid size line, mid data, mid CRLF, whole chunks
    got: list[bytes] = []
    for a, b in itertools.pairwise(cuts):
        before = len(calls)
        p.feed(wire[a:b])
        assert len(calls) - before <= 1
        got.extend(calls[before:])
        # whatever the read completed is delivered now: at most a partial chunk's own bytes wait
        delivered = b"".join(got)
        assert b"".join(frames).startswith(delivered)
        whole = wire[:b].count(b"\n\n\r\n")  # chunks that ended in this read or before
        assert delivered.count(b"\n\n") >= sum(f.count(b"\n\n") for f in frames[:whole])
    assert p.message_complete and b"".join(got) == b"".join(frames)
