"""`campaign local` parses the manifest once in its own process (issue 38): the CLI's parse is
handed down to run_local, its fleets' replays and every capacity step; only the child processes
(emulators, Locust) are handed the file, and parse it themselves."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import core.manifest
from analysis.capacity.search import StepPlan
from campaign.cli import main as cli
from core.errors import EXIT_OK
from loadgen.replay_options import ReplayOptions
from tests.conftest import EXAMPLE_MANIFEST


class _ExitedProcess:
    """A Locust process that has already exited cleanly: no process is started by this test."""

    returncode = 0
    pid = 0

    def __init__(self, argv: list[str], **_kwargs: Any) -> None:
        self.argv = argv

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_campaign_local_parses_the_manifest_once_in_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses: list[Path | None] = []
    real_parse = core.manifest.manifest_from_data

    def counting_parse(data: Any, source: Path | None = None) -> core.manifest.Manifest:
        parses.append(source)
        return real_parse(data, source)

    # load_manifest looks manifest_from_data up in its module at each call, whoever imported it.
    monkeypatch.setattr(core.manifest, "manifest_from_data", counting_parse)
    started: list[list[str]] = []

    def popen(argv: list[str], **kwargs: Any) -> _ExitedProcess:
        started.append(argv)
        return _ExitedProcess(argv, **kwargs)

    monkeypatch.setattr("loadgen.launch.subprocess.Popen", popen)
    monkeypatch.setattr(
        "campaign.backends.local.fleets.start_emulator", lambda _sup, _path, fleet, *_a: f"http://127.0.0.1:1/{fleet}"
    )
    monkeypatch.setattr("campaign.backends.local.fleets._maybe_prometheus", lambda *_a: None)

    def stages(m: core.manifest.Manifest, fleets: Any, out_dir: Path, stop: threading.Event, **_k: Any) -> Any:
        """The stages' use of the fleets: one replay, then two capacity steps (a search and a settle segment)."""
        fleets.replay(out_dir / "records", ReplayOptions(duration_s=1.0))
        steps = fleets.steps()
        for i, name in enumerate(fleets.names * 2):
            steps.run(name, StepPlan(1.0, 1.0, "test", skip_s=float(i)), out_dir / f"step{i}", 1, stop)
        return SimpleNamespace(decision=SimpleNamespace(state="go", reasons=[]))

    monkeypatch.setattr("campaign.backends.local.fleets.run_stages", stages)
    code = cli.main(["local", str(EXAMPLE_MANIFEST), "--out", str(tmp_path / "run")])
    parsed_by_the_campaign = list(parses)

    assert code == EXIT_OK
    assert parsed_by_the_campaign == [EXAMPLE_MANIFEST]
    fleets = len(core.manifest.load_manifest(EXAMPLE_MANIFEST).fleets)
    assert len(started) == 3 * fleets  # the replay and both steps did start Locust for every fleet
    assert all(argv[argv.index("--manifest") + 1] == str(EXAMPLE_MANIFEST.resolve()) for argv in started)
