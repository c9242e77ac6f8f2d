"""Bench: N synthetic per-request records (default 10 million) -> report.json; prints the figures.

    .venv/bin/python -m bench.analysis_throughput [--records 10000000] [--format parquet|jsonl] [--dir DIR] [--runs 3]

This process generates the records (duckdb, straight to Parquet or JSONL, split over both fleets
of the example manifest) into DIR/records, the files a run directory holds. Each run then builds
the report in a child process, as `campaign report` would read those files: what a user waits for.
The child prints build_report's seconds (load, digest check, goodput, percentiles, sizing, cost,
sensitivity, report.json/.md/.html) and its own peak RSS (ru_maxrss, imports and duckdb included).

The report must not change with the code's speed: report.json's sha256 (its `generated_at` blanked,
the one field that moves from run to run) is checked against REFERENCE, the hash the code gave
before the throughput work (issue 53), for the record counts listed there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"

# (records, format) -> report.json's sha256 (report_hash) from the analysis code before issue 53's
# changes. First recorded at 63bedbd (2026-12-07); recorded again the same day at 5218038 (main
# before issue 53's branch was merged: the example manifest's NVIDIA driver pin and report 2.4 had
# changed the report since) with this bench, and the merged code gave the same hashes at 200 k, 1 M,
# 10 M and 100 M. The report names its records folder relative to its own (`../records`), which is why
# the bench keeps that layout fixed. Since its records' times are DOUBLE (they were DECIMAL, generate),
# the same values give the same hashes: checked at 200 k, 1 M, 10 M and 100 M (2026-12-07).
REFERENCE: dict[tuple[int, str], str] = {
    (200_000, "parquet"): "d25c4dc7d8099aa977ed677533e216040bf47d419affb11f6910de38bef4c824",
    (1_000_000, "parquet"): "5fb347e623f8069f442f5dfaaab55418e62357e83eb199a88fcfb6613a088519",
    (10_000_000, "parquet"): "736162358782cb71dcd1058f6c7824251b36126382b24eafe5edbc96dd0e52e9",
    (100_000_000, "parquet"): "99b6340ada9d0e1cde592b786d5e487b64b9d57eb6fb7408e56eebcb0530502b",
}


def generate(out: Path, n: int, digest: str, campaign: str, fmt: str) -> None:
    import duckdb

    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    per_file = n // 4
    for k, fleet in enumerate(("inf2", "inf2", "g6", "g6")):
        # Deterministic pseudo-random latencies from hash(i): ~3% errors, a long TTFT tail. Times are
        # DOUBLE, as RequestRecord's floats are: the literals alone would make them DECIMAL, whose
        # decoding and cast every scan then paid (issue 53; the values, and the report, are the same).
        sql = f"""
        SELECT '{campaign}' AS campaign, '{digest}' AS manifest_digest, '{fleet}' AS fleet, i AS request_id, 'w{k}' AS worker,
               1700000000.0::DOUBLE AS wall_start, (i * 0.0001)::DOUBLE AS scheduled_s, (i * 0.0001)::DOUBLE AS sent_s,
               0.0::DOUBLE AS send_lag_s,
               CASE WHEN h % 100 < 3 THEN NULL ELSE 0.05 + (h % 1000) / 400.0 END AS ttft_s,
               CASE WHEN h % 100 < 3 THEN NULL ELSE 0.02 + (h % 997) / 8000.0 END AS itl_s,
               NULL::DOUBLE AS itl_max_s,
               CASE WHEN h % 100 < 3 THEN NULL ELSE 3.0::DOUBLE END AS e2e_s,
               512 AS input_tokens, 512 AS max_tokens, CAST(50 + h % 400 AS BIGINT) AS client_output_tokens, 512 AS server_prompt_tokens,
               CASE WHEN h % 7 = 0 THEN NULL ELSE CAST(50 + h % 400 AS BIGINT) END AS server_output_tokens,
               'stop' AS finish_reason, CASE WHEN h % 100 < 3 THEN 'http_error' ELSE 'ok' END AS outcome, 200 AS http_status,
               NULL::VARCHAR AS error, (h % 1000) < 900 AS slo_ok, i < 1000 AS warmup, 1 AS record_version
        FROM (SELECT i, hash(i * 4 + {k}) AS h FROM range({per_file}) t(i))
        """
        ext = "parquet" if fmt == "parquet" else "jsonl"
        target = out / f"records-{fleet}-w{k}.{ext}"
        opts = "(FORMAT parquet, COMPRESSION zstd)" if fmt == "parquet" else "(FORMAT json)"
        con.execute(f"COPY ({sql}) TO '{target}' {opts}")
    con.close()


def _decimal_times(rec_dir: Path) -> bool:
    """Whether reused Parquet records hold scheduled_s as DECIMAL, as this bench wrote them before issue 53."""
    import duckdb

    got = duckdb.connect().execute(
        f"SELECT column_type FROM (DESCRIBE SELECT scheduled_s FROM read_parquet('{rec_dir}/records-*.parquet'))"
    )
    row = got.fetchone()
    return row is not None and str(row[0]).startswith("DECIMAL")


def report_hash(report_json: bytes) -> str:
    """sha256 of report.json with its build time blanked: the same records give the same hash."""
    return hashlib.sha256(re.sub(rb'"generated_at": "[^"]*"', b'"generated_at": ""', report_json, count=1)).hexdigest()


class Built(TypedDict):
    """What the child prints (one JSON line) and the parent reads."""

    seconds: float  # build_report alone
    cpu_s: float  # the child's CPU seconds (user + system, every thread) in build_report: steadier than seconds on a shared machine
    maxrss_mib: float  # the child's peak RSS, its imports included
    sha256: str  # report_hash
    requests: int
    cells: int  # sensitivity cells
    fleets: dict[str, tuple[int, int, float, float]]  # requests, successful tokens, P95 TTFT, P95 ITL
    wall_s: float  # the child's whole life, imports included (set by the parent)


def build(base: Path) -> Built:
    """The child's part: base/records -> base/out/report.json (+ .md, .html), as `campaign report`
    builds it from a run's records (campaign.stages.run.run_report, records only)."""
    from campaign.stages.run import RunFacts, run_report
    from core.manifest import load_manifest

    m = load_manifest(MANIFEST, check_files=False)
    out = base / "out"
    t0, cpu0 = time.perf_counter(), _cpu_s()
    rep = run_report(m, out, out, None, RunFacts({"inf2": 1, "g6": 1}), None, None, records_dir=base / "records")
    seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    return {
        "wall_s": 0.0,
        "seconds": seconds,
        "cpu_s": cpu,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        "sha256": report_hash((out / "report.json").read_bytes()),
        "requests": sum(f.requests for f in rep.fleets.values()),
        "cells": len(rep.sensitivity.cells) if rep.sensitivity is not None else 0,
        "fleets": {
            name: (f.requests, f.successful_output_tokens, f.p95_ttft_s or 0.0, f.p95_itl_s or 0.0)
            for name, f in rep.fleets.items()
        },
    }


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_child(base: Path) -> Built:
    t0 = time.perf_counter()
    got = subprocess.run(
        [sys.executable, "-m", "bench.analysis_throughput", "--child", str(base)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    res: Built = json.loads(got.stdout.strip().splitlines()[-1])
    res["wall_s"] = time.perf_counter() - t0
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    ap.add_argument(
        "--dir", type=Path, default=None, help="keep records (DIR/records, reused) and report (DIR/out) here"
    )
    ap.add_argument("--runs", type=int, default=1, help="build the report this many times (the median is printed)")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)  # the child's part: build(DIR)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(build(args.child)))
        return 0
    from core.manifest import load_manifest

    m = load_manifest(MANIFEST, check_files=False)
    with tempfile.TemporaryDirectory() as tmp:
        base = args.dir or Path(tmp)
        rec_dir = base / "records"
        t0 = time.perf_counter()
        reused = any(rec_dir.glob("records-*"))
        if not reused:
            generate(rec_dir, args.records, m.digest, m.campaign, args.format)
        t_gen = time.perf_counter() - t0
        if reused and args.format == "parquet" and _decimal_times(rec_dir):
            print(
                f"note: {rec_dir} holds records from before issue 53's DOUBLE times (DECIMAL): slower to read; delete it to regenerate"
            )
        size_mb = sum(p.stat().st_size for p in rec_dir.glob("records-*")) / 1e6
        print(f"records: {args.records:,} ({args.format}, {size_mb:.0f} MB), generated in {t_gen:.1f} s", flush=True)
        runs = []
        for i in range(args.runs):
            r = run_child(base)
            runs.append(r)
            print(
                f"  run {i + 1}: build_report {r['seconds']:.2f} s, {r['cpu_s']:.2f} CPU s (child {r['wall_s']:.2f} s with its imports), "
                f"peak RSS {r['maxrss_mib']:,.0f} MiB",
                flush=True,
            )
    last = runs[-1]
    seconds = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    rss = statistics.median(r["maxrss_mib"] for r in runs)
    print(
        f"build_report: {seconds:.2f} s (median of {len(runs)}) -> {last['requests'] / seconds / 1e6:.2f} M records/s, "
        f"{cpu:.2f} CPU s, peak RSS {rss:,.0f} MiB (report.json + md + html, {last['cells']} sensitivity cells)"
    )
    for name, (requests, tokens, ttft, itl) in last["fleets"].items():
        print(
            f"  {name}: requests {requests:,}, successful tokens {tokens:,}, p95 TTFT {ttft:.3f} s, p95 ITL {itl:.4f} s"
        )
    hashes = {r["sha256"] for r in runs}
    want = REFERENCE.get((args.records, args.format))
    print(f"report.json sha256 {', '.join(sorted(hashes))}", end="")
    if want is None:
        print(" (no reference for this record count and format)")
        return 0 if len(hashes) == 1 else 1
    if hashes != {want}:
        print(f"\nreport.json CHANGED: reference {want}")
        return 1
    print(" = the reference (report unchanged)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
