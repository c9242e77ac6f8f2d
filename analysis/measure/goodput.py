"""Successful output tokens, fleet percentiles and SLO-compliant throughput, from per-request records.

docs/design.md: a token is successful when its request completed without error, passed the
quality gate and met the per-request SLO; server usage counts where the server reported it.
Warmup requests are excluded from everything. The per-request SLO is recomputed here from
the measured TTFT and ITL (ttft <= slo.ttft and itl <= slo.itl; a request with one token has
no ITL) so a tighter or looser SLO can be evaluated from the same records; disagreements
with the loadgen's own `slo_ok` verdict are counted and reported, never hidden.
The measured window is the arrival span of the requests that were actually sent (non-warmup,
outcome other than not_sent): first to last scheduled send, widened by n/(n-1) so n arrivals
cover n inter-arrival gaps. Goodput over it is the SLO-compliant demand the instance sustained:
an open-loop request counts toward the moment it arrived, however long it then took, and the
drain after the last arrival (one request's length, or a queue in overload) neither dilutes a
short step nor credits an overloaded server. Requests scheduled but never sent (a `--duration`
cut, a dead worker) do not stretch the window.
Percentiles are exact nearest-rank P95 over the fleet's non-warmup requests that received
a first token (core.quantiles.nearest_rank, LatencyOrder), i.e. over raw records, never
averaged per replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field, replace
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from analysis.model import Measure
from analysis.sources.records import RecordSet
from core import stats
from core.quantiles import nearest_rank
from core.records import ERROR_OUTCOMES, Outcome

K = TypeVar("K")
V = TypeVar("V")

_TOKENS = "coalesce(server_output_tokens, client_output_tokens)"
_ABANDONED = f"outcome = '{Outcome.SLO_ABANDONED.value}'"
# What each record contributes to a latency percentile, its CDF and its interval. A request a
# capacity step abandoned on its SLO deadline (Outcome.SLO_ABANDONED, given up e2e_s after it
# was scheduled) is censored, and enters at a lower bound: with no first token, its TTFT is
# over e2e_s; with one, its ITL is at least the rest of e2e_s spread over the tokens it still
# owed. Since the deadline is the TTFT target + max_tokens x the ITL target, the TTFT bound is
# over its target, and so is the ITL bound of a request whose first token came in time: a P95
# that is within its target is then exact, and one over it a lower bound. (One whose first token
# came late is already over on TTFT; its ITL bound may be under target.)
LATENCY_SQL = {
    "ttft_s": f"CASE WHEN {_ABANDONED} AND ttft_s IS NULL THEN e2e_s ELSE ttft_s END",
    "itl_s": f"CASE WHEN {_ABANDONED} AND ttft_s IS NOT NULL AND max_tokens > 1 "
    "THEN greatest(coalesce(itl_s, 0), (e2e_s - ttft_s) / (max_tokens - 1)) ELSE itl_s END",
}


def _slo_met(ttft: str, itl: str) -> str:
    """The per-request SLO (module docstring) against the thresholds these SQL parameters name."""
    return f"(ttft_s IS NOT NULL AND ttft_s <= {ttft} AND (itl_s IS NULL OR itl_s <= {itl}))"


_SLO_MET = _slo_met("$ttft", "$itl")
# One value per request: its successful output tokens (0 unless it completed ok inside the
# per-request SLO). Over the non-warmup requests sent, their sum is what goodput divides by the window.
_SUCCESSFUL = f"CASE WHEN outcome = 'ok' AND {_SLO_MET} THEN coalesce({_TOKENS}, 0) ELSE 0 END"
SUCCESSFUL_TOKENS_SQL = f"CAST({_SUCCESSFUL} AS DOUBLE)"
# A capacity step's settle segments (campaign.stages.settle) sit in its directory as settle-<n>/: more
# requests at the same rate, replayed after the step, each with its own schedule from 0. Records
# of the step itself are segment "".
SETTLE_DIR = "settle-"
SEGMENT_SQL = f"regexp_extract(filename, '/{SETTLE_DIR}([0-9]+)/', 1)"


def measure_fleets(
    rs: RecordSet, ttft_slo_s: float, itl_slo_s: float, *, percentiles: bool = True
) -> dict[str, Measure]:
    """Every fleet's counts, tokens, window and P95s.

    The sums come from one grouped scan of a few hundred groups whatever the number of records
    (tally), which judges the requests by every SLO named to it at once: the report names the base
    SLO and its sensitivity grid's before asking for the first (a scan per SLO was most of the work,
    bench/analysis_throughput.py). The P95s do not depend on the SLO thresholds;
    `percentiles=False` skips them (None) for callers that re-evaluate goodput under another SLO
    and already hold them."""
    tallies = _slo_free_tallies(rs)
    judged = slo_tallies(rs, ttft_slo_s, itl_slo_s)
    if percentiles:
        latency_orders(rs, [(fleet, column) for fleet in sorted(tallies) for column in LATENCY_SQL])

    def p95(fleet: str, column: str) -> float | None:
        return latency_order(rs, fleet, column).p95.point if percentiles else None

    return {
        fleet: t.measure(
            fleet, judged.get(fleet, SloTally()), p95(fleet, "ttft_s"), p95(fleet, "itl_s"), rs.segment_starts
        )
        for fleet, t in sorted(tallies.items())
    }


def tally(rs: RecordSet, slos: Iterable[tuple[float, float]]) -> None:
    """Every sum measure_fleets and the report's outcome counts take from the records, with the
    requests judged by each SLO (P95 TTFT, P95 ITL targets) in `slos`, kept with the records
    (RecordSet.derived) for _slo_free_tallies, slo_tallies, outcome_counts and itl_basis_counts.

    One scan, grouped by what each of them tells apart (a few hundred groups, whatever the number
    of records): fleet, warmup, outcome, segment, ITL basis, its own slo_ok verdict, and where its
    TTFT and ITL stand against the SLOs' targets: how many of the distinct TTFT targets its TTFT is
    within (NULL without a TTFT), and how many ITL targets its ITL is (NULL without an ITL). Being
    within a target means being within every larger one, so a request within c of m targets is
    within the c largest, and its verdict under each SLO follows (_within). The count is a CASE
    tried from the smallest target up, the first it is within giving it: the verdicts themselves,
    one expression per SLO grouped as bits, cost the scan twice as much as a sum of one comparison
    per target (1.0 against 0.56 s of its 1.9 s at 10 million records, 3 SLOs), and that sum about
    2 CPU s more than the CASE (the scan at 100 million records: 18.2-18.9 against 15.9-16.9 CPU s)."""
    slos = list(dict.fromkeys(slos))
    ttfts, itls = sorted({t for t, _ in slos}), sorted({i for _, i in slos})
    params = {f"t{j}": t for j, t in enumerate(ttfts)} | {f"i{j}": i for j, i in enumerate(itls)}

    def within_sql(column: str, p: str, targets: list[float]) -> str:
        arms = " ".join(f"WHEN {column} <= ${p}{j} THEN {len(targets) - j}" for j in range(len(targets)))
        return f"CASE {arms} WHEN {column} IS NOT NULL THEN 0 END"

    rows = rs.con.execute(
        f"""SELECT fleet, warmup, outcome, {SEGMENT_SQL} AS segment, itl_s IS NOT NULL AS has_itl, itl_basis,
                   {within_sql("ttft_s", "t", ttfts)} AS ttft_within, {within_sql("itl_s", "i", itls)} AS itl_within, slo_ok,
                   count(*), coalesce(sum({_TOKENS}), 0), coalesce(sum({_TOKENS} * {_TOKENS}), 0),
                   min(wall_start), min(scheduled_s), max(scheduled_s)
            FROM records GROUP BY ALL""",
        params or None,
    ).fetchall()
    free: dict[str, _Tally] = {}
    outcomes: dict[str, dict[str, int]] = {}
    bases: dict[str, dict[str, int]] = {}
    judged: list[dict[str, SloTally]] = [{} for _ in slos]
    for fleet, warmup, outcome, segment, has_itl, basis, ttft_in, itl_in, slo_ok, n, tok, sq, wall, first, last in rows:
        fleet, n, tok, sq = str(fleet), int(n), int(tok), int(sq)
        free.setdefault(fleet, _Tally()).add(bool(warmup), str(outcome), n, tok, wall, first, last, str(segment))
        if warmup is not False:  # what follows counts `NOT warmup`, which a NULL is not either
            continue
        counts = outcomes.setdefault(fleet, {})
        counts[str(outcome)] = counts.get(str(outcome), 0) + n
        if outcome == "ok" and has_itl:
            by_basis = bases.setdefault(fleet, {})
            basis = "unknown" if basis is None else str(basis)  # records from before the field
            by_basis[basis] = by_basis.get(basis, 0) + n
        sent = n if outcome is not None and outcome != Outcome.NOT_SENT.value else 0
        for i, by_fleet in enumerate(judged):
            got = SloTally(sent=sent)
            if outcome == "ok":
                ttft, itl = slos[i]
                within = _within(ttft_in, ttfts, ttft) and (itl_in is None or _within(itl_in, itls, itl))
                got = replace(got, disagreements=n if within != slo_ok else 0)  # slo_ok NULL disagrees too
                if within:
                    got = replace(got, successful=n, successful_tokens=tok, successful_tokens_sq=sq)
            by_fleet[fleet] = by_fleet.get(fleet, SloTally()) + got
    rs.derived[("slo_free_tallies",)] = free
    rs.derived[("outcome_counts",)] = {f: dict(sorted(c.items())) for f, c in sorted(outcomes.items())}
    rs.derived[("itl_basis_counts",)] = {f: dict(sorted(c.items())) for f, c in sorted(bases.items())}
    for (ttft, itl), by_fleet in zip(slos, judged, strict=True):
        rs.derived[("slo_tallies", ttft, itl)] = by_fleet


def _within(count: int | None, targets: list[float], target: float) -> bool:
    """Whether a value within `count` of the sorted `targets` (None: no value) is within `target`,
    one of them: it is within the `count` largest."""
    return count is not None and count >= len(targets) - targets.index(target)


def _slo_free_tallies(rs: RecordSet) -> dict[str, _Tally]:
    """Per fleet, what measure_fleets takes from the records whatever the SLO (tally)."""
    if ("slo_free_tallies",) not in rs.derived:
        tally(rs, [])
    tallies: dict[str, _Tally] = rs.derived[("slo_free_tallies",)]
    return tallies


@dataclass(frozen=True)
class SloTally:
    """One fleet's non-warmup requests judged by one SLO (the per-request SLO recomputed from ttft_s
    and itl_s, module docstring)."""

    successful: int = 0  # completed ok and within the SLO
    successful_tokens: int = 0  # their output tokens, the server's count where it gave one
    disagreements: int = 0  # completed ok, and loadgen's own slo_ok verdict differs
    sent: int = 0  # requests sent (outcome other than not_sent)
    successful_tokens_sq: int = 0  # over the requests sent, the sum of each one's successful tokens squared

    def __add__(self, other: SloTally) -> SloTally:
        return SloTally(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def tokens_var(self) -> float:
        """Population variance, over the requests sent, of each one's successful tokens (0 unless
        it was successful): with `sent` and `successful_tokens`, the interval of their sum
        (analysis.measure.intervals.successful_tokens_ci). From the exact integer sums, rounded
        once, so every run gives the same figure: duckdb's var_pop merges its threads' partial
        states in the order they finish, which moves its last bits from run to run."""
        n = self.sent
        return float(Fraction(n * self.successful_tokens_sq - self.successful_tokens**2, n * n)) if n else 0.0


def slo_tallies(rs: RecordSet, ttft_slo_s: float, itl_slo_s: float) -> dict[str, SloTally]:
    """Per fleet, its SloTally under this SLO, for measure_fleets and the capacity interval alike:
    from the scan that named the SLO (tally), or one scan for it alone."""
    key = ("slo_tallies", ttft_slo_s, itl_slo_s)
    if key not in rs.derived:
        tally(rs, [(ttft_slo_s, itl_slo_s)])
    judged: dict[str, SloTally] = rs.derived[key]
    return judged


@dataclass
class _Tally:
    """One fleet's sums over the groups of _slo_free_tallies."""

    requests: int = 0
    warmup: int = 0
    ok: int = 0
    errors: int = 0
    quality_failed: int = 0
    no_text: int = 0
    not_sent: int = 0
    ok_tokens: int = 0
    wall_start: float | None = None
    # Per segment (SEGMENT_SQL): non-warmup requests sent, first and last scheduled send
    spans: dict[str, _Span] = field(default_factory=dict)

    def add(
        self,
        warmup: bool,
        outcome: str,
        n: int,
        tok: int,
        wall: float | None,
        first: float | None,
        last: float | None,
        segment: str = "",
    ) -> None:
        if wall is not None:
            self.wall_start = wall if self.wall_start is None else min(self.wall_start, wall)
        if warmup:
            self.warmup += n
            return
        self.requests += n
        self.errors += n if outcome in ERROR_OUTCOMES else 0
        self.quality_failed += n if outcome == "quality_fail" else 0
        self.no_text += n if outcome == Outcome.NO_TEXT.value else 0
        if outcome == "not_sent":
            self.not_sent += n
        else:
            self.spans.setdefault(segment, _Span()).add(n, first, last)
        if outcome == "ok":
            self.ok += n
            self.ok_tokens += tok

    def measure(
        self,
        fleet: str,
        judged: SloTally,
        p95_ttft: float | None,
        p95_itl: float | None,
        starts: Mapping[str, float] | None = None,
    ) -> Measure:
        first, end = self._window(starts or {})
        window = max(end - first, 0.0) if first is not None and end is not None else 0.0  # 0: no window
        sent = self.requests - self.not_sent
        return Measure(
            fleet=fleet,
            requests=self.requests,
            warmup_excluded=self.warmup,
            completed_ok=self.ok,
            errors=self.errors,
            quality_failed=self.quality_failed,
            no_text=self.no_text,
            not_sent=self.not_sent,
            slo_violations=self.ok - judged.successful,
            successful_requests=judged.successful,
            successful_output_tokens=judged.successful_tokens,
            completed_output_tokens=self.ok_tokens,
            slo_verdict_disagreements=judged.disagreements,
            wall_start=self.wall_start,
            window_start_s=first,
            window_end_s=end,
            p95_ttft_s=p95_ttft,
            p95_itl_s=p95_itl,
            window_s=window,
            error_rate=self.errors / sent if sent else None,
            # goodput: successful output tokens per second over the measured window (whole fleet)
            goodput_tok_s=judged.successful_tokens / window if window > 0 else None,
        )

    def _window(self, starts: Mapping[str, float]) -> tuple[float | None, float | None]:
        """The window's start and end in the step's schedule seconds.

        A step continued by settle segments replayed one schedule in parts, each segment's
        scheduled_s counted from its own 0 (`starts`: where each part begins on the step's
        timeline). Placed there, the parts are one arrival span, measured as one step over the
        same records would be: a segment of any size, one request included, adds to it (summing
        each part's own widened span would need two arrivals in every part). Without a segment's
        start (a run directory from before segment.json), each part's span is added up as before."""
        parts = {seg: sp for seg, sp in self.spans.items() if sp.first is not None and sp.last is not None}
        if "" not in parts:
            return None, None
        if all(seg == "" or seg in starts for seg in parts):
            pooled = _Span()
            for seg, sp in parts.items():
                at = starts.get(seg, 0.0)
                pooled.add(sp.sent, (sp.first or 0.0) + at, (sp.last or 0.0) + at)
            w = pooled.window_s()
            return pooled.first, None if w is None else (pooled.first or 0.0) + w
        first = parts[""].first
        windows = [s.window_s() for s in self.spans.values()]
        if first is None or any(w is None for w in windows):
            return first, None
        return first, first + sum(w for w in windows if w is not None)


