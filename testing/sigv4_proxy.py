"""A stand-in for an Amazon Managed Prometheus workspace's query API: a small HTTP proxy in front of
a real Prometheus that lets through only requests SigV4-signed for service `aps`, the campaign's
region and the stand-in credentials, as AMP takes only signed queries (AMP user guide, "Query
using Prometheus-compatible APIs", AMP-onboard-query-APIs.html).

Each request's signature is recomputed with botocore's own signer (botocore.auth.SigV4Auth: the
canonical request, the string to sign and the signature, at the request's own X-Amz-Date) over
the headers the request says it signed, and compared with the one it carries. The canonical query
string in it is not botocore's, which is the query string as sent, sorted: it is built here from
the specification (`canonical_query_string`), as the service does from the parameters it decoded,
so a client that sends its query in any other encoding (`+` for a space, a raw `{` or `"`,
lower-case hex) and signs what it sent is refused, as AWS would refuse it. Unsigned, signed for
another service or region, with another key or a wrong signature: 403 with a JSON {"message": ...}
naming why. Queries are served under /workspaces/<workspace id>/, as AMP serves
them; another workspace id is answered 404.

Remote writes are checked the same way: AMP takes them at /workspaces/<id>/api/v1/remote_write
(AMP user guide, "Ingest Prometheus metrics to the workspace": the remote_write url), and the
proxy hands them to the upstream Prometheus's receiver at /api/v1/write (Prometheus docs, "HTTP
API", "Remote Write Receiver"), with the headers that say how the body is encoded.
"""

from __future__ import annotations

import hmac
import json
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote_to_bytes

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

SERVICE = "aps"
# SigV4's Authorization header: "AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/<service>/aws4_request,
# SignedHeaders=<h1;h2>, Signature=<hex>" (AWS Signature Version 4, "Add the signature to the request").
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
    r"\s*SignedHeaders=(?P<signed>[a-z0-9;-]+),\s*Signature=(?P<signature>[0-9a-f]{64})$"
)
_WORKSPACE_PATH = re.compile(r"^/workspaces/(?P<workspace>[A-Za-z0-9-]+)(?P<rest>/.*)$")
AMP_REMOTE_WRITE, RECEIVER_WRITE = "/api/v1/remote_write", "/api/v1/write"
# What a remote-write body needs beside its bytes: snappy-compressed protobuf, and its protocol version
# (Prometheus remote-write specification 1.0, "Protocol": Content-Encoding, Content-Type, X-Prometheus-Remote-Write-Version).
_FORWARDED_HEADERS = ("Content-Type", "Content-Encoding", "X-Prometheus-Remote-Write-Version")


# SigV4's URI encoding (IAM user guide, "Create a signed AWS API request", section "Create a canonical
# request", UriEncode): every byte of the UTF-8 text is percent-encoded as %XY with upper-case hex,
# except the unreserved A-Z a-z 0-9 - . _ ~; a space is %20, never +. "You URI-encode each name and
# value individually" and sort the parameters by name ("The sorting occurs after encoding"), a
# repeated name by value. What follows is that rule, not botocore's code, so it checks the client.
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def uri_encode(text: str) -> str:
    return "".join(
        chr(byte) if byte in _UNRESERVED else f"%{byte:02X}" for byte in text.encode("utf-8", "surrogateescape")
    )


def query_parameters(raw_query: str) -> list[tuple[str, str]]:
    """The names and values a query string carries, percent-decoded. A `+` stays a `+`: only HTML
    form encoding makes it a space (RFC 3986 gives it no meaning in a query), and either way a
    client that sent one for a space signed something other than the canonical %20."""
    pairs = []
    for part in raw_query.split("&") if raw_query else []:
        name, _, value = part.partition("=")
        pairs.append((_decode(name), _decode(value)))
    return pairs


def _decode(text: str) -> str:
    return unquote_to_bytes(text).decode("utf-8", "surrogateescape")


