"""The conductor's and a worker's synthesized task roles against the AWS calls they make (issue 49):
each call the seam makes in moto is recorded as its actor's (the conductor: a run's inputs, a
capacity step's target health, Cloud Map registrations and uploads, a resume's stale registrations
and moves, RunTask, DescribeTasks, ListTasks and StopTask; a worker: its inputs staged, its master
found, a part of its records and its summary put) and evaluated against the actor's role's policies from `cdk synth`
by a real evaluator (testing/iam_policy.py: iam-simulate, actions, resources and conditions). Every
call is allowed; removing any one statement the calls exercise denies a call of its action, named.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from campaign.backends.fargate.ecs_tasks import EcsTaskLauncher, stop_run_tasks
from campaign.backends.fargate.fleets import FargateSteps
from campaign.backends.fargate.run import CloudRun
from campaign.backends.fargate.tasks import TaskSpec
from core import cloud_contract as cc
from core.manifest import load_manifest
from loadgen.recording import RecordParts, upload_to_s3
from loadgen.task_inputs import discover_master, stage_inputs
from testing.iam_policy import (
    Denial,
    Evaluator,
    Recorded,
    World,
    resolve,
    role_policies,
    statement_with,
    without_statement,
)
from tests.cloud.test_cloud_steps import BUCKET, REGION, Aws, Launcher
from tests.conftest import EXAMPLE_MANIFEST

ACCOUNT = "123456789012"  # moto's
CONDUCTOR, WORKER = "conductor", "worker"
STACK = "harness-stack"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from testing.cloud_offline import synth

    return synth(EXAMPLE_MANIFEST, tmp_path_factory.mktemp("synth"))


def _logical(template: dict[str, Any], kind: str, name: str | None = None) -> list[str]:
    return [
        k
        for k, v in template["Resources"].items()
        if v["Type"] == kind and (name is None or v["Properties"].get("Name") == name)
    ]


def _role(template: dict[str, Any], prefix: str) -> str:
    (role,) = [r for r in _logical(template, "AWS::IAM::Role") if r.startswith(prefix)]
    return role


def _runs_prefix(template: dict[str, Any]) -> str:
    parts = template["Outputs"][cc.RUN_CONFIG_OUTPUT]["Value"]["Fn::Join"][1]
    (prefix,) = {
        m.group(1) for p in parts if isinstance(p, str) for m in [re.match(r"^/(campaigns/[^\"]+/runs)\"", p)] if m
    }
    return str(prefix)


class Ecs:
    """ECS's answers to RunTask, DescribeTasks, ListTasks and StopTask (moto 5.2.5's RunTask of a
    Fargate task in awsvpc mode fails inside moto: NetworkInterface has no private_dns_name); the
    calls' parameters, what is authorized, are the seam's own."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}

    def run_task(self, **kw: Any) -> dict[str, Any]:
        arn = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{kw['cluster']}/{len(self.tasks):032x}"
        self.tasks[arn] = {"taskArn": arn, "startedBy": kw["startedBy"], "lastStatus": "RUNNING", "containers": []}
        return {"tasks": [self.tasks[arn]], "failures": []}

    def describe_tasks(self, cluster: str, tasks: list[str]) -> dict[str, Any]:
        return {"tasks": [self.tasks[t] for t in tasks], "failures": []}

    def stop_task(self, cluster: str, task: str, reason: str) -> None:
        self.tasks[task]["lastStatus"] = "STOPPED"

    def get_paginator(self, name: str) -> Any:
        tasks = self.tasks

        class Pages:
            def paginate(self, **kw: Any) -> list[dict[str, Any]]:
                return [{"taskArns": [a for a, t in tasks.items() if t["lastStatus"] == kw["desiredStatus"]]}]

        return Pages()


