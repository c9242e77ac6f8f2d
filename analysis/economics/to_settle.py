"""The evidence that would settle an undecided decision, in the user's units (report.json `decision.to_settle`).

Aimed at the threshold that decides the action (analysis.economics.decision.Economics.aim): the Go
threshold first (migrate or not), and 0 (Defer or Reject) only once Go is ruled out; never
at the sign of the delta for its own sake. From the measured interval:
- the interval's reach toward the threshold (point - low end when the point is above it,
  high end - point when below; each end against the threshold priced at that end) against
  the point's distance from it. A 95% interval's half-width shrinks as 1/sqrt(n), so
  every fleet needs (reach / distance)^2 times the requests of the step it is sized from
  (its capacity boundary): `requests`, per fleet, in total (core.stats.n_to_settle). A rule
  of thumb for planning the next run, not a guarantee: fleet sizes are integers, and a
  capacity low end taken from another step moves with that step's requests.
- `minutes`: the requests still missing at each fleet's measured request rate on that step
  (its requests / arrival span), plus the drain of its last requests (that step's median
  lifetime) and the load generator's start and stop (the search's median step overhead: on AWS,
  Fargate tasks), as the settle phase's budget counts them; the fleets measured side by side:
  the longest fleet's.
- `usd`: for that time, each fleet's instances at the count measured (instances_measured)
  and its On-Demand hourly price (the report's price source, `provenance.prices.instance.*`),
  plus its load-generator tasks (a Locust master and loadgen.workers workers per fleet, each
  core.cloud_contract.LOADGEN_TASK_VCPU vCPU and LOADGEN_TASK_MEMORY_GIB GiB, at the Fargate
  prices in `provenance.prices.fargate_*`), prorated by the minute.
Fleet sizes are whole instances, so the delta's end moves only when a fleet's count at the
capacity end it is priced from moves: each fleet also needs the requests that would move that end
past the next instance boundary toward the point (the same 1/sqrt(n) rule on the end's distance
from the point), and a capacity low end borrowed from a lower step (the sizing step held the SLO
only at its point estimate) needs the sizing step to hold it with 95% confidence first
(core.stats.n_to_hold). A fleet whose end already sizes it as the point does needs none: no
requests there move the delta. `requests` per fleet is the larger of the two rules (`whole_instances`).
When an end the threshold needs is unknown (no step held the SLO with 95% confidence), no
ratio exists: a fleet with that unknown end needs the requests at which its sizing step would
hold the SLO with 95% confidence if its requests keep missing the targets at the shares they
did (core.stats.n_to_hold: the P95's upper bound, an order statistic, falls within the target
once enough requests lie below it), at least core.stats.min_n_bounded_upper(); the figures are
marked `lower_bound`: the interval's width after that is not yet known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from analysis.economics.decision import Aim, Economics
from analysis.model import Report, ToSettle, ToSettleFleet
from core import stats
from core.cloud_contract import loadgen_task_hourly_usd
from core.manifest import Manifest


@dataclass(frozen=True)
class FleetBasis:
    """What one fleet's figures are computed from: the step it is sized from, as measured."""

    requests: int  # non-warmup requests of the step the fleet is sized from (its capacity boundary)
    rate_req_s: float | None  # that step's requests / its arrival span, over all the instances measured
    instances: int  # instances in service while it was measured
    instance_hourly_usd: float | None  # On-Demand, from the report's price source; None: no price
    loadgen_tasks: int  # Fargate tasks that drive the fleet (one master + the workers)
    loadgen_task_hourly_usd: float | None  # one task's hourly price; None: no Fargate price
    end_known: bool = True  # False: the fleet's capacity interval has an unknown end
    # With an unknown end: the requests at which its sizing step would hold the SLO with 95%
    # confidence at the shares of requests it missed the targets by (core.stats.n_to_hold).
    hold_requests: int | None = None
    # "baseline" or "candidate": which capacity end the delta's reaching end is priced from (the
    # baseline's low capacity and the candidate's high capacity price the delta's high end).
    role: Literal["baseline", "candidate"] | None = None
    # Per capacity end (low, high): the requests at the sizing step before that end can move the
    # fleet's instance count toward the point (a borrowed low end: the step's hold requests);
    # None at an end: no requests at this step move it. None: whole instances not modelled.
    end_requests: tuple[int | None, int | None] | None = None
    drain_s: float = 0.0  # the sizing step's median request lifetime: the last requests' drain
    overhead_s: float = 0.0  # the search's median step overhead (analysis.capacity.steps.median_overhead_s)


def measuring_hourly_usd(
    instances: int, instance_hourly_usd: float | None, loadgen_tasks: int, loadgen_task_hourly_usd: float | None
) -> float | None:
    """USD an hour of measuring a fleet costs on the cloud: its instances at the On-Demand price and
    the load-generator tasks that drive it (none counted without a Fargate price); None: no
    instance price."""
    if instance_hourly_usd is None:
        return None
    return instances * instance_hourly_usd + loadgen_tasks * (loadgen_task_hourly_usd or 0.0)


