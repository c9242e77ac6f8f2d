"""Start Locust for one fleet as subprocesses and merge what the workers wrote.

Pure Python (subprocess only): the campaign can import this without gevent or locust, and
run several fleets in parallel with `start_fleet(...)` handles.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from core.errors import EXIT_SETUP_FAILED
from core.manifest import Manifest, load_manifest
from core.ports import free_port
from core.records import RunSummary
from core.schedule import build_schedule, span_s
from loadgen.recording import fleet_records, in_stream_order, read_records, summary_name, worker_summaries
from loadgen.replay_options import ReplayOptions
from loadgen.replay_options import to_argv as replay_argv
from loadgen.summary import SummaryInputs, load_summary, summarize

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
# The locustfile's exit status when a worker could not set up (bad records dir, metrics port
# taken, prompt synthesis failed): nothing was sent, and the log names the cause. `run` exits
# with the same code (core/errors.py's table).
SETUP_FAILED = EXIT_SETUP_FAILED
# Seconds a local run's Locust web UI (`ui_port`) stays up after the replay, for its final figures.
LOCAL_UI_LINGER_S = 10
ROOT = LOCUSTFILE.parent.parent  # the directory holding our packages: the checkout, or site-packages when installed


def merge_worker_outputs(
    m: Manifest,
    fleet: str,
    out_dir: Path,
    *,
    extra_invalid: Sequence[str] = (),
    window_s: float | None = None,
    skip_s: float = 0.0,
) -> RunSummary:
    """One fleet summary from every worker's raw records (percentiles are never averaged): each
    worker's records file, or the parts a cloud worker uploaded, read in sequence.

    client_cpu_percent is the busiest worker's: that worker is what bounds the client.
    """
    rec_paths = in_stream_order(fleet_records(out_dir, fleet))
    worker_sums = [load_summary(p) for p in worker_summaries(out_dir, fleet)]
    reasons = list(extra_invalid)
    if not worker_sums:
        reasons.append("no worker summary: a worker died before finishing")
    schedule = build_schedule(m, window_s=window_s, skip_s=skip_s)
    s = summarize(
        SummaryInputs(m.campaign, m.digest, fleet, m.loadgen.max_schedule_lag_p99_s),
        read_records(rec_paths),
        [r.request_id for r in schedule],
        client_cpu_percent=max((w.client_cpu_percent for w in worker_sums), default=0.0),
        started_at=min((w.started_at for w in worker_sums), default=0.0),
        ended_at=max((w.ended_at for w in worker_sums), default=time.time()),
        extra_invalid=reasons,
    )
    (out_dir / summary_name(fleet)).write_text(s.to_json(), encoding="utf-8")
    return s


@dataclass
class FleetRun:
    """Handle on a running fleet replay: `.wait()` merges and returns the summary."""

    manifest: Manifest
    fleet: str
    out_dir: Path
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    _files: list[IO[bytes]] = field(default_factory=list)
    _summary: RunSummary | None = None
    window_s: float | None = None
    skip_s: float = 0.0

    def poll(self) -> bool:
        """True when every process has exited."""
        return all(p.poll() is not None for p in self.procs)

    def wait(self, timeout: float | None = None) -> RunSummary:
        if self._summary is not None:
            return self._summary
        deadline = None if timeout is None else time.monotonic() + timeout
        for p in self.procs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            p.wait(left)
        for f in self._files:
            f.close()
        bad = [
            exit_reason(p.returncode, log)
            for p, log in zip(self.procs, self.logs, strict=True)
            if p.returncode not in (0, 1)
        ]
        self._summary = merge_worker_outputs(
            self.manifest, self.fleet, self.out_dir, extra_invalid=bad, window_s=self.window_s, skip_s=self.skip_s
        )
        return self._summary

    def terminate(self, grace_s: float = 20.0) -> RunSummary:
        """Stop early (Ctrl-C path): Locust's SIGTERM handler runs the quitting hooks, which
        flush records and mark unsent requests not_sent; a process stuck past grace is killed."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return self.wait()


def exit_reason(code: int, log: Path) -> str:
    if code == SETUP_FAILED:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
        cause = next(
            (ln.split("setup failed", 1)[1].lstrip(" :,") for ln in lines if "setup failed" in ln), "see the log"
        )
        return f"setup failed, nothing was sent: {cause} (log: {log})"
    return f"locust process exited {code} (log: {log})"


