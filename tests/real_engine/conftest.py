"""A real vLLM (CPU build) for the tests marked real_engine: started once per session.

Without .venv-engine (`make engine`, which `make test` runs first) they fail, naming it: the
suite never passes by skipping its real parts (tests/real_parts.py).
The checkpoint is generated into a temp dir and the example real-engine manifest is copied
with its paths pointed there; nothing else of the manifest changes unless a test says so.
"""

from __future__ import annotations

import os
import time
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

# `make test` starts these tests beside the others with REAL_ENGINE_AFTER naming a file it writes
# once every other test process has finished: the engine loads meanwhile (66 s and 52 CPU-s alone
# here, 2026-12-07; loading has no timing subject), and the tests, whose subject is timing, still
# run alone (beside the rest, vLLM's own client lagged ours several-fold). Unset: they start at once.
AFTER_ENV = "REAL_ENGINE_AFTER"
AFTER_WAIT_S = 3600.0  # the rest of `make test` takes about 20 min on 2 cores


def _after() -> Path | None:
    value = os.environ.get(AFTER_ENV)
    return Path(value) if value else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test to use the engine also waits for the rest of `make test` (see AFTER_ENV):
    its time limit grows by that wait, no other test's."""
    if _after() is None:
        return
    first = next((i for i in items if "real_server" in getattr(i, "fixturenames", ())), None)
    if first is not None:
        limit = first.get_closest_marker("timeout")
        base = float(limit.args[0]) if limit is not None and limit.args else 900.0
        first.add_marker(pytest.mark.timeout(base + AFTER_WAIT_S), append=False)


def _wait_for_the_rest(go: Path, proc: Managed) -> None:
    deadline = time.monotonic() + AFTER_WAIT_S
    while not go.exists():
        if proc.proc.poll() is not None:
            raise RuntimeError(
                f"vLLM exited (code {proc.proc.returncode}) while the other tests ran; its log: {proc.log}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{AFTER_ENV}: {go} did not appear in {AFTER_WAIT_S:.0f} s")
        time.sleep(0.5)


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
    go = _after()
    # Loading beside the rest of `make test` (at nice 10) may take far longer than alone.
    settings = engines.EngineSettings(startup_timeout_s=AFTER_WAIT_S) if go else engines.EngineSettings()
    with Supervisor(tmp_path_factory.mktemp("vllm-logs")) as sup:
        proc, url = engines.start_vllm_cpu(sup, m, "g6", settings)
        engines.wait_ready(sup, proc, settings)
        if go is not None:
            _wait_for_the_rest(go, proc)
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
