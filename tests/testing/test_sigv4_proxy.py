"""testing.sigv4_proxy checks SigV4's canonical query string by the specification, not by the
client's signer (issue 49, item 4). Until then it recomputed each signature with botocore, whose
canonical query string is the query as sent, sorted: a query sent `+`-encoded, or with a raw `{`,
passed it, while AWS builds the canonical form from the decoded parameters and refuses it.

The expected canonical strings are literals, encoded by hand from the rule (IAM user guide, "Create
a signed AWS API request", "Create a canonical request", UriEncode): every byte but A-Z a-z 0-9
- _ . ~ as %XY with upper-case hex, a space as %20, é as its UTF-8 bytes %C3%A9; parameters sorted
by encoded name, then value."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.credentials import Credentials

from analysis.sources.prometheus import PrometheusSource, sigv4_headers
from testing.sigv4_proxy import SigV4Proxy, StandInCredentials

REGION = "us-east-1"
STAND_IN = StandInCredentials("AKIDSTANDIN0000000000", "stand-in-secret-key")
SIGNER = Credentials(STAND_IN.access_key, STAND_IN.secret_key)

# PromQL with spaces, parentheses, a colon, braces, `=`, quotes and brackets.
LATENCY = 'sum by (le) (increase(vllm:e2e_request_latency_seconds_bucket{fleet="inf2"}[30s]))'
LATENCY_ENCODED = "sum%20by%20%28le%29%20%28increase%28vllm%3Ae2e_request_latency_seconds_bucket%7Bfleet%3D%22inf2%22%7D%5B30s%5D%29%29"
# `+` (a regex's and an addition's), `~` (unreserved, left as it is), a comma and a non-ASCII value.
PLUS = 'count(up{job=~"inf2.+",zone="é"}) + 1'
PLUS_ENCODED = "count%28up%7Bjob%3D~%22inf2.%2B%22%2Czone%3D%22%C3%A9%22%7D%29%20%2B%201"


def test_canonical_query_strings_are_the_specifications() -> None:
    from testing.sigv4_proxy import canonical_query_string, query_parameters  # what the stand-in checks against

    assert canonical_query_string([("query", LATENCY), ("time", "1765000000.500")]) == (
        f"query={LATENCY_ENCODED}&time=1765000000.500"
    )
    assert canonical_query_string([("query", PLUS), ("time", "1765000000.500")]) == (
        f"query={PLUS_ENCODED}&time=1765000000.500"
    )
    # query_range's parameters as the client sends them, sorted by name
    assert canonical_query_string([("query", "up"), ("start", "1"), ("end", "2"), ("step", "5")]) == (
        "end=2&query=up&start=1&step=5"
    )
    # a repeated name by value; sorted after encoding: '%' (0x25) sorts before '~' (0x7E), though
    # 'é' (0xE9) is after '~' unencoded
    assert canonical_query_string([("match[]", "b"), ("match[]", "a")]) == "match%5B%5D=a&match%5B%5D=b"
    assert canonical_query_string([("a~", "2"), ("aé", "1")]) == "a%C3%A9=1&a~=2"
    # decoded from a query as sent: `+` is a plus, not a space; lower-case hex decodes the same
    assert query_parameters("query=up+1&x=%7b%7D") == [("query", "up+1"), ("x", "{}")]
    assert canonical_query_string(query_parameters("query=up+1&x=%7b%7D")) == "query=up%2B1&x=%7B%7D"


class _Upstream:
    """The Prometheus behind the stand-in, reduced to what these tests read: the query string each
    request reached it with, answered with an empty success."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream.queries.append(self.path.partition("?")[2])
                payload = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture(scope="module")
def _stand_in() -> Iterator[tuple[SigV4Proxy, _Upstream]]:
    upstream = _Upstream()
    upstream.thread.start()
    try:
        with SigV4Proxy(f"http://127.0.0.1:{upstream.server.server_port}", REGION, STAND_IN) as proxy:
            yield proxy, upstream
    finally:
        upstream.server.shutdown()
        upstream.server.server_close()


@pytest.fixture
def stand_in(_stand_in: tuple[SigV4Proxy, _Upstream]) -> tuple[SigV4Proxy, _Upstream]:
    proxy, upstream = _stand_in
    proxy.refusals.clear()
    proxy.accepted.clear()
    upstream.queries.clear()
    return proxy, upstream


