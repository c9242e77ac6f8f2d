"""Automatic SLO-capacity search: bracket the SLO boundary, then bisect it (pure; no sockets).

The anchors: MLPerf LoadGen's server-scenario "find peak performance" mode doubles the target
QPS until the latency constraint fails (`FindBoundaries`), then binary-searches between the
last passing and the first failing QPS until the bounds are close enough
(`FindPeakPerformanceBinarySearch`, mlcommons/inference@695be057 loadgen/loadgen.cc).
guidellm's `sweep` profile measures a synchronous rate and a throughput rate, then runs
constant rates evenly spaced between them (vllm-project/guidellm@c0319b39
src/guidellm/benchmark/profiles.py, `SweepProfile`): it maps the curve but does not aim at an
SLO. Ours does what LoadGen does, on the trace's own requests and arrival shape:

1. start at `start_multiplier` x the replay rate; while the SLO holds multiply by `growth`;
   while it misses divide by `growth`, or, after a miss that was not a near one nor on ITL, step down to
   the miss's own estimate of the boundary: its multiplier x the share of its requests that met
   their SLO (the SLO-compliant rate the fleet sustained over the rate offered), at most
   growth^3 down (`step_down`).
   Halving from x1 to a fleet that holds only x0.1 took four steps, each at a lower rate and
   so longer than the last (a step needs `min_requests` arrivals); the estimate lands near the
   boundary in one. Continue until one multiplier held and a higher one missed. Given the
   boundary `campaign plan` predicted (`predicted`: `campaign local/run --from-plan`), the start,
   or the first step below a miss, goes to it once instead, and a hold there is confirmed as an
   estimate's is: a campaign whose plan is right converges in two steps;
2. bisect geometrically (sqrt(held x missed)) until missed / held <= 1 + tolerance; except that
   a hold reached by a miss's estimate is followed by the step just above it, held x
   (1 + tolerance): the estimate (the compliant rate the fleet sustained, which cannot exceed
   what it sustains within the SLO) tends to land just under the boundary, so that step usually
   misses and ends the search at once; on the M/M/1 fleet of the tests it ends in 2 steps where
   bisection took 6. It is tried once per estimate: a hold there is bisected as usual.

`min_requests` defaults to the fewest requests whose P95 has a bounded 95% interval
(`core.stats.min_n_bounded_upper`, 72): a step that held over fewer cannot carry the
capacity's low end (`analysis.measure.intervals`), so the decision could only Defer.

Every step is long enough by construction: its arrival span covers `lifetimes` x the median
request lifetime measured in the previous step (x `_MARGIN`, since lifetimes grow with load;
after a miss, the median over the requests that met their SLO, since the overload's queue
inflates the rest, but not less than the lifetime of the hold under the miss, which a step
between them outlives) and at least `min_requests` requests. A step that held the SLO but turned
out too short by its own lifetime is run again, longer, once. A step sized for a hold need not
run its whole span to show a miss: the runner stops it once its records so far decide one
(`certain_miss`), so a miss costs seconds, not a hold's span. Stop rules bound the whole search
(steps, time, multiplier range, trace length) and the one that fired is recorded with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from analysis.capacity.steps import REPLAY, STEADY_STATE_LIFETIMES, SearchPath, SearchStep, StopRule, Verdict
from core.manifest import CapacitySearch
from core.quantiles import nearest_rank

# A step is sized from the previous step's median lifetime, measured at a different load:
# lifetimes grow towards the boundary, so the step is made a quarter longer than the bare rule.
_MARGIN = 1.25
# The SLO's percentile (P95 TTFT and ITL).
SLO_QUANTILE = 0.95
# One estimated step down goes at most growth^3 below the miss (x8 at the default growth): the
# share is measured at a load the fleet did not sustain, so a far estimate is checked on the way.
_MAX_DOWN_POWER = 3


# A step down to a miss's estimate of the boundary says so in its `why`; a hold there is followed
# by the confirming step just above it (`next_step`).
ESTIMATE_WHY = "bracket down to the estimate"
# A step at the plan's predicted boundary (SearchSettings.predicted) is confirmed the same way.
PREDICTED_WHY = "the plan's predicted boundary"
# A step that held over its own requests and missed once the settle phase pooled more with it
# (campaign.stages.settle): its detail starts with this, and the step below it goes just under it.
POOLED_MISS = "missed pooled with its settle segments"
CONFIRM_WHY = "confirm: held at"
# hi / lo at exactly 1 + tolerance (a confirming step) must read as converged despite float rounding.
_ROUNDING = 1 + 1e-9


# The defaults are the manifest's (workload.capacity_search), defined once there.
_MANIFEST_DEFAULTS = CapacitySearch()


@dataclass(frozen=True)
class SearchSettings:
    start_multiplier: float = _MANIFEST_DEFAULTS.start_multiplier
    growth: float = _MANIFEST_DEFAULTS.growth
    tolerance: float = _MANIFEST_DEFAULTS.tolerance  # converged when missed / held <= 1 + tolerance
    lifetimes: float = STEADY_STATE_LIFETIMES
    min_requests: int = _MANIFEST_DEFAULTS.min_requests
    max_steps: int = _MANIFEST_DEFAULTS.max_steps
    time_budget_s: float = _MANIFEST_DEFAULTS.time_budget_s  # arrival spans plus drains of every step, per fleet
    min_multiplier: float = _MANIFEST_DEFAULTS.min_multiplier
    max_multiplier: float = _MANIFEST_DEFAULTS.max_multiplier
    # The boundary `campaign plan` predicted for this fleet (its simulated search's highest hold):
    # the first step below a miss, or the start, goes there once instead of to the miss's estimate.
    # Only where to look: every verdict is still measured.
    predicted: float | None = None

    def __post_init__(self) -> None:
        if (
            self.growth <= 1
            or self.tolerance <= 0
            or self.min_multiplier <= 0
            or self.max_multiplier < self.start_multiplier
            or (self.predicted is not None and not self.min_multiplier <= self.predicted <= self.max_multiplier)
        ):
            raise ValueError(f"capacity search settings out of range: {self}")


@dataclass(frozen=True)
class StepPlan:
    multiplier: float
    span_s: float  # arrival span the step must cover (replay seconds); the runner lengthens it to min_requests
    why: str
    repeat: int = 1  # 2: the same multiplier again, longer (its label gets "-r2")
    # Replay seconds (at x1) of the trace skipped first: a settle segment continues its step with
    # the requests after the ones the step already replayed (campaign.stages.settle).
    skip_s: float = 0.0

    @property
    def label(self) -> str:
        return f"x{self.multiplier:.4g}" + (f"-r{self.repeat}" if self.repeat > 1 else "")


@dataclass(frozen=True)
class Stop:
    rule: StopRule
    detail: str


def bracket(steps: Sequence[SearchStep]) -> tuple[float | None, float | None]:
    """(highest multiplier that held below the lowest miss, lowest multiplier that missed)."""
    missed = [s.multiplier for s in steps if s.verdict is Verdict.MISSED]
    hi = min(missed, default=None)
    held = [s.multiplier for s in steps if s.verdict is Verdict.HELD and (hi is None or s.multiplier < hi)]
    return max(held, default=None), hi


def step_span_s(settings: SearchSettings, lifetime_s: float) -> float:
    return settings.lifetimes * lifetime_s * _MARGIN


def next_step(settings: SearchSettings, steps: Sequence[SearchStep], lifetime_s: float) -> StepPlan | Stop:
    """The next step to run, or why to stop. `lifetime_s`: the median request lifetime last
    measured (the replay's before the first step)."""
    st = settings
    lo, hi = bracket(steps)
    last = steps[-1] if steps else None
    plan: StepPlan
    if last is not None and last.verdict in (Verdict.SHORT, Verdict.INVALID):
        tries = [s for s in steps if s.multiplier == last.multiplier and s.verdict is last.verdict]
        if len(tries) >= 2 and last.verdict is Verdict.SHORT:
            return Stop(
                StopRule.NEVER_STEADY,
                f"x{last.multiplier:.4g} held the SLO but stayed too short for steady state "
                f"after it was lengthened: {last.detail}",
            )
        if len(tries) >= 2:
            return Stop(
                StopRule.CLIENT_LIMITED,
                f"x{last.multiplier:.4g} was run twice and both runs were invalid (they measured the client, "
                f"or no instance was healthy): {last.detail}",
            )
        again = 1 + sum(1 for s in steps if s.multiplier == last.multiplier and s.label != REPLAY)
        why = (
            "repeat longer: the last step was too short"
            if last.verdict is Verdict.SHORT
            else "repeat: the last run was invalid"
        )
        plan = StepPlan(last.multiplier, step_span_s(st, lifetime_s), why, again)
    elif lo is not None and hi is not None:
        if hi / lo <= (1 + st.tolerance) * _ROUNDING:
            return Stop(StopRule.CONVERGED, f"held at x{lo:.4g}, missed at x{hi:.4g}: within {st.tolerance:.0%}")
        if _reached_by(steps, lo, ESTIMATE_WHY, PREDICTED_WHY) and lo * (1 + st.tolerance) < hi:
            plan = _confirm(st, steps, lo, lifetime_s)
        else:
            plan = StepPlan(math.sqrt(lo * hi), step_span_s(st, lifetime_s), f"bisect x{lo:.4g}..x{hi:.4g}")
    elif lo is not None and _reached_by(steps, lo, PREDICTED_WHY):  # started at the prediction, and it held
        plan = _confirm(st, steps, lo, lifetime_s)
    elif lo is not None:
        k = lo * st.growth
        if k > st.max_multiplier:
            return Stop(
                StopRule.CEILING,
                f"held the SLO at x{lo:.4g}; the next step x{k:.4g} is above the search's "
                f"max_multiplier x{st.max_multiplier:g}: capacity is at least the x{lo:.4g} figure",
            )
        plan = StepPlan(k, step_span_s(st, lifetime_s), f"bracket up: held at x{lo:.4g}")
    elif hi is not None and _prediction_untried(st, steps) and st.predicted is not None and st.predicted < hi:
        plan = StepPlan(
            st.predicted,
            step_span_s(st, lifetime_s),
            f"{PREDICTED_WHY} (campaign plan, simulated): missed at x{hi:.4g}",
        )
    elif hi is not None:
        k, why = step_down(st, steps, hi)
        if k < st.min_multiplier < hi:  # the floor itself is tried before the search gives up
            k, why = st.min_multiplier, f"{why}; bounded by min_multiplier x{st.min_multiplier:g}"
        if k < st.min_multiplier:
            return Stop(
                StopRule.FLOOR,
                f"missed the SLO at x{hi:.4g}; the next step x{k:.4g} is below the search's "
                f"min_multiplier x{st.min_multiplier:g}: no SLO-compliant capacity was measured",
            )
        plan = StepPlan(k, step_span_s(st, lifetime_s), why)
    elif st.predicted is not None:
        plan = StepPlan(st.predicted, step_span_s(st, lifetime_s), f"{PREDICTED_WHY} (campaign plan, simulated)")
    else:
        plan = StepPlan(st.start_multiplier, step_span_s(st, lifetime_s), "start")
    if len(steps) >= st.max_steps:
        return Stop(
            StopRule.MAX_STEPS,
            f"{len(steps)} steps run (max_steps {st.max_steps}); next would be {plan.label} ({plan.why})",
        )
    return plan


def _reached_by(steps: Sequence[SearchStep], held: float, *whys: str) -> bool:
    """Whether the hold at `held` was a step whose `why` starts with one of `whys`: a step down to a
    miss's estimate (see step_down) or to the plan's predicted boundary. Either lands near or under
    the boundary, so the step just above it usually misses and ends the search."""
    return any(s.multiplier == held and s.verdict is Verdict.HELD and s.why.startswith(whys) for s in steps)


def _confirm(st: SearchSettings, steps: Sequence[SearchStep], lo: float, lifetime_s: float) -> StepPlan:
    """The step just above a hold reached by an estimate or a prediction: a miss there converges."""
    by = PREDICTED_WHY if _reached_by(steps, lo, PREDICTED_WHY) else "a miss's estimate"
    k = lo * (1 + st.tolerance)
    return StepPlan(
        k, step_span_s(st, lifetime_s), f"{CONFIRM_WHY} x{lo:.4g}, reached by {by}: a miss at x{k:.4g} converges"
    )


def _prediction_untried(settings: SearchSettings, steps: Sequence[SearchStep]) -> bool:
    return settings.predicted is not None and not any(s.why.startswith(PREDICTED_WHY) for s in steps)


def step_down(settings: SearchSettings, steps: Sequence[SearchStep], missed: float) -> tuple[float, str]:
    """The next multiplier below the lowest miss (no hold yet), and why: to the miss's estimate
    of the boundary (its multiplier x the share of its requests that met their SLO, at most
    growth^3 down), or down by `growth` when no share was measured or the miss was a near one.
    A near miss (share above 1 / (1 + tolerance)^2, an estimate within two tolerances of the
    miss) says little: the fleet may have fallen just short of its P95 over a few requests, and
    the 32-request replay of the example missed at x1 with 91% within their SLO where the
    boundary lay at x0.62. A larger miss's estimate lands near or under the boundary: the g6
    fleet of the example missed at x1 with 55% and held up to x0.59 (bench/capacity_search_traces.py).
    The share models a queue (the fleet serves its capacity, the rest wait past their TTFT); a
    miss on P95 ITL is a batch too large for the per-token target, which slows every request at
    once: just past the boundary almost none meet it. The code trace's inf2 fleet missed x0.68 on
    ITL with 8% within their SLO, an estimate of x0.053 (bounded to x0.086) against a boundary near x0.45 (2026-12-04),
    so such a miss steps down by `growth`."""
    st = settings
    misses = [s for s in steps if s.verdict is Verdict.MISSED and s.multiplier == missed]
    if any(s.detail.startswith(POOLED_MISS) for s in misses):
        # it held alone, so the boundary lies just under it: a hold one tolerance down converges
        return (
            missed / (1 + st.tolerance),
            f"just below x{missed:.4g}: it held over its own requests but {POOLED_MISS}",
        )
    if any(s.itl_missed for s in misses):
        return missed / st.growth, f"bracket down: missed at x{missed:.4g} on P95 ITL (its share estimates nothing)"
    share = min((s.met_share for s in misses if s.met_share is not None), default=None)
    if share is None:
        return missed / st.growth, f"bracket down: missed at x{missed:.4g}"
    if share > (1 + st.tolerance) ** -2:
        return (
            missed / st.growth,
            f"bracket down: missed at x{missed:.4g} ({share:.0%} of requests within their SLO: a near miss)",
        )
    factor = max(share, st.growth**-_MAX_DOWN_POWER)
    bound = "" if factor == share else f", bounded to x{factor:.3g} of it"
    return (
        missed * factor,
        f"{ESTIMATE_WHY}: missed at x{missed:.4g} with {share:.0%} of requests within their SLO{bound}",
    )


def certain_miss(planned: int, errors: int, ttft_over: int, itl_over: int, max_error_rate: float) -> str | None:
    """Whether a step still running has already missed the fleet SLO, whatever its remaining
    requests do: `planned` (an upper bound on the requests the step sends) and the counts so
    far of errors and of requests over the TTFT / ITL targets. The P95 of m values exceeds the
    target once more than m - rank(P95) of them do (nearest rank, as the report takes it), a bound that only grows with m; the error
    rate exceeds the ceiling once errors > ceiling x planned. None: not decided yet."""
    allowed = planned - nearest_rank(planned, SLO_QUANTILE) if planned > 0 else 0
    why = []
    if errors > max_error_rate * planned:
        why.append(f"{errors} errors > {max_error_rate:g} x {planned} planned requests")
    if ttft_over > allowed:
        why.append(f"{ttft_over} requests over the TTFT target, more than the {allowed} a P95 of {planned} allows")
    if itl_over > allowed:
        why.append(f"{itl_over} requests over the ITL target, more than the {allowed} a P95 of {planned} allows")
    return "; ".join(why) or None


def over_budget(
    settings: SearchSettings, plan: StepPlan, lifetime_s: float, elapsed_s: float, overhead_s: float = 0.0
) -> Stop | None:
    """A step costs its arrival span, the drain of its last requests (about one lifetime) and the
    runner's own overhead per step (starting the load generator, measuring), as last observed."""
    cost = plan.span_s + lifetime_s + overhead_s
    if elapsed_s + cost > settings.time_budget_s:
        return Stop(
            StopRule.TIME_BUDGET,
            f"the next step {plan.label} ({plan.why}) needs about {cost:.0f} s; "
            f"{elapsed_s:.0f} s of the {settings.time_budget_s:.0f} s time budget are spent",
        )
    return None


# Lengthens a plan to what the runner can really replay (at least min_requests requests), or
# says why it cannot run (e.g. the trace is too short for the step's span at this rate).
Resolve = Callable[[StepPlan], StepPlan | Stop]
# Runs a resolved plan: the measured step and the seconds it took.
RunStep = Callable[[StepPlan], tuple[SearchStep, float]]
# Asked last before a step runs, with the seconds it needs (as over_budget counts them): a Stop
# when something outside the search forbids it (the campaign's deadline, campaign.stages.deadline).
Admit = Callable[[StepPlan, float], Stop | None]


def next_lifetime(step: SearchStep, previous_s: float) -> float:
    """What the step after `step` is sized from (see SearchStep.sizing_lifetime_s)."""
    if step.verdict is Verdict.MISSED:
        return step.sizing_lifetime_s or previous_s
    return step.median_lifetime_s or previous_s


def sizing_lifetime(steps: Sequence[SearchStep], previous_s: float) -> float:
    """What the step after `steps` is sized from: `next_lifetime` of the last one, but after a miss
    never less than the median lifetime of the hold just under it, nor than the sizing lifetime of
    the lowest miss, the step it goes under. The next step then lies between that hold and the
    miss, at a higher load than the hold, so its requests live at least as long as the hold's did;
    the miss's SLO-compliant requests are its fastest ones. Sized from those alone, the step in
    between came out shorter than 3 of its own lifetimes and was run again whole in each of three
    example runs (2026-12-04: g6 sized from 8.6 s, lived 13.6 s). The lowest miss need not be the
    last step: a search the settle phase reopens (a hold that missed pooled) goes under a step
    measured before the last, and sized from the last (an early-stopped miss above, 8.5 s) its
    step came out short and ran again (2026-12-05: inf2 x0.5893, 31.3 s < 3 x 11.0 s)."""
    life = next_lifetime(steps[-1], previous_s)
    if steps[-1].verdict is Verdict.MISSED:
        lo, hi = bracket(steps)
        near = [
            s.median_lifetime_s if s.verdict is Verdict.HELD else s.sizing_lifetime_s
            for s in steps
            if (s.verdict is Verdict.HELD and s.multiplier == lo)
            or (s.verdict is Verdict.MISSED and s.multiplier == hi)
        ]
        life = max([life, *(x for x in near if x)])
    return life


def search(
    fleet: str,
    settings: SearchSettings,
    run_step: RunStep,
    first_lifetime_s: float,
    resolve: Resolve | None = None,
    seed: Sequence[SearchStep] = (),
    admit: Admit | None = None,
) -> SearchPath:
    """Run the search to a stop rule; `first_lifetime_s` sizes the first step (e.g. the replay's
    median lifetime). `seed`: steps already measured (the trace replay at x1) that the search
    starts from instead of repeating them; their time is not counted in the budget. `admit`: the
    last say on each step that would run (Admit)."""
    steps: list[SearchStep] = list(seed)
    lifetime, elapsed = first_lifetime_s, 0.0
    for st in steps:
        lifetime = next_lifetime(st, lifetime)
    if steps:
        lifetime = sizing_lifetime(steps, lifetime)
    overheads: list[float] = []
    while True:
        nxt = next_step(settings, steps, lifetime)
        if not isinstance(nxt, Stop) and resolve is not None:
            nxt = resolve(nxt)
        if not isinstance(nxt, Stop):
            # The runner's fixed cost per step is the least seen over full steps: a miss's drain (or early stop) is not overhead.
            overhead = min(overheads, default=0.0)
            nxt = over_budget(settings, nxt, lifetime, elapsed, overhead) or nxt
        if not isinstance(nxt, Stop) and admit is not None:
            nxt = admit(nxt, nxt.span_s + lifetime + overhead) or nxt
        if isinstance(nxt, Stop):
            break
        step, took = run_step(nxt)
        step = _queue_grew(steps, step)
        steps.append(step if step.took_s is not None else step.model_copy(update={"took_s": took}))
        elapsed += took
        lifetime = sizing_lifetime(steps, lifetime)
        if (
            step.verdict is not Verdict.MISSED
        ):  # a miss may have been stopped early: its time says nothing of the overhead
            overheads.append(max(0.0, took - nxt.span_s - lifetime))
    lo, hi = bracket(steps)
    return SearchPath(fleet, tuple(steps), lo, hi, nxt.rule, nxt.detail, settings.tolerance)


def _queue_grew(steps: Sequence[SearchStep], step: SearchStep) -> SearchStep:
    """A step lengthened because it was too short, and still too short because its requests lived
    longer the longer it ran (by more than _MARGIN), is a queue that grows: overload, a miss. Seen
    against real vLLM on a CPU core (2026-12-05): x8 lived a median 2.1 s over 3.1 s of arrivals,
    then 4.2 s over 7.9 s; sized from its own lifetime each time, it could never be long enough,
    and the search stopped `never_steady` at x4..x8 instead of bisecting."""
    before = [s for s in steps if s.multiplier == step.multiplier and s.verdict is Verdict.SHORT]
    if step.verdict is not Verdict.SHORT or not before or not step.median_lifetime_s:
        return step
    first = before[-1].median_lifetime_s
    if not first or step.median_lifetime_s <= first * _MARGIN:
        return step
    return step.model_copy(
        update={
            "verdict": Verdict.MISSED,
            "detail": f"a growing queue: its median lifetime went from {first:.3g} s to {step.median_lifetime_s:.3g} s when "
            f"lengthened, so no length is steady ({step.detail})",
        }
    )


def judge(
    *,
    held_slo: bool,
    requests: int,
    arrival_span_s: float | None,
    median_lifetime_s: float | None,
    settings: SearchSettings,
    failed: str = "",
    invalid: str = "",
) -> tuple[Verdict, str]:
    """A measured step's verdict: a run that measured the client says nothing about the server
    (it is run again); a miss is a miss at any length; a hold counts only over a steady-state
    step (span >= lifetimes x its own median lifetime, and enough requests)."""
    if invalid:
        return Verdict.INVALID, f"run invalid: {invalid}"
    if not held_slo:
        return Verdict.MISSED, failed or "the fleet SLO failed"
    short = []
    if requests < settings.min_requests:
        short.append(f"{requests} requests < min_requests {settings.min_requests}")
    need = settings.lifetimes * (median_lifetime_s or 0.0)
    if not arrival_span_s or arrival_span_s < need:
        short.append(
            f"arrival span {arrival_span_s or 0:.1f} s < {settings.lifetimes:g} x median lifetime "
            f"{median_lifetime_s or 0:.1f} s = {need:.1f} s"
        )
    if short:
        return Verdict.SHORT, "; ".join(short)
    return Verdict.HELD, f"held over {requests} requests and {arrival_span_s:.1f} s of arrivals"
