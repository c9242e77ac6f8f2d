"""Successful output tokens, fleet percentiles and SLO-compliant throughput, from per-request records.

DESIGN.md: a token is successful when its request completed without error, passed the
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
a first token (duckdb quantile_disc), i.e. over raw records, never averaged per replica.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from analysis.sources.records import RecordSet
from core.records import ERROR_OUTCOMES, Outcome


@dataclass(frozen=True)
class FleetMeasure:
    fleet: str
    requests: int  # non-warmup requests scheduled in the window
    warmup_excluded: int
    completed_ok: int
    errors: int
    quality_failed: int
    no_text: int  # usage reported output tokens but no chunk carried text: not a success
    not_sent: int
    slo_violations: int  # completed ok but missed the per-request SLO
    successful_requests: int
    successful_output_tokens: int
    completed_output_tokens: int  # all ok requests, SLO met or not (the work the fleet did)
    slo_verdict_disagreements: int  # ok requests where loadgen's slo_ok differs from the recomputed one
    wall_start: float | None
    window_start_s: float | None
    window_end_s: float | None
    p95_ttft_s: float | None
    p95_itl_s: float | None

    @property
    def window_s(self) -> float:
        if self.window_start_s is None or self.window_end_s is None:
            return 0.0
        return max(self.window_end_s - self.window_start_s, 0.0)

    @property
    def error_rate(self) -> float | None:
        sent = self.requests - self.not_sent
        return self.errors / sent if sent else None

    @property
    def goodput_tok_s(self) -> float | None:
        """Successful output tokens per second over the measured window (whole fleet)."""
        return self.successful_output_tokens / self.window_s if self.window_s > 0 else None

    def slo_pass(self, ttft_p95_s: float, itl_p95_s: float, max_error_rate: float) -> bool:
        """Fleet-level SLO: P95 TTFT and P95 ITL under target and the error ceiling held."""
        if self.p95_ttft_s is None or self.error_rate is None:
            return False
        itl_ok = self.p95_itl_s is None or self.p95_itl_s <= itl_p95_s
        return self.p95_ttft_s <= ttft_p95_s and itl_ok and self.error_rate <= max_error_rate

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.update(window_s=self.window_s, error_rate=self.error_rate, goodput_tok_s=self.goodput_tok_s)
        return d


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
_SLO_MET = "(ttft_s IS NOT NULL AND ttft_s <= $ttft AND (itl_s IS NULL OR itl_s <= $itl))"


def measure_fleets(rs: RecordSet, ttft_slo_s: float, itl_slo_s: float, *, percentiles: bool = True) -> dict[str, FleetMeasure]:
    """One scan over the records computes every fleet's counts, tokens, window and P95s.

    The P95s do not depend on the SLO thresholds; `percentiles=False` skips them (None) for
    callers that re-evaluate goodput under another SLO and already hold them."""
    errs = ", ".join(f"'{o}'" for o in sorted(ERROR_OUTCOMES))
    sql = f"""
    WITH r AS (
      SELECT fleet, warmup, outcome, slo_ok, ttft_s, itl_s, scheduled_s, sent_s, e2e_s, wall_start,
             {_TOKENS} AS tok, {_SLO_MET} AS slo_met, {LATENCY_SQL["ttft_s"]} AS ttft_v, {LATENCY_SQL["itl_s"]} AS itl_v
      FROM records)
    SELECT fleet,
      count(*) FILTER (WHERE NOT warmup),
      count(*) FILTER (WHERE warmup),
      count(*) FILTER (WHERE NOT warmup AND outcome = 'ok'),
      count(*) FILTER (WHERE NOT warmup AND outcome IN ({errs})),
      count(*) FILTER (WHERE NOT warmup AND outcome = 'quality_fail'),
      count(*) FILTER (WHERE NOT warmup AND outcome = '{Outcome.NO_TEXT.value}'),
      count(*) FILTER (WHERE NOT warmup AND outcome = 'not_sent'),
      count(*) FILTER (WHERE NOT warmup AND outcome = 'ok' AND NOT slo_met),
      count(*) FILTER (WHERE NOT warmup AND outcome = 'ok' AND slo_met),
      coalesce(sum(tok) FILTER (WHERE NOT warmup AND outcome = 'ok' AND slo_met), 0),
      coalesce(sum(tok) FILTER (WHERE NOT warmup AND outcome = 'ok'), 0),
      count(*) FILTER (WHERE NOT warmup AND outcome = 'ok' AND slo_met IS DISTINCT FROM slo_ok),
      min(wall_start),
      min(scheduled_s) FILTER (WHERE NOT warmup AND outcome <> 'not_sent'),
      CASE WHEN count(*) FILTER (WHERE NOT warmup AND outcome <> 'not_sent') > 1 THEN
        min(scheduled_s) FILTER (WHERE NOT warmup AND outcome <> 'not_sent')
        + (max(scheduled_s) FILTER (WHERE NOT warmup AND outcome <> 'not_sent')
           - min(scheduled_s) FILTER (WHERE NOT warmup AND outcome <> 'not_sent'))
          * count(*) FILTER (WHERE NOT warmup AND outcome <> 'not_sent')
          / (count(*) FILTER (WHERE NOT warmup AND outcome <> 'not_sent') - 1)
      END,
      {"quantile_disc(ttft_v, 0.95) FILTER (WHERE NOT warmup AND ttft_v IS NOT NULL)" if percentiles else "NULL"},
      {"quantile_disc(itl_v, 0.95) FILTER (WHERE NOT warmup AND itl_v IS NOT NULL)" if percentiles else "NULL"}
    FROM r GROUP BY fleet ORDER BY fleet
    """
    rows = rs.con.execute(sql, {"ttft": ttft_slo_s, "itl": itl_slo_s}).fetchall()
    out: dict[str, FleetMeasure] = {}
    for row in rows:
        ints = [int(v) for v in row[1:13]]
        out[row[0]] = FleetMeasure(row[0], *ints, *(None if v is None else float(v) for v in row[13:18]))
    return out


def outcome_counts(rs: RecordSet) -> dict[str, dict[str, int]]:
    """Non-warmup requests per fleet and outcome (every outcome value present, zeros omitted)."""
    rows = rs.con.execute("SELECT fleet, outcome, count(*) FROM records WHERE NOT warmup GROUP BY fleet, outcome ORDER BY fleet, outcome").fetchall()
    out: dict[str, dict[str, int]] = {}
    for fleet, outcome, n in rows:
        out.setdefault(str(fleet), {})[str(outcome)] = int(n)
    return out


def itl_basis_counts(rs: RecordSet) -> dict[str, dict[str, int]]:
    """Completed, non-warmup requests per fleet by how their ITL was computed (records.itl_basis):
    "server_tokens", "chunks" (no server usage), "unknown" (records older than the field)."""
    rows = rs.con.execute(
        "SELECT fleet, coalesce(itl_basis, 'unknown'), count(*) FROM records "
        "WHERE NOT warmup AND outcome = 'ok' AND itl_s IS NOT NULL GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    out: dict[str, dict[str, int]] = {}
    for fleet, basis, n in rows:
        out.setdefault(str(fleet), {})[str(basis)] = int(n)
    return out


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
    sent, or without an E2E (errors whose end is unknown), are not counted. A sweep over the
    start (+1) and end (-1) events sorted by time, ends before starts at the same instant, so
    back-to-back requests do not count as overlapping."""
    sql = """
    WITH iv AS (
      SELECT fleet, coalesce(scheduled_s + send_lag_s, sent_s) AS t0, scheduled_s + e2e_s AS t1
      FROM records
      WHERE NOT warmup AND outcome <> 'not_sent' AND e2e_s IS NOT NULL),
    ev AS (
      SELECT fleet, t0 AS t, 1 AS d FROM iv WHERE t0 IS NOT NULL AND t1 > t0
      UNION ALL
      SELECT fleet, t1 AS t, -1 AS d FROM iv WHERE t0 IS NOT NULL AND t1 > t0),
    run AS (
      SELECT fleet, sum(d) OVER (PARTITION BY fleet ORDER BY t, d ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS n
      FROM ev)
    SELECT fleet, max(n) FROM run GROUP BY fleet ORDER BY fleet
    """
    return {str(f): int(n) for f, n in rs.con.execute(sql).fetchall()}


