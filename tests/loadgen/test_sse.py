from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from core.records import Outcome
from loadgen.sse import SSEEvent, SSEParser, StreamState, Transport, classify

STREAM = (
    b": keep-alive\r\n\r\n"
    b'data: {"choices":[{"index":0,"text":"h\xc3\xa9llo","finish_reason":null}]}\r\n\r\n'
    b"event: note\ndata: a\ndata: b\n\n"
    b'data: {"choices":[{"index":0,"text":" w","finish_reason":"length"}]}\r\r'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def _all(chunks: list[bytes]) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    for c in chunks:
        out += p.feed(c)
    assert not p.pending
    return out


def test_parse_whole() -> None:
    evs = _all([STREAM])
    assert [e.event for e in evs] == ["message", "note", "message", "message", "message"]
    assert evs[1].data == "a\nb" and evs[-1].data == "[DONE]"
    assert json.loads(evs[0].data)["choices"][0]["text"] == "héllo"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_same_events(cuts: list[int]) -> None:
    pts = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *pts], [*pts, len(STREAM)], strict=True)]
    assert _all(chunks) == _all([STREAM])


def _state(stream: bytes) -> StreamState:
    s = StreamState()
    for i, e in enumerate(SSEParser().feed(stream)):
        s.on_event(e, float(i))
    return s


def test_state_tokens_usage_and_gaps() -> None:
    s = _state(STREAM)
    assert s.content_chunks == 2 and s.server_output_tokens == 2 and s.server_prompt_tokens == 5
    assert s.finish_reason == "length" and s.done and s.gaps() == [2.0]
    chat = _state(
        b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\ndata: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    )
    assert chat.content_chunks == 1  # a role-only delta is not a token


OK_T = Transport(200, False, None, True)


def test_classify() -> None:
    s = _state(STREAM)
    assert classify(OK_T, s, 2) == (Outcome.OK, None)
    assert classify(OK_T, s, 5)[0] is Outcome.QUALITY_FAIL  # "length" after 2 of 5 tokens
    assert classify(Transport(503, False, None, True), s, 2)[0] is Outcome.HTTP_ERROR
    assert classify(Transport(None, False, "refused", False), StreamState(), 2)[0] is Outcome.CONNECTION_ERROR
    assert classify(Transport(200, True, None, True), s, 2)[0] is Outcome.TIMEOUT
    # the same timeout, when it was the request's SLO deadline (a capacity step): not an error
    assert classify(Transport(200, True, None, True, slo_abandoned=True), s, 2)[0] is Outcome.SLO_ABANDONED
    cut = _state(STREAM[: STREAM.index(b"data: [DONE]")])
    assert classify(OK_T, cut, 2) == (Outcome.TRUNCATED, "stream ended early: no [DONE]")
    assert classify(Transport(200, False, "reset", True), s, 2)[0] is Outcome.TRUNCATED
    err = _state(b'data: {"error": {"message": "boom"}}\n\n')
    assert classify(OK_T, err, 2) == (Outcome.HTTP_ERROR, "server error in stream: boom")


def test_usage_without_any_text_is_its_own_outcome() -> None:
    # A model that emits only special tokens: every chunk's content is empty, usage says 3.
    silent = _state(
        b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    )
    assert silent.content_chunks == 0 and silent.server_output_tokens == 3
    outcome, why = classify(OK_T, silent, 3)
    assert (
        outcome is Outcome.NO_TEXT and why is not None and "3 output tokens" in why and "no chunk carried text" in why
    )


def _reference(stream: bytes) -> list[SSEEvent]:
    """The WHATWG dispatch rules applied to the whole decoded stream at once: no buffering,
    so it cannot share a split-handling bug with the incremental parser."""
    import re

    events: list[SSEEvent] = []
    data: list[str] = []
    event = ""
    *lines, _unterminated = re.split(r"\r\n|\r|\n", stream.decode("utf-8"))
    for line in lines:
        if line == "":
            if data:
                events.append(SSEEvent("\n".join(data), event or "message"))
            data, event = [], ""
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    return events


_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
_field = st.one_of(
    st.builds(lambda v: f"data: {v}", _text),
    st.builds(lambda v: f"data:{v}", _text),
    st.builds(lambda v: f"event: {v}", _text),
    st.builds(lambda v: f": {v}", _text),
    st.just(""),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_field, st.sampled_from(["\n", "\n", "\n", "\r\n", "\r"])), max_size=15),
    st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_incremental_parse_matches_whole_stream_reference(fields: list[tuple[str, str]], cuts: list[int]) -> None:
    stream = "".join(f + end for f, end in fields).encode()
    pts = sorted({c for c in cuts if c <= len(stream)})
    chunks = [stream[a:b] for a, b in zip([0, *pts], [*pts, len(stream)], strict=True)]
    want = _reference(stream)
    assert _all_of(chunks) == want
    for i in range(len(stream) + 1):  # every single cut: CR|LF and mid-UTF-8 splits included
        assert _all_of([stream[:i], stream[i:]]) == want


