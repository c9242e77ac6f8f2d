"""Fleet latency histograms over the Prometheus HTTP API (`/api/v1/query`, `/api/v1/query_range`),
from a plain Prometheus (the local campaign's) or an Amazon Managed Service for Prometheus (AMP)
workspace (the cloud campaign's), whose query API takes only SigV4-signed requests.

Buckets are merged across every replica and worker with `sum by (le)` of `increase` over the
campaign window, and only then turned into a quantile (histogram_quantile); per-replica
quantiles are fetched only to show how far their average would have been off.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from analysis.errors import SourceUnavailable


@dataclass(frozen=True)
class HistogramNames:
    """Metric base names (without `_bucket`); each serving stack names them its own way (`for_stack`)."""

    client_ttft: str = "loadgen_ttft_seconds"
    client_itl: str = "loadgen_itl_seconds"
    # None: the stack exports no such histogram (TGI has no time-to-first-token series).
    server_ttft: str | None = "vllm:time_to_first_token_seconds"
    server_itl: str | None = "vllm:inter_token_latency_seconds"
    server_itl_fallback: str | None = "vllm:time_per_output_token_seconds"  # older vLLM releases
    fleet_label: str = "fleet"
    replica_label: str = "instance"

    @classmethod
    def for_stack(cls, stack: str) -> HistogramNames:
        """The serving stack's own series, as core.serving declares them for its fleets."""
        from core.serving import METRICS_BY_STACK, VLLM_METRICS

        names = METRICS_BY_STACK.get(stack)
        if names is None:
            raise ValueError(f"unknown serving stack {stack!r}; known: {sorted(METRICS_BY_STACK)}")
        fallback = cls.server_itl_fallback if names is VLLM_METRICS else None
        return cls(server_ttft=names.get("ttft"), server_itl=names.get("itl"), server_itl_fallback=fallback)


def _selector(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(labels.items())
    )
    return "{" + inner + "}"


def scrape_widened(start: float, end: float, scrape_interval_s: float) -> tuple[float, float]:
    """A measured window [start, end] widened by one scrape interval each side, to query at its
    new end: `increase` reads only the samples inside its range, so the range must hold the last
    scrape before the first request (the counters' values when the window began) and the first
    scrape after the last completion (its observations reach Prometheus then). A range from the
    first send reads no sample of the window's start, and a short window none at all."""
    return start - scrape_interval_s, end + scrape_interval_s


def _range(start: float, end: float) -> str:
    return f"{max(math.ceil(end - start), 1)}s"


# AMP's Prometheus-compatible query API lives under the workspace's endpoint,
# https://aps-workspaces.<region>.amazonaws.com/workspaces/<workspace id>/api/v1/query (and
# query_range), and every request to it "must be signed with SigV4" for service `aps` (AMP user
# guide: "Query using Prometheus-compatible APIs", AMP-onboard-query-APIs.html, and "Use awscurl to
# query with Prometheus-compatible APIs", AMP-compatible-APIs.html: `awscurl --service aps`).
AMP_SERVICE = "aps"
_AMP_HOST = re.compile(r"^aps-workspaces\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")
_AMP_PATH = re.compile(r"^/workspaces/(?P<workspace>[A-Za-z0-9-]+)$")
_API_SUFFIX = re.compile(r"/api/v1/(query|query_range)/?$")


@dataclass(frozen=True)
class PrometheusEndpoint:
    """Where the queries go: the base URL (the API paths are added to it), and the region the
    requests are SigV4-signed for (None: plain, unsigned HTTP, as a local Prometheus takes)."""

    base_url: str
    sigv4_region: str | None = None


