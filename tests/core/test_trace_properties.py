"""Property tests for every trace reader in core/traces.py.

Well-formed files, generated in each format's own layout and unit, read back to exactly the
rows they were written from (offsets, token counts, hash ids, source lines). A corrupted row
gives a TraceError naming the file and the line, never another exception type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.traces import BLOCK_TOKENS, FORMATS, TraceError, TraceRow, read_trace

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EPOCH0 = datetime(2023, 11, 16, 18, 0, 0)


@dataclass(frozen=True)
class Gen:
    """One generated row: arrival in the format's unit, tokens, optional hash ids."""

    t: int | float
    inp: int
    out: int
    hashes: tuple[int, ...] | None


# A request needs a token each way; only BurstGPT logs 0 response tokens (a failed request).
tokens = st.integers(min_value=1, max_value=20_000)


def out_tokens(fmt: str) -> st.SearchStrategy[int]:
    return st.integers(min_value=0 if fmt == "burstgpt" else 1, max_value=20_000)


@st.composite
def gen_rows(draw: st.DrawFn, fmt: str) -> list[Gen]:
    n = draw(st.integers(min_value=1, max_value=12))
    if fmt == "azure":  # 100 ns ticks from an arbitrary start
        steps = draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n))
    elif fmt == "mooncake":  # integer milliseconds
        steps = draw(st.lists(st.integers(0, 10**7), min_size=n, max_size=n))
    else:  # seconds, float
        steps = draw(st.lists(st.floats(0, 1e4, allow_nan=False, allow_infinity=False), min_size=n, max_size=n))
    start: int | float
    start = (
        draw(st.integers(0, 10**12 if fmt == "azure" else 10**9))
        if fmt in ("azure", "mooncake")
        else draw(st.floats(0, 1000000.0))
    )
    times: list[int | float] = []
    t = start
    for s in steps:
        t = t + s
        times.append(t)
    rows = []
    for t in times:
        inp = draw(tokens)
        hashes = None
        if fmt in ("mooncake", "plain-csv", "plain-jsonl") and draw(st.booleans()):
            k = -(-inp // BLOCK_TOKENS)  # enough blocks to cover the prompt (an empty list reads as "none" in CSV)
            hashes = tuple(draw(st.lists(st.integers(0, 2**40), min_size=max(k, 1), max_size=k + 3)))
        rows.append(Gen(t, inp, draw(out_tokens(fmt)), hashes))
    return rows


def _azure_ts(ticks: int) -> str:
    whole, frac = divmod(ticks, 10_000_000)
    return (EPOCH0 + timedelta(seconds=whole)).strftime("%Y-%m-%d %H:%M:%S") + f".{frac:07d}"


def render_row(fmt: str, g: Gen) -> str:
    if fmt == "azure":
        return f"{_azure_ts(int(g.t))},{g.inp},{g.out}"
    if fmt == "burstgpt":
        return f"{g.t!r},ChatGPT,{g.inp},{g.out},{g.inp + g.out},Conversation log"
    if fmt == "plain-csv":
        return f"{g.t!r},{g.inp},{g.out}," + (" ".join(map(str, g.hashes)) if g.hashes is not None else "")
    obj: dict[str, Any]
    if fmt == "mooncake":
        obj = {"timestamp": g.t, "input_length": g.inp, "output_length": g.out}
        if g.hashes is not None:
            obj["hash_ids"] = list(g.hashes)
    else:
        obj = {"offset_s": g.t, "input_tokens": g.inp, "output_tokens": g.out}
        if g.hashes is not None:
            obj["hash_ids"] = list(g.hashes)
    return json.dumps(obj)


HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "plain-csv": "offset_s,input_tokens,output_tokens,hash_ids",
}
SCALE = {"azure": 1e-7, "burstgpt": 1.0, "mooncake": 1e-3, "plain-csv": 1.0, "plain-jsonl": 1.0}


