"""Per-fleet 95% intervals from the records: P95 TTFT and ITL, and per-instance SLO-compliant capacity.

The P95 intervals are over the same requests as the point P95 (non-warmup, with a first
token / an ITL), so the point always lies inside. The capacity interval is that of the step
the fleet is sized from (a capacity step, or the replay):
- its high end is the bootstrap high end of that step's per-instance goodput;
- its low end is the bootstrap low end of the best steady-state step that held the SLO *with
  95% confidence* (its P95 intervals' high ends within the targets). When the sizing step
  held the SLO only at its point estimate, the low end falls to such a step; when there is
  none, the low end is unknown (None) and so are every figure's pessimistic ends. So the
  uncertainty of "did this step hold the SLO" is carried into the capacity, not dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from analysis.measure.goodput import SUCCESSFUL_TOKENS_SQL, SloTally, latency_array, latency_order, slo_tallies
from analysis.model import FleetIntervalsModel, Measure, QuantileInterval
from analysis.sources.records import RecordSet
from core import stats

REPLAY = "replay"  # the label of the trace replay as a step (analysis.capacity.steps.REPLAY)


def latency_sample(rs: RecordSet, fleet: str, column: str) -> list[float]:
    """The same values sorted, as a list."""
    return sorted(latency_array(rs, fleet, column).tolist())


def latency_cis(rs: RecordSet, fleet: str) -> tuple[stats.QuantileCI, stats.QuantileCI]:
    """The P95 TTFT and P95 ITL intervals of one fleet's records."""
    return latency_order(rs, fleet, "ttft_s").p95, latency_order(rs, fleet, "itl_s").p95


_SENT = "fleet = $fleet AND NOT warmup AND outcome <> 'not_sent'"


def successful_tokens_per_request(rs: RecordSet, fleet: str, ttft_slo_s: float, itl_slo_s: float) -> stats.FloatArray:
    got = rs.con.execute(
        f"SELECT {SUCCESSFUL_TOKENS_SQL} AS v FROM records WHERE {_SENT}",
        {"fleet": fleet, "ttft": ttft_slo_s, "itl": itl_slo_s},
    ).fetchnumpy()["v"]
    return np.asarray(got, dtype=np.float64)


def successful_tokens_ci(rs: RecordSet, fleet: str, ttft_slo_s: float, itl_slo_s: float) -> stats.SumInterval | None:
    """95% interval of the step's successful output tokens (core.stats.sum_ci): n, the sum and
    the variance come from the scan that judges the fleet by this SLO (goodput.slo_tallies); the
    per-request values are read only to bootstrap."""
    t = slo_tallies(rs, ttft_slo_s, itl_slo_s).get(fleet, SloTally())
    return stats.sum_ci(
        t.sent,
        float(t.successful_tokens),
        t.tokens_var,
        lambda: successful_tokens_per_request(rs, fleet, ttft_slo_s, itl_slo_s),
    )


