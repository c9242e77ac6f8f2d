from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.manifest import Manifest, load_manifest
from tests.conftest import ROOT
from tests.loadgen.sse_server import SSEServer, serving

CONV = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def small_manifest_data(base: dict[str, Any], **workload: Any) -> dict[str, Any]:
    """The example manifest cut down so a replay takes seconds: 60 s of the conv trace."""
    d = copy.deepcopy(base)
    w = d["workload"]
    w["trace"]["path"] = str(CONV)
    w["window"] = {"start_s": 600, "duration_s": 60}
    w["time_scale"] = 0.05
    w["rate_scale"] = 0.5
    w["warmup_s"] = 1.0
    w["request_class"] = {"max_input_tokens": 256, "max_output_tokens": 16, "mode": "clip"}
    w.update(workload)
    d["loadgen"]["request_timeout_s"] = 2.0
    d["loadgen"]["max_schedule_lag_p99_s"] = 0.5  # shared 2-core CI box; the bench measures lag
    return d


def write(tmp: Path, data: dict[str, Any], name: str = "m.yaml") -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.fixture
def small_manifest(tmp_path: Path, manifest_data: dict[str, Any]) -> Path:
    return write(tmp_path, small_manifest_data(manifest_data))


@pytest.fixture
def manifest(example_manifest_path: Path) -> Manifest:
    return load_manifest(example_manifest_path)


@pytest.fixture
def sse_server(manifest: Manifest) -> Iterator[SSEServer]:
    s = serving(manifest)
    yield s
    s.stop()
