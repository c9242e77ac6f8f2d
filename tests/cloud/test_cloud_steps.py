"""What `campaign run` does around each replay and capacity step on AWS, against moto's ELBv2,
EC2, Cloud Map and S3 and a task launcher whose tasks the test drives (no offline task
processes, so none of testing/offline_tasks.py's substitutions, e.g. its 1 s UI linger, apply):

- ready is every measured instance healthy in the fleet's target group, not the first answer;
- a step's master and workers start together, each fleet's workers find their own master of
  that step in Cloud Map, and the step's registrations go when the step ends;
- only the trace replay's master lingers for its web UI;
- each step records the instances it really ran on: the fewest healthy while it ran.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from analysis.capacity.search import StepPlan
from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate.fleets import CloudFleets
from campaign.backends.fargate.run import CloudRun
from campaign.backends.fargate.tasks import TaskSpec, TaskStatus
from core import cloud_contract as cc
from core.manifest import load_manifest
from core.records import INSTANCES_FILE
from loadgen.fixtures import FixtureResult, GateResult
from loadgen.gate_task import gate_key
from loadgen.task_inputs import InputsRejected, discover_master
from tests.conftest import EXAMPLE_MANIFEST

BUCKET = "results"
REGION = "us-east-1"


def run_config(**change: Any) -> cc.RunConfig:
    """A stack's run config as the tests here give it, `change` replacing fields."""
    base = cc.RunConfig(
        region=REGION,
        cluster="c",
        master_task_definition="master-td",
        worker_task_definition="worker-td",
        gate_task_definition="gate-td",
        subnets=("s",),
        security_groups=("g",),
        results_uri=f"s3://{BUCKET}/campaigns/c/d/runs",
        targets={"inf2": "http://nlb:8000", "g6": "http://nlb:8001"},
        workers=2,
    )
    return replace(base, **change)


class Aws:
    def __init__(self) -> None:
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.elbv2 = boto3.client("elbv2", region_name=REGION)
        self.sd = boto3.client("servicediscovery", region_name=REGION)
        self.s3 = boto3.client("s3", region_name=REGION)
        self.s3.create_bucket(Bucket=BUCKET)
        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.sd.create_private_dns_namespace(Name="harness.local", Vpc=vpc)
        ns = self.sd.list_namespaces()["Namespaces"][0]["Id"]
        self.instances: dict[str, list[str]] = {}
        self.target_groups: dict[str, str] = {}
        self.masters: dict[str, str] = {}
        self.workers: dict[str, str] = {}
        # one of moto's stock images, by name: listing all of them (1,300) costs seconds to serialize
        amzn2 = [{"Name": "name", "Values": ["amzn2-ami-hvm-2.0.*-x86_64-gp2"]}]
        image = self.ec2.describe_images(Filters=amzn2)["Images"][0]["ImageId"]
        for fleet in ("inf2", "g6"):
            self.target_groups[fleet] = self.elbv2.create_target_group(
                Name=f"tg-{fleet}", Protocol="TCP", Port=8000, VpcId=vpc, TargetType="instance"
            )["TargetGroups"][0]["TargetGroupArn"]
            made = self.ec2.run_instances(ImageId=image, MinCount=4, MaxCount=4)["Instances"]
            self.instances[fleet] = [i["InstanceId"] for i in made]
            for role, names in (("master", self.masters), ("workers", self.workers)):
                name = cc.master_service_name(fleet) if role == "master" else cc.workers_service_name(fleet)
                names[fleet] = self.sd.create_service(Name=name, NamespaceId=ns)["Service"]["Id"]

    def healthy(self, fleet: str, count: int) -> None:
        """The fleet's first `count` instances pass their health checks (moto: a registered,
        running instance target is healthy; a stopped one is not)."""
        ids = self.instances[fleet][:count]
        self.elbv2.register_targets(TargetGroupArn=self.target_groups[fleet], Targets=[{"Id": i} for i in ids])

    def config(self) -> cc.RunConfig:
        return run_config(
            target_groups=dict(self.target_groups),
            namespace="harness.local",
            master_services=dict(self.masters),
            workers_services=dict(self.workers),
        )


@pytest.fixture
def aws() -> Iterator[Aws]:
    with mock_aws():
        yield Aws()


