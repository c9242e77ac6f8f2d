from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.manifest import Manifest, load_manifest
from tests.analysis.synth import manifest

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
