"""deploy's compile phase (campaign/aws/compile_phase.py) against a moto server on loopback.

S3, CloudFormation, Auto Scaling, EC2 and CloudWatch Logs are moto's; `cdk deploy` is a stand-in
that builds what the stacks would (the results bucket and the compile phase's output and group),
and the compile instance's work (publish the set, marker last, then terminate itself with the
group's desired capacity decremented) is done by the test between two polls.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from campaign.aws import compile_phase
from campaign.aws import stack as aws
from campaign.aws.compile_phase import CompilePhaseFailed, CompileRefused
from core.errors import EXIT_BAD_INPUT, EXIT_FAILED_STEP
from core.manifest import Manifest, load_manifest, manifest_from_data
from core.naming import stack_name
from core.serving import definition_for
from tests.campaign.test_cloud_checks import HUB_CREDENTIAL_ARN, _filled
from tests.conftest import EXAMPLE_MANIFEST, moto_server, write_manifest

REGION = "us-east-1"
BUCKET = "results-bucket"
GROUP = "compile-inf2-group"
LOG_GROUP = "fleet-inf2-logs"
AMI = "ami-12c6146b"  # one of moto's stock images


@pytest.fixture
def session() -> Iterator[Any]:
    with moto_server(REGION):
        yield boto3.session.Session(region_name=REGION)


@pytest.fixture(scope="module")
def example() -> Manifest:
    return load_manifest(EXAMPLE_MANIFEST, check_files=False)


def _key(m: Manifest) -> str:
    compiled = definition_for(m, m.fleet("inf2")).compiled
    assert compiled is not None
    return compiled.key


def _stack(session: Any, m: Manifest, *, compile_phase_output: bool) -> None:
    """What the stacks build, as far as deploy reads it: the results bucket, and in the compile
    phase its output and the compile instance's empty group (stacks/compile_instance.py)."""
    outputs: dict[str, Any] = {"ResultsBucketName": {"Value": {"Ref": "Results"}}}
    if compile_phase_output:
        ec2 = session.client("ec2")
        autoscaling = session.client("autoscaling")
        if not autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]:
            lt = ec2.create_launch_template(
                LaunchTemplateName="compile-inf2", LaunchTemplateData={"ImageId": AMI, "InstanceType": "inf2.8xlarge"}
            )["LaunchTemplate"]["LaunchTemplateId"]
            autoscaling.create_auto_scaling_group(
                AutoScalingGroupName=GROUP,
                LaunchTemplate={"LaunchTemplateId": lt},
                MinSize=0,
                MaxSize=1,
                AvailabilityZones=[f"{REGION}a"],
            )
        # The fleet's own group at 0 (its max the manifest's) behind its target group, as the compile
        # phase's template holds it (stacks/comparison_stack.py), for the one-instance check.
        target_group = _fleet_group(session, m)
        phase = {
            "inf2": {
                "group": GROUP,
                "instance_type": "inf2.8xlarge",
                "log_group": LOG_GROUP,
                "fleet_group": FLEET_GROUP,
                "target_group": target_group,
            }
        }
        outputs["CompilePhase"] = {"Value": json.dumps(phase)}
    template = {
        "Resources": {"Results": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": BUCKET}}},
        "Outputs": outputs,
    }
    cfn = session.client("cloudformation")
    name = stack_name(m.campaign)
    try:
        cfn.update_stack(StackName=name, TemplateBody=json.dumps(template))
    except cfn.exceptions.ClientError:
        cfn.create_stack(StackName=name, TemplateBody=json.dumps(template))


FLEET_GROUP = "fleet-inf2-group"


def _fleet_group(session: Any, m: Manifest) -> str:
    """The inf2 fleet's group (created once) and its target group's ARN."""
    elbv2, autoscaling = session.client("elbv2"), session.client("autoscaling")
    found = elbv2.describe_target_groups().get("TargetGroups", [])
    if found:
        return str(found[0]["TargetGroupArn"])
    ec2 = session.client("ec2")
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    tg = elbv2.create_target_group(Name="inf2", Protocol="TCP", Port=8000, VpcId=vpc, TargetType="instance")[
        "TargetGroups"
    ][0]["TargetGroupArn"]
    lt = ec2.create_launch_template(
        LaunchTemplateName="fleet-inf2", LaunchTemplateData={"ImageId": AMI, "InstanceType": "inf2.xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=FLEET_GROUP,
        LaunchTemplate={"LaunchTemplateId": lt},
        MinSize=0,
        MaxSize=m.fleet("inf2").asg.max,
        DesiredCapacity=0,
        AvailabilityZones=[f"{REGION}a"],
        TargetGroupARNs=[tg],
    )
    return str(tg)


def _publish(session: Any, m: Manifest, publisher: str = "ip-10-0-1-7-1767225600", *, marker: bool = True) -> None:
    s3 = session.client("s3")
    prefix = f"compiled/{_key(m)}/{publisher}"
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/model.pt", Body=b"neff")
    if marker:
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/COMPLETE", Body=_key(m).encode())


def _the_instance(session: Any) -> str:
    (group,) = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])[
        "AutoScalingGroups"
    ]
    (instance,) = group["Instances"]
    return str(instance["InstanceId"])