def prometheus_endpoint(url: str, sigv4_region: str | None = None) -> PrometheusEndpoint:
    """`url`: a Prometheus base URL, or a query URL (`.../api/v1/query`, as the AMP console and
    the stack's PrometheusQueryUrl output give it). An AMP workspace's URL is signed for the
    region in its host name; any other URL only when `sigv4_region` is given (the offline
    stand-in behind testing/sigv4_proxy.py)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"Prometheus URL {url!r} is not an http(s) URL")
    path = _API_SUFFIX.sub("", parts.path).rstrip("/")
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    amp = _AMP_HOST.match(parts.hostname or "")
    if amp is None:
        return PrometheusEndpoint(base, sigv4_region)
    if parts.scheme != "https" or _AMP_PATH.match(path) is None:
        raise ValueError(
            f"Prometheus URL {url!r} is an Amazon Managed Prometheus host but not a workspace's query URL "
            "(https://aps-workspaces.<region>.amazonaws.com/workspaces/<workspace id>[/api/v1/query])"
        )
    region = amp.group("region")
    if sigv4_region is not None and sigv4_region != region:
        raise ValueError(f"Prometheus URL: the workspace {url!r} is in {region}, not in {sigv4_region}")
    return PrometheusEndpoint(base, region)


class _Credentials(Protocol):
    access_key: str
    secret_key: str
    token: str | None


def _default_credentials() -> _Credentials:
    """The AWS credentials botocore's own chain finds (environment, profile, instance or task role)."""
    import botocore.exceptions
    import botocore.session

    try:
        creds = botocore.session.get_session().get_credentials()
    except botocore.exceptions.BotoCoreError as exc:  # a profile or role that fails to give them
        raise SourceUnavailable(f"no AWS credentials to sign the Prometheus queries with: {exc}") from None
    if creds is None:
        raise SourceUnavailable(
            "no AWS credentials to sign the Prometheus queries with (SigV4, service aps): "
            "set a profile or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    frozen: _Credentials = creds.get_frozen_credentials()
    return frozen


def sigv4_headers(url: str, region: str, credentials: _Credentials) -> dict[str, str]:
    """The headers that sign a GET of `url` for service aps in `region`, by botocore's own signer."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method="GET", url=url)
    SigV4Auth(credentials, AMP_SERVICE, region).add_auth(request)
    return dict(request.headers.items())


def _query_string(params: dict[str, str]) -> str:
    # Percent-encoded as SigV4's canonical query string wants it (space as %20, not '+'; only
    # -_.~ left as they are: AWS Signature Version 4 "Create a canonical request"): botocore signs
    # the query string of the URL as it is, and AMP recomputes the signature from the canonical form.
    return urllib.parse.urlencode(params, quote_via=urllib.parse.quote, safe="-_.~")


def _refusal_detail(exc: urllib.error.HTTPError) -> str:
    """Prometheus answers {"error": ...}; AMP (and the stand-in proxy) {"message": ...}."""
    raw = exc.read()[:2000].decode("utf-8", "replace")
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.strip()
    if isinstance(body, dict):
        return str(body.get("error") or body.get("message") or body.get("Message") or raw).strip()
    return raw.strip()


class PrometheusSource:
    def __init__(
        self,
        url: str | PrometheusEndpoint,
        *,
        timeout_s: float = 5.0,
        sigv4_region: str | None = None,
        credentials: _Credentials | None = None,
    ):
        """`url` as `prometheus_endpoint` takes it (an AMP workspace's is signed); `credentials`:
        for signing, botocore's default chain when not given."""
        endpoint = url if isinstance(url, PrometheusEndpoint) else prometheus_endpoint(url, sigv4_region)
        self.url = endpoint.base_url
        self.sigv4_region = endpoint.sigv4_region
        self.timeout_s = timeout_s
        self._credentials = credentials

    def _headers(self, full: str) -> dict[str, str]:
        if self.sigv4_region is None:
            return {}
        if self._credentials is None:
            self._credentials = _default_credentials()
        return sigv4_headers(full, self.sigv4_region, self._credentials)

    # AMP's errors: AccessDeniedException is HTTP 403 and ResourceNotFoundException (a workspace
    # that does not exist) 404, each with a `message` (AMP API reference, e.g. DescribeWorkspace's
    # Errors); querying needs aps:QueryMetrics (the AWS managed policy AmazonPrometheusQueryAccess
    # grants it with GetLabels, GetSeries, GetMetricMetadata).
    def _refused(self, exc: urllib.error.HTTPError, query: str | None) -> SourceUnavailable:
        detail = _refusal_detail(exc)
        if exc.code == 403 and self.sigv4_region is not None:
            why = (
                f"the query was refused (HTTP 403: {detail}): the caller needs aps:QueryMetrics on the workspace, "
                f"and requests signed with SigV4 for service {AMP_SERVICE} in {self.sigv4_region}"
            )
        elif exc.code == 403:
            why = f"the query was refused (HTTP 403: {detail}); an AMP workspace needs SigV4-signed requests"
        elif exc.code == 404 and self.sigv4_region is not None:
            why = f"no such workspace (HTTP 404: {detail}): it was deleted, or the URL names another region"
        else:
            return SourceUnavailable(f"Prometheus at {self.url} answered HTTP {exc.code} to {query!r}: {detail}")
        return SourceUnavailable(f"Prometheus at {self.url}: {why}")

    def _get(self, path: str, params: dict[str, str]) -> Any:
        full = f"{self.url}{path}?{_query_string(params)}"
        request = urllib.request.Request(full, headers=self._headers(full))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc, params.get("query")) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceUnavailable(f"Prometheus at {self.url} is unreachable: {reason}") from None
        if body.get("status") != "success":
            raise SourceUnavailable(f"Prometheus at {self.url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        return list(data.get("result", []))

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        data = self._get(
            "/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        )
        return list(data.get("result", []))

    def has_series(self, metric: str, labels: dict[str, str], start: float, end: float) -> bool:
        expr = f"count(count_over_time({metric}_bucket{_selector(labels)}[{_range(start, end)}]))"
        return bool(self.query(expr, end))

    def merged_buckets(self, metric: str, labels: dict[str, str], start: float, end: float) -> dict[float, float]:
        """Cumulative counts per le over the window, summed across replicas and workers."""
        return {
            float(s["metric"]["le"]): float(s["value"][1])
            for s in self.query(merged_bucket_query(metric, labels, start, end), end)
        }

    def merged_quantile(self, q: float, metric: str, labels: dict[str, str], start: float, end: float) -> float | None:
        """Prometheus's own histogram_quantile of the merged buckets: the fleet percentile."""
        expr = (
            f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket{_selector(labels)}[{_range(start, end)}])))"
        )
        res = self.query(expr, end)
        if not res:
            return None
        v = float(res[0]["value"][1])
        return None if math.isnan(v) else v

    def per_replica_quantiles(
        self, q: float, metric: str, labels: dict[str, str], start: float, end: float, by: str = "instance"
    ) -> dict[str, float]:
        """Diagnostics only: each replica's own quantile. Never average these into a fleet figure."""
        expr = f"histogram_quantile({q}, sum by (le, {by}) (increase({metric}_bucket{_selector(labels)}[{_range(start, end)}])))"
        out = {}
        for s in self.query(expr, end):
            v = float(s["value"][1])
            if not math.isnan(v):
                out[s["metric"].get(by, "?")] = v
        return out


