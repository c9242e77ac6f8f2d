"""The per-request record: the contract between the load generator and the analysis.

One JSON object per line (JSONL). The loadgen writes it, the analysis reads it; both import
this module so the field names cannot drift. Times are seconds. `scheduled_s` and `sent_s`
are offsets from the run's start on the loadgen's monotonic clock; `wall_start` is the
run's start as Unix time, for aligning with Prometheus and CloudWatch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.manifest import Slo

RECORD_VERSION = 1
# Beside a replay's, a capacity step's or a settle segment's records, what the runner counted: per
# fleet, every poll of the instances serving it and where the count comes from
# ({"<fleet>": {"instances": fewest, "source": "measured", "polls": [[unix s, n], ...], "detail": "..."}});
# the analysis divides that step's goodput by the polls' time-weighted mean over its load window
# (analysis.sources.instances) instead of the run's instance count.
INSTANCES_FILE = "instances.json"


def add_instance_counts(dest: Path, counted: Mapping[str, Mapping[str, Any]]) -> Path:
    """These fleets' entries into dest/INSTANCES_FILE, beside the other fleets' already there."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / INSTANCES_FILE
    earlier = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(json.dumps({**earlier, **counted}, indent=2), encoding="utf-8")
    return path


def constant_count(instances: int, start: float, end: float, detail: str) -> dict[str, Any]:
    """An entry for a runner whose instances cannot drop out (the local emulators, the simulated
    fleets): the same count polled as the step starts and ends."""
    return {
        "instances": instances,
        "source": "measured",
        "polls": [[start, instances], [end, instances]],
        "detail": detail,
    }


class Outcome(StrEnum):
    OK = "ok"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    TRUNCATED = "truncated"  # stream ended without a finish reason / [DONE]
    CONNECTION_ERROR = "connection_error"
    QUALITY_FAIL = "quality_fail"
    # The stream completed and usage reports output tokens, but no chunk carried text (e.g. a
    # model emitting only special tokens): no first token to time, and nothing usable.
    NO_TEXT = "no_text"
    NOT_SENT = "not_sent"  # scheduled but never sent (run stopped, worker died)
    # A capacity step's client gave up on the request once it could no longer meet its own SLO
    # (`--slo-deadline`: TTFT target + output tokens x ITL target after its scheduled time). An
    # SLO miss, not an error: left to run, it would have finished late, over a latency target,
    # and counted against the P95 (see analysis.measure.goodput.LATENCY_SQL), not the error ceiling.
    SLO_ABANDONED = "slo_abandoned"


# The one definition of the outcome groups (loadgen summary, progress, analysis, quality layers).
# Completed: a whole response came back (finish reason, [DONE]), usable or not.
COMPLETED_OUTCOMES = frozenset({Outcome.OK.value, Outcome.QUALITY_FAIL.value, Outcome.NO_TEXT.value})
# Errors: the exchange itself failed (they make the fleet's error rate).
ERROR_OUTCOMES = frozenset(
    {Outcome.HTTP_ERROR.value, Outcome.TIMEOUT.value, Outcome.TRUNCATED.value, Outcome.CONNECTION_ERROR.value}
)
# Invalid responses: something came back but cannot be used.
INVALID_RESPONSE_OUTCOMES = frozenset({Outcome.TRUNCATED.value, Outcome.QUALITY_FAIL.value, Outcome.NO_TEXT.value})


def latency_values(
    outcome: str, ttft_s: float | None, itl_s: float | None, e2e_s: float | None, max_tokens: int
) -> tuple[float | None, float | None]:
    """(TTFT, ITL) a record contributes to the latency percentiles: its own, or for a request
    abandoned on its SLO deadline the lower bounds of analysis.measure.goodput.LATENCY_SQL (the same
    rule, for the readers that follow records as they are written)."""
    if outcome != Outcome.SLO_ABANDONED.value or e2e_s is None:
        return ttft_s, itl_s
    if ttft_s is None:
        return e2e_s, itl_s
    if max_tokens > 1:
        return ttft_s, max(itl_s or 0.0, (e2e_s - ttft_s) / (max_tokens - 1))
    return ttft_s, itl_s


