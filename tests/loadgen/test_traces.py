from __future__ import annotations

from pathlib import Path

import pytest

from core.traces import TraceError, check_trace, parse_azure_timestamp, read_trace, read_trace_text
from tests.loadgen.conftest import CONV

AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"


def test_azure_real_file_crlf_no_final_newline() -> None:
    assert not CONV.read_bytes().endswith(b"\n")
    rows = read_trace(CONV, "azure")
    assert len(rows) == 19366
    assert rows[0].offset_s == 0.0 and (rows[0].input_tokens, rows[0].output_tokens) == (374, 44)
    # second row: 18:15:50.9951690 - 18:15:46.6805900, exact to the 7th digit
    assert rows[1].offset_s == pytest.approx(4.314579, abs=1e-9)
    assert rows[-1].line == 19367


def test_azure_seven_digit_fraction() -> None:
    a = parse_azure_timestamp("2023-11-16 18:15:46.6805901")
    b = parse_azure_timestamp("2023-11-16 18:15:46.6805900")
    assert a - b == 1  # 100 ns ticks, no float rounding


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("2023-11-16 18:15:4x.0000000,1,1", "bad timestamp"),
        ("2023-11-16 18:15:47.0000000,-3,1", "negative"),
        ("2023-11-16 18:15:47.0000000,3,abc", "integer"),
        ("2023-11-16 18:15:45.0000000,3,1", "not sorted"),
    ],
)
def test_azure_bad_rows_name_file_and_line(row: str, needle: str) -> None:
    text = AZ_HEAD + "2023-11-16 18:15:46.0000000,5,5\r\n" + row
    with pytest.raises(TraceError) as ei:
        read_trace_text(text, "azure", name="bad.csv")
    assert ei.value.line == 3 and ei.value.path == "bad.csv" and needle in ei.value.reason
    assert str(ei.value).startswith("bad.csv:3:")


def test_burstgpt() -> None:
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n7.5,GPT-4,1087,0,1087,Conversation log\n"
    )
    rows = read_trace_text(text, "burstgpt")
    assert [(r.offset_s, r.input_tokens, r.output_tokens) for r in rows] == [(0.0, 472, 18), (2.5, 1087, 0)]


def test_mooncake_ms_and_hash_ids() -> None:
    text = (
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1500, "input_length": 100, "output_length": 7, "hash_ids": [1]}\n'
    )
    rows = read_trace_text(text, "mooncake", "t.jsonl")
    assert rows[1].offset_s == 1.5 and rows[0].hash_ids == (1, 2)
    bad = '{"timestamp": 0, "input_length": 1600, "output_length": 5, "hash_ids": [1, 2]}\n'
    with pytest.raises(TraceError, match=r"t\.jsonl:1: hash_ids: 2 hash_ids cover 1024"):
        read_trace_text(bad, "mooncake", "t.jsonl")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: \(row\): not JSON"):
        read_trace_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n', "mooncake", "t.jsonl")


def test_plain_csv_and_jsonl(tmp_path: Path) -> None:
    rows = read_trace_text("offset_s,input_tokens,output_tokens,hash_ids\n0.5,10,2,7 8\n1.0,20,3,\n", "plain-csv")
    assert rows[0].offset_s == 0.0 and rows[0].hash_ids == (7, 8) and rows[1].hash_ids is None
    rows = read_trace_text('{"offset_s": 2, "input_tokens": 4, "output_tokens": 1}\n', "plain-jsonl")
    assert rows[0].input_tokens == 4
    with pytest.raises(TraceError, match="missing column"):
        read_trace_text("offset_s,input_tokens\n0,1\n", "plain-csv")


def test_a_row_with_more_fields_than_the_header_names_its_line(tmp_path: Path) -> None:
    # "1,2" in the offset column shifts every later column: reading it would misattribute tokens.
    p = tmp_path / "t.csv"
    p.write_text("offset_s,input_tokens,output_tokens,hash_ids\n0.5,10,20,\n1,2,30,40,\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: \(row\): 5 fields, the header has 4"):
        read_trace(p, "plain-csv")


@pytest.mark.parametrize(
    ("text", "fmt", "line", "needle"),
    [
        ("offset_s,input_tokens,output_tokens\n0,1,1\n,,\n2,1,1\n", "plain-csv", 3, "every field is blank"),
        (
            "offset_s,input_tokens,output_tokens\n0,1,1\n1," + "9" * 200_000 + ",1\n",
            "plain-csv",
            3,
            "field larger than field limit",
        ),
        (
            '{"offset_s": 0, "input_tokens": 1, "output_tokens": 1}\n{"offset_s": true, "input_tokens": 1, "output_tokens": 1}\n',
            "plain-jsonl",
            2,
            "offset_s",
        ),
    ],
)
def test_rows_that_cannot_be_taken_at_face_value_name_their_line(text: str, fmt: str, line: int, needle: str) -> None:
    with pytest.raises(TraceError) as ei:
        read_trace_text(text, fmt)
    assert ei.value.line == line and needle in str(ei.value)


def test_whitespace_only_lines_are_blank() -> None:
    rows = read_trace_text("offset_s,input_tokens,output_tokens\n0,1,1\n   \n2,1,1\n", "plain-csv")
    assert [r.line for r in rows] == [2, 4]


