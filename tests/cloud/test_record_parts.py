"""A cloud worker's records flushed as new objects, one part per flush (loadgen.recording.RecordParts),
and every reader of them on a moto S3: each record read once, in the order it was written, nothing
lost that was uploaded, including from a worker that died between flushes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from analysis.sources.records import load_records
from campaign.aws.s3_trees import download_run
from campaign.stages.progress import RecordTail
from core.manifest import Manifest, load_manifest
from core.records import RequestRecord
from core.schedule import ScheduledRequest, build_schedule, partition
from loadgen.launch import merge_worker_outputs, run_fleet
from loadgen.recording import (
    RecordContext,
    RecordParts,
    RecordSink,
    in_stream_order,
    not_sent_record,
    read_records,
    records_name,
    records_part_name,
    summary_name,
)
from loadgen.summary import SummaryInputs, summarize
from tests.conftest import moto_server, write_manifest
from tests.loadgen.conftest import small_manifest_data
from tests.loadgen.sse_server import serving

BUCKET = "results-parts"
STEP = f"s3://{BUCKET}/runs/20261203T143000Z-1a2b3c/capacity/g6/x2"


def _bucket() -> Any:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    # as the stacks' results bucket: every overwrite would keep the old version
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return s3


def _versions(s3: Any, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in s3.list_object_versions(Bucket=BUCKET, Prefix=prefix).get("Versions", []):
        out[v["Key"]] = out.get(v["Key"], 0) + 1
    return out


def _ctx(m: Manifest, worker: str) -> RecordContext:
    return RecordContext(m.campaign, m.digest, "g6", worker, 1000.0, 0.0, m.slo.ttft_p95_s, m.slo.itl_p95_s)


def _line(m: Manifest, req: ScheduledRequest, worker: str = "w0") -> str:
    return not_sent_record(_ctx(m, worker), req, "stand-in record").to_json() + "\n"


class _Flaky:
    """An S3 client whose next put fails: before storing (`landed=False`) or after (`landed=True`,
    a timeout once the object was written)."""

    def __init__(self, s3: Any) -> None:
        self.s3 = s3
        self.fail: bool | None = None  # None: work; False/True: fail once, not landed / landed

    def put_object(self, **kw: Any) -> Any:
        landed, self.fail = self.fail, None
        if landed is None:
            return self.s3.put_object(**kw)
        if landed:
            self.s3.put_object(**kw)
        raise ConnectionError("read timeout")


@pytest.fixture
def small(tmp_path: Path, manifest_data: dict[str, Any]) -> Manifest:
    return load_manifest(write_manifest(tmp_path, small_manifest_data(manifest_data)))


def test_each_part_holds_the_complete_lines_since_the_last_once(tmp_path: Path, small: Manifest) -> None:
    reqs = build_schedule(small)[:12]
    lines = [_line(small, r) for r in reqs]
    path = tmp_path / records_name("g6", "w0")
    with moto_server("us-east-1"):
        s3 = _bucket()
        flaky = _Flaky(s3)
        parts = RecordParts(path, STEP, "g6", "w0", client=flaky)
        assert parts.flush() is None  # no file yet: no object
        path.write_text("".join(lines[:3]) + lines[3][:25])  # line 3 is being written
        assert parts.flush() == "runs/20261203T143000Z-1a2b3c/capacity/g6/x2/records-g6-w0-p000001.jsonl"
        assert parts.flush() is None  # nothing complete is new: no empty part
        with path.open("a") as fh:
            fh.write(lines[3][25:] + lines[4])
        flaky.fail = False  # the put fails before S3 stores it ...
        with pytest.raises(ConnectionError):
            parts.flush()
        with path.open("a") as fh:
            fh.write(lines[5])
        assert parts.flush().endswith("-p000002.jsonl")  # ... so its lines go in the same part, with the new one
        with path.open("a") as fh:
            fh.write(lines[6] + lines[7])
        flaky.fail = True  # stored, but the worker saw a timeout: the same key again, a superset
        with pytest.raises(ConnectionError):
            parts.flush()
        with path.open("a") as fh:
            fh.write(lines[8])
        assert parts.flush().endswith("-p000003.jsonl")
        with path.open("a") as fh:
            fh.write("".join(lines[9:]))
        assert parts.flush().endswith("-p000004.jsonl")
        prefix = STEP.split("/", 3)[3] + "/"
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"])
        bodies = [s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys]
        versions = _versions(s3, prefix)
    assert parts.keys == keys and len(keys) == 4
    assert bodies == [
        "".join(lines[:3]).encode(),
        "".join(lines[3:6]).encode(),
        "".join(lines[6:9]).encode(),
        "".join(lines[9:]).encode(),
    ]
    assert b"".join(bodies) == path.read_bytes()  # the parts in sequence are the worker's file
    assert [versions[k] for k in keys] == [1, 1, 2, 1]  # only the part whose put seemed to fail was put twice


def _worker(m: Manifest, d: Path, worker: str, reqs: list[ScheduledRequest]) -> tuple[RecordSink, RecordParts]:
    sink = RecordSink(d / records_name("g6", worker), batch=10_000)
    for r in reqs:
        sink.append(not_sent_record(_ctx(m, worker), r, "stand-in record"))
    return sink, RecordParts(sink.path, STEP, "g6", worker)


def _summary(m: Manifest, recs: list[RequestRecord], ids: list[int]) -> str:
    s = summarize(
        SummaryInputs(m.campaign, m.digest, "g6", m.loadgen.max_schedule_lag_p99_s),
        recs,
        ids,
        client_cpu_percent=1.0,
        started_at=0.0,
        ended_at=1.0,
    )
    return s.to_json()


class _Counting:
    def __init__(self, s3: Any) -> None:
        self.s3 = s3
        self.downloads: list[str] = []

    def get_paginator(self, name: str) -> Any:
        return self.s3.get_paginator(name)

    def download_file(self, bucket: str, key: str, path: str) -> None:
        self.downloads.append(key.rsplit("/", 1)[1])
        self.s3.download_file(bucket, key, path)


def test_every_reader_reads_the_parts_as_one_stream_a_dead_worker_s_included(tmp_path: Path, small: Manifest) -> None:
    sched = build_schedule(small)
    mine = {w: partition(sched, 2, i) for i, w in enumerate(("w0", "w1"))}
    assert len(mine["w1"]) >= 6
    local = {w: tmp_path / "task" / w for w in mine}  # each task's own disk
    dest = tmp_path / "operator"
    with moto_server("us-east-1"):
        s3 = counting = _Counting(_bucket())
        # w0 runs to the end: three parts while it runs, the final one, then its summary.
        sink0, parts0 = _worker(small, local["w0"], "w0", [])
        third = len(mine["w0"]) // 3
        for chunk in (mine["w0"][:third], mine["w0"][third : 2 * third]):
            for r in chunk:
                sink0.append(not_sent_record(_ctx(small, "w0"), r, "stand-in record"))
            sink0.flush()
            parts0.flush()
        # w1 uploads one part, writes more, and dies before its next flush.
        half = len(mine["w1"]) // 2
        sink1, parts1 = _worker(small, local["w1"], "w1", mine["w1"][:half])
        sink1.flush()
        parts1.flush()
        for r in mine["w1"][half:]:
            sink1.append(not_sent_record(_ctx(small, "w1"), r, "stand-in record"))
        sink1.flush()  # on its disk, never uploaded

        got = download_run(s3.s3, STEP, dest)  # the operator polls mid-step
        tail = RecordTail(dest, "g6", len(sched))
        seen = tail.poll().not_sent
        assert seen == 2 * third + half

        for r in mine["w0"][2 * third :]:
            sink0.append(not_sent_record(_ctx(small, "w0"), r, "stand-in record"))
        sink0.close()
        parts0.flush()  # the final part ...
        recs0 = list(read_records([sink0.path]))
        summary0 = local["w0"] / summary_name("g6", "w0")
        summary0.write_text(_summary(small, recs0, [r.request_id for r in mine["w0"]]))
        s3.s3.upload_file(str(summary0), BUCKET, f"{STEP.split('/', 3)[3]}/{summary0.name}")  # ... then the summary

        counting.downloads.clear()
        got = download_run(counting, STEP, dest)
        assert sorted(counting.downloads) == ["records-g6-w0-p000003.jsonl", summary0.name]  # only what is new
        assert tail.poll().not_sent == len(mine["w0"]) + half  # the new part read once, nothing twice
        in_place = load_records(STEP, small.digest)
        assert in_place.count() == len(mine["w0"]) + half and not in_place.torn_tails
    names = [p.name for p in in_stream_order(p for p in got if p.name.startswith("records-"))]
    assert names == [f"records-g6-w0-p00000{i}.jsonl" for i in (1, 2, 3)] + ["records-g6-w1-p000001.jsonl"]
    stream = list(read_records(in_stream_order(dest.glob("records-g6-w*.jsonl"))))
    assert [r.request_id for r in stream] == [r.request_id for r in mine["w0"] + mine["w1"][:half]]
    s = merge_worker_outputs(small, "g6", dest)
    lost = len(mine["w1"]) - half
    assert s.not_sent == len(mine["w0"]) + half  # every uploaded record, once
    assert f"{lost} scheduled requests have no record (first: {mine['w1'][half].request_id})" in s.invalid_reasons
    assert not [x for x in s.invalid_reasons if "duplicate" in x]
    assert json.loads((dest / summary_name("g6")).read_text())["scheduled"] == len(sched)


def test_a_worker_s_file_beside_its_parts_is_refused_not_counted_twice(tmp_path: Path) -> None:
    for name in ("records-g6-w0.jsonl", "records-g6-w0-p000001.jsonl", "records-g6-w1-p000001.jsonl"):
        (tmp_path / name).write_text("")
    with pytest.raises(ValueError, match=r"records-g6-w0: both the worker's records file and its uploaded parts"):
        in_stream_order(tmp_path.glob("records-*.jsonl"))
    with pytest.raises(ValueError, match="both the worker's records file"):
        RecordTail(tmp_path, "g6", 10).poll()


def test_the_s3_client_is_made_before_the_schedule_starts_not_at_the_first_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RecordParts is built with the worker (ReplayWorker.__init__), before its schedule's clock
    starts: the S3 client made at the first periodic flush held up the sends due meanwhile."""
    made: list[str] = []
    monkeypatch.setattr(boto3, "client", lambda service, *a, **k: made.append(service) or object())
    RecordParts(tmp_path / "records-g6-w0.jsonl", STEP, "g6", "w0")
    assert made == ["s3"]


