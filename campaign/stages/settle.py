"""The settle phase: after the capacity searches, more requests where the decision needs them.

The searches bracket each fleet's SLO boundary with steps of `min_requests` (72) requests, and
with 72 requests the upper 95% bound of a P95 is the step's largest value: one slow request
leaves the capacity's low end unknown and the decision undecided. The report says what would
settle it (`decision.to_settle`: requests per fleet at its sizing step, aimed at the threshold
that decides the action). This phase collects exactly that: each round continues every fleet's
sizing step with a segment of the requests that follow in the trace (`settle-<n>/` in the
step's directory, pooled with the step by the analysis: analysis.measure.goodput.SEGMENT_SQL), then
recomputes the report, until the decision settles (and every fleet has run the manifest's
`settle_min_segments`, a rehearsal's one, settled or not), the manifest's settle budget (seconds of
arrivals and drains, and the USD those cost on the cloud fleets) is spent, or the trace has no
more requests. The segments run through the same step runner as the search
(`campaign.stages.capacity.StepRunner`): Locust locally, the emulator in simulated time in a plan.
A sizing step that misses the SLO once pooled with its segments stops a round ("reopened"):
`settle_phase`, which the campaign and `campaign plan` both run, resumes that fleet's search
below it and carries on with the budget left.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from analysis.capacity.search import StepPlan
from analysis.capacity.settle_record import Reopened, SettleOutcome, SettleProgress, SettleSegment, SettleStop
from analysis.capacity.steps import median_overhead_s, read_search_path
from analysis.economics.to_settle import report_hourly_usd
from analysis.measure.goodput import SETTLE_DIR
from analysis.model import Report, Verdict
from campaign.stages.capacity import StepRunner, arrival_offsets, resume_search
from campaign.stages.deadline import StepDeadline
from core.manifest import SETTLE_MAX_ROUNDS, CapacitySearch, Manifest

# the rule of thumb behind to_settle is 1/sqrt(n): a few rounds correct its misses
MAX_ROUNDS = SETTLE_MAX_ROUNDS
MAX_REOPENED = 2  # how often the phase may reopen a fleet's search (a sizing step that missed pooled)


def settle_phase(
    m: Manifest,
    steps: Callable[[], StepRunner],
    capacity_root: Path,
    capacity_dirs: dict[str, Path],
    report: Callable[[], Report],
    stop: threading.Event,
    log: Callable[[str], None] | None = None,
    concurrent: int | None = None,
    deadline: StepDeadline | None = None,
) -> SettleOutcome:
    """The whole phase, for a live campaign and for `campaign plan` alike: `settle`, and while it
    stops "reopened", each such fleet's search resumed below the step that missed pooled (its own
    time budget), then `settle` again with what the phase has spent (at most MAX_REOPENED times).
    `steps()`: a step runner for every fleet (LocalFleets.steps() clears its handle table, so
    fleets measured at once share one: its abort() must reach them all). `capacity_dirs` gains
    the resumed searches' steps. `deadline`: asked before each segment and each step of a
    reopened search; one it would cut is not started."""
    log = log or (lambda line: print(line, flush=True))
    progress = SettleProgress.read(capacity_root)  # a run cut off mid-phase: go on from its state
    carried = None
    if progress is not None:
        carried = progress.carried_over()
        log(
            f"settle: resuming after {len(carried.segments)} finished segment(s) and {carried.reopens} reopened "
            f"search(es), {carried.seconds:.0f} s and {carried.usd:.2f} USD of its budget spent "
            f"({len(progress.pending)} cut-off segment(s) counted at what their round reserved)"
        )
    if carried is not None and carried.reopened:
        out = carried  # cut off while its reopened searches ran: they run again first
        if out.reopens >= MAX_REOPENED:  # cut off as it ended: nothing more to reopen
            out.write(capacity_root)
    else:
        out = settle(m, steps(), capacity_root, capacity_dirs, report, stop, log, concurrent, carried, deadline)
    while out.stopped == SettleStop.REOPENED and out.reopens < MAX_REOPENED:
        runner = steps()
        with ThreadPoolExecutor(max_workers=concurrent or len(out.reopened)) as pool:
            resumed = [
                pool.submit(resume_search, m, name, capacity_root, r.step, r.why, runner, stop, log, deadline)
                for name, r in out.reopened.items()
            ]
            for f in resumed:
                capacity_dirs.update(f.result())
        out = out.model_copy(update={"reopens": out.reopens + 1, "reopened": {}}, deep=True)
        SettleProgress(outcome=out).write(capacity_root)
        out = settle(m, steps(), capacity_root, capacity_dirs, report, stop, log, concurrent, out, deadline)
    return out


def settle(
    m: Manifest,
    runner: StepRunner,
    capacity_root: Path,
    capacity_dirs: Mapping[str, Path],
    report: Callable[[], Report],
    stop: threading.Event,
    log: Callable[[str], None] | None = None,
    concurrent: int | None = None,
    resume: SettleOutcome | None = None,
    deadline: StepDeadline | None = None,
) -> SettleOutcome:
    """Rounds of segments until the report's decision settles and every fleet has run
    settle_min_segments, the budget is spent or the deadline would cut every fleet's next segment;
    writes capacity_root/settle.json. `report()` builds the
    report from the records as they are now. `resume`: the outcome of the phase before a search
    reopened (its budget spent so far, its segments and its "before" carry on). `deadline`: asked
    per segment with its arrivals, drain and load-generator start and stop, as the budget counts them."""
    log = log or (lambda line: print(line, flush=True))
    cfg = m.workload.capacity_search or CapacitySearch()
    offsets = arrival_offsets(m)
    rep = report()
    out = SettleOutcome(
        stopped=SettleStop.NOTHING,
        detail="the decision is settled without it",
        delta_ci_before=_ci(rep),
        delta_ci_after=_ci(rep),
        decision_before=rep.decision.state,
        decision_after=rep.decision.state,
    )
    if resume is not None:
        out = resume.model_copy(
            update={"stopped": out.stopped, "detail": out.detail, "reopened": {}, "over_budget": []}, deep=True
        )
    for _ in range(MAX_ROUNDS):
        ts = rep.decision.to_settle
        owed = _owed(m, cfg, out)
        if ts is None and not owed:
            out.stopped, out.detail = (
                (SettleStop.SETTLED, f"after {len(out.segments)} segment(s){_minimum(cfg)}")
                if out.segments
                else (out.stopped, out.detail)
            )
            break
        plans, drain, overhead, why_not = _next_segments(m, rep, capacity_root, capacity_dirs, offsets, owed, cfg)
        if not plans:
            out.stopped, out.detail = (
                (SettleStop.NO_STEP if not out.segments else SettleStop.TRACE_EXHAUSTED),
                "; ".join(why_not),
            )
            break
        hourly = report_hourly_usd(rep, m)
        over, usd = _over_budget(
            cfg, out, hourly, {n: p for n, (_, p, _) in plans.items()}, drain, overhead, _sequential(concurrent, plans)
        )
        out.over_budget = [f"{n}: {why}" for n, why in sorted(over.items())]
        if len(over) == len(plans):
            out.stopped, out.detail = SettleStop.BUDGET, "; ".join(out.over_budget)
            break
        plans = {n: v for n, v in plans.items() if n not in over}
        # A segment the deadline would cut sits out as one over budget does; each fleet on its own,
        # so the other's segment still runs when it fits.
        cut = {
            n: why
            for n, (_, p, _) in plans.items()
            if deadline is not None
            and (why := deadline(f"settle {n}'s next segment", p.span_s + drain[n] + overhead[n]))
        }
        out.over_budget += [f"{n}: {why}" for n, why in sorted(cut.items())]
        if cut and len(cut) == len(plans):
            out.stopped, out.detail = SettleStop.DEADLINE, "; ".join(cut[n] for n in sorted(cut))
            break
        plans = {n: v for n, v in plans.items() if n not in cut}
        for line in out.over_budget:
            log(f"settle {line}: it sits this round out")
        round_usd = sum(usd[n] for n in plans)
        SettleProgress(  # what the round reserves counts as spent if the run is cut off in it
            outcome=out,
            pending=[d.relative_to(capacity_root).as_posix() for _, _, d in plans.values()],
            pending_seconds=_wall({n: p.span_s + drain[n] + overhead[n] for n, (_, p, _) in plans.items()}, concurrent),
            pending_usd=round_usd,
        ).write(capacity_root)
        took = _run_round(runner, plans, offsets, stop, concurrent)
        _record_round(out, plans, took, offsets, capacity_root, log)
        out.seconds += _wall(took, concurrent)
        out.usd += sum(_usd(hourly[n], took[n]) for n in plans)  # what each segment held its fleet for
        before = _evidence(rep)
        rep = report()
        log(f"settle: monthly delta 95% CI now {_fmt(_ci(rep))}; decision {rep.decision.state}")
        out.reopened = {
            name: Reopened(step=step, why=why)
            for name, (step, _, _) in plans.items()
            if (why := _flipped(rep, name, step))
        }
        if out.reopened:
            # More requests showed the sizing step does not hold: the capacity lies below it, which
            # only a step below can measure (settle_phase resumes the search there).
            out.stopped, out.detail = SettleStop.REOPENED, "; ".join(r.why for r in out.reopened.values())
        # The round is accounted: a run cut off from here keeps its segments (a pooled miss reads
        # them) and, reopened, resumes the searches first.
        SettleProgress(outcome=out).write(capacity_root)
        if out.reopened:
            break
        if rep.decision.to_settle is not None and _evidence(rep) == before and not _owed(m, cfg, out):
            # Seen in the example: to_settle asked 2-3 more requests per fleet, four rounds in a
            # row, and the interval never moved. Its estimate scales a width continuously; the end
            # that decided came from the search's bracket (a missed step caps a capacity) and the
            # integer fleet, which more requests at the sizing step do not move.
            out.stopped, out.detail = (
                SettleStop.STALLED,
                "the last round moved neither end of the monthly delta's interval nor of any fleet's capacity "
                "interval: the end that decides is set by the search's bracket or the integer fleet size, not by "
                "the sizing step's requests",
            )
            break
    else:
        out.stopped, out.detail = SettleStop.ROUNDS, f"{MAX_ROUNDS} rounds without settling"
    out.delta_ci_after, out.decision_after = _ci(rep), rep.decision.state
    SettleProgress(outcome=out).write(capacity_root)
    if out.stopped != SettleStop.REOPENED or out.reopens >= MAX_REOPENED:
        # settle.json marks the phase finished (campaign.stages.resume): not while a reopened
        # search is still to run, or a run cut off in it would resume at its report
        out.write(capacity_root)
    log(
        f"settle phase: {out.stopped} ({out.detail}); monthly delta 95% CI {_fmt(out.delta_ci_before)} -> {_fmt(out.delta_ci_after)}"
    )
    return out


Planned = dict[str, tuple[str, StepPlan, Path]]  # per fleet: the step it continues, the segment, its directory


def _owed(m: Manifest, cfg: CapacitySearch, out: SettleOutcome) -> set[str]:
    """The fleets that have run fewer segments than the manifest's settle_min_segments."""
    return {f.name for f in m.fleets if sum(s.fleet == f.name for s in out.segments) < cfg.settle_min_segments}


