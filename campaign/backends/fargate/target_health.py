"""How many of a fleet's instances serve: the NLB's own view, ELBv2 DescribeTargetHealth on the
fleet's target group.

A fleet is ready when every instance the campaign measures (`fleets[].measure_instances`) is
healthy there, not when the first request through the NLB answers: an instance that still
downloads or compiles counts as InService in its Auto Scaling group during the health-check
grace (EC2 Auto Scaling user guide, "Health check grace period"), but the NLB routes to healthy
targets only (ELB user guide, "Target health status": initial, healthy, unhealthy, unused,
draining, unavailable; only `healthy` receives new connections). The same count, polled while a
replay or a capacity step runs, gives the instances that step really ran on: every poll is kept,
and per-instance capacity divides by their time-weighted mean over the step's load window
(analysis.sources.instances; AWS/NetworkELB HealthyHostCount is the same count at one-minute
resolution, too coarse for a one-minute step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import EXIT_FAILED_STEP, CampaignError

HEALTHY = "healthy"


class TargetHealthError(CampaignError, RuntimeError):
    """DescribeTargetHealth could not be read (permissions, a deleted target group)."""

    exit_code = EXIT_FAILED_STEP


@dataclass(frozen=True)
class HealthCount:
    healthy: int
    states: dict[str, int]  # every target's state (and reason) -> how many

    def describe(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in sorted(self.states.items())) or "no target registered"


def count_healthy(elbv2: Any, target_group_arn: str) -> HealthCount:
    try:
        resp = elbv2.describe_target_health(TargetGroupArn=target_group_arn)
    except Exception as exc:  # botocore ClientError, endpoint errors: say which group and why
        raise TargetHealthError(f"DescribeTargetHealth {target_group_arn}: {type(exc).__name__}: {exc}") from None
    states: dict[str, int] = {}
    for d in resp.get("TargetHealthDescriptions", []):
        th = d.get("TargetHealth", {})
        key = str(th.get("State", "unknown"))
        if th.get("Reason") and key != HEALTHY:
            key += f" ({th['Reason']})"
        states[key] = states.get(key, 0) + 1
    return HealthCount(states.get(HEALTHY, 0), states)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    after_s: float
    seen: str  # the last poll's states, for the operator when the fleet never came up


def wait_all_healthy(
    elbv2: Any,
    target_group_arn: str,
    want: int,
    timeout_s: float,
    *,
    poll_s: float = 15.0,
    say: Callable[[str], None] = lambda line: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Readiness:
    """Until `want` targets are healthy at once, or `timeout_s`; says each change of the count."""
    t0 = clock()
    last: HealthCount | None = None
    while True:
        now = count_healthy(elbv2, target_group_arn)
        if last is None or now.states != last.states:
            say(f"{now.healthy} of {want} healthy ({now.describe()}) after {clock() - t0:.0f} s")
        last = now
        if now.healthy >= want:
            return Readiness(True, clock() - t0, now.describe())
        if clock() - t0 + poll_s > timeout_s:
            return Readiness(False, clock() - t0, f"{now.healthy} of {want} healthy: {now.describe()}")
        sleep(poll_s)


@dataclass
class FewestHealthy:
    """Every poll of one fleet's healthy targets over a replay, a step or a settle segment; the
    analysis divides its goodput by their time-weighted mean over its load window
    (analysis.sources.instances), and the fewest seen stays for the log."""

    elbv2: Any
    target_group_arn: str
    fewest: int | None = None
    polls: int = 0
    errors: list[str] = field(default_factory=list)
    first_poll: float | None = None  # unix seconds: the window the count covers
    last_poll: float | None = None
    series: list[tuple[float, int]] = field(default_factory=list)  # (unix seconds, healthy), every poll

    def poll(self) -> None:
        try:
            n = count_healthy(self.elbv2, self.target_group_arn).healthy
        except TargetHealthError as exc:  # one missed poll is a gap in the count, not the end of the step
            self.errors.append(str(exc))
            return
        self.polls += 1
        self.fewest = n if self.fewest is None else min(self.fewest, n)
        self.last_poll = time.time()
        self.first_poll = self.first_poll or self.last_poll
        self.series.append((self.last_poll, n))

    def as_dict(self, poll_s: float) -> dict[str, Any]:
        """The step's polls and where they came from (analysis reads them: core.records.INSTANCES_FILE)."""
        return {
            "instances": self.fewest,
            "source": "measured",
            "from": self.first_poll,
            "to": self.last_poll,
            "polls": [[t, n] for t, n in self.series],
            "detail": f"healthy targets of the fleet's NLB target group, {self.polls} DescribeTargetHealth polls "
            f"every {poll_s:g} s while it ran (polls: [Unix seconds UTC, healthy])"
            + (f"; {len(self.errors)} poll(s) failed: {self.errors[-1]}" if self.errors else ""),
        }


def fewest_healthy(elbv2: Any, target_groups: Mapping[str, str], fleets: list[str]) -> dict[str, FewestHealthy]:
    return {f: FewestHealthy(elbv2, target_groups[f]) for f in fleets if f in target_groups}