def canonical_query_string(parameters: list[tuple[str, str]]) -> str:
    """SigV4's CanonicalQueryString of these (decoded) parameters: each name and value URI-encoded,
    sorted by encoded name, then encoded value, joined `name=value` with `&`."""
    return "&".join(f"{name}={value}" for name, value in sorted((uri_encode(n), uri_encode(v)) for n, v in parameters))


@dataclass(frozen=True)
class StandInCredentials:
    access_key: str
    secret_key: str


def signature_problem(
    method: str,
    host: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    creds: StandInCredentials,
    region: str,
    keys: frozenset[str] = frozenset(),
) -> str | None:
    """Why this request's SigV4 signature is not one for `aps` in `region` by `creds`; None when it is.
    `headers` with lower-case names, `path` with its query string. `keys`: further access key ids
    taken, each with `creds`' secret (one per actor of an offline run: testing/iam_recorder.py)."""
    authorization = headers.get("authorization")
    if authorization is None:
        return "the request is not signed (no SigV4 Authorization header)"
    parsed = _AUTHORIZATION.match(authorization.strip())
    if parsed is None:
        return "the Authorization header is not a SigV4 (AWS4-HMAC-SHA256) one"
    if parsed["key"] in keys:
        creds = StandInCredentials(parsed["key"], creds.secret_key)
    if parsed["key"] != creds.access_key:
        return f"signed with access key {parsed['key']}, which this workspace does not know"
    if (parsed["service"], parsed["region"]) != (SERVICE, region):
        return f"signed for service {parsed['service']} in {parsed['region']}; this is service {SERVICE} in {region}"
    stamp = headers.get("x-amz-date", "")
    if not stamp.startswith(parsed["date"]):
        return "no X-Amz-Date header of the credential's date"
    signed = parsed["signed"].split(";")
    if "host" not in signed or any(name not in headers for name in signed):
        return f"signed headers {parsed['signed']} must include host and be present in the request"
    # botocore takes the URL's query string as it stands (sorted) for the canonical one; given the
    # specification's, it signs what the service would.
    where, _, raw_query = path.partition("?")
    canonical = canonical_query_string(query_parameters(raw_query))
    request = AWSRequest(
        method=method,
        url=f"http://{host}{where}" + (f"?{canonical}" if canonical else ""),
        data=body or None,
        headers={n: headers[n] for n in signed},
    )
    request.context["timestamp"] = stamp
    auth = SigV4Auth(Credentials(creds.access_key, creds.secret_key), SERVICE, region)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if not hmac.compare_digest(expected, parsed["signature"]):
        why = "the request signature does not match the one computed from the request and the secret key"
        return why + _query_encoding_note(raw_query, canonical)
    return None


def _query_encoding_note(raw_query: str, canonical: str) -> str:
    """What a signature mismatch most likely comes from when the query was not sent in canonical form."""
    as_sent = "&".join(sorted(raw_query.split("&"))) if raw_query else ""
    if as_sent == canonical:
        return ""
    return (
        f": the query string as sent, {raw_query!r}, is not in SigV4's canonical encoding, {canonical!r} "
        "(every byte but A-Z a-z 0-9 - _ . ~ percent-encoded, upper-case hex, a space as %20, never +)"
    )