def _minimum(cfg: CapacitySearch) -> str:
    if not cfg.settle_min_segments:
        return ""
    return f", at least {cfg.settle_min_segments} per fleet as capacity_search.settle_min_segments asks"


def _next_segments(
    m: Manifest,
    rep: Report,
    capacity_root: Path,
    capacity_dirs: Mapping[str, Path],
    offsets: list[float],
    owed: set[str],
    cfg: CapacitySearch,
) -> tuple[Planned, dict[str, float], dict[str, float], list[str]]:
    """The round's segment per fleet that to_settle asks more requests of, or that still owes one
    of settle_min_segments (`owed`: `min_requests` of them where to_settle asks none), with the
    seconds its last requests take to drain and its load generator's start and stop (as the
    search's steps measured them: wall time the budget counts too), and why a fleet has none."""
    plans: Planned = {}
    drain: dict[str, float] = {}
    overhead: dict[str, float] = {}
    why_not: list[str] = []
    ts = rep.decision.to_settle
    asked = {name: need.more_requests or 0 for name, need in ts.by_fleet.items()} if ts is not None else {}
    for name in sorted(owed - asked.keys()):
        asked[name] = 0
    for name, more in asked.items():
        if not more and name in owed:
            # a settled fleet still owes a segment: a step's worth, the fewest the search measures with
            more = cfg.min_requests
        got = _plan(m, name, more, rep, capacity_root, capacity_dirs, offsets, why_not, owes=name in owed)
        if got is not None:
            plans[name], drain[name], overhead[name] = got[:3], got[3], got[4]
    return plans, drain, overhead, why_not