# Rows 3-7 each break one rule; rows 2 and 8 are good. A reader that stops at the first bad row
# (or at none) makes a user fix and rerun once per row.
BAD_ROWS = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.0000000,374,44\n"
    "2023-11-16 18:15:47.0000000,374\n"
    "2023-11-16 18:15:48.0000000,-5,10\n"
    "2023-11-16 18:15:49.0000000,12,0\n"
    "2023-11-16 18:15:45.0000000,12,3\n"
    "2023-11-16 18:15:50.0000000,abc,3\n"
    "2023-11-16 18:15:51.0000000,20,4\n"
)
BAD_ROWS_FOUND = [
    (3, "GeneratedTokens", "missing column"),
    (4, "ContextTokens", "negative (-5)"),
    (5, "GeneratedTokens", "zero: a request needs at least one output token"),
    (6, "TIMESTAMP", "arrivals not sorted: 4.000000 s before the arrival on line 5"),
    (7, "ContextTokens", "not an integer: 'abc'"),
]


def test_every_bad_row_is_listed_with_its_line_field_and_rule(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(BAD_ROWS)
    found = check_trace(p, "azure")
    assert [(q.line, q.field, q.reason) for q in found] == BAD_ROWS_FOUND
    assert [str(q) for q in found] == [f"{p}:{line}: {field}: {reason}" for line, field, reason in BAD_ROWS_FOUND]
    with pytest.raises(TraceError) as ei:
        read_trace(p, "azure")
    assert ei.value.problems == found and (ei.value.line, ei.value.field) == (3, "GeneratedTokens")
    assert str(ei.value) == f"{p}:3: GeneratedTokens: missing column (and 4 more problem(s) in this trace)"
    assert check_trace(CONV, "azure") == []


@pytest.mark.parametrize(
    ("text", "fmt", "found"),
    [
        # a header without a needed column: said once, not once per row
        (
            "offset_s,input_tokens\n0,1\n1,1\n",
            "plain-csv",
            [(1, "output_tokens", "missing column: the header has offset_s, input_tokens")],
        ),
        # zero lengths: no request can be made of them; BurstGPT's 0 response tokens is a logged failure, kept
        (
            '{"offset_s": 0, "input_tokens": 0, "output_tokens": 1}\n{"offset_s": 1, "input_tokens": 1, "output_tokens": 0}\n',
            "plain-jsonl",
            [
                (1, "input_tokens", "zero: a request needs at least one prompt token"),
                (2, "output_tokens", "zero: a request needs at least one output token"),
            ],
        ),
        (
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,0,0,0,Conversation log\n",
            "burstgpt",
            [(2, "Request tokens", "zero: a request needs at least one prompt token")],
        ),
        # null, empty, and both bad in one row: each field its own line
        (
            '{"offset_s": null, "input_tokens": "", "output_tokens": 1.5}\n',
            "plain-jsonl",
            [(1, "offset_s", "null"), (1, "input_tokens", "empty"), (1, "output_tokens", "not an integer: 1.5")],
        ),
        # a line that is not UTF-8 or not JSON does not stop the rows after it from being checked
        (
            '{"offset_s": 0, "input_tokens": 1, "output_tokens": 1}\n{oops\n[1]\n{"offset_s": 1, "input_tokens": -1, "output_tokens": 1}\n',
            "plain-jsonl",
            [
                (2, "(row)", "not JSON: Expecting property name enclosed in double quotes"),
                (3, "(row)", "each line must be a JSON object"),
                (4, "input_tokens", "negative (-1)"),
            ],
        ),
    ],
)
def test_each_rule_names_its_field(text: str, fmt: str, found: list[tuple[int, str, str]]) -> None:
    with pytest.raises(TraceError) as ei:
        read_trace_text(text, fmt, name="t")
    assert [(q.line, q.field, q.reason) for q in ei.value.problems] == found


def test_rows_after_a_line_that_is_not_utf8_are_still_checked(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(b"offset_s,input_tokens,output_tokens\n0,1,1\n1,\xff2,1\n2,-1,1\n")
    assert [(q.line, q.field) for q in check_trace(p, "plain-csv")] == [(3, "(row)"), (4, "input_tokens")]


@pytest.mark.parametrize("bad", ["2023-13-01 00:00:00.0", "2023-02-31 00:00:00.0", "2023-01-01 24:00:00.0"])
def test_an_impossible_date_or_time_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="bad timestamp"):
        parse_azure_timestamp(bad)


def test_a_trace_read_again_is_the_same_and_an_edited_one_is_read_anew(tmp_path: Path) -> None:
    """A process keeps each trace version it read (core.traces._scan): the same rows again, lists
    of its own for each caller, and a file edited in place read anew, its problems naming the path
    the caller gave."""
    p = tmp_path / "t.csv"
    p.write_text("offset_s,input_tokens,output_tokens\n0,10,5\n1,20,6\n", encoding="utf-8")
    first = read_trace(p, "plain-csv")
    first.clear()  # the caller's own list
    again = read_trace(p, "plain-csv")
    assert [(r.offset_s, r.input_tokens) for r in again] == [(0.0, 10), (1.0, 20)]
    p.write_text("offset_s,input_tokens,output_tokens\n0,10,5\n1,20,6\n2,30,7\n", encoding="utf-8")
    assert [r.input_tokens for r in read_trace(p, "plain-csv")] == [10, 20, 30]
    p.write_text("offset_s,input_tokens,output_tokens\n0,10,5\n1,0,6\n", encoding="utf-8")
    problems = check_trace(str(p), "plain-csv")
    assert [(q.path, q.line, q.field) for q in problems] == [(str(p), 3, "input_tokens")]