def test_a_cloud_worker_flushes_its_records_as_new_parts_then_its_summary(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    """The real Locust replay as a cloud worker runs it, against the SSE test server: a 24 s replay
    uploads two parts while it runs (every RECORDS_UPLOAD_EVERY_S = 10 s) and the final one when it
    stops, into a versioned bucket as the stacks' results bucket is: each part a new object put
    once, together exactly the worker's records file, and no whole-file object. Its subject is the
    parts, not timing: it runs here, beside the replays of the main suite (which it sat in, 30 s)."""
    m = write_manifest(tmp_path, small_manifest_data(manifest_data, time_scale=0.4))
    bucket, run_id = "results-replay", "20261203T143000Z-1a2b3c"
    prefix = f"runs/{run_id}/capacity/g6/x1"
    server = serving(load_manifest(m))
    try:
        with moto_server("us-east-1"):
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket=bucket)
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
            s = run_fleet(
                m,
                "g6",
                server.url,
                tmp_path / "task",
                extra_args=[
                    "--s3-uri",
                    f"s3://{bucket}/runs",
                    "--run-id",
                    run_id,
                    "--records-prefix",
                    "capacity/g6/x1",
                ],
            )
            versions = [v["Key"] for v in s3.list_object_versions(Bucket=bucket, Prefix=prefix + "/")["Versions"]]
            parts = sorted(k for k in versions if k.rsplit("/", 1)[1].startswith("records-"))
            bodies = b"".join(s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in parts)
            download_run(s3, f"s3://{bucket}/{prefix}", tmp_path / "operator")
    finally:
        server.stop()
    assert s.valid and s.completed == s.scheduled, s.invalid_reasons
    assert len(parts) >= 3 and parts == [
        f"{prefix}/{records_part_name('g6', 'w0', i)}" for i in range(1, len(parts) + 1)
    ]
    assert sorted(versions) == sorted({*parts, f"{prefix}/summary-g6-w0.json"})  # each put once
    assert bodies == (tmp_path / "task" / "records-g6-w0.jsonl").read_bytes()
    merged = merge_worker_outputs(load_manifest(m), "g6", tmp_path / "operator")
    assert merged.valid and merged.completed == s.scheduled, merged.invalid_reasons