def _over_budget(
    cfg: CapacitySearch,
    out: SettleOutcome,
    hourly: Mapping[str, float | None],  # each fleet's USD per hour of measuring (None: no price)
    plans: Mapping[str, StepPlan],
    drain: Mapping[str, float],
    overhead: Mapping[str, float],
    sequential: bool = False,
) -> tuple[dict[str, str], dict[str, float]]:
    """The fleets whose next segment does not fit what is left of the settle budget (and why),
    and the USD of those that do. `sequential`: the round's segments run one after another (a CPU
    engine per fleet on one machine's cores), so they fit the seconds left together, the shortest first."""
    # Each fleet's segment on its own: one fleet needing more than the budget must not keep
    # the other from the few requests that bound its interval (a marginal SLO can need
    # thousands at one fleet and tens at the other). The budget counts a round's wall time, so
    # a segment fits with the drain of its last requests (the demo, 2026-12-05: segments that
    # each fit by arrivals left the phase at 154 s of its 120 s budget).
    # The runner's own start and stop (on AWS, Fargate tasks: a minute or more) is wall time and
    # billed instance time too, so it counts as the search's steps measured it.
    left_s = cfg.settle_budget_s - out.seconds
    over: dict[str, str] = {}
    before = 0.0  # a sequential round's segments that run before this one
    for n, p in sorted(plans.items(), key=lambda item: item[1].span_s + drain[item[0]] + overhead[item[0]]):
        need_s = p.span_s + drain[n] + overhead[n]
        if before + need_s > left_s:
            after = f" after the {before:.0f} s of the round's segments before it" if before else ""
            over[n] = (
                f"its next segment needs about {p.span_s:.0f} s of arrivals, {drain[n]:.0f} s to drain and "
                f"{overhead[n]:.0f} s to start and stop the load generator{after}; "
                f"{max(left_s, 0):.0f} s of the {cfg.settle_budget_s:g} s settle budget are left"
            )
        elif sequential:
            before += need_s
    if cfg.settle_budget_usd is not None:  # a cap it cannot apply: the segment does not run unbounded
        over |= {
            n: f"its segment has no price (the report has no On-Demand price for the fleet's instances), so the "
            f"{cfg.settle_budget_usd:g} USD settle budget cannot bound it"
            for n in plans
            if n not in over and hourly.get(n) is None
        }
    usd = {n: _usd(hourly.get(n), p.span_s + drain[n] + overhead[n]) for n, p in plans.items() if n not in over}
    left_usd = None if cfg.settle_budget_usd is None else cfg.settle_budget_usd - out.usd
    while left_usd is not None and usd and sum(usd.values()) > left_usd:  # drop the dearest until it fits
        dearest = max(usd, key=lambda n: usd[n])
        over[dearest] = (
            f"its next segment would cost about {_usd_text(usd.pop(dearest))} USD on the cloud fleets; "
            f"{_usd_text(max(left_usd, 0))} of the {cfg.settle_budget_usd:g} USD settle budget are left"
        )
    return over, usd


