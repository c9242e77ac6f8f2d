"""The quality gate against a real emulator process on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from campaign.backends.local.fleets import start_emulator
from campaign.backends.local.processes import Supervisor
from core.manifest import load_manifest
from loadgen.fixtures import run_gate
from tests.conftest import write_manifest


@pytest.fixture
def emulator(tmp_path: Path, manifest_data: dict[str, Any]) -> Iterator[tuple[Path, str]]:
    manifest_data["quality"]["fixtures"].append(
        {"id": "wants-json", "prompt": "Reply with a JSON object.", "max_tokens": 8, "expect_json": True}
    )
    manifest_data["quality"]["fixtures"].append(
        {"id": "wants-stop", "prompt": "Say hi.", "max_tokens": 8, "expect_finish_reason": "stop"}
    )
    # The emulated model made 16x smaller, so its answers stream about 10x sooner (each fixture
    # 0.3 s instead of 3 to 4 s): the gate's rules are the subject, not the emulated hardware's
    # pace; the emulator stays a real process on loopback, its answers' words and lengths the same.
    manifest_data["model"]["params_b"] = 0.5
    path = write_manifest(tmp_path, manifest_data)
    with Supervisor(tmp_path / "logs") as sup:
        yield path, start_emulator(sup, path, "g6", tmp_path, [])


def test_gate_checks_each_rule(emulator: tuple[Path, str]) -> None:
    path, url = emulator
    m = load_manifest(path)
    gate = run_gate(m, "g6", url)
    by = {f.id: f for f in gate.fixtures}
    assert by["length-exact"].passed and by["length-exact"].completion_tokens == 32
    assert by["answers-nonempty"].passed
    # The emulator writes plain words: not JSON, and it runs to max_tokens.
    assert not by["wants-json"].passed and "not valid JSON" in by["wants-json"].problems[0]
    assert not by["wants-stop"].passed and "finish_reason 'length', expected 'stop'" in by["wants-stop"].problems[0]
    assert gate.pass_rate == pytest.approx(0.5)
    assert not gate.passed  # min_pass_rate 1.0 in the example manifest
    assert len(gate.failures) == 2


def test_gate_reports_an_unreachable_endpoint(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    m = load_manifest(write_manifest(tmp_path, manifest_data))
    gate = run_gate(m, "g6", "http://127.0.0.1:9", timeout_s=2)
    assert not gate.passed
    assert all("request failed" in f for f in gate.failures)
