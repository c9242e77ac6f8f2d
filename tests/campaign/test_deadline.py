"""The campaign's deadline (issue 40): `deploy` sets it (deploy time + max_campaign_hours, kept by a
second deploy, moved by --extend-hours), `plan` and `deploy` list what still bills after it, `validate
--for cloud` checks it covers the plan, and `run` refuses a stage the plan says would outlast it."""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from campaign.aws import stack as aws
from campaign.plan.predict import CampaignPrediction, billing_after_deadline, deadline_issues
from campaign.stages.deadline import CAPACITY_STAGE, GATE_STAGE, REPLAY_STAGE, DeadlineGuard, PastDeadline
from core.cloud_contract import format_deadline, parse_deadline
from core.manifest import load_manifest, manifest_from_data
from core.naming import CAMPAIGN_DEADLINE_PARAMETER
from tests.campaign.test_cloud_checks import HUB_CREDENTIAL_ARN, _filled
from tests.campaign.test_compile_phase import _with_tokenizer_files
from tests.conftest import EXAMPLE_MANIFEST, write_manifest

NOW = datetime(2026, 12, 5, 20, 0, 0, tzinfo=UTC)


def deploy_args(path: Path, extend_hours: float | None = None) -> argparse.Namespace:
    """`deploy MANIFEST --yes` with the test's Docker Hub credential, as the CLI's own parser reads it
    (a flag deploy gains is then in every test's arguments, at its default)."""
    from campaign.cli.main import build_parser

    hours = ["--extend-hours", str(extend_hours)] if extend_hours is not None else []
    argv = ["deploy", str(path), "--yes", "--docker-hub-credential-arn", HUB_CREDENTIAL_ARN, *hours]
    return build_parser().parse_args(argv)


# --- deploy: which deadline -------------------------------------------------------------------


def test_a_new_stack_gets_deploy_time_plus_max_campaign_hours() -> None:
    d = aws.campaign_deadline(6, now=NOW, deployed=None)
    assert d.parameter == "2026-12-06T02:00:00Z"
    assert "max_campaign_hours (6 h)" in d.how


def test_a_deployed_stack_keeps_its_deadline_and_extend_hours_moves_it() -> None:
    deployed = NOW + timedelta(hours=2)
    assert aws.campaign_deadline(6, now=NOW, deployed=deployed).at == deployed  # a redeploy is no new campaign
    moved = aws.campaign_deadline(6, now=NOW, deployed=deployed, extend_hours=3)
    assert moved.parameter == "2026-12-06T01:00:00Z"  # 22:00 + 3 h
    assert "moved by --extend-hours 3" in moved.how


def test_a_deadline_past_or_too_close_is_refused_naming_both_times() -> None:
    passed = NOW - timedelta(hours=1)
    with pytest.raises(aws.DeadlineRefused) as exc:
        aws.campaign_deadline(6, now=NOW, deployed=passed)
    assert "2026-12-05T19:00:00Z" in str(exc.value) and "2026-12-05T20:00:00Z" in str(exc.value)
    assert "--extend-hours" in str(exc.value)
    with pytest.raises(aws.DeadlineRefused):  # moved, but still less than the margin ahead
        aws.campaign_deadline(6, now=NOW, deployed=passed, extend_hours=1.25)
    assert aws.campaign_deadline(6, now=NOW, deployed=passed, extend_hours=2).at == NOW + timedelta(hours=1)


def test_extend_hours_without_a_deployed_stack_is_refused() -> None:
    with pytest.raises(aws.DeadlineRefused, match="--extend-hours: no deployed stack"):
        aws.campaign_deadline(6, now=NOW, deployed=None, extend_hours=2)


class _Cfn:
    def __init__(self, parameters: list[dict[str, str]] | None) -> None:
        self.parameters = parameters

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        if self.parameters is None:
            raise ClientError(
                {"Error": {"Code": "ValidationError", "Message": f"Stack with id {StackName} does not exist"}},
                "DescribeStacks",
            )
        return {"Stacks": [{"StackName": StackName, "Parameters": self.parameters}]}


def test_the_deployed_deadline_is_read_from_the_stacks_parameter() -> None:
    params = [{"ParameterKey": "AmiInf2", "ParameterValue": "ami-1"}]
    assert aws.deployed_deadline(_Cfn(None), "s") is None
    assert aws.deployed_deadline(_Cfn(params), "s") is None  # deployed before the deadline existed
    params.append({"ParameterKey": CAMPAIGN_DEADLINE_PARAMETER, "ParameterValue": "2026-12-06T01:00:00Z"})
    assert aws.deployed_deadline(_Cfn(params), "s") == datetime(2026, 12, 6, 1, tzinfo=UTC)


