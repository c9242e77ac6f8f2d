"""Teardown's last step against a real moto server on loopback: find what is still tagged."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from campaign import aws
from tests.conftest import ROOT, moto_server

CAMPAIGN = "llama3-8b-inf2-vs-g6"


@pytest.fixture
def moto_env() -> Iterator[dict[str, str]]:
    with moto_server("us-east-1") as env:
        yield env


def _tags(extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in {"campaign": CAMPAIGN, **(extra or {})}.items()]


def _run_instance(ec2: object, tags: list[dict[str, str]]) -> str:
    r = ec2.run_instances(  # type: ignore[attr-defined]
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g6.xlarge",
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
