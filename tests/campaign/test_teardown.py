"""Teardown's last step against a real moto server on loopback: find what is still tagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from campaign.aws import stack as aws
from tests.conftest import ROOT, moto_server

CAMPAIGN = "llama3-8b-inf2-vs-g6"


@pytest.fixture
def moto_env() -> Iterator[dict[str, str]]:
    with moto_server("us-east-1") as env:
        yield env


def _tags(extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in {"campaign": CAMPAIGN, **(extra or {})}.items()]


def _tls_only(bucket: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": "s3:*",
                    "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


def _run_instance(ec2: object, tags: list[dict[str, str]]) -> str:
    r = ec2.run_instances(  # type: ignore[attr-defined]
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        InstanceType="g6.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return str(r["Instances"][0]["InstanceId"])


def test_finds_left_over_instance_and_keeps_bucket(moto_env: dict[str, str]) -> None:
    session = boto3.session.Session(region_name="us-east-1")
    ec2 = session.client("ec2")
    s3 = session.client("s3")
    alive = _run_instance(ec2, _tags({"fleet": "g6"}))
    dead = _run_instance(ec2, _tags({"fleet": "inf2"}))
    ec2.terminate_instances(InstanceIds=[dead])
    _run_instance(ec2, [{"Key": "campaign", "Value": "someone-else"}])
    s3.create_bucket(Bucket="results-bucket")
    s3.put_bucket_tagging(Bucket="results-bucket", Tagging={"TagSet": _tags({"lifecycle": "retained"})})
    s3.put_bucket_policy(Bucket="results-bucket", Policy=_tls_only("results-bucket"))

    left, kept = aws.check_nothing_left(session, CAMPAIGN)
    assert [x.arn.rsplit("/", 1)[1] for x in left] == [alive]
    assert [x.arn for x in kept] == ["arn:aws:s3:::results-bucket"]


def test_cli_teardown_check_says_what_is_left(moto_env: dict[str, str], example_manifest_path: Path) -> None:
    ec2 = boto3.session.Session(region_name="us-east-1").client("ec2")
    cmd = [sys.executable, "-m", "campaign", "teardown", str(example_manifest_path), "--check-only"]
    env = {**os.environ, **moto_env}
    clean = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert f"nothing tagged campaign={CAMPAIGN} is left running" in clean.stdout

    iid = _run_instance(ec2, _tags({"fleet": "g6"}))
    dirty = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert dirty.returncode == 1
    assert "LEFT RUNNING" in dirty.stderr and iid in dirty.stderr


# --- issue 25, item 5: what a killed run and ECS leave outside the stack --------------------------

STACK = aws.naming.stack_name(CAMPAIGN)


def test_check_reports_the_container_insights_log_group_and_a_bucket_without_tls_only(moto_env: dict[str, str]) -> None:
    session = boto3.session.Session(region_name="us-east-1")
    logs = session.client("logs")
    group = f"/aws/ecs/containerinsights/{STACK}-ObservabilityCluster1A2B3C-xYz/performance"
    logs.create_log_group(logGroupName=group)
    logs.create_log_group(logGroupName="/aws/ecs/containerinsights/someone-else-Cluster-1/performance")
    s3 = session.client("s3")
    s3.create_bucket(Bucket="results-bucket")
    s3.put_bucket_tagging(
        Bucket="results-bucket", Tagging={"TagSet": _tags({"lifecycle": "retained"})}
    )  # no policy left

    left, kept = aws.check_nothing_left(session, CAMPAIGN)
    assert f"log-group:{group}" in [x.arn for x in left]
    assert not any("someone-else" in x.arn for x in left)
    assert [x.tags.get("problem") for x in left if x.arn == "arn:aws:s3:::results-bucket"] == [
        "retained without its TLS-only bucket policy"
    ]
    assert [x.arn for x in kept] == ["arn:aws:s3:::results-bucket"]

    aws.delete_container_insights_logs(session, STACK, say=lambda _: None)
    s3.put_bucket_policy(Bucket="results-bucket", Policy=_tls_only("results-bucket"))
    left, _ = aws.check_nothing_left(session, CAMPAIGN)
    assert left == []


def test_check_counts_an_instance_that_is_stopped_not_terminated(moto_env: dict[str, str]) -> None:
    session = boto3.session.Session(region_name="us-east-1")
    ec2 = session.client("ec2")
    iid = _run_instance(ec2, _tags({"fleet": "g6"}))
    ec2.stop_instances(InstanceIds=[iid])
    left, _ = aws.check_nothing_left(session, CAMPAIGN)
    assert [x.arn.rsplit("/", 1)[1] for x in left] == [iid]


def test_destroy_deregisters_cloud_map_instances_a_killed_run_left(moto_env: dict[str, str]) -> None:
    session = boto3.session.Session(region_name="us-east-1")
    sd = session.client("servicediscovery")
    op = sd.create_private_dns_namespace(Name="c.harness.internal", Vpc="vpc-12345678")
    ns = sd.get_operation(OperationId=op["OperationId"])["Operation"]["Targets"]["NAMESPACE"]
    master = sd.create_service(Name="master", NamespaceId=ns, DnsConfig={"DnsRecords": [{"Type": "A", "TTL": 10}]})[
        "Service"
    ]["Id"]
    workers = sd.create_service(Name="workers", NamespaceId=ns, DnsConfig={"DnsRecords": [{"Type": "A", "TTL": 10}]})[
        "Service"
    ]["Id"]
    sd.register_instance(ServiceId=master, InstanceId="task-m", Attributes={"AWS_INSTANCE_IPV4": "10.0.0.5"})
    for i in range(2):
        sd.register_instance(
            ServiceId=workers, InstanceId=f"task-w{i}", Attributes={"AWS_INSTANCE_IPV4": f"10.0.0.{6 + i}"}
        )

    class _Cfn:  # the stack's LoadgenRunConfig output, as read_run_config reads it
        def describe_stacks(self, StackName: str) -> dict[str, object]:
            cfg = {
                "region": "us-east-1",
                "cluster": "c",
                "master_task_definition": "m",
                "worker_task_definition": "w",
                "gate_task_definition": "g",
                "subnets": "s",
                "security_groups": "g",
                "results_uri": "s3://b/p",
                "targets": {},
                "workers": 2,
                "master_services": {"g6": master},
                "workers_services": {"g6": workers},
            }
            from core.cloud_contract import RUN_CONFIG_OUTPUT

            return {
                "Stacks": [
                    {
                        "StackName": StackName,
                        "Outputs": [{"OutputKey": RUN_CONFIG_OUTPUT, "OutputValue": json.dumps(cfg)}],
                    }
                ]
            }

    said: list[str] = []
    gone = aws.deregister_discovery_instances(session, _Cfn(), STACK, say=said.append)
    assert sorted(gone) == sorted([f"{master}/task-m", f"{workers}/task-w0", f"{workers}/task-w1"])
    assert (
        sd.list_instances(ServiceId=master)["Instances"] == []
        and sd.list_instances(ServiceId=workers)["Instances"] == []
    )


# --- issue 50, item 5: the repositories the Docker Hub pull-through cache created -----------------


def test_teardown_lists_and_deletes_the_pull_through_caches_repositories(moto_env: dict[str, str]) -> None:
    """Deleting the stack deletes the cache rule, not the docker-hub/* repositories (and images) its
    pulls created; they carry no campaign tag, so the Tagging API never showed them."""
    session = boto3.session.Session(region_name="us-east-1")
    ecr = session.client("ecr")
    for name in (
        "docker-hub/vllm/vllm-openai",
        "docker-hub/prom/prometheus",
        "ecr-public/neuron/pytorch-inference-vllm-neuronx",
        "cdk-hnb659fds-container-assets-1",
    ):
        ecr.create_repository(repositoryName=name)
    cfn = session.client("cloudformation")
    cfn.create_stack(
        StackName=STACK,
        TemplateBody=json.dumps({"Resources": {"T": {"Type": "AWS::SNS::Topic"}}}),
    )

    left, _ = aws.check_nothing_left(session, CAMPAIGN)
    assert sorted(x.arn for x in left) == [
        "ecr-repository:docker-hub/prom/prometheus",
        "ecr-repository:docker-hub/vllm/vllm-openai",
        "ecr-repository:ecr-public/neuron/pytorch-inference-vllm-neuronx",
    ]
    said: list[str] = []
    assert aws.destroy(session, STACK, say=said.append) == 0
    names = [r["repositoryName"] for r in ecr.describe_repositories()["repositories"]]
    assert names == ["cdk-hnb659fds-container-assets-1"]  # the CDK bootstrap's is not the cache's
    assert (
        "deleted ECR repository docker-hub/vllm/vllm-openai (created by the pull-through cache outside the stack)"
        in said
    )
    assert aws.check_nothing_left(session, CAMPAIGN)[0] == []
