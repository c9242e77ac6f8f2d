"""Loadgen per-request records (`records-*.jsonl`, optionally `records-*.parquet`) as one columnar table.

duckdb scans the files in parallel and keeps only the columns the analysis reads, so ten
million records load in seconds. Every file's manifest_digest is checked against the
manifest before any number is computed from it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analysis.errors import AnalysisError, DigestMismatch, EmptyWindow
from analysis.sources.locations import RecordsLocation, open_location
from core.records import RunSummary, split_torn_tail

# The subset of core.records.RequestRecord the analysis needs, with duckdb types.
COLUMNS: dict[str, str] = {
    "campaign": "VARCHAR",
    "manifest_digest": "VARCHAR",
    "fleet": "VARCHAR",
    "request_id": "BIGINT",
    "wall_start": "DOUBLE",
    "scheduled_s": "DOUBLE",
    "sent_s": "DOUBLE",
    "send_lag_s": "DOUBLE",
    "ttft_s": "DOUBLE",
    "itl_s": "DOUBLE",
    "e2e_s": "DOUBLE",
    "max_tokens": "BIGINT",
    "client_output_tokens": "BIGINT",
    "server_output_tokens": "BIGINT",
    "outcome": "VARCHAR",
    "slo_ok": "BOOLEAN",
    "warmup": "BOOLEAN",
    "retries": "BIGINT",
    "itl_basis": "VARCHAR",
}
# Columns added after the first record version: records written before them read as NULL.
LATER_COLUMNS = frozenset({"retries", "itl_basis"})


@dataclass
class RecordSet:
    """The records of one campaign, loaded into an in-memory duckdb table named `records`."""

    con: duckdb.DuckDBPyConnection
    files: list[str]  # as duckdb read them: local paths or s3:// URIs
    summaries: dict[str, RunSummary] = field(default_factory=dict)
    torn_tails: list[str] = field(default_factory=list)  # "file: N bytes" left out, see _complete_lines
    # Per settle segment ("1", "2": goodput.SEGMENT_SQL), where its schedule starts in its step's
    # schedule seconds (segment.json's skip_s / multiplier): a segment's records count their
    # scheduled_s from its own 0, and pooling them with the step needs the one timeline.
    segment_starts: dict[str, float] = field(default_factory=dict)
    # What the measures derive from these records and read more than once (analysis.measure.goodput:
    # the tallies, latency order statistics, peak in flight), by the key the computing function
    # gives it: each is one or more scans of every record, done once.
    derived: dict[tuple[object, ...], Any] = field(default_factory=dict)
    # The schema holding `records` where the database is shared (see _connection); None: its own.
    schema: str | None = None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """Another connection that reads these records (a query in a thread of its own needs one)."""
        cursor = self.con.cursor()
        if self.schema is not None:
            cursor.execute(f"SET search_path = '{self.schema}'")
        return cursor

    def fleets(self) -> list[str]:
        """The fleets the records name, sorted: a scan of every record, so done once (derived)."""
        if ("fleets",) not in self.derived:
            rows = self.con.execute("SELECT DISTINCT fleet FROM records ORDER BY fleet").fetchall()
            self.derived[("fleets",)] = [r[0] for r in rows]
        return list(self.derived[("fleets",)])

    def count(self) -> int:
        row = self.con.execute("SELECT count(*) FROM records").fetchone()
        return int(row[0]) if row else 0


def _sql_list(paths: Sequence[str | Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _scan(jsonl: Sequence[str], parquet: Sequence[str], parquet_columns: frozenset[str] = frozenset(COLUMNS)) -> str:
    cols = ", ".join(COLUMNS)
    parts = []
    if jsonl:
        spec = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"
        # Explicit columns: no schema sniffing, and fields the analysis ignores are never parsed into the table.
        parts.append(
            f"SELECT {cols}, filename FROM read_json({_sql_list(jsonl)}, format='newline_delimited', "
            f"columns={spec}, filename=true)"
        )
    if parquet:
        casts = ", ".join(
            f"CAST({k if k in parquet_columns or k not in LATER_COLUMNS else 'NULL'} AS {v}) AS {k}"
            for k, v in COLUMNS.items()
        )
        parts.append(f"SELECT {casts}, filename FROM read_parquet({_sql_list(parquet)}, filename=true)")
    return " UNION ALL ".join(parts)


def find_record_files(loc: RecordsLocation) -> tuple[list[str], list[str]]:
    """(non-empty JSONL, Parquet) record files below the location, as duckdb reads them."""
    return (
        [loc.url(p) for p in loc.find("records-*.jsonl", non_empty=True)],
        [loc.url(p) for p in loc.find("records-*.parquet")],
    )


def _load_summaries(loc: RecordsLocation) -> dict[str, RunSummary]:
    out: dict[str, RunSummary] = {}
    for p in loc.find("*summary*.json"):
        try:
            data = json.loads(loc.read_bytes(p).decode("utf-8"))
            s = RunSummary(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise AnalysisError(f"{loc.url(p)}: not a RunSummary: {exc}") from None
        out[f"{s.fleet}:{loc.relative(p)}"] = s
    return out


SEGMENT_FILE = "segment.json"  # settle-<n>/segment.json: the segment's plan (campaign.stages.settle)
_SEGMENT_DIR = re.compile(r"/settle-([0-9]+)/" + re.escape(SEGMENT_FILE) + "$")


def _segment_starts(loc: RecordsLocation) -> dict[str, float]:
    """Each settle segment's start in its step's schedule seconds, from its segment.json: the trace
    seconds it skipped (at x1) over its rate multiplier. A malformed file is an AnalysisError naming it."""
    out: dict[str, float] = {}
    for p in loc.find(SEGMENT_FILE):
        got = _SEGMENT_DIR.search("/" + loc.relative(p))
        if got is None:
            continue
        try:
            data = json.loads(loc.read_bytes(p).decode("utf-8"))
            skip, k = float(data["skip_s"]), float(data["multiplier"])
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise AnalysisError(f"{loc.url(p)}: not a settle segment's plan (skip_s, multiplier): {exc}") from None
        if not (math.isfinite(skip) and skip >= 0 and math.isfinite(k) and k > 0):
            raise AnalysisError(f"{loc.url(p)}: skip_s must be >= 0 and multiplier > 0, got {skip}, {k}")
        out[got.group(1)] = skip / k
    return out


def _complete_lines(loc: RecordsLocation, jsonl: Sequence[str], scratch: Path) -> tuple[list[str], list[str]]:
    """A file that does not end with a newline was cut mid-write (core.records.split_torn_tail).
    Its complete lines are read from a local copy; the partial tail is left out and named
    (relative to the location: the name lands in reports), and the evidence file itself is
    never modified."""
    out: list[str] = []
    torn: list[str] = []
    for i, url in enumerate(jsonl):
        path = url[len(loc.scheme) :]
        if loc.last_byte(path) == b"\n":
            out.append(url)
            continue
        complete, cut = split_torn_tail(loc.read_bytes(path))
        torn.append(f"{loc.relative(path)}: {cut} bytes after the last complete record")
        if complete:
            copy = scratch / str(i) / loc.relative(path)  # its folders kept: a settle segment is known by its folder
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(complete)
            out.append(str(copy))
    return out, torn


_SHARED: duckdb.DuckDBPyConnection | None = None
_SHARED_LOCK = threading.Lock()
_SCHEMAS = itertools.count(1)


def _connection(loc: RecordsLocation, threads: int | None) -> tuple[duckdb.DuckDBPyConnection, str | None]:
    """A connection for one record set, and the schema its tables go in. Opening a database costs
    about 40 ms of CPU (duckdb 2.0.1, measured here 2026-12-07), a connection and a schema in an
    open one next to nothing, and a simulated campaign loads its records some 20 times: so local
    records go in a schema of their own in this process's one in-memory database, dropped with
    their RecordSet. A remote location (its filesystem registered) or a thread count (a
    database-wide setting) gets a database of its own, as every record set once did."""
    global _SHARED
    if loc.remote or threads:
        return duckdb.connect(":memory:"), None
    with _SHARED_LOCK:  # one connection object is not for two threads at once, cursor() included
        if _SHARED is None:
            _SHARED = duckdb.connect(":memory:")
        con = _SHARED.cursor()
    schema = f"records_{next(_SCHEMAS)}"
    con.execute(f"CREATE SCHEMA {schema}")
    con.execute(f"SET search_path = '{schema}'")
    return con, schema


def _dropper(con: duckdb.DuckDBPyConnection, schema: str | None) -> Callable[[], object]:
    """What frees a record set's tables: its schema dropped on a connection of its own (a
    finalizer may run in any thread); nothing where the database is the record set's own."""
    if schema is None:
        return lambda: None
    own = con.cursor()
    return lambda: own.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def load_records(records_dir: str | Path, manifest_digest: str, *, threads: int | None = None) -> RecordSet:
    """Load every record file under `records_dir` (a directory, or an s3://bucket/prefix read in
    place: analysis.sources.locations); refuse records from another manifest.

    Raises EmptyWindow when there is nothing to measure and DigestMismatch naming the
    first offending file, so a report can never be built from mixed or absent evidence.
    """
    loc = open_location(records_dir)
    d = loc.url(loc.root)
    jsonl, parquet = find_record_files(loc)
    if not jsonl and not parquet:
        raise EmptyWindow(f"no records-*.jsonl or records-*.parquet files under {d}: the campaign window is empty")
    con, schema = _connection(loc, threads)
    drop = _dropper(con, schema)
    try:
        rs = _load(loc, con, schema, jsonl, parquet, manifest_digest, threads)
    except BaseException:
        drop()
        raise
    weakref.finalize(rs, drop).atexit = False  # at exit the process's memory goes anyway
    return rs