class Conductor:
    """moto's account as the stack would leave it, the template's resources bound to it, and the
    conductor's calls recorded."""

    def __init__(self, template: dict[str, Any], aws: Aws) -> None:
        self.aws, self.calls = aws, []  # type: Aws, list[Call]
        ecs = boto3.client("ecs", region_name=REGION)
        self.ecs = ecs
        refs = {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT, "AWS::Region": REGION}
        refs["AWS::StackId"] = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/1"
        attrs: dict[tuple[str, str], str] = {}
        for role in _logical(template, "AWS::IAM::Role"):
            attrs[(role, "Arn")] = f"arn:aws:iam::{ACCOUNT}:role/{role}"
        (cluster,) = _logical(template, "AWS::ECS::Cluster")
        ecs.create_cluster(clusterName="c")
        refs[cluster], attrs[(cluster, "Arn")] = "c", f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/c"
        self.roles: dict[str, list[str]] = {}
        for td in _logical(template, "AWS::ECS::TaskDefinition"):
            props = template["Resources"][td]["Properties"]
            roles = [resolve(props[k], refs, attrs) for k in ("TaskRoleArn", "ExecutionRoleArn")]
            made = ecs.register_task_definition(
                family=props["Family"],
                taskRoleArn=roles[0],
                executionRoleArn=roles[1],
                requiresCompatibilities=["FARGATE"],
                networkMode="awsvpc",
                cpu="1024",
                memory="2048",
                containerDefinitions=[{"name": "locust", "image": "x", "memory": 2048}],
            )["taskDefinition"]
            refs[td] = made["taskDefinitionArn"]
            self.roles[made["taskDefinitionArn"]] = roles
        # the namespace and services the stack makes, by the template's names (a worker's
        # DiscoverInstances is authorized on them)
        (namespace,) = _logical(template, "AWS::ServiceDiscovery::PrivateDnsNamespace")
        self.namespace = template["Resources"][namespace]["Properties"]["Name"]
        vpc = aws.ec2.describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.0.0.0/16"]}])["Vpcs"][0]["VpcId"]
        # moto takes one namespace per VPC, and the test's Aws made one in `vpc`
        other_vpc = aws.ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
        aws.sd.create_private_dns_namespace(Name=self.namespace, Vpc=other_vpc)
        (ns,) = [n for n in aws.sd.list_namespaces()["Namespaces"] if n["Name"] == self.namespace]
        zone = aws.sd.get_namespace(Id=ns["Id"])["Namespace"]["Properties"]["DnsProperties"]["HostedZoneId"]
        self.zone = zone.split("/")[-1]  # moto answers "/hostedzone/<id>", Cloud Map the id alone
        attrs[(namespace, "HostedZoneId")] = self.zone
        self.services: dict[str, dict[str, str]] = {"master": {}, "workers": {}}
        by_name: dict[str, str] = {}
        for role, name_of in (("master", cc.master_service_name), ("workers", cc.workers_service_name)):
            for fleet in ("inf2", "g6"):
                made = aws.sd.create_service(Name=name_of(fleet), NamespaceId=ns["Id"])["Service"]
                (logical,) = _logical(template, "AWS::ServiceDiscovery::Service", name_of(fleet))
                attrs[(logical, "Arn")], self.services[role][fleet] = made["Arn"], made["Id"]
                by_name[name_of(fleet)] = made["Arn"]
        (results,) = [r for r in _logical(template, "AWS::S3::Bucket") if r.startswith("Results") and "Logs" not in r]
        refs[results], attrs[(results, "Arn")] = BUCKET, f"arn:aws:s3:::{BUCKET}"
        (workspace,) = _logical(template, "AWS::APS::Workspace")
        attrs[(workspace, "Arn")] = f"arn:aws:aps:{REGION}:{ACCOUNT}:workspace/ws-stand-in"
        self.policies = {
            actor: [resolve(doc, refs, attrs) for doc in role_policies(template, role)]
            for actor, role in (
                (CONDUCTOR, _role(template, "ConductorTaskTaskRole")),
                (WORKER, _role(template, "LoadGeneratorWorkerTaskTaskRole")),
            )
        }
        self.world = World(
            account=ACCOUNT,
            region=REGION,
            hosted_zone_of_service=lambda _sid: self.zone,  # one namespace holds every service
            task_definition=lambda name: ecs.describe_task_definition(taskDefinition=name)["taskDefinition"][
                "taskDefinitionArn"
            ],
            roles_of_task_definition=lambda arn: self.roles[arn],
            discovery_arns=lambda namespace, service: (ns["Arn"], by_name[service]),
            stack_arn=lambda name: (
                refs["AWS::StackId"] if name == STACK else f"arn:aws:cloudformation:::stack/{name}/x"
            ),
        )
        subnet = aws.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        group = aws.ec2.create_security_group(GroupName="lg", Description="lg", VpcId=vpc)["GroupId"]
        self.cfg = replace(
            aws.config(),
            subnets=(subnet,),
            security_groups=(group,),
            results_uri=f"s3://{BUCKET}/{_runs_prefix(template)}",
            namespace=self.namespace,
            master_services=self.services["master"],
            workers_services=self.services["workers"],
            master_task_definition=refs[next(t for t in refs if t.startswith("LoadGeneratorMasterTask"))],
        )

    def client(self, service: str, client: Any, actor: str = "conductor") -> Any:
        return Recorded(client, service, actor, self.calls)


