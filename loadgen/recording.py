"""Per-request records: building them from a finished stream, and the batched JSONL sink.

Files: `records-<fleet>-<worker>.jsonl`, one per worker, appended in batches (every
`batch` records or `interval_s` seconds) and flushed to the OS each time, so a crashed worker
loses at most its last unflushed batch. A cloud worker also uploads that file as it grows, in
parts (`RecordParts`): `records-<fleet>-<worker>-p<seq>.jsonl`, each a new object holding only
the complete lines written since the part before, so a worker's records are its whole file or
its parts read in sequence (`in_stream_order`), never both.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from core.cloud_contract import split_s3_uri
from core.records import Outcome, RequestRecord, split_torn_tail
from core.schedule import ScheduledRequest
from loadgen.sse import StreamState, Transport, classify


def records_name(fleet: str, worker: str) -> str:
    return f"records-{fleet}-{worker}.jsonl"


def records_part_name(fleet: str, worker: str, seq: int) -> str:
    """Part `seq` (1, 2, ...) of a worker's uploaded records; the number is zero-padded so a
    listing sorts in sequence, but readers order by its value (`in_stream_order`)."""
    return f"records-{fleet}-{worker}-p{seq:06d}.jsonl"


# A worker's records file, whole or one of its parts: records-<fleet>-w<i>[-p<seq>].jsonl
_WORKER_FILE = re.compile(r"^(?P<stream>records-.+-w\d+)(?:-p(?P<seq>\d+))?\.jsonl$")


def in_stream_order(paths: Iterable[Path]) -> list[Path]:
    """Record files ordered as their workers wrote them: per worker its whole file, or its parts by
    sequence number; any other records file on its own, by name. ValueError when a worker has
    both a whole file and parts in one place: its records would count twice."""
    keyed: list[tuple[str, int, Path]] = []
    whole: set[str] = set()
    parted: set[str] = set()
    for p in paths:
        m = _WORKER_FILE.match(p.name)
        stream = str(p.parent / m["stream"]) if m else str(p)
        seq = int(m["seq"]) if m and m["seq"] is not None else -1
        (parted if seq >= 0 else whole).add(stream)
        keyed.append((stream, seq, p))
    both = sorted(whole & parted)
    if both:
        raise ValueError(
            f"{both[0]}: both the worker's records file and its uploaded parts are here; "
            "keep one (a local run writes the file, a cloud download brings the parts)"
        )
    return [p for _stream, _seq, p in sorted(keyed, key=lambda k: (k[0], k[1]))]


def summary_name(fleet: str, worker: str | None = None) -> str:
    return f"summary-{fleet}.json" if worker is None else f"summary-{fleet}-{worker}.json"


# The workers that write a fleet's records: a Locust worker (w<i>), or `campaign plan`'s simulated
# replay (one file per fleet, campaign.backends.simulated.fleets).
SIMULATED_WORKER = "sim"
_WORKER = rf"(?:w\d+|{SIMULATED_WORKER})"


def fleet_records(directory: Path, fleet: str) -> list[Path]:
    """The fleet's own records files in `directory` (whole or parts), by name. Matched on the whole
    name, never a glob on `records-<fleet>-*`: a fleet whose name continues another's would be
    taken with it (records-g6-w* also matches g6-west's records-g6-west-w0.jsonl)."""
    own = re.compile(rf"records-{re.escape(fleet)}-{_WORKER}(?:-p\d+)?\.jsonl")
    return _matching(directory, own)


def worker_summaries(directory: Path, fleet: str) -> list[Path]:
    """The fleet's per-worker summaries in `directory` (summary-<fleet>-w<i>.json), by name;
    not its merged summary, nor another fleet's whose name continues this one's."""
    return _matching(directory, re.compile(rf"summary-{re.escape(fleet)}-{_WORKER}\.json"))


def _matching(directory: Path, name: re.Pattern[str]) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if name.fullmatch(p.name) and p.is_file())


@dataclass(frozen=True)
class RecordContext:
    campaign: str
    manifest_digest: str
    fleet: str
    worker: str
    wall_start: float  # Unix time of t0
    t0: float  # monotonic time the schedule's offsets count from
    ttft_slo_s: float
    itl_slo_s: float


