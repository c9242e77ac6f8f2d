"""testing/iam_recorder.py: with its environment, every botocore client of a process records each
call (operation, the parameters as given, payloads left out) under the access key that signs it."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from testing import iam_recorder


def test_each_call_is_recorded_as_the_key_that_signs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in iam_recorder.environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        bucket = "recorded-calls-bucket"
        stand_in = boto3.client("s3", region_name="us-east-1", aws_access_key_id="stand-in", aws_secret_access_key="x")
        stand_in.create_bucket(Bucket=bucket)
        role = boto3.client("s3", region_name="us-east-1", aws_access_key_id="WorkerRole", aws_secret_access_key="x")
        role.put_object(Bucket=bucket, Key="runs/r/records-p1.jsonl", Body=b"{}\n")
        list(role.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="runs/"))
    calls = list(iam_recorder.read(tmp_path))
    assert [(c["actor"], c["service"], c["operation"]) for c in calls] == [
        ("stand-in", "s3", "CreateBucket"),
        ("WorkerRole", "s3", "PutObject"),
        ("WorkerRole", "s3", "ListObjectsV2"),
    ]
    assert calls[1]["params"] == {"Bucket": bucket, "Key": "runs/r/records-p1.jsonl"}  # no Body
    assert calls[2]["params"]["Prefix"] == "runs/"


def test_without_its_environment_nothing_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(iam_recorder.CALLS_DIR_ENV, raising=False)
    monkeypatch.setenv(iam_recorder.PLUGIN_ENV, iam_recorder.PLUGIN)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").list_buckets()
    assert list(iam_recorder.read(tmp_path)) == []
