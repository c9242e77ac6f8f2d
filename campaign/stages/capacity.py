"""Run the capacity measurement of `campaign local` against live endpoints: the automatic search
(one search per fleet, fleets side by side: each has its own server) or the fixed sweep.

The search's logic is pure (`analysis.capacity.search`); this module turns its plans into
Locust runs and measures each step by the same rules the report uses (`analysis.measure.goodput`).
A step replays the manifest's trace from `workload.window.start_s` at rate x k, as many trace
seconds as its arrival span needs (`--window-s`), with every request abandoned once it can no
longer meet its SLO; records go to `capacity/<fleet>/x<k>/` and the path to
`capacity/<fleet>/search.json`. While a step runs its records (flushed every second) are
watched, and the step is stopped as soon as it has certainly missed the SLO
(`analysis.capacity.search.certain_miss`): an overloaded step would otherwise run its whole
span, sized for `min_requests` holds, only to confirm a miss.
"""

from __future__ import annotations

import bisect
import statistics
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from analysis.capacity.search import (
    POOLED_MISS,
    SearchSettings,
    StepPlan,
    Stop,
    certain_miss,
    judge,
    next_lifetime,
    search,
)
from analysis.capacity.steps import (
    REPLAY,
    SearchPath,
    SearchStep,
    StopRule,
    Verdict,
    read_search_path,
    step_divisors,
    write_search_path,
    write_search_step,
)
from analysis.measure import goodput
from analysis.sources.records import load_records
from campaign.stages.deadline import StepDeadline
from campaign.stages.progress import RecordTail
from campaign.stages.resume import FleetSteps
from core.errors import EXIT_BAD_INPUT, CampaignError
from core.manifest import CapacitySearch, Manifest
from loadgen.recording import fleet_records

if TYPE_CHECKING:
    from loadgen.replay_options import ReplayOptions

# The whole trace from the window's start: a step needs as much of it as its span asks for.
_WHOLE_TRACE_S = 1e9


class Interrupted(Exception):
    """Ctrl-C reached a search between steps: no new step is started."""


class ResumeMismatch(CampaignError):
    """A resumed search does not retrace the steps its run recorded: `run --resume` refuses (exit 2,
    as for a manifest, schedule or plan that differs from the run's)."""

    exit_code = EXIT_BAD_INPUT


def settings_from(cfg: CapacitySearch) -> SearchSettings:
    return SearchSettings(
        start_multiplier=cfg.start_multiplier,
        growth=cfg.growth,
        tolerance=cfg.tolerance,
        min_requests=cfg.min_requests,
        max_steps=cfg.max_steps,
        time_budget_s=cfg.time_budget_s,
        min_multiplier=cfg.min_multiplier,
        max_multiplier=cfg.max_multiplier,
    )


def arrival_offsets(m: Manifest) -> list[float]:
    """Replay offsets (at x1) of every request from the window's start to the trace's end."""
    from core.schedule import build_schedule

    return [r.offset_s for r in build_schedule(m, window_s=_WHOLE_TRACE_S)]


def resolve_span(plan: StepPlan, offsets: list[float], min_requests: int) -> StepPlan | Stop:
    """Lengthen the plan's span so it holds at least `min_requests` arrivals at its rate, or say
    why the trace cannot give the step its span and requests."""
    k = plan.multiplier
    if len(offsets) < min_requests:
        return Stop(
            StopRule.TRACE_EXHAUSTED,
            f"{plan.label}: the trace has {len(offsets)} requests from the window's start, "
            f"fewer than min_requests {min_requests}",
        )
    # The n-th arrival must fall strictly inside [0, span): nudge past it.
    span = max(plan.span_s, offsets[min_requests - 1] / k + 1e-3)
    available = offsets[-1] / k
    if span > available:
        return Stop(
            StopRule.TRACE_EXHAUSTED,
            f"{plan.label} ({plan.why}) needs {span:.1f} s of arrivals; at x{k:.4g} the trace "
            f"from the window's start gives {available:.1f} s: use a longer trace or a later window.start_s",
        )
    return replace(plan, span_s=span)


