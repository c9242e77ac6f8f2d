"""The resolver contract (loadgen/resolver.py): which answer sources a replay may name, and how
an answer is read. The lookups themselves run in the client (tests/loadgen/test_client.py)."""

from __future__ import annotations

import pytest

from loadgen.replay_options import ReplayOptions
from loadgen.resolver import check_resolver_url, decode_answer, encode_answer, query_target


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8053/", "http://127.0.0.9:8053/nlb/g6", "http://[::1]:8053", "http://127.0.0.1:1"]
)
def test_loopback_answer_sources_are_accepted(url: str) -> None:
    assert check_resolver_url(url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://10.0.0.2:8053/", "loopback"),  # would send lookups off this machine
        ("http://localhost:8053/", "IP literal"),
        ("https://127.0.0.1:8053/", "need http://"),
        ("http://127.0.0.1/", "port"),
        ("http://127.0.0.1:x/", "port"),
        ("http://127.0.0.1:8053/?name=x", "need http://"),
        ("127.0.0.1:8053", "need http://"),
    ],
)
def test_other_sources_are_refused_naming_the_setting(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"^resolver: .*{why}"):
        check_resolver_url(url)
    with pytest.raises(ValueError, match=r"^resolver: "):
        ReplayOptions(resolver=url)  # the replay's options refuse it before any worker starts


def test_query_asks_for_the_name_escaped() -> None:
    assert query_target("http://127.0.0.1:1/nlb", "a.b-c.elb.us-east-1.amazonaws.com") == (
        "/nlb?name=a.b-c.elb.us-east-1.amazonaws.com"
    )
    assert query_target("http://127.0.0.1:1", "x y&z") == "/?name=x%20y%26z"


def test_answer_round_trip() -> None:
    body = encode_answer("nlb.internal", ["127.0.0.3", "127.0.0.2", "::1"])
    assert decode_answer(body, "nlb.internal", "src") == ["127.0.0.3", "127.0.0.2", "::1"]


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"<html>", "the answer is not JSON"),
        (encode_answer("other.name", ["127.0.0.2"]), "expected an answer for name 'nlb.internal'"),
        (encode_answer("nlb.internal", []), "addresses: expected a non-empty list"),
        (b'{"name": "nlb.internal", "addresses": "127.0.0.2"}', "addresses: expected a non-empty list"),
        (encode_answer("nlb.internal", ["127.0.0.2", "nlb-node-b"]), r"addresses\[1\]: 'nlb-node-b' is not an IP"),
    ],
)
def test_bad_answers_name_the_source_and_the_field(body: bytes, what: str) -> None:
    with pytest.raises(ValueError, match=rf"^resolver http://127.0.0.1:9/: {what}"):
        decode_answer(body, "nlb.internal", "http://127.0.0.1:9/")