def render(fmt: str, rows: list[str], eol: str, final_eol: bool) -> tuple[str, int]:
    """File text and the 1-based line of the first data row."""
    lines = ([HEADERS[fmt]] if fmt in HEADERS else []) + rows
    return eol.join(lines) + (eol if final_eol else ""), 2 if fmt in HEADERS else 1


def expected(fmt: str, gens: list[Gen], first_line: int) -> list[TraceRow]:
    t0 = gens[0].t
    return [TraceRow(first_line + i, (g.t - t0) * SCALE[fmt], g.inp, g.out, g.hashes) for i, g in enumerate(gens)]


def test_every_format_is_covered() -> None:
    assert set(FORMATS) == set(SCALE)


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(data=st.data(), eol=st.sampled_from(["\n", "\r\n"]), final_eol=st.booleans())
def test_well_formed_round_trips(fmt: str, data: st.DataObject, eol: str, final_eol: bool, tmp_path: Path) -> None:
    gens = data.draw(gen_rows(fmt))
    text, first = render(fmt, [render_row(fmt, g) for g in gens], eol, final_eol)
    p = tmp_path / f"trace-{fmt}.txt"
    p.write_bytes(text.encode())
    assert read_trace(p, fmt) == expected(fmt, gens, first)


def _bad_value(fmt: str) -> st.SearchStrategy[str]:
    return st.sampled_from(["-1", "abc", "", "1.5", "nan", "inf", "1e999", "0x10", "\u00bd", "--3"])