@pytest.fixture
def conductor(template: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Conductor]:
    """The calls of one capacity step, a resume's clean-up and moves, and a task's start, look and stop."""
    monkeypatch.setattr(CloudRun, "_collect", lambda self, *a, **k: {})  # no records: not under test
    with mock_aws():
        aws = Aws()
        c = Conductor(template, aws)
        aws.healthy("g6", 4)
        m = load_manifest(EXAMPLE_MANIFEST)
        run = CloudRun(
            m,
            c.cfg,
            Launcher(aws),
            c.client("s3", aws.s3),
            out_dir=tmp_path,
            poll_s=0.01,
            discovery=c.client("servicediscovery", aws.sd),
            elbv2=c.client("elbv2", aws.elbv2),
            say=lambda line: None,
        )
        from analysis.capacity.search import StepPlan

        run.upload_inputs()
        plan = StepPlan(multiplier=1.0, span_s=10.0, why="test")
        FargateSteps(run).run("g6", plan, run.run_dir / "capacity" / "g6" / plan.label, 10, threading.Event())
        run.write_run_record("running")
        run.publish()
        # a resume: a stale registration dropped, a cut-off step's objects set aside
        aws.sd.register_instance(
            ServiceId=c.services["master"]["g6"],
            InstanceId="stale",
            Attributes={"AWS_INSTANCE_IPV4": "10.0.0.1", cc.STEP_ATTRIBUTE: f"{run.run_id}/capacity/g6/x2"},
        )
        run.deregister_stale()
        bucket, prefix = cc.split_s3_uri(run.uri)
        aws.s3.put_object(Bucket=bucket, Key=f"{prefix}/capacity/g6/x2/records-g6-w0-p0.jsonl", Body=b"cut\n")
        run.move("capacity/g6/x2", "interrupted/capacity/g6/x2-1")
        # a task started, looked at and stopped through ECS itself
        ecs = c.client("ecs", Ecs())
        launcher = EcsTaskLauncher(ecs, c.cfg, run.run_id, say=lambda line: None)
        spec = TaskSpec(
            role="master",
            fleet="g6",
            task_definition=c.cfg.master_task_definition,
            environment={cc.ENV_RUN_ID: run.run_id},
        )
        handle = launcher.start(spec)
        launcher.describe([handle])
        stop_run_tasks(ecs, c.cfg.cluster, "test", run.run_id, conductor=False)
        # a worker of step x1: its inputs staged, its master found, a part of its records put
        step = f"{run.run_id}/capacity/g6/x1"
        aws.sd.register_instance(
            ServiceId=c.services["master"]["g6"],
            InstanceId="m",
            Attributes={"AWS_INSTANCE_IPV4": "10.0.0.9", cc.STEP_ATTRIBUTE: step},
        )
        env = {
            cc.ENV_RESULTS_URI: c.cfg.results_uri,
            cc.ENV_RUN_ID: run.run_id,
            cc.ENV_MANIFEST_DIGEST: m.digest,
            cc.ENV_WORK_DIR: str(tmp_path / "worker"),
            cc.ENV_DISCOVERY_NAMESPACE: c.namespace,
            cc.ENV_MASTER_SERVICE: cc.master_service_name("g6"),
            cc.ENV_STEP: step,
        }
        stage_inputs(env, c.client("s3", aws.s3, WORKER))
        assert discover_master(env, c.client("servicediscovery", aws.sd, WORKER), timeout_s=1) == (
            "10.0.0.9",
            str(cc.LOCUST_MASTER_PORT),
        )
        records = tmp_path / "records-g6-w0.jsonl"
        records.write_text("{}\n")
        parts = RecordParts(records, f"{run.uri}/capacity/g6/x1", "g6", "w0", c.client("s3", aws.s3, WORKER))
        assert parts.flush() is not None
        summary = tmp_path / "summary-g6-w0.json"
        summary.write_text("{}")
        upload_to_s3([summary], f"{run.uri}/capacity/g6/x1", c.client("s3", aws.s3, WORKER))
        yield c


