"""Which Prometheus URLs are an Amazon Managed Prometheus workspace (signed with SigV4 for `aps`
in the workspace's region) and which a plain Prometheus (unsigned), and the signature itself."""

from __future__ import annotations

import pytest
from botocore.credentials import Credentials

from analysis.errors import SourceUnavailable
from analysis.sources.prometheus import PrometheusEndpoint, PrometheusSource, prometheus_endpoint, sigv4_headers

WS = "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-0a1b2c3d-4e5f-6789-abcd-ef0123456789"


@pytest.mark.parametrize("url", [WS, WS + "/", WS + "/api/v1/query", WS + "/api/v1/query_range"])
def test_an_amp_workspace_url_is_signed_for_its_region(url: str) -> None:
    assert prometheus_endpoint(url) == PrometheusEndpoint(WS, "eu-west-1")


def test_a_plain_prometheus_is_unsigned_unless_told() -> None:
    assert prometheus_endpoint("http://127.0.0.1:9090/") == PrometheusEndpoint("http://127.0.0.1:9090", None)
    assert prometheus_endpoint("http://127.0.0.1:9090/api/v1/query", "us-east-1") == PrometheusEndpoint(
        "http://127.0.0.1:9090", "us-east-1"
    )
    assert PrometheusSource("http://prom:9090").sigv4_region is None


@pytest.mark.parametrize(
    ("url", "region", "why"),
    [
        ("https://aps-workspaces.eu-west-1.amazonaws.com/", None, "not a workspace's query URL"),
        ("http://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1", None, "not a workspace's query URL"),
        (WS, "us-east-1", "is in eu-west-1, not in us-east-1"),
        ("aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1", None, "is not an http"),
    ],
)
def test_bad_prometheus_urls_are_named(url: str, region: str | None, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        prometheus_endpoint(url, region)


def test_the_signature_is_botocores_for_aps_in_the_region() -> None:
    headers = sigv4_headers(WS + "/api/v1/query?query=up", "eu-west-1", Credentials("AKIDEXAMPLE", "secret", "tok"))
    scope = headers["Authorization"].split("Credential=AKIDEXAMPLE/")[1].split(",")[0]
    assert scope.endswith("/eu-west-1/aps/aws4_request")
    assert "SignedHeaders=host;x-amz-date;x-amz-security-token," in headers["Authorization"]
    assert headers["X-Amz-Security-Token"] == "tok"


def test_no_credentials_to_sign_with_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's whole chain finds nothing (and asks no metadata endpoint: both are turned off)."""
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SourceUnavailable, match="no AWS credentials to sign the Prometheus queries"):
        PrometheusSource(WS).query("up", 0.0)