def report_hourly_usd(rep: Report, m: Manifest) -> dict[str, float | None]:
    """Per fleet, measuring_hourly_usd from the report's own inputs, for a decided report too (which
    has no to_settle): its instances_measured and the prices its provenance records
    (`prices.instance.<type>`, `prices.fargate_*`)."""

    def value(key: str) -> float | None:
        entry = rep.provenance.get(key)
        return None if entry is None or entry.value is None else float(entry.value)

    vcpu, gib = value("prices.fargate_vcpu_hour"), value("prices.fargate_gb_hour")
    task = None if vcpu is None or gib is None else loadgen_task_hourly_usd(vcpu, gib)
    out: dict[str, float | None] = {}
    for f in m.fleets:
        row = rep.fleets.get(f.name)
        instances = row.instances_measured if row is not None else None
        out[f.name] = measuring_hourly_usd(
            instances or 0, value(f"prices.instance.{f.instance_type}"), m.loadgen.workers + 1, task
        )
    return out


def _reach(e: Economics, aim: Aim) -> tuple[float | None, float] | None:
    """(the interval's reach toward the threshold, the point's distance from it); reach None: the end
    it needs is unknown; None: the point is on the threshold (no sample settles it). The reach is the
    delta's low end when the point is above the threshold, its high end when below."""
    if aim == "go":
        point = e.delta - e.go_threshold
        low = None if e.low is None else e.low - e.go_threshold_low
        high = None if e.high is None else e.high - e.go_threshold_high
    else:
        point, low, high = e.delta, e.low, e.high
    if point > 0:
        return (None if low is None else point - low), point
    if point < 0:
        return (None if high is None else high - point), -point
    return None


def _minutes(more: int | None, b: FleetBasis) -> float | None:
    """The missing requests' arrivals at the step's rate, their drain and the runner's overhead."""
    if more is None or not b.rate_req_s:
        return None
    return (more / b.rate_req_s + b.drain_s + b.overhead_s) / 60.0 if more else 0.0


def to_settle(e: Economics, aim: Aim, fleets: Mapping[str, FleetBasis], loadgen_price_source: str) -> ToSettle:
    """report.json's `decision.to_settle` (analysis.model.ToSettle) for an undecided decision."""
    threshold = e.go_threshold if aim == "go" else 0.0
    rd = _reach(e, aim)
    factor: float | None = None
    unknown = rd is not None and rd[0] is None
    whole = False
    requests: dict[str, int | None] = {}
    for name, b in fleets.items():
        if rd is None:
            requests[name] = None  # on the threshold: no sample size settles it
        elif rd[0] is None:
            requests[name] = (
                b.requests if b.end_known else max(b.requests, b.hold_requests or stats.min_n_bounded_upper())
            )
        else:
            reach, distance = rd[0], rd[1]
            factor = (reach / distance) ** 2
            need = continuous = stats.n_to_settle(b.requests, reach, distance)
            end = _capacity_end(b, via_high=_point_below(e, aim))
            if end is not None and continuous is not None:
                floor = b.end_requests[end] if b.end_requests is not None else None
                need = b.requests if floor is None else max(continuous, floor)
                whole = whole or need != continuous
            requests[name] = need
    by_fleet: dict[str, ToSettleFleet] = {}
    for name, b in fleets.items():
        need = requests[name]
        more = None if need is None else max(need - b.requests, 0)
        minutes = _minutes(more, b)
        hourly = measuring_hourly_usd(b.instances, b.instance_hourly_usd, b.loadgen_tasks, b.loadgen_task_hourly_usd)
        usd = None if minutes is None or hourly is None else minutes / 60.0 * hourly
        by_fleet[name] = ToSettleFleet(
            requests_now=b.requests,
            more_requests=more,
            rate_req_s=b.rate_req_s,
            minutes=minutes,
            drain_s=b.drain_s,
            overhead_s=b.overhead_s,
            instances=b.instances,
            instance_hourly_usd=b.instance_hourly_usd,
            loadgen_tasks=b.loadgen_tasks,
            loadgen_task_hourly_usd=b.loadgen_task_hourly_usd,
            usd=usd,
        )
    minutes_all = [f.minutes for f in by_fleet.values()]
    usd_all = [f.usd for f in by_fleet.values()]
    return ToSettle(
        threshold=aim,
        threshold_usd_per_month=threshold,
        factor=factor,
        lower_bound=unknown,
        requests=requests,
        minutes=None if None in minutes_all or not minutes_all else max(m for m in minutes_all if m is not None),
        usd=None if None in usd_all or not usd_all else math.fsum(u for u in usd_all if u is not None),
        by_fleet=by_fleet,
        basis=_basis(aim, rd, loadgen_price_source),
        whole_instances=whole,
    )


