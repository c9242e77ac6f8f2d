from __future__ import annotations

import json
from typing import Any

from core.manifest import load_manifest
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth


def _flat(v: Any) -> str:
    """A CloudFormation value as text, references as their logical ids."""
    if isinstance(v, str):
        return v
    if "Fn::Join" in v:
        return str(v["Fn::Join"][0]).join(_flat(p) for p in v["Fn::Join"][1])
    if "Ref" in v:
        return str(v["Ref"])
    return ".".join(v["Fn::GetAtt"])


# What `deploy` would fill the CampaignDeadline parameter with (campaign.aws.stack.campaign_deadline).
SAMPLE_DEADLINE = "2026-12-06T03:00:00Z"


def _run_config(example: Synth) -> Any:
    """The run config output as `run` reads it once deployed: the deadline parameter filled in."""
    from core.cloud_contract import RUN_CONFIG_OUTPUT, RunConfig
    from core.naming import CAMPAIGN_DEADLINE_PARAMETER

    text = _flat(example.template_json["Outputs"][RUN_CONFIG_OUTPUT]["Value"])
    return RunConfig.from_json(text.replace(f'"{CAMPAIGN_DEADLINE_PARAMETER}"', f'"{SAMPLE_DEADLINE}"'))


def _is_loadgen(container: dict[str, Any]) -> bool:
    """A load-generator container (master, worker, gate): the conductor's has the same name, no role."""
    return container["Name"] == "locust" and any(e["Name"] == "HARNESS_LOADGEN_ROLE" for e in container["Environment"])


def _loadgen_containers(example: Synth) -> list[dict[str, Any]]:
    return [
        c
        for t in example.resources("AWS::ECS::TaskDefinition").values()
        for c in t["Properties"]["ContainerDefinitions"]
        if _is_loadgen(c)
    ]


def test_loadgen_cluster_has_enhanced_container_insights(example: Synth) -> None:
    (cluster,) = example.resources("AWS::ECS::Cluster").values()
    assert {"Name": "containerInsights", "Value": "enhanced"} in cluster["Properties"]["ClusterSettings"]


def test_prometheus_scrapes_every_fleet_and_the_loadgen_into_a_managed_workspace(example: Synth) -> None:
    assert len(example.resources("AWS::APS::Workspace")) == 1
    containers = [
        c
        for t in example.resources("AWS::ECS::TaskDefinition").values()
        for c in t["Properties"]["ContainerDefinitions"]
    ]
    (prom,) = [c for c in containers if c["Name"] == "prometheus"]
    (env,) = [e for e in prom["Environment"] if e["Name"] == "PROMETHEUS_CONFIG"]
    text = json.dumps(env["Value"])
    for job in ("serving-inf2", "serving-g6", "loadgen-master", "loadgen-worker"):
        assert job in text
    assert "remote_write" in text and "sigv4" in text


def test_loadgen_master_and_workers_are_task_definitions_started_per_run(example: Synth) -> None:
    # Only Prometheus runs as a service; `campaign run` starts a fresh master and workers per fleet.
    services = example.resources("AWS::ECS::Service")
    assert sorted(s["Properties"]["DesiredCount"] for s in services.values()) == [1]
    assets = json.loads((example.outdir / "Comparison.assets.json").read_text(encoding="utf-8"))
    assert len(assets["dockerImages"]) == 2  # the load generator's image and the conductor's (test_conductor.py)
    locust = _loadgen_containers(example)
    assert len(locust) == 3  # master, worker and the gate, each its own definition
    m = load_manifest(EXAMPLE_MANIFEST)
    for c in locust:
        env = {e["Name"]: e["Value"] for e in c["Environment"]}
        assert env["HARNESS_MANIFEST_DIGEST"] == m.digest
        assert json.dumps(env["HARNESS_RESULTS_S3_URI"]).endswith(f'/campaigns/{m.campaign}/{m.short_digest}/runs"]]}}')
        # Nothing of a run is baked in: fleet, host, run id and the manifest itself come per run.
        assert not {"LOADGEN_MANIFEST", "LOADGEN_FLEET", "LOCUST_HOST", "LOADGEN_RUN_ID"} & set(env)
    by_role = {c["Command"][0]: {e["Name"]: e["Value"] for e in c["Environment"]} for c in locust}
    assert set(by_role) == {"--master", "--worker", "--gate"}
    master = by_role["--master"]
    n = str(m.loadgen.workers)
    assert (master["LOCUST_AUTOSTART"], master["LOCUST_USERS"], master["LOCUST_EXPECT_WORKERS"]) == ("true", n, n)


def test_run_config_output_is_what_campaign_run_reads(example: Synth) -> None:
    cfg = _run_config(example)
    assert cfg.deadline == SAMPLE_DEADLINE  # the CampaignDeadline parameter, for run's check before each stage
    tasks = example.resources("AWS::ECS::TaskDefinition")
    assert {cfg.master_task_definition, cfg.worker_task_definition, cfg.gate_task_definition} <= set(tasks)
    assert len({cfg.master_task_definition, cfg.worker_task_definition, cfg.gate_task_definition}) == 3
    assert cfg.cluster in example.resources("AWS::ECS::Cluster")
    assert len(cfg.subnets) == 2 and all(s in example.resources("AWS::EC2::Subnet") for s in cfg.subnets)
    assert set(cfg.targets) == {"inf2", "g6"} and cfg.workers == 2
    # one master and one workers service per fleet: each fleet's workers find their own master
    assert set(cfg.master_services) == set(cfg.workers_services) == {"inf2", "g6"}
    services = [s.split(".")[0] for s in [*cfg.master_services.values(), *cfg.workers_services.values()]]
    assert len(set(services)) == 4 and set(services) <= set(example.resources("AWS::ServiceDiscovery::Service"))