def _send_signed_as_is(url: str) -> int:
    """GET `url` signed by botocore over its query string exactly as written (what a client that
    encodes its own query and signs the URL does)."""
    request = urllib.request.Request(url, headers=sigv4_headers(url, REGION, SIGNER))
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_plus_encoded_query_is_refused(stand_in: tuple[SigV4Proxy, _Upstream]) -> None:
    proxy, upstream = stand_in
    # `up == 1` form-encoded (urllib.parse.urlencode's default: quote_plus), signed as sent
    assert _send_signed_as_is(f"{proxy.url}/api/v1/query?query=up+%3D%3D+1&time=1765000000.500") == 403
    (why,) = proxy.refusals
    assert why.startswith("the request signature does not match")
    assert "'query=up%2B%3D%3D%2B1&time=1765000000.500'" in why  # the canonical form, by the rule
    assert "a space as %20, never +" in why
    assert upstream.queries == []


@pytest.mark.parametrize(
    "query",
    [
        'query=up{job="inf2"}&time=1',  # raw braces and quotes
        "query=up%7bjob%3d%22inf2%22%7d&time=1",  # lower-case hex
        "query=sum(up)&time=1",  # raw parentheses
    ],
)
def test_other_non_canonical_queries_are_refused(stand_in: tuple[SigV4Proxy, _Upstream], query: str) -> None:
    proxy, upstream = stand_in
    assert _send_signed_as_is(f"{proxy.url}/api/v1/query?{query}") == 403
    assert len(proxy.refusals) == 1 and "is not in SigV4's canonical encoding" in proxy.refusals[0]
    assert upstream.queries == []


def test_a_canonical_query_signed_as_sent_passes(stand_in: tuple[SigV4Proxy, _Upstream]) -> None:
    proxy, upstream = stand_in
    canonical = f"query={PLUS_ENCODED}&time=1765000000.500"
    assert _send_signed_as_is(f"{proxy.url}/api/v1/query?{canonical}") == 200
    assert proxy.refusals == [] and upstream.queries == [canonical]


def test_our_clients_queries_pass(stand_in: tuple[SigV4Proxy, _Upstream]) -> None:
    """analysis.sources.prometheus sends each query in the canonical encoding, so the stand-in's
    specification check lets every one through (query_range's parameters unsorted as sent)."""
    proxy, upstream = stand_in
    source = PrometheusSource(proxy.url, sigv4_region=REGION, credentials=SIGNER)
    assert source.query(LATENCY, 1765000000.5) == []
    assert source.query(PLUS, 1765000000.5) == []
    assert source.query_range(PLUS, 1765000000.0, 1765000060.0, 5.0) == []
    assert proxy.refusals == []
    assert upstream.queries == [
        f"query={LATENCY_ENCODED}&time=1765000000.500",
        f"query={PLUS_ENCODED}&time=1765000000.500",
        f"query={PLUS_ENCODED}&start=1765000000.000&end=1765000060.000&step=5",
    ]


def test_each_actors_key_is_taken_and_named_an_unknown_one_refused() -> None:
    """An offline run signs with one key per actor (its role's; one secret): the workspace takes
    the keys it is given, records who called it for what (testing/cloud_offline.py evaluates those
    as aps calls of that role), and refuses any other key."""
    upstream = _Upstream()
    upstream.thread.start()
    try:
        with SigV4Proxy(
            f"http://127.0.0.1:{upstream.server.server_port}", REGION, STAND_IN, keys=frozenset({"ConductorRole"})
        ) as proxy:
            for key, status in (("ConductorRole", 200), ("OtherRole", 403)):
                url = f"{proxy.url}/api/v1/query?query=up&time=1"
                headers = sigv4_headers(url, REGION, Credentials(key, STAND_IN.secret_key))
                try:
                    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
                        assert (key, resp.status) == (key, status)
                except urllib.error.HTTPError as exc:
                    assert (key, exc.code) == (key, status)
            assert proxy.signers == [("ConductorRole", "/api/v1/query")]
            assert proxy.refusals == ["signed with access key OtherRole, which this workspace does not know"]
    finally:
        upstream.server.shutdown()
        upstream.server.server_close()
