"""The run's S3 layout read back: one listing loop serves a step's records and a whole run."""

from __future__ import annotations

from pathlib import Path

import boto3

from campaign.aws.s3_trees import download_run, download_tree
from tests.conftest import moto_server

KEYS = [
    "runs/r1/records-g6-w0.jsonl",
    "runs/r1/summary-g6.json",
    "runs/r1/run.json",
    "runs/r1/inputs/manifest.yaml",
    "runs/r1/capacity/g6/x0.5/records-g6-w0.jsonl",
    "runs/r1/capacity/g6/x0.5/settle-1/records-g6-w0.jsonl",
    "runs/r1/report.json",
    "runs/r10/records-g6-w0.jsonl",  # a sibling prefix: not r1's
]


def test_a_step_gets_its_own_records_and_a_run_everything_but_inputs(tmp_path: Path) -> None:
    with moto_server("us-east-1"):
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="results-b")
        for k in KEYS:
            s3.put_object(Bucket="results-b", Key=k, Body=k.encode())
        step = download_run(s3, "s3://results-b/runs/r1", tmp_path / "step")
        run = download_tree(s3, "s3://results-b/runs/r1", tmp_path / "run")
    assert [p.relative_to(tmp_path / "step").as_posix() for p in step] == ["records-g6-w0.jsonl", "summary-g6.json"]
    assert [p.relative_to(tmp_path / "run").as_posix() for p in run] == sorted(
        [
            "capacity/g6/x0.5/records-g6-w0.jsonl",
            "capacity/g6/x0.5/settle-1/records-g6-w0.jsonl",
            "records-g6-w0.jsonl",
            "report.json",
            "run.json",
            "summary-g6.json",
        ]
    )
    assert (tmp_path / "run" / "capacity/g6/x0.5/settle-1/records-g6-w0.jsonl").read_text() == KEYS[5]