def _s3_writes_of(example: Synth, task_definition: str) -> set[str]:
    """The run files (<name>-*) the task definition's role may put."""
    role = example.template_json["Resources"][task_definition]["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
    out: set[str] = set()
    for p in example.resources("AWS::IAM::Policy").values():
        if {"Ref": role} not in p["Properties"]["Roles"]:
            continue
        for st in p["Properties"]["PolicyDocument"]["Statement"]:
            if "s3:PutObject" in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]]):
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                out |= {json.dumps(r).rsplit("/", 1)[1].split("-*")[0] for r in resources}
    return out


def test_the_gate_runs_from_its_own_definition_the_only_one_that_writes_gate_results(
    example: Synth, tmp_path: Any
) -> None:
    """The gate's gate-<fleet>.json is what the run's verdict is read from: the gate task has its own
    definition and task role, the only role that may write gate-*, and `campaign run` (CloudRun._spec)
    and the offline launcher start it from that definition."""
    from campaign.backends.fargate.run import CloudRun
    from testing.offline_tasks import LocalTaskLauncher

    cfg = _run_config(example)
    assert _s3_writes_of(example, cfg.gate_task_definition) == {"gate"}
    for locust_role in (cfg.master_task_definition, cfg.worker_task_definition):
        writes = _s3_writes_of(example, locust_role)
        assert writes and "gate" not in writes
    roles = {
        example.template_json["Resources"][td]["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
        for td in (cfg.master_task_definition, cfg.worker_task_definition, cfg.gate_task_definition)
    }
    assert len(roles) == 3
    m = load_manifest(example.manifest_path, check_files=False)
    launcher = LocalTaskLauncher(example.template_json, {}, tmp_path, {})
    spec = CloudRun(m, cfg, launcher, None, out_dir=tmp_path, run_id="20261205T000000Z-abcdef")._spec("gate", "g6", {})
    assert spec.task_definition == cfg.gate_task_definition
    gate = launcher.container(spec.task_definition)  # what the offline launcher runs for it
    assert gate["Command"] == ["--gate"]
    assert {"Name": "HARNESS_LOADGEN_ROLE", "Value": "gate"} in gate["Environment"]


def test_loadgen_task_roles_read_only_the_run_inputs_and_write_only_their_own_files(example: Synth) -> None:
    tasks = [
        t
        for t in example.resources("AWS::ECS::TaskDefinition").values()
        if any(_is_loadgen(c) for c in t["Properties"]["ContainerDefinitions"])
    ]
    roles = {t["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0] for t in tasks}
    assert len(roles) == 3  # master, worker, gate
    statements = [
        st
        for p in example.resources("AWS::IAM::Policy").values()
        if {r["Ref"] for r in p["Properties"]["Roles"]} & roles
        for st in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    s3: dict[str, list[str]] = {}
    for st in statements:
        for action in st["Action"] if isinstance(st["Action"], list) else [st["Action"]]:
            if action.startswith("s3:"):
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                s3.setdefault(action, []).extend(json.dumps(r)[-30:] for r in resources)
    # No List*, no GetBucket*, no Delete*: the bucket-wide read grant is gone.
    assert set(s3) == {"s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"}
    assert all(r.endswith('/runs/*/inputs/*"]]}') for r in s3["s3:GetObject"])
    assert {r.rsplit("/", 1)[1] for r in s3["s3:PutObject"]} == {
        'records-*"]]}',
        'summary-*"]]}',
        'progress-*"]]}',
        'gate-*"]]}',
    }


def test_only_workers_may_discover_and_only_their_campaigns_master_services(example: Synth) -> None:
    grants = [
        (logical_id, st)
        for logical_id, p in example.resources("AWS::IAM::Policy").items()
        for st in p["Properties"]["PolicyDocument"]["Statement"]
        if "servicediscovery:DiscoverInstances" in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    ]
    [(policy, st)] = grants
    assert "WorkerTask" in policy
    assert set(st["Condition"]["StringEquals"]["servicediscovery:ServiceName"]) == {"master-inf2", "master-g6"}
    assert "servicediscovery:NamespaceName" in st["Condition"]["StringEquals"]


def test_the_workspace_query_url_is_a_stack_output(example: Synth) -> None:
    """`run` and `report --run-id` read it (campaign/aws/run_config.py): the workspace's own endpoint
    (which ends in a slash) + api/v1/query, the query API the analysis signs for aps."""
    from core.cloud_contract import PROMETHEUS_QUERY_OUTPUT

    (workspace,) = example.resources("AWS::APS::Workspace")
    value = example.template_json["Outputs"][PROMETHEUS_QUERY_OUTPUT]["Value"]
    assert _flat(value) == f"{workspace}.PrometheusEndpointapi/v1/query"
    assert "aps:QueryMetrics" in example.template_json["Outputs"][PROMETHEUS_QUERY_OUTPUT]["Description"]
