"""Record sets share one in-memory duckdb database (analysis.sources.records._connection: opening
a database cost ~40 ms of CPU, a simulated campaign opened ~20): each must still see only its
own records, from any thread, and give its tables back when it goes or when its load fails."""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import DigestMismatch
from analysis.sources import records
from analysis.sources.records import load_records
from tests.analysis.synth import manifest, rec, write_jsonl


def _schemas() -> set[str]:
    assert records._SHARED is not None
    rows = records._SHARED.cursor().execute("SELECT schema_name FROM information_schema.schemata").fetchall()
    return {r[0] for r in rows if r[0].startswith("records_")}


def _write(m: Any, d: Path, fleet: str, n: int) -> Path:
    write_jsonl(d / f"records-{fleet}.jsonl", [rec(m, fleet, i) for i in range(n)])
    return d


def test_record_sets_alive_together_see_only_their_own_records_from_any_thread(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    m = manifest(manifest_data)
    dirs = [_write(m, tmp_path / str(n), "g6" if n % 2 else "inf2", n) for n in range(1, 9)]
    sets = [load_records(d, m.digest) for d in dirs]  # all alive at once, in one database
    assert [rs.count() for rs in sets] == list(range(1, 9))
    assert [rs.fleets() for rs in sets] == [["g6" if n % 2 else "inf2"] for n in range(1, 9)]

    def in_a_thread(d: Path) -> tuple[int, int]:
        rs = load_records(d, m.digest)
        with rs.cursor() as c:  # a second connection, as a fetch in a thread of its own takes
            row = c.execute("SELECT count(*) FROM records").fetchone()
        assert row is not None
        return rs.count(), int(row[0])

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(in_a_thread, dirs * 3))
    assert got == [(n, n) for n in range(1, 9)] * 3


def test_a_record_set_gone_or_refused_leaves_no_table_behind(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    m = manifest(manifest_data)
    d = _write(m, tmp_path / "ok", "g6", 5)
    load_records(d, m.digest)  # opens the shared database if no test did before
    gc.collect()
    before = _schemas()
    rs = load_records(d, m.digest)
    assert rs.schema is not None and _schemas() == before | {rs.schema}
    del rs
    gc.collect()
    assert _schemas() == before
    with pytest.raises(DigestMismatch):
        load_records(d, "0" * 64)
    gc.collect()
    assert _schemas() == before