@dataclass
class RequestRecord:
    campaign: str
    manifest_digest: str
    fleet: str
    request_id: int  # index in the normalized schedule; identical across fleets
    worker: str
    wall_start: float  # run start, Unix seconds
    scheduled_s: float
    sent_s: float | None
    send_lag_s: float | None  # sent_s - scheduled_s: the client's own queueing, kept visible
    ttft_s: float | None  # scheduled send -> first output token (docs/design.md)
    # Mean interval between consecutive output tokens: (last token - first token) / (server
    # output tokens - 1); see `itl_basis` and loadgen.recording.inter_token_latency.
    itl_s: float | None
    itl_max_s: float | None  # largest gap between content chunks (how output arrived; not ITL)
    e2e_s: float | None  # scheduled send -> last token
    input_tokens: int  # requested prompt length from the trace (after clipping)
    max_tokens: int  # requested output length
    # Chunks that carried text. Not a token count where the server packs several tokens into a
    # chunk (vLLM does); it stands in for one only when the server reports no usage.
    client_output_tokens: int
    server_prompt_tokens: int | None  # usage reported by the server
    server_output_tokens: int | None
    finish_reason: str | None
    outcome: str  # Outcome value
    http_status: int | None
    error: str | None
    slo_ok: bool  # this request met the per-request TTFT and ITL SLO
    warmup: bool
    # Prompt tokens of what was sent, counted with the manifest's tokenizer and template; the
    # server's prompt_tokens should equal it (a mismatch means a wrong tokenizer or template).
    client_prompt_tokens: int | None = None
    # Times this request was re-sent after a failure. The open-loop replayer never retries (a
    # failure is recorded as it happened), so it writes 0; a client that does retry counts them
    # here, and the quality gate holds the share of retried requests to slo.max_retry_rate.
    retries: int = 0
    # How itl_s was computed: "server_tokens" (first-to-last content span over the server's
    # output tokens - 1) or "chunks" (mean gap between content chunks: no usage was reported);
    # None when there is no interval to measure.
    itl_basis: str | None = None
    record_version: int = RECORD_VERSION

    @property
    def output_tokens(self) -> int:
        """Server usage where available (it is what is billed), else the client's count."""
        return self.server_output_tokens if self.server_output_tokens is not None else self.client_output_tokens

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        optional = {f.name for f in fields(cls) if f.default is not MISSING}
        missing = names - set(d) - optional
        if missing:
            raise ValueError(f"record is missing fields: {', '.join(sorted(missing))}")
        return cls(**{k: v for k, v in d.items() if k in names})


def slo_deadline_s(slo: Slo, output_tokens: int) -> float:
    """Seconds after its scheduled send by which a request has certainly missed its SLO: the TTFT
    target plus every output token at the ITL target. A capacity step
    abandons a request then (loadgen's slo_deadline), and so does its simulation."""
    return float(slo.ttft_p95_s + output_tokens * slo.itl_p95_s)


def split_torn_tail(data: bytes) -> tuple[bytes, int]:
    """(the complete records, bytes cut): every record ends with a newline (the loadgen writes
    whole lines), so what follows the last newline is a record cut mid-write (a worker killed,
    a disk full), even when it happens to parse. The one rule both readers apply: the run
    summary's (loadgen.recording.read_records) and the analysis's (analysis.sources.records)."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], len(data) - cut


@dataclass
class RunSummary:
    """Written next to the records at the end of a run; the invariant is checked before it is."""

    campaign: str
    manifest_digest: str
    fleet: str
    scheduled: int
    completed: int  # outcome ok or quality_fail: a response came back whole
    failed: int
    not_sent: int
    warmup_excluded: int
    schedule_lag_p50_s: float
    schedule_lag_p99_s: float
    client_cpu_percent: float
    valid: bool  # False when lag p99 exceeded the manifest bound: the client, not the server, was measured
    invalid_reasons: list[str]
    # Share of ok requests with server usage whose output tokens differ from the requested length
    # (an answer that ended early where the stack cannot force the length, e.g. TGI).
    token_count_mismatch_rate: float
    started_at: float
    ended_at: float
    # Share of requests with server usage whose prompt_tokens differ from the client's count.
    prompt_token_mismatch_rate: float = 0.0

    def invariant_holds(self) -> bool:
        return self.scheduled == self.completed + self.failed + self.not_sent

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)
