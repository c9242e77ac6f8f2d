"""Reports to render in the page tests: a full one (capacity search on both fleets, sensitivity,
ledger, payback), one stopped at the quality gate (Reject) and the recorded example run's, all
written with their pages. tests/analysis/conftest.py builds each once per session for the tests
that only read them."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from analysis.capacity.steps import discover_steps
from analysis.model import Report
from analysis.report.build import ReportInputs, build_gate_report, build_report
from tests.analysis.synth import manifest
from tests.analysis.test_capacity import KW, _m, _search_layout, _write
from tests.analysis.test_recorded_example import staged
from tests.quality import quality_results

# TTFT and ITL CDFs, goodput over time, cost per 1M, capacity steps, search path, payback, tornado
FULL_REPORT_FIGURES = 8


def full_report(tmp_path: Path, manifest_data: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    m = _m(manifest_data)
    replay = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    r = build_report(
        ReportInputs(
            m, replay, out_dir=tmp_path / "out", capacity_dirs=discover_steps(_search_layout(tmp_path, m)), **KW
        )
    )
    return r.model_dump(mode="json"), tmp_path / "out"


def gate_reject_report(tmp_path: Path, manifest_data: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    layers = {
        "fixtures": {
            "layer": "fixtures",
            "passed": False,
            "reasons": ["fixture json-answer: schema invalid"],
            "figures": {"pass_rate": 0.5, "min_pass_rate": 1.0},
        },
        "task_acceptance": {
            "layer": "task_acceptance",
            "passed": None,
            "reasons": ["the scorer exited 1"],
            "figures": {},
        },
        "distribution": {
            "layer": "distribution",
            "passed": True,
            "reasons": [],
            "figures": {"output_length_ks": {"against": "g6", "p_value": 0.5}},
        },
    }
    quality = quality_results(
        {
            "inf2": {
                "passed": False,
                "pass_rate": 0.5,
                "failures": ["fixture json-answer: schema invalid"],
                "failed_layer": "fixtures",
                "layers": layers,
            },
            "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
        }
    )
    r = build_gate_report(manifest(manifest_data), quality, out_dir=tmp_path / "out")
    return r.model_dump(mode="json"), tmp_path / "out"


def recorded_pages(tmp_path: Path) -> tuple[Report, Path]:
    """The recorded example run's report, with report.md and report.html, under tmp_path/out."""
    m, run = staged(tmp_path)
    quality = quality_results(json.loads((run / "quality.json").read_text(encoding="utf-8")))
    rep = build_report(
        ReportInputs(
            m,
            run / "records",
            quality=quality,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            capacity_dirs=discover_steps(run / "capacity"),
        )
    )
    return rep, tmp_path / "out"


class PageText(HTMLParser):
    """The text of a page's headings and table cells, and its <figure> elements' raw SVG."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.cells: list[str] = []
        self.text: list[str] = []
        self._open: str | None = None
        self._buf: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("h1", "h2", "h3", "td", "th"):
            self._open, self._buf = tag, []

    def handle_endtag(self, tag: str) -> None:
        if tag == self._open:
            text = " ".join("".join(self._buf).split())
            (self.cells if tag in ("td", "th") else self.headings).append(text)
            self._open = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._open:
            self._buf.append(data)

    @property
    def all_text(self) -> str:
        return " ".join("".join(self.text).split())