@dataclass
class _Span:
    sent: int = 0
    first: float | None = None
    last: float | None = None

    def add(self, n: int, first: float | None, last: float | None) -> None:
        self.sent += n
        if first is not None and last is not None:
            self.first = first if self.first is None else min(self.first, first)
            self.last = last if self.last is None else max(self.last, last)

    def window_s(self) -> float | None:
        """The sent requests' schedule plus one mean inter-arrival gap (n - 1 gaps over n arrivals)."""
        if self.sent > 1 and self.first is not None and self.last is not None:
            return (self.last - self.first) * self.sent / (self.sent - 1)
        return None


def outcome_counts(rs: RecordSet) -> dict[str, dict[str, int]]:
    """Non-warmup requests per fleet and outcome (every outcome value present, zeros omitted), sorted
    by both (tally)."""
    if ("outcome_counts",) not in rs.derived:
        tally(rs, [])
    counts: dict[str, dict[str, int]] = rs.derived[("outcome_counts",)]
    return counts


def itl_basis_counts(rs: RecordSet) -> dict[str, dict[str, int]]:
    """Completed, non-warmup requests per fleet by how their ITL was computed (records.itl_basis):
    "server_tokens", "chunks" (no server usage), "unknown" (records older than the field); sorted
    by both (tally)."""
    if ("itl_basis_counts",) not in rs.derived:
        tally(rs, [])
    counts: dict[str, dict[str, int]] = rs.derived[("itl_basis_counts",)]
    return counts


