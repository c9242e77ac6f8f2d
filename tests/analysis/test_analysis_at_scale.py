"""The analysis's large-sample paths (issue 31) against their definitions.

Each fast path is checked against a slow one that is obviously right: the windowed binomial
CDF against the full table, the partial-sort order statistics against a full sort, the
normal interval of a sum against the bootstrap, the sorted-starts peak against a brute-force
sweep, and the grouped measure against per-record Python sums.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.measure import goodput, intervals
from analysis.sources.records import load_records
from core import stats
from core.records import ERROR_OUTCOMES, Outcome
from tests.analysis.synth import manifest, rec, write_jsonl


@pytest.mark.parametrize("n", [1, 2, 20, 71, 72, 100, 500, 3_000, 40_000])
def test_windowed_ranks_equal_the_full_binomial_table(n: int) -> None:
    """quantile_ranks sums the CDF over +-12 sd only; the full table (binom_cdf_table) gives the same ranks."""
    cdf = stats.binom_cdf_table(n, 0.95)
    alpha = 0.05

    def F(k: int) -> float:
        return 0.0 if k < 0 else 1.0 if k >= n else cdf[k]

    low = sum(1 for k in range(n) if F(k) <= alpha / 2)  # ranks r with F(r-1) <= alpha/2: 1..low
    high = next((k + 1 for k in range(n + 1) if F(k) >= 1 - alpha / 2), n + 1)
    lo, hi, cov = stats.quantile_ranks(n, 0.95)
    assert (lo, hi) == (low, min(high, n + 1))
    assert cov == pytest.approx(F(hi - 1) - F(lo - 1), abs=1e-8)  # the full table sums n terms of rounding


def test_window_of_a_large_binomial_is_narrow_and_holds_its_mass() -> None:
    n = 5_000_000
    k0, cdf = stats.binom_cdf_window(n, 0.95)
    assert len(cdf) < 20_000  # O(sqrt(n)) terms, not n
    assert cdf[0] < 1e-25 and cdf[-1] == pytest.approx(1.0, abs=1e-12)
    lo, hi, cov = stats.quantile_ranks(n, 0.95)
    assert k0 < lo < n * 0.95 < hi < n and cov >= 0.95


def test_unsorted_interval_equals_the_sorted_one() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 5, 71, 72, 1_000, 25_000):
        x = rng.lognormal(0.0, 1.0, n).round(3)  # ties included
        assert stats.quantile_ci_unsorted(x) == stats.quantile_ci(sorted(x.tolist()))
    assert stats.quantile_ci_unsorted(np.array([], dtype=np.float64)).n == 0


def _tokens(values: list[int], copies: int) -> np.ndarray:
    return np.tile(np.asarray(values, dtype=np.float64), copies)


def test_normal_interval_agrees_with_the_bootstrap_at_the_switch(recorded_tokens: list[int]) -> None:
    """On recorded per-request successful tokens (a real emulated run, tests/analysis/data), at
    the sample size where sum_ci switches method, the two intervals' ends differ by less than
    the bootstrap's own Monte Carlo noise (the spread of its ends over seeds)."""
    x = _tokens(recorded_tokens, stats.BOOTSTRAP_MAX_N // len(recorded_tokens) + 1)
    normal = stats.normal_sum_ci(len(x), float(x.sum()), float(x.var()))
    assert normal is not None
    boots = [stats.bootstrap_sum_ci(x, seed=s) for s in range(8)]
    ends = np.array([b for b in boots if b is not None])
    noise = ends.std(axis=0, ddof=1)
    mean = ends.mean(axis=0)
    for i in (0, 1):
        assert abs(normal[i] - mean[i]) < 3 * noise[i] + 1e-9, (normal, mean, noise)
    # and the switch is where the module says
    small = stats.sum_ci(stats.BOOTSTRAP_MAX_N, 1.0, 1.0, lambda: x[: stats.BOOTSTRAP_MAX_N])
    large = stats.sum_ci(
        len(x), float(x.sum()), float(x.var()), lambda: pytest.fail("the normal interval reads no sample")
    )
    assert small is not None and "bootstrap" in small.method
    assert large is not None and "normal" in large.method and (large.low, large.high) == pytest.approx(normal)


def test_bootstrap_is_seeded_and_vectorized_in_blocks() -> None:
    x = np.arange(50_000, dtype=np.float64) % 97  # 50,000 x 1,000 draws: several blocks
    a, b = stats.bootstrap_sum_ci(x), stats.bootstrap_sum_ci(x)
    assert a == b and a is not None
    assert a[0] < x.sum() < a[1]
    assert stats.bootstrap_sum_ci(x, seed=1) != a


def _brute_peak(spans: list[tuple[float, float]]) -> int:
    events = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_peak_in_flight_equals_a_brute_force_sweep(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(manifest_data)
    rng = random.Random(5)
    recs, spans = [], []
    for i in range(400):
        sched = float(rng.randrange(0, 60))  # whole seconds: many ties between starts and ends
        e2e = float(rng.randrange(1, 8))
        lag = rng.choice([0.0, 0.0, 1.0, None])  # None: the send is sent_s
        r = rec(m, "g6", i, scheduled=sched, e2e=e2e)
        r.send_lag_s = lag
        recs.append(r)
        assert r.sent_s is not None
        start = r.sent_s if lag is None else sched + lag
        if sched + e2e > start:
            spans.append((start, sched + e2e))
    write_jsonl(tmp_path / "records-g6-w0.jsonl", recs)
    rs = load_records(tmp_path, m.digest)
    assert goodput.peak_in_flight(rs) == {"g6": _brute_peak(spans)}


def test_grouped_measure_equals_per_record_sums(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(manifest_data)
    rng = random.Random(9)
    outcomes = ["ok"] * 6 + sorted(ERROR_OUTCOMES) + ["quality_fail", "no_text", "not_sent"]
    recs = []
    for i in range(600):
        outcome = rng.choice(outcomes)
        ttft = None if outcome != "ok" and rng.random() < 0.5 else rng.uniform(0.05, 3.0)
        r = rec(
            m,
            "inf2" if i % 3 else "g6",
            i,
            scheduled=i * 0.1 + rng.random(),
            ttft=ttft,
            itl=rng.choice([None, rng.uniform(0.01, 0.2)]),
            tokens=rng.randrange(1, 400),
            server_tokens=rng.choice([None, rng.randrange(1, 400)]),
            outcome=outcome,
            warmup=i < 30,
            slo_ok=rng.random() < 0.5,
        )
        recs.append(r)
    write_jsonl(tmp_path / "records-w0.jsonl", recs)
    rs = load_records(tmp_path, m.digest)
    ttft_slo, itl_slo = 1.5, 0.1
    got = goodput.measure_fleets(rs, ttft_slo, itl_slo, percentiles=False)
    for fleet in ("inf2", "g6"):
        mine = [r for r in recs if r.fleet == fleet]
        live = [r for r in mine if not r.warmup]
        ok = [r for r in live if r.outcome == "ok"]

        def met(r: Any) -> bool:
            return r.ttft_s is not None and r.ttft_s <= ttft_slo and (r.itl_s is None or r.itl_s <= itl_slo)

        def tok(r: Any) -> int:
            return int(r.server_output_tokens if r.server_output_tokens is not None else r.client_output_tokens)

        sent = sorted(r.scheduled_s for r in live if r.outcome != "not_sent")
        fm = got[fleet]
        assert (fm.requests, fm.warmup_excluded, fm.completed_ok) == (len(live), len(mine) - len(live), len(ok))
        assert fm.errors == sum(r.outcome in ERROR_OUTCOMES for r in live)
        assert (fm.quality_failed, fm.no_text) == (
            sum(r.outcome == "quality_fail" for r in live),
            sum(r.outcome == "no_text" for r in live),
        )
        assert fm.not_sent == sum(r.outcome == "not_sent" for r in live)
        assert fm.successful_requests == sum(met(r) for r in ok) and fm.slo_violations == sum(not met(r) for r in ok)
        assert fm.successful_output_tokens == sum(tok(r) for r in ok if met(r))
        assert fm.completed_output_tokens == sum(tok(r) for r in ok)
        assert fm.slo_verdict_disagreements == sum(met(r) != r.slo_ok for r in ok)
        assert fm.window_start_s == sent[0]
        assert fm.window_end_s == pytest.approx(sent[0] + (sent[-1] - sent[0]) * len(sent) / (len(sent) - 1))


def test_one_tally_of_several_slos_equals_per_record_sums(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    """goodput.tally judges the records by several SLOs in one scan, grouped by how many of the
    targets each request's TTFT and ITL are within (SLOs sharing a target included): each SLO's
    tally is the per-record sums (and what a scan of that SLO alone gives), and the outcome and
    ITL-basis counts come from the same scan."""
    m = manifest(manifest_data)
    rng = random.Random(23)
    outcomes = ["ok"] * 6 + sorted(ERROR_OUTCOMES) + ["quality_fail", "no_text", "not_sent"]
    recs = []
    for i in range(900):
        outcome = rng.choice(outcomes)
        r = rec(
            m,
            "inf2" if i % 3 else "g6",
            i,
            ttft=None if outcome != "ok" and rng.random() < 0.5 else round(rng.uniform(0.05, 3.0), 1),  # ties
            itl=rng.choice([None, round(rng.uniform(0.01, 0.2), 2)]),
            tokens=rng.randrange(1, 400),
            server_tokens=rng.choice([None, rng.randrange(1, 400)]),
            outcome=outcome,
            warmup=i < 30,
            slo_ok=rng.random() < 0.5,
        )
        r.itl_basis = rng.choice([None, "server_tokens", "chunks"])
        recs.append(r)
    write_jsonl(tmp_path / "records-w0.jsonl", recs)
    slos = [(1.5, 0.1), (1.2, 0.05), (2.2, 0.15), (0.3, 0.2), (1.5, 0.15)]  # the last shares both targets
    rs = load_records(tmp_path, m.digest)
    goodput.tally(rs, slos)
    for ttft_slo, itl_slo in slos:
        alone = goodput.slo_tallies(load_records(tmp_path, m.digest), ttft_slo, itl_slo)
        assert goodput.slo_tallies(rs, ttft_slo, itl_slo) == alone
        for fleet in ("inf2", "g6"):
            live = [r for r in recs if r.fleet == fleet and not r.warmup]
            ok = [r for r in live if r.outcome == "ok"]
            met = [
                r.ttft_s is not None and r.ttft_s <= ttft_slo and (r.itl_s is None or r.itl_s <= itl_slo) for r in ok
            ]
            tok = [
                int(r.server_output_tokens if r.server_output_tokens is not None else r.client_output_tokens)
                for r in ok
            ]
            assert alone[fleet] == goodput.SloTally(
                successful=sum(met),
                successful_tokens=sum(t for t, y in zip(tok, met, strict=True) if y),
                disagreements=sum(y != r.slo_ok for r, y in zip(ok, met, strict=True)),
                sent=sum(r.outcome != "not_sent" for r in live),
                successful_tokens_sq=sum(t * t for t, y in zip(tok, met, strict=True) if y),
            )
    for fleet in ("g6", "inf2"):
        live = [r for r in recs if r.fleet == fleet and not r.warmup]
        assert goodput.outcome_counts(rs)[fleet] == {
            o: n for o in sorted(set(outcomes)) if (n := sum(r.outcome == o for r in live))
        }
        with_itl = [r for r in live if r.outcome == "ok" and r.itl_s is not None]
        assert goodput.itl_basis_counts(rs)[fleet] == {
            b: n
            for b in ("chunks", "server_tokens", "unknown")
            if (n := sum((r.itl_basis or "unknown") == b for r in with_itl))
        }
    assert list(goodput.outcome_counts(rs)) == ["g6", "inf2"]  # sorted, as report.json lists them


def test_a_capacity_interval_is_computed_once_per_step_and_slo(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sensitivity grid re-reads the intervals of cells that keep the SLO: the successful
    tokens' interval of a step runs once per (fleet, SLO), not once per cell."""
    from analysis.report.build import ReportInputs, build_report

    m = manifest(manifest_data)
    for fleet in (f.name for f in m.fleets):
        write_jsonl(
            tmp_path / "rec" / f"records-{fleet}-w0.jsonl",
            [rec(m, fleet, i, ttft=0.2 + (i % 10) / 100, tokens=100 + i % 50) for i in range(200)],
        )
    calls: list[tuple[str, float, float]] = []
    real = intervals.successful_tokens_ci

    def counting(rs: Any, fleet: str, ttft: float, itl: float) -> stats.SumInterval | None:
        calls.append((fleet, ttft, itl))
        return real(rs, fleet, ttft, itl)

    monkeypatch.setattr(intervals, "successful_tokens_ci", counting)
    rep = build_report(ReportInputs(m, tmp_path / "rec", out_dir=tmp_path / "out", with_pages=False))
    assert rep.sensitivity is not None and len(rep.sensitivity.cells) > 5
    assert calls and len(calls) == len(set(calls))  # each (fleet, SLO) once
    assert len(calls) <= len(m.fleets) * 3  # the base SLO and the grid's two SLO cells


def _searched_peak(starts: np.ndarray, ends: np.ndarray) -> int:
    """The peak by its definition: over the sorted starts s_k, (k + 1) - #(ends <= s_k)."""
    if not len(starts):
        return 0
    s, e = np.sort(starts), np.sort(ends)
    return int((np.arange(1, len(s) + 1) - np.searchsorted(e, s, side="right")).max())


def _peak_cases() -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    n = 50_000
    whole = rng.integers(0, 5_000, n).astype(np.float64)  # ties between starts, and with ends
    uniform = rng.random(n) * 1_000
    # the bench's shape: two workers send at the same instants, 3% of requests not counted, each 3 s
    bench = np.repeat(np.arange(n // 2) * 0.0001, 2)
    bench = bench[rng.random(len(bench)) >= 0.03]
    burst = np.concatenate([np.arange(n) * 0.01, 123.4 + rng.random(500) * 0.05])  # a spike in a flat level
    one_instant = np.full(1_000, 5.0)
    back_to_back = np.arange(1_000, dtype=np.float64)
    return [
        ("whole seconds", whole, whole + rng.integers(1, 40, n)),
        ("uniform", uniform, uniform + rng.random(n) * 10),
        ("bench-like", bench, bench + 3.0),
        ("a burst", burst, burst + 1.0),
        ("every start at one instant", one_instant, one_instant + 1.0),
        ("back to back (ends before starts)", back_to_back, back_to_back + 1.0),
        ("one request", np.array([2.0]), np.array([2.5])),
        ("no request", np.array([], dtype=np.float64), np.array([], dtype=np.float64)),
        ("an end at infinity", uniform[:100], np.append(uniform[:99] + 1.0, np.inf)),
    ]


def _chunks(times: np.ndarray, cuts: int, seed: int) -> list[np.ndarray]:
    """The times cut at `cuts` random places (chunks of any length, empty ones too), as duckdb's
    Arrow batches hand them to goodput._peak."""
    at = np.sort(np.random.default_rng(seed).integers(0, len(times) + 1, cuts))
    return [c.copy() for c in np.split(times, at)]


@pytest.mark.parametrize("per_bin", [1, 3, 16, 10**9])  # 10**9: a single bin, everything computed exactly
@pytest.mark.parametrize(("case", "starts", "ends"), _peak_cases(), ids=[c[0] for c in _peak_cases()])
def test_binned_peak_equals_a_search_of_every_start(
    monkeypatch: pytest.MonkeyPatch, per_bin: int, case: str, starts: np.ndarray, ends: np.ndarray
) -> None:
    """goodput._peak counts per time bin and sorts only the bins that may hold the peak: whatever
    the bins' size, and however the times come in chunks (starts and ends cut apart differently,
    blocks of 64 within a chunk), it finds the peak a search of every sorted start finds (ties,
    one bin, none)."""
    monkeypatch.setattr(goodput, "_PEAK_BIN_STARTS", per_bin)
    want = _searched_peak(starts, ends)
    assert goodput._peak([starts.copy()], [ends.copy()]) == want, case
    monkeypatch.setattr(goodput, "_PEAK_BLOCK", 64)
    assert goodput._peak(_chunks(starts, 7, 1), _chunks(ends, 4, 2)) == want, case


def test_latency_order_is_duckdbs_nearest_rank_and_the_full_sort(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    """One read of a fleet's latencies gives the P95 duckdb's quantile_disc gives, the interval
    over the fully sorted sample, and the CDF's nearest-rank quantiles; warmup requests and
    requests without a value are left out."""
    m = manifest(manifest_data)
    rng = random.Random(13)
    recs = [
        rec(
            m,
            "g6",
            i,
            ttft=None if i % 17 == 0 else round(rng.uniform(0.05, 3.0), 2),  # ties included
            itl=None if i % 5 == 0 else rng.uniform(0.01, 0.2),
            warmup=i < 20,
        )
        for i in range(3_000)
    ]
    write_jsonl(tmp_path / "records-g6-w0.jsonl", recs)
    rs = load_records(tmp_path, m.digest)
    for column in ("ttft_s", "itl_s"):
        values = sorted(v for r in recs if not r.warmup and (v := getattr(r, column)) is not None)
        order = goodput.latency_order(rs, "g6", column)
        assert order.p95 == stats.quantile_ci(values)
        row = rs.con.execute(f"SELECT quantile_disc({column}, 0.95) FROM records WHERE NOT warmup").fetchone()
        assert row is not None and order.p95.point == row[0]
        n = len(values)
        assert order.cdf == [(values[math.ceil(n * q - 1e-12) - 1], q) for q in goodput.CDF_QUANTILES]
        assert goodput.latency_order(rs, "g6", column) is order  # read once, kept with the records


def test_latency_order_reads_the_ranks_of_the_fully_sorted_sample(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """goodput.latency_orders counts the values per bucket and fetches only the buckets whose
    values differ: its P95 interval and CDF are those read from every value sorted, for values
    that share buckets, sit on a bucket's edges, repeat, pass through the abandoned requests'
    CASE, and for a fleet with a handful of values or none."""
    m = manifest(manifest_data)
    rng = random.Random(19)
    edge = 37 / 65536  # a bucket's least value, and the value just under it (the bucket before)
    pool = [edge, float(np.nextafter(edge, 0.0)), 0.5, 0.5 + 1e-9, 0.5 + 2e-9, 7.25, 1e4]
    recs = []
    for i in range(4_000):
        ttft = rng.choice(pool) if i % 3 else rng.uniform(0.0, 2.0)  # repeats, and continuous ones
        itl = 0.5 + rng.random() * 1e-6  # every value in one of a few buckets: those are fetched
        r = rec(m, "g6", i, ttft=ttft, itl=itl, e2e=20.0)
        if i % 97 == 0:  # abandoned: the TTFT enters at e2e_s, the ITL at its lower bound
            r = replace(r, outcome=Outcome.SLO_ABANDONED.value, ttft_s=None if i % 2 else 0.3, slo_ok=False)
        recs.append(r)
    recs += [rec(m, "inf2", i, ttft=float(i % 3), itl=None, e2e=5.0) for i in range(7)]  # no ITL at all
    write_jsonl(tmp_path / "records-w0.jsonl", recs)
    rs = load_records(tmp_path, m.digest)
    for fleet in ("g6", "inf2"):
        for column in ("ttft_s", "itl_s"):
            x = np.sort(goodput.latency_array(rs, fleet, column))  # every value, the reference's way
            n = len(x)
            want_p95 = stats.quantile_ci(x.tolist())
            want_cdf = [(float(x[math.ceil(n * q - 1e-12) - 1]), q) for q in goodput.CDF_QUANTILES] if n else []
            order = goodput.latency_order(rs, fleet, column)
            assert (fleet, column, order.p95, order.cdf) == (fleet, column, want_p95, want_cdf)
    assert (
        goodput.latency_order(rs, "g6", "itl_s").p95.n == 4_000
        and goodput.latency_order(rs, "inf2", "itl_s").p95.n == 0
    )


def test_slo_tally_gives_the_tokens_interval_of_the_per_request_values(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """The capacity interval's n, sum and variance come from the scan that judges the fleet by
    the SLO: they are those of the per-request successful tokens the bootstrap would resample."""
    m = manifest(manifest_data)
    rng = random.Random(17)
    recs = [
        rec(
            m,
            "g6",
            i,
            ttft=rng.uniform(0.05, 3.0),
            itl=rng.choice([None, rng.uniform(0.01, 0.2)]),
            tokens=rng.randrange(1, 400),
            server_tokens=rng.choice([None, rng.randrange(1, 400)]),
            outcome=rng.choice(["ok", "ok", "ok", "http_error", "not_sent"]),
            warmup=i < 10,
        )
        for i in range(2_000)
    ]
    write_jsonl(tmp_path / "records-g6-w0.jsonl", recs)
    rs = load_records(tmp_path, m.digest)
    x = intervals.successful_tokens_per_request(rs, "g6", 1.5, 0.1)
    t = goodput.slo_tallies(rs, 1.5, 0.1)["g6"]
    assert (t.sent, t.successful_tokens) == (len(x), int(x.sum()))
    assert t.tokens_var == pytest.approx(float(x.var()), rel=1e-12)
    # and it is the exact variance, rounded once: the same bits on every run, whatever order
    # duckdb's threads finish in (its var_pop's last bits move with that order)
    ints = [int(v) for v in x]
    exact = Fraction(len(ints) * sum(v * v for v in ints) - sum(ints) ** 2, len(ints) ** 2)
    assert t.tokens_var == float(exact)
    fm = goodput.measure_fleets(rs, 1.5, 0.1)["g6"]
    assert (fm.successful_output_tokens, fm.requests - fm.not_sent) == (t.successful_tokens, t.sent)
