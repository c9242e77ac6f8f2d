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


_SETUP_PROBE = """
import itertools, json, sys, time, types
import gevent
from loadgen import locustfile, replay
from loadgen.replay_options import ReplayOptions, to_argv
from locust.argument_parser import get_parser

real = replay.build_schedule
def slow_schedule(*args, **kwargs):  # a loaded machine: the trace read takes 1.5 s of CPU
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        pass
    return real(*args, **kwargs)
replay.build_schedule = slow_schedule
if hasattr(locustfile, "build_schedule"):
    locustfile.build_schedule = slow_schedule
opts = get_parser().parse_args(["--manifest", sys.argv[1], "--fleet", sys.argv[2], "--records-dir", sys.argv[3],
                                *to_argv(ReplayOptions(tokenizer_check=False))])
env = types.SimpleNamespace(parsed_options=opts, host="http://127.0.0.1:9", runner=None)
ticks = []
def heartbeat():
    while True:
        ticks.append(time.monotonic())
        gevent.sleep(0.05)
beat = gevent.spawn(heartbeat)
gevent.sleep(0)
started = time.monotonic()
r = locustfile._make_replayer(env)
ended = time.monotonic()
beat.kill()
gaps = [b - a for a, b in itertools.pairwise([*ticks, ended])]
print(json.dumps({"took": ended - started, "max_gap": max(gaps), "mine": len(r.mine)}))
"""


def test_a_workers_setup_reads_its_files_off_the_event_loop(tmp_path: Path) -> None:
    """The manifest, trace and tokenizer are read in gevent's thread pool (loadgen/locustfile.py,
    _make_replayer): the loop keeps its heartbeat going through a slow read. In a fresh process:
    the locustfile patches Locust and registers listeners on import."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    m = load_manifest(EXAMPLE_MANIFEST)
    out = subprocess.run(
        [sys.executable, "-c", _SETUP_PROBE, str(EXAMPLE_MANIFEST), m.fleets[0].name, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["took"] > 1.5 and got["mine"] > 0, got
    assert got["max_gap"] < 0.5, got  # old code: one gap as long as the whole read


def test_a_setup_error_read_off_the_loop_is_raised_on_it_once(tmp_path: Path) -> None:
    """A manifest that does not load fails the worker's setup through the locustfile's own error
    path (`_setup_failed` logs it once): gevent's pool, left to itself, prints its own bare
    traceback to the worker's log first."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    probe = (
        "import sys, types\n"
        "from loadgen import locustfile\n"
        "from locust.argument_parser import get_parser\n"
        "opts = get_parser().parse_args(['--manifest', sys.argv[1], '--fleet', 'g6', '--records-dir', sys.argv[2]])\n"
        "env = types.SimpleNamespace(parsed_options=opts, host='http://127.0.0.1:9', runner=None)\n"
        "try:\n"
        "    locustfile._make_replayer(env)\n"
        "except Exception as exc:\n"
        "    print('raised', type(exc).__name__, exc)\n"
    )
    missing = tmp_path / "no-such-manifest.yaml"
    out = subprocess.run(
        [sys.executable, "-c", probe, str(missing), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("raised ") and str(missing) in out.stdout, out.stdout
    assert "Traceback" not in out.stderr and "failed with" not in out.stderr, out.stderr[-3000:]
