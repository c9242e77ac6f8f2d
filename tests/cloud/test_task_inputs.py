"""The load-generator task's entry point stages a run's inputs from S3 and refuses wrong ones;
`run` uploads them and keys everything by a new run id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from campaign.cloud_run import upload_inputs
from core import cloud_contract as cc
from core.manifest import load_manifest
from loadgen.task_entry import InputsRejected, stage_inputs
from tests.conftest import EXAMPLE_MANIFEST

BUCKET = "results"
RESULTS = f"s3://{BUCKET}/campaigns/c/0123456789ab/runs"


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _env(tmp_path: Path, run_id: str, digest: str) -> dict[str, str]:
    return {
        cc.ENV_RESULTS_URI: RESULTS,
        cc.ENV_RUN_ID: run_id,
        cc.ENV_MANIFEST_DIGEST: digest,
        cc.ENV_WORK_DIR: str(tmp_path / "task"),
    }


def test_uploaded_inputs_stage_to_a_byte_identical_manifest(s3: Any, tmp_path: Path) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    run_id = cc.new_run_id()
    desc = upload_inputs(s3, m, RESULTS, run_id)
    staged = stage_inputs(_env(tmp_path, run_id, m.digest), s3)
    assert staged.read_bytes() == EXAMPLE_MANIFEST.read_bytes()
    again = load_manifest(staged)
    assert again.digest == m.digest and again.trace_path.read_bytes() == m.trace_path.read_bytes()
    assert again.trace_path.is_relative_to(tmp_path / "task")
    assert desc.requests > 0 and len(desc.schedule_digest) == 64


def test_a_manifest_other_than_the_deployed_one_is_refused(s3: Any, tmp_path: Path) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    run_id = cc.new_run_id()
    upload_inputs(s3, m, RESULTS, run_id)
    with pytest.raises(InputsRejected, match="not the one this stack was deployed for"):
        stage_inputs(_env(tmp_path, run_id, "f" * 64), s3)


def test_a_schedule_that_differs_from_the_planned_one_is_refused(s3: Any, tmp_path: Path) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    run_id = cc.new_run_id()
    desc = upload_inputs(s3, m, RESULTS, run_id)
    _, prefix = cc.split_s3_uri(cc.inputs_uri(RESULTS, run_id))
    tampered = json.loads(desc.to_json()) | {"schedule_digest": "0" * 64}
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{cc.INPUT_SCHEDULE}", Body=json.dumps(tampered).encode())
    with pytest.raises(InputsRejected, match="differs from the one `campaign run` planned"):
        stage_inputs(_env(tmp_path, run_id, m.digest), s3)


def test_missing_inputs_and_environment_name_what_is_missing(s3: Any, tmp_path: Path) -> None:
    run_id = cc.new_run_id()
    with pytest.raises(InputsRejected, match=f"cannot download {RESULTS}/{run_id}/inputs/schedule.json"):
        stage_inputs(_env(tmp_path, run_id, "a" * 64), s3)
    env = _env(tmp_path, run_id, "a" * 64)
    del env[cc.ENV_RUN_ID]
    with pytest.raises(InputsRejected, match="LOADGEN_RUN_ID is not set"):
        stage_inputs(env, s3)


def test_absolute_trace_path_cannot_be_run_in_the_cloud(s3: Any, tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str(load_manifest(EXAMPLE_MANIFEST).trace_path)
    path = tmp_path / "abs.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"workload\.trace\.path: .* is absolute"):
        upload_inputs(s3, load_manifest(path), RESULTS, cc.new_run_id())


def test_run_ids_are_new_every_time_and_checked() -> None:
    ids = {cc.new_run_id(1_780_000_000.0) for _ in range(20)}
    assert len(ids) == 20 and all(i.startswith("20260528T") for i in ids)
    for bad in ("latest", "../other", "20261203T143000Z-XYZ123"):
        with pytest.raises(ValueError, match="run id"):
            cc.check_run_id(bad)


@pytest.mark.parametrize(
    ("trace", "inside"),
    [("../data/t.csv", "manifest/data/t.csv"), ("t.csv", "manifest/t.csv"), ("../../a/b/t.csv", "manifest/a/b/t.csv")],
)
def test_staged_paths_keep_the_manifests_relative_trace_path(tmp_path: Path, trace: str, inside: str) -> None:
    manifest, staged = cc.staged_paths(tmp_path, trace)
    assert staged == (tmp_path / inside).resolve()
    assert (manifest.parent / trace).resolve() == staged