class _Session:
    def __init__(self, cfn: _Cfn) -> None:
        self.cfn = cfn

    def client(self, name: str, **kw: Any) -> Any:
        return (
            self.cfn if name == "cloudformation" else None
        )  # ec2: resolve_amis is replaced; ce: none (deploy says so)


def _deploy(tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[Any]:
    """cmd_deploy with every AWS call replaced: returns each `cdk deploy`'s extra arguments."""
    from campaign.aws import compile_phase, dlami, fleet_sizes
    from campaign.cli import aws_cmds

    path = write_manifest(tmp_path, _with_tokenizer_files(tmp_path, _filled(manifest_data)))
    deploys: list[Any] = []
    monkeypatch.setattr(aws_cmds, "aws_session", lambda region: _Session(kw.get("cfn", _Cfn(None))))
    monkeypatch.setattr(aws_cmds, "check_workload", lambda m: [])
    monkeypatch.setattr(compile_phase, "needed", lambda *a, **k: [])
    monkeypatch.setattr(dlami, "resolve_amis", lambda *a: [])
    monkeypatch.setattr(aws, "utc_now", lambda: NOW)

    def deploy(manifest_path: Path, **k: Any) -> int:
        deploys.append(k["extra"])
        return 0

    monkeypatch.setattr(aws, "deploy", deploy)
    # the groups the deadline set to 0 (tests/campaign/test_extend_hours.py drives it on moto)
    monkeypatch.setattr(fleet_sizes, "restore_fleet_sizes", lambda session, stack: ([], []))
    args = deploy_args(path, kw.get("extend_hours"))
    assert aws_cmds.cmd_deploy(args) == 0
    return deploys


def test_deploy_passes_the_deadline_parameter_and_warns_what_still_bills(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest_data["max_campaign_hours"] = 6
    (extra,) = _deploy(tmp_path, manifest_data, monkeypatch)
    i = extra.index(f"{CAMPAIGN_DEADLINE_PARAMETER}=2026-12-06T02:00:00Z")
    assert extra[i - 1] == "--parameters"
    out = capsys.readouterr().out
    assert "deadline 2026-12-06T02:00:00Z: deploy time + max_campaign_hours (6 h)" in out
    assert "these still bill until `teardown`" in out and "NAT gateway" in out and "Network Load Balancer" in out


def test_a_second_deploy_with_extend_hours_moves_the_deployed_deadline(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest_data["max_campaign_hours"] = 6
    cfn = _Cfn([{"ParameterKey": CAMPAIGN_DEADLINE_PARAMETER, "ParameterValue": "2026-12-05T21:00:00Z"}])
    (extra,) = _deploy(tmp_path, manifest_data, monkeypatch, cfn=cfn, extend_hours=4)
    assert f"{CAMPAIGN_DEADLINE_PARAMETER}=2026-12-06T01:00:00Z" in extra


def test_deploy_refuses_a_passed_deadline_before_cdk_runs(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest_data["max_campaign_hours"] = 6
    cfn = _Cfn([{"ParameterKey": CAMPAIGN_DEADLINE_PARAMETER, "ParameterValue": "2026-12-05T19:00:00Z"}])
    with pytest.raises(aws.DeadlineRefused):
        _deploy(tmp_path, manifest_data, monkeypatch, cfn=cfn)


def test_deploy_and_validate_for_cloud_name_a_missing_max_campaign_hours(manifest_data: dict[str, Any]) -> None:
    from campaign.aws.cloud_checks import cloud_issues

    manifest_data.pop("max_campaign_hours", None)
    paths = [i.path for i in cloud_issues(manifest_from_data(_filled(manifest_data)), docker_hub_credential_arn="x")]
    assert "max_campaign_hours" in paths


def test_extend_hours_must_be_positive() -> None:
    from campaign.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["deploy", "m.yaml", "--extend-hours", "-2"])
    assert build_parser().parse_args(["deploy", "m.yaml", "--extend-hours", "2.5"]).extend_hours == 2.5


# --- plan: what still bills, and whether the deadline covers the campaign ------------------------


def test_what_still_bills_is_the_stacks_standing_resources_priced_where_the_snapshot_has_them() -> None:
    lines = billing_after_deadline(load_manifest(EXAMPLE_MANIFEST, check_files=False))
    assert len(lines) == 5
    nat, nlb, endpoints, prometheus, workspace = lines
    assert nat.startswith("1 NAT gateway") and "hours not priced" in nat and "0.0450 USD/GB" in nat  # the nat-gb row
    assert nlb.startswith("1 Network Load Balancer") and "0.0225 USD/hour" in nlb and "Elastic Load Balancing" in nlb
    assert endpoints.startswith("7 interface VPC endpoints (ecr.api, ecr.dkr,") and "2 AZs" in endpoints
    # 1 vCPU x 0.04048 + 2 GiB x 0.004445 per hour (the Fargate rows of the snapshot)
    assert "Prometheus task" in prometheus and "0.0494 USD/hour" in prometheus
    assert "Managed Service for Prometheus workspace" in workspace and "not priced" in workspace


def _prediction(campaign_minutes: float) -> CampaignPrediction:
    return CampaignPrediction(
        campaign_minutes=campaign_minutes,
        campaign_usd=None,
        predicted_decision="defer",
        decision_reasons=[],
        monthly_delta_usd=None,
        monthly_delta_ci_usd=None,
        to_settle=None,
        settle=None,
        fleets={},
        minutes={"deploy": 15.0, "compile_phase_at_most": 85.0, "replay": campaign_minutes - 100.0},
        usd={},
        assumptions=[],
        billing_after_deadline=[],
    )


def test_a_deadline_shorter_than_the_plan_is_named_with_both_figures(manifest_data: dict[str, Any]) -> None:
    manifest_data["max_campaign_hours"] = 3
    m = manifest_from_data(manifest_data)
    (issue,) = deadline_issues(m, _prediction(206.0))
    assert issue.path == "max_campaign_hours"
    assert "3 h (180 min) does not cover the plan's campaign, 206 min" in issue.reason
    assert "compile_phase_at_most 85" in issue.reason and "set at least 4" in issue.reason
    assert deadline_issues(m, _prediction(180.0)) == []


def test_the_example_manifests_deadline_covers_their_plans() -> None:
    # Their plans (2026-12-05): 206 and 222 min, compile phase included.
    for name in ("llama3-8b-inf2-vs-g6.yaml", "llama3-8b-three-fleets.yaml"):
        m = load_manifest(EXAMPLE_MANIFEST.parent / name, check_files=False)
        assert m.max_campaign_hours is not None and deadline_issues(m, _prediction(222.0)) == []


def test_validate_for_cloud_says_when_the_deadline_does_not_cover_the_plan(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import campaign.plan.predict
    from campaign.aws import cloud_checks
    from campaign.cli.local_cmds import cmd_validate
    from core.manifest import ManifestError

    manifest_data["max_campaign_hours"] = 2
    path = write_manifest(tmp_path, manifest_data)
    monkeypatch.setattr(cloud_checks, "cloud_issues", lambda *a, **k: [])
    monkeypatch.setattr(campaign.plan.predict, "predict", lambda m: _prediction(206.0))
    args = argparse.Namespace(manifest=str(path), target="cloud", weights_s3_uri=None, docker_hub_credential_arn=None)
    with pytest.raises(ManifestError) as exc:
        cmd_validate(args)
    assert [i.path for i in exc.value.issues] == ["max_campaign_hours"]


# --- run: a stage the plan says would outlast the deadline is not started -------------------------


def test_the_guard_refuses_a_stage_that_would_end_after_the_deadline_naming_both_times() -> None:
    guard = DeadlineGuard(NOW + timedelta(minutes=30), {REPLAY_STAGE: 20.0, CAPACITY_STAGE: 45.0}, clock=lambda: NOW)
    guard(REPLAY_STAGE)  # ends 20:20, before 20:30
    guard("report")  # no planned minutes: not held
    with pytest.raises(PastDeadline) as exc:
        guard(CAPACITY_STAGE)
    msg = str(exc.value)
    assert "capacity_searches not started: the plan gives it 45 min" in msg
    assert "2026-12-05T20:45:00Z" in msg and "after the deadline 2026-12-05T20:30:00Z" in msg


def test_run_stages_stops_before_the_replay_that_would_outlast_the_deadline(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    from campaign.backends.simulated.fleets import SimulatedFleets
    from campaign.stages.run import run_stages

    m = manifest_from_data(manifest_data)
    asked: list[str] = []
    guard = DeadlineGuard(NOW + timedelta(minutes=10), {GATE_STAGE: 5.0, REPLAY_STAGE: 30.0}, lambda: NOW)

    def before(stage: str) -> None:
        asked.append(stage)
        guard(stage)

    with pytest.raises(PastDeadline, match="replay not started"):
        run_stages(m, SimulatedFleets(m), tmp_path, threading.Event(), before_stage=before, log=lambda s: None)
    assert asked == [GATE_STAGE, REPLAY_STAGE]
    assert (tmp_path / "quality.json").is_file()  # the gate before it is kept
    assert not list((tmp_path / "records").glob("records-*.jsonl"))


# --- run: the deadline per capacity step, read from the stack again before each (issue 48) -------


class _FakeRun:
    """What run_campaign asks of CloudRun, with no AWS behind it."""

    def __init__(self, m: Any, cfg: Any, launcher: Any, s3: Any, *, out_dir: Path, run_id: str, **kw: Any) -> None:
        self.run_dir = out_dir / run_id
        self.uri = f"s3://b/runs/{run_id}"
        self.exit_code: int | None = None
        self.predicted = None
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)

    def upload_inputs(self) -> None: ...

    def deregister(self) -> None: ...

    def publish(self) -> int:
        return 0

    def write_run_record(self, status: str) -> None: ...


def _run_on_simulated_fleets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, m: Any, deadlines: list[str], minutes: dict[str, float]
) -> Any:
    """run_campaign on the simulated fleets, the stack's deadline read as `deadlines` gives it, one per
    read (the last repeated): the report, or the PastDeadline that stopped the run, as its message."""
    from campaign.backends.fargate import campaign as fargate
    from campaign.backends.fargate import systems
    from campaign.backends.simulated.fleets import SimulatedFleets
    from tests.cloud.test_cloud_steps import run_config

    reads = iter(deadlines)
    last = [deadlines[0]]

    def read(cfn: Any, stack: str) -> Any:
        last[0] = next(reads, last[0])
        return run_config(deadline=last[0])

    monkeypatch.setattr(fargate, "read_run_config", read)
    monkeypatch.setattr(fargate, "CloudRun", _FakeRun)
    monkeypatch.setattr(fargate, "CloudFleets", lambda run, **kw: SimulatedFleets(m))
    monkeypatch.setattr(systems, "stack_amis", lambda *a: {})
    monkeypatch.setattr(systems, "systems_under_test", lambda *a: None)

    class _Session:
        def client(self, name: str) -> Any:
            return None

    try:
        result = fargate.run_campaign(
            _Session(),
            m,
            tmp_path,
            launcher=object(),  # type: ignore[arg-type]  # _FakeRun never launches a task
            stage_minutes=lambda: minutes,
            clock=lambda: NOW,
        )
    except PastDeadline as exc:
        return str(exc)
    return result.report


def test_a_deadline_extended_during_the_run_reaches_its_capacity_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest_data: dict[str, Any]
) -> None:
    """`deploy --extend-hours` while the run goes: the stack's new deadline is read before the
    capacity steps. On 63bedbd the deadline read at the start stopped the run before its search
    (PastDeadline: "capacity_searches not started ... after the deadline 2026-12-05T20:20:00Z")."""
    manifest_data["workload"]["capacity_search"] = {
        **manifest_data["workload"].get("capacity_search", {}),
        "settle_budget_s": 0,
    }
    m = manifest_from_data(manifest_data)
    first, extended = format_deadline(NOW + timedelta(minutes=20)), format_deadline(NOW + timedelta(hours=5))
    minutes = {GATE_STAGE: 1.0, REPLAY_STAGE: 1.0, CAPACITY_STAGE: 60.0}
    got = _run_on_simulated_fleets(tmp_path, monkeypatch, m, [first, first, extended], minutes)
    assert not isinstance(got, str), got
    rules = {n: f.capacity.search.stop_rule for n, f in got.fleets.items() if f.capacity and f.capacity.search}
    assert rules == {"inf2": "converged", "g6": "converged"}  # the searches ran to their own end


def test_a_step_the_deadline_would_cut_is_not_started_and_the_run_ends_with_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest_data: dict[str, Any]
) -> None:
    """The stack's deadline is 5 h ahead for the gate, the replay and each fleet's first step (the
        fleets search side by side: reads 5 and 6, the gate is asked twice), then moved to 30 s ahead: each fleet's next step
        is not started, its search stops `deadline` saying why, so does the settle phase (its segments
    would be cut too), and the run ends with its report. On
        63bedbd the deadline was read once and no step was held to it: every search ran to its own
        stop rule (inf2 and g6 "converged")."""
    m = manifest_from_data(manifest_data)
    far, near = format_deadline(NOW + timedelta(hours=5)), format_deadline(NOW + timedelta(seconds=30))
    minutes = {GATE_STAGE: 0.1, REPLAY_STAGE: 0.1}
    got = _run_on_simulated_fleets(tmp_path, monkeypatch, m, [far] * 6 + [near], minutes)
    assert not isinstance(got, str), got
    paths = {name: f.capacity.search for name, f in got.fleets.items() if f.capacity is not None}
    assert {name: p.stop_rule if p else None for name, p in paths.items()} == {"inf2": "deadline", "g6": "deadline"}
    for p in paths.values():
        assert p is not None and [s.label for s in p.steps][:1] == ["replay"] and len(p.steps) == 2  # one step ran
        assert "not started" in p.stop_detail and "after the deadline 2026-12-05T20:00:30Z" in p.stop_detail
        assert "--extend-hours" in p.stop_detail
    # the settle phase after them: every fleet's next segment would be cut, none started
    settle = got.provenance["settle"].detail
    assert (
        settle.startswith("settle phase: deadline (settle g6's next segment not started") and "0 segment(s)" in settle
    )


def test_run_refuses_before_uploading_anything_when_the_gate_would_outlast_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from campaign.backends.fargate import campaign as fargate
    from tests.cloud.test_cloud_steps import run_config

    cfg = run_config(deadline=format_deadline(NOW + timedelta(minutes=3)))
    monkeypatch.setattr(fargate, "read_run_config", lambda cfn, stack: cfg)

    class _NoAws:
        def client(self, name: str) -> Any:
            if name == "cloudformation":
                return None
            raise AssertionError(f"{name} called after the deadline refused the run")

    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    with pytest.raises(PastDeadline, match="quality_gate not started"):
        fargate.run_campaign(_NoAws(), m, tmp_path, stage_minutes=lambda: {GATE_STAGE: 5.0}, clock=lambda: NOW)
    # A stack without a deadline (deployed before it existed) asks for no plan at all.
    asked: list[bool] = []

    def minutes() -> dict[str, float]:
        asked.append(True)
        return {}

    none = replace(cfg, deadline="")
    monkeypatch.setattr(fargate, "read_run_config", lambda cfn, stack: none)
    deadline = fargate.stack_deadline(None, "s", none, minutes, lambda: NOW)
    deadline.stage(GATE_STAGE)
    assert asked == [] and deadline.cuts("a step", 1e9) is None


def test_a_stack_that_cannot_be_read_again_keeps_the_deadline_last_read() -> None:
    from campaign.stages.deadline import StackDeadline

    said: list[str] = []

    def read() -> datetime:
        raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "DescribeStacks")

    deadline = StackDeadline(read, None, lambda: NOW, said.append, last=NOW + timedelta(minutes=1))
    assert "after the deadline 2026-12-05T20:01:00Z" in (deadline.cuts("capacity search g6 x2", 120) or "")
    assert deadline.cuts("capacity search g6 x2", 30) is None
    assert "could not be read again (ClientError" in said[0] and "2026-12-05T20:01:00Z" in said[0]


