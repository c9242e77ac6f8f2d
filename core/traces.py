"""Trace readers: every supported format becomes a list of `TraceRow`.

Offsets are seconds from the trace's first arrival. Readers are strict: a row that cannot be
trusted (a missing or unparsable column, a negative or zero length, arrivals out of order)
raises `TraceError` naming the file, the 1-based line and the field, because silently skipping
rows would change the offered load. The whole file is read first and every bad row is listed
(`check_trace`, `TraceError.problems`), so one `validate` shows all there is to fix.
"""

from __future__ import annotations

import codecs
import csv
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from core.errors import CampaignError

BLOCK_TOKENS = 512  # Mooncake hash_ids name 512-token prompt blocks


@dataclass(frozen=True)
class TraceRow:
    line: int  # 1-based line in the source file, for error messages and provenance
    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None


ROW = "(row)"  # the field of a problem with the whole row (not UTF-8, not JSON, wrong field count)


@dataclass(frozen=True)
class TraceProblem:
    """One bad row: `path:line: field: reason`."""

    path: str
    line: int  # 1-based
    field: str  # the column (CSV) or key (JSON Lines) at fault, or ROW
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.reason}"


class TraceError(CampaignError, ValueError):
    """Every problem found in one trace, in line order (`problems`; a row may have several).
    `path`, `line`, `field` and `reason` are the first one's; the message is its line and how
    many more there are."""

    def __init__(self, problems: Sequence[TraceProblem]):
        if not problems:
            raise ValueError("a TraceError needs at least one problem")
        self.problems = sorted(problems, key=lambda p: p.line)
        first = self.problems[0]
        self.path, self.line, self.field, self.reason = first.path, first.line, first.field, first.reason
        more = len(self.problems) - 1
        super().__init__(str(first) + (f" (and {more} more problem(s) in this trace)" if more else ""))


_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,7}))?$")


def parse_azure_timestamp(text: str) -> int:
    """100-ns ticks since the epoch (naive, treated as UTC) for `YYYY-MM-DD HH:MM:SS.fffffff`.

    Python's %f takes 6 digits; Azure writes 7 (100 ns), so the fraction is parsed by hand, and
    kept as an integer: a float of epoch seconds would lose the 7th digit. The whole seconds go
    through `fromisoformat` (the regex has fixed the shape; it refuses a month 13 or a 31 February
    as strptime did, at a twentieth of its cost: a trace has tens of thousands of rows).
    """
    m = _AZURE_TS.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"bad timestamp {text!r} (want YYYY-MM-DD HH:MM:SS.fffffff)")
    try:
        whole = datetime.fromisoformat(m.group(1))
    except ValueError:
        raise ValueError(f"bad timestamp {text!r} (want YYYY-MM-DD HH:MM:SS.fffffff)") from None
    frac = m.group(2) or "0"
    seconds = int((whole - datetime(1970, 1, 1)).total_seconds())
    return seconds * 10_000_000 + int(frac.ljust(7, "0"))


def _count(value: Any) -> int:
    """A non-negative integer (JSON 5.0 and CSV " 5" included); ValueError names what is wrong."""
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str):
        try:
            n = int(value.strip())
        except ValueError:
            raise ValueError(f"not an integer: {value!r}") from None
    else:
        raise ValueError(f"not an integer: {value!r}")
    if n < 0:
        raise ValueError(f"negative ({n})")
    return n


def _number(value: Any) -> float:
    if isinstance(value, bool):  # JSON true would otherwise pass as 1.0
        raise ValueError(f"not a number: {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {value!r}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError(f"not a finite number: {value!r}")
    return f


def _hash_ids(value: Any) -> tuple[int, ...] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):  # plain CSV: space- or semicolon-separated ids
        value = [v for v in re.split(r"[ ;|]+", value.strip()) if v]
    if not isinstance(value, list):
        raise ValueError(f"not a list of integers: {value!r}")
    try:
        return tuple(_count(v) for v in value)
    except ValueError as exc:
        raise ValueError(f"an id is {exc}") from None


def _text_lines(path: Path, problems: list[TraceProblem], *, strip_bom: bool) -> Iterator[tuple[int, str | None]]:
    """(1-based line, text) decoded one line at a time; a line that is not UTF-8 is reported in
    `problems` and comes as None, so every later line is still read. Line breaks are \n, \r\n
    or \r, as in text mode; each line keeps its ending (the csv module needs it)."""
    n = 0
    with path.open("rb") as fh:
        for chunk in fh:  # binary iteration splits at \n only: split \r-only endings too
            for raw in chunk.splitlines(keepends=True):
                n += 1
                if n == 1 and strip_bom and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]
                try:
                    yield n, raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    problems.append(
                        TraceProblem(
                            str(path), n, ROW, f"not UTF-8: byte {raw[exc.start]:#04x} at column {exc.start + 1}"
                        )
                    )
                    yield n, None