def start_fleet(
    m: Manifest,
    fleet: str,
    host: str,
    out_dir: Path,
    options: ReplayOptions | None = None,
    *,
    workers: int = 1,
    metrics_port: int = 0,
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    ui_port: int | None = None,
    cpus: Collection[int] | None = None,
) -> FleetRun:
    """Start Locust replaying `options` (the defaults: the manifest's whole window, chat API,
    warmup, tokenizer check) against `host`; returns at once with the handle. `cpus`: the cores
    its processes may run on (a CPU engine on the same machine keeps its own). `m` is the
    caller's parsed manifest; the Locust processes are handed its file (`m.source`) and parse it
    once each."""
    opts = options or ReplayOptions()
    manifest_file = m.source_file()
    m.fleet(fleet)
    _claim_records_dir(out_dir, fleet)
    common = [
        "-f",
        str(LOCUSTFILE),
        "--host",
        host,
        "--manifest",
        str(manifest_file),
        "--fleet",
        fleet,
        "--records-dir",
        str(out_dir.resolve()),
        "--metrics-port",
        str(metrics_port),
        *replay_argv(opts),
        *extra_args,
    ]
    lead = _locust_lead(workers, _run_time_s(m, opts), ui_port)
    procs, logs, files = _spawn(_locust_commands(lead, common, workers), out_dir, fleet, _child_env(extra_env), cpus)
    return FleetRun(m, fleet, out_dir, procs, logs, files, window_s=opts.window_s, skip_s=opts.skip_s)


def _claim_records_dir(out_dir: Path, fleet: str) -> None:
    """Create `out_dir`; refuse one already holding this fleet's records (they would be merged in)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = fleet_records(out_dir, fleet)
    if stale:
        raise FileExistsError(
            f"{out_dir} already holds records for fleet {fleet} ({stale[0].name}); use a fresh directory"
        )


def _run_time_s(m: Manifest, opts: ReplayOptions) -> int:
    """Locust's --run-time: the replay's span plus a request timeout and a minute. A safety net
    only: the replayer stops the run itself when its schedule is done."""
    span = span_s(build_schedule(m, window_s=opts.window_s, skip_s=opts.skip_s)) / opts.rate_multiplier
    if opts.duration_s is not None:
        span = min(span, opts.duration_s)
    return int(span + m.loadgen.request_timeout_s + 60)


def _child_env(extra_env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment with `extra_env`, and our packages importable from ROOT."""
    env = {**os.environ, **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _locust_lead(workers: int, run_time_s: int, ui_port: int | None) -> list[str]:
    """`python -m locust` with the run's users, run time and mode: headless, or (`ui_port`) as the
    cloud master runs: the replay starts by itself and the web UI (loopback only) shows it live,
    staying LOCAL_UI_LINGER_S after the run (stacks/load_generator.py)."""
    mode = (
        ["--headless", "--only-summary"]
        if ui_port is None
        else [
            "--autostart",
            "--autoquit",
            str(LOCAL_UI_LINGER_S),
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(ui_port),
        ]
    )
    return [
        sys.executable,
        "-m",
        "locust",
        *mode,
        "--exit-code-on-error",
        "0",
        "-u",
        str(workers),
        "-r",
        str(workers),
        "--run-time",
        f"{run_time_s}s",
        "--stop-timeout",
        "5",
    ]


def _locust_commands(lead: list[str], common: list[str], workers: int) -> list[tuple[str, list[str]]]:
    """(name, argv) per process: one standalone Locust, or a master on a loopback port and its workers."""
    if workers == 1:
        return [("standalone", lead + common)]
    port = free_port()
    master = [
        *lead,
        "--master",
        "--master-bind-host",
        "127.0.0.1",
        "--master-bind-port",
        str(port),
        "--expect-workers",
        str(workers),
        *common,
    ]
    worker = [sys.executable, "-m", "locust", "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)]
    return [("master", master)] + [(f"worker{i}", [*worker, *common]) for i in range(workers)]


def _spawn(
    cmds: list[tuple[str, list[str]]],
    out_dir: Path,
    fleet: str,
    env: dict[str, str],
    cpus: Collection[int] | None,
) -> tuple[list[subprocess.Popen[bytes]], list[Path], list[IO[bytes]]]:
    """Start each command in its own session, its output in locust-<fleet>-<name>.log."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    files: list[IO[bytes]] = []
    for name, cmd in cmds:
        log = out_dir / f"locust-{fleet}-{name}.log"
        fh = log.open("wb")
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True
        )
        if cpus:  # set after the start (preexec_fn is unsafe with threads): threads started later inherit it
            os.sched_setaffinity(proc.pid, set(cpus))
        procs.append(proc)
        logs.append(log)
        files.append(fh)
    return procs, logs, files


def run_fleet(manifest: Manifest | Path, fleet: str, host: str, out_dir: Path, **kwargs: Any) -> RunSummary:
    """Blocking: replay the manifest's schedule against `host`, return the merged summary.
    `manifest`: parsed already, or its file (parsed here, once). `kwargs` are start_fleet's
    (options, workers, metrics_port, ...).
    Ctrl-C stops the replay gracefully and still returns what was recorded."""
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    run = start_fleet(m, fleet, host, out_dir, **kwargs)
    try:
        return run.wait()
    except KeyboardInterrupt:
        return run.terminate()
