"""The cloud report's histograms come from the stack's Prometheus workspace: its query URL is a
stack output, `read_run_config` reads it, `campaign run`'s facts pass it to the report, and
`report --run-id` finds it by itself (and says so when the stack is gone)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from campaign.aws.run_config import read_run_config
from campaign.aws.stack import stack_name
from campaign.backends.fargate.fleets import CloudFleets
from campaign.cli import main as cli
from campaign.cli.report_cmds import stack_prometheus
from core import cloud_contract as cc
from core.manifest import load_manifest
from tests.conftest import EXAMPLE_MANIFEST, moto_server

WORKSPACE_QUERY = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-0a1b2c3d/api/v1/query"
CONFIG = {
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
}


def _deploy(session: Any, stack: str, outputs: dict[str, str]) -> None:
    """A stack with the given outputs, in moto's CloudFormation."""
    template = {
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    session.client("cloudformation").create_stack(StackName=stack, TemplateBody=json.dumps(template))


def test_run_config_without_the_field_still_parses() -> None:
    assert cc.RunConfig.from_json(json.dumps(CONFIG)).prometheus_url == ""
    cfg = cc.RunConfig.from_json(json.dumps({**CONFIG, "prometheus_url": WORKSPACE_QUERY}))
    assert cfg.prometheus_url == WORKSPACE_QUERY
    assert cc.RunConfig.from_json(cfg.to_json()) == cfg


def test_the_stack_workspace_reaches_the_reports_facts(capsys: pytest.CaptureFixture[str]) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    with moto_server("us-east-1"):
        session = boto3.session.Session(region_name="us-east-1")
        _deploy(
            session,
            stack_name(m),
            {cc.RUN_CONFIG_OUTPUT: json.dumps(CONFIG), cc.PROMETHEUS_QUERY_OUTPUT: WORKSPACE_QUERY},
        )
        cfg = read_run_config(session.client("cloudformation"), stack_name(m))
        assert cfg.prometheus_url == WORKSPACE_QUERY
        assert stack_prometheus(session, m) == WORKSPACE_QUERY
        assert f"prometheus: {WORKSPACE_QUERY} (stack {stack_name(m)}'s workspace" in capsys.readouterr().out
    run = SimpleNamespace(m=SimpleNamespace(fleets=[]), cfg=cfg)
    facts = CloudFleets(run).facts()  # type: ignore[arg-type]
    # signed for the stack's region: what an AMP URL names, and what the offline stand-in takes
    assert (facts.prometheus_url, facts.prometheus_sigv4_region) == (WORKSPACE_QUERY, "us-east-1")
    bare = CloudFleets(SimpleNamespace(m=run.m, cfg=cc.RunConfig.from_json(json.dumps(CONFIG)))).facts()  # type: ignore[arg-type]
    assert (bare.prometheus_url, bare.prometheus_sigv4_region) == (None, None)


def test_report_run_id_says_when_the_stack_and_its_workspace_are_gone(capsys: pytest.CaptureFixture[str]) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    with moto_server("us-east-1"):
        session = boto3.session.Session(region_name="us-east-1")
        assert stack_prometheus(session, m) is None
        out = capsys.readouterr().out
        assert f"cannot read stack {stack_name(m)}" in out and "pulled/ answers, else the records alone" in out
        _deploy(session, stack_name(m), {cc.RUN_CONFIG_OUTPUT: json.dumps(CONFIG)})  # an older stack
        assert stack_prometheus(session, m) is None
        assert f"has no {cc.PROMETHEUS_QUERY_OUTPUT} output" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (["--prometheus", "https://aps-workspaces.us-east-1.amazonaws.com/"], "not a workspace's query URL"),
        (["--prometheus", "prometheus:9090"], "is not an http"),
        (["--prometheus", WORKSPACE_QUERY, "--prometheus-sigv4", "eu-west-1"], "is in us-east-1, not in eu-west-1"),
        (["--prometheus-sigv4", "us-east-1"], "give --prometheus too"),
    ],
)
def test_a_bad_prometheus_url_is_refused_before_anything_is_read(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], given: list[str], why: str
) -> None:
    argv = ["report", str(EXAMPLE_MANIFEST), "--records", str(tmp_path), *given, "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--prometheus" in err and why in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("given", "signed_for"),
    [
        ([], "us-east-1"),
        (["--prometheus", "http://127.0.0.1:9/workspaces/ws", "--prometheus-sigv4", "eu-west-1"], "eu-west-1"),
    ],
)
def test_report_run_id_signs_the_stacks_workspace_for_the_stacks_region(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, given: list[str], signed_for: str
) -> None:
    """`report --run-id` queries the stack's workspace signed for the stack's region, as `run` did
    (CloudFleets.facts): a stand-in workspace's loopback URL (make cloud-offline) names no region.
    A --prometheus URL given is signed as --prometheus-sigv4 says."""
    import campaign.aws.session
    import campaign.backends.fargate.campaign
    import campaign.cli.report_cmds
    import campaign.stages.run

    stand_in = "http://127.0.0.1:9/workspaces/ws-stand-in/api/v1/query"
    called: dict[str, Any] = {}

    def report_from_run_dir(m: Any, run_dir: Any, out: Any, **kw: Any) -> Any:
        called.update(kw)
        return SimpleNamespace(decision=SimpleNamespace(state="go", reasons=[]))

    monkeypatch.setattr(campaign.aws.session, "aws_session", lambda region: None)
    monkeypatch.setattr(campaign.backends.fargate.campaign, "fetch_run", lambda s, m, run_id, out: tmp_path)
    monkeypatch.setattr(campaign.cli.report_cmds, "stack_prometheus", lambda s, m: stand_in)
    monkeypatch.setattr(campaign.stages.run, "report_from_run_dir", report_from_run_dir)
    argv = ["report", str(EXAMPLE_MANIFEST), "--run-id", "r1", *given, "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    assert called["prometheus_sigv4_region"] == signed_for
    assert called["prometheus_url"] == (stand_in if not given else given[1])
