"""The stack's Prometheus, offline: the synthesized scrape configuration run by a real Prometheus,
remote-writing with its `sigv4` block to a second real Prometheus that stands in for the AMP
workspace, behind testing/sigv4_proxy.py (which checks every write and every query is signed).

Only the discovery blocks change: each `serving-<fleet>` job's `ec2_sd_configs` becomes a
`static_configs` entry naming the fleet's local server, with the `__meta_ec2_*` labels ec2_sd
would attach (Prometheus docs, "Configuration", ec2_sd_config: `__meta_ec2_tag_<tagkey>`,
`__meta_ec2_instance_id`, `__meta_ec2_instance_type`, `__meta_ec2_availability_zone`), so the
job's own relabeling makes its `fleet`, `instance_id`, `instance_type` and `az` labels as on
AWS; labels starting with `__` are dropped after relabeling ("Configuration", relabel_config).
The load generators' `dns_sd_configs` become empty `static_configs`: the offline tasks take
their metrics ports at start (testing/offline_tasks.py), so no fixed list names them.
Everything else (job names, scrape interval, relabeling, external labels, remote_write and its
sigv4 section) is the synthesized text; the workspace endpoint it names is the proxy's, reached
through testing.sigv4_proxy.SigningSidecar (the remote_write URL's host and port are the
sidecar's, its path the workspace's).

Prometheus signs remote writes for service `aps` with the AWS SDK's default credential chain,
the environment first (Prometheus docs, "Configuration", sigv4: "If blank, the environment
variables AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are used"; the service name:
prometheus/common sigv4/sigv4.go, `signer.Sign(..., "aps", ...)`), so it is given the stand-in
credentials there. Debian's build (2.42.0+ds, the one installed here) sends them unsigned all
the same; the sidecar signs those, as AWS's SigV4 proxy sidecar would (see SigningSidecar), and
lets a signed one through untouched.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign.backends.local import prometheus as local_prometheus
from campaign.backends.local.processes import ProcessFailed, Supervisor
from core.ports import free_port
from testing.offline_tasks import resolve
from testing.sigv4_proxy import SigningSidecar, SigV4Proxy, StandInCredentials

CONFIG_VARIABLE = "PROMETHEUS_CONFIG"  # the Prometheus container's environment (stacks/observability.py)
ENDPOINT_ATTRIBUTE = "PrometheusEndpoint"  # AWS::APS::Workspace's return value the config names
QUERY_OUTPUT_PATH = "api/v1/query"  # what the stack's PrometheusQueryUrl output appends to the endpoint


@dataclass(frozen=True)
class ServingTarget:
    """One fleet's local server as ec2_sd would describe the instance(s) it stands for."""

    fleet: str
    address: str  # host:port of its /metrics
    instance_id: str
    instance_type: str
    az: str


