"""A real vLLM (CPU build) for the tests marked real_engine: started once per session.

Without .venv-engine (`make engine`, which `make test` runs first) they fail, naming it: the
suite never passes by skipping its real parts (tests/real_parts.py).
The checkpoint is generated into a temp dir and the example real-engine manifest is copied
with its paths pointed there; nothing else of the manifest changes unless a test says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.backends.local import engine as engines
from campaign.backends.local import prometheus as prometheus_local
from campaign.backends.local.processes import Managed, Supervisor
from core.ports import free_port
from tests.conftest import ROOT
from tests.real_parts import missing

REAL_MANIFEST = ROOT / "manifests" / "tiny-llama-real-engine.yaml"
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def need(condition: bool, reason: str) -> None:
    if not condition:
        missing(reason)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime.tiny_model import generate

    d = tmp_path_factory.mktemp("tiny-llama")
    generate(d)
    return d


@pytest.fixture(scope="session")
def real_manifest_data(tiny_checkpoint: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(REAL_MANIFEST.read_text())
    data["tokenizer"]["path"] = str(tiny_checkpoint / "tokenizer.json")
    data["workload"]["trace"]["path"] = str(TRACE)
    # 10% of arrivals: these tests check timings and accounting at a light load, while
    # `make real-engine` replays 80% to start its capacity search from the replay.
    data["workload"]["rate_scale"] = 0.1
    return data


WriteManifest = Callable[..., Path]


@pytest.fixture(scope="session")
def write_real_manifest(real_manifest_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> WriteManifest:
    """write(**changes): the example real-engine manifest with top-level sections updated."""
    counter = iter(range(1_000_000))

    def write(**changes: dict[str, Any]) -> Path:
        import copy

        data = copy.deepcopy(real_manifest_data)
        for section, update in changes.items():
            data[section] = {**data[section], **update} if isinstance(data[section], dict) else update
        p = tmp_path_factory.mktemp("manifest") / f"m{next(counter)}.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        return p

    return write


@dataclass
class RealServer:
    url: str
    proc: Managed
    manifest: Path
    fleet: str


@pytest.fixture(scope="session")
def real_server(write_real_manifest: WriteManifest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    need(
        (engines.ENGINE_VENV / "bin" / "python").is_file(),
        f"no engine environment at {engines.ENGINE_VENV} (run `make engine`)",
    )
    from core.manifest import load_manifest

    manifest = write_real_manifest()
    m = load_manifest(manifest)
    with Supervisor(tmp_path_factory.mktemp("vllm-logs")) as sup:
        proc, url = engines.start_vllm_cpu(sup, m, "g6")
        engines.wait_ready(sup, proc)
        yield RealServer(url, proc, manifest, "g6")


@pytest.fixture(scope="session")
def prometheus_url_for(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, int, str], str]]:
    """start(server_url, loadgen_metrics_port, fleet) -> URL of a real Prometheus scraping both."""
    with Supervisor(tmp_path_factory.mktemp("prom-logs")) as sup:

        def start(server_url: str, loadgen_port: int, fleet: str) -> str:
            need(prometheus_local.binary() is not None, "prometheus is not installed")
            labels = {"fleet": fleet}
            targets = [
                prometheus_local.ScrapeTarget("server", server_url.removeprefix("http://"), labels),
                prometheus_local.ScrapeTarget("loadgen", f"127.0.0.1:{loadgen_port}", labels),
            ]
            _, url = prometheus_local.start(sup, tmp_path_factory.mktemp("prometheus"), targets)
            return url

        yield start


__all__ = ["RealServer", "free_port", "need"]