def planned_requests(plan: StepPlan, offsets: list[float]) -> int:
    """An upper bound on the requests the step sends: arrivals (at x1) before span x k."""
    return bisect.bisect_right(offsets, plan.span_s * plan.multiplier)


def running_miss(m: Manifest, tail: RecordTail, planned: int) -> str | None:
    """Whether the records a running step has flushed so far (read on from where `tail` last
    stopped) already decide a miss."""
    p, slo = tail.poll(), m.slo
    ttft_over = sum(v > slo.ttft_p95_s for v in p.ttfts)
    itl_over = sum(v > slo.itl_p95_s for v in p.itls)
    return certain_miss(planned, p.errors, ttft_over, itl_over, slo.max_error_rate)


def measure_step(
    m: Manifest,
    fleet: str,
    records_dir: Path,
    label: str,
    multiplier: float,
    why: str,
    planned_span_s: float,
    settings: SearchSettings,
    *,
    took_s: float | None = None,
) -> SearchStep:
    """A step's verdict from its records, by the report's rules (`analysis.measure.goodput`); a run its
    summary marks invalid (it measured the client, e.g. schedule lag) gets no verdict and is run
    again. `took_s`: the step's wall time, whose part outside its requests' own time is its overhead."""
    rs = load_records(records_dir, m.digest)
    load = goodput.load_span_s(rs).get(fleet)
    overhead = None if took_s is None or load is None else max(took_s - load, 0.0)
    slo = m.slo
    fm = goodput.measure_fleets(rs, slo.ttft_p95_s, slo.itl_p95_s).get(fleet)
    life = goodput.median_e2e(rs).get(fleet)
    met_life = goodput.median_e2e(rs, slo.ttft_p95_s, slo.itl_p95_s).get(fleet)
    invalid = [r for s in rs.summaries.values() if s.fleet == fleet and not s.valid for r in s.invalid_reasons]
    counted = step_divisors(records_dir, rs).get(fleet)
    if counted is not None and counted.instances <= 0:  # it measured no instance: run it again, not a miss
        invalid.append(f"no target of the fleet was healthy while it ran ({counted.detail})")
    if fm is None or fm.requests == 0:
        verdict, detail = judge(
            held_slo=False,
            requests=0,
            arrival_span_s=None,
            median_lifetime_s=None,
            settings=settings,
            failed="no records: " + ("; ".join(invalid) or "nothing was measured"),
        )
        return SearchStep(
            label,
            multiplier,
            why,
            planned_span_s,
            verdict,
            0,
            None,
            None,
            None,
            None,
            None,
            None,
            detail,
            took_s=took_s,
            overhead_s=overhead,
        )
    failed = []
    if fm.p95_ttft_s is None or fm.p95_ttft_s > slo.ttft_p95_s:
        failed.append(
            f"P95 TTFT {'none' if fm.p95_ttft_s is None else f'{fm.p95_ttft_s:.3g}'} s > {slo.ttft_p95_s:g} s"
        )
    itl_missed = fm.p95_itl_s is not None and fm.p95_itl_s > slo.itl_p95_s
    if itl_missed:
        failed.append(f"P95 ITL {fm.p95_itl_s:.3g} s > {slo.itl_p95_s:g} s")
    if fm.error_rate is None or fm.error_rate > slo.max_error_rate:
        failed.append(
            f"error rate {'none' if fm.error_rate is None else f'{fm.error_rate:.3f}'} > {slo.max_error_rate:g}"
        )
    held = fm.slo_pass(slo.ttft_p95_s, slo.itl_p95_s, slo.max_error_rate)
    span = fm.window_s or None
    verdict, detail = judge(
        held_slo=held,
        requests=fm.requests,
        arrival_span_s=span,
        median_lifetime_s=life,
        settings=settings,
        failed="; ".join(failed),
        invalid="; ".join(dict.fromkeys(invalid)),
    )
    sent = fm.requests - fm.not_sent
    return SearchStep(
        label,
        multiplier,
        why,
        planned_span_s,
        verdict,
        fm.requests,
        span,
        fm.requests / span if span else None,
        life,
        fm.p95_ttft_s,
        fm.p95_itl_s,
        fm.error_rate,
        detail,
        met_life,
        fm.successful_requests / sent if sent else None,
        itl_missed=itl_missed,
        took_s=took_s,
        overhead_s=overhead,
    )


