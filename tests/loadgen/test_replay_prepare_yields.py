"""A worker's prompt building lets Locust's event loop run: the heartbeat that tells the master
the worker is alive goes out every second (locust.runners HEARTBEAT_INTERVAL), and a worker
silent for 3 intervals is marked missing; with no other worker left the master stops the run."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import gevent

from core.manifest import load_manifest
from loadgen import replay
from loadgen.replay import ReplayConfig, Replayer
from loadgen.replay_options import ReplayOptions
from tests.conftest import EXAMPLE_MANIFEST


def test_building_the_prompts_lets_the_event_loop_run(tmp_path: Path, monkeypatch: Any) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    fleet = m.fleets[0].name
    cfg = ReplayConfig(fleet, "http://127.0.0.1:9", tmp_path, options=ReplayOptions(tokenizer_check=False))
    r = Replayer(m, cfg)
    r.mine = r.mine[:60]  # 1.5 s of building at the pace below
    assert len(r.mine) == 60
    real_build = replay.PromptBuilder.build

    def slow_build(self: Any, req: Any) -> Any:  # a loaded machine: 25 ms of CPU a prompt
        until = time.monotonic() + 0.025
        while time.monotonic() < until:
            pass
        return real_build(self, req)

    monkeypatch.setattr(replay.PromptBuilder, "build", slow_build)
    ticks: list[float] = []

    def heartbeat() -> None:
        while True:
            ticks.append(time.monotonic())
            gevent.sleep(0.05)

    beat = gevent.spawn(heartbeat)
    gevent.sleep(0)
    started = time.monotonic()
    r.prepare()
    took = time.monotonic() - started
    gevent.sleep(0)
    beat.kill()
    marks = [*ticks, started + took]  # the last tick to the build's end counts too
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    assert took > 1.0, took  # long enough that a loop held for all of it would show
    assert max(gaps) < 0.5, (max(gaps), took)  # old code: one gap as long as the whole build