class _LoopbackHop:
    """A threaded HTTP server on a loopback port, its requests handled by `_handler()`: the proxy
    and the sidecar below differ only in what they do with a request."""

    def __init__(self, name: str) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class SigV4Proxy(_LoopbackHop):
    """`with SigV4Proxy(upstream, region, creds) as proxy:` the workspace's base URL is `proxy.url`."""

    def __init__(
        self,
        upstream: str,
        region: str,
        creds: StandInCredentials,
        *,
        workspace: str = "ws-stand-in",
        keys: frozenset[str] = frozenset(),
    ) -> None:
        self.upstream, self.region, self.creds, self.workspace = upstream.rstrip("/"), region, creds, workspace
        self.keys = keys  # further access key ids taken with creds' secret (signature_problem)
        self.refusals: list[str] = []  # why each refused request was refused, in order
        self.accepted: list[str] = []  # the path (without its query) of each request let through, in order
        self.signers: list[tuple[str, str]] = []  # (access key id, path in the workspace) of each let through
        super().__init__("sigv4-proxy")

    @property
    def url(self) -> str:
        return f"{self.base}/workspaces/{self.workspace}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                problem = signature_problem(
                    self.command,
                    headers.get("host", ""),
                    self.path,
                    headers,
                    body,
                    proxy.creds,
                    proxy.region,
                    proxy.keys,
                )
                if problem is not None:
                    proxy.refusals.append(problem)
                    self._answer(403, {"message": problem})
                    return
                where = _WORKSPACE_PATH.match(self.path)
                if where is None or where["workspace"] != proxy.workspace:
                    self._answer(404, {"message": f"no workspace at {self.path.split('?')[0]}"})
                    return
                proxy.accepted.append(self.path.split("?")[0])
                rest = where["rest"]
                key = _AUTHORIZATION.match(headers["authorization"].strip())
                assert key is not None  # signature_problem parsed it
                proxy.signers.append((key["key"], rest.split("?")[0]))
                self._forward(RECEIVER_WRITE if rest == AMP_REMOTE_WRITE else rest, body)

            def _forward(self, rest: str, body: bytes) -> None:
                request = urllib.request.Request(
                    proxy.upstream + rest, data=body or None, method=self.command, headers=self._body_headers()
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as resp:
                        status, payload = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, payload = exc.code, exc.read()
                self._send(status, payload)

            def _body_headers(self) -> dict[str, str]:
                return {name: self.headers[name] for name in _FORWARDED_HEADERS if self.headers.get(name)}

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                self._send(status, json.dumps(body).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the tests read the refusals, not a log

        return Handler


class SigningSidecar(_LoopbackHop):
    """A signing hop for a Prometheus whose `sigv4` block does not sign: Debian's prometheus
    2.42.0+ds (what tools/system-deps.sh installs) sends remote writes with no Authorization header
    although its configuration has the block (seen in the offline run). AWS's answer for a
    Prometheus that cannot sign is a SigV4 proxy sidecar in front of the workspace (AMP user
    guide, "Set up ingestion from a new Prometheus server using Helm" / awslabs/aws-sigv4-proxy);
    this is that sidecar. A request that arrives signed passes unchanged, so a Prometheus that
    does sign is checked by the workspace stand-in on its own signature; an unsigned one is signed
    with botocore for service `aps` in `region` with `creds`. `signed` counts what it signed."""

    def __init__(self, upstream: str, region: str, creds: StandInCredentials) -> None:
        self.upstream, self.region, self.creds = upstream.rstrip("/"), region, creds
        self.signed = 0
        self.passed = 0  # arrived signed
        super().__init__("sigv4-sidecar")

    def sign(self, method: str, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        request = AWSRequest(method=method, url=url, data=body or None, headers=headers)
        SigV4Auth(Credentials(self.creds.access_key, self.creds.secret_key), SERVICE, self.region).add_auth(request)
        return dict(request.headers.items())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = sidecar.upstream + self.path
                headers = {name: self.headers[name] for name in _FORWARDED_HEADERS if self.headers.get(name)}
                if self.headers.get("Authorization"):
                    sidecar.passed += 1
                    for name in ("Host", "Authorization", "X-Amz-Date", "X-Amz-Security-Token", "X-Amz-Content-Sha256"):
                        if self.headers.get(name):
                            headers[name] = self.headers[name]
                else:
                    sidecar.signed += 1
                    headers = sidecar.sign("POST", url, headers, body)
                request = urllib.request.Request(url, data=body, method="POST", headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=30) as resp:
                        status, payload = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, payload = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
