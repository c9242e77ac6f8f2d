"""The campaign's deadline, held before each stage, capacity step and settle segment: `campaign run`
refuses to start the quality gate or the replay when the plan says it cannot finish before every
fleet's group is set to 0 (the stack's scheduled actions, stacks/fleet.py), and starts no capacity
step or settle segment that the deadline would cut (the search and the settle phase then stop,
saying why, and the run ends with its report), instead of measuring fleets that vanish halfway.
The deadline is read from the stack again each time (StackDeadline), so `deploy --extend-hours`
reaches a run already going. Locally and in a plan there is no stack and no deadline.

The stage names are the keys of the plan's `minutes` breakdown (campaign.plan.predict), so the
guard reads a stage's planned minutes from a saved plan or an in-process one alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.cloud_contract import format_deadline
from core.errors import EXIT_FAILED_STEP, CampaignError

# The stages run_stages guards, by the plan's names for their minutes.
GATE_STAGE = "quality_gate"
REPLAY_STAGE = "replay"
CAPACITY_STAGE = "capacity_searches"
SETTLE_STAGE = "settle_phase"

StageGuard = Callable[[str], None]


class PastDeadline(CampaignError, RuntimeError):
    """A stage would end after the deadline: not started (what ran before it is kept)."""

    exit_code = EXIT_FAILED_STEP


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class DeadlineGuard:
    """Called with a stage's name before it starts; raises PastDeadline when now + the plan's minutes
    for it ends after `deadline`. A stage the plan gives no minutes is not held."""

    deadline: datetime
    stage_minutes: Mapping[str, float]
    clock: Callable[[], datetime] = utc_now

    def __call__(self, stage: str) -> None:
        minutes = self.stage_minutes.get(stage)
        if minutes is None:
            return
        now = self.clock()
        ends = now + timedelta(minutes=minutes)
        if ends > self.deadline:
            raise PastDeadline(
                f"{stage} not started: the plan gives it {minutes:g} min, so from now ({format_deadline(now)}) it "
                f"would end at {format_deadline(ends)}, after the deadline {format_deadline(self.deadline)}, when "
                "every fleet's Auto Scaling group is set to 0; `campaign deploy MANIFEST --extend-hours N` moves the "
                "deadline, then `run` again"
            )


# Asked before each capacity step and settle segment: `what` (the step, in the log's words) and
# the seconds it needs (its arrivals, the drain of its last requests and the load generator's
# start and stop, as the search and the settle phase estimate them); the reason it is not
# started when the deadline would cut it, else None.
StepDeadline = Callable[[str, float], str | None]


class StackDeadline:
    """The stack's deadline, read from the stack again before each stage, capacity step and settle
    segment (`read`), so `campaign deploy --extend-hours N` reaches a run already going, a detached
    conductor's included. `stage`: the DeadlineGuard of the quality gate and the replay (the plan's
    minutes, asked for once, when a deadline is first there to hold them to). `cuts`: a StepDeadline.
    A read that fails keeps the deadline last read (`log` says so): never no deadline at all."""

    def __init__(
        self,
        read: Callable[[], datetime | None],
        stage_minutes: Callable[[], Mapping[str, float]] | None,
        clock: Callable[[], datetime] = utc_now,
        log: Callable[[str], None] = lambda line: None,
        last: datetime | None = None,
    ) -> None:
        self.read, self.stage_minutes, self.clock, self.log = read, stage_minutes, clock, log
        self.last = last
        self._minutes: Mapping[str, float] | None = None
        self._lock = threading.Lock()  # the fleets' searches ask from their own threads

    def current(self) -> datetime | None:
        try:
            at = self.read()
        except Exception as exc:  # botocore: throttling, an expired session; the stack itself stays
            self.log(
                f"deadline: the stack could not be read again ({type(exc).__name__}: {exc}); holding to the last read, "
                f"{format_deadline(self.last) if self.last else 'none'}"
            )
            return self.last
        with self._lock:
            if at != self.last and self.last is not None and at is not None:
                self.log(
                    f"deadline: the stack's deadline is now {format_deadline(at)} (was {format_deadline(self.last)})"
                )
            self.last = at
        return at

    def stage(self, stage: str) -> None:
        deadline = self.current()
        if deadline is None or self.stage_minutes is None:
            return
        with self._lock:
            if self._minutes is None:
                self._minutes = self.stage_minutes()
        DeadlineGuard(deadline, self._minutes, self.clock)(stage)

    def cuts(self, what: str, seconds: float) -> str | None:
        deadline = self.current()
        if deadline is None:
            return None
        now = self.clock()
        ends = now + timedelta(seconds=seconds)
        if ends <= deadline:
            return None
        return (
            f"{what} not started: it needs about {seconds:.0f} s, so from now ({format_deadline(now)}) it would end at "
            f"{format_deadline(ends)}, after the deadline {format_deadline(deadline)}, when every fleet's Auto Scaling "
            "group is set to 0 (`campaign deploy MANIFEST --extend-hours N` moves it, also for a run already going)"
        )