RowSource = Callable[[Path, list[TraceProblem], Sequence[str]], Iterator[tuple[int, dict[str, Any]]]]


def _csv_rows(
    path: Path, problems: list[TraceProblem], required: Sequence[str]
) -> Iterator[tuple[int, dict[str, Any]]]:
    fed = [0]  # the last physical line handed to the csv module: where its rows and errors are

    def lines() -> Iterator[str]:
        for n, text in _text_lines(path, problems, strip_bom=True):
            fed[0] = n
            if text is None:  # reported; a header that does not decode ends the file
                if n == 1:
                    return
                continue
            yield text

    def problem(field: str, reason: str) -> None:
        problems.append(TraceProblem(str(path), max(fed[0], 1), field, reason))

    reader = csv.DictReader(lines())
    try:
        header = reader.fieldnames
    except csv.Error as exc:
        problem(ROW, f"malformed CSV header: {exc}")
        return
    if header is None:
        if not problems:
            problem(ROW, "empty file (no header)")
        return
    absent = [c for c in required if c not in header]
    if absent:  # every row would repeat it: said once, on the header
        for c in absent:
            problems.append(TraceProblem(str(path), 1, c, f"missing column: the header has {', '.join(header)}"))
        return
    while True:
        before = fed[0]
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # e.g. NUL byte, field over the csv field size limit: the next line is read anew
            problem(ROW, f"malformed CSV: {exc}")
            if fed[0] == before:
                return  # nothing consumed: nothing more can be read
            continue
        values = [v for v in row.values() if isinstance(v, str)]
        if not any(v.strip() for v in values):
            if len(values) != 1:
                problem(ROW, "empty row: every field is blank")
            continue  # else a whitespace-only line
        extra = row.get(None)
        if extra:  # a stray separator shifts every later column: never guess which is which
            problem(ROW, f"{len(header) + len(extra)} fields, the header has {len(header)}")
            continue
        yield fed[0], row


def _jsonl_rows(
    path: Path, problems: list[TraceProblem], required: Sequence[str]
) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, raw in _text_lines(path, problems, strip_bom=False):
        if raw is None or not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append(TraceProblem(str(path), n, ROW, f"not JSON: {exc.msg}"))
            continue
        except RecursionError:
            problems.append(TraceProblem(str(path), n, ROW, "not JSON: nested too deeply"))
            continue
        if not isinstance(obj, dict):
            problems.append(TraceProblem(str(path), n, ROW, "each line must be a JSON object"))
            continue
        yield n, obj


@dataclass(frozen=True)
class _Format:
    rows: RowSource
    time: str  # the arrival column, in the format's own unit (int where exact)
    parse_time: Callable[[Any], float]
    scale: float  # the unit in seconds
    input: str
    output: str
    hashes: str | None = None
    zero_output_ok: bool = (
        False  # BurstGPT logs a failed request with 0 response tokens (replayed as 1: core/schedule.py)
    )


_FORMATS: dict[str, _Format] = {
    "azure": _Format(_csv_rows, "TIMESTAMP", parse_azure_timestamp, 1e-7, "ContextTokens", "GeneratedTokens"),
    "burstgpt": _Format(_csv_rows, "Timestamp", _number, 1.0, "Request tokens", "Response tokens", zero_output_ok=True),
    "mooncake": _Format(
        _jsonl_rows, "timestamp", _number, 1e-3, "input_length", "output_length", "hash_ids"
    ),  # milliseconds
    "plain-csv": _Format(_csv_rows, "offset_s", _number, 1.0, "input_tokens", "output_tokens", "hash_ids"),
    "plain-jsonl": _Format(_jsonl_rows, "offset_s", _number, 1.0, "input_tokens", "output_tokens", "hash_ids"),
}

FORMATS: tuple[str, ...] = tuple(_FORMATS)


