"""The tags the bill is read by (issue 48, finding 4): `deploy` asks Cost Explorer whether `campaign`
and `fleet` are activated cost allocation tags (ListCostAllocationTags, through botocore's Stubber:
moto does not answer it) and prints what to activate; a refusal is a printed line, never a failed
deploy; `plan` names them offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from campaign.aws import stack as aws
from tests.campaign.test_cloud_checks import _filled
from tests.campaign.test_compile_phase import _with_tokenizer_files
from tests.campaign.test_deadline import NOW, _Cfn, deploy_args
from tests.conftest import EXAMPLE_MANIFEST, write_manifest


class _Session:
    def __init__(self, ce: Any) -> None:
        self.ce = ce

    def client(self, name: str, **kw: Any) -> Any:
        return {"cloudformation": _Cfn(None), "ce": self.ce}.get(name)


def _deploy_output(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ce: Any,
) -> str:
    """cmd_deploy's output with every AWS call but Cost Explorer's replaced."""
    from campaign.aws import compile_phase, dlami
    from campaign.cli import aws_cmds

    manifest_data["max_campaign_hours"] = 6
    path = write_manifest(tmp_path, _with_tokenizer_files(tmp_path, _filled(manifest_data)))
    monkeypatch.setattr(aws_cmds, "aws_session", lambda region: _Session(ce))
    monkeypatch.setattr(aws_cmds, "check_workload", lambda m: [])
    monkeypatch.setattr(compile_phase, "needed", lambda *a, **k: [])
    monkeypatch.setattr(dlami, "resolve_amis", lambda *a: [])
    monkeypatch.setattr(aws, "utc_now", lambda: NOW)
    monkeypatch.setattr(aws, "deploy", lambda manifest_path, **k: 0)
    args = deploy_args(path)
    assert aws_cmds.cmd_deploy(args) == 0
    return capsys.readouterr().out


def _ce() -> Any:
    return boto3.client("ce", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")


def test_deploy_says_which_tags_to_activate(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`campaign` active, `fleet` never seen in the billing data yet (ListCostAllocationTags does not
    list it). On 63bedbd deploy printed nothing about either."""
    ce = _ce()
    with Stubber(ce) as stub:
        stub.add_response(
            "list_cost_allocation_tags",
            {"CostAllocationTags": [{"TagKey": "campaign", "Type": "UserDefined", "Status": "Active"}]},
            {"TagKeys": ["campaign", "fleet"], "Type": "UserDefined"},
        )
        out = _deploy_output(tmp_path, manifest_data, monkeypatch, capsys, ce)
    assert (
        "billing: cost allocation tags campaign Active, fleet not seen (ListCostAllocationTags: 1 request(s), 0.01 USD)"
        in out
    )
    assert "billing: until fleet is active, Cost Explorer answers no rows for this campaign" in out
    assert "--cost-allocation-tags-status TagKey=fleet,Status=Active`" in out


def test_deploy_goes_on_when_the_tags_cannot_be_checked(
    tmp_path: Path, manifest_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ce = _ce()
    with Stubber(ce) as stub:
        stub.add_client_error("list_cost_allocation_tags", "AccessDeniedException", "not authorized")
        out = _deploy_output(tmp_path, manifest_data, monkeypatch, capsys, ce)
    assert "billing: the cost allocation tags campaign, fleet could not be checked (Cost Explorer " in out
    assert "AccessDeniedException" in out and "TagKey=campaign,Status=Active TagKey=fleet,Status=Active" in out


def test_plan_names_the_tags_to_activate_offline(capsys: pytest.CaptureFixture[str]) -> None:
    """No AWS call: the keys and how to activate them. On 63bedbd plan named neither."""
    from campaign.cli.main import main

    main(["plan", str(EXAMPLE_MANIFEST), "--no-simulate"])
    out = capsys.readouterr().out
    assert "billing: the report reads the bill by the tags campaign, fleet" in out
    assert "aws ce update-cost-allocation-tags-status" in out
