"""A server whose model name is not the manifest's model.repo (vLLM's --served-model-name):
the probe and the Locust replay send the name they are given; the wrong name is a 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.manifest import load_manifest
from loadgen.gate_task import probe_models
from loadgen.launch import run_fleet
from loadgen.recording import read_records
from loadgen.replay_options import ReplayOptions
from tests.conftest import ROOT
from tests.loadgen.conftest import small_manifest_data, write
from tests.loadgen.test_client import probe
from tests.runtime.conftest import emulator_process

SERVED = "local/tiny-llama"


@pytest.fixture(scope="module")
def served_g6(example_manifest_path: Path) -> Iterator[str]:
    """One emulated g6 serving SERVED for the probe and the replay: the cut-down manifest the
    replay reads changes only the workload and the load generator, not what the fleet serves."""
    with emulator_process(example_manifest_path, "g6", "--served-model-name", SERVED) as url:
        yield url


def test_probe_sends_the_served_model_name(example_manifest_path: Path, served_g6: str) -> None:
    url = served_g6
    wrong = probe(url, example_manifest_path, "--output-tokens", "4")  # sends model.repo
    assert (wrong["outcome"], wrong["http_status"]) == ("http_error", 404)
    r = probe(url, example_manifest_path, "--output-tokens", "4", "--served-model", SERVED)
    assert r["outcome"] == "ok" and r["server_output_tokens"] == 4


def test_replay_sends_the_served_model_name(tmp_path: Path, manifest_data: dict[str, Any], served_g6: str) -> None:
    data = small_manifest_data(manifest_data, window={"start_s": 600, "duration_s": 20})
    data["loadgen"]["request_timeout_s"] = 30.0  # the emulated L4 streams 16 tokens in about 2 s
    m = write(tmp_path, data)
    # The tokenizer check (/tokenize with the model name) and every request use the name.
    s = run_fleet(m, "g6", served_g6, tmp_path / "run", options=ReplayOptions(served_model=SERVED))
    assert s.valid and s.invariant_holds() and s.completed == s.scheduled > 0, s.invalid_reasons
    recs = list(read_records(sorted((tmp_path / "run").glob("records-g6-*.jsonl"))))
    assert recs and all(r.outcome == "ok" for r in recs)


THREE_FLEETS = ROOT / "manifests" / "llama3-8b-three-fleets.yaml"


def test_a_trtllm_fleet_is_listed_and_addressed_by_its_weights_directory_name(tmp_path: Path) -> None:
    """The emulator's trtllm stack lists the model as trtllm-serve does (the weights directory's
    name, the commit here); the probe and the replay send that id by default."""
    data = small_manifest_data(yaml.safe_load(THREE_FLEETS.read_text()), window={"start_s": 600, "duration_s": 20})
    data["loadgen"]["request_timeout_s"] = 30.0  # the emulated A10G streams 16 tokens in about 2 s
    m = write(tmp_path, data)
    manifest = load_manifest(m, check_files=False)
    with emulator_process(m, "g5") as url:
        ids, seen = probe_models(url)
        assert ids == [manifest.model.commit], seen
        r = probe(url, m, "--fleet", "g5", "--output-tokens", "4")
        assert r["outcome"] == "ok" and r["server_output_tokens"] == 4
        s = run_fleet(m, "g5", url, tmp_path / "run")  # the tokenizer check and every request name the id
        assert s.valid and s.completed == s.scheduled > 0, s.invalid_reasons
