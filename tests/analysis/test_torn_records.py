"""A worker killed mid-write leaves a partial last line: the complete records still count."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.errors import EmptyWindow
from analysis.report.build import ReportInputs, build_report
from analysis.sources.records import load_records
from core.manifest import Manifest
from tests.analysis.synth import steady, write_jsonl


def test_partial_last_line_is_left_out_and_named(tmp_path: Path, m: Manifest) -> None:
    d = tmp_path / "r"
    f = write_jsonl(d / "records-g6-w0.jsonl", steady(m, "g6", 10, 100))
    write_jsonl(d / "records-inf2-w0.jsonl", steady(m, "inf2", 10, 100))
    before = f.read_bytes()
    f.write_bytes(before + b'{"campaign": "llama3-8b-inf2-vs-g6", "manifest_dig')
    rs = load_records(d, m.digest)
    assert rs.count() == 20
    assert len(rs.torn_tails) == 1 and "records-g6-w0.jsonl: 50 bytes" in rs.torn_tails[0]
    assert f.read_bytes().startswith(before) and f.read_bytes() != before  # the evidence is never rewritten
    r = build_report(
        ReportInputs(
            m,
            d,
            out_dir=tmp_path / "o",
            instances_measured={"g6": 1, "inf2": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    gaps = [g for g in r["gaps"] if g["what"] == "records.torn_tail"]
    assert len(gaps) == 1 and not gaps[0]["blocks_go"]
    assert r["fleets"]["g6"]["requests"] == 10


def test_a_file_that_is_only_a_partial_line_is_an_empty_window(tmp_path: Path, m: Manifest) -> None:
    d = tmp_path / "r"
    d.mkdir()
    (d / "records-g6-w0.jsonl").write_bytes(b'{"campaign": "x"')
    with pytest.raises(EmptyWindow, match="no complete record"):
        load_records(d, m.digest)
