from __future__ import annotations

import copy
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    data = copy.deepcopy(_example_data)
    # Keep the trace path valid when the data is written somewhere else.
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    # ... and the buyer's scorer runnable from there (it runs in the manifest's directory).
    data["quality"]["task_acceptance"]["command"] = [sys.executable, str(ROOT / "manifests" / "scorers" / "answers_nonempty.py")]
    return data


def write_manifest(tmp_path: Path, data: dict[str, Any], name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@contextmanager
def moto_server(region: str) -> Iterator[dict[str, str]]:
    """A moto server on a free loopback port, reset to an empty account, with the AWS_* variables
    that point boto3 (in this process and in child processes) at it; stopped on exit."""
    from moto.server import ThreadedMotoServer

    from core.ports import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        # Backends are process-global in moto: start from an empty account.
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"), timeout=10)
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": region,
        }
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            yield env
    finally:
        server.stop()