def synthesized_config_value(template: Mapping[str, Any]) -> Any:
    """The Prometheus container's PROMETHEUS_CONFIG value in the template, as CloudFormation has it."""
    found = [
        env["Value"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::ECS::TaskDefinition"
        for c in r["Properties"]["ContainerDefinitions"]
        for env in c.get("Environment", [])
        if env["Name"] == CONFIG_VARIABLE
    ]
    if len(found) != 1:
        raise ValueError(
            f"the template has {len(found)} containers with {CONFIG_VARIABLE}; expected the one Prometheus"
        )
    return found[0]


def _endpoint_refs(value: Any) -> list[str]:
    """The `<logical id>.PrometheusEndpoint` GetAtt keys a CloudFormation value names."""
    if isinstance(value, dict):
        if list(value) == ["Fn::GetAtt"] and value["Fn::GetAtt"][1] == ENDPOINT_ATTRIBUTE:
            return [".".join(value["Fn::GetAtt"])]
        return [k for v in value.values() for k in _endpoint_refs(v)]
    if isinstance(value, list):
        return [k for v in value for k in _endpoint_refs(v)]
    return []


def deployed_config(template: Mapping[str, Any], workspace_endpoint: str) -> dict[str, Any]:
    """The scrape configuration the stack's Prometheus task writes to disk, with the workspace's
    PrometheusEndpoint (ending in a slash, as AMP's does) resolved to `workspace_endpoint`."""
    value = synthesized_config_value(template)
    refs = {key: workspace_endpoint for key in _endpoint_refs(value)}
    config: dict[str, Any] = json.loads(resolve(value, refs))
    return config


def with_static_targets(config: Mapping[str, Any], servers: Mapping[str, ServingTarget]) -> dict[str, Any]:
    """`config` with only its discovery blocks replaced (see the module's docstring)."""
    jobs = []
    for job in config["scrape_configs"]:
        job = dict(job)
        if "ec2_sd_configs" in job:
            fleet = job["job_name"].removeprefix("serving-")
            if fleet not in servers:
                raise ValueError(f"scrape job {job['job_name']}: no local server for fleet {fleet!r}")
            s = servers[fleet]
            del job["ec2_sd_configs"]
            job["static_configs"] = [
                {
                    "targets": [s.address],
                    "labels": {
                        "__meta_ec2_tag_fleet": s.fleet,
                        "__meta_ec2_instance_id": s.instance_id,
                        "__meta_ec2_instance_type": s.instance_type,
                        "__meta_ec2_availability_zone": s.az,
                    },
                }
            ]
        elif "dns_sd_configs" in job:
            del job["dns_sd_configs"]
            job["static_configs"] = []
        jobs.append(job)
    return {**config, "scrape_configs": jobs}


def start_prometheus(sup: Supervisor, name: str, workdir: Path, config: Mapping[str, Any] | None, **kw: Any) -> str:
    """A real Prometheus on a free loopback port with `config` (JSON is YAML), its base URL once
    /-/ready answers. `config` None: the remote-write receiver (the workspace stand-in), which
    scrapes nothing and takes writes at /api/v1/write (Prometheus docs, "Command-line flags",
    --web.enable-remote-write-receiver)."""
    exe = local_prometheus.binary()
    if exe is None:
        raise ProcessFailed("prometheus is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(json.dumps(config or {}, indent=1), encoding="utf-8")
    port = free_port()
    argv = [
        exe,
        f"--config.file={cfg}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1d",
    ]
    if config is None:
        argv.append("--web.enable-remote-write-receiver")
    proc = sup.start(name, argv, **kw)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ProcessFailed(f"{name} exited with code {proc.proc.returncode}:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return url
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise ProcessFailed(f"{name} not ready after 30 s:\n{proc.tail()}")


def through_sidecar(config: Mapping[str, Any], workspace: StandInWorkspace) -> dict[str, Any]:
    """`config` with each remote_write URL at the workspace sent to the signing sidecar instead (same path)."""
    writes = []
    for w in config["remote_write"]:
        url = str(w["url"])
        if not url.startswith(workspace.proxy.base + "/"):
            raise ValueError(f"remote_write url {url} is not the workspace stand-in's ({workspace.proxy.base})")
        writes.append({**w, "url": workspace.sidecar.base + url.removeprefix(workspace.proxy.base)})
    return {**config, "remote_write": writes}


@dataclass
class StandInWorkspace:
    """The workspace stand-in: the receiving Prometheus behind the SigV4-checking proxy."""

    proxy: SigV4Proxy
    sidecar: SigningSidecar  # in front of the proxy, for remote writes
    store_url: str  # the receiving Prometheus, unsigned (the tests only)

    @property
    def endpoint(self) -> str:
        """What AWS::APS::Workspace's PrometheusEndpoint would be: the workspace URL, with a slash."""
        return self.proxy.url + "/"

    @property
    def query_url(self) -> str:
        """What the stack's PrometheusQueryUrl output would be (stacks/observability.py query_url)."""
        return self.endpoint + QUERY_OUTPUT_PATH


@contextmanager
def stand_in_workspace(
    sup: Supervisor,
    workdir: Path,
    region: str,
    creds: StandInCredentials,
    *,
    keys: frozenset[str] = frozenset(),
    writer: StandInCredentials | None = None,
) -> Iterator[StandInWorkspace]:
    """`keys`: further access key ids the workspace takes with `creds`' secret (SigV4Proxy);
    `writer`: what the remote writes are signed with (the Prometheus task's; default `creds`)."""
    store = start_prometheus(sup, "prometheus-workspace", workdir / "workspace", None)
    with (
        SigV4Proxy(store, region, creds, keys=keys) as proxy,
        SigningSidecar(proxy.base, region, writer or creds) as sidecar,
    ):
        yield StandInWorkspace(proxy, sidecar, store)


def start_scraper(
    sup: Supervisor,
    workdir: Path,
    template: Mapping[str, Any],
    workspace: StandInWorkspace,
    servers: Mapping[str, ServingTarget],
    creds: StandInCredentials,
) -> str:
    """The stack's Prometheus: the synthesized configuration with static targets, remote-writing
    to `workspace` signed with `creds` (in its environment, where the SDK's chain finds them).
    Returns its base URL (the tests query it directly: what the local path reads)."""
    config = through_sidecar(with_static_targets(deployed_config(template, workspace.endpoint), servers), workspace)
    env = {"AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key}
    return start_prometheus(sup, "prometheus-scraper", workdir / "scraper", config, env=env)