def _load(
    loc: RecordsLocation,
    con: duckdb.DuckDBPyConnection,
    schema: str | None,
    jsonl: list[str],
    parquet: list[str],
    manifest_digest: str,
    threads: int | None,
) -> RecordSet:
    d = loc.url(loc.root)
    loc.register(con)
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    # Local Parquet is already columnar: a view scans it in parallel on demand. JSON, and
    # anything on S3 (one read, not one per query), is read once into a table.
    kind = "TABLE" if jsonl or loc.remote else "VIEW"
    with tempfile.TemporaryDirectory(prefix="records-") as scratch:
        readable, torn = _complete_lines(loc, jsonl, Path(scratch))
        if not readable and not parquet:
            raise EmptyWindow(f"record files under {d} hold no complete record: the campaign window is empty")
        try:
            # A later column counts only when every Parquet file has it (read_parquet unifies by the first file's schema).
            have = frozenset(COLUMNS) - LATER_COLUMNS
            if parquet:
                per_file = con.execute(
                    f"SELECT file_name, list(name) FROM parquet_schema({_sql_list(parquet)}) GROUP BY ALL"
                ).fetchall()
                have |= frozenset.intersection(*(frozenset(names) for _, names in per_file)) & LATER_COLUMNS
            scan = _scan(readable, parquet, have)
            con.execute(f"CREATE {kind} raw AS {scan}")
        except duckdb.Error as exc:
            raise AnalysisError(f"cannot read records under {d}: {exc}") from None
    bad = con.execute(
        "SELECT filename, coalesce(manifest_digest, '<missing>'), count(*) FROM raw "
        "WHERE manifest_digest IS DISTINCT FROM ? GROUP BY ALL ORDER BY 1 LIMIT 1",
        [manifest_digest],
    ).fetchone()
    if bad:
        raise DigestMismatch(str(bad[0]), str(bad[1]), manifest_digest, int(bad[2]))
    con.execute(f"ALTER {kind} raw RENAME TO records")  # no copy
    rs = RecordSet(con, [*jsonl, *parquet], _load_summaries(loc), torn, _segment_starts(loc), schema=schema)
    if rs.count() == 0:
        raise EmptyWindow(f"record files under {d} hold no records: the campaign window is empty")
    return rs
