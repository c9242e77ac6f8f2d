"""A cloud run's saved server series (metrics/<fleet>/<step>.json) go to the run's S3 prefix with
the run directory (CloudRun.publish, in run_campaign's `finally`), and come back with it for
`report --run-id` and `teardown` (download_tree), so the per-step server figures outlive the
stack's Prometheus workspace."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import boto3

from campaign.aws.s3_trees import download_tree
from campaign.backends.fargate.fleets import CloudFleets
from campaign.backends.fargate.run import CloudRun
from core import cloud_contract as cc
from tests.conftest import moto_server


def test_metrics_are_published_with_the_run_directory_and_fetched_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    saved = {"fleet": "g6", "step": "g6/x2", "window_unix": [1.0, 61.0]}
    (run_dir / "metrics" / "g6").mkdir(parents=True)
    (run_dir / "metrics" / "g6" / "x2.json").write_text(json.dumps(saved))
    (run_dir / "records").mkdir()
    (run_dir / "records" / "records-g6-w0-p1.jsonl").write_text("")  # the tasks uploaded these already
    with moto_server("us-east-1"):
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="results")
        uri = "s3://results/campaigns/c/d/runs/r1"
        # CloudRun's own publish over a stand-in holding only what it reads (no tasks, no launcher)
        run = SimpleNamespace(s3=s3, run_dir=run_dir, uri=uri, _publish_lock=threading.Lock(), _published={})
        assert CloudRun.publish(run) == 1  # type: ignore[arg-type]
        back = tmp_path / "fetched"
        download_tree(s3, uri, back)
    assert json.loads((back / "metrics" / "g6" / "x2.json").read_text()) == saved


def test_a_cloud_runs_facts_carry_the_stacks_scrape_interval() -> None:
    cfg = SimpleNamespace(
        prometheus_url="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1", region="us-east-1"
    )
    facts = CloudFleets(SimpleNamespace(m=SimpleNamespace(fleets=[]), cfg=cfg)).facts()  # type: ignore[arg-type]
    assert facts.scrape_interval_s == cc.PROMETHEUS_SCRAPE_INTERVAL_S == 5