class Launcher:
    """Tasks that run for `lifetime` DescribeTasks polls, then stop with exit 0; a gate task writes
    its fleet's result first. `on_describe(n)` runs at each poll (a target dropping out, say)."""

    def __init__(self, aws: Aws, lifetime: int = 4) -> None:
        self.aws = aws
        self.lifetime = lifetime
        self.started: list[tuple[TaskSpec, int, int]] = []  # spec, polls so far, healthy targets of its fleet
        self.polls: dict[str, int] = {}
        self.specs: dict[str, TaskSpec] = {}
        self.describes = 0
        self.on_describe: Any = None
        self.discovered: dict[str, tuple[str, str]] = {}  # worker handle -> the master it found

    def start(self, spec: TaskSpec) -> str:
        handle = f"arn:task/{spec.fleet}-{spec.role}-{len(self.started)}"
        tg = self.aws.target_groups[spec.fleet]
        health = self.aws.elbv2.describe_target_health(TargetGroupArn=tg)["TargetHealthDescriptions"]
        self.started.append((spec, self.describes, sum(d["TargetHealth"]["State"] == "healthy" for d in health)))
        self.polls[handle] = 0
        self.specs[handle] = spec
        if spec.role == "gate":
            result = {
                "fleet": spec.fleet,
                "ready": True,
                "ready_after_s": 3.0,
                "seen": "ok",
                "gate": GateResult(
                    spec.fleet, True, 1.0, 1.0, [FixtureResult("a", True, [], "length", 32, "x")]
                ).as_dict(),
            }
            run_id = spec.environment[cc.ENV_RUN_ID]
            key = f"campaigns/c/d/runs/{run_id}/{gate_key(spec.fleet)}"
            self.aws.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(result).encode())
        return handle

    def describe(self, handles: Sequence[str]) -> dict[str, TaskStatus]:
        self.describes += 1
        if self.on_describe is not None:
            self.on_describe(self.describes)
        out = {}
        for h in handles:
            self.polls[h] += 1
            spec = self.specs[h]
            if self.polls[h] > self.lifetime:
                out[h] = TaskStatus("STOPPED", 0)
                continue
            out[h] = TaskStatus("RUNNING", None, "", "10.0.0.9", {cc.LOCUST_MASTER_PORT: 15557})
            # a worker asks once it staged its inputs: here, from its second poll (the master
            # became RUNNING, and `run` registered it, at the first)
            if spec.role == "worker" and h not in self.discovered and self.polls[h] >= 2:
                self.discovered[h] = discover_master(spec.environment, self.aws.sd, timeout_s=1, poll_s=0.01)
        return out

    def stop(self, handle: str, reason: str) -> None:
        self.polls[handle] = self.lifetime + 1


def _run(aws: Aws, launcher: Launcher, tmp_path: Path, poll_s: float = 0.01) -> CloudRun:
    m = load_manifest(EXAMPLE_MANIFEST)
    return CloudRun(
        m,
        aws.config(),
        launcher,
        aws.s3,
        out_dir=tmp_path,
        poll_s=poll_s,
        discovery=aws.sd,
        elbv2=aws.elbv2,
        say=lambda line: None,
    )


def test_ready_waits_for_every_measured_instance_healthy_before_the_gate(aws: Aws, tmp_path: Path) -> None:
    launcher = Launcher(aws)
    run = _run(aws, launcher, tmp_path)
    aws.healthy("g6", 4)
    aws.healthy("inf2", 1)  # the first answer through the NLB would come from this one

    def the_rest() -> None:
        for n in (2, 3, 4):
            time.sleep(0.1)
            aws.healthy("inf2", n)

    t = threading.Thread(target=the_rest)
    t.start()
    fleets = CloudFleets(run)
    gates = fleets.gate()
    t.join()
    assert set(gates) == {"inf2", "g6"} and all(g.passed for g in gates.values())
    # every gate task started once all 4 measured instances of its fleet were healthy
    assert [(s.role, healthy) for s, _, healthy in launcher.started] == [("gate", 4), ("gate", 4)]
    assert fleets.ready_after_s["inf2"] >= 0.3


def test_a_fleet_with_a_target_never_healthy_ends_the_run_naming_its_states(
    aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cc, "HEALTH_GRACE_MIN", {"aws-neuron": 0.005, "nvidia": 0.005})  # 0.3 s
    launcher = Launcher(aws)
    aws.healthy("g6", 4)
    aws.healthy("inf2", 4)
    aws.ec2.stop_instances(InstanceIds=[aws.instances["inf2"][3]])  # still compiling, say
    with pytest.raises(CloudRunError, match=r"fleet inf2: 3 of 4 healthy: 3 healthy, 1 unused \(Target.InvalidState\)"):
        CloudFleets(_run(aws, launcher, tmp_path)).gate()
    assert not any(s.role == "gate" for s, *_ in launcher.started)  # no task was paid for


def _step(run: CloudRun, fleet: str, multiplier: float) -> Path:
    from campaign.backends.fargate.fleets import FargateSteps

    plan = StepPlan(multiplier=multiplier, span_s=10.0, why="test")
    step_dir = run.run_dir / "capacity" / fleet / plan.label
    FargateSteps(run).run(fleet, plan, step_dir, 10, threading.Event())
    return step_dir


