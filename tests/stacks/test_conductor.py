"""The conductor (`run --detach`, stacks/conductor.py) on the synthesized template: its task
definition, its image, the run config naming it, and a task role that may do what `campaign run`
and `run --resume` do, on this stack's resources only."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from core import cloud_contract as cc
from core.manifest import load_manifest
from core.naming import stack_name
from stacks.conductor import (
    CLOUD_MAP_UNSCOPED,
    CONDUCTOR_DEFAULT_COMMAND,
    CONDUCTOR_DOCKERFILE,
    CONDUCTOR_ENTRYPOINT,
    UNSCOPED_READS,
)
from tests.stacks.conftest import EXAMPLE_MANIFEST, REPO_ROOT, Synth
from tests.stacks.test_observability import _run_config

Statement = dict[str, Any]


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _conductor_id(s: Synth) -> str:
    (lid,) = [lid for lid in s.resources("AWS::ECS::TaskDefinition") if lid.startswith("ConductorTask")]
    return lid


def _container(s: Synth) -> dict[str, Any]:
    (c,) = s.template_json["Resources"][_conductor_id(s)]["Properties"]["ContainerDefinitions"]
    return c


def _task_role_statements(s: Synth, task_definition: str) -> list[Statement]:
    role = s.template_json["Resources"][task_definition]["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
    return [
        st
        for p in s.resources("AWS::IAM::Policy").values()
        if {"Ref": role} in p["Properties"]["Roles"]
        for st in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def _granting(statements: list[Statement], action: str, effect: str = "Allow") -> list[Statement]:
    return [st for st in statements if st["Effect"] == effect and action in _as_list(st["Action"])]


def _text(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


@pytest.fixture(scope="module")
def statements(example: Synth) -> list[Statement]:
    return _task_role_statements(example, _conductor_id(example))


def test_its_task_definition_runs_the_campaign_cli_at_the_contracts_size(example: Synth) -> None:
    props = example.template_json["Resources"][_conductor_id(example)]["Properties"]
    assert (props["Cpu"], props["Memory"]) == (
        str(1024 * cc.CONDUCTOR_TASK_VCPU),
        str(1024 * cc.CONDUCTOR_TASK_MEMORY_GIB),
    )
    assert props["RequiresCompatibilities"] == ["FARGATE"] and props["NetworkMode"] == "awsvpc"
    c = _container(example)
    # RunTask's containerOverrides name the container; `conduct <run id>` replaces the command.
    assert c["Name"] == cc.CONTAINER_NAME
    assert c["EntryPoint"] == ["python", "-m", "campaign"] and c["Command"] == [cc.CONDUCT_COMMAND, "--help"]
    m = load_manifest(EXAMPLE_MANIFEST)
    # The stack whose LoadgenRunConfig it reads is the one `deploy` and `run` name (core.naming);
    # it stages a run's inputs as the load generators do: the deployed manifest's, under their prefix.
    cfg = _run_config(example)
    master = example.template_json["Resources"][cfg.master_task_definition]["Properties"]["ContainerDefinitions"][0]
    master_env = {e["Name"]: e["Value"] for e in master["Environment"]}
    assert {e["Name"]: e["Value"] for e in c["Environment"]} == {
        cc.ENV_STACK_NAME: stack_name(m.campaign),
        "AWS_DEFAULT_REGION": m.costs.region,
        cc.ENV_WORK_DIR: "/data",
        cc.ENV_MANIFEST_DIGEST: m.digest,
        cc.ENV_RESULTS_URI: master_env[cc.ENV_RESULTS_URI],
    }
    # Logs go where the load generators' do, under its own stream prefix.
    options = c["LogConfiguration"]["Options"]
    assert c["LogConfiguration"]["LogDriver"] == "awslogs" and options["awslogs-stream-prefix"] == "conductor"
    assert options["awslogs-group"] == master["LogConfiguration"]["Options"]["awslogs-group"]


def test_its_image_is_built_from_the_conductor_dockerfile_whose_entrypoint_is_the_task_definitions(
    example: Synth,
) -> None:
    text = (REPO_ROOT / CONDUCTOR_DOCKERFILE).read_text(encoding="utf-8")
    entrypoint = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
    cmd = re.search(r"^CMD\s+(\[.*\])\s*$", text, re.M)
    assert entrypoint and cmd, "Dockerfile.conductor: exec-form ENTRYPOINT and CMD"
    assert json.loads(entrypoint.group(1)) == CONDUCTOR_ENTRYPOINT == _container(example)["EntryPoint"]
    assert json.loads(cmd.group(1)) == CONDUCTOR_DEFAULT_COMMAND
    assets = json.loads((example.outdir / "Comparison.assets.json").read_text(encoding="utf-8"))
    by_file = {a["source"].get("dockerFile", "Dockerfile"): a for a in assets["dockerImages"].values()}
    assert set(by_file) == {"Dockerfile", CONDUCTOR_DOCKERFILE}
    (tag,) = {d["imageTag"] for d in by_file[CONDUCTOR_DOCKERFILE]["destinations"].values()}
    assert _text(_container(example)["Image"]).endswith(f':{tag}"}}')


def test_the_run_config_names_the_conductors_task_definition(example: Synth) -> None:
    cfg = _run_config(example)
    assert cfg.conductor_task_definition == _conductor_id(example)
    others = {cfg.master_task_definition, cfg.worker_task_definition, cfg.gate_task_definition}
    assert cfg.conductor_task_definition not in others


def test_its_role_grants_exactly_the_calls_run_and_resume_make(statements: list[Statement]) -> None:
    allowed = {a for st in statements if st["Effect"] == "Allow" for a in _as_list(st["Action"])}
    assert allowed == {
        "cloudformation:DescribeStacks",
        "ecs:RunTask",
        "ecs:StopTask",
        "ecs:DescribeTasks",
        "ecs:ListTasks",
        "ecs:TagResource",
        "iam:PassRole",
        "servicediscovery:RegisterInstance",
        "servicediscovery:DeregisterInstance",
        "servicediscovery:ListInstances",
        "route53:ChangeResourceRecordSets",
        "route53:GetHealthCheck",
        "route53:UpdateHealthCheck",
        "route53:DeleteHealthCheck",
        *CLOUD_MAP_UNSCOPED,
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "aps:QueryMetrics",
        *UNSCOPED_READS,
    }
    # Resource "*" only for the actions that define no resource type, and ListTasks with its cluster condition.
    on_star = [st for st in statements if st["Effect"] == "Allow" and "*" in _as_list(st["Resource"])]
    assert {a for st in on_star for a in _as_list(st["Action"])} == {
        *UNSCOPED_READS,
        *CLOUD_MAP_UNSCOPED,
        "ecs:ListTasks",
    }
    (list_tasks,) = _granting(statements, "ecs:ListTasks")
    assert set(_as_list(list_tasks["Action"])) == {"ecs:ListTasks"}
    assert list_tasks["Condition"] == {"ArnEquals": {"ecs:cluster": {"Fn::GetAtt": [_cluster(statements), "Arn"]}}}
    (describe_stacks,) = _granting(statements, "cloudformation:DescribeStacks")
    assert describe_stacks["Resource"] == {"Ref": "AWS::StackId"}


def _cluster(statements: list[Statement]) -> str:
    (run_task,) = _granting(statements, "ecs:RunTask")
    cluster: str = run_task["Condition"]["ArnEquals"]["ecs:cluster"]["Fn::GetAtt"][0]
    return cluster


def test_it_starts_only_the_load_generators_definitions_in_its_cluster_and_passes_only_their_roles(
    example: Synth, statements: list[Statement]
) -> None:
    cfg = _run_config(example)
    resources = example.template_json["Resources"]
    loadgen = [cfg.master_task_definition, cfg.worker_task_definition, cfg.gate_task_definition]
    (run_task,) = _granting(statements, "ecs:RunTask")
    assert set(_as_list(run_task["Action"])) == {"ecs:RunTask"}
    assert sorted(r["Ref"] for r in run_task["Resource"]) == sorted(loadgen)  # not its own definition
    assert _cluster(statements) == cfg.cluster
    for action in ("ecs:StopTask", "ecs:DescribeTasks", "ecs:TagResource"):
        (st,) = _granting(statements, action)
        assert _text(st["Resource"]).endswith(f':task/", {{"Ref": "{cfg.cluster}"}}, "/*"]]}}'), action
    (tag,) = _granting(statements, "ecs:TagResource")
    assert tag["Condition"] == {"StringEquals": {"ecs:CreateAction": "RunTask"}}  # tags at RunTask only
    (pass_role,) = _granting(statements, "iam:PassRole")
    roles = {
        resources[td]["Properties"][key]["Fn::GetAtt"][0]
        for td in loadgen
        for key in ("TaskRoleArn", "ExecutionRoleArn")
    }
    assert {r["Fn::GetAtt"][0] for r in pass_role["Resource"]} == roles and len(roles) == 6
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}


def test_it_registers_only_in_the_campaigns_services_and_writes_only_the_runs_prefix(
    example: Synth, statements: list[Statement]
) -> None:
    cfg = _run_config(example)
    (register,) = _granting(statements, "servicediscovery:RegisterInstance")
    services = {*cfg.master_services.values(), *cfg.workers_services.values()}
    assert {r["Fn::GetAtt"][0] for r in register["Resource"]} == {s.split(".")[0] for s in services}
    assert set(_as_list(register["Action"])) == {
        "servicediscovery:RegisterInstance",
        "servicediscovery:DeregisterInstance",
        "servicediscovery:ListInstances",
    }
    (namespace,) = example.resources("AWS::ServiceDiscovery::PrivateDnsNamespace")
    (records,) = _granting(statements, "route53:ChangeResourceRecordSets")
    assert _text(records["Resource"]).endswith(f'hostedzone/", {{"Fn::GetAtt": ["{namespace}", "HostedZoneId"]}}]]}}')
    # what Cloud Map's API permissions reference lists beside it, on health checks only
    (health,) = _granting(statements, "route53:GetHealthCheck")
    assert set(_as_list(health["Action"])) == {
        "route53:GetHealthCheck",
        "route53:UpdateHealthCheck",
        "route53:DeleteHealthCheck",
    }
    assert _text(health["Resource"]).endswith(':route53:::healthcheck/*"]]}')
    m = load_manifest(EXAMPLE_MANIFEST)
    runs = f"campaigns/{m.campaign}/{m.short_digest}/runs"
    (listing,) = _granting(statements, "s3:ListBucket")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{runs}/*"]}}
    (objects,) = _granting(statements, "s3:PutObject")
    assert _text(objects["Resource"]).endswith(f'"/{runs}/*"]]}}')
    assert set(_as_list(objects["Action"])) == {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
    }
    # The gate's results, which the verdict is read from, stay the gate task's own to write.
    (deny,) = _granting(statements, "s3:PutObject", effect="Deny")
    assert _text(deny["Resource"]).endswith(f'"/{runs}/*/{cc.GATE_PREFIX}*"]]}}')
    (workspace,) = example.resources("AWS::APS::Workspace")
    (query,) = _granting(statements, "aps:QueryMetrics")
    assert query["Resource"] == {"Fn::GetAtt": [workspace, "Arn"]}


def test_every_manifest_gets_its_conductor(three_fleets: Synth) -> None:
    cfg = _run_config(three_fleets)
    assert cfg.conductor_task_definition == _conductor_id(three_fleets)
    (run_task,) = _granting(_task_role_statements(three_fleets, cfg.conductor_task_definition), "ecs:RunTask")
    assert len(run_task["Resource"]) == 3
