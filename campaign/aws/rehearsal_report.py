"""The rehearsal report (issue 51): what a rehearsal proved, one line per AWS seam.

No verdict and no cost comparison: an emulated fleet's figures decide nothing. Each seam says what
was observed (quotas checked, the stack created, instances healthy in N min, the gate, tasks
started per step, records in S3, AMP's answer to signed queries, tags, the deadline action, the
conductor through detach and attach, what teardown left); a failed seam carries the AWS error as
it came and what to fix. `run --rehearsal` exits 0 when every seam it observes passed, 1 naming the
first that did not. A seam observed later (teardown's) is `pending` until its command records it.

The record lives in the results bucket at `campaigns/<campaign>/rehearsal.json`, beside (not under)
the digest prefixes, so that the campaign's own `deploy` (another manifest digest: the
rehearsal's manifest is derived from the campaign's) finds it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, EXIT_OK

# The seams in the order a rehearsal meets them (the first failure is the first in this order).
IMAGES = "images"
QUOTAS = "quotas"
STACK = "stack"
INSTANCES = "instances"
GATE = "gate"
TASKS = "tasks"
RECORDS = "records"
AMP = "amp"
TAGS = "tags"
COST_ALLOCATION = "cost allocation"
DEADLINE = "deadline action"
CONDUCTOR = "conductor"
TEARDOWN = "teardown"
SEAMS = (
    IMAGES,
    QUOTAS,
    STACK,
    INSTANCES,
    GATE,
    TASKS,
    RECORDS,
    AMP,
    TAGS,
    COST_ALLOCATION,
    DEADLINE,
    CONDUCTOR,
    TEARDOWN,
)

RECORD_NAME = "rehearsal.json"


@dataclass(frozen=True)
class Seam:
    name: str  # one of SEAMS
    passed: bool | None  # None: observed by a later command (pending)
    observed: str
    error: str = ""  # the AWS error as it came (its code and message), where one was the cause
    fix: str = ""  # what to change

    def line(self) -> str:
        state = {True: "ok", False: "FAILED", None: "pending"}[self.passed]
        text = f"{self.name:<16} {state:<7} {self.observed}"
        if self.error:
            text += f"\n{'':<24} AWS error: {self.error}"
        if self.fix:
            text += f"\n{'':<24} fix: {self.fix}"
        return text


def failed(name: str, observed: str, exc: BaseException | str, fix: str) -> Seam:
    """A failed seam whose cause is `exc` (a botocore error: its class, code and message, as AWS gave them)."""
    error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return Seam(name, False, observed, error, fix)


@dataclass
class RehearsalReport:
    campaign: str
    manifest_digest: str  # the campaign's manifest (the rehearsal's is derived from it)
    rehearsal_digest: str  # the rehearsal's manifest, whose results prefix holds the run
    run_id: str = ""
    seams: list[Seam] = field(default_factory=list)

    def add(self, seam: Seam) -> Seam:
        if seam.name not in SEAMS:
            raise ValueError(f"unknown seam {seam.name!r}: one of {', '.join(SEAMS)}")
        self.seams = [s for s in self.seams if s.name != seam.name] + [seam]
        self.seams.sort(key=lambda s: SEAMS.index(s.name))
        return seam

    def first_failure(self) -> Seam | None:
        return next((s for s in self.seams if s.passed is False), None)

    @property
    def passed(self) -> bool:
        """Every seam observed passed (pending ones aside)."""
        return bool(self.seams) and self.first_failure() is None

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_FAILED_STEP

    def lines(self) -> list[str]:
        head = f"rehearsal of {self.campaign} (manifest {self.manifest_digest[:12]}, run {self.run_id or 'none'}):"
        out = [head, *(s.line() for s in self.seams)]
        first = self.first_failure()
        if first is not None:
            out.append(f"rehearsal FAILED at {first.name}: {first.error or first.observed}")
        elif self.passed:
            pending = [s.name for s in self.seams if s.passed is None]
            out.append("rehearsal passed" + (f" (pending: {', '.join(pending)})" if pending else ""))
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> RehearsalReport:
        data = json.loads(text)
        seams = [Seam(**s) for s in data.pop("seams", [])]
        return cls(**data, seams=seams)


def record_key(results_uri: str, campaign: str) -> tuple[str, str]:
    """(bucket, key) of the campaign's rehearsal record: campaigns/<campaign>/rehearsal.json."""
    bucket, _ = cc.split_s3_uri(results_uri)
    return bucket, f"campaigns/{campaign}/{RECORD_NAME}"


def put_record(s3: Any, results_uri: str, report: RehearsalReport) -> str:
    bucket, key = record_key(results_uri, report.campaign)
    s3.put_object(Bucket=bucket, Key=key, Body=report.to_json().encode())
    return f"s3://{bucket}/{key}"


def read_record(s3: Any, results_uri: str, campaign: str) -> RehearsalReport | None:
    """The campaign's rehearsal record, or None where there is none."""
    bucket, key = record_key(results_uri, campaign)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return RehearsalReport.from_json(body.decode())