@pytest.fixture
def no_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks here write no records: what the replay collects is not under test."""
    monkeypatch.setattr(CloudRun, "_collect", lambda self, *a, **k: {})


def test_a_steps_master_and_workers_start_together_and_find_each_other(
    aws: Aws, tmp_path: Path, no_records: None
) -> None:
    aws.healthy("g6", 4)
    launcher = Launcher(aws)
    run = _run(aws, launcher, tmp_path)
    _step(run, "g6", 1.0)
    roles = [(s.role, polls) for s, polls, _ in launcher.started]
    assert roles == [("master", 0), ("worker", 0), ("worker", 0)]  # all started before the first poll
    step = f"{run.run_id}/capacity/g6/x1"
    for s, *_ in launcher.started:
        assert s.environment[cc.ENV_STEP] == step
        if s.role == "master":
            assert s.environment[cc.ENV_AUTOQUIT] == "0"  # no UI linger billed on a step
        else:  # Locust refuses --autoquit on a worker
            assert cc.ENV_AUTOQUIT not in s.environment
            assert s.environment[cc.ENV_MASTER_SERVICE] == "master-g6"
            assert s.environment[cc.ENV_DISCOVERY_NAMESPACE] == "harness.local"
    # each worker found this step's master, at the port its task exposes
    assert set(launcher.discovered.values()) == {("10.0.0.9", "15557")}
    # and the step's registrations left Cloud Map with it
    for service in (aws.masters["g6"], aws.workers["g6"]):
        assert aws.sd.list_instances(ServiceId=service)["Instances"] == []


def test_a_worker_never_takes_an_earlier_steps_master(aws: Aws) -> None:
    aws.sd.register_instance(
        ServiceId=aws.masters["inf2"],
        InstanceId="stale",
        Attributes={"AWS_INSTANCE_IPV4": "10.0.0.1", cc.STEP_ATTRIBUTE: "run/capacity/inf2/x1"},
    )
    env = {
        cc.ENV_DISCOVERY_NAMESPACE: "harness.local",
        cc.ENV_MASTER_SERVICE: "master-inf2",
        cc.ENV_STEP: "run/capacity/inf2/x2",
    }
    with pytest.raises(
        InputsRejected, match=r"no master of step run/capacity/inf2/x2 registered in master-inf2\.harness\.local"
    ):
        discover_master(env, aws.sd, timeout_s=0.05, poll_s=0.01)
    aws.sd.register_instance(
        ServiceId=aws.masters["inf2"],
        InstanceId="now",
        Attributes={
            "AWS_INSTANCE_IPV4": "10.0.0.2",
            "AWS_INSTANCE_PORT": "5557",
            cc.STEP_ATTRIBUTE: "run/capacity/inf2/x2",
        },
    )
    assert discover_master(env, aws.sd, timeout_s=1, poll_s=0.01) == ("10.0.0.2", "5557")


def test_only_the_trace_replay_lingers_for_its_web_ui(aws: Aws, tmp_path: Path, no_records: None) -> None:
    from loadgen.replay_options import ReplayOptions

    for f in ("inf2", "g6"):
        aws.healthy(f, 4)
    launcher = Launcher(aws)
    run = _run(aws, launcher, tmp_path)
    CloudFleets(run).replay(run.run_dir / "records", ReplayOptions(duration_s=10))
    masters = [s for s, *_ in launcher.started if s.role == "master"]
    assert [s.environment[cc.ENV_AUTOQUIT] for s in masters] == [str(cc.UI_LINGER_S)] * 2
    # each fleet's workers ask for their own fleet's master
    workers = [s for s, *_ in launcher.started if s.role == "worker"]
    assert {(s.fleet, s.environment[cc.ENV_MASTER_SERVICE]) for s in workers} == {
        ("inf2", "master-inf2"),
        ("g6", "master-g6"),
    }
    counted = json.loads((run.run_dir / "records" / INSTANCES_FILE).read_text())
    assert {f: c["instances"] for f, c in counted.items()} == {"inf2": 4, "g6": 4}


def test_a_step_runs_on_the_fewest_instances_healthy_while_it_ran(aws: Aws, tmp_path: Path, no_records: None) -> None:
    aws.healthy("inf2", 4)
    launcher = Launcher(aws, lifetime=6)
    dropped = aws.instances["inf2"][2]

    def one_drops_out_for_a_while(poll: int) -> None:
        if poll == 2:
            aws.ec2.stop_instances(InstanceIds=[dropped])
        if poll == 4:
            aws.ec2.start_instances(InstanceIds=[dropped])

    launcher.on_describe = one_drops_out_for_a_while
    run = _run(aws, launcher, tmp_path)
    step_dir = _step(run, "inf2", 2.0)
    counted = json.loads((step_dir / INSTANCES_FILE).read_text())["inf2"]
    assert counted["instances"] == 3 and counted["source"] == "measured"  # the fewest seen, for the log
    # every poll is kept (issue 46): the one that dropped out shows as 3 between 4s, which the
    # analysis averages over the step's load window (tests/analysis/test_step_divisor.py)
    healthy = [n for _, n in counted["polls"]]
    assert 3 in healthy and healthy[0] == 4 and healthy[-1] == 4, healthy
    assert "DescribeTargetHealth polls" in counted["detail"]
    assert aws.elbv2.describe_target_health(TargetGroupArn=aws.target_groups["inf2"])  # all 4 back
