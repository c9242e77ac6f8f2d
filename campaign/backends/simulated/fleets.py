"""The plan's fleets: the trace replay and the capacity steps run through the emulator's engine
in simulated time, behind the same seams as a live campaign's (`SimulatedFleets` is a
campaign.stages.run.Fleets, `SimulatedSteps` a campaign.stages.capacity.StepRunner), so
`campaign plan` runs the campaign's own stages (campaign.stages.run.run_stages).

The step runner behind `campaign plan`: the same search (`campaign.stages.capacity.search_fleet`),
the same records and the same judging and report code as a live campaign, but each step's
requests go through `runtime.emulator.simulate.replay` (the engine the live emulator runs, its
clock jumping from event to event) instead of Locust and a server. A step of minutes takes
milliseconds, so a plan runs a whole campaign's searches before anything is deployed.

A request abandoned on its SLO deadline (the live step's `slo_deadline`) is recorded as
abandoned at its deadline and cancelled in the simulated engine at its next event, as the live
server aborts a request whose client disconnected: its slot and KV go to the others (until
2026-12-05 it kept its place to the end, so an overloaded step queued longer than a live one).
Not modelled: the load generator's own lag and the network. Each simulated step draws its
requests' instances afresh (runtime.emulator.balancer) where the live emulator continues one
draw over the campaign, so their imbalance differs by chance (docs/cli.md). A step stopped early on a certain miss
stops at the completion that decided it, as the live watch would within its one-second poll.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.capacity.search import StepPlan, certain_miss
from core.manifest import Manifest
from core.records import Outcome, RequestRecord, RunSummary, add_instance_counts, constant_count, slo_deadline_s
from core.schedule import ScheduledRequest, build_schedule
from loadgen.recording import SIMULATED_WORKER, records_name
from runtime.emulator.balancer import FlowHash
from runtime.emulator.engine import EngineSeq
from runtime.emulator.simulate import replay
from runtime.emulator.timing import TimingModel

if TYPE_CHECKING:
    from campaign.stages.run import RunFacts
    from loadgen.fixtures import GateResult
    from loadgen.replay_options import ReplayOptions

SIMULATED_WALL_START = 1_700_000_000.0  # records need a run start; a plan's is nominal


@dataclass(frozen=True)
class SimulatedRun:
    """What one simulated replay took: its records and the time a live one would have run."""

    records: list[RequestRecord]
    duration_s: float  # from the first arrival to the last completion (or the early stop)
    stopped_early: str | None


def simulate_requests(
    m: Manifest,
    fleet: str,
    schedule: list[ScheduledRequest],
    *,
    multiplier: float = 1.0,
    slo_deadline: bool = False,
    planned: int | None = None,
) -> SimulatedRun:
    """The schedule at rate x `multiplier` through the fleet's measured instances behind one
    endpoint (measure_instances, each with its replicas), spread as the live emulator spreads
    them (runtime.emulator.balancer); records as the live replayer writes them."""
    f = m.fleet(fleet)
    timing = TimingModel.for_fleet(m, f)
    reqs = sorted(schedule, key=lambda r: r.offset_s)
    patience = (
        [min(slo_deadline_s(m.slo, r.output_tokens), m.loadgen.request_timeout_s) for r in reqs]
        if slo_deadline
        else None
    )
    seqs = spread_replay(
        timing,
        [(r.offset_s / multiplier, r.input_tokens, r.output_tokens) for r in reqs],
        f.instances_measured,
        patience,
    )
    records = [_record(m, fleet, r, s, slo_deadline) for r, s in zip(reqs, seqs, strict=True)]
    stop_at, early = None, None
    if slo_deadline and planned is not None:
        stop_at, early = _early_stop(m, records, planned)
    ends = [rec.scheduled_s + (rec.e2e_s or 0.0) for rec in records]
    first = min((rec.scheduled_s for rec in records), default=0.0)
    duration = (stop_at if stop_at is not None else max(ends, default=first)) - first
    return SimulatedRun(records, duration, early)


def spread_replay(
    timing: TimingModel,
    arrivals: list[tuple[float, int, int]],
    instances: int,
    patience_s: list[float] | None = None,
) -> list[EngineSeq]:
    """`arrivals` (in time order) over `instances` independent instances: each request drawn to
    one as the NLB's flow hash does, each instance's share replayed on its own (instances share
    nothing); the sequences come back in the arrivals' order. `patience_s`: per arrival, when its
    client gives up (simulate.replay)."""
    flow = FlowHash(instances)
    picks = [flow.pick() for _ in arrivals]
    out: dict[int, EngineSeq] = {}
    for k in range(instances):
        idx = [i for i, p in enumerate(picks) if p == k]
        mine = [patience_s[i] for i in idx] if patience_s is not None else None
        out.update(zip(idx, replay(timing, [arrivals[i] for i in idx], patience_s=mine), strict=True))
    return [out[i] for i in range(len(arrivals))]


def _record(m: Manifest, fleet: str, req: ScheduledRequest, seq: EngineSeq, slo_deadline: bool) -> RequestRecord:
    at = seq.arrival
    ttft = None if seq.first_token_at is None else seq.first_token_at - at
    # a cancelled request (its client gave up) ends at its deadline, below, whatever it last emitted
    e2e = math.inf if seq.cancelled else seq.last_token_at - at
    itl = (
        (seq.last_token_at - seq.first_token_at) / (seq.generated - 1)
        if seq.first_token_at is not None and seq.generated > 1
        else None
    )
    outcome, tokens = Outcome.OK.value, seq.generated
    deadline = slo_deadline_s(m.slo, req.output_tokens)
    if slo_deadline and e2e > min(deadline, m.loadgen.request_timeout_s):
        # Given up at its deadline, as the live step's client does: the first token only if it came in time.
        e2e = min(deadline, m.loadgen.request_timeout_s)
        ttft = ttft if ttft is not None and ttft <= e2e else None
        itl, outcome, tokens = None, Outcome.SLO_ABANDONED.value, 0
    slo_ok = (
        outcome == Outcome.OK.value
        and ttft is not None
        and ttft <= m.slo.ttft_p95_s
        and (itl is None or itl <= m.slo.itl_p95_s)
    )
    return RequestRecord(
        campaign=m.campaign,
        manifest_digest=m.digest,
        fleet=fleet,
        request_id=req.request_id,
        worker="sim",
        wall_start=SIMULATED_WALL_START,
        scheduled_s=at,
        sent_s=at,
        send_lag_s=0.0,
        ttft_s=ttft,
        itl_s=itl,
        itl_max_s=itl,
        e2e_s=e2e,
        input_tokens=req.input_tokens,
        max_tokens=req.output_tokens,
        client_output_tokens=tokens,
        server_prompt_tokens=req.input_tokens if outcome == Outcome.OK.value else None,
        server_output_tokens=tokens if outcome == Outcome.OK.value else None,
        finish_reason="length" if outcome == Outcome.OK.value else None,
        outcome=outcome,
        http_status=200,
        error=None,
        slo_ok=slo_ok,
        warmup=req.warmup,
        client_prompt_tokens=req.input_tokens,
        itl_basis="server_tokens" if itl is not None else None,
    )


def _early_stop(m: Manifest, records: list[RequestRecord], planned: int) -> tuple[float | None, str | None]:
    """The completion at which the live watch would have called a certain miss, if any."""
    slo = m.slo
    done = sorted(records, key=lambda r: r.scheduled_s + (r.e2e_s or 0.0))
    ttft_over = itl_over = 0
    for r in done:
        ttft = r.ttft_s if r.ttft_s is not None else r.e2e_s  # an abandoned request enters at its bound
        ttft_over += ttft is not None and ttft > slo.ttft_p95_s
        itl_over += r.itl_s is not None and r.itl_s > slo.itl_p95_s
        why = certain_miss(planned, 0, ttft_over, itl_over, slo.max_error_rate)
        if why is not None:
            return r.scheduled_s + (r.e2e_s or 0.0), why
    return None, None


def write_records(records: list[RequestRecord], step_dir: Path, fleet: str) -> Path:
    step_dir.mkdir(parents=True, exist_ok=True)
    path = step_dir / records_name(fleet, SIMULATED_WORKER)
    path.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
    return path


class SimulatedSteps:
    """campaign.stages.capacity.StepRunner in simulated time. `overhead_s`: what each step costs
    beyond its requests where it runs for real (launching the load generator), added to the time
    it reports, so the search spends its time budget as the live one would."""

    def __init__(self, m: Manifest, overhead_s: float = 0.0):
        self.m, self.overhead_s = m, overhead_s

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        window_s = plan.span_s * plan.multiplier / self.m.workload.time_scale
        # As the live step: the trace seconds whose arrivals land inside the span at rate x k, none a warmup
        skip = plan.skip_s / self.m.workload.time_scale
        schedule = [replace(r, warmup=False) for r in build_schedule(self.m, window_s=window_s, skip_s=skip)]
        run = simulate_requests(self.m, fleet, schedule, multiplier=plan.multiplier, slo_deadline=True, planned=planned)
        write_records(run.records, step_dir, fleet)
        n = next(f.instances_measured for f in self.m.fleets if f.name == fleet)
        add_instance_counts(
            step_dir,
            {
                fleet: constant_count(
                    n,
                    SIMULATED_WALL_START,
                    SIMULATED_WALL_START + run.duration_s,
                    "measure_instances simulated, all in service throughout",
                )
            },
        )
        return run.duration_s + self.overhead_s, run.stopped_early

    def abort(self) -> None:
        """Nothing runs outside the caller's thread."""


