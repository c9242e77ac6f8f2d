from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from core.records import Outcome, RequestRecord
from core.schedule import ScheduledRequest
from loadgen.recording import RecordContext, RecordSink, build_record, not_sent_record, read_records, upload_to_s3
from loadgen.sse import StreamState, Transport

CTX = RecordContext("c", "d" * 64, "g6", "w0", 1000.0, 50.0, ttft_slo_s=0.5, itl_slo_s=0.05)
REQ = ScheduledRequest(7, 2.0, 100, 3, None, 9, False)


def _state(times: list[float], server_out: int | None = 3) -> StreamState:
    s = StreamState(
        chunk_times=times, finish_reason="length", done=True, server_prompt_tokens=100, server_output_tokens=server_out
    )
    return s


def test_ttft_counts_from_scheduled_time_including_client_queueing() -> None:
    sched = CTX.t0 + REQ.offset_s
    # the client got to send 0.3 s late; the server answered 0.1 s after the send
    sent = sched + 0.3
    r = build_record(
        CTX, REQ, sent, sent + 0.2, _state([sent + 0.1, sent + 0.12, sent + 0.16]), Transport(200, False, None, True)
    )
    assert r.send_lag_s == pytest.approx(0.3)
    assert r.ttft_s == pytest.approx(0.4)  # not 0.1: coordinated omission stays out
    assert r.e2e_s == pytest.approx(0.46)
    assert r.itl_s == pytest.approx(0.03) and r.itl_max_s == pytest.approx(0.04)
    assert r.outcome == "ok" and r.slo_ok
    late = build_record(
        CTX,
        REQ,
        sched + 0.45,
        sched + 1,
        _state([sched + 0.55, sched + 0.56, sched + 0.57]),
        Transport(200, False, None, True),
    )
    assert not late.slo_ok  # the server was fast, but the request waited in the client


def test_client_and_server_counts_both_kept() -> None:
    sched = CTX.t0 + REQ.offset_s
    r = build_record(
        CTX, REQ, sched, sched + 1, _state([sched + 0.1, sched + 0.2], server_out=3), Transport(200, False, None, True)
    )
    assert (r.client_output_tokens, r.server_output_tokens, r.output_tokens) == (2, 3, 3)


def test_itl_is_the_token_span_over_server_tokens() -> None:
    # Two content chunks 0.1 s apart carrying 3 tokens (usage): 2 token intervals in 0.1 s.
    sched = CTX.t0 + REQ.offset_s
    r = build_record(
        CTX, REQ, sched, sched + 1, _state([sched + 0.1, sched + 0.2], server_out=3), Transport(200, False, None, True)
    )
    assert r.itl_s == pytest.approx(0.05) and r.itl_basis == "server_tokens"
    assert r.itl_max_s == pytest.approx(0.1)  # the largest gap between chunks: arrivals, not ITL
    # No usage: the mean gap between content chunks is the only figure, and says so.
    r = build_record(
        CTX,
        REQ,
        sched,
        sched + 1,
        _state([sched + 0.1, sched + 0.2, sched + 0.4], server_out=None),
        Transport(200, False, None, True),
    )
    assert r.itl_s == pytest.approx(0.15) and r.itl_basis == "chunks"
    # One token: no interval at all.
    one = ScheduledRequest(8, 2.0, 100, 1, None, 9, False)
    r = build_record(CTX, one, sched, sched + 1, _state([sched + 0.1], server_out=1), Transport(200, False, None, True))
    assert r.itl_s is None and r.itl_basis is None and r.slo_ok


def test_not_sent_record() -> None:
    r = not_sent_record(CTX, REQ, "not sent: stopped")
    assert r.outcome == Outcome.NOT_SENT.value and r.sent_s is None and not r.slo_ok


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines()) if p.exists() else 0


def test_sink_batches_by_count_and_time(tmp_path: Path) -> None:
    clock = Clock()
    p = tmp_path / "r.jsonl"
    sink = RecordSink(p, batch=5, interval_s=1.0, clock=clock)
    rec = not_sent_record(CTX, REQ, "x")
    for _ in range(4):
        sink.append(rec)
    assert _lines(p) == 0 and sink.pending == 4  # a crash now loses < one batch
    sink.append(rec)
    assert _lines(p) == 5
    sink.append(rec)
    clock.t = 1.5
    sink.maybe_flush()
    assert _lines(p) == 6
    sink.close()
    assert [r.request_id for r in read_records([p])] == [7] * 6


def test_sink_never_appends_to_or_overwrites_an_earlier_run(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    earlier = not_sent_record(CTX, REQ, "earlier run").to_json()
    p.write_text(earlier[:40])  # a crashed run's torn last line
    with pytest.raises(FileExistsError, match=r"r\.jsonl already exists"):
        RecordSink(p)
    assert p.read_text() == earlier[:40]  # untouched


def test_record_carries_the_client_prompt_count() -> None:
    r = build_record(CTX, REQ, 52.0, 53.0, _state([52.5, 52.6, 52.7]), Transport(200, False, None, True), 104)
    assert r.client_prompt_tokens == 104 and r.server_prompt_tokens == 100 and r.input_tokens == 100
    # Records written before the field existed still load.
    old = json.loads(r.to_json())
    del old["client_prompt_tokens"]
    assert RequestRecord.from_dict(old).client_prompt_tokens is None


def test_torn_last_line_is_skipped_but_corruption_is_not(tmp_path: Path) -> None:
    line = not_sent_record(CTX, REQ, "x").to_json()
    p = tmp_path / "r.jsonl"
    p.write_text(line + "\n" + line[:40])
    assert len(list(read_records([p]))) == 1
    p.write_text(line[:40] + "\n" + line + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:1"):
        list(read_records([p]))


def test_both_readers_agree_on_what_is_torn(tmp_path: Path) -> None:
    """A record is whole only with its newline (RecordSink writes whole lines): a last line
    without one was cut mid-write, even when what was cut happens to parse. The run summary
    (read_records) and the analysis (load_records) leave out the same records."""
    from analysis.sources.records import load_records

    line = not_sent_record(CTX, REQ, "x").to_json()
    second = line.replace('"request_id":7,', '"request_id":8,')
    assert second != line
    p = tmp_path / "records-g6-w0.jsonl"
    p.write_text(line + "\n" + second)
    assert [r.request_id for r in read_records([p])] == [7]
    rs = load_records(tmp_path, CTX.manifest_digest)
    assert rs.count() == 1 and rs.torn_tails == [f"{p.name}: {len(second)} bytes after the last complete record"]


def test_records_roundtrip_contract() -> None:
    r = not_sent_record(CTX, REQ, "x")
    assert RequestRecord.from_dict(json.loads(r.to_json())) == r


@mock_aws
def test_s3_upload(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="results")
    f = tmp_path / "records-g6-w0.jsonl"
    f.write_text("{}\n")
    keys = upload_to_s3([f], "s3://results/run-1/", client=s3)
    assert keys == ["run-1/records-g6-w0.jsonl"]
    assert s3.get_object(Bucket="results", Key=keys[0])["Body"].read() == b"{}\n"
    with pytest.raises(ValueError):
        upload_to_s3([f], "results/run-1")