def _identity(ctx: RecordContext, req: ScheduledRequest, prompt_tokens: int | None) -> dict[str, Any]:
    """What every record of a scheduled request carries, sent or not."""
    return {
        "client_prompt_tokens": prompt_tokens,
        "campaign": ctx.campaign,
        "manifest_digest": ctx.manifest_digest,
        "fleet": ctx.fleet,
        "request_id": req.request_id,
        "worker": ctx.worker,
        "wall_start": ctx.wall_start,
        "scheduled_s": req.offset_s,
        "input_tokens": req.input_tokens,
        "max_tokens": req.output_tokens,
        "warmup": req.warmup,
    }


ITL_FROM_SERVER_TOKENS = "server_tokens"
ITL_FROM_CHUNKS = "chunks"


def inter_token_latency(chunk_times: Sequence[float], server_tokens: int | None) -> tuple[float | None, str | None]:
    """Mean interval between consecutive output tokens, and how it was computed.

    With usage: (last token's arrival - first token's arrival) / (server tokens - 1). A chunk
    can carry several tokens and some chunks carry none, so the content chunks' own gaps would
    overstate ITL by the tokens-per-chunk ratio. Without usage, the mean gap between content
    chunks is all there is, and the basis says so."""
    if server_tokens is not None:
        if server_tokens < 2 or not chunk_times:
            return None, None
        return (chunk_times[-1] - chunk_times[0]) / (server_tokens - 1), ITL_FROM_SERVER_TOKENS
    if len(chunk_times) < 2:
        return None, None
    return (chunk_times[-1] - chunk_times[0]) / (len(chunk_times) - 1), ITL_FROM_CHUNKS


def build_record(
    ctx: RecordContext,
    req: ScheduledRequest,
    sent_t: float,
    end_t: float,
    state: StreamState,
    transport: Transport,
    prompt_tokens: int | None = None,
) -> RequestRecord:
    sched_t = ctx.t0 + req.offset_s  # TTFT and E2E count from here: client queueing included
    outcome, reason = classify(transport, state, req.output_tokens)
    times = state.chunk_times
    ttft = times[0] - sched_t if times else None
    itl, itl_basis = inter_token_latency(times, state.server_output_tokens)
    # An abandoned request's e2e is when the client gave up: the latency bounds are read from it.
    e2e = (times[-1] if times and outcome is not Outcome.SLO_ABANDONED else end_t) - sched_t
    slo_ok = (
        outcome is Outcome.OK and ttft is not None and ttft <= ctx.ttft_slo_s and (itl is None or itl <= ctx.itl_slo_s)
    )
    return RequestRecord(
        **_identity(ctx, req, prompt_tokens),
        sent_s=sent_t - ctx.t0,
        send_lag_s=sent_t - sched_t,
        ttft_s=ttft,
        itl_s=itl,
        itl_max_s=state.max_gap(),
        e2e_s=e2e,
        client_output_tokens=state.content_chunks,
        server_prompt_tokens=state.server_prompt_tokens,
        server_output_tokens=state.server_output_tokens,
        finish_reason=state.finish_reason,
        outcome=outcome.value,
        http_status=transport.http_status,
        error=reason,
        slo_ok=slo_ok,
        retries=0,  # never re-sent: see RequestRecord.retries
        itl_basis=itl_basis,
    )


def not_sent_record(
    ctx: RecordContext, req: ScheduledRequest, why: str, prompt_tokens: int | None = None
) -> RequestRecord:
    return RequestRecord(
        **_identity(ctx, req, prompt_tokens),
        sent_s=None,
        send_lag_s=None,
        ttft_s=None,
        itl_s=None,
        itl_max_s=None,
        e2e_s=None,
        client_output_tokens=0,
        server_prompt_tokens=None,
        server_output_tokens=None,
        finish_reason=None,
        outcome=Outcome.NOT_SENT.value,
        http_status=None,
        error=why,
        slo_ok=False,
    )


