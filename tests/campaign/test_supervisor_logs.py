"""campaign.backends.local.processes.Supervisor reads only its own child's output from a log that earlier runs appended to."""

from __future__ import annotations

import sys
from pathlib import Path

from campaign.backends.local.processes import Supervisor


def test_wait_for_line_ignores_an_earlier_runs_lines(tmp_path: Path) -> None:
    # Seen with `campaign local --out DIR` reused after a crashed run: the old emulator log's
    # "listening on" line was taken as the new emulator's address, and the gate met a dead port.
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "emulator-g6.log").write_text("earlier run\nlistening on http://127.0.0.1:1\n")
    child = "import time; time.sleep(0.3); print('listening on http://127.0.0.1:2', flush=True); time.sleep(30)"
    with Supervisor(logs) as sup:
        m = sup.start("emulator-g6", [sys.executable, "-c", child])
        line = sup.wait_for_line(m, "listening on http://", timeout_s=20)
        assert line.endswith("127.0.0.1:2"), line
        assert "earlier run" not in m.tail()
    # The earlier run's lines are kept: the log is evidence of that run too.
    assert (logs / "emulator-g6.log").read_text().startswith("earlier run\n")


def test_a_child_started_on_a_core_keeps_every_process_it_starts_there(tmp_path: Path) -> None:
    # A CPU engine pinned by VLLM_CPU_OMP_THREADS_BIND alone ran its API server and engine core on
    # the client's core (2026-12-05); the engine's processes start after seconds of imports.
    child = (
        "import os, subprocess, sys, time; time.sleep(0.5); "
        "print('parent', sorted(os.sched_getaffinity(0)), flush=True); "
        "subprocess.run([sys.executable, '-c', 'import os; print(\"grandchild\", sorted(os.sched_getaffinity(0)), flush=True)'], check=True); "
        "time.sleep(30)"
    )
    with Supervisor(tmp_path / "logs") as sup:
        m = sup.start("pinned", [sys.executable, "-c", child], cpus={0})
        assert sup.wait_for_line(m, "parent", timeout_s=20).endswith("[0]")
        assert sup.wait_for_line(m, "grandchild", timeout_s=20).endswith("[0]")