def requests_to_move_end(n: int, point: float, end: float, count: Callable[[float], int]) -> int | None:
    """Requests at a step of n whose capacity interval end `end` (point estimate `point`) would move
    the fleet's instance count at that end toward the point's, the half-width shrinking as
    1/sqrt(n); None: the end already sizes the fleet as the point does (no requests move it).
    `count(capacity)`: the fleet's instances for a per-instance capacity (non-increasing in it)."""
    at_end = count(end)
    if at_end == count(point):
        return None
    near, far = end, point  # the boundary lies between: count(near) is the end's, count(far) is not
    for _ in range(100):
        mid = (near + far) / 2
        if count(mid) == at_end:
            near = mid
        else:
            far = mid
        if abs(far - near) <= 1e-9 * max(abs(point), 1.0):
            break
    return stats.n_to_settle(n, abs(end - point), abs(far - point)) or n


def _point_below(e: Economics, aim: Aim) -> bool:
    return (e.delta - e.go_threshold if aim == "go" else e.delta) < 0


def _capacity_end(b: FleetBasis, *, via_high: bool) -> int | None:
    """Index (0 low, 1 high) of the fleet's capacity end that prices the delta's reaching end; None:
    whole instances not modelled for it. delta = baseline - candidate: its high end takes the
    baseline's dearest fleet (low capacity) and the candidate's cheapest (high capacity)."""
    if b.role is None or b.end_requests is None:
        return None
    low_for_baseline = via_high
    return 0 if (b.role == "baseline") == low_for_baseline else 1


def _basis(aim: Aim, rd: tuple[float | None, float] | None, loadgen_price_source: str) -> str:
    target = "the Go threshold (migrate or not)" if aim == "go" else "0 (Defer or Reject; Go is ruled out)"
    if rd is None:
        how = "the point estimate is on the threshold: no sample size settles it"
    elif rd[0] is None:
        how = (
            "an end of the interval is unknown, so no ratio exists: a fleet whose capacity low end is unknown needs its sizing "
            "step to hold the SLO at its P95 intervals' high ends, which takes the requests at which the order-statistic bound "
            "falls within the target if requests keep missing it at the shares they did (core.stats.n_to_hold), at least "
            f"{stats.min_n_bounded_upper()} (lower bounds)"
        )
    else:
        how = (
            "requests = the sizing step's requests x (the interval's reach toward the threshold / the point's distance from it)^2, "
            "the half-width shrinking as 1/sqrt(n): a planning rule of thumb; fleets are whole instances, so each fleet needs at "
            "least the requests that move the capacity end the delta's end is priced from past its next instance boundary "
            "toward the point (by the same rule; a low end borrowed from a lower step: its sizing step's requests to hold the "
            "SLO with 95% confidence, core.stats.n_to_hold), and none when that end already sizes the fleet as the point does"
        )
    return (
        f"aimed at {target}; {how}; minutes: the missing requests at each fleet's measured rate on its sizing step, fleets "
        "side by side (the longest); usd: that time of each fleet's instances as measured at its On-Demand price "
        f"(provenance prices.instance.*) plus its load-generator tasks ({loadgen_price_source})"
    )


def settle_text(ts: ToSettle, unknown: list[str] | None = None) -> str:
    """The sentence a Defer reason ends with: what would settle it, in the user's units; `unknown`:
    why a fleet's capacity end is unknown (the interval's notes)."""
    req = ts.requests
    now = {name: f.requests_now for name, f in ts.by_fleet.items()}
    if all(v is None for v in req.values()):
        return "the point estimate is on the threshold: no sample size settles it"
    per = ", ".join(f"{name} {'?' if n is None else f'{n:,}'} (now {now[name]:,})" for name, n in req.items())
    cost = ""
    if ts.minutes is not None:
        cost = (
            f": about {ts.minutes:,.1f} min"
            + (f" and {ts.usd:,.2f} USD" if ts.usd is not None else "")
            + " at the measured rates"
        )
    if ts.lower_bound:
        why = f" ({'; '.join(unknown)})" if unknown else ""
        return (
            f"an end is unknown{why}; a sizing step holds the SLO with 95% confidence once its P95 intervals' high ends are "
            f"within the targets, which at the shares of requests that missed them takes at least {per} requests at each capacity "
            f"boundary{cost} (decision.to_settle)"
        )
    if ts.whole_instances:
        return (
            f"fleets move in whole instances: the requests at each capacity boundary that would move the end that decides "
            f"are {per}{cost} (decision.to_settle)"
        )
    return f"about {ts.factor:.1f}x the requests at each capacity boundary would settle it: {per}{cost} (decision.to_settle)"