def _record_round(
    out: SettleOutcome,
    plans: Planned,
    took: Mapping[str, float],
    offsets: list[float],
    capacity_root: Path,
    log: Callable[[str], None],
) -> None:
    """Each segment the round ran, into the outcome and the log."""
    for name, (step, plan, seg_dir) in plans.items():
        seg = SettleSegment(
            fleet=name,
            step=step,
            directory=seg_dir.relative_to(capacity_root).as_posix(),
            multiplier=plan.multiplier,
            skip_s=plan.skip_s,
            span_s=plan.span_s,
            planned_requests=_arrivals(offsets, plan),
            took_s=took[name],
        )
        out.segments.append(seg)
        log(
            f"settle {name}: {seg.planned_requests} more requests at x{plan.multiplier:.4g} continuing {step} "
            f"({plan.why}) [{took[name]:.0f} s]"
        )


def _flipped(rep: Report, fleet: str, step: str) -> str:
    """Why `step` (the fleet's sizing step, now pooled with its segments) no longer holds the SLO
    at its point estimate; "" while it still does."""
    row = rep.fleets.get(fleet)
    steps = row.capacity.steps if row is not None and row.capacity is not None else []
    st = next((s for s in steps if s.label == step), None)
    if st is None or st.slo_pass:
        return ""
    ttft = "n/a" if st.p95_ttft_s is None else f"{st.p95_ttft_s:.3g} s"
    itl = "n/a" if st.p95_itl_s is None else f"{st.p95_itl_s:.3g} s"
    return f"{step} missed over {st.requests} requests with its segments (P95 TTFT {ttft}, P95 ITL {itl})"