def replay_step(m: Manifest, fleet: str, replay_dir: Path, settings: SearchSettings) -> SearchStep | None:
    """The trace replay (x1, both fleets at once) as the search's first measured point, when it has records for the fleet."""
    if not fleet_records(replay_dir, fleet):
        return None
    span = m.workload.window.duration_s * m.workload.time_scale
    return measure_step(m, fleet, replay_dir, REPLAY, 1.0, "the trace replay, every fleet at once", span, settings)


def fallback_lifetime(m: Manifest) -> float:
    """Without a replay: the SLO's own bound for the schedule's median request (TTFT + output
    tokens x ITL), an upper bound on the lifetime of a request that meets it."""
    from core.schedule import build_schedule

    tokens = statistics.median(r.output_tokens for r in build_schedule(m))
    return m.slo.ttft_p95_s + tokens * m.slo.itl_p95_s


def step_options(m: Manifest, plan: StepPlan) -> ReplayOptions:
    """A step's replay: the trace seconds whose arrivals land inside its span at rate x k
    (offsets are trace seconds x time_scale), every request abandoned at its SLO deadline, no
    warmup (the replay warmed the server); the same for every runner."""
    from loadgen.replay_options import ReplayOptions

    ts = m.workload.time_scale
    return ReplayOptions(
        rate_multiplier=plan.multiplier,
        slo_deadline=True,
        warmup=False,
        window_s=plan.span_s * plan.multiplier / ts,
        skip_s=plan.skip_s / ts,
    )


class StepRunner(Protocol):
    """How a capacity step reaches a fleet: the seam between the search (the same for every
    runner) and what serves the load. `LocalSteps` replays it with Locust against a live
    endpoint; `campaign.backends.simulated.fleets.SimulatedSteps` through the emulator's engine in
    simulated time (`campaign plan`). Either writes the step's records into `step_dir`, which
    `measure_step` then judges by the report's rules."""

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        """Run the step; (seconds it took, the certain miss it was stopped on, if any)."""
        ...

    def abort(self) -> None:
        """Stop every step in flight (Ctrl-C)."""
        ...


