"""Invariant: what the run's prefix holds is what its run directory holds, whatever uploads failed
on the way (issue 47; guards issue 46's finding 6).

Over a generated history of checkpoints (each writes or rewrites some of the run directory's
files, then publishes, with some of that publish's uploads refused by the bucket), one clean
publish at the end leaves every file under the run's prefix byte for byte as it is on disk. A
file stamped as put before its upload returned is skipped by every later publish and lost once
teardown deletes the workspace (17e73d2)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boto3.exceptions import S3UploadFailedError
from hypothesis import given
from hypothesis import strategies as st
from moto import mock_aws

from core import cloud_contract as cc
from tests.cloud.test_cloud_steps import Aws, Launcher, _run
from tests.invariants import INVARIANT

FILES = ("quality.json", "metrics/inf2.json", "metrics/g6.json", "capacity/g6/x1/step.json", "settle.json")


@pytest.fixture(scope="module")
def aws() -> Iterator[Aws]:
    with mock_aws():
        yield Aws()


class _Refuses:
    """The results bucket refusing the uploads of the keys in `refused` (a timed-out PutObject)."""

    def __init__(self, s3: Any) -> None:
        self.s3, self.refused = s3, frozenset[str]()

    def upload_file(self, path: str, bucket: str, key: str) -> None:
        if any(key.endswith(f"/{name}") for name in self.refused):
            raise S3UploadFailedError(f"Failed to upload {path} to {bucket}/{key}: RequestTimeout")
        self.s3.upload_file(path, bucket, key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.s3, name)


checkpoint = st.tuples(
    st.dictionaries(st.sampled_from(FILES), st.binary(min_size=1, max_size=24), min_size=1),  # written
    st.frozensets(st.sampled_from(FILES)),  # refused at this checkpoint's publish
)


@INVARIANT
@given(history=st.lists(checkpoint, min_size=1, max_size=6))
def test_after_a_clean_publish_the_prefix_holds_the_run_directory(
    aws: Aws, history: list[tuple[dict[str, bytes], frozenset[str]]]
) -> None:
    out = Path(tempfile.mkdtemp(prefix="published-"))
    try:
        run = _run(aws, Launcher(aws), out)
        bucket_s3 = _Refuses(aws.s3)
        run.s3 = bucket_s3
        for written, refused in history:
            for name, data in written.items():
                (run.run_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (run.run_dir / name).write_bytes(data)
            bucket_s3.refused = refused
            with contextlib.suppress(S3UploadFailedError):  # the next checkpoint publishes again
                run.publish()
        bucket_s3.refused = frozenset()
        run.publish()

        bucket, prefix = cc.split_s3_uri(run.uri)
        listed = aws.s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
        held = {
            o["Key"].removeprefix(f"{prefix}/"): aws.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            for o in listed
        }
        on_disk = {p.relative_to(run.run_dir).as_posix(): p.read_bytes() for p in run.run_dir.rglob("*") if p.is_file()}
        assert {k: held.get(k) for k in on_disk} == on_disk
    finally:
        shutil.rmtree(out, ignore_errors=True)