def _sequential(concurrent: int | None, plans: Mapping[str, object]) -> bool:
    return concurrent is not None and concurrent < len(plans)


def _wall(seconds: Mapping[str, float], concurrent: int | None) -> float:
    """A round's wall time from its segments' seconds: the longest when the fleets run side by side,
    their sum when fewer run at once (until 2026-12-07 always the longest, so a local round of CPU
    engines, one fleet after the other, spent about twice the seconds its budget counted)."""
    return sum(seconds.values()) if _sequential(concurrent, seconds) else max(seconds.values())


def _usd_text(usd: float) -> str:
    """Cents from a dollar up; below, three significant digits (a rehearsal's budget is cents)."""
    return f"{usd:.2f}" if usd >= 1 else f"{usd:.3g}"


def _usd(hourly: float | None, seconds: float) -> float:
    """What `seconds` of a fleet's segment cost on the cloud fleets: its instances and load-generator
    tasks for the segment's whole wall time (arrivals, drain, the load generator's start and stop:
    the instances serve, and bill, throughout), as decision.to_settle prices its minutes. Until
    2026-12-07 the arrivals alone were priced, and a segment to_settle did not list (one a fleet
    owes, on a settled decision) at 0. 0: no instance price (with a USD budget such a segment does
    not run: _over_budget)."""
    return 0.0 if hourly is None else hourly * seconds / 3600.0


def _plan(
    m: Manifest,
    fleet: str,
    more: int,
    rep: Report,
    root: Path,
    dirs: Mapping[str, Path],
    offsets: list[float],
    why_not: list[str],
    *,
    owes: bool = False,
) -> tuple[str, StepPlan, Path, float, float] | None:
    """The next segment of the fleet's sizing step: `more` arrivals after what it already replayed,
    its drain (the step's median request lifetime) and the runner's overhead (the search's median).
    A fleet that `owes` a segment of settle_min_segments and is sized from no capacity step (the
    replay, or nothing) runs it at its search's highest held step, else its last one: the segment is
    owed to show the phase runs, and a fleet sized from the replay has no step of its own to extend."""
    row = rep.fleets.get(fleet)
    basis = row.intervals.basis if row is not None and row.intervals is not None else None
    if more <= 0:
        return None
    if owes and (basis is None or basis not in dirs):
        basis = _owed_step(fleet, root, dirs) or basis
    if basis is None or basis not in dirs:
        why_not.append(f"{fleet}: sized from {basis or 'nothing'}, not a capacity step")
        return None
    path = read_search_path(root / fleet)
    label = basis.split("/", 1)[1]
    step = next((s for s in path.steps if s.label == label), None) if path is not None else None
    if step is None:
        why_not.append(f"{fleet}: no search step {label}")
        return None
    k = step.multiplier
    step_dir = dirs[basis]
    done = sorted(step_dir.glob(f"{SETTLE_DIR}*"))
    # the step and every earlier segment replayed the arrivals of their spans at x k, one after another
    skip = step.planned_span_s * k + sum(_segment_span(d) * k for d in done)
    after = [o - skip for o in offsets if o >= skip]
    if len(after) < more:
        why_not.append(f"{fleet}: the trace has {len(after)} requests after {skip:.0f} s, {more} needed")
        return None
    span = after[more - 1] / k + 1e-3
    plan = StepPlan(k, span, f"settle: {more} more requests for decision.to_settle", skip_s=skip)
    return (
        basis,
        plan,
        step_dir / f"{SETTLE_DIR}{len(done) + 1}",
        step.median_lifetime_s or 0.0,
        median_overhead_s(path.steps if path is not None else ()),
    )


