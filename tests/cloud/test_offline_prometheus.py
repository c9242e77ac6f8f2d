"""testing/offline_prometheus.py: the stack's scrape configuration in a real Prometheus, remote-writing
with its sigv4 block through the SigV4-checking proxy to a second real Prometheus (the AMP stand-in)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from analysis.sources.prometheus import PrometheusSource
from campaign.backends.local.processes import Supervisor
from core.manifest import Manifest, load_manifest
from core.serving import definition_for
from stacks.observability import prometheus_config
from testing import offline_prometheus as op
from testing.sigv4_proxy import StandInCredentials
from tests.conftest import ROOT
from tests.real_parts import missing

pytestmark = [pytest.mark.prometheus, pytest.mark.cloud_path]

REGION = "us-east-1"
CREDS = StandInCredentials("AKIDSTANDIN", "stand-in-secret")
TTFT = "vllm:time_to_first_token_seconds"
# One vLLM-like histogram, as a server's /metrics would show it (Prometheus text format).
METRICS = (
    f"# TYPE {TTFT} histogram\n"
    f'{TTFT}_bucket{{le="0.1"}} 3\n{TTFT}_bucket{{le="1.0"}} 7\n{TTFT}_bucket{{le="+Inf"}} 8\n'
    f"{TTFT}_sum 4.2\n{TTFT}_count 8\n"
)


def synthesized_template(m: Manifest) -> dict[str, Any]:
    """A template holding the Prometheus task's PROMETHEUS_CONFIG as CDK writes it: the config's JSON
    (stacks.observability.prometheus_config) joined around the workspace endpoint's GetAtt."""
    fleets = [SimpleNamespace(fleet=f, definition=definition_for(m, f)) for f in m.fleets]
    marker = "@@ENDPOINT@@"
    config = prometheus_config(
        manifest=m,
        fleets=fleets,
        namespace="ns.internal",
        region=REGION,
        remote_write_url=f"{marker}api/v1/remote_write",
    )  # type: ignore[arg-type]
    before, after = json.dumps(config, sort_keys=True).split(marker)
    value = {"Fn::Join": ["", [before, {"Fn::GetAtt": ["Workspace1234", "PrometheusEndpoint"]}, after]]}
    container = {"Name": "prometheus", "Environment": [{"Name": "PROMETHEUS_CONFIG", "Value": value}]}
    task = {"Type": "AWS::ECS::TaskDefinition", "Properties": {"ContainerDefinitions": [container]}}
    return {"Resources": {"PrometheusTask": task}}


@pytest.fixture
def metrics_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_only_the_discovery_blocks_change() -> None:
    m = load_manifest(ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml", check_files=False)
    template = synthesized_template(m)
    servers = {
        f.name: op.ServingTarget(f.name, f"127.0.0.1:{9000 + i}", f"i-{i}", f.instance_type, "us-east-1a")
        for i, f in enumerate(m.fleets)
    }
    deployed = op.deployed_config(template, "http://proxy/workspaces/ws/")
    changed = op.with_static_targets(deployed, servers)
    assert deployed["remote_write"] == [
        {"url": "http://proxy/workspaces/ws/api/v1/remote_write", "sigv4": {"region": REGION}}
    ]
    assert {k: v for k, v in changed.items() if k != "scrape_configs"} == {
        k: v for k, v in deployed.items() if k != "scrape_configs"
    }
    for before, after in zip(deployed["scrape_configs"], changed["scrape_configs"], strict=True):
        discovery = {"ec2_sd_configs", "dns_sd_configs", "static_configs"}
        assert {k: v for k, v in before.items() if k not in discovery} == {
            k: v for k, v in after.items() if k not in discovery
        }
        assert not discovery & set(after) - {"static_configs"}
    (inf2,) = [j for j in changed["scrape_configs"] if j["job_name"] == "serving-inf2"]
    assert inf2["static_configs"][0]["targets"] == ["127.0.0.1:9000"]
    assert inf2["static_configs"][0]["labels"]["__meta_ec2_tag_fleet"] == "inf2"
    with pytest.raises(ValueError, match="serving-g6: no local server for fleet 'g6'"):
        op.with_static_targets(deployed, {"inf2": servers["inf2"]})


def test_the_scraper_remote_writes_signed_through_the_proxy_which_refuses_unsigned(
    tmp_path: Path, metrics_server: str
) -> None:
    if op.local_prometheus.binary() is None:
        missing("no prometheus binary")
    m = load_manifest(ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml", check_files=False)
    servers = {
        f.name: op.ServingTarget(f.name, metrics_server, f"i-{f.name}", f.instance_type, "us-east-1a") for f in m.fleets
    }
    with Supervisor(tmp_path / "logs") as sup, op.stand_in_workspace(sup, tmp_path, REGION, CREDS) as ws:
        scraper = op.start_scraper(sup, tmp_path, synthesized_template(m), ws, servers, CREDS)
        from botocore.credentials import Credentials

        signed = PrometheusSource(
            ws.query_url, sigv4_region=REGION, credentials=Credentials(CREDS.access_key, CREDS.secret_key)
        )
        deadline = time.monotonic() + 60
        found: list[dict[str, Any]] = []
        while not found and time.monotonic() < deadline:
            found = signed.query(f'{TTFT}_bucket{{fleet="inf2",le="1.0"}}', time.time())
            time.sleep(1)
        assert found, (ws.proxy.refusals, scraper)
        labels = found[0]["metric"]
        # the job's own relabeling made these from the __meta_ec2_* labels; the external labels came along
        assert (labels["instance_id"], labels["instance_type"], labels["az"]) == (
            "i-inf2",
            m.fleet("inf2").instance_type,
            "us-east-1a",
        )
        assert labels["campaign"] == m.campaign and labels["job"] == "serving-inf2"
        assert float(found[0]["value"][1]) == 7
        assert any(p.endswith("/api/v1/remote_write") for p in ws.proxy.accepted)
        assert not ws.proxy.refusals  # every write was signed as AMP wants
        assert ws.sidecar.signed + ws.sidecar.passed > 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(ws.query_url + "?query=up", timeout=10)
        assert refused.value.code == 403
        assert ws.proxy.refusals == ["the request is not signed (no SigV4 Authorization header)"]