def _terminate_itself(session: Any) -> None:
    """The compile script's EXIT trap: terminate, the group's desired capacity decremented."""
    session.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=_the_instance(session), ShouldDecrementDesiredCapacity=True
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(session: Any, m: Manifest, on_sleep: Callable[[int], None]) -> list[str]:
    said: list[str] = []
    clock = _Clock()
    sleeps = 0

    def sleep(s: float) -> None:
        nonlocal sleeps
        sleeps += 1
        clock.now += s
        on_sleep(sleeps)

    targets = compile_phase.compile_targets(m)
    compile_phase.run(session, m, stack_name(m.campaign), targets, say=said.append, clock=clock, sleep=sleep)
    return said


def test_without_a_stack_the_at_risk_fleet_needs_the_compile_phase(session: Any, example: Manifest) -> None:
    (t,) = compile_phase.needed(session, example, stack_name(example.campaign), say=print)
    assert (t.fleet, t.host.instance_type, t.key, t.timeout_min) == ("inf2", "inf2.8xlarge", _key(example), 85)


def test_a_published_set_skips_the_compile_phase_and_a_half_one_does_not(session: Any, example: Manifest) -> None:
    _stack(session, example, compile_phase_output=False)
    said: list[str] = []
    _publish(session, example, "uploading", marker=False)  # no marker yet: not a set
    assert [t.fleet for t in compile_phase.needed(session, example, stack_name(example.campaign), say=said.append)] == [
        "inf2"
    ]
    _publish(session, example)
    assert compile_phase.needed(session, example, stack_name(example.campaign), say=said.append) == []
    assert said == [
        f"inf2: its compiled set is already published at s3://{BUCKET}/compiled/{_key(example)}/ip-10-0-1-7-1767225600/: "
        "no compile phase for it"
    ]


def test_a_disabled_compile_phase_refuses_with_the_numbers(session: Any, example: Manifest) -> None:
    with pytest.raises(CompileRefused) as err:
        compile_phase.needed(session, example, stack_name(example.campaign), enabled=False)
    assert err.value.exit_code == EXIT_BAD_INPUT
    text = str(err.value)
    assert "nothing was deployed" in text
    assert "inf2: weights 15.0 GiB are 93% of inf2.xlarge's 16 GiB host memory, and --no-compile-phase forbids" in text
    assert "on a inf2.8xlarge (128 GiB host) first" in text
    assert "drop --no-compile-phase (the stack and its results bucket do not exist yet)" in text
    _stack(session, example, compile_phase_output=False)
    _publish(session, example)
    assert (
        compile_phase.needed(session, example, stack_name(example.campaign), enabled=False) == []
    )  # nothing to compile


