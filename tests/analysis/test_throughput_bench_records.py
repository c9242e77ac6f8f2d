"""bench/analysis_throughput.py's records are typed as loadgen's are (core.records.RequestRecord).

The bench measures what reading a day of records costs; records whose columns have other types
than a real run's measure another cost. Its SQL once wrote the times as DECIMAL (the literals
`1700000000.0`, `i * 0.0001`), which every scan then decoded and cast to DOUBLE (issue 53).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import duckdb

from core.records import RequestRecord
from tests.conftest import ROOT


def _float_fields() -> list[str]:
    """RequestRecord's fields typed float (or float | None)."""
    hints = typing.get_type_hints(RequestRecord)
    return [
        f.name for f in dataclasses.fields(RequestRecord) if float in (hints[f.name], *typing.get_args(hints[f.name]))
    ]


def test_the_bench_writes_a_records_float_fields_as_double(tmp_path: Path) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "bench.analysis_throughput", "--records", "4000", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    files = sorted((tmp_path / "records").glob("records-*.parquet"))
    assert len(files) == 4
    types = dict(
        duckdb.connect()
        .execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet('{files[0]}'))")
        .fetchall()
    )
    floats = _float_fields()
    assert {"wall_start", "scheduled_s", "sent_s", "send_lag_s", "ttft_s", "e2e_s"} <= set(floats)
    assert {name: types[name] for name in floats} == dict.fromkeys(floats, "DOUBLE")
