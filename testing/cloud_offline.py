"""`make cloud-offline`: `campaign run` end to end on this machine, through the Fargate seam.

    .venv/bin/python -m testing.cloud_offline [MANIFEST] [--out DIR]

What AWS would be is stood in for, and nothing else:
- the stacks: `cdk synth` of MANIFEST (in a subprocess: jsii and gevent cannot share one); the
  load-generator task definitions' command lines and environment are what the tasks run;
- ECS RunTask: testing.offline_tasks.LocalTaskLauncher runs each task as a local process, exactly
  as its synthesized definition describes it (the Dockerfile's ENTRYPOINT + the Command);
- the fleets behind their NLBs: one emulator per fleet serving `measure_instances` instances
  behind one port (runtime/emulator's balancer), the NLB endpoint being the
  one value of the run config replaced;
- S3, CloudFormation (the deployed stack's outputs), Auto Scaling and CloudWatch: a moto server.
  Each fleet's Auto Scaling group exists there, in the stand-in stack, with the stacks' tags; its
  `GroupInServiceInstances` metric is fed every 30 s with the instances the emulator serves, so
  the report measures instances in service as it would on AWS;
- the stack's Prometheus and its AMP workspace: testing/offline_prometheus.py, the synthesized
  scrape configuration with static targets (each fleet's local server) in a real Prometheus,
  remote-writing to a second one behind the SigV4-checking proxy, whose query URL is the stand-in
  stack's PrometheusQueryUrl output (the per-step server truth is pulled through it);
- the credentials: each actor its own access key id, its role's (moto takes any; the workspace
  stand-in takes what each signs): every task its task role's logical id, the stack's Prometheus
  its task role's, the operator `operator`, and what stands in for AWS itself `stand-in`. Every
  botocore call of every process is recorded under its key (testing/iam_recorder.py), and at the
  end each is evaluated against the caller's synthesized role or the operator's published minimum
  policy (docs/operator-policy.json) by iam-simulate (testing/iam_policy.py, `enforce_roles`): a
  denied call fails the run, naming the role, the action and the resource;
- the client-lag bound (loadgen.max_schedule_lag_p99_s), relaxed to 0.5 s in a copy of the
  manifest: it states what a 1-vCPU Fargate worker holds, not this machine shared by every task.
Then `campaign.backends.fargate.campaign.run_campaign` (what `python -m campaign run` calls) runs every stage: the
gate tasks (readiness, quality), the trace replay, both capacity searches, the settle phase and
the report, written under DIR/runs/<run id>/ and uploaded to the stand-in bucket.
For `time_to_ready`, each fleet also gets an NLB and a tagged target group in the stand-in
stack, its HealthyHostCount fed as the in-service metric is, and moto's Auto Scaling lists a
launch activity per instance at the time its emulator started (testing/moto_gaps.py: what moto
does not model), so the report measures emulator start to first healthy minute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testing.iam_recorder import CALLS_DIR_ENV

if TYPE_CHECKING:
    from testing.nlb_stand_in import HealthScript, StandInNlb
    from testing.offline_prometheus import StandInWorkspace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"
# as CloudFormation names the results bucket (stack name, logical id, a suffix; lower case), which the
# operator's minimum policy (docs/operator-policy.json) matches
BUCKET = "offline-comparison-results-stand-in"
SYNTH = (
    "import json, sys\n"
    "from stacks.app_builder import build_app\n"
    "app, _ = build_app(context={'manifest': sys.argv[1], **json.loads(sys.argv[3])}, outdir=sys.argv[2])\n"
    "app.synth()\n"
)
METRIC_EVERY_S = 30.0
# The access key ids (testing/iam_recorder.py): the operator's, for `run` and what the harness reads
# as `report` would; the stand-ins' for AWS itself (no role is held to them). Each task's is its
# task role's logical id (testing.offline_tasks.task_role).
OPERATOR, STAND_IN_KEY = "operator", "stand-in"
IAM_DIR = "iam"  # under --out: calls/ (one JSONL per process) and bindings.json


@contextmanager
def moto_server(region: str, key: str = "testing", calls_dir: Path | None = None) -> Iterator[dict[str, str]]:
    """A moto server on a free loopback port, reset to an empty account, with the AWS_* variables
    that point boto3 (in this process and in child processes) at it, `key` the access key id;
    stopped on exit. `calls_dir`: every botocore call of these processes is recorded there, as
    its access key's (testing/iam_recorder.py)."""
    from moto.server import ThreadedMotoServer

    from core.ports import free_port
    from testing import iam_recorder

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": region,
        **(iam_recorder.environment(calls_dir) if calls_dir is not None else {}),
    }
    saved = {k: os.environ.get(k) for k in env}
    try:
        # Backends are process-global in moto: start from an empty account.
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"), timeout=10
        )
        os.environ.update(env)
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def synth(manifest_path: Path, outdir: Path, context: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The comparison stack's template, synthesized from the manifest in a subprocess; `context`:
    further `-c` values (deploy's compile phase: compile_fleets)."""
    with synthesizing(manifest_path, outdir, context) as template:
        return template()


@contextmanager
def synthesizing(
    manifest_path: Path, outdir: Path, context: Mapping[str, str] | None = None
) -> Iterator[Callable[[], dict[str, Any]]]:
    """`cdk synth` started in a subprocess now; the block gets a function that waits for it and
    returns the template, so that the stand-ins (the emulators, the CPU engines' minutes of
    loading) start while it runs. A synthesis still running when the block ends is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SYNTH, str(manifest_path), str(outdir), json.dumps(dict(context or {}))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def template() -> dict[str, Any]:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"cdk synth failed: {err[-3000:]}")
        done: dict[str, Any] = json.loads((outdir / "Comparison.template.json").read_text(encoding="utf-8"))
        return done

    try:
        yield template
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def group_name(m: Any, fleet: str) -> str:
    return f"{m.campaign}-{fleet}-offline"


def deploy_stand_in(
    session: Any,
    m: Any,
    template: Mapping[str, Any],
    endpoints: Mapping[str, str],
    prometheus_query_url: str | None = None,
) -> dict[str, Any]:
    """What `deploy` would leave: the results bucket, and a stack whose outputs are the synthesized
    ones (references resolved to the offline names; the fleet endpoints are the emulators) and
    whose resources include one Auto Scaling group per fleet, tagged as the stacks tag them
    (campaign, fleet) and sized to the instances measured, so that deleting the stack (teardown)
    terminates their instances as CloudFormation would. `prometheus_query_url`: the stand-in
    workspace's, as the PrometheusQueryUrl output (None: the stack has no such output)."""
    from campaign.aws.stack import campaign_deadline, stack_name, utc_now
    from core import cloud_contract as cc
    from core.naming import CAMPAIGN_DEADLINE_PARAMETER, REHEARSAL_OUTPUT
    from testing.offline_tasks import resolve

    outputs = template["Outputs"]
    refs = {outputs["ResultsBucketName"]["Value"]["Ref"]: BUCKET}
    # the pseudo parameters a task definition's environment may name (the conductor's does)
    refs.update({"AWS::StackName": stack_name(m), "AWS::Region": m.costs.region})
    # The deadline `deploy` would pass as the CampaignDeadline parameter (the run config carries it).
    hours = m.max_campaign_hours if m.max_campaign_hours is not None else 24.0
    refs[CAMPAIGN_DEADLINE_PARAMETER] = campaign_deadline(hours, now=utc_now(), deployed=None).parameter
    run_config = json.loads(resolve(outputs[cc.RUN_CONFIG_OUTPUT]["Value"], refs))
    if set(run_config["targets"]) != {f.name for f in m.fleets}:
        raise RuntimeError(f"synthesized targets {sorted(run_config['targets'])} are not the manifest's fleets")
    run_config["targets"] = dict(endpoints)
    s3 = session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_tagging(
        Bucket=BUCKET,
        Tagging={"TagSet": [{"Key": "campaign", "Value": m.campaign}, {"Key": "lifecycle", "Value": "retained"}]},
    )
    resources: dict[str, Any] = {
        "Marker": {"Type": "AWS::SQS::Queue", "Properties": {"Tags": [{"Key": "campaign", "Value": m.campaign}]}},
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.0.0.0/16"}},
        "Subnet": {
            "Type": "AWS::EC2::Subnet",
            "Properties": {
                "VpcId": {"Ref": "Vpc"},
                "CidrBlock": "10.0.1.0/24",
                "AvailabilityZone": f"{m.costs.region}a",
            },
        },
    }
    for i, f in enumerate(m.fleets):
        tags = [
            {"Key": "campaign", "Value": m.campaign, "PropagateAtLaunch": True},
            {"Key": "fleet", "Value": f.name, "PropagateAtLaunch": True},
        ]
        resources[f"Template{i}"] = {
            "Type": "AWS::EC2::LaunchTemplate",
            "Properties": {
                "LaunchTemplateName": f"lt-{group_name(m, f.name)}",
                "LaunchTemplateData": {"ImageId": "ami-12345678", "InstanceType": f.instance_type},
            },
        }
        # The fleet's NLB and target group, for time_to_ready's HealthyHostCount (the listener is
        # HTTP because moto's CloudFormation refuses TCP listeners; nothing connects through it).
        resources[f"Nlb{i}"] = {
            "Type": "AWS::ElasticLoadBalancingV2::LoadBalancer",
            "Properties": {"Type": "network", "Scheme": "internal", "Subnets": [{"Ref": "Subnet"}]},
        }
        resources[f"Targets{i}"] = {
            "Type": "AWS::ElasticLoadBalancingV2::TargetGroup",
            "Properties": {"Protocol": "TCP", "Port": 8000, "VpcId": {"Ref": "Vpc"}, "TargetType": "instance"},
        }
        resources[f"Listener{i}"] = {
            "Type": "AWS::ElasticLoadBalancingV2::Listener",
            "Properties": {
                "LoadBalancerArn": {"Ref": f"Nlb{i}"},
                "Port": 80,
                "Protocol": "HTTP",
                "DefaultActions": [{"Type": "forward", "TargetGroupArn": {"Ref": f"Targets{i}"}}],
            },
        }
        resources[f"Group{i}"] = {
            "Type": "AWS::AutoScaling::AutoScalingGroup",
            "Properties": {
                "AutoScalingGroupName": group_name(m, f.name),
                "MinSize": str(f.asg.min),
                "MaxSize": str(f.asg.max),
                "DesiredCapacity": str(f.instances_measured),
                "LaunchTemplate": {"LaunchTemplateId": {"Ref": f"Template{i}"}, "Version": "1"},
                "VPCZoneIdentifier": [{"Ref": "Subnet"}],
                "Tags": tags,
            },
        }
    # The run config names each fleet's target group as the stack's output does: a reference
    # CloudFormation resolves to the group's ARN once it exists.
    run_config["target_groups"] = {f.name: f"@@Targets{i}@@" for i, f in enumerate(m.fleets)}
    run_config.update(_discovery(session, m, template))
    stack = {
        "Resources": resources,
        "Outputs": {
            cc.RUN_CONFIG_OUTPUT: {"Value": _with_refs(json.dumps(run_config))},
            "ResultsBucketName": {"Value": BUCKET},
            **({cc.PROMETHEUS_QUERY_OUTPUT: {"Value": prometheus_query_url}} if prometheus_query_url else {}),
            # a rehearsal's stack says so, as the synthesized one does
            **(
                {REHEARSAL_OUTPUT: {"Value": outputs[REHEARSAL_OUTPUT]["Value"]}} if REHEARSAL_OUTPUT in outputs else {}
            ),
        },
    }
    cfn = session.client("cloudformation")
    cfn.create_stack(StackName=stack_name(m), TemplateBody=json.dumps(stack))
    made = {
        r["LogicalResourceId"]: r["PhysicalResourceId"]
        for r in cfn.describe_stack_resources(StackName=stack_name(m))["StackResources"]
    }
    elbv2 = session.client("elbv2")
    autoscaling = session.client("autoscaling")
    target_groups: dict[str, tuple[str, str]] = {}
    for i, f in enumerate(m.fleets):
        tg = run_config["target_groups"][f.name] = made[f"Targets{i}"]
        # The stacks' tags reach a target group and a load balancer by CloudFormation's
        # propagation, which moto skips.
        elbv2.add_tags(
            ResourceArns=[tg, made[f"Nlb{i}"]],
            Tags=[{"Key": "campaign", "Value": m.campaign}, {"Key": "fleet", "Value": f.name}],
        )
        # The fleet's deadline action, as the stacks make it (stacks/fleet.py: min, max and desired
        # 0 at the deadline), put through the API by what stands in for CloudFormation.
        autoscaling.put_scheduled_update_group_action(
            AutoScalingGroupName=group_name(m, f.name),
            ScheduledActionName=f"{f.name}-deadline",
            StartTime=refs[CAMPAIGN_DEADLINE_PARAMETER],
            MinSize=0,
            MaxSize=0,
            DesiredCapacity=0,
        )
        (group,) = elbv2.describe_target_groups(TargetGroupArns=[tg])["TargetGroups"]
        # CloudWatch's dimension values: targetgroup/<name>/<id>, and the balancer's <type>/<name>/<id>
        target_groups[f.name] = (tg.split(":")[-1], group["LoadBalancerArns"][0].split(":loadbalancer/")[-1])
    return {"refs": refs, "run_config": run_config, "target_groups": target_groups}


def _with_refs(text: str) -> Any:
    """`text` with each @@LogicalId@@ replaced by a Ref to that resource (Fn::Join)."""
    parts = re.split(r"@@(\w+)@@", text)
    return {"Fn::Join": ["", [p if i % 2 == 0 else {"Ref": p} for i, p in enumerate(parts)]]}


def _discovery(session: Any, m: Any, template: Mapping[str, Any]) -> dict[str, Any]:
    """The Cloud Map namespace and each fleet's master and workers services, as the stacks make
    them (stacks/load_generator.py), by the template's names: a step's workers find their master
    there, and the worker's role allows DiscoverInstances in that namespace only."""
    from core import cloud_contract as cc

    sd = session.client("servicediscovery")
    (name,) = [
        r["Properties"]["Name"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::ServiceDiscovery::PrivateDnsNamespace"
    ]
    sd.create_private_dns_namespace(Name=name, Vpc=f"vpc-{m.campaign}-offline")
    (ns,) = [n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == name]
    services = {
        role: {
            f.name: sd.create_service(Name=service_of(f.name), NamespaceId=ns["Id"])["Service"]["Id"] for f in m.fleets
        }
        for role, service_of in (
            ("master_services", cc.master_service_name),
            ("workers_services", cc.workers_service_name),
        )
    }
    return {"namespace": name, **services}


class StandInTargets:
    """Each fleet's NLB target group in the stand-in stack, with its Auto Scaling group's instances
    as targets. moto reports a registered instance target `healthy` unless the instance is
    stopped (`unused`), so registering an instance is it passing its health checks, and stopping
    it is it dropping out; DescribeTargetHealth then answers `campaign run` as the NLB would."""

    def __init__(self, session: Any, m: Any, target_groups: Mapping[str, str]) -> None:
        self.elbv2 = session.client("elbv2")
        self.ec2 = session.client("ec2")
        self.target_groups = dict(target_groups)  # fleet -> target group ARN
        autoscaling = session.client("autoscaling")
        self.instances: dict[str, list[str]] = {}
        for f in m.fleets:
            (g,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name(m, f.name)])[
                "AutoScalingGroups"
            ]
            self.instances[f.name] = sorted(i["InstanceId"] for i in g["Instances"])

    def register(self, fleet: str, count: int | None = None) -> None:
        """The fleet's first `count` instances (all: None) pass their health checks."""
        ids = self.instances[fleet][: len(self.instances[fleet]) if count is None else count]
        self.elbv2.register_targets(TargetGroupArn=self.target_groups[fleet], Targets=[{"Id": i} for i in ids])

    def drop(self, fleet: str, index: int) -> None:
        self.ec2.stop_instances(InstanceIds=[self.instances[fleet][index]])

    def restore(self, fleet: str, index: int) -> None:
        self.ec2.start_instances(InstanceIds=[self.instances[fleet][index]])

    def by_zone(self, fleet: str, zones: list[str]) -> list[tuple[str, bool]]:
        """(AZ, healthy) of each of the fleet's instances, the i-th in zones[i % len(zones)] as an
        ASG spreads its instances over its subnets: what the NLB's DNS answer depends on."""
        health = self.elbv2.describe_target_health(TargetGroupArn=self.target_groups[fleet])
        state = {d["Target"]["Id"]: d["TargetHealth"]["State"] for d in health["TargetHealthDescriptions"]}
        return [(zones[i % len(zones)], state.get(iid) == "healthy") for i, iid in enumerate(self.instances[fleet])]

    def healthy(self, fleet: str) -> int:
        health = self.elbv2.describe_target_health(TargetGroupArn=self.target_groups[fleet])
        return sum(d["TargetHealth"]["State"] == "healthy" for d in health["TargetHealthDescriptions"])


class InServiceFeed:
    """Puts each group's AWS/AutoScaling GroupInServiceInstances (its instances) and its target
    group's AWS/NetworkELB HealthyHostCount (the stand-in targets healthy now) every
    METRIC_EVERY_S, as Auto Scaling group metrics collection and the NLB would."""

    def __init__(
        self,
        session: Any,
        groups: Mapping[str, str],
        targets: StandInTargets,
        dimensions: Mapping[str, tuple[str, str]],
    ) -> None:
        self.cw = session.client("cloudwatch")
        self.groups, self.targets, self.dimensions = dict(groups), targets, dict(dimensions)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _put(self) -> None:
        import datetime as dt

        now = dt.datetime.now(dt.UTC)
        # (fleet, namespace, metric, dimensions, unit, value)
        series = [
            (
                f,
                "AWS/AutoScaling",
                "GroupInServiceInstances",
                {"AutoScalingGroupName": g},
                "None",
                len(self.targets.instances[f]),
            )
            for f, g in self.groups.items()
        ] + [
            (
                f,
                "AWS/NetworkELB",
                "HealthyHostCount",
                {"TargetGroup": tg, "LoadBalancer": lb},
                "Count",
                self._healthy(f),
            )
            for f, (tg, lb) in self.dimensions.items()
        ]
        for _, namespace, metric, dims, unit, value in series:
            datum = {
                "MetricName": metric,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Timestamp": now,
                "Value": float(value),
                "Unit": unit,
            }
            self.cw.put_metric_data(Namespace=namespace, MetricData=[datum])

    def _healthy(self, fleet: str) -> int:
        """Healthy targets now; 0 once the target group is gone (the last put after a teardown)."""
        from botocore.exceptions import ClientError

        try:
            return self.targets.healthy(fleet)
        except ClientError:
            return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._put()
            self._stop.wait(METRIC_EVERY_S)

    def __enter__(self) -> InServiceFeed:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._put()


LAG_BOUND_S = 0.5
ENGINE_MIN_REQUESTS = 240


def engine_run(data: dict[str, Any]) -> None:
    """What the real-engine offline run changes beside the lag bound (`offline_manifest(change=)`):
    a coarser search (a 50% bracket, 5 steps, 150 s of steps per fleet) and a 40 s settle budget,
    so both fleets' searches and settle phases fit in 10 minutes on 2 cores with the fleets measured
    one at a time. The stages and their accounting are under test, not the CPU's capacity.
    Steps of ENGINE_MIN_REQUESTS at least: the first (x2, about 7 requests/s on the tiny
    checkpoint) then spans over 6 of the stack's 5 s scrapes, the shortest window that carries
    server truth (analysis.measure.server_truth.MIN_SCRAPES); at the default 72 every step was shorter."""
    data["workload"]["capacity_search"] = {
        **data["workload"].get("capacity_search", {}),
        "min_requests": ENGINE_MIN_REQUESTS,
        "tolerance": 0.5,
        "max_steps": 5,
        "time_budget_s": 150,
        "settle_budget_s": 40,
    }


SHORT_ENGINE_MAX_STEPS = 3
SHORT_ENGINE_WINDOW_S = 38
SHORT_ENGINE_MIN_REQUESTS = 130
SHORT_ENGINE_TIME_BUDGET_S = 200
SHORT_ENGINE_OUTPUT_TOKENS = 16
SHORT_ENGINE_MIN_MULTIPLIER = 0.5


def short_engine_run(data: dict[str, Any]) -> None:
    """engine_run, shorter, for tests/cloud/test_cloud_offline_engine.py, which needs per fleet two
    search steps, one of them and the replay each with a load window (first send to last answer)
    over MIN_SCRAPES (6) of the stack's 5 s scrapes, for server truth:
    - max_steps SHORT_ENGINE_MAX_STEPS: the replay counts as a step, so two search steps (engine_run's
      5 ran four or five, each on fresh task processes);
    - a SHORT_ENGINE_WINDOW_S window (warmup 5 s): 142 requests, 125 measured, about 33 s of
      arrivals and a 5 s answer, still over the 30 s;
    - SHORT_ENGINE_MIN_REQUESTS: above the replay's 125 measured, so the replay is too short to
      count and the first search step is x1 (130 requests, about 35 s of arrivals: over 30 s);
      x0.5 after a miss there takes about 70 s of arrivals, where 240 took 122 s;
    - time_budget_s SHORT_ENGINE_TIME_BUDGET_S: room for that second step after a miss at x1 (at
      150 s and 240 requests, g6 missed at x1 on a busy machine and the budget stopped its search
      after one step); max_steps ends the search either way;
    - answers clipped to SHORT_ENGINE_OUTPUT_TOKENS (the manifest's 64): two CPU engines (one a fleet), their
      load generators and the other test processes share 2 cores, and in CI (2026-12-07) inf2's
      replay at 64 tokens queued past the 10 s TTFT target; a quarter of the decode steps keeps x1
      well under the engines' capacity on a busy machine, and every step drains sooner;
    - min_multiplier SHORT_ENGINE_MIN_MULTIPLIER: after a miss at x1 the next step is x0.5 (about
      70 s of arrivals), where the search's estimate could go to x0.125 (280 s, over the budget:
      that CI run's search stopped before its first step)."""
    engine_run(data)
    data["workload"]["window"]["duration_s"] = SHORT_ENGINE_WINDOW_S
    data["workload"]["request_class"]["max_output_tokens"] = SHORT_ENGINE_OUTPUT_TOKENS
    data["workload"]["capacity_search"].update(
        max_steps=SHORT_ENGINE_MAX_STEPS,
        min_requests=SHORT_ENGINE_MIN_REQUESTS,
        time_budget_s=SHORT_ENGINE_TIME_BUDGET_S,
        min_multiplier=SHORT_ENGINE_MIN_MULTIPLIER,
    )


SHORT_OUTPUT_TOKENS = 32


def short_run(data: dict[str, Any]) -> None:
    """`offline_manifest(change=)` for the tests of the cloud path: a 12 s window (warmup 2 s), one
    instance measured per fleet at 20% of the arrivals (13 requests), answers clipped to
    SHORT_OUTPUT_TOKENS, a short search (steps of 12 requests, two at most) and a settle phase of
    one short round at most: the stages and their S3 plumbing are under test, not the search's
    precision. The clip is what keeps the steps short: at the example's 512 tokens an emulated
    answer took up to 28 s, so each replay and step ran 30 s past its arrivals, and the replay
    (10.9 s of arrivals under 3 median lifetimes of 7.8 s) was too short to count as a step,
    so the search ran x1 again over 28 s of arrivals; at 32 a lifetime is about 2.5 s."""
    data["workload"]["window"]["duration_s"] = 12
    data["workload"]["warmup_s"] = 2
    data["workload"]["request_class"]["max_output_tokens"] = SHORT_OUTPUT_TOKENS
    for f in data["fleets"]:
        f["measure_instances"] = 1
    data["workload"]["rate_scale"] = 0.2
    data["quality"]["distribution"]["min_samples"] = 10
    data["workload"]["capacity_search"] = {
        "start_multiplier": 1.0,
        "tolerance": 0.5,
        "max_steps": 2,
        "min_requests": 12,
        "time_budget_s": 120,
        "settle_budget_s": 20,
    }


def kill_run(data: dict[str, Any]) -> None:
    """short_run for the cloud kills (tests/faults/test_cloud_kills.py), whose first kill must fall
    inside a capacity search: min_requests above the 12 requests the replay measures, so that it never
    counts as a step and every fleet's search runs one of its own (x1 after a hold; x0.5 after a
    miss, min_multiplier 0.5, where the search's estimate could step far enough down that no step
    fits the 120 s budget). With the replay counted, a search could end before its first step, and
    the kill then fell after it: the one time the kills failed (make test, 2026-12-07: the resumed
    run put no search.json, "the run finished before the upload kill") fits that, though its log
    did not say. As many steps run either way: the replay and one step per fleet (max_steps 2).
    One Locust worker a step, where the example has two: the kills are the conductor's, and each
    step's processes start afresh (as Fargate tasks do), a worker about 4.6 CPU-s of the 2 shared
    cores (2026-12-07); the rehearsal (tests/cloud/test_cloud_path.py) keeps two and checks each
    worker's records."""
    short_run(data)
    data["workload"]["capacity_search"].update(min_requests=14, min_multiplier=0.5)
    data["loadgen"]["workers"] = 1


def offline_manifest(src: Path, workdir: Path, change: Any = None) -> Path:
    """A copy of the manifest under workdir/manifests/ (its trace under workdir/data/traces/, its
    scorers beside it, so relative paths resolve as in the repository) with the client-lag bound
    set to LAG_BOUND_S: the manifest's bound is a statement about a 1-vCPU Fargate worker, and
    here six or more Locust processes, the emulators and moto share this machine's cores (at
    50 ms both searches stopped `client_limited` on 2 cores). `change(data)` edits it further."""
    import shutil

    import yaml

    data = yaml.safe_load(src.read_text(encoding="utf-8"))
    data["loadgen"]["max_schedule_lag_p99_s"] = LAG_BOUND_S
    if change is not None:
        change(data)
    trace = src.parent / data["workload"]["trace"]["path"]
    (workdir / "data" / "traces").mkdir(parents=True, exist_ok=True)
    shutil.copy(trace, workdir / "data" / "traces" / trace.name)
    data["workload"]["trace"]["path"] = f"../data/traces/{trace.name}"
    (workdir / "manifests").mkdir(exist_ok=True)
    tok = data.get("tokenizer", {}).get("path")
    if tok and not Path(tok).is_absolute():  # the checkpoint's directory (a real engine serves it) beside, as relative
        staged = (workdir / "manifests" / tok).resolve().parent
        if not staged.is_relative_to(workdir.resolve()):
            raise ValueError(f"tokenizer.path: {tok} leaves {workdir}")
        shutil.copytree((src.parent / tok).resolve().parent, staged, dirs_exist_ok=True)
    if (src.parent / "scorers").is_dir():
        shutil.copytree(src.parent / "scorers", workdir / "manifests" / "scorers", dirs_exist_ok=True)
    path = workdir / "manifests" / f"offline-{src.stem}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class OfflineAws:
    env: dict[str, str]  # AWS_* variables pointing at the moto server (set in os.environ meanwhile)
    session: Any
    template: dict[str, Any]
    refs: dict[str, str]
    run_config: dict[str, Any]
    endpoints: dict[str, str]
    targets: StandInTargets
    task_env: dict[str, str] = field(default_factory=dict)  # beside env: the NLB stand-in's answer source
    task_cpus: dict[str, set[int]] = field(default_factory=dict)  # per fleet, the cores its tasks may use
    concurrent: int | None = None  # fleets measured at once (None: all)
    health: HealthScript | None = None  # the real-engine run's target health over time
    nlb: StandInNlb | None = None  # the real-engine run's NLB stand-in (connections per node)
    prometheus: OfflinePrometheus | None = None  # the stack's Prometheus and the workspace stand-in
    stand_in: str | None = None  # what serves the fleets in place of the stack's instances (stand_in_note)


def stand_in_note(m: Any, engine: str) -> str:
    """What the report says served the fleets of an offline cloud run: the emulators or the real
    vLLM CPU engines, as `campaign local` says it of the same servers."""
    from campaign.backends.local import engine as engines

    note = engines.VLLM_CPU_NOTE if engine == "vllm-cpu" else engines.emulator_note(m)
    return f"An offline cloud run (testing/cloud_offline.py, no AWS). {note}"


@dataclass(frozen=True)
class OfflinePrometheus:
    workspace: StandInWorkspace  # the AMP stand-in behind the SigV4-checking proxy
    scraper_url: str  # the stack's Prometheus itself (what the local path would query)


@contextmanager
def offline_aws(
    manifest_path: Path,
    out: Path,
    say: Any = print,
    *,
    engine: str = "emulator",
    drop_fleet: str | None = None,
    context: Mapping[str, str] | None = None,
) -> Iterator[OfflineAws]:
    """The stand-ins for a deployed stack (see the module's docstring), up until the block ends.
    `engine`: "emulator" (every fleet's measure_instances emulated behind one port, every target
    healthy from the start) or "vllm-cpu" (a real vLLM per fleet behind the NLB stand-in,
    testing/nlb_stand_in.py; targets healthy one by one; `drop_fleet` loses one for a while during
    its first capacity step). `context`: the synthesis's further `-c` values (a rehearsal's)."""
    import boto3

    from campaign.backends.local.processes import Supervisor
    from core.manifest import load_manifest

    m = load_manifest(manifest_path)
    out.mkdir(parents=True, exist_ok=True)
    iam = out / IAM_DIR
    shutil.rmtree(iam, ignore_errors=True)  # a previous run's calls are not this one's
    (iam / "calls").mkdir(parents=True)
    with (
        moto_server(m.costs.region, OPERATOR, iam / "calls") as env,
        synthesizing(manifest_path, out / "cdk.out", context) as synthesized,
        Supervisor(out / "server-logs") as sup,
    ):
        say(f"moto server at {env['AWS_ENDPOINT_URL']}; synthesizing the stacks (cdk synth) while the fleets start ...")
        # what stands in for AWS itself (CloudFormation's resources, metrics, target health) calls
        # under its own key, which no role is held to; the operator's session is the environment's
        session = boto3.session.Session(
            region_name=m.costs.region, aws_access_key_id=STAND_IN_KEY, aws_secret_access_key="testing"
        )
        groups = {f.name: group_name(m, f.name) for f in m.fleets}
        if engine == "vllm-cpu":
            yield from _with_engines(sup, session, m, manifest_path, out, synthesized, env, groups, say, drop_fleet)
        else:
            yield from _with_emulators(sup, session, m, manifest_path, out, synthesized, env, groups, say)
    enforce_roles(out, say)


def _with_emulators(
    sup: Any,
    session: Any,
    m: Any,
    manifest_path: Path,
    out: Path,
    synthesized: Callable[[], dict[str, Any]],
    env: dict[str, str],
    groups: dict[str, str],
    say: Any,
) -> Iterator[OfflineAws]:
    """Every fleet's measure_instances emulated behind one port, every target healthy from the start."""
    import boto3

    from campaign.backends.local.fleets import start_emulator
    from testing.moto_gaps import filled_in

    launched = time.time()  # the fleets' "instances" start with their emulators
    endpoints = {f.name: start_emulator(sup, manifest_path, f.name, out, [], f.instances_measured) for f in m.fleets}
    template = synthesized()
    say(
        "fleets (emulated, behind one port each): "
        + ", ".join(f"{f.name} x{f.instances_measured} {endpoints[f.name]}" for f in m.fleets)
    )
    with (
        filled_in({g: launched for g in groups.values()}),
        stand_in_workspace(sup, m, out, env, template) as workspace,
    ):
        deployed = deploy_stand_in(session, m, template, endpoints, workspace.query_url)
        write_bindings(session, m, template, deployed, workspace, out)
        targets = StandInTargets(session, m, deployed["run_config"]["target_groups"])
        for f in m.fleets:  # every instance serves from the start: the emulators do
            targets.register(f.name)
        prometheus = start_stack_prometheus(sup, m, out, template, workspace, endpoints, targets, env)
        with InServiceFeed(session, groups, targets, deployed["target_groups"]):
            yield OfflineAws(
                env,
                boto3.session.Session(region_name=m.costs.region),  # the operator's
                template,
                deployed["refs"],
                deployed["run_config"],
                endpoints,
                targets,
                prometheus=prometheus,
                stand_in=stand_in_note(m, "emulator"),
            )


def _with_engines(
    sup: Any,
    session: Any,
    m: Any,
    manifest_path: Path,
    out: Path,
    synthesized: Callable[[], dict[str, Any]],
    env: dict[str, str],
    groups: dict[str, str],
    say: Any,
    drop_fleet: str | None,
) -> Iterator[OfflineAws]:
    """A real vLLM (CPU build) per fleet, each on its own core (campaign.backends.local.fleets.core_plan), behind
    the NLB stand-in: the tasks reach it by its DNS name through the resolver seam; their own
    cores are the others'; fleets are measured one at a time, as `campaign local` does on 2 cores."""
    import boto3

    from campaign.backends.local import engine as engines
    from campaign.backends.local.fleets import core_plan, start_engines
    from loadgen.resolver import RESOLVER_ENV
    from testing.moto_gaps import filled_in
    from testing.nlb_stand_in import HealthScript, StandInNlb

    say("starting one vLLM (CPU build) per fleet; each takes a minute or more to load")
    cores = core_plan([f.name for f in m.fleets], engines.cpu_count())
    served = start_engines(sup, m, cores)
    template = synthesized()  # synthesized while the engines loaded
    launched = time.time()  # the fleets' instances "launch" once their engines serve, then pass health checks
    zones = list(dict.fromkeys(z for f in m.fleets for z in f.availability_zones))
    holder: dict[str, StandInTargets] = {}
    # The stacks turn cross-zone on for every target group (stacks/load_balancer.py); the DNS
    # answer follows that, whatever costs.network.nlb_cross_zone prices.
    nlb = StandInNlb(
        f"{m.campaign}-nlb.offline.invalid",
        zones,
        served,
        lambda fleet: holder["targets"].by_zone(fleet, zones) if "targets" in holder else [],
        cross_zone=True,
    )
    say(
        f"engines {served} (cores {cores.engine_core}); NLB stand-in {nlb.name}: nodes {nlb.nodes}, "
        f"listeners {nlb.endpoints}"
    )
    with (
        filled_in({g: launched for g in groups.values()}),
        stand_in_workspace(sup, m, out, env, template) as workspace,
    ):
        deployed = deploy_stand_in(session, m, template, nlb.endpoints, workspace.query_url)
        write_bindings(session, m, template, deployed, workspace, out)
        targets = holder["targets"] = StandInTargets(session, m, deployed["run_config"]["target_groups"])
        # the stack's Prometheus scrapes each engine itself, as ec2_sd finds the instances, not the NLB
        prometheus = start_stack_prometheus(sup, m, out, template, workspace, served, targets, env)
        with (
            nlb,
            HealthScript(targets, [f.name for f in m.fleets], out / "runs", drop_fleet=drop_fleet) as health,
            InServiceFeed(session, groups, targets, deployed["target_groups"]),
        ):
            yield OfflineAws(
                env,
                boto3.session.Session(region_name=m.costs.region),  # the operator's
                template,
                deployed["refs"],
                deployed["run_config"],
                nlb.endpoints,
                targets,
                task_env={RESOLVER_ENV: nlb.resolver_url},
                task_cpus={name: set(c) for name, c in cores.client_cpus.items() if c},
                concurrent=cores.concurrent,
                health=health,
                nlb=nlb,
                prometheus=prometheus,
                stand_in=stand_in_note(m, "vllm-cpu"),
            )


@contextmanager
def stand_in_workspace(
    sup: Any, m: Any, out: Path, env: Mapping[str, str], template: Mapping[str, Any]
) -> Iterator[StandInWorkspace]:
    """The AMP workspace stand-in (testing.offline_prometheus), taking what is signed for the
    manifest's region with the operator's stand-in credentials (moto's, in `env`) or a task's (its
    role's key, the same secret), the remote writes signed by the Prometheus task's. Who called
    it, for what, is recorded as the botocore calls are (aps RemoteWrite and QueryMetrics)."""
    from testing import offline_prometheus
    from testing.sigv4_proxy import AMP_REMOTE_WRITE, StandInCredentials

    creds = StandInCredentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    roles = frozenset(k for k, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role")
    writer = StandInCredentials(prometheus_role(template), env["AWS_SECRET_ACCESS_KEY"])
    with offline_prometheus.stand_in_workspace(
        sup, out / "prometheus", m.costs.region, creds, keys=roles, writer=writer
    ) as workspace:
        yield workspace
        if CALLS_DIR_ENV in env:
            lines = [
                {
                    "actor": key,
                    "service": "aps",
                    "operation": "RemoteWrite" if path == AMP_REMOTE_WRITE else "QueryMetrics",
                    "params": {"path": path},
                }
                for key, path in workspace.proxy.signers
            ]
            calls = Path(env[CALLS_DIR_ENV]) / "calls-aps.jsonl"
            calls.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def prometheus_role(template: Mapping[str, Any]) -> str:
    """The logical id of the task role of the stack's Prometheus (its container is `prometheus`)."""
    from testing.offline_tasks import task_role

    (definition,) = [
        k
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::ECS::TaskDefinition"
        and any(c["Name"] == "prometheus" for c in r["Properties"]["ContainerDefinitions"])
    ]
    return task_role(template, definition)


def write_bindings(
    session: Any,
    m: Any,
    template: Mapping[str, Any],
    deployed: Mapping[str, Any],
    workspace: StandInWorkspace,
    out: Path,
) -> None:
    """What the template's references are in the stand-in account (testing.iam_policy.Bindings), to
    `out`/iam/bindings.json, for the roles' policies to be evaluated against the recorded calls."""
    from campaign.aws.stack import stack_name
    from testing.iam_policy import Bindings

    account = session.client("sts").get_caller_identity()["Account"]
    region = m.costs.region
    cfn = session.client("cloudformation")
    (stack,) = cfn.describe_stacks(StackName=stack_name(m))["Stacks"]
    sd = session.client("servicediscovery")
    run_config = deployed["run_config"]
    (ns,) = [n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == run_config["namespace"]]
    zone = sd.get_namespace(Id=ns["Id"])["Namespace"]["Properties"]["DnsProperties"]["HostedZoneId"]
    services = {s["Name"]: s["Arn"] for s in sd.list_services()["Services"]}
    bindings = Bindings(
        account=account,
        region=region,
        stack_name=stack["StackName"],
        stack_id=stack["StackId"],
        bucket=BUCKET,
        cluster=run_config["cluster"],
        namespace=ns["Name"],
        namespace_arn=ns["Arn"],
        hosted_zone=zone.split("/")[-1],  # moto answers "/hostedzone/<id>", Cloud Map the id alone
        services=services,
        workspace_arn=f"arn:aws:aps:{region}:{account}:workspace/{workspace.proxy.workspace}",
    )
    (out / IAM_DIR / "bindings.json").write_text(json.dumps(bindings.__dict__, indent=1), encoding="utf-8")


def role_denials(out: Path, without: tuple[str, str] | None = None) -> tuple[list[Any], int]:
    """The run's recorded calls (`out`/iam) evaluated against their callers' policies, as
    `enforce_roles` does; `without` (actor, action): that actor's statement allowing the action
    removed first (testing.iam_policy.offline_denials)."""
    from testing.iam_policy import offline_denials

    template = json.loads((out / "cdk.out" / "Comparison.template.json").read_text(encoding="utf-8"))
    return offline_denials(out / IAM_DIR, template, operator=OPERATOR, ignored={STAND_IN_KEY}, without=without)


def denied_without(out: Path, actor: str, action: str) -> list[str]:
    """What the run's enforcement (`role_denials`) says once `actor`'s statement allowing `action`
    is removed: each denial, named. A test of each statement's need, over the run's own calls."""
    denied, _ = role_denials(out, (actor, action))
    return [str(d) for d in denied]


def enforce_roles(out: Path, say: Any = print) -> None:
    """Each call the run recorded (`out`/iam) evaluated against its actor's role from the template
    (the tasks', by their access keys) or the operator's published minimum policy
    (testing.iam_policy.OPERATOR_POLICY); any denial fails the run, naming actor, action and
    resource (testing.iam_policy.offline_denials)."""
    from testing.iam_policy import recorded_calls

    if not any(c.actor == OPERATOR for c in recorded_calls(out / IAM_DIR / "calls")):
        raise RuntimeError(f"IAM: no call of the operator's recorded in {out / IAM_DIR}: the recorder did not run")
    denied, checked = role_denials(out)
    if denied:
        raise RuntimeError(
            f"IAM: {len(denied)} of the run's calls are denied by the caller's role:\n"
            + "\n".join(f"  {d}" for d in denied)
        )
    say(
        f"IAM: the run's {checked} distinct authorizations are each allowed by the caller's role (testing/iam_policy.py)"
    )


def start_stack_prometheus(
    sup: Any,
    m: Any,
    out: Path,
    template: Mapping[str, Any],
    workspace: StandInWorkspace,
    servers: Mapping[str, str],
    targets: StandInTargets,
    env: Mapping[str, str],
) -> OfflinePrometheus:
    """The stack's Prometheus (the synthesized configuration, testing.offline_prometheus) scraping
    each fleet's local server (`servers`: fleet -> its base URL), which stands for every instance of
    the fleet's group: ec2_sd's labels name them all."""
    from urllib.parse import urlsplit

    from testing import offline_prometheus
    from testing.sigv4_proxy import StandInCredentials

    scraped = {
        f.name: offline_prometheus.ServingTarget(
            f.name,
            urlsplit(servers[f.name]).netloc,
            "+".join(targets.instances[f.name]),
            f.instance_type,
            f.availability_zones[0],
        )
        for f in m.fleets
    }
    creds = StandInCredentials(prometheus_role(template), env["AWS_SECRET_ACCESS_KEY"])  # its task role's
    url = offline_prometheus.start_scraper(sup, out / "prometheus", template, workspace, scraped, creds)
    return OfflinePrometheus(workspace, url)


# report.json's fields that two builds of one report from the same files differ in by nature, not by
# a figure; testing.json_diff.report_differences compares every other one. Paths need no entry where the report is
# rebuilt in a copy of the run directory (its run-relative paths are the run's), and the URLs are
# the run's own (the Prometheus URL is kept with its answers, analysis.sources.pulled).
VOLATILE = frozenset({"generated_at"})  # when the report was built


def run_once(aws: OfflineAws, manifest_path: Path, out: Path, name: str, **kwargs: Any) -> Any:
    """One `campaign run` (campaign.backends.fargate.campaign.run_campaign) with local task processes; returns its
    CloudRunResult and the launcher (its task logs)."""
    from campaign.backends.fargate.campaign import run_campaign
    from core.manifest import load_manifest
    from testing.offline_tasks import LocalTaskLauncher

    launcher = LocalTaskLauncher(
        aws.template,
        aws.refs,
        out / f"tasks-{name}",
        {**aws.env, **aws.task_env},
        cpus=aws.task_cpus,
        stand_in=aws.stand_in,
    )
    try:
        result = run_campaign(
            aws.session,
            load_manifest(manifest_path),
            out / "runs",
            launcher=launcher,
            **{"poll_s": 1.0, "concurrent": aws.concurrent, "stand_in": aws.stand_in, **kwargs},
        )
    finally:
        launcher.close()
    return result, launcher


# Where an AWS call of the run lands in the rehearsal report when its caller's role denies it: the
# seam whose observation needed it (offline, a denial is found after the run by iam-simulate;
# on AWS the call itself fails with AccessDenied where it is made).
DENIED_SEAMS = {
    "s3": "records",
    "servicediscovery": "tasks",
    "route53": "tasks",
    "aps": "amp",
    "ecs": "conductor",
    "iam": "conductor",
    "cloudformation": "stack",
    "autoscaling": "deadline action",
    "elasticloadbalancing": "instances",
    "tag": "tags",
    "ce": "cost allocation",
    "servicequotas": "quotas",
    "ecr": "images",
}


def denials_seam(report: Any, out: Path, without: tuple[str, str] | None = None) -> None:
    """The run's calls (`out`/iam) evaluated against their callers' roles (role_denials; `without`:
    one statement removed first): the first denial fails the seam its service serves, with the
    AccessDenied AWS would have answered."""
    from campaign.aws.rehearsal_report import failed

    denied, _ = role_denials(out, without)
    if not denied:
        return
    first = denied[0]
    service = str(first).split(" may not ", 1)[1].split(":", 1)[0]
    seam = DENIED_SEAMS.get(service, "conductor")
    report.add(
        failed(
            seam,
            f"{len(denied)} call(s) of the run denied by the caller's role (iam-simulate over the recorded calls)",
            f"AccessDenied: {first}",
            "add the action to that role (stacks/) or to docs/operator-policy.json",
        )
    )


@dataclass
class OfflineRehearsal:
    """The stand-ins of a rehearsal's deployed stack (rehearsal_stand_ins)."""

    aws: OfflineAws
    m: Any  # the rehearsal's manifest (campaign.stages.rehearsal), written beside the campaign's
    campaign_digest: str
    held: dict[str, str]  # what the loopback registry holds (testing.registry_stand_in); a test may remove one
    mirrors: dict[str, str]  # Docker Hub's and ECR Public's host -> the loopback registry's

    def preflight(self) -> list[Any]:
        """What `deploy --rehearsal` and `run --rehearsal` check first: the images, the quotas."""
        from campaign.aws.rehearsal_seams import quotas_seam
        from campaign.pin.image_check import check_images, image_references, images_seam

        images = check_images(image_references(self.m), ecr=self.aws.session.client("ecr"), mirrors=self.mirrors)
        return [images_seam(images), quotas_seam(self.aws.session, self.m)]


@contextmanager
def rehearsal_stand_ins(manifest_path: Path, out: Path, say: Any = print) -> Iterator[OfflineRehearsal]:
    """`deploy --rehearsal` offline: the rehearsal's manifest written beside `manifest_path` and
    synthesized with `-c rehearsal=1` into the stand-ins (offline_aws), a loopback registry holding
    every image it names, moto's missing quotas and cost-allocation tags filled in
    (testing.moto_gaps.account_filled_in)."""
    from campaign.pin.image_check import image_references
    from campaign.stages.rehearsal import write_rehearsal_manifest
    from core.images import DOCKER_HUB_UPSTREAM_URL, ECR_PUBLIC_HOST
    from core.manifest import load_manifest
    from core.naming import REHEARSAL_CONTEXT
    from testing.moto_gaps import account_filled_in
    from testing.registry_stand_in import held_manifests, registry_stand_in

    campaign_m = load_manifest(manifest_path)
    m = load_manifest(write_rehearsal_manifest(manifest_path))
    held = held_manifests(image_references(m))
    with (
        account_filled_in(),
        registry_stand_in(held) as registry,
        offline_aws(m.source_file(), out, say, context={REHEARSAL_CONTEXT: "1"}) as aws,
    ):
        yield OfflineRehearsal(
            aws, m, campaign_m.digest, held, {DOCKER_HUB_UPSTREAM_URL: registry, ECR_PUBLIC_HOST: registry}
        )


def rehearse_in(
    stand_ins: OfflineRehearsal, out: Path, say: Any = print, *, without: tuple[str, str] | None = None
) -> Any:
    """`run --rehearsal` in the stand-ins: the pre-flight seams, then the rehearsal
    (campaign.backends.fargate.rehearsal) with the conductor a local process, and the recorded calls
    evaluated against their roles (`without`: one statement removed, denials_seam). The RehearsalReport."""
    from campaign.aws.run_config import read_run_config
    from campaign.aws.stack import stack_name
    from campaign.backends.fargate.rehearsal import rehearse
    from testing.offline_tasks import LocalTaskLauncher

    aws, m = stand_ins.aws, stand_ins.m
    cfg = read_run_config(aws.session.client("cloudformation"), stack_name(m))
    launcher = LocalTaskLauncher(
        aws.template,
        aws.refs,
        out / "tasks",
        {**aws.env, **aws.task_env},
        cpus=aws.task_cpus,
        concurrent=aws.concurrent,
        stand_in=aws.stand_in,
    )
    try:
        return rehearse(
            aws.session,
            m,
            stand_ins.campaign_digest,
            cfg,
            launcher,
            out / "runs",
            checked=stand_ins.preflight(),
            poll_s=1.0,
            say=say,
            observe=lambda report, _: denials_seam(report, out, without),
        )
    finally:
        launcher.close()


def rehearse_offline(manifest_path: Path, out: Path, say: Any = print) -> Any:
    """`make cloud-offline-rehearsal`: deploy --rehearsal, run --rehearsal and teardown offline; the
    RehearsalReport, teardown's line included (also in runs/<run id>/rehearsal.json)."""
    with rehearsal_stand_ins(manifest_path, out, say) as stand_ins:
        report = rehearse_in(stand_ins, out, say)
        report.add(teardown_seam(stand_ins.m.source_file(), out / "teardown", say))
        say(report.seams[-1].line())
        (out / "runs" / (report.run_id or "no-run") / "rehearsal.json").write_text(report.to_json(), encoding="utf-8")
        return report


def teardown_seam(manifest_path: Path, out: Path, say: Any) -> Any:
    """`teardown MANIFEST` as the operator types it (its parser, its handler), the results bucket
    under the stack's TLS-only policy first (stacks/results.py), as CloudFormation leaves it: the
    rehearsal report's teardown line. (moto's plain HTTP is then refused the bucket, so teardown's
    own update of the record says it could not, and this line is the local report's.)"""
    import contextlib
    import io

    import boto3

    from campaign.aws.rehearsal_report import TEARDOWN, Seam, failed
    from campaign.cli.main import build_parser
    from core.manifest import load_manifest

    m = load_manifest(manifest_path)
    stand_in = boto3.session.Session(
        region_name=m.costs.region, aws_access_key_id=STAND_IN_KEY, aws_secret_access_key="testing"
    )
    deny_plain = {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    s3 = stand_in.client("s3")
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({"Version": "2012-10-17", "Statement": [deny_plain]}))
    args = build_parser().parse_args(["teardown", str(manifest_path), "--out", str(out)])
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = args.handler(args)
    finally:
        s3.delete_bucket_policy(Bucket=BUCKET)
    text = printed.getvalue()
    (out).mkdir(parents=True, exist_ok=True)
    (out / "teardown.log").write_text(text, encoding="utf-8")
    if code != 0:
        left = [line.strip() for line in text.splitlines() if "LEFT RUNNING" in line]
        return failed(TEARDOWN, f"teardown exited {code}", left[0] if left else text[-500:], "delete what is left")
    return Seam(TEARDOWN, True, f"the stack deleted; nothing tagged campaign={m.campaign} left running")


def main(argv: list[str] | None = None) -> int:
    from core.manifest import load_manifest

    ap = argparse.ArgumentParser(
        prog="python -m testing.cloud_offline", description=__doc__.split("\n\n", 1)[0] if __doc__ else None
    )
    ap.add_argument("manifest", nargs="?", default=str(EXAMPLE), help="campaign manifest (default: the example)")
    ap.add_argument("--out", default="runs/cloud-offline", help="where the run directory, task logs and cdk.out go")
    ap.add_argument(
        "--engine",
        choices=("emulator", "vllm-cpu"),
        default="emulator",
        help="what serves each fleet: the emulator, or a real vLLM (CPU build, `make engine`) behind the NLB stand-in",
    )
    ap.add_argument(
        "--rehearsal",
        action="store_true",
        help="`deploy --rehearsal` and `run --rehearsal` (the emulators stand in for the rehearsal's fleets): "
        "prints the rehearsal report; exit 0 when every seam passed",
    )
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    out = Path(a.out)
    path = offline_manifest(Path(a.manifest).resolve(), out, engine_run if a.engine == "vllm-cpu" else None)
    print(f"manifest copied to {path} with loadgen.max_schedule_lag_p99_s {LAG_BOUND_S} (see offline_manifest)")
    if a.rehearsal:
        report = rehearse_offline(path, out)
        print(f"rehearsal {report.run_id}: {time.monotonic() - t0:.0f} s; exit {report.exit_code}")
        return int(report.exit_code)
    first = load_manifest(path, check_files=False).fleets[0].name
    drop = first if a.engine == "vllm-cpu" else None  # one target drops out during its first step
    with offline_aws(path, out, engine=a.engine, drop_fleet=drop) as aws:
        result, _ = run_once(aws, path, out, "run")
    rep = result.report
    print(f"run {result.run_id}: {time.monotonic() - t0:.0f} s; report {result.run_dir / 'report.json'}")
    if rep is not None:
        for name, f in rep.fleets.items():
            search = f.capacity.search if f.capacity is not None else None
            steps = (
                f"{len(search.steps)} search steps, stopped: {search.stop_rule}" if search is not None else "no search"
            )
            source = rep.provenance.get(f"instances_measured.{name}")
            print(
                f"  {name}: {steps}; instances measured {f.instances_measured} ({source.source if source else 'unknown'}); "
                f"time to ready {'n/a' if not rep.time_to_ready or name not in rep.time_to_ready else rep.time_to_ready[name].seconds}"
            )
        print(f"decision: {rep.decision.state.upper()} — " + "; ".join(rep.decision.reasons))
    return int(result.exit_code)


if __name__ == "__main__":
    sys.exit(main())
