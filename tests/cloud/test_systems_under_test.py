"""A cloud run's report names what served each fleet (issue 46, finding 10): the serving stack, the
image by digest, the engine's command line, the AMI the stack was deployed with and the driver or
Neuron SDK; an offline run names what stood in. Until then a cloud run's systems_under_test was null."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from campaign.aws.stack import stack_name
from campaign.backends.fargate import campaign as fargate_campaign
from campaign.backends.fargate.run import CloudRun
from campaign.stages import run as stages
from core.manifest import load_manifest
from core.naming import ami_parameter_name
from core.serving import definition_for
from tests.cloud.test_cloud_steps import BUCKET, run_config
from tests.cloud.test_conductor import Launcher
from tests.conftest import EXAMPLE_MANIFEST

AMIS = {"inf2": "ami-0123456789abcdef0", "g6": "ami-0fedcba9876543210"}


def _deploy(session: Any, m: Any) -> None:
    """The stack as `deploy` leaves it for this manifest: its run config, and each fleet's AMI
    parameter filled (campaign.aws.dlami)."""
    template = {
        "Parameters": {ami_parameter_name(f): {"Type": "String"} for f in AMIS},
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {"LoadgenRunConfig": {"Value": run_config(workers=m.loadgen.workers).to_json()}},
    }
    session.client("cloudformation").create_stack(
        StackName=stack_name(m),
        TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": ami_parameter_name(f), "ParameterValue": ami} for f, ami in AMIS.items()],
    )
    session.client("s3").create_bucket(Bucket=BUCKET)


def _facts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **kwargs: Any) -> Any:
    """The facts `campaign run` hands the stages (and writes to campaign.json), with no stage run."""
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    seen: list[Any] = []

    def stages_seen(m: Any, fleets: Any, *args: Any, **kw: Any) -> None:
        seen.append(fleets.facts())

    monkeypatch.setattr(stages, "run_stages", stages_seen)
    monkeypatch.setattr(CloudRun, "upload_inputs", lambda self: None)
    with mock_aws():
        session = boto3.session.Session(region_name=m.costs.region)
        _deploy(session, m)
        fargate_campaign.run_campaign(session, m, tmp_path, launcher=Launcher(), final_report=False, **kwargs)
    (facts,) = seen
    return m, facts


def test_a_cloud_runs_facts_name_each_fleets_image_digest_engine_flags_ami_and_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    m, facts = _facts(monkeypatch, tmp_path)
    sut = facts.systems_under_test
    assert sut is not None and all(f.serving.image in sut for f in m.fleets), sut
    for f in m.fleets:
        defn = definition_for(m, f)
        assert f"{f.name} on {f.instance_type}: {f.serving.stack}, image {f.serving.image}" in sut
        assert f"engine `{shlex.join(defn.command)}`" in sut
        assert f"--max-num-seqs {f.max_concurrency}" in sut
        assert f"AMI {AMIS[f.name]} (stack parameter {ami_parameter_name(f.name)})" in sut
        assert f.serving.driver_version in sut
    assert "Neuron SDK 2.28.0 (driver aws-neuronx-dkms 2.26.5.0, runtime 2.30.51.0)" in sut
    assert sut.startswith("Systems under test, as deployed: ")


def test_an_offline_run_says_what_stood_in_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stood_in = "Systems under test: one emulator process per fleet."
    m, facts = _facts(monkeypatch, tmp_path, stand_in=stood_in)
    assert facts.systems_under_test.startswith(f"{stood_in} They stood in for what the stack deploys: ")
    assert all(f.serving.image in facts.systems_under_test for f in m.fleets)
