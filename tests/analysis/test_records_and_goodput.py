from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analysis.economics.cost import unit_cost_per_million
from analysis.errors import DigestMismatch, EmptyWindow
from analysis.measure.goodput import measure_fleets
from analysis.sources.records import load_records
from core.manifest import Manifest
from tests.analysis.synth import rec, steady, write_jsonl


def test_per_instance_goodput_and_seed_cost(tmp_path: Path, m: Manifest) -> None:
    # 100 requests x 450 tokens over exactly 100 s on one instance: 450 successful tok/s.
    write_jsonl(tmp_path / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))
    fm = measure_fleets(load_records(tmp_path, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    assert fm.window_s == pytest.approx(100.0)
    assert fm.goodput_tok_s == pytest.approx(450.0)
    assert unit_cost_per_million(1.006, fm.goodput_tok_s) == pytest.approx(0.621, abs=5e-4)


def test_failed_slo_violating_quality_failing_and_warmup_tokens_are_not_successful(tmp_path: Path, m: Manifest) -> None:
    recs = steady(m, "g6", 10, 100)
    recs += [rec(m, "g6", 10, outcome="http_error", ttft=None, itl=None, e2e=None, tokens=0)]
    recs += [rec(m, "g6", 11, ttft=m.slo.ttft_p95_s * 2)]  # completed but missed the SLO
    recs += [rec(m, "g6", 12, outcome="quality_fail")]
    recs += [rec(m, "g6", 13, warmup=True, scheduled=-5.0)]
    recs += [rec(m, "g6", 14, server_tokens=300, tokens=299)]  # server usage wins
    # Usage says 40 tokens but no chunk carried text: not a success, and counted as such.
    recs += [rec(m, "g6", 15, outcome="no_text", ttft=None, itl=None, tokens=0, server_tokens=40)]
    write_jsonl(tmp_path / "records-g6-w0.jsonl", recs)
    fm = measure_fleets(load_records(tmp_path, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    assert fm.requests == 15 and fm.warmup_excluded == 1
    assert fm.successful_requests == 11 and fm.successful_output_tokens == 10 * 100 + 300
    assert fm.errors == 1 and fm.quality_failed == 1 and fm.slo_violations == 1 and fm.no_text == 1
    assert fm.error_rate == pytest.approx(1 / 15)


def test_adding_failures_raises_cost_per_successful_token(tmp_path: Path, m: Manifest) -> None:
    clean, dirty = tmp_path / "clean", tmp_path / "dirty"
    write_jsonl(clean / "records-g6-w0.jsonl", steady(m, "g6", 50, 200))
    # same successes, plus failed and SLO-violating requests interleaved over a longer window
    extra = [rec(m, "g6", 50 + i, outcome="timeout", ttft=None, itl=None, e2e=None) for i in range(10)]
    extra += [rec(m, "g6", 60 + i, itl=m.slo.itl_p95_s * 3) for i in range(10)]
    write_jsonl(dirty / "records-g6-w0.jsonl", steady(m, "g6", 50, 200) + extra)
    a = measure_fleets(load_records(clean, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    b = measure_fleets(load_records(dirty, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    assert a.goodput_tok_s is not None and b.goodput_tok_s is not None
    ca, cb = unit_cost_per_million(0.8048, a.goodput_tok_s), unit_cost_per_million(0.8048, b.goodput_tok_s)
    assert ca is not None and cb is not None and cb > ca


def test_p95_is_exact_nearest_rank_over_records(tmp_path: Path, m: Manifest) -> None:
    # TTFTs 0.01 .. 1.00: nearest-rank P95 of 100 values is the 95th, 0.95
    write_jsonl(tmp_path / "records-g6-w0.jsonl", [rec(m, "g6", i, ttft=(i + 1) / 100) for i in range(100)])
    fm = measure_fleets(load_records(tmp_path, m.digest), 10.0, 10.0)["g6"]
    assert fm.p95_ttft_s == pytest.approx(0.95)


def test_records_from_another_manifest_are_refused(tmp_path: Path, m: Manifest) -> None:
    write_jsonl(tmp_path / "records-g6-w0.jsonl", steady(m, "g6", 3, 10))
    other = "f" * 64
    write_jsonl(tmp_path / "records-inf2-w0.jsonl", steady(m, "inf2", 3, 10, digest=other))
    with pytest.raises(DigestMismatch) as exc:
        load_records(tmp_path, m.digest)
    assert "records-inf2-w0.jsonl" in str(exc.value) and other in str(exc.value) and m.digest in str(exc.value)


def test_empty_window_is_an_error(tmp_path: Path, m: Manifest) -> None:
    with pytest.raises(EmptyWindow, match="no records"):
        load_records(tmp_path, m.digest)
    (tmp_path / "records-g6-w0.jsonl").write_text("")
    with pytest.raises(EmptyWindow):
        load_records(tmp_path, m.digest)


def test_parquet_and_jsonl_are_read_together(tmp_path: Path, m: Manifest) -> None:
    src = write_jsonl(tmp_path / "src.jsonl.tmp", steady(m, "inf2", 20, 50))
    duckdb.sql(
        f"COPY (SELECT * FROM read_json('{src}', format='newline_delimited')) TO '{tmp_path / 'records-inf2.parquet'}' (FORMAT parquet)"
    )
    write_jsonl(tmp_path / "records-g6-w0.jsonl", steady(m, "g6", 10, 50))
    rs = load_records(tmp_path, m.digest)
    assert rs.fleets() == ["g6", "inf2"] and rs.count() == 30


def test_parquet_written_before_the_retries_column_reads_it_as_null(tmp_path: Path, m: Manifest) -> None:
    src = tmp_path / "src.jsonl"
    write_jsonl(src, [rec(m, "inf2", i) for i in range(3)])
    duckdb.sql(
        f"COPY (SELECT * EXCLUDE (retries) FROM read_json('{src}', format='newline_delimited')) "
        f"TO '{tmp_path / 'records-inf2.parquet'}' (FORMAT parquet)"
    )
    src.unlink()
    rs = load_records(tmp_path, m.digest)
    assert rs.con.execute("SELECT count(*), count(retries) FROM records").fetchone() == (3, 0)
