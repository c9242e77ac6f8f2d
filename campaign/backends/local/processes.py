"""Start, watch and always stop the local processes of a campaign.

Every child goes into its own process group so a Ctrl-C in the terminal reaches us, not the
children directly: we then stop them in a known order (load generators first, so they flush
their records; servers last) and nothing outlives the campaign.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from core.errors import EXIT_FAILED_STEP, CampaignError


class ProcessFailed(CampaignError, RuntimeError):
    exit_code = EXIT_FAILED_STEP


@dataclass
class Managed:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    stop_signal: int = signal.SIGTERM
    # The log is appended to across runs in one directory (an earlier run's lines are evidence);
    # this child's own output starts here, so nothing of an earlier process is read as its own.
    log_offset: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def own_log(self) -> str:
        try:
            with self.log.open("rb") as fh:
                fh.seek(self.log_offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.own_log().splitlines()[-lines:])


@dataclass
class Supervisor:
    """Context manager owning child processes; exiting it stops them all, newest first."""

    log_dir: Path
    children: list[Managed] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stop_signal: int = signal.SIGTERM,
        cpus: Collection[int] | None = None,
    ) -> Managed:
        """`cpus`: the cores the child and every process it starts may run on."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        fh = log.open("ab")
        offset = fh.seek(0, os.SEEK_END)
        proc = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,  # own process group: terminal Ctrl-C does not hit it directly
        )
        fh.close()
        if cpus:  # set after the start (preexec_fn is unsafe with threads): processes it starts later inherit it
            os.sched_setaffinity(proc.pid, set(cpus))
        m = Managed(name, proc, log, stop_signal, offset)
        self.children.append(m)
        return m

    def wait_for_line(self, m: Managed, needle: str, timeout_s: float) -> str:
        """Wait until the child's log holds a line containing `needle`; return that line."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in m.own_log().splitlines():
                if needle in line:
                    return line
            if not m.alive():
                raise ProcessFailed(f"{m.name} exited with code {m.proc.returncode} before ready:\n{m.tail()}")
            time.sleep(0.05)
        raise ProcessFailed(f"{m.name} not ready after {timeout_s:.0f} s:\n{m.tail()}")

    def stop(self, m: Managed, grace_s: float = 10.0) -> None:
        if not m.alive():
            return
        try:
            os.killpg(m.proc.pid, m.stop_signal)
        except ProcessLookupError:
            return
        try:
            m.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(m.proc.pid, signal.SIGKILL)
            m.proc.wait(timeout=5)

    def stop_all(self) -> None:
        for m in reversed(self.children):
            self.stop(m)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop_all()