def search_fleet(
    m: Manifest,
    fleet: str,
    fleet_dir: Path,
    cfg: CapacitySearch,
    first_lifetime_s: float,
    runner: StepRunner,
    stop: threading.Event,
    log: Callable[[str], None] | None = None,
    seed: tuple[SearchStep, ...] = (),
    predicted: float | None = None,
    recorded: Mapping[str, SearchStep] | None = None,
    deadline: StepDeadline | None = None,
) -> SearchPath:
    """One fleet's search into `fleet_dir`. `deadline`: asked before each step it would run; a step
    the campaign's deadline would cut is not started and the search stops (StopRule.DEADLINE).
    `recorded`: the steps a run cut off had finished
    (label -> verdict, campaign.stages.resume): the search walks its path again from the start,
    and where it reaches one of them takes its recorded verdict and time instead of running it,
    so its state (the bracket, the sizing lifetime, the time spent, the runner's overhead) is
    rebuilt by the search's own code and the next step is the one the uninterrupted search
    would have taken. A recorded step the walk never reaches is an error naming it: the run was
    searched with other settings (another plan, manifest or code)."""
    log = log or (lambda line: print(line, flush=True))
    carried = dict(recorded or {})
    settings = settings_from(cfg)
    if predicted is not None and settings.min_multiplier <= predicted <= settings.max_multiplier:
        settings = replace(settings, predicted=predicted)
    elif predicted is not None:
        log(
            f"capacity search {fleet}: the plan's predicted x{predicted:.4g} is outside the search's range "
            f"x{settings.min_multiplier:g}..x{settings.max_multiplier:g}: not used"
        )
    offsets = arrival_offsets(m)

    def run(plan: StepPlan) -> tuple[SearchStep, float]:
        if plan.label in carried:
            step = carried.pop(plan.label)
            log(
                f"capacity search {fleet} {plan.label}: carried over from the run cut off ({step.verdict}: {step.detail})"
            )
            return step, step.took_s or 0.0
        if stop.is_set():
            raise Interrupted
        step_dir = fleet_dir / plan.label
        took, early = runner.run(fleet, plan, step_dir, planned_requests(plan, offsets), stop)
        step = measure_step(
            m, fleet, step_dir, plan.label, plan.multiplier, plan.why, plan.span_s, settings, took_s=took
        )
        if early is not None:
            step = step.model_copy(update={"detail": f"{step.detail} (stopped early, a certain miss: {early})"})
        write_search_step(step, step_dir)
        log(
            f"capacity search {fleet} {plan.label} ({plan.why}): {step.requests} requests over {step.arrival_span_s or 0:.1f} s, "
            f"{step.verdict}: {step.detail} [{took:.0f} s]"
        )
        return step, took

    def admit(plan: StepPlan, seconds: float) -> Stop | None:
        if deadline is None or plan.label in carried:  # a carried-over step is not run again
            return None
        why = deadline(f"capacity search {fleet} {plan.label} ({plan.why})", seconds)
        return Stop(StopRule.DEADLINE, why) if why else None

    for st in seed:
        log(
            f"capacity search {fleet} starts from {st.label} (x{st.multiplier:g}): {st.requests} requests, {st.verdict}: {st.detail}"
        )
    path = search(
        fleet,
        settings,
        run,
        first_lifetime_s,
        resolve=lambda p: resolve_span(p, offsets, settings.min_requests),
        seed=seed,
        admit=admit,
    )
    if carried:
        raise ResumeMismatch(
            f"capacity search {fleet}: recorded step(s) {', '.join(sorted(carried))} are not on the path the "
            "search takes now: the run was searched with other settings (plan, manifest or code)"
        )
    write_search_path(path, fleet_dir)
    log(f"capacity search {fleet}: stopped ({path.stop_rule}): {path.stop_detail}")
    return path


def run_search(
    m: Manifest,
    fleets: list[str],
    runner: StepRunner,
    root: Path,
    replay_dir: Path | None,
    stop: threading.Event,
    log: Callable[[str], None] | None = None,
    concurrent: int | None = None,
    predicted: Mapping[str, float] | None = None,
    resume: Mapping[str, FleetSteps] | None = None,
    deadline: StepDeadline | None = None,
) -> dict[str, Path]:
    """Every fleet's search, `concurrent` at a time (default: all side by side); returns the
    report's capacity steps ("<fleet>/x<k>" -> directory). `predicted`: per fleet, the boundary
    `campaign plan` predicted (SearchSettings.predicted). `resume`: per fleet, what a run cut off
    had recorded (campaign.stages.resume): a fleet whose search finished keeps its search.json,
    the others continue from their finished steps (search_fleet's `recorded`)."""
    resume = resume or {}
    done = {
        name: p
        for name in fleets
        if name in resume and resume[name].search_finished and (p := read_search_path(root / name)) is not None
    }
    fleets = [name for name in fleets if name not in done]
    cfg = m.workload.capacity_search or CapacitySearch()
    settings = settings_from(cfg)
    seeds = {name: replay_step(m, name, replay_dir, settings) if replay_dir is not None else None for name in fleets}
    fallback = fallback_lifetime(m)
    lives = {name: next_lifetime(st, fallback) if st is not None else fallback for name, st in seeds.items()}
    pool = ThreadPoolExecutor(max_workers=concurrent or len(fleets) or 1)
    try:
        futures = {
            name: pool.submit(
                search_fleet,
                m,
                name,
                root / name,
                cfg,
                lives[name],
                runner,
                stop,
                log,
                tuple(st for st in (seeds[name],) if st is not None),
                (predicted or {}).get(name),
                resume[name].finished if name in resume else None,
                deadline,
            )
            for name in fleets
        }
        paths = {**done, **{name: f.result() for name, f in futures.items()}}
    except BaseException:  # Ctrl-C: stop the steps in flight, so the searches end now, not after their steps
        stop.set()
        runner.abort()
        raise
    finally:
        pool.shutdown(wait=True)
    return {
        f"{name}/{s.label}": root / name / s.label for name, p in paths.items() for s in p.steps if s.label != REPLAY
    }