def test_a_model_no_host_can_compile_is_refused_unless_its_set_is_published(
    session: Any, manifest_data: dict[str, Any]
) -> None:
    manifest_data["model"]["params_b"] = 300.0  # 559 GiB: above half of inf2.48xlarge's 768 GiB
    m = manifest_from_data(manifest_data)
    with pytest.raises(CompileRefused) as err:
        compile_phase.needed(session, m, stack_name(m.campaign))
    assert "inf2: weights 558.8 GiB are 3492% of inf2.xlarge's 16 GiB host memory" in str(err.value)
    assert "no Inferentia2 instance in core/catalog.py with TP 2 has host memory above 1117.6 GiB" in str(err.value)
    assert "give the fleet an instance_type whose host memory clears it" in str(err.value)
    _stack(session, m, compile_phase_output=False)  # a stack (and its bucket) exists: a staged set is the way out
    with pytest.raises(CompileRefused, match=f"published under s3://{BUCKET}/compiled/<the fleet's key"):
        compile_phase.needed(session, m, stack_name(m.campaign))
    _publish(session, m)  # compiled elsewhere and staged by the operator
    assert compile_phase.needed(session, m, stack_name(m.campaign)) == []


def test_the_phase_starts_the_compile_group_and_waits_for_the_set(session: Any, example: Manifest) -> None:
    _stack(session, example, compile_phase_output=True)

    def compile_instance(n: int) -> None:
        if n == 2:  # two polls in: the set is published (marker last), then the instance goes
            _publish(session, example)
            _terminate_itself(session)

    said = _run(session, example, compile_instance)
    assert said[0] == f"inf2: compile instance requested (inf2.8xlarge, group {GROUP})"
    progress = [s for s in said if s.startswith("inf2: compiling on inf2.8xlarge")]
    assert len(progress) == 2 and "0 of at most 85 min" in progress[0] and "1 of at most 85 min" in progress[1]
    assert f"boot log: CloudWatch Logs group {LOG_GROUP}, stream i-" in progress[0]
    assert said[-1].startswith(f"inf2: compiled set published at s3://{BUCKET}/compiled/{_key(example)}/")
    group = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 0  # the instance took its group back to 0


def test_a_compile_instance_that_ends_without_a_set_fails_deploy_naming_its_log(
    session: Any, example: Manifest
) -> None:
    _stack(session, example, compile_phase_output=True)
    logs = session.client("logs")
    logs.create_log_group(logGroupName=LOG_GROUP)

    def crashed(n: int) -> None:
        instance = _the_instance(session)
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{instance}/boot")
        lines = ["server not healthy 4500 s into the boot", "compile host: exit status 1; this instance terminates"]
        logs.put_log_events(
            logGroupName=LOG_GROUP,
            logStreamName=f"{instance}/boot",
            logEvents=[{"timestamp": int(time.time() * 1000) + i, "message": line} for i, line in enumerate(lines)],
        )
        _terminate_itself(session)

    with pytest.raises(CompilePhaseFailed) as err:
        _run(session, example, crashed)
    text = str(err.value)
    assert err.value.exit_code == EXIT_FAILED_STEP
    assert (
        f"inf2: the compile instance ended without publishing a set under s3://{BUCKET}/compiled/{_key(example)}/"
        in text
    )
    assert f"boot log: CloudWatch Logs group {LOG_GROUP}, stream i-" in text and "--log-stream-names i-" in text
    assert "    | server not healthy 4500 s into the boot" in text  # its last lines
    assert f"ASG {GROUP} latest activities:" in text and "describe-scaling-activities" in text
    assert "every fleet is still at 0" in text


def test_a_compile_past_the_plans_minutes_stops_its_group_and_fails(session: Any, example: Manifest) -> None:
    _stack(session, example, compile_phase_output=True)
    with pytest.raises(CompilePhaseFailed) as err:
        _run(session, example, lambda n: None)  # it never publishes; a poll a minute
    assert "no set published under" in str(err.value) and "after 85 min, the plan's at most 85" in str(err.value)
    group = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 0  # stopped: nothing billed after deploy gave up


def test_a_second_run_restarts_an_empty_group(session: Any, example: Manifest) -> None:
    # An earlier attempt ended (its instance took the group to 0): the same template redeploys
    # unchanged, so deploy itself starts the new attempt.
    _stack(session, example, compile_phase_output=True)

    def compile_instance(n: int) -> None:
        _publish(session, example)
        _terminate_itself(session)

    said = _run(session, example, compile_instance)
    assert said[0].startswith("inf2: compile instance requested")


# --- cmd_deploy: the two `cdk deploy`s around the phase ---------------------------------------------