def _scan(path: Path, fmt: str) -> tuple[list[TraceRow], list[TraceProblem]]:
    """Every row of the file, and every problem: one per bad field, each naming its line.

    A process reads the same trace many times (the manifest check, each stage's schedule, the
    report's prefix-cache section), so a scan is kept per file content (its SHA-256: an edit is
    read anew however quickly it follows). The rows are frozen; each caller gets its own lists,
    and problems name the path it gave."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    rows, problems = _scan_content(digest, str(path), fmt)
    return list(rows), [replace(q, path=str(path)) for q in problems]


@functools.lru_cache(maxsize=8)
def _scan_content(digest: str, path: str, fmt: str) -> tuple[tuple[TraceRow, ...], tuple[TraceProblem, ...]]:
    """Keyed by the content's digest (and the path, which the rows are read from)."""
    rows, problems = _scan_file(Path(path), fmt)
    return tuple(rows), tuple(problems)


def _scan_file(path: Path, fmt: str) -> tuple[list[TraceRow], list[TraceProblem]]:
    try:
        f = _FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown trace format {fmt!r}; supported: {', '.join(FORMATS)}") from None
    problems: list[TraceProblem] = []
    out: list[TraceRow] = []
    t0: float | None = None
    prev, prev_line = float("-inf"), 0
    for line, row in f.rows(path, problems, (f.time, f.input, f.output)):
        bad: list[TraceProblem] = []

        def value(
            name: str,
            parse: Callable[[Any], Any],
            row: dict[str, Any] = row,
            line: int = line,
            bad: list[TraceProblem] = bad,
        ) -> Any:
            """The parsed column, or None with its problem added to `bad`."""
            v = row.get(name)
            reason = ""
            if v is None:  # CSV: a short row; JSON: no such key, or null
                reason = "null" if name in row and f.rows is _jsonl_rows else "missing column"
            elif isinstance(v, str) and not v.strip():
                reason = "empty"
            else:
                try:
                    return parse(v)
                except ValueError as exc:
                    reason = str(exc)
            bad.append(TraceProblem(str(path), line, name, reason))
            return None

        t, inp, outp = value(f.time, f.parse_time), value(f.input, _count), value(f.output, _count)
        blank = (
            f.hashes is None or row.get(f.hashes) is None or str(row.get(f.hashes)).strip() == ""
        )  # optional: none given
        hashes = None if blank or f.hashes is None else value(f.hashes, _hash_ids)
        if inp == 0:
            bad.append(TraceProblem(str(path), line, f.input, "zero: a request needs at least one prompt token"))
        if outp == 0 and not f.zero_output_ok:
            bad.append(TraceProblem(str(path), line, f.output, "zero: a request needs at least one output token"))
        if hashes is not None and inp is not None and len(hashes) * BLOCK_TOKENS < inp:
            bad.append(
                TraceProblem(
                    str(path),
                    line,
                    f.hashes or ROW,
                    f"{len(hashes)} hash_ids cover {len(hashes) * BLOCK_TOKENS} tokens < input length {inp}",
                )
            )
        if t is not None:
            if t < prev:  # the format lists arrivals in order: offsets count from the first row
                bad.append(
                    TraceProblem(
                        str(path),
                        line,
                        f.time,
                        f"arrivals not sorted: {(prev - t) * f.scale:.6f} s before the arrival on line {prev_line}",
                    )
                )
            else:
                prev, prev_line = t, line
        problems += bad
        if bad or problems:
            continue
        if t0 is None:
            t0 = t
        out.append(TraceRow(line, (t - t0) * f.scale, inp, outp, hashes))
    return out, problems


def check_trace(path: str | Path, fmt: str) -> list[TraceProblem]:
    """Read the whole trace and return every problem (none: it reads); `validate` prints them."""
    return _scan(Path(path), fmt)[1]


def read_trace(path: str | Path, fmt: str) -> list[TraceRow]:
    """Read a whole trace; offsets are relative to its first row, which must be the earliest.
    A trace with any bad row raises TraceError holding every problem, not only the first."""
    rows, problems = _scan(Path(path), fmt)
    if problems:
        raise TraceError(problems)
    return rows


def read_trace_text(text: str, fmt: str, name: str = "<text>") -> list[TraceRow]:
    """Convenience for tests and small inline traces."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(text, encoding="utf-8", newline="")
        try:
            return read_trace(p, fmt)
        except TraceError as exc:
            raise TraceError([replace(q, path=name) for q in exc.problems]) from None


__all__ = [
    "BLOCK_TOKENS",
    "FORMATS",
    "ROW",
    "TraceError",
    "TraceProblem",
    "TraceRow",
    "check_trace",
    "parse_azure_timestamp",
    "read_trace",
    "read_trace_text",
]