# The serving targets' scrape jobs: the local campaign's `server` job (campaign/backends/local/
# prometheus.py) and the stack's `serving-<fleet>` jobs (stacks/observability.py), both labelled
# with the fleet; the load generators' jobs are left out of a fleet's target check.
SERVER_JOBS = "server|serving-.+"


@dataclass(frozen=True)
class RawQuery:
    """One instant query as sent and its raw result vector: what a run directory keeps (metrics/)."""

    query: str
    at: float
    result: list[dict[str, Any]]


def merged_bucket_query(metric: str, labels: dict[str, str], start: float, end: float) -> str:
    """`sum by (le)` of `increase` over [start, end]: the fleet's merged cumulative buckets."""
    return f"sum by (le) (increase({metric}_bucket{_selector(labels)}[{_range(start, end)}]))"


def target_up_queries(labels: dict[str, str], start: float, end: float) -> dict[str, str]:
    """Per serving target over [start, end]: its lowest `up` (0: at least one scrape failed) and
    how many `up` samples it has (fewer than the window's scrapes: it was gone part of the time,
    e.g. an instance replaced, which leaves no sample at all rather than a 0)."""
    job = f'job=~"{SERVER_JOBS}"'
    sel = _selector(labels)[:-1] + "," + job + "}" if labels else "{" + job + "}"
    rng = _range(start, end)
    return {
        "up_min": f"min_over_time(up{sel}[{rng}])",
        "up_samples": f"count_over_time(up{sel}[{rng}])",
    }


def raw_query(src: PrometheusSource, expr: str, at: float) -> RawQuery:
    return RawQuery(expr, at, src.query(expr, at))