def resume_search(
    m: Manifest,
    fleet: str,
    root: Path,
    step_label: str,
    why: str,
    runner: StepRunner,
    stop: threading.Event,
    log: Callable[[str], None] | None = None,
    deadline: StepDeadline | None = None,
) -> dict[str, Path]:
    """The fleet's search again from its recorded steps, with `step_label` ("<fleet>/x<k>", which the
    settle phase found missing the SLO once pooled with its segments: `why`) now a miss, within
    what is left of the search's own time budget; returns its capacity steps as run_search does."""
    cfg = m.workload.capacity_search or CapacitySearch()
    path = read_search_path(root / fleet)
    if path is None:
        return {}
    label = step_label.split("/", 1)[1]
    seed = tuple(
        s.model_copy(update={"verdict": Verdict.MISSED, "detail": f"{POOLED_MISS}: {why}"}) if s.label == label else s
        for s in path.steps
    )
    spent = sum(s.took_s or 0.0 for s in path.steps if s.label != REPLAY)
    left = cfg.model_copy(update={"time_budget_s": max(cfg.time_budget_s - spent, 0.0)})
    resumed = search_fleet(
        m, fleet, root / fleet, left, fallback_lifetime(m), runner, stop, log, seed, deadline=deadline
    )
    return {f"{fleet}/{s.label}": root / fleet / s.label for s in resumed.steps if s.label != REPLAY}


def run_sweep(
    m: Manifest,
    fleets: list[str],
    runner: StepRunner,
    root: Path,
    stop: threading.Event,
    log: Callable[[str], None] | None = None,
    concurrent: int | None = None,
    deadline: StepDeadline | None = None,
) -> dict[str, Path]:
    """The explicit sweep: one open-loop step of `step_s` replay seconds per multiplier, fleets side
    by side, each step's records in `root/x<k>/` (shared by the fleets), through the same runner as
    the search (so a step stops early on a certain miss here too). `deadline`: a step it would cut
    ends the sweep before it starts; the step is counted at its span plus the most any earlier
    step took beyond its span (drain and the load generator's start and stop), none before the first."""
    log = log or (lambda line: print(line, flush=True))
    sweep = m.workload.capacity_sweep
    assert sweep is not None
    offsets = arrival_offsets(m)
    dirs: dict[str, Path] = {}
    beyond_span = 0.0
    pool = ThreadPoolExecutor(max_workers=concurrent or len(fleets))
    try:
        for k in sweep.multipliers:
            if stop.is_set():
                raise Interrupted
            plan = StepPlan(k, sweep.step_s, "the manifest's fixed sweep")
            cut = deadline(f"capacity step {plan.label}", plan.span_s + beyond_span) if deadline else None
            if cut:
                log(f"capacity sweep: stopped: {cut}")
                break
            step_dir = root / plan.label
            futures = {
                name: pool.submit(runner.run, name, plan, step_dir, planned_requests(plan, offsets), stop)
                for name in fleets
            }
            for name, f in futures.items():
                took, early = f.result()
                beyond_span = max(beyond_span, took - plan.span_s)
                log(
                    f"capacity step {plan.label} {name}: [{took:.0f} s]"
                    + (f" stopped early, a certain miss: {early}" if early else "")
                )
            dirs[plan.label] = step_dir
    except BaseException:
        stop.set()
        runner.abort()
        raise
    finally:
        pool.shutdown(wait=True)
    return dirs
