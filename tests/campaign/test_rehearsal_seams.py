"""The rehearsal (issue 51): its manifest, its pre-flight image check, and the seams it observes
on a stack, each against moto or a loopback registry stand-in. A seam broken on purpose (an image
reference that does not exist, an untagged resource, a group without its deadline action, a stack
not deployed as a rehearsal) fails the rehearsal report, naming the seam and what AWS answered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from campaign.aws import rehearsal_report as rr
from campaign.aws.rehearsal_seams import deadline_seam, stack_seam, tags_seam
from campaign.pin.image_check import check_image, check_images, image_references, images_seam, mirrors_from_env
from campaign.stages.rehearsal import rehearsal_path, write_rehearsal_manifest
from core import rehearsal
from core.images import PROMETHEUS_IMAGE
from core.manifest import load_manifest
from core.naming import REHEARSAL_OUTPUT
from testing.registry_stand_in import registry_stand_in
from tests.conftest import example_data, write_manifest

REGION = "us-east-1"
DIGEST = "sha256:" + "e" * 64


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_manifest(tmp_path, example_data(), "campaign.yaml")


def test_the_rehearsal_manifest_has_the_fixed_shape_and_one_digest(manifest: Path) -> None:
    path = write_rehearsal_manifest(manifest)
    assert path == rehearsal_path(manifest) == manifest.with_name("campaign.rehearsal.yaml")
    m, campaign = load_manifest(path), load_manifest(manifest)
    search = m.workload.capacity_search
    assert search is not None and m.workload.capacity_sweep is None
    assert m.workload.window.duration_s == min(campaign.workload.window.duration_s, rehearsal.REPLAY_S)
    assert search.max_steps == rehearsal.CAPACITY_STEPS + 1 and search.tolerance == 0.01
    # its settle segments run settled or not, each with a step's room for its arrivals, drain and
    # the load generator's start and stop (a segment the budget cannot hold is skipped)
    assert search.settle_min_segments == rehearsal.SETTLE_SEGMENTS
    assert search.settle_budget_s == rehearsal.SETTLE_SEGMENTS * 4 * rehearsal.STEP_S
    # everything else is the campaign's: the fleets, their images, the SLO
    assert m.fleets == campaign.fleets and m.slo == campaign.slo and m.campaign == campaign.campaign
    # written again from the same manifest: the same digest, so deploy and run agree
    digest = m.digest
    assert load_manifest(write_rehearsal_manifest(manifest)).digest == digest != campaign.digest
    with pytest.raises(ValueError, match="already a rehearsal's manifest"):
        write_rehearsal_manifest(path)


# --- images: the OCI manifest HEAD at a loopback registry stand-in, ECR DescribeImages in moto ----


@pytest.fixture
def registry() -> Iterator[tuple[str, dict[str, str]]]:
    manifests: dict[str, str] = {}  # "repository/manifests/reference" -> digest, filled in by each test
    with registry_stand_in(manifests) as host:
        yield host, manifests


def test_a_public_image_is_heads_at_its_pinned_digest_through_the_mirror_seam(
    registry: tuple[str, dict[str, str]],
) -> None:
    host, manifests = registry
    manifests[f"prom/prometheus/manifests/{PROMETHEUS_IMAGE.split('@')[1]}"] = PROMETHEUS_IMAGE.split("@")[1]
    mirrors = mirrors_from_env({"HARNESS_REGISTRY_MIRRORS": f"registry-1.docker.io={host}"})
    found = check_image(PROMETHEUS_IMAGE, mirrors=mirrors)
    assert found.exists, found
    assert found.where == f"HEAD http://{host}/v2/prom/prometheus/manifests/{PROMETHEUS_IMAGE.split('@')[1]}"
    # an image pinned to a digest the registry does not hold: the seam fails with its answer
    missing = f"{host}/vllm/vllm-openai:v0.9.0@{DIGEST}"
    seam = images_seam(check_images([PROMETHEUS_IMAGE, missing], mirrors=mirrors))
    assert seam.passed is False and seam.name == rr.IMAGES
    assert (
        seam.error
        == f"HEAD http://{host}/v2/vllm/vllm-openai/manifests/{DIGEST}: {host}/vllm/vllm-openai: no manifest {DIGEST} (HTTP 404)"
    )
    assert missing in seam.observed and "campaign pin" in seam.fix


def test_every_image_the_stacks_pull_is_checked(manifest: Path) -> None:
    m = load_manifest(manifest)
    assert image_references(m) == [*(f.serving.image for f in m.fleets), PROMETHEUS_IMAGE]


@mock_aws
def test_a_private_ecr_image_is_asked_of_ecr_describe_images() -> None:
    ecr = boto3.client("ecr", region_name=REGION)
    ecr.create_repository(repositoryName="harness/emulator")
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"})
    ecr.put_image(repositoryName="harness/emulator", imageManifest=manifest, imageTag="v1")
    host = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    assert check_image(f"{host}/harness/emulator:v1", ecr=ecr).exists
    gone = check_image(f"{host}/harness/emulator:v2", ecr=ecr)
    assert gone.where == "ECR DescribeImages harness/emulator v2"
    assert gone.error.startswith("ImageNotFoundException: "), gone.error


# --- the stack's seams, in moto ---------------------------------------------------------------


def _stack(campaign: str, *, rehearsal_output: bool = True) -> dict[str, Any]:
    tags = [{"Key": "campaign", "Value": campaign}]
    return {
        "Resources": {
            "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.0.0.0/16"}},
            "Subnet": {
                "Type": "AWS::EC2::Subnet",
                "Properties": {"VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.0.1.0/24", "AvailabilityZone": "us-east-1a"},
            },
            "Template": {
                "Type": "AWS::EC2::LaunchTemplate",
                "Properties": {"LaunchTemplateData": {"ImageId": "ami-12345678", "InstanceType": "c6a.large"}},
            },
            "Group": {
                "Type": "AWS::AutoScaling::AutoScalingGroup",
                "Properties": {
                    "AutoScalingGroupName": f"{campaign}-inf2",
                    "MinSize": "1",
                    "MaxSize": "1",
                    "LaunchTemplate": {"LaunchTemplateId": {"Ref": "Template"}, "Version": "1"},
                    "VPCZoneIdentifier": [{"Ref": "Subnet"}],
                    "Tags": [
                        {"Key": "campaign", "Value": campaign, "PropagateAtLaunch": True},
                        {"Key": "fleet", "Value": "inf2", "PropagateAtLaunch": True},
                    ],
                },
            },
            "Targets": {
                "Type": "AWS::ElasticLoadBalancingV2::TargetGroup",
                "Properties": {"Protocol": "TCP", "Port": 8000, "VpcId": {"Ref": "Vpc"}, "Tags": tags},
            },
            "Bucket": {"Type": "AWS::S3::Bucket", "Properties": {"Tags": tags}},
        },
        "Outputs": {REHEARSAL_OUTPUT: {"Value": "true"}} if rehearsal_output else {"Other": {"Value": "x"}},
    }


def _deploy(campaign: str, **kw: Any) -> Any:
    session = boto3.session.Session(region_name=REGION)
    cfn = session.client("cloudformation")
    cfn.create_stack(StackName=f"{campaign}-comparison", TemplateBody=json.dumps(_stack(campaign, **kw)))
    # The stacks' tags reach a target group by CloudFormation's propagation, which moto skips.
    for r in cfn.list_stack_resources(StackName=f"{campaign}-comparison")["StackResourceSummaries"]:
        if r["ResourceType"] == "AWS::ElasticLoadBalancingV2::TargetGroup":
            session.client("elbv2").add_tags(
                ResourceArns=[r["PhysicalResourceId"]], Tags=[{"Key": "campaign", "Value": campaign}]
            )
    return session


@mock_aws
def test_stack_seam_needs_a_stack_deployed_as_a_rehearsal(manifest: Path) -> None:
    m = load_manifest(manifest)
    cfn = _deploy(m.campaign).client("cloudformation")
    ok = stack_seam(cfn, f"{m.campaign}-comparison")
    assert ok.passed is True and "Rehearsal=true" in ok.observed
    missing = stack_seam(cfn, "nope-comparison")
    assert missing.passed is False and "does not exist" in missing.error and "--rehearsal" in missing.fix


@mock_aws
def test_a_campaign_stack_is_not_a_rehearsal(manifest: Path) -> None:
    m = load_manifest(manifest)
    cfn = _deploy(m.campaign, rehearsal_output=False).client("cloudformation")
    seam = stack_seam(cfn, f"{m.campaign}-comparison")
    assert seam.passed is False and "not deployed as a rehearsal" in seam.observed


@mock_aws
def test_an_untagged_resource_fails_the_tags_seam_naming_it(manifest: Path) -> None:
    m = load_manifest(manifest)
    session = _deploy(m.campaign)
    stack = f"{m.campaign}-comparison"
    seam = tags_seam(session, m, stack)
    assert seam.passed is True, seam
    assert "on all 3 " in seam.observed
    # the target group loses its campaign tag: the seam names it, and the report exits 1 on it
    (tg,) = [
        r["PhysicalResourceId"]
        for r in session.client("cloudformation").list_stack_resources(StackName=stack)["StackResourceSummaries"]
        if r["ResourceType"] == "AWS::ElasticLoadBalancingV2::TargetGroup"
    ]
    session.client("elbv2").remove_tags(ResourceArns=[tg], TagKeys=["campaign"])
    seam = tags_seam(session, m, stack)
    assert seam.passed is False and seam.error == f"untagged: {tg}"
    assert seam.observed.startswith(f"1 of 3 resource(s) without campaign={m.campaign}: {tg}")
    report = rr.RehearsalReport(m.campaign, m.digest, m.digest, "r1", [rr.Seam(rr.STACK, True, "ok"), seam])
    assert report.exit_code == 1 and report.lines()[-1] == f"rehearsal FAILED at tags: untagged: {tg}"


@mock_aws
def test_the_deadline_action_is_looked_for_on_every_fleets_group(manifest: Path) -> None:
    full = load_manifest(manifest)
    session = _deploy(full.campaign)
    # the stack above has the inf2 group only
    inf2_only = full.model_copy(update={"fleets": tuple(f for f in full.fleets if f.name == "inf2")})
    seam = deadline_seam(session, inf2_only, "2026-12-08T00:00:00Z")
    assert seam.passed is False and seam.error == "0 scheduled action(s), none to 0"
    session.client("autoscaling").put_scheduled_update_group_action(
        AutoScalingGroupName=f"{full.campaign}-inf2",
        ScheduledActionName="deadline",
        StartTime="2030-01-01T00:00:00Z",
        MinSize=0,
        MaxSize=0,
        DesiredCapacity=0,
    )
    seam = deadline_seam(session, inf2_only, "2030-01-01T00:00:00Z")
    assert seam.passed is True and "inf2 at 2030-01-01" in seam.observed, seam


@mock_aws
def test_the_record_is_read_back_and_a_failed_or_missing_one_is_not_passed(manifest: Path) -> None:
    m = load_manifest(manifest)
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="x-comparison-results")
    uri = "s3://x-comparison-results/campaigns/c/abc/runs"
    assert rr.read_record(s3, uri, m.campaign) is None
    report = rr.RehearsalReport(m.campaign, m.digest, "d2", "r1", [rr.Seam(rr.TEARDOWN, None, "pending")])
    report.add(rr.Seam(rr.GATE, True, "passed"))
    assert [s.name for s in report.seams] == [rr.GATE, rr.TEARDOWN]  # in the order a rehearsal meets them
    assert report.exit_code == 0 and report.lines()[-1] == "rehearsal passed (pending: teardown)"
    assert rr.put_record(s3, uri, report) == f"s3://x-comparison-results/campaigns/{m.campaign}/rehearsal.json"
    back = rr.read_record(s3, uri, m.campaign)
    assert back == report and back.passed
    report.add(rr.failed(rr.RECORDS, "no record files", "AccessDenied: s3:PutObject", "allow it"))
    assert report.exit_code == 1 and report.first_failure() == report.seams[1]
    with pytest.raises(ValueError, match="unknown seam"):
        report.add(rr.Seam("nope", True, ""))


# --- the tasks seam: what the run's directory shows of its steps and settle segments -------------


def _searched(run_dir: Path, fleet: str, labels: list[str]) -> None:
    from analysis.capacity.steps import SearchPath, SearchStep, StopRule, Verdict, write_search_path

    steps = tuple(
        SearchStep(label, 1.0, "test", 30.0, Verdict.HELD, 72, 30.0, 0.6, 5.0, 1.5, 0.08, 0.0) for label in labels
    )
    path = SearchPath(fleet, steps, 1.0, None, StopRule.MAX_STEPS, "test", 0.01)
    write_search_path(path, run_dir / "capacity" / fleet)


def _settled(run_dir: Path, fleets: list[str]) -> None:
    from analysis.capacity.settle_record import SettleOutcome, SettleSegment, SettleStop

    SettleOutcome(
        stopped=SettleStop.BUDGET,
        detail="g6: its next segment needs about 40 s of arrivals",
        delta_ci_before=None,
        delta_ci_after=None,
        decision_before="go",
        decision_after="go",
        segments=[
            SettleSegment(
                fleet=f,
                step=f"{f}/x2",
                directory=f"{f}/x2/settle-1",
                multiplier=2.0,
                skip_s=60.0,
                span_s=20.0,
                planned_requests=72,
                took_s=90.0,
            )
            for f in fleets
        ],
    ).write(run_dir / "capacity")


def test_the_tasks_seam_fails_on_a_fleet_that_ran_no_settle_segment(manifest: Path, tmp_path: Path) -> None:
    # Offline the rehearsal ran 0 settle segments per fleet and the tasks seam passed, reporting
    # the count: a rehearsal that skipped its settle phase met its price without rehearsing it.
    from campaign.backends.fargate.rehearsal import _tasks

    m = load_manifest(write_rehearsal_manifest(manifest))
    names = [f.name for f in m.fleets]
    run_dir = tmp_path / "run"
    for name in names:
        _searched(run_dir, name, ["replay", "x1", "x2"])
    tasks = [
        {"fleet": n, "role": r, "task": f"{n}-{r}-{i}", "state": "STOPPED", "exit_code": 0}
        for n in names
        for i, r in enumerate(["gate", "master", "worker", "master", "worker"])
    ]
    _settled(run_dir, names)
    assert _tasks(m, run_dir, {"tasks": tasks}).passed is True
    _settled(run_dir, names[:1])  # the other fleet's segment sat out (over the settle budget)
    seam = _tasks(m, run_dir, {"tasks": tasks})
    assert seam.passed is False and seam.name == rr.TASKS
    assert f"{names[1]}: 0 settle segment(s), the rehearsal runs {rehearsal.SETTLE_SEGMENTS}" in seam.error
    assert "settle phase: budget" in seam.error and names[0] + ":" not in seam.error
    (run_dir / "capacity" / "settle.json").unlink()  # no settle phase at all
    seam = _tasks(m, run_dir, {"tasks": tasks})
    assert seam.passed is False
    assert all(f"{n}: 0 settle segment(s)" in seam.error for n in names) and "no settle.json" in seam.error
    _settled(run_dir, names)
    _searched(run_dir, names[0], ["replay", "x1"])  # one capacity step short
    seam = _tasks(m, run_dir, {"tasks": tasks})
    assert seam.passed is False
    assert seam.error == f"{names[0]}: 1 capacity step(s), the rehearsal runs {rehearsal.CAPACITY_STEPS}"


# --- deploy --rehearsal and the campaign's deploy, every AWS call but the checked ones replaced --


def _deploy_cli(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    *,
    rehearsal: bool,
    preflight: list[rr.Seam],
) -> tuple[int | Exception, list[dict[str, Any]], Path]:
    """cmd_deploy with `preflight` as the rehearsal's pre-flight seams; (its code or what it raised,
    each `cdk deploy`'s arguments, the manifest)."""
    from campaign.aws import compile_phase, dlami
    from campaign.aws import stack as aws
    from campaign.cli import aws_cmds
    from tests.campaign.test_billing_tags import _ce, _Session
    from tests.campaign.test_cloud_checks import _filled
    from tests.campaign.test_compile_phase import _with_tokenizer_files
    from tests.campaign.test_deadline import NOW, deploy_args

    manifest_data["max_campaign_hours"] = 6
    path = write_manifest(tmp_path, _with_tokenizer_files(tmp_path, _filled(manifest_data)))
    deployed: list[dict[str, Any]] = []
    monkeypatch.setattr(aws_cmds, "aws_session", lambda region: _Session(_ce()))
    monkeypatch.setattr(aws_cmds, "_preflight_seams", lambda session, m: preflight)
    monkeypatch.setattr(
        compile_phase, "needed", lambda *a, **k: pytest.fail("a rehearsal has no compile phase") if rehearsal else []
    )
    monkeypatch.setattr(dlami, "resolve_amis", lambda *a: [])
    monkeypatch.setattr(aws, "utc_now", lambda: NOW)

    def deploy(manifest_path: Path, **k: Any) -> int:
        deployed.append({"path": manifest_path, **k})
        return 0

    monkeypatch.setattr(aws, "deploy", deploy)
    args = deploy_args(path)
    args.rehearsal = rehearsal
    try:
        return aws_cmds.cmd_deploy(args), deployed, path
    except Exception as exc:
        return exc, deployed, path