def _with_tokenizer_files(directory: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The filled example's pinned tokenizer files, written beside the manifest with their hashes."""
    files = {"tokenizer.json": "{}", "tokenizer_config.json": json.dumps({"chat_template": "{{ messages }}"})}
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    data["tokenizer"]["files"] = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in files.items()}
    return data


def _deploy(tmp_path: Path, manifest_data: dict[str, Any], session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`deploy` with `cdk deploy` replaced by a stand-in that builds the stack deploy reads; the
    stand-in's compile instance publishes and terminates on the first poll."""
    from campaign.cli import aws_cmds as aws_cli

    path = write_manifest(tmp_path, _with_tokenizer_files(tmp_path, _filled(manifest_data)))
    m = load_manifest(path)
    deploys: list[dict[str, Any]] = []
    quota_checks: list[Any] = []

    def cdk_deploy(manifest_path: Path, **kw: Any) -> int:
        deploys.append(kw)
        _stack(session, m, compile_phase_output="compile_fleets=inf2" in kw["extra"])
        if kw.get("check_quota", True):
            quota_checks.append(kw.get("compiling"))
        return 0

    def compile_instance(n: int) -> None:
        _publish(session, m)
        _terminate_itself(session)

    monkeypatch.setattr(aws_cli, "aws_session", lambda region: session)
    monkeypatch.setattr(aws, "deploy", cdk_deploy)
    real_run = compile_phase.run
    monkeypatch.setattr(
        compile_phase, "run", lambda *a, **k: real_run(*a, **k, sleep=lambda s: compile_instance(0), poll_s=0)
    )
    real_check = compile_phase.prove_on_fleet_type  # moto's target is healthy once its instance runs
    monkeypatch.setattr(compile_phase, "prove_on_fleet_type", lambda *a, **k: real_check(*a, **k, poll_s=0))
    args = argparse.Namespace(
        manifest=str(path),
        yes=True,
        ami=[f"inf2={AMI}", f"g6={AMI}"],
        weights_s3_uri=None,
        no_compile_phase=False,
        docker_hub_credential_arn=HUB_CREDENTIAL_ARN,
        extend_hours=None,
    )
    assert aws_cli.cmd_deploy(args) == 0
    return deploys, quota_checks


def test_deploy_compiles_first_then_sizes_the_fleets_and_a_second_deploy_skips_it(
    session: Any,
    manifest_data: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    deploys, quota_checks = _deploy(tmp_path, manifest_data, session, monkeypatch)
    first, second = deploys
    assert first["extra"][-2:] == ["-c", "compile_fleets=inf2"]  # every fleet at 0, the compile group
    assert not any("compile_fleets" in a for a in second["extra"])  # the fleets at size, the compile group gone
    assert [a for a in first["extra"] if a != "-c" and "compile_fleets" not in a] == second["extra"]  # same AMIs
    ((host,),) = quota_checks  # checked once, before the first, with the compile instance counted
    assert host.instance_type == "inf2.8xlarge"
    out = capsys.readouterr().out
    assert "compile phase: inf2 on one inf2.8xlarge (every fleet at 0 meanwhile)" in out
    # Issue 50, item 2: one instance of the fleet's own type serves the set before the group is sized.
    assert "inf2: one inf2.xlarge serves the set after" in out
    assert (
        out.index("compile phase:")
        < out.index("inf2: compiled set published at")
        < out.index("inf2: one inf2.xlarge requested in its own group")
        < out.index("inf2: one inf2.xlarge serves the set after")
        < out.index("deploying llama3-8b-inf2-vs-g6-comparison (manifest")
    )
    # The set is published now: a second deploy is one plain `cdk deploy`, and says why.
    deploys, quota_checks = _deploy(tmp_path, manifest_data, session, monkeypatch)
    (only,) = deploys
    assert not any("compile_fleets" in a for a in only["extra"]) and quota_checks == [[]]
    assert "inf2: its compiled set is already published at s3://" in capsys.readouterr().out


# --- issue 50, item 2: one instance on the fleet's own type before its group is sized -------------


def _check(session: Any, m: Manifest, on_sleep: Callable[[int], None]) -> tuple[list[str], _Clock]:
    said: list[str] = []
    clock = _Clock()
    sleeps = 0

    def sleep(s: float) -> None:
        nonlocal sleeps
        sleeps += 1
        clock.now += s
        on_sleep(sleeps)

    targets = compile_phase.compile_targets(m)
    compile_phase.prove_on_fleet_type(
        session, m, stack_name(m.campaign), targets, say=said.append, clock=clock, sleep=sleep, poll_s=60
    )
    return said, clock


def _check_stopped(session: Any, m: Manifest, stop: Callable[[int], None]) -> None:
    """The check with every instance of the fleet stopped as soon as the group launches it."""
    autoscaling = session.client("autoscaling")

    class _Session:
        def client(self, name: str) -> Any:
            if name != "autoscaling":
                return session.client(name)

            class _Asg:  # the group launches the instance, which then stops (out of memory, say)
                def __getattr__(self, attr: str) -> Any:
                    return getattr(autoscaling, attr)

                def update_auto_scaling_group(self, **kw: Any) -> Any:
                    out = autoscaling.update_auto_scaling_group(**kw)
                    if kw.get("DesiredCapacity"):
                        stop(0)
                    return out

            return _Asg()

    clock = _Clock()

    def sleep(s: float) -> None:
        clock.now += s

    targets = compile_phase.compile_targets(m)
    compile_phase.prove_on_fleet_type(
        _Session(), m, stack_name(m.campaign), targets, say=lambda _: None, clock=clock, sleep=sleep, poll_s=60
    )
    assert clock.now >= 75 * 60  # it waited out the Neuron grace


def _fleet_instances(session: Any) -> list[str]:
    (group,) = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[FLEET_GROUP])[
        "AutoScalingGroups"
    ]
    return [i["InstanceId"] for i in group["Instances"]]


def test_one_fleet_instance_that_serves_the_set_proves_it_and_a_later_deploy_skips_the_check(
    session: Any, example: Manifest
) -> None:
    _stack(session, example, compile_phase_output=True)
    _publish(session, example)
    said, _ = _check(session, example, lambda n: None)
    (group,) = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[FLEET_GROUP])[
        "AutoScalingGroups"
    ]
    assert group["DesiredCapacity"] == 1 and len(_fleet_instances(session)) == 1  # one, not the manifest's size
    assert said[0].startswith("inf2: one inf2.xlarge requested in its own group fleet-inf2-group")
    assert said[-1] == "inf2: one inf2.xlarge serves the set after 0 min; sizing the group"
    body = session.client("s3").get_object(Bucket=BUCKET, Key=f"compiled/{_key(example)}/PROVEN")["Body"].read()
    assert body == b"inf2.xlarge"
    # The set stays published: a later deploy skips the compile phase, and the check with it.
    assert compile_phase.needed(session, example, stack_name(example.campaign), say=lambda _: None) == []