class RecordSink:
    """JSONL writer for one run's new file, with bounded loss: at most one batch is ever only in memory."""

    def __init__(self, path: Path, *, batch: int = 50, interval_s: float = 1.0, clock: Any = time.monotonic):
        self.path = path
        self.batch = batch
        self.interval_s = interval_s
        self._clock = clock
        self._pending: list[str] = []
        self._last_flush = clock()
        self.written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Exclusive create: a rerun into the same directory must not mix two runs in one
            # file (or write after a crashed run's torn line), nor overwrite what was measured.
            self._fh: IO[str] | None = path.open("x", encoding="utf-8")
        except FileExistsError:
            why = "an earlier run's records are never appended to or overwritten; use a fresh records directory"
            raise FileExistsError(f"{path} already exists: {why}") from None

    def append(self, rec: RequestRecord) -> None:
        self._pending.append(rec.to_json())
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if len(self._pending) >= self.batch or (self._pending and self._clock() - self._last_flush >= self.interval_s):
            self.flush()

    def flush(self) -> None:
        self._last_flush = self._clock()
        if not self._pending or self._fh is None:
            return
        self._fh.write("\n".join(self._pending) + "\n")
        self._fh.flush()  # into the OS: survives the process dying
        self.written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    @property
    def pending(self) -> int:
        return len(self._pending)


def read_records(paths: Iterable[Path]) -> Iterator[RequestRecord]:
    """A run's record files as RequestRecords, for its summary. A torn last line (core.records.
    split_torn_tail) is skipped, not fatal; any other bad line is an error naming file and line.

    The analysis reads the same files through duckdb (analysis.sources.records: columnar, Parquet
    too, millions of records); this reader stays because the load-generator image has no duckdb."""
    import json

    for p in paths:
        complete, _torn = split_torn_tail(p.read_bytes())
        for i, line in enumerate(complete.decode("utf-8").split("\n")[:-1]):
            if not line.strip():
                continue
            try:
                yield RequestRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, ValueError, TypeError):
                raise ValueError(f"{p}:{i + 1}: not a valid record") from None


def _s3_client(client: Any) -> Any:
    if client is None:
        import boto3

        client = boto3.client("s3")
    return client


def upload_to_s3(paths: Iterable[Path], s3_uri: str, client: Any = None) -> list[str]:
    """Copy finished files to s3://bucket/prefix/; returns the object keys written."""
    bucket, prefix = split_s3_uri(s3_uri)
    client = _s3_client(client)
    keys = []
    for p in paths:
        key = f"{prefix}/{p.name}" if prefix else p.name
        client.upload_file(str(p), bucket, key)
        keys.append(key)
    return keys


class RecordParts:
    """Uploads a worker's growing records file to s3://bucket/prefix/ as new objects, each holding
    only the complete lines written since the part before (`records_part_name`). S3 has no append:
    putting the whole file again at every flush, into a versioned bucket that keeps old versions,
    stored a step's records over and over, growing with the square of its length.

    `flush` is idempotent per part: a part whose upload failed (or seemed to) is put again under
    the same key, from the same offset, with whatever was written since, so its key ends up with
    a superset of any earlier attempt and no line is in two parts. Not safe to call concurrently."""

    def __init__(self, path: Path, s3_uri: str, fleet: str, worker: str, client: Any = None) -> None:
        self.path = path
        self.bucket, self.prefix = split_s3_uri(s3_uri)
        self.fleet = fleet
        self.worker = worker
        # Made now, with the Replayer, before its schedule starts (Replayer.run): made at the first
        # flush, the client's service model loading (about 1 s of CPU on a busy core) stalled
        # every send due then, and a step's schedule lag p99 read 1.07 s (offline cloud path).
        self._client = _s3_client(client)
        self.offset = 0  # bytes of the file already in parts
        self.seq = 1  # the number of the next part
        self.keys: list[str] = []  # the parts uploaded, in order

    def flush(self) -> str | None:
        """Upload the lines written since the last part as the next part; its key, or None when
        no complete line is new. An exception leaves the state as it was (the next call retries)."""
        data = self._new_lines()
        if not data:
            return None
        name = records_part_name(self.fleet, self.worker, self.seq)
        key = f"{self.prefix}/{name}" if self.prefix else name
        self._client = _s3_client(self._client)
        self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        self.offset += len(data)
        self.seq += 1
        self.keys.append(key)
        return key

    def _new_lines(self) -> bytes:
        if not self.path.is_file():
            return b""
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete, _torn = split_torn_tail(data)  # a line still being written waits for the next part
        return complete
