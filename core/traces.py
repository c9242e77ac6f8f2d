"""Trace readers: every supported format becomes a list of `TraceRow`.

Offsets are seconds from the trace's first arrival. Readers are strict: a row that cannot be
trusted (bad timestamp, negative tokens, arrivals out of order) raises `TraceError` naming the
file and the 1-based line, because silently skipping rows would change the offered load.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


class TraceError(CampaignError, ValueError):
    def __init__(self, path: Path | str, line: int, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")


_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,7}))?$")


def parse_azure_timestamp(text: str) -> int:
    """100-ns ticks since the epoch (naive, treated as UTC) for `YYYY-MM-DD HH:MM:SS.fffffff`.

    Python's %f takes 6 digits; Azure writes 7 (100 ns), so the fraction is parsed by hand, and
    kept as an integer: a float of epoch seconds would lose the 7th digit.
    """
    m = _AZURE_TS.match(text.strip())
    if not m:
        raise ValueError(f"bad timestamp {text!r} (want YYYY-MM-DD HH:MM:SS.fffffff)")
    whole = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    frac = m.group(2) or "0"
    seconds = int((whole - datetime(1970, 1, 1)).total_seconds())
    return seconds * 10_000_000 + int(frac.ljust(7, "0"))


def _int_field(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str):
        try:
            n = int(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    else:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if n < 0:
        raise ValueError(f"{name} is negative ({n})")
    return n


def _float_field(value: Any, name: str) -> float:
    if isinstance(value, bool):  # JSON true would otherwise pass as 1.0
        raise ValueError(f"bad {name} {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"bad {name} {value!r}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError(f"bad {name} {value!r}")
    return f


def _hash_ids(value: Any) -> tuple[int, ...] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):  # plain CSV: space- or semicolon-separated ids
        value = [v for v in re.split(r"[ ;|]+", value.strip()) if v]
    if not isinstance(value, list):
        raise ValueError(f"hash_ids must be a list of integers, got {value!r}")
    return tuple(_int_field(v, "hash_ids[]") for v in value)


def _text_lines(path: Path, *, strip_bom: bool) -> Iterator[tuple[int, str]]:
    """(1-based line, text) decoded one line at a time, so a byte that is not UTF-8 is reported
    with its line instead of escaping as a bare UnicodeDecodeError. Line breaks are \n, \r\n
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
                    raise TraceError(path, n, f"not UTF-8: byte {raw[exc.start]:#04x} at column {exc.start + 1}") from None


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    fed = [0]  # the last physical line handed to the csv module: where its own errors are

    def lines() -> Iterator[str]:
        for n, text in _text_lines(path, strip_bom=True):
            fed[0] = n
            yield text

    reader = csv.DictReader(lines())
    try:
        if reader.fieldnames is None:
            raise TraceError(path, 1, "empty file (no header)")
        for row in reader:
            values = [v for v in row.values() if isinstance(v, str)]
            if not any(v.strip() for v in values):
                if len(values) == 1:
                    continue  # a whitespace-only line
                raise TraceError(path, reader.line_num, "empty row: every field is blank")
            extra = row.get(None)
            if extra:  # a stray separator shifts every later column: never guess which is which
                raise TraceError(path, reader.line_num, f"{len(reader.fieldnames) + len(extra)} fields, the header has {len(reader.fieldnames)}")
            yield reader.line_num, row
    except csv.Error as exc:  # e.g. NUL byte, field over the csv field size limit
        raise TraceError(path, max(fed[0], 1), f"malformed CSV: {exc}") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, raw in _text_lines(path, strip_bom=False):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(path, n, f"not JSON: {exc.msg}") from None
        except RecursionError:
            raise TraceError(path, n, "not JSON: nested too deeply") from None
        if not isinstance(obj, dict):
            raise TraceError(path, n, "each line must be a JSON object")
        yield n, obj


def _need(row: dict[str, Any], *names: str) -> list[Any]:
    missing = [n for n in names if n not in row or row[n] is None]
    if missing:
        raise ValueError(f"missing column(s) {', '.join(missing)}")
    return [row[n] for n in names]


# A parser returns the arrival in the format's own unit (int where exact); SCALE turns
# differences of it into seconds.
Parsed = tuple[float, int, int, tuple[int, ...] | None]
RowParser = Callable[[dict[str, Any]], Parsed]


def _azure(row: dict[str, Any]) -> Parsed:
    ts, inp, out = _need(row, "TIMESTAMP", "ContextTokens", "GeneratedTokens")
    return parse_azure_timestamp(ts), _int_field(inp, "ContextTokens"), _int_field(out, "GeneratedTokens"), None


def _burstgpt(row: dict[str, Any]) -> Parsed:
    ts, inp, out = _need(row, "Timestamp", "Request tokens", "Response tokens")
    return _float_field(ts, "Timestamp"), _int_field(inp, "Request tokens"), _int_field(out, "Response tokens"), None


def _mooncake(row: dict[str, Any]) -> Parsed:
    ts, inp, out = _need(row, "timestamp", "input_length", "output_length")
    return _float_field(ts, "timestamp"), _int_field(inp, "input_length"), _int_field(out, "output_length"), _hash_ids(row.get("hash_ids"))


def _plain(row: dict[str, Any]) -> Parsed:
    ts, inp, out = _need(row, "offset_s", "input_tokens", "output_tokens")
    return _float_field(ts, "offset_s"), _int_field(inp, "input_tokens"), _int_field(out, "output_tokens"), _hash_ids(row.get("hash_ids"))


_FORMATS: dict[str, tuple[Callable[[Path], Iterator[tuple[int, dict[str, Any]]]], RowParser, float]] = {
    "azure": (_csv_rows, _azure, 1e-7),
    "burstgpt": (_csv_rows, _burstgpt, 1.0),
    "mooncake": (_jsonl_rows, _mooncake, 1e-3),  # milliseconds
    "plain-csv": (_csv_rows, _plain, 1.0),
    "plain-jsonl": (_jsonl_rows, _plain, 1.0),
}

FORMATS: tuple[str, ...] = tuple(_FORMATS)


def read_trace(path: str | Path, fmt: str) -> list[TraceRow]:
    """Read a whole trace; offsets are relative to its first row, which must be the earliest."""
    p = Path(path)
    try:
        rows_of, parse, scale = _FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown trace format {fmt!r}; supported: {', '.join(FORMATS)}") from None
    out: list[TraceRow] = []
    t0: float | None = None
    prev: float = float("-inf")
    for line, row in rows_of(p):
        try:
            t, inp, outp, hashes = parse(row)
        except ValueError as exc:
            raise TraceError(p, line, str(exc)) from None
        if t < prev:
            raise TraceError(p, line, f"arrivals not sorted: timestamp goes back {(prev - t) * scale:.6f} s")
        if hashes is not None and len(hashes) * BLOCK_TOKENS < inp:
            raise TraceError(p, line, f"{len(hashes)} hash_ids cover {len(hashes) * BLOCK_TOKENS} tokens < input length {inp}")
        prev = t
        if t0 is None:
            t0 = t
        out.append(TraceRow(line, (t - t0) * scale, inp, outp, hashes))
    return out


def read_trace_text(text: str, fmt: str, name: str = "<text>") -> list[TraceRow]:
    """Convenience for tests and small inline traces."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(text, encoding="utf-8", newline="")
        try:
            return read_trace(p, fmt)
        except TraceError as exc:
            raise TraceError(name, exc.line, exc.reason) from None


__all__ = ["BLOCK_TOKENS", "FORMATS", "TraceError", "TraceRow", "parse_azure_timestamp", "read_trace", "read_trace_text"]