def test_the_run_config_deadline_is_checked_and_parsed() -> None:
    from core import cloud_contract as cc

    base = {
        "region": "r",
        "cluster": "c",
        "master_task_definition": "m",
        "worker_task_definition": "w",
        "gate_task_definition": "g",
        "subnets": "s1,s2",
        "security_groups": "sg",
        "results_uri": "s3://b/p",
        "targets": {},
        "workers": 1,
    }
    assert cc.RunConfig.from_json(json.dumps(base)).deadline_at is None
    cfg = cc.RunConfig.from_json(json.dumps({**base, "deadline": "2026-12-06T02:00:00Z"}))
    assert cfg.deadline_at == datetime(2026, 12, 6, 2, tzinfo=UTC)
    with pytest.raises(ValueError, match="LoadgenRunConfig: deadline: expected YYYY-MM-DDThh:mm:ssZ"):
        cc.RunConfig.from_json(json.dumps({**base, "deadline": "CampaignDeadline"}))
    assert parse_deadline(format_deadline(NOW)) == NOW


def test_a_saved_plans_stage_minutes_are_read_back_and_a_bad_one_named(tmp_path: Path) -> None:
    from campaign.plan.plan_file import planned_stage_minutes
    from core.errors import BadArgument

    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"manifest_digest": m.digest, "prediction": {"minutes": {"replay": 1.6}}}))
    assert planned_stage_minutes(path, m) == {"replay": 1.6}
    path.write_text(json.dumps({"manifest_digest": m.digest, "prediction": {"minutes": {"replay": "soon"}}}))
    with pytest.raises(BadArgument, match=r"prediction\.minutes\.replay: expected minutes >= 0"):
        planned_stage_minutes(path, m)
    path.write_text(json.dumps({"manifest_digest": m.digest, "prediction": None}))
    with pytest.raises(BadArgument, match=r"prediction\.minutes: missing"):
        planned_stage_minutes(path, m)