@dataclass(frozen=True)
class StepEvidence:
    """One measured step (a capacity step or the replay) of one fleet, with its P95 intervals.

    Its capacity interval depends only on the step's records and the SLO it is judged by, so it
    is computed once per SLO and shared by every copy (dataclasses.replace keeps the cache):
    the sensitivity grid's cells that keep the SLO reuse it."""

    label: str
    requests: int
    per_instance_tok_s: float | None
    p95_ttft: stats.QuantileCI
    p95_itl: stats.QuantileCI
    records: RecordSet
    window_s: float
    instances: float
    _capacity_cache: dict[tuple[str, float, float], stats.SumInterval | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def surely_holds(self, ttft_slo_s: float, itl_slo_s: float) -> bool:
        """Both P95 intervals' high ends are bounded and within the targets (an ITL-less step has no ITL bound)."""
        ttft_ok = self.p95_ttft.high is not None and self.p95_ttft.high <= ttft_slo_s
        itl_ok = self.p95_itl.n == 0 or (self.p95_itl.high is not None and self.p95_itl.high <= itl_slo_s)
        return ttft_ok and itl_ok

    def requests_to_hold(self, fleet: str, ttft_slo_s: float, itl_slo_s: float) -> int | None:
        """Requests at which this step would hold the SLO with 95% confidence if its requests keep
        missing the targets at the shares they did (core.stats.n_to_hold); None: it cannot."""
        need = []
        for column, target in (("ttft_s", ttft_slo_s), ("itl_s", itl_slo_s)):
            x = latency_array(self.records, fleet, column)
            if len(x):
                need.append(stats.n_to_hold(len(x), int((x > target).sum())))
        return None if not need or None in need else max(n for n in need if n is not None)

    def tokens_ci(self, fleet: str, ttft_slo_s: float, itl_slo_s: float) -> stats.SumInterval | None:
        key = (fleet, ttft_slo_s, itl_slo_s)
        if key not in self._capacity_cache:
            self._capacity_cache[key] = successful_tokens_ci(self.records, fleet, ttft_slo_s, itl_slo_s)
        return self._capacity_cache[key]

    def capacity_ci(self, fleet: str, ttft_slo_s: float, itl_slo_s: float) -> tuple[float, float] | None:
        if self.window_s <= 0 or self.instances <= 0:
            return None
        ci = self.tokens_ci(fleet, ttft_slo_s, itl_slo_s)
        if ci is None:
            return None
        scale = self.window_s * self.instances
        return ci.low / scale, ci.high / scale


def step_evidence(
    label: str,
    rs: RecordSet,
    fleet: str,
    *,
    requests: int,
    per_instance_tok_s: float | None,
    window_s: float | None,
    instances: float,
) -> StepEvidence:
    ttft, itl = latency_cis(rs, fleet)
    return StepEvidence(label, requests, per_instance_tok_s, ttft, itl, rs, window_s or 0.0, instances)


def replay_evidence(rs: RecordSet, fleet: str, fm: Measure | None, instances: int) -> StepEvidence:
    per = fm.goodput_tok_s / instances if fm is not None and fm.goodput_tok_s is not None and instances > 0 else None
    return step_evidence(
        REPLAY,
        rs,
        fleet,
        requests=fm.requests if fm else 0,
        per_instance_tok_s=per,
        window_s=fm.window_s if fm else 0.0,
        instances=instances,
    )


# How every P95 interval is computed (core.stats.quantile_ci), as the report states it.
QUANTILE_CI_METHOD = "order-statistic (binomial) interval, distribution-free"


def quantile_interval(ci: stats.QuantileCI) -> QuantileInterval:
    """A P95 with its 95% interval, as the report holds it."""
    return QuantileInterval(
        q=ci.q,
        n=ci.n,
        point=ci.point,
        ci=(ci.low, ci.high),
        ranks=(ci.low_rank, ci.high_rank),
        coverage=ci.coverage,
        method=QUANTILE_CI_METHOD,
    )


def _shown(replay: StepEvidence, basis: str, b: StepEvidence, note: str) -> FleetIntervalsModel:
    """What the fleet row shows: the replay's P95 intervals (the row's P95s are the replay's), the
    step the size rests on ("replay" or a capacity step label) with its P95 intervals, and the note."""
    return FleetIntervalsModel(
        basis=basis,
        basis_requests=b.requests,
        capacity_note=note,
        p95_ttft=quantile_interval(replay.p95_ttft),
        p95_itl=quantile_interval(replay.p95_itl),
        basis_p95_ttft=quantile_interval(b.p95_ttft),
        basis_p95_itl=quantile_interval(b.p95_itl),
    )


@dataclass(frozen=True)
class FleetIntervals:
    shown: FleetIntervalsModel  # the fleet row's `intervals`, built here once
    capacity_tok_s: tuple[float | None, float | None] | None  # per instance, [low, high]; None: nothing to size from
    # Requests the basis step would need to hold the SLO with 95% confidence at the shares it
    # missed by (StepEvidence.requests_to_hold); None: it cannot, or it already does.
    hold_requests: int | None = None
    # True: the low end is a lower step's (the basis held the SLO only at its point estimate), so
    # more requests at the basis move it only once the basis holds with 95% confidence.
    low_borrowed: bool = False


def fleet_intervals(
    fleet: str,
    replay: StepEvidence,
    steps: Mapping[str, StepEvidence],
    basis: str,
    ttft_slo_s: float,
    itl_slo_s: float,
) -> FleetIntervals:
    """`steps`: every steady-state step that held the SLO at its point estimate (label -> evidence),
    the basis among them when it is a capacity step; `basis`: the label the fleet is sized from."""
    b = steps.get(basis, replay)
    borrowed = False
    high_ci = b.capacity_ci(fleet, ttft_slo_s, itl_slo_s)
    if high_ci is None:
        return FleetIntervals(_shown(replay, basis, b, "no requests to size from"), None)
    if b.surely_holds(ttft_slo_s, itl_slo_s) or (
        b is replay and basis == REPLAY and not _point_holds(b, ttft_slo_s, itl_slo_s)
    ):
        # the replay in overload is sized from its (pessimistic) goodput: no SLO verdict to doubt
        low: float | None = high_ci[0]
        note = f"step {basis} held the SLO with 95% confidence"
    else:
        sure = [s for s in steps.values() if s.per_instance_tok_s and s.surely_holds(ttft_slo_s, itl_slo_s)]
        best = max(sure, key=lambda s: s.per_instance_tok_s or 0.0, default=None)
        if best is None:
            low = None
            note = (
                f"step {basis} held the SLO only at its point estimate (P95 TTFT 95% CI {_fmt_ci(b.p95_ttft)} s, "
                f"P95 ITL 95% CI {_fmt_ci(b.p95_itl)} s, n={b.requests}) and no step held it with 95% confidence"
            )
        else:
            best_ci = best.capacity_ci(fleet, ttft_slo_s, itl_slo_s)
            low = min(best_ci[0], high_ci[0]) if best_ci else None
            borrowed = low is not None
            note = (
                f"step {basis} held the SLO only at its point estimate; the low end is step {best.label}, "
                "the best that held it with 95% confidence"
            )
    how = b.tokens_ci(fleet, ttft_slo_s, itl_slo_s)
    note += f" (successful tokens' interval: {how.method})" if how is not None else ""
    hold = None if low is not None and not borrowed else b.requests_to_hold(fleet, ttft_slo_s, itl_slo_s)
    return FleetIntervals(_shown(replay, basis, b, note), (low, high_ci[1]), hold, borrowed)


def _point_holds(s: StepEvidence, ttft_slo_s: float, itl_slo_s: float) -> bool:
    ttft_ok = s.p95_ttft.point is not None and s.p95_ttft.point <= ttft_slo_s
    return ttft_ok and (s.p95_itl.point is None or s.p95_itl.point <= itl_slo_s)


def _fmt_ci(ci: stats.QuantileCI) -> str:
    def one(v: float | None) -> str:
        return "unbounded" if v is None else f"{v:.3g}"

    return f"[{one(ci.low)}, {one(ci.high)}]"


IntervalsFn = Callable[[float], dict[str, FleetIntervals]]  # slo_scale -> per fleet