def _all_of(chunks: list[bytes]) -> list[SSEEvent]:
    p = SSEParser()
    got: list[SSEEvent] = []
    for c in chunks:
        got += p.feed(c)
    return got


def test_error_null_in_a_chunk_is_not_a_failure() -> None:
    # Some servers serialize every optional field, so a healthy chunk can carry "error": null.
    s = _state(
        b'data: {"error": null, "choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
        b'data: {"error": null, "choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert s.server_error is None and s.content_chunks == 2
    assert classify(OK_T, s, 2) == (Outcome.OK, None)


# -- feed_events: the client's path, which skips the parser for whole one-line data events --------

_FRAMES = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',  # no text: not a token
    b'data: {"choices":[{"index":0,"text":"h\xc3\xa9","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n',
    b'data: {"choices":[{"index":0,"text":"x","finish_reason":"length"}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n',
    b'data: {"error": null, "choices":[{"index":0,"text":"e"}]}\n\n',
    b'data: {"error": {"message": "boom"}}\n\n',
    b"data: [DONE]\n\n",
    b"data:  [DONE] \n\n",  # stripped to [DONE] by on_event
    b'data: {"choices":[{"index":0,"text":"t"}]}\x0b\n\n',  # not JSON whitespace: strip() takes it, orjson would not
    b'data: {"choices":[{"index":0,"text":"\xff\xfe"}]}\n\n',  # invalid UTF-8: decoded with U+FFFD, still a token
    b"data: [1, 2]\n\n",  # JSON, not an object
    b"data: {not json}\n\n",
    b"data: \n\n",
    b'data: {"choices":[{"index":0,"text":"a"}]}\r\n\r\n',  # CR LF line ends: the parser's path
    b'data: {"choices":[{"index":0,"text":"cr"}]}\rid: 1\n\n',  # a lone CR ends the data line
    b": keep-alive\n\n",
    b'event: note\ndata: {"choices":[{"index":0,"text":"n"}]}\n\n',
    b'data: {"choices":[{"index":0,\ndata: "text":"two lines"}]}\n\n',  # multi-line data: joined with LF
    b'data:{"choices":[{"index":0,"text":"no space"}]}\n\n',
    b"\n",  # a stray blank line
]


def _reference_state(reads: list[tuple[bytes, float]]) -> StreamState:
    """What the client did before feed_events: every read through the parser, every event to on_event."""
    p, s = SSEParser(), StreamState()
    for chunk, now in reads:
        for ev in p.feed(chunk):
            s.on_event(ev, now)
    return s


def _fast_state(reads: list[tuple[bytes, float]]) -> StreamState:
    from loadgen.sse import feed_events

    p, s = SSEParser(), StreamState()
    for chunk, now in reads:
        feed_events(p, s, chunk, now)
    return s


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(range(len(_FRAMES))), min_size=1, max_size=14),
    st.lists(st.integers(min_value=0, max_value=1200), max_size=8),
    st.booleans(),
)
def test_feed_events_is_the_parser_and_on_event_exactly(picks: list[int], cuts: list[int], whole_frames: bool) -> None:
    # Every read keeps its own time, so a token stamped with another read's time shows as a
    # difference in chunk_times; text, finish reason, usage, errors, [DONE] and bad chunks too.
    stream = b"".join(_FRAMES[i] for i in picks)
    if whole_frames:  # reads that end on frame boundaries (the fast path), several frames per read
        ends = sorted(
            {
                len(b"".join(_FRAMES[i] for i in picks[:k]))
                for k in range(1, len(picks) + 1)
                if k % 2 == 0 or k == len(picks)
            }
        )
    else:
        ends = sorted({c for c in cuts if 0 < c < len(stream)} | {len(stream)})
    reads = [(stream[a:b], float(i)) for i, (a, b) in enumerate(zip([0, *ends[:-1]], ends, strict=True))]
    assert _fast_state(reads) == _reference_state(reads)


def test_feed_events_takes_the_fast_path_on_whole_frames() -> None:
    # The equivalence above would also hold if feed_events always used the parser: check that
    # whole one-line frames never reach it (the point of the function).
    from loadgen.sse import feed_events

    class NoParser(SSEParser):
        def feed(self, chunk: bytes) -> list[SSEEvent]:
            raise AssertionError(f"parser used for {chunk!r}")

    s = StreamState()
    feed_events(NoParser(), s, _FRAMES[0] * 3 + _FRAMES[3], 1.0)
    feed_events(NoParser(), s, _FRAMES[4] + _FRAMES[7], 2.0)
    assert s.chunk_times == [1.0, 1.0, 1.0, 1.0] and s.text_parts == [" tok", " tok", " tok", "x"]
    assert (s.finish_reason, s.server_output_tokens, s.done) == ("length", 3, True)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=30))
def test_max_gap_is_the_largest_gap(times: list[float]) -> None:
    s = StreamState(chunk_times=sorted(times))
    assert s.max_gap() == (max(s.gaps()) if s.gaps() else None)