@st.composite
def corrupt_row(draw: st.DrawFn, fmt: str, g: Gen, prev: Gen | None) -> str:
    """A row that no reader may accept, built from a valid one by one targeted change."""
    kinds = ["tokens", "missing", "garbage"]
    if prev is not None:
        kinds.append("unsorted")
    if fmt in ("mooncake", "plain-csv", "plain-jsonl"):
        kinds.append("hashes")
    if fmt in ("mooncake", "plain-jsonl"):
        kinds += ["json-syntax", "json-type"]
    if fmt != "azure":
        kinds.append("time")
    kind = draw(st.sampled_from(kinds))
    if kind == "unsorted":
        assert prev is not None
        back = draw(st.integers(1, 10**6))
        return render_row(fmt, Gen(prev.t - back, g.inp, g.out, g.hashes))
    if kind == "hashes":
        inp = max(g.inp, 1) + BLOCK_TOKENS * 2
        return render_row(fmt, Gen(g.t, inp, g.out, (1,)))  # one block cannot cover it
    if kind == "garbage":
        base = render_row(fmt, g)
        return draw(st.sampled_from(["\x00" + base, "\ufffd" + base, "\x00", "{" + base]))
    line = render_row(fmt, g)
    if fmt in ("mooncake", "plain-jsonl"):
        obj = json.loads(line)
        key = "timestamp" if fmt == "mooncake" else "offset_s"
        tok_keys = ["input_length", "output_length"] if fmt == "mooncake" else ["input_tokens", "output_tokens"]
        if kind == "json-syntax":
            return line[: draw(st.integers(1, len(line) - 1))]
        if kind == "json-type":
            return draw(st.sampled_from(["[]", "1", '"x"', "null", "[1, 2, 3]"]))
        if kind == "missing":
            obj.pop(draw(st.sampled_from([key, *tok_keys])))
        elif kind == "tokens":
            obj[draw(st.sampled_from(tok_keys))] = draw(st.sampled_from([-1, 1.5, "abc", None, True, [1], {"a": 1}]))
        else:  # time
            obj[key] = draw(st.sampled_from(["abc", None, [1], {"t": 1}, "nan"]))
        return json.dumps(obj)
    cells = line.split(",")
    if fmt == "azure" and kind == "missing" and draw(st.booleans()):
        cells[0] = draw(
            st.sampled_from([cells[0] + "x", cells[0].replace("-", "/"), "2023-13-45 99:99:99.0", cells[0][:10]])
        )
    tok_idx = {"azure": [1, 2], "burstgpt": [2, 3], "plain-csv": [1, 2]}[fmt]
    if kind == "missing":
        if cells[0] == line.split(",")[0]:
            cells = cells[: draw(st.sampled_from(tok_idx))]  # short row: columns missing
    elif kind == "tokens":
        cells[draw(st.sampled_from(tok_idx))] = draw(_bad_value(fmt).filter(lambda v: v != "" or True))
        if all(c.strip() == "" for c in cells):
            cells[0] = "x"
    else:  # time
        cells[0] = draw(st.sampled_from(["abc", "nan", "inf", "-inf", "", "1,2"]))
    return ",".join(cells)


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(data=st.data(), eol=st.sampled_from(["\n", "\r\n"]))
def test_one_corrupted_row_names_file_and_line(fmt: str, data: st.DataObject, eol: str, tmp_path: Path) -> None:
    gens = data.draw(gen_rows(fmt))
    k = data.draw(st.integers(0, len(gens) - 1))
    rows = [render_row(fmt, g) for g in gens]
    bad = data.draw(corrupt_row(fmt, gens[k], gens[k - 1] if k > 0 else None))
    if not bad.strip(",").strip():
        bad = "x" + bad  # an all-blank CSV row is a skipped blank line, not corruption
    rows[k] = bad
    text, first = render(fmt, rows, eol, True)
    p = tmp_path / f"bad-{fmt}.txt"
    p.write_bytes(text.encode())
    try:
        got = read_trace(p, fmt)
    except TraceError as exc:
        assert exc.path == str(p) and str(exc).startswith(f"{p}:{exc.line}: ")
        assert exc.line == first + k, (exc, bad)
        return
    pytest.fail(f"corrupted row {bad!r} was accepted: {got[k] if k < len(got) else got}")


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(data=st.data(), junk=st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b))
def test_arbitrary_bytes_in_one_row_never_escape_as_another_error(
    fmt: str, data: st.DataObject, junk: bytes, tmp_path: Path
) -> None:
    """Any bytes (invalid UTF-8, NUL, quotes, stray separators) in place of, or spliced into,
    one row: either the file still reads, or a TraceError names the file and a line at or after
    the damage (a CSV quote may run on to a later line)."""
    gens = data.draw(gen_rows(fmt))
    k = data.draw(st.integers(0, len(gens) - 1))
    rows = [render_row(fmt, g).encode() for g in gens]
    at = data.draw(st.integers(0, len(rows[k])))
    rows[k] = data.draw(st.sampled_from([junk, rows[k][:at] + junk + rows[k][at:]]))
    head = [HEADERS[fmt].encode()] if fmt in HEADERS else []
    first = len(head) + 1
    p = tmp_path / f"junk-{fmt}.txt"
    p.write_bytes(b"\n".join(head + rows) + b"\n")
    try:
        read_trace(p, fmt)
    except TraceError as exc:
        assert exc.path == str(p) and str(exc).startswith(f"{p}:{exc.line}: ")
        assert first + k <= exc.line <= first + len(rows) or (fmt in HEADERS and exc.line == 1), (exc, rows[k])


def test_invalid_utf8_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(b"offset_s,input_tokens,output_tokens\n0,1,1\n1,\xff2,1\n")
    with pytest.raises(TraceError) as ei:
        read_trace(p, "plain-csv")
    assert ei.value.line == 3 and "UTF-8" in ei.value.reason
    p = tmp_path / "t.jsonl"
    p.write_bytes(
        b'{"offset_s": 0, "input_tokens": 1, "output_tokens": 1}\n{"offset_s": 1, "input_tokens": 1\xc3, "output_tokens": 1}\n'
    )
    with pytest.raises(TraceError) as ei:
        read_trace(p, "plain-jsonl")
    assert ei.value.line == 2 and "UTF-8" in ei.value.reason
