from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.model import Report
from core.manifest import Manifest, load_manifest
from tests.analysis.synth import manifest
from tests.conftest import example_data

# A recorded `campaign local` run of the example manifest (tests/analysis/test_recorded_example.py).
EXAMPLE_RUN = Path(__file__).parent / "data" / "example-run"


@pytest.fixture
def m(manifest_data: dict[str, Any]) -> Manifest:
    return manifest(manifest_data)


def recorded_digest(run: Path) -> str:
    """The manifest digest the recorded records carry."""
    first = next(run.rglob("records-*.jsonl"))
    return str(json.loads(first.read_text(encoding="utf-8").splitlines()[0])["manifest_digest"])


@pytest.fixture
def recorded_tokens() -> list[int]:
    """Per-request successful output tokens of the recorded replay, both fleets."""
    from analysis.measure import intervals
    from analysis.sources.records import load_records

    m = load_manifest(EXAMPLE_RUN / "manifest.yaml", check_files=False)
    rs = load_records(EXAMPLE_RUN / "records", recorded_digest(EXAMPLE_RUN / "records"))
    out: list[int] = []
    for fleet in rs.fleets():
        out += [int(v) for v in intervals.successful_tokens_per_request(rs, fleet, m.slo.ttft_p95_s, m.slo.itl_p95_s)]
    return out


# The reports of tests/analysis/report_pages.py, each built once for the session: a build with its
# pages costs seconds (matplotlib draws every figure) and a dozen tests in five modules read the
# same ones. The directories are shared: a test only reads them (one that edits a file copies the
# directory first); each test gets its own copy of the data.
@pytest.fixture(scope="session")
def _full_pages(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    from tests.analysis.report_pages import full_report

    return full_report(tmp_path_factory.mktemp("full-report"), example_data())


@pytest.fixture
def full_pages(_full_pages: tuple[dict[str, Any], Path]) -> tuple[dict[str, Any], Path]:
    """report_pages.full_report: its report.json's data and its directory (read-only)."""
    return copy.deepcopy(_full_pages[0]), _full_pages[1]


@pytest.fixture(scope="session")
def _gate_reject_pages(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    from tests.analysis.report_pages import gate_reject_report

    return gate_reject_report(tmp_path_factory.mktemp("gate-reject-report"), example_data())


@pytest.fixture
def gate_reject_pages(_gate_reject_pages: tuple[dict[str, Any], Path]) -> tuple[dict[str, Any], Path]:
    """report_pages.gate_reject_report: its report.json's data and its directory (read-only)."""
    return copy.deepcopy(_gate_reject_pages[0]), _gate_reject_pages[1]


@pytest.fixture(scope="session")
def _recorded_pages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    from tests.analysis.report_pages import recorded_pages

    return recorded_pages(tmp_path_factory.mktemp("recorded-report"))


@pytest.fixture
def recorded_pages(_recorded_pages: tuple[Report, Path]) -> tuple[Report, Path]:
    """report_pages.recorded_pages: the recorded example run's report and its directory (read-only)."""
    return _recorded_pages[0].model_copy(deep=True), _recorded_pages[1]
