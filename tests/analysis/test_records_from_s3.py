"""Records read in place from S3 (a moto server on loopback) give the report the local copy gives."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import duckdb
import pytest

from analysis.errors import DigestMismatch, EmptyWindow
from analysis.report.build import ReportInputs, build_report
from analysis.sources.records import load_records
from core.records import RunSummary
from tests.analysis.synth import manifest, rec, write_jsonl
from tests.conftest import moto_server

BUCKET = "campaign-results"
PREFIX = "runs/r-1"


def _write_run(root: Path, m: Any) -> None:
    write_jsonl(
        root / "inf2" / "records-inf2-w0.jsonl",
        [rec(m, "inf2", i, ttft=0.2 + (i % 7) / 50, tokens=90 + i % 30) for i in range(150)],
    )
    torn = root / "g6" / "records-g6-w0.jsonl"
    write_jsonl(torn, [rec(m, "g6", i, ttft=0.3 + (i % 5) / 40, tokens=80 + i % 40) for i in range(120)])
    with torn.open("a", encoding="utf-8") as fh:
        fh.write('{"campaign": "cut mid-wr')  # a worker killed mid-record
    # a second g6 worker in Parquet
    src = root / "w1.jsonl"
    write_jsonl(src, [rec(m, "g6", 1000 + i, ttft=0.25, tokens=100) for i in range(40)])
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * FROM read_json('{src}', format='newline_delimited')) TO '{root / 'g6' / 'records-g6-w1.parquet'}' (FORMAT parquet)"
    )
    src.unlink()
    summary = RunSummary(
        campaign=m.campaign,
        manifest_digest=m.digest,
        fleet="inf2",
        scheduled=150,
        completed=150,
        failed=0,
        not_sent=0,
        warmup_excluded=0,
        schedule_lag_p50_s=0.001,
        schedule_lag_p99_s=0.002,
        client_cpu_percent=10.0,
        valid=True,
        invalid_reasons=[],
        token_count_mismatch_rate=0.0,
        started_at=1_700_000_000.0,
        ended_at=1_700_000_200.0,
    )
    (root / "inf2" / "run-summary.json").write_text(json.dumps(asdict(summary)), encoding="utf-8")


def _upload(root: Path, s3: Any) -> None:
    s3.create_bucket(Bucket=BUCKET)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), BUCKET, f"{PREFIX}/{p.relative_to(root).as_posix()}")


def test_a_report_from_s3_equals_the_report_from_the_local_copy(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    import boto3

    m = manifest(manifest_data)
    local = tmp_path / "records"
    _write_run(local, m)
    here = build_report(ReportInputs(m, local, out_dir=tmp_path / "local", with_pages=False)).model_dump(mode="json")
    with moto_server("us-east-1"):
        _upload(local, boto3.client("s3"))
        rs = load_records(f"s3://{BUCKET}/{PREFIX}", m.digest)
        assert all(f.startswith(f"s3://{BUCKET}/{PREFIX}/") for f in rs.files) and len(rs.files) == 3
        assert rs.torn_tails == ["g6/records-g6-w0.jsonl: 24 bytes after the last complete record"]
        assert [s.fleet for s in rs.summaries.values()] == ["inf2"]
        there = build_report(
            ReportInputs(m, f"s3://{BUCKET}/{PREFIX}/", out_dir=tmp_path / "s3", with_pages=False)
        ).model_dump(mode="json")
    for k in ("fleets", "monthly_delta_usd", "monthly_delta_ci_usd", "decision"):
        assert there[k] == here[k], k
    assert rs.count() == 150 + 120 + 40


def test_s3_records_of_another_manifest_are_refused_by_uri(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    import boto3

    m = manifest(manifest_data)
    write_jsonl(tmp_path / "r" / "records-g6-w0.jsonl", [rec(m, "g6", i, digest="0" * 64) for i in range(3)])
    with moto_server("us-east-1"):
        _upload(tmp_path / "r", boto3.client("s3"))
        with pytest.raises(DigestMismatch, match=f"s3://{BUCKET}/{PREFIX}/records-g6-w0.jsonl"):
            load_records(f"s3://{BUCKET}/{PREFIX}", m.digest)
        with pytest.raises(EmptyWindow, match="s3://campaign-results/runs/none"):
            load_records(f"s3://{BUCKET}/runs/none", m.digest)