def _denied(c: Conductor, policies: dict[str, list[dict[str, Any]]]) -> list[Denial]:
    with Evaluator(ACCOUNT) as iam:
        return iam.denials(c.calls, policies, c.world)


def test_every_call_the_conductor_makes_is_allowed_by_its_role(conductor: Conductor) -> None:
    made = {(call.service, call.operation) for call in conductor.calls if call.actor == CONDUCTOR}
    assert {
        ("ecs", "RunTask"),
        ("ecs", "DescribeTasks"),
        ("ecs", "ListTasks"),
        ("ecs", "StopTask"),
        ("servicediscovery", "RegisterInstance"),
        ("servicediscovery", "DeregisterInstance"),
        ("servicediscovery", "ListInstances"),
        ("elbv2", "DescribeTargetHealth"),
        ("s3", "PutObject"),
        ("s3", "CopyObject"),
        ("s3", "DeleteObject"),
    } <= made
    assert [str(d) for d in _denied(conductor, conductor.policies) if d.call.actor == CONDUCTOR] == []


def test_every_call_a_worker_makes_is_allowed_by_its_role(conductor: Conductor) -> None:
    made = {(call.service, call.operation) for call in conductor.calls if call.actor == WORKER}
    assert made == {("s3", "GetObject"), ("s3", "PutObject"), ("servicediscovery", "DiscoverInstances")}
    assert [str(d) for d in _denied(conductor, conductor.policies) if d.call.actor == WORKER] == []


@pytest.mark.parametrize(
    ("actor", "action"),
    [
        (CONDUCTOR, "ecs:RunTask"),
        (CONDUCTOR, "ecs:ListTasks"),
        (CONDUCTOR, "ecs:StopTask"),
        (CONDUCTOR, "iam:PassRole"),
        (CONDUCTOR, "ecs:TagResource"),
        (CONDUCTOR, "servicediscovery:RegisterInstance"),
        (CONDUCTOR, "route53:ChangeResourceRecordSets"),
        (CONDUCTOR, "route53:GetHealthCheck"),
        (CONDUCTOR, "route53:CreateHealthCheck"),
        (CONDUCTOR, "s3:PutObject"),
        (CONDUCTOR, "elasticloadbalancing:DescribeTargetHealth"),
        (WORKER, "s3:GetObject"),
        (WORKER, "s3:PutObject"),
        (WORKER, "servicediscovery:DiscoverInstances"),
    ],
)
def test_removing_a_statement_denies_the_call_that_needs_it(conductor: Conductor, actor: str, action: str) -> None:
    doc, statement = statement_with(conductor.policies[actor], action)
    policies = {**conductor.policies, actor: without_statement(conductor.policies[actor], doc, statement)}
    denied = _denied(conductor, policies)
    assert denied, f"removing the {actor}'s statement with {action} denied nothing"
    removed = conductor.policies[actor][doc]["Statement"][statement]["Action"]
    removed = set(removed) if isinstance(removed, list) else {removed}
    # only the removed statement's actions, only of this actor, and the one asked among them
    assert {d.call.actor for d in denied} == {actor}
    assert action in {d.authorization.action for d in denied} <= removed
    first = next(d for d in denied if d.authorization.action == action)
    assert str(first).startswith(f"{actor} may not {action} on ")
    print(json.dumps([str(d) for d in denied][:3]))
