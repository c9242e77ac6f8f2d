from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

# One moto server for the tests and `make cloud-offline`: a free loopback port, an empty account,
# the AWS_* variables set for this process and its children (tests import it from here).
from testing.cloud_offline import moto_server as moto_server

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_MANIFEST = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"


@pytest.fixture(scope="session")
def example_manifest_path() -> Path:
    return EXAMPLE_MANIFEST


@pytest.fixture(scope="session")
def _example_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    return data


@pytest.fixture
def manifest_data(_example_data: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the example manifest as plain data, for tests that mutate one field."""
    return example_data(_example_data)


def example_data(source: dict[str, Any] | None = None) -> dict[str, Any]:
    """`manifest_data` for a fixture of wider scope: the example manifest as plain data, its
    trace and scorer runnable from wherever it is written."""
    data = copy.deepcopy(source) if source is not None else yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    # Keep the trace path valid when the data is written somewhere else.
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    # ... and the buyer's scorer runnable from there (it runs in the manifest's directory).
    data["quality"]["task_acceptance"]["command"] = [
        sys.executable,
        str(ROOT / "manifests" / "scorers" / "answers_nonempty.py"),
    ]
    return data


def write_manifest(tmp_path: Path, data: dict[str, Any], name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


# The real parts (tests/real_parts.py), each a marker: the closing lines say how their tests
# ended, so a run shows it met every one of them instead of passing beside them.
REAL_PARTS = ("real_engine", "prometheus", "browser", "shellcheck")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            # a passed test reports setup, call and teardown; count its call once
            if outcome == "passed" and getattr(report, "when", "call") != "call":
                continue
            for part in REAL_PARTS:
                if part in getattr(report, "keywords", {}):
                    per = counts.setdefault(part, {})
                    per[outcome] = per.get(outcome, 0) + 1
    if counts:
        terminalreporter.write_line(
            "real parts: "
            + "; ".join(
                f"{part} " + ", ".join(f"{n} {outcome}" for outcome, n in counts[part].items())
                for part in REAL_PARTS
                if part in counts
            )
        )
