"""Run summaries: computed from the raw records (never by averaging per-worker percentiles)."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.quantiles import interpolated_quantile
from core.records import COMPLETED_OUTCOMES, Outcome, RequestRecord, RunSummary


class CpuMeter:
    """This process's CPU time over wall time, in percent of one core."""

    def __init__(self) -> None:
        self._cpu0 = self._cpu()
        self._wall0 = time.monotonic()

    @staticmethod
    def _cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def percent(self) -> float:
        wall = time.monotonic() - self._wall0
        return 100.0 * (self._cpu() - self._cpu0) / wall if wall > 0 else 0.0


@dataclass(frozen=True)
class SummaryInputs:
    campaign: str
    manifest_digest: str
    fleet: str
    max_lag_p99_s: float


def summarize(
    inp: SummaryInputs,
    records: Iterable[RequestRecord],
    scheduled_ids: Iterable[int],
    *,
    client_cpu_percent: float,
    started_at: float,
    ended_at: float,
    extra_invalid: Sequence[str] = (),
) -> RunSummary:
    expected = set(scheduled_ids)
    seen: dict[int, RequestRecord] = {}
    dupes = 0
    for r in records:
        if r.request_id in seen:
            dupes += 1
        seen[r.request_id] = r
    recs = [seen[i] for i in sorted(seen) if i in expected]
    completed = sum(r.outcome in COMPLETED_OUTCOMES for r in recs)
    not_sent = sum(r.outcome == Outcome.NOT_SENT.value for r in recs)
    failed = len(recs) - completed - not_sent
    lags = [r.send_lag_s for r in recs if r.send_lag_s is not None]
    ok = [r for r in recs if r.outcome == Outcome.OK.value]
    with_usage = [r for r in ok if r.server_output_tokens is not None]
    # Against the requested length, not content chunks (a chunk may carry several tokens).
    mismatches = sum(r.server_output_tokens != r.max_tokens for r in with_usage)
    # Any response with usage counts here: the prompt was tokenized even if generation failed.
    prompt_pairs = [r for r in recs if r.server_prompt_tokens is not None and r.client_prompt_tokens is not None]
    prompt_mismatches = sum(r.server_prompt_tokens != r.client_prompt_tokens for r in prompt_pairs)
    reasons = list(extra_invalid)
    if not expected:
        reasons.append("the schedule is empty: nothing was measured (check workload.window against the trace)")
    lag_p99 = interpolated_quantile(lags, 0.99)
    if lag_p99 > inp.max_lag_p99_s:
        reasons.append(
            f"schedule lag p99 {lag_p99 * 1000:.1f} ms > bound {inp.max_lag_p99_s * 1000:.1f} ms: the client was measured"
        )
    missing = expected - set(seen)
    if missing:
        reasons.append(f"{len(missing)} scheduled requests have no record (first: {min(missing)})")
    strays = set(seen) - expected
    if strays:
        reasons.append(f"{len(strays)} records for requests not in the schedule")
    if dupes:
        reasons.append(f"{dupes} duplicate records")
    s = RunSummary(
        campaign=inp.campaign,
        manifest_digest=inp.manifest_digest,
        fleet=inp.fleet,
        scheduled=len(expected),
        completed=completed,
        failed=failed,
        not_sent=not_sent,
        warmup_excluded=sum(r.warmup for r in recs),
        schedule_lag_p50_s=interpolated_quantile(lags, 0.5),
        schedule_lag_p99_s=lag_p99,
        client_cpu_percent=client_cpu_percent,
        valid=False,
        invalid_reasons=reasons,
        token_count_mismatch_rate=mismatches / len(with_usage) if with_usage else 0.0,
        prompt_token_mismatch_rate=prompt_mismatches / len(prompt_pairs) if prompt_pairs else 0.0,
        started_at=started_at,
        ended_at=ended_at,
    )
    if not s.invariant_holds():
        reasons.append(
            f"invariant broken: scheduled {s.scheduled} != completed {completed} + failed {failed} + not_sent {not_sent}"
        )
    s.valid = not reasons
    return s


def load_summary(path: Path) -> RunSummary:
    return RunSummary(**json.loads(path.read_text(encoding="utf-8")))