def load_windows(rs: RecordSet) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (fleet, segment: SEGMENT_SQL, "" for the step itself), the wall-clock window from its first
    request sent to its last request's end (scheduled send + lifetime; an answer never completed
    ends at its first token or its send), Unix seconds: the time the load itself took, without the
    runner's start and stop around it, and the window the server's histograms are read over."""
    rows = rs.con.execute(
        f"SELECT fleet, {SEGMENT_SQL} AS segment, min(wall_start + sent_s), "
        "max(wall_start + scheduled_s + coalesce(e2e_s, ttft_s, send_lag_s, 0)) "
        "FROM records WHERE sent_s IS NOT NULL GROUP BY ALL"
    ).fetchall()
    return {(str(f), str(seg)): (float(a), max(float(a), float(b))) for f, seg, a, b in rows if a is not None}


def load_span_s(rs: RecordSet) -> dict[str, float]:
    """Per fleet, wall seconds from its first request sent to its last request's end, over every
    segment (load_windows)."""
    spans: dict[str, tuple[float, float]] = {}
    for (fleet, _), (a, b) in load_windows(rs).items():
        lo, hi = spans.get(fleet, (a, b))
        spans[fleet] = (min(lo, a), max(hi, b))
    return {f: max(b - a, 0.0) for f, (a, b) in spans.items()}


def median_e2e(rs: RecordSet, ttft_slo_s: float | None = None, itl_slo_s: float | None = None) -> dict[str, float]:
    """Median scheduled-send -> last-token time of each fleet's completed, non-warmup requests;
    with the SLO given, of those that also met it (a lifetime not inflated by an overload's queue)."""
    met = f"AND {_SLO_MET}" if ttft_slo_s is not None and itl_slo_s is not None else ""
    rows = rs.con.execute(
        "SELECT fleet, quantile_cont(e2e_s, 0.5) FROM records "
        f"WHERE NOT warmup AND outcome = 'ok' AND e2e_s IS NOT NULL {met} GROUP BY fleet",
        {"ttft": ttft_slo_s, "itl": itl_slo_s} if met else None,
    ).fetchall()
    return {str(f): float(v) for f, v in rows if v is not None}


@dataclass(frozen=True)
class Saturation:
    """Whether one instance of a fleet was driven to its batch limit during the run.

    Per-instance SLO-compliant throughput is a capacity figure only when the instance was
    saturated; at low offered load goodput equals the offered load, the throughput is a
    lower bound and a fleet sized from it an upper bound."""

    fleet: str
    peak_in_flight: int  # whole fleet, non-warmup requests
    instances_measured: int
    max_concurrency: int  # sequences one instance runs at once: max_concurrency x replicas_per_instance

    @property
    def peak_in_flight_per_instance(self) -> float | None:
        return self.peak_in_flight / self.instances_measured if self.instances_measured > 0 else None

    @property
    def saturated(self) -> bool:
        per = self.peak_in_flight_per_instance
        return per is not None and per >= self.max_concurrency

    def as_dict(self) -> dict[str, object]:
        return {
            "peak_in_flight": self.peak_in_flight,
            "peak_in_flight_per_instance": self.peak_in_flight_per_instance,
            "max_concurrency": self.max_concurrency,
            "saturated": self.saturated,
        }


def peak_in_flight(rs: RecordSet) -> dict[str, int]:
    """Peak number of non-warmup requests in flight at once, per fleet (whole fleet, not per instance).

    A request is in flight from its actual send (scheduled_s + send_lag_s, else sent_s) to its
    last token (scheduled_s + e2e_s: E2E is measured from the scheduled send). Requests never
    sent, or without an E2E (errors whose end is unknown), are not counted. Ends count before
    starts at the same instant, so back-to-back requests do not overlap.

    The count only rises at a start, so the peak is the largest, over the starts s, of
    #(starts <= s) - #(ends <= s): counted per time bin in numpy, only the bins that may hold it
    sorted (_peak), where a SQL running sum over every start and end event sorts twice as many
    rows in one window (8.5 s of a 10-million-record report, bench/analysis_throughput.py). Computed once per record set
    (RecordSet.derived): the saturation check and the capacity steps both read it."""
    if ("peak_in_flight",) in rs.derived:
        known: dict[str, int] = rs.derived[("peak_in_flight",)]
        return dict(known)
    live = "fleet = $fleet AND NOT warmup AND outcome <> 'not_sent' AND e2e_s IS NOT NULL"

    def fetch(fleet: str) -> tuple[list[npt.NDArray[np.float64]], list[npt.NDArray[np.float64]]]:
        # The send as two parts, scheduled_s + send_lag_s and, where send_lag_s is missing, sent_s:
        # duckdb decodes every column an expression names (coalesce's sent_s too), and the second
        # part's filter skips the row groups whose statistics say no send_lag_s is missing
        # (the fetch took 3.1 instead of 4.9 CPU s for 50 million requests). The times stay in the
        # batches duckdb wrote them to (_fetch_chunks): joined, they were 0.8 GB more memory per
        # fleet at 100 million records, new pages costing more than the arithmetic on them.
        got = _fetch_chunks(
            rs,
            f"""SELECT t0, t1 FROM (
                  SELECT scheduled_s + send_lag_s AS t0, scheduled_s + e2e_s AS t1 FROM records
                  WHERE {live} AND send_lag_s IS NOT NULL
                  UNION ALL
                  SELECT sent_s, scheduled_s + e2e_s FROM records WHERE {live} AND send_lag_s IS NULL)
                WHERE t0 IS NOT NULL AND t1 > t0""",
            {"fleet": fleet},
        )
        return got["t0"], got["t1"]

    out: dict[str, int] = {}
    for fleet, (starts, ends) in _one_ahead(fetch, rs.fleets()):
        if any(len(c) for c in starts):
            out[fleet] = _peak(starts, ends)
        del starts, ends  # before the next fleet's arrays arrive: at most two fleets' in memory
    rs.derived[("peak_in_flight",)] = out
    return dict(out)


def _fetch_arrow(rs: RecordSet, sql: str, params: Mapping[str, object]) -> Any:
    """A query's result as an Arrow table (pyarrow.Table), on a cursor of its own (the query may run
    in a thread of _one_ahead beside the caller's). Through a relation rather than execute() (the
    DB-API result's copy in between cost a tenth to a fifth more CPU), and as Arrow batches, which
    duckdb builds on its threads, where fetchnumpy() converted the whole result on one (duckdb 2.0.1)."""
    with rs.cursor() as cursor:
        return cursor.sql(sql, params=dict(params)).to_arrow_table()


def _fetch_numpy(rs: RecordSet, sql: str, params: Mapping[str, object]) -> dict[str, npt.NDArray[Any]]:
    """A query's columns as numpy arrays (_fetch_arrow), each joined from its batches. A NULL comes
    back as NaN (a float column) or makes an integer column float: every caller leaves them out."""
    table = _fetch_arrow(rs, sql, params)
    return {name: table.column(name).to_numpy() for name in table.column_names}


def _fetch_chunks(rs: RecordSet, sql: str, params: Mapping[str, object]) -> dict[str, list[npt.NDArray[Any]]]:
    """A query's columns as numpy views of duckdb's Arrow batches (_fetch_arrow), one per batch:
    no copy (where a batch holds a NULL, that batch is copied, the NULL as _fetch_numpy gives it)."""
    table = _fetch_arrow(rs, sql, params)
    return {name: [c.to_numpy(zero_copy_only=False) for c in table.column(name).chunks] for name in table.column_names}


def _one_ahead(fetch: Callable[[K], V], keys: Iterable[K]) -> Iterator[tuple[K, V]]:
    """(key, fetch(key)) for each key in turn, the next key's fetch running in a thread while the
    caller works on this one's result. A fetch is duckdb on both cores (with the new pages its
    batches take); the caller's work is numpy passes over the arrays (_peak), on one core: overlapped,
    they keep both cores busy (the wall time falls, not the CPU time)."""
    todo = list(keys)
    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(fetch, todo[0]) if todo else None
        for i, key in enumerate(todo):
            assert ahead is not None
            got = ahead.result()
            ahead = pool.submit(fetch, todo[i + 1]) if i + 1 < len(todo) else None
            yield key, got
            del got


# Starts per time bin, on average, in _peak: few enough that a bin's bound (in flight at its start
# plus its starts) is within the level's own ups and downs, so that only bins near the peak are
# computed exactly (the bench's level wanders by about 40 around 58,000 in flight).
_PEAK_BIN_STARTS = 16
_PEAK_BLOCK = 1 << 18  # times binned at once in _peak: 2 MiB of scratch, in the processor's caches


def _peak(starts: Sequence[npt.NDArray[np.float64]], ends: Sequence[npt.NDArray[np.float64]]) -> int:
    """max over the starts s of #(starts <= s) - #(ends <= s) (0 without starts): the number in flight
    just after each start, ends counted before starts at the same instant. `starts` and `ends` each
    come in chunks (the batches of _fetch_chunks), in any order and of any lengths.

    Without sorting every time: the times are binned (a monotone function of the time, so every
    time in a bin is above every time in an earlier one), and counting per bin gives the number in
    flight at each bin's start exactly. That number is at most the peak (it is reached at the last
    start before the bin), and a bin's starts can raise it by no more than their count: only the
    bins where that bound passes the best number at a bin's start can hold the peak, and only
    their times are sorted and searched (the bench's: about one start in a thousand, against two
    sorts of 50 million times and a search of every start, 12 of the report's 59 CPU seconds at
    100 million records)."""
    starts, ends = [c for c in starts if len(c)], [c for c in ends if len(c)]
    if not starts:
        return 0
    lo = min(float(c.min()) for c in starts)
    span = max(float(c.max()) for c in ends) - lo
    bins = max(sum(len(c) for c in starts) // _PEAK_BIN_STARTS, 1)
    # A span that is not finite (a NaN or infinite time) puts every time in one bin: all exact.
    scale = bins / span if np.isfinite(span) and span > 0 else 0.0
    # A block's worth of scratch, used again for every block: new pages cost as much as the
    # arithmetic, and scratch as long as the times was a sixth of the memory the peak touched.
    scratch = np.empty(_PEAK_BLOCK)

    def bin_of(chunks: Sequence[npt.NDArray[np.float64]]) -> npt.NDArray[np.int32]:
        # The chunks' bins, one after the other. int32: half the memory of the default, and bins
        # (a sixteenth of the starts) fit in it.
        out = np.zeros(sum(len(c) for c in chunks), dtype=np.int32)
        if scale == 0.0:
            return out
        at = 0
        for chunk in chunks:
            for i in range(0, len(chunk), _PEAK_BLOCK):
                t = chunk[i : i + _PEAK_BLOCK]
                x = np.subtract(t, lo, out=scratch[: len(t)])
                x *= scale
                b = out[at : at + len(t)]
                np.copyto(b, x, casting="unsafe")  # toward zero, as astype(np.int32)
                np.minimum(b, bins - 1, out=b)  # the last end lands on `bins`
                at += len(t)
        return out

    def chosen(chunks: Sequence[npt.NDArray[np.float64]], keep: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        # the times whose place in bin_of's order `keep` marks
        ends_at = np.cumsum([len(c) for c in chunks])
        return np.concatenate([c[keep[e - len(c) : e]] for c, e in zip(chunks, ends_at, strict=True)])

    at_s, at_e = bin_of(starts), bin_of(ends)
    n_s, n_e = np.bincount(at_s, minlength=bins), np.bincount(at_e, minlength=bins)
    before_s, before_e = np.cumsum(n_s) - n_s, np.cumsum(n_e) - n_e  # starts and ends in earlier bins
    level = before_s - before_e  # in flight at each bin's start
    best = int(level.max())
    maybe = level + n_s > best
    if not maybe.any():
        return best
    # The bins that may hold the peak, exactly: each start's count of starts and ends up to it is
    # the count in the bins before its own plus the count in its own bin up to it, which the
    # sorted times of those bins alone give (their own earlier bins' counted out).
    sub_s, sub_e = np.sort(chosen(starts, maybe[at_s])), np.sort(chosen(ends, maybe[at_e]))
    own = bin_of([sub_s])
    kept_s, kept_e = np.cumsum(n_s * maybe) - n_s * maybe, np.cumsum(n_e * maybe) - n_e * maybe
    offset = (before_s - kept_s) - (before_e - kept_e)
    in_flight = offset[own] + np.searchsorted(sub_s, sub_s, side="right") - np.searchsorted(sub_e, sub_s, side="right")
    return max(best, int(in_flight.max()))


def goodput_series(
    rs: RecordSet, windows: Mapping[str, tuple[float, float]], ttft_slo_s: float, itl_slo_s: float, bins: int = 60
) -> dict[str, list[tuple[float, float]]]:
    """Per fleet, successful output tokens/s in equal bins by completion time over its window
    (start_s, end_s): (bin start offset, tok/s); [] for an empty window.

    `bins` bins span the window; requests that complete after it (the drain) get further bins of
    the same width, up to the last completion, rather than being piled into the window's last bin.
    One scan bins every fleet, each by its own start and width (query parameters, so the
    arithmetic is that of a query per fleet). A fleet without a window has no start: its bin is
    NULL, and left out here. No filter on the fleet: testing each record's against the names cost
    the scan about 6% (100 million records: 5.7 against 6.1 CPU s), where nearly every fleet has one."""
    spans = {f: (start, (end - start) / bins) for f, (start, end) in windows.items() if end > start and bins >= 1}
    out: dict[str, list[tuple[float, float]]] = {f: [] for f in windows}
    if not spans:
        return out
    params: dict[str, object] = {"ttft": ttft_slo_s, "itl": itl_slo_s}
    for i, (f, (start, width)) in enumerate(spans.items()):
        params |= {f"f{i}": f, f"s{i}": start, f"w{i}": width}

    def per_fleet(p: str) -> str:
        return "CASE fleet " + " ".join(f"WHEN $f{i} THEN ${p}{i}" for i in range(len(spans))) + " END"

    rows = rs.con.execute(
        f"""SELECT fleet, CAST(floor((scheduled_s + coalesce(e2e_s, 0) - {per_fleet("s")}) / {per_fleet("w")}) AS BIGINT) AS b,
                   sum({_TOKENS})
            FROM records
            WHERE NOT warmup AND outcome = 'ok' AND {_SLO_MET}
            GROUP BY fleet, b""",
        params,
    ).fetchall()
    per_bin: dict[str, dict[int, float]] = {f: {} for f in spans}
    for f, b, t in rows:
        if b is not None and b >= 0:
            per_bin[str(f)][int(b)] = float(t)
    for f, (start, width) in spans.items():
        n = max([bins, *(b + 1 for b in per_bin[f])])
        out[f] = [(start + i * width, per_bin[f].get(i, 0.0) / width) for i in range(n)]
    return out


def _latency_values(column: str, where: str) -> str:
    """SELECT fleet, v: the non-warmup values of `column` as the P95s take them (LATENCY_SQL), of
    the records `where` selects.

    In two parts, as LATENCY_SQL reads: a request not abandoned gives its column as it is, an
    abandoned one goes through the CASE. duckdb decodes every column an expression names, so the
    first part reads only the column itself, and the second part's filter skips the row groups
    whose statistics hold no abandoned request (the ITL fetch: a fifth to a third less CPU). The
    first part's test is IS DISTINCT FROM, what `NOT coalesce(outcome = ..., false)` means: scanning
    100 million TTFTs with it took 2.6-3.0 CPU s, against 3.1-3.4 s (2.3-2.4 s with no outcome test)."""
    if column not in LATENCY_SQL:
        raise ValueError(f"no latency column {column!r}")
    v = LATENCY_SQL[column]
    return f"""SELECT fleet, CAST({column} AS DOUBLE) AS v FROM records
            WHERE {where} AND NOT warmup AND {column} IS NOT NULL
              AND outcome IS DISTINCT FROM '{Outcome.SLO_ABANDONED.value}'
            UNION ALL
            SELECT fleet, CAST({v} AS DOUBLE) FROM records WHERE {where} AND NOT warmup AND {_ABANDONED} AND {v} IS NOT NULL"""


def latency_array(rs: RecordSet, fleet: str, column: str) -> npt.NDArray[np.float64]:
    """Non-warmup values of `column` as the P95s take them (LATENCY_SQL), unsorted, as one numpy
    array straight from duckdb (no Python object per request)."""
    got = _fetch_numpy(rs, f"SELECT v FROM ({_latency_values(column, 'fleet = $fleet')})", {"fleet": fleet})["v"]
    return np.asarray(got, dtype=np.float64)


CDF_QUANTILES = [round((i + 1) / 50, 6) for i in range(50)]  # the points of a latency CDF plot


@dataclass(frozen=True)
class LatencyOrder:
    """One fleet's latencies as the P95s take them (latency_array), reduced to what the report
    reads of them: the P95 with its 95% interval (core.stats) and the CDF's points: about a
    hundred order statistics, found without reading every value (_order)."""

    p95: stats.QuantileCI  # the point is the nearest-rank P95
    cdf: list[tuple[float, float]]  # (latency, cumulative fraction): the nearest-rank quantiles at CDF_QUANTILES


def latency_order(rs: RecordSet, fleet: str, column: str) -> LatencyOrder:
    """The fleet's LatencyOrder of `column`, computed on first use and kept with the records."""
    (order,) = latency_orders(rs, [(fleet, column)])
    return order


def latency_orders(rs: RecordSet, wanted: Iterable[tuple[str, str]]) -> list[LatencyOrder]:
    """The LatencyOrder of each (fleet, column), those not yet known computed in turn (_order), and
    kept with the records."""
    keys = [("latency_order", fleet, column) for fleet, column in wanted]
    for key in dict.fromkeys(keys):
        if key not in rs.derived:
            rs.derived[key] = _order(rs, str(key[1]), str(key[2]))
    return [rs.derived[k] for k in keys]


# Latencies are bucketed by floor(v x 2^16) (15 microseconds): scaling by a power of two is exact,
# so the bucket is a monotone function of the value and every value in a bucket is above every value
# in an earlier one. Fine enough that the bench's values (a thousand distinct ones) each have a
# bucket of their own, and a real run's continuous ones a few thousand values per bucket.
_LATENCY_BUCKET = "floor(v * 65536.0)"


def _order(rs: RecordSet, fleet: str, column: str) -> LatencyOrder:
    """The fleet's LatencyOrder of `column`, reading only the order statistics it needs.

    One grouped scan counts the values per bucket (_LATENCY_BUCKET) with the bucket's least and
    greatest value; the running counts say which bucket holds each wanted rank, and the rank's
    value is the bucket's own where its least and greatest are equal (the bench's: every one).
    Only the other buckets' values are fetched, by value range (every value between a bucket's
    least and greatest is in it), and sorted. A fetch and sort of every value took 10.5 of the
    report's 59 CPU seconds at 100 million records; the TTFTs of both fleets, on a loaded machine,
    8.9 CPU s fetched and sorted against 7.0 counted per bucket. A query per fleet: grouping by the
    fleet's name beside the bucket cost a quarter more (10 million records)."""
    values = f"SELECT v FROM ({_latency_values(column, 'fleet = $fleet')})"
    got = _fetch_numpy(
        rs,
        f"SELECT {_LATENCY_BUCKET} AS b, count(*) AS n, min(v) AS least, max(v) AS greatest "
        f"FROM ({values}) GROUP BY b ORDER BY b",
        {"fleet": fleet},
    )
    ends = np.cumsum(np.asarray(got["n"], dtype=np.int64))  # the running count to each bucket's end
    least, greatest = np.asarray(got["least"], dtype=np.float64), np.asarray(got["greatest"], dtype=np.float64)
    n = int(ends[-1]) if len(ends) else 0
    wanted = ({nearest_rank(n, q) for q in CDF_QUANTILES} | set(stats.quantile_ci_ranks(n))) if n else set()
    bucket = {r: int(np.searchsorted(ends, r)) for r in sorted(wanted)}  # the first bucket ending at r or after
    fetch = sorted({i for i in bucket.values() if least[i] != greatest[i]})
    params: dict[str, object] = {"fleet": fleet}
    for j, i in enumerate(fetch):
        params |= {f"l{j}": float(least[i]), f"g{j}": float(greatest[i])}
    ranges = " OR ".join(f"v BETWEEN $l{j} AND $g{j}" for j in range(len(fetch)))
    fetched = np.sort(_fetch_numpy(rs, f"{values} WHERE {ranges}", params)["v"]) if fetch else np.array([])
    at: dict[int, float] = {}
    for r, i in bucket.items():
        if least[i] == greatest[i]:
            at[r] = float(least[i])
        else:  # r's place among the fetched values: those of earlier buckets, then its own before it
            below = int(np.searchsorted(fetched, least[i]))
            at[r] = float(fetched[below + r - (int(ends[i - 1]) if i else 0) - 1])
    return _order_at(n, at)


def _order_at(n: int, at: Mapping[int, float]) -> LatencyOrder:
    """The LatencyOrder of n values, `at` their order statistics at the ranks it reads."""
    p95 = stats.quantile_ci_at(n, lambda ranks: {r: at[r] for r in ranks})
    return LatencyOrder(p95, [(at[nearest_rank(n, q)], q) for q in CDF_QUANTILES] if n else [])


def latency_cdf(rs: RecordSet, fleet: str, column: str) -> list[tuple[float, float]]:
    """(latency, cumulative fraction) pairs for a CDF plot, from raw non-warmup records."""
    return latency_order(rs, fleet, column).cdf
