"""Pre-flight (issue 25, item 5): `deploy` checks the account's Service Quotas against what the
manifest needs and refuses, with the numbers, before `cdk deploy` runs. Service Quotas through
botocore's Stubber (moto has no Service Quotas values to set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from campaign.aws import stack as aws
from campaign.aws.cloud_checks import quota_needs
from core.manifest import load_manifest
from tests.conftest import EXAMPLE_MANIFEST

CODES = {"L-1945791B": "ec2", "L-DB2E81BA": "ec2", "L-3032A538": "fargate"}


class _Session:
    def __init__(self, client: Any) -> None:
        self._client = client

    def client(self, name: str) -> Any:
        assert name == "service-quotas"
        return self._client


def _stubbed(values: dict[str, float | None]) -> tuple[Any, Stubber]:
    client = boto3.session.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x").client(
        "service-quotas"
    )
    stub = Stubber(client)
    for code, value in values.items():
        params = {"ServiceCode": CODES[code], "QuotaCode": code}
        if value is None:  # no applied value in this account: the default is read instead
            stub.add_client_error("get_service_quota", "NoSuchResourceException", expected_params=params)
            stub.add_response("get_aws_default_service_quota", {"Quota": {"QuotaCode": code, "Value": 0.0}}, params)
        else:
            stub.add_response("get_service_quota", {"Quota": {"QuotaCode": code, "Value": value}}, params)
    stub.activate()
    return client, stub


def test_needs_are_asg_max_times_vcpus_per_family_and_one_vcpu_per_fargate_task() -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    # inf2.xlarge and g6.xlarge have 4 vCPUs; asg.max 12 and 8; 2 fleets x (1 master + 2 workers), Prometheus
    # and the conductor (`run --detach` runs it beside the load generators it starts).
    # With no compile phase (its set already published): the fleets only.
    needs = {n.code: n for n in quota_needs(m, compiling=[])}
    assert {code: n.vcpus for code, n in needs.items()} == {
        "L-1945791B": 12 * 4,
        "L-DB2E81BA": 8 * 4,
        "L-3032A538": 2 * (1 + 2) + 1 + 1,
    }
    assert needs["L-3032A538"].why == (
        "2 fleets x (1 master + 2 workers) x 1 vCPU + Prometheus 1 vCPU + the conductor 1 vCPU (run --detach)"
    )


def test_the_compile_instance_counts_in_its_familys_quota() -> None:
    # The example's inf2 fleet compiles once on an inf2.8xlarge (32 vCPUs) first: by default (what plan
    # shows) and when deploy runs the phase, in the Inf quota, named in the sum.
    from core.compile_host import compile_hosts

    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    for needs in (quota_needs(m), quota_needs(m, compile_hosts(m))):
        by = {n.code: n for n in needs}
        assert by["L-1945791B"].vcpus == 12 * 4 + 32 and by["L-DB2E81BA"].vcpus == 8 * 4
        assert by["L-1945791B"].why == (
            "inf2: asg.max 12 x 4 vCPU (inf2.xlarge) + inf2 compile phase: 1 x 32 vCPU (inf2.8xlarge)"
        )


def test_deploy_refuses_a_short_quota_with_the_numbers_before_cdk_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(aws.subprocess, "call", lambda *a, **k: ran.append(a) or 0)
    client, stub = _stubbed({"L-1945791B": 48.0, "L-DB2E81BA": 64.0, "L-3032A538": None})
    with pytest.raises(aws.QuotaTooLow) as err:
        aws.deploy(Path(EXAMPLE_MANIFEST), session=_Session(client))
    text = str(err.value)
    assert (
        "Running On-Demand Inf instances (ec2 L-1945791B): the manifest needs 80 vCPU" in text
        and "quota in us-east-1 is 48" in text
    )  # the fleets' 48 fit; the compile instance's 32 more do not
    assert (
        "Fargate On-Demand vCPU resource count (fargate L-3032A538): the manifest needs 8 vCPU" in text
        and "is 0" in text
    )
    assert "L-DB2E81BA" not in text  # 64 >= 32: that one fits
    assert err.value.exit_code == 1
    assert ran == []  # cdk deploy never ran: no spend
    stub.assert_no_pending_responses()


def test_deploy_goes_on_when_every_quota_fits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(aws.subprocess, "call", lambda *a, **k: ran.append(a) or 0)
    monkeypatch.setattr(aws.shutil, "which", lambda _: "/usr/bin/npx")
    client, stub = _stubbed({"L-1945791B": 80.0, "L-DB2E81BA": 32.0, "L-3032A538": 4000.0})
    assert aws.deploy(Path(EXAMPLE_MANIFEST), session=_Session(client)) == 0
    assert len(ran) == 1 and ran[0][0][1:3] == ["cdk", "deploy"]
    assert "within the account's quotas" in capsys.readouterr().out
    stub.assert_no_pending_responses()