def test_a_fleet_instance_not_healthy_within_its_grace_stops_deploy_with_its_console_and_withdraws_the_set(
    session: Any, example: Manifest
) -> None:
    _stack(session, example, compile_phase_output=True)
    _publish(session, example)
    ec2 = session.client("ec2")

    def out_of_memory(n: int) -> None:  # the instance boots, then never serves: its target is never healthy
        ec2.stop_instances(InstanceIds=_fleet_instances(session))

    # moto's target is healthy while its instance runs: it stops as soon as the group launched it.
    with pytest.raises(compile_phase.OneInstanceCheckFailed) as exc:
        _check_stopped(session, example, out_of_memory)
    msg = str(exc.value)
    assert msg.startswith(
        "inf2: no inf2.xlarge of its own group was healthy in its target group within its 75-min grace"
    )
    assert "console output, last lines (EC2 GetConsoleOutput)" in msg and "    | Linux version" in msg
    assert "give the fleet a larger instance_type, or quantized weights" in msg
    assert exc.value.exit_code == EXIT_FAILED_STEP
    (group,) = session.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[FLEET_GROUP])[
        "AutoScalingGroups"
    ]
    assert group["DesiredCapacity"] == 0
    # Withdrawn: no instance fetches it, and the next deploy compiles (and checks) again.
    assert compile_phase.published_set(session.client("s3"), BUCKET, f"compiled/{_key(example)}") is None
    assert [
        t.fleet for t in compile_phase.needed(session, example, stack_name(example.campaign), say=lambda _: None)
    ] == ["inf2"]