class SimulatedFleets:
    """campaign.stages.run.Fleets in simulated time: what `campaign plan` runs the stages on.
    No fleet answers a fixture, so the quality gate is not run (assumed to pass, and said to be);
    `replay_s` is how long the longest fleet's trace replay would run live."""

    systems_under_test = "campaign plan: the emulator in simulated time (a prediction)"

    def __init__(self, m: Manifest, overhead_s: float = 0.0):
        self.m, self.overhead_s = m, overhead_s
        self.names = [f.name for f in m.fleets]
        self.concurrent = len(self.names)  # fleets side by side, as on AWS
        self.replay_s = 0.0

    def facts(self) -> RunFacts:
        from campaign.stages.run import RunFacts

        # measure_instances per fleet serve every step, as simulated (and as the local emulator serves them).
        return RunFacts({f.name: f.instances_measured for f in self.m.fleets}, self.systems_under_test)

    def gate(self) -> dict[str, GateResult] | None:
        return None

    def replay(self, records_dir: Path, options: ReplayOptions) -> dict[str, RunSummary]:
        from loadgen.summary import SummaryInputs, summarize

        schedule = build_schedule(self.m)
        out: dict[str, RunSummary] = {}
        for name in self.names:
            run = simulate_requests(self.m, name, schedule)
            write_records(run.records, records_dir, name)
            self.replay_s = max(self.replay_s, run.duration_s)
            out[name] = summarize(
                SummaryInputs(self.m.campaign, self.m.digest, name, self.m.loadgen.max_schedule_lag_p99_s),
                run.records,
                [r.request_id for r in schedule],
                client_cpu_percent=0.0,
                started_at=SIMULATED_WALL_START,
                ended_at=SIMULATED_WALL_START + run.duration_s,
            )
        return out

    def steps(self) -> SimulatedSteps:
        return SimulatedSteps(self.m, self.overhead_s)

    def abort(self) -> None:
        """Nothing runs outside the caller's thread."""

    def checkpoint(self, stage: str) -> None:
        """A plan's run directory is a temporary one: nothing to keep."""