def test_deploy_rehearsal_deploys_the_rehearsal_manifest_with_the_stacks_context(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = [rr.Seam(rr.IMAGES, True, "all 3 exist"), rr.Seam(rr.QUOTAS, True, "checked")]
    code, deployed, path = _deploy_cli(tmp_path, manifest_data, monkeypatch, rehearsal=True, preflight=ok)
    assert code == 0
    (call,) = deployed  # one `cdk deploy`: no compile phase first
    assert call["path"] == rehearsal_path(path) and call["path"].is_file()
    assert call["extra"][call["extra"].index("rehearsal=1") - 1 : call["extra"].index("rehearsal=1") + 1] == [
        "-c",
        "rehearsal=1",
    ]
    assert call["check_quota"] is False  # the accelerator quotas are not the rehearsal's: its own were checked
    out = capsys.readouterr().out
    assert "images           ok      all 3 exist" in out and f"run {path} --rehearsal" in out


def test_deploy_rehearsal_refuses_a_missing_image_and_writes_nothing(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from campaign.aws.stack import AwsStepFailed

    bad = [
        rr.failed(
            rr.IMAGES, "1 of 3 not found", "HEAD https://r/v2/x/manifests/sha256:e: no manifest (HTTP 404)", "pin"
        )
    ]
    exc, deployed, path = _deploy_cli(tmp_path, manifest_data, monkeypatch, rehearsal=True, preflight=bad)
    assert isinstance(exc, AwsStepFailed) and str(exc).startswith(
        "images: HEAD https://r/v2/x/manifests/sha256:e: no manifest (HTTP 404)"
    )
    assert not deployed and not rehearsal_path(path).exists()


def test_the_campaigns_deploy_suggests_a_rehearsal_it_has_none_of(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, deployed, _ = _deploy_cli(tmp_path, manifest_data, monkeypatch, rehearsal=False, preflight=[])
    assert code == 0 and len(deployed) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "rehearsal" in x]
    assert line.startswith("note: ") and "no passed rehearsal (no stack deployed yet)" in line and "--rehearsal" in line


@mock_aws
def test_run_rehearsal_without_its_stack_exits_1_naming_the_stack_and_writes_nothing(
    manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from campaign.cli import aws_cmds
    from campaign.cli.main import build_parser
    from core.errors import BadArgument

    monkeypatch.setattr(aws_cmds, "_preflight_seams", lambda session, m: [rr.Seam(rr.IMAGES, True, "all exist")])
    args = build_parser().parse_args(["run", str(manifest), "--rehearsal"])
    assert args.handler(args) == 1
    out = capsys.readouterr().out
    assert "stack            FAILED  llama3-8b-inf2-vs-g6-comparison: its run config not readable" in out
    assert out.splitlines()[-1].startswith("rehearsal FAILED at stack: ")
    assert not rehearsal_path(manifest).exists()
    with pytest.raises(BadArgument, match="drop --detach, --no-capacity"):
        bad = build_parser().parse_args(["run", str(manifest), "--rehearsal", "--detach", "--no-capacity"])
        bad.handler(bad)
