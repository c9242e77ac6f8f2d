"""Prefix caching, reported apart from everything else.

A fleet whose stack caches prompt prefixes (vLLM on GPU does by default; vLLM on Neuron does
not) answers a request that shares a prefix with an earlier one without encoding that prefix,
so its TTFT is not comparable with an uncached fleet's. The seed study asks to report cached
and uncached runs separately; per fleet this section gives
- whether the fleet's stack caches prefixes (core/scheduling.py, with sources),
- the server's hit rate where Prometheus scraped it: increase(vllm:prefix_cache_hits_total)
  / increase(vllm:prefix_cache_queries_total) over the window (tokens, as vLLM counts them),
- TTFT P50 / P95 over requests at least half of whose prompt is a prefix of blocks (Mooncake
  `hash_ids`) already seen in an earlier request (a hit), and over the rest (a miss), from the
  records; and the token share such prefixes make up, the hit rate an unbounded cache reaches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from analysis.errors import SourceUnavailable
from analysis.model import PrefixCache, PrefixCacheFleet, PrefixSplit
from analysis.sources.prometheus import PrometheusSource
from analysis.sources.records import RecordSet
from core.manifest import Manifest
from core.schedule import ScheduledRequest
from core.serving import VLLM_METRICS
from core.traces import BLOCK_TOKENS

HIT_SHARE = 0.5  # a request is a "hit" when at least this share of its prompt is a prefix seen before


def shared_prefix_tokens(schedule: Sequence[ScheduledRequest]) -> dict[int, tuple[int, int]] | None:
    """request_id -> (prompt tokens, tokens of its leading blocks already seen in an earlier
    request), blocks of BLOCK_TOKENS as Mooncake's hash_ids name them, only those the (clipped)
    prompt covers; None when the trace carries no block ids."""
    if not any(r.hash_ids for r in schedule):
        return None
    seen: set[int] = set()
    out: dict[int, tuple[int, int]] = {}
    for r in sorted(schedule, key=lambda r: (r.offset_s, r.request_id)):
        blocks = (r.hash_ids or ())[: -(-r.input_tokens // BLOCK_TOKENS)]
        lead = 0
        for b in blocks:
            if b not in seen:
                break
            lead += 1
        out[r.request_id] = (r.input_tokens, min(r.input_tokens, lead * BLOCK_TOKENS))
        seen.update(blocks)
    return out


def shared_prefix_requests(schedule: Sequence[ScheduledRequest]) -> dict[int, bool] | None:
    """request_id -> whether at least HIT_SHARE of its prompt is a prefix seen before."""
    tokens = shared_prefix_tokens(schedule)
    if tokens is None:
        return None
    return {rid: shared >= HIT_SHARE * total for rid, (total, shared) in tokens.items()}


def _ttft_split(rs: RecordSet, fleet: str, shared: Mapping[int, bool]) -> dict[Literal["hit", "miss"], PrefixSplit]:
    con = rs.con
    con.execute("CREATE OR REPLACE TEMP TABLE prefix_shared (request_id BIGINT, shared BOOLEAN)")
    con.executemany("INSERT INTO prefix_shared VALUES (?, ?)", list(shared.items()))
    rows = con.execute(
        "SELECT p.shared, count(*), quantile_disc(r.ttft_s, 0.5), quantile_disc(r.ttft_s, 0.95) FROM records r "
        "JOIN prefix_shared p USING (request_id) WHERE r.fleet = $fleet AND NOT r.warmup AND r.outcome = 'ok' "
        "AND r.ttft_s IS NOT NULL GROUP BY p.shared",
        {"fleet": fleet},
    ).fetchall()
    out: dict[Literal["hit", "miss"], PrefixSplit] = {}
    for is_shared, n, p50, p95 in rows:
        out["hit" if is_shared else "miss"] = PrefixSplit(requests=int(n), ttft_p50_s=p50, ttft_p95_s=p95)
    return out


def server_hit_rate(src: PrometheusSource, fleet_label: str, fleet: str, start: float, end: float) -> float | None:
    rng = f"{max(1, round(end - start))}s"
    sel = f'{{{fleet_label}="{fleet}"}}'
    hits = src.query(f"sum(increase({VLLM_METRICS['prefix_cache_hits']}{sel}[{rng}]))", end)
    queries = src.query(f"sum(increase({VLLM_METRICS['prefix_cache_queries']}{sel}[{rng}]))", end)
    if not hits or not queries:
        return None
    q = float(queries[0]["value"][1])
    return float(hits[0]["value"][1]) / q if q > 0 else None


def section(
    m: Manifest,
    rs: RecordSet,
    schedule: Sequence[ScheduledRequest] | None,
    server_rates: Mapping[str, float | None] | None = None,
) -> PrefixCache:
    tokens = shared_prefix_tokens(schedule) if schedule is not None else None
    shared = None if tokens is None else {rid: sh >= HIT_SHARE * total for rid, (total, sh) in tokens.items()}
    fleets = {
        f.name: PrefixCacheFleet(
            # the manifest's setting, else the stack's documented default
            caching="on" if f.serving.resolved_prefix_caching else "off",
            stack=f.serving.stack,
            server_hit_rate=(server_rates or {}).get(f.name),
            ttft_by_prefix=None if shared is None else _ttft_split(rs, f.name, shared),
        )
        for f in m.fleets
    }
    if schedule is None:
        trace = "the trace could not be read here, so requests are not split by shared prefix"
    elif shared is None:
        trace = "the trace has no prompt block ids (hash_ids): no request shares a prefix by construction"
    else:
        assert tokens is not None
        total = sum(t for t, _ in tokens.values())
        reuse = sum(sh for _, sh in tokens.values()) / total if total else 0.0
        trace = (
            f"{sum(shared.values())} of {len(shared)} requests reuse at least half their prompt as a prefix seen before (hit); "
            f"{reuse:.1%} of all prompt tokens are such prefixes, the hit rate an unbounded cache would reach"
        )
    differs = len({e.caching for e in fleets.values()}) > 1
    return PrefixCache(
        trace=trace,
        fleets=fleets,
        mixed=differs and shared is not None and any(shared.values()),
        trace_reuse=None
        if tokens is None
        else sum(sh for _, sh in tokens.values()) / max(1, sum(t for t, _ in tokens.values())),
        note="a fleet with prefix caching on skips the shared blocks of a 'hit' request: compare fleets on the 'miss' rows, "
        "and read 'hit' rows as what caching buys",
    )


def server_hit_rates(src: PrometheusSource, measures: Mapping[str, Any]) -> dict[str, float | None]:
    """Per fleet, the server's hit rate from Prometheus over its measured window (the report's
    evidence asks it through the run's pulled answers, analysis.report.evidence)."""
    rates: dict[str, float | None] = {}
    for name, fm in measures.items():
        if fm.wall_start is None or fm.window_start_s is None or fm.window_end_s is None:
            continue
        try:
            rates[name] = server_hit_rate(
                src, "fleet", name, fm.wall_start + fm.window_start_s, fm.wall_start + fm.window_end_s
            )
        except SourceUnavailable:  # the histogram section reports Prometheus's own failure as a gap
            rates[name] = None
    return rates


def report_schedule(m: Manifest) -> list[ScheduledRequest] | None:
    """The schedule the section splits requests by, as build_report gives it: rebuilt from the
    manifest's trace, None where the trace cannot be read here."""
    from core.schedule import ScheduleError, build_schedule
    from core.traces import TraceError

    try:
        return build_schedule(m)
    except (OSError, ScheduleError, TraceError):
        return None