def goodput_series(
    rs: RecordSet, fleet: str, ttft_slo_s: float, itl_slo_s: float, start_s: float, end_s: float, bins: int = 60
) -> list[tuple[float, float]]:
    """Successful output tokens/s in equal bins by completion time: (bin start offset, tok/s).

    `bins` bins span the window; requests that complete after it (the drain) get further bins of
    the same width, up to the last completion, rather than being piled into the window's last bin."""
    if end_s <= start_s or bins < 1:
        return []
    width = (end_s - start_s) / bins
    rows = rs.con.execute(
        f"""SELECT CAST(floor((scheduled_s + coalesce(e2e_s, 0) - $start) / $w) AS BIGINT) AS b, sum({_TOKENS})
            FROM records
            WHERE fleet = $fleet AND NOT warmup AND outcome = 'ok' AND {_SLO_MET}
            GROUP BY b""",
        {"start": start_s, "w": width, "fleet": fleet, "ttft": ttft_slo_s, "itl": itl_slo_s},
    ).fetchall()
    per_bin = {int(b): float(t) for b, t in rows if b is not None and b >= 0}
    n = max([bins, *(b + 1 for b in per_bin)])
    return [(start_s + i * width, per_bin.get(i, 0.0) / width) for i in range(n)]


def latency_cdf(rs: RecordSet, fleet: str, column: str, points: int = 50) -> list[tuple[float, float]]:
    """(latency, cumulative fraction) pairs for a CDF plot, from raw non-warmup records."""
    if column not in LATENCY_SQL:
        raise ValueError(f"no latency column {column!r}")
    qs = [round((i + 1) / points, 6) for i in range(points)]
    v = LATENCY_SQL[column]
    row = rs.con.execute(
        f"SELECT quantile_disc({v}, $qs) FROM records WHERE fleet = $fleet AND NOT warmup AND {v} IS NOT NULL",
        {"qs": qs, "fleet": fleet},
    ).fetchone()
    if not row or row[0] is None:
        return []
    return [(float(v), q) for v, q in zip(row[0], qs, strict=True)]