def _owed_step(fleet: str, root: Path, dirs: Mapping[str, Path]) -> str | None:
    """The fleet's search step an owed segment runs at: the highest held one, else the last measured."""
    path = read_search_path(root / fleet)
    steps = [s for s in (path.steps if path is not None else []) if f"{fleet}/{s.label}" in dirs]
    held = [s for s in steps if s.verdict is Verdict.HELD]
    pick = max(held, key=lambda s: s.multiplier) if held else (steps[-1] if steps else None)
    return f"{fleet}/{pick.label}" if pick is not None else None


def _segment_span(seg_dir: Path) -> float:
    meta = seg_dir / "segment.json"
    return float(json.loads(meta.read_text(encoding="utf-8"))["span_s"]) if meta.is_file() else 0.0


def _arrivals(offsets: list[float], plan: StepPlan) -> int:
    return sum(1 for o in offsets if plan.skip_s <= o < plan.skip_s + plan.span_s * plan.multiplier)


def _run_round(
    runner: StepRunner,
    plans: Mapping[str, tuple[str, StepPlan, Path]],
    offsets: list[float],
    stop: threading.Event,
    concurrent: int | None = None,
) -> dict[str, float]:
    """Every fleet's segment, `concurrent` at a time (default: side by side); each segment's span
    is written beside its records."""

    def one(name: str, plan: StepPlan, seg_dir: Path) -> float:
        seg_dir.mkdir(parents=True, exist_ok=True)
        (seg_dir / "segment.json").write_text(
            json.dumps({"span_s": plan.span_s, "skip_s": plan.skip_s, "multiplier": plan.multiplier}), encoding="utf-8"
        )
        took, _ = runner.run(name, plan, seg_dir, _arrivals(offsets, plan), stop)
        return took

    with ThreadPoolExecutor(max_workers=min(concurrent or len(plans), len(plans))) as pool:
        futures = {name: pool.submit(one, name, plan, seg_dir) for name, (_, plan, seg_dir) in plans.items()}
        try:
            return {name: f.result() for name, f in futures.items()}
        except BaseException:
            stop.set()
            runner.abort()
            raise


def _evidence(rep: Report) -> tuple[object, ...]:
    """What a round can move: the delta's interval, and which ends of each fleet's capacity
    interval are known (an end becoming known is progress even while the other fleet keeps the
    delta's unknown). Not the fleet intervals' values: every segment pools into its step, so they
    shift a little each round whether or not anything that decides has moved."""
    known = tuple(
        sorted(
            (n, tuple(v is not None for v in (getattr(f, "capacity_ci_tok_s", None) or (None, None))))
            for n, f in rep.fleets.items()
        )
    )
    return (tuple(_ci(rep) or ()), known)


def _ci(rep: Report) -> list[float | None] | None:
    return list(rep.monthly_delta_ci_usd) if rep.monthly_delta_ci_usd else None


def _fmt(ci: list[float | None] | None) -> str:
    return "n/a" if not ci else "[" + ", ".join("unknown" if v is None else f"{v:+,.0f}" for v in ci) + "] USD"
