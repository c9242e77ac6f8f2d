"""`campaign run` on AWS: upload the run's inputs, start a fresh Locust master + workers per
fleet, wait for them, and collect the records under the run id.

The orchestration talks to tasks only through a `TaskLauncher` (ECS RunTask in a campaign,
local processes in the offline cloud-path test), so the same code path is exercised by both.
Fleets run side by side, as in the local campaign: each has its own master and workers and
replays the same schedule against its own endpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, EXIT_OK, EXIT_SETUP_FAILED, CampaignError
from core.manifest import Manifest

if TYPE_CHECKING:
    from core.schedule import ScheduledRequest

Role = Literal["master", "worker"]
# After the replay's own safety net (Locust --run-time), how long `run` still waits for a task
# to stop before it stops it: Fargate provisioning, the workers' connect wait, the UI linger.
PROVISIONING_MARGIN_S = 600.0


class CloudRunError(CampaignError, RuntimeError):
    exit_code = EXIT_FAILED_STEP


@dataclass(frozen=True)
class TaskSpec:
    role: Role
    fleet: str
    task_definition: str
    environment: dict[str, str]  # overrides on top of the task definition's own


@dataclass(frozen=True)
class TaskStatus:
    state: str  # PROVISIONING, PENDING, RUNNING, STOPPED (ECS's lastStatus)
    exit_code: int | None = None
    reason: str = ""
    address: str | None = None  # where other tasks reach this one, once it runs
    ports: Mapping[int, int] = field(default_factory=dict)  # container port -> reachable port, where they differ
    ui_hint: str = ""  # how the operator reaches this task's web UI

    @property
    def stopped(self) -> bool:
        return self.state == "STOPPED"


class TaskLauncher(Protocol):
    def start(self, spec: TaskSpec) -> str: ...

    def describe(self, handles: Sequence[str]) -> dict[str, TaskStatus]: ...

    def stop(self, handle: str, reason: str) -> None: ...


@dataclass
class RunningTask:
    spec: TaskSpec
    handle: str
    status: TaskStatus = field(default_factory=lambda: TaskStatus("PROVISIONING"))


@dataclass
class CloudRunResult:
    run_id: str
    uri: str  # s3://bucket/<runs prefix>/<run id>
    records_dir: Path  # local copy of the records
    # `run`'s exit code (core/errors.py): EXIT_OK every task ended cleanly, EXIT_FAILED_STEP a task failed,
    # EXIT_SETUP_FAILED a task refused its inputs (nothing was sent)
    exit_code: int
    summaries: dict[str, Any] = field(default_factory=dict)


def replay_run_time_s(m: Manifest, schedule_span_s: float, duration_s: float | None) -> int:
    """Locust's --run-time for the master: a safety net only (the replay stops the run itself)."""
    span = schedule_span_s if duration_s is None else min(schedule_span_s, duration_s)
    return int(span + m.loadgen.request_timeout_s + 60)


def upload_inputs(s3: Any, m: Manifest, results_uri: str, run_id: str, schedule: Sequence[ScheduledRequest] | None = None) -> cc.RunInputs:
    """The manifest (byte for byte: its digest is what the tasks check), the trace and the
    schedule description, under <run>/inputs/."""
    from core.schedule import build_schedule, schedule_digest

    if m.source is None:
        raise CloudRunError("the manifest has no file to upload")
    if schedule is None:
        schedule = build_schedule(m)
    desc = cc.RunInputs(m.digest, m.workload.trace.path, m.trace_path.name, schedule_digest(schedule), len(schedule))
    cc.staged_paths(Path("/nonexistent"), desc.trace_path)  # an absolute trace path fails here, before anything starts
    bucket, prefix = cc.split_s3_uri(cc.inputs_uri(results_uri, run_id))
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.INPUT_MANIFEST}", Body=m.source.read_bytes())
    s3.upload_file(str(m.trace_path), bucket, f"{prefix}/{desc.trace_file}")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.INPUT_SCHEDULE}", Body=desc.to_json().encode())
    return desc


def download_run(s3: Any, uri: str, dest: Path) -> list[Path]:
    """Records and summaries of one run (not its inputs) into `dest`; returns the files."""
    bucket, prefix = cc.split_s3_uri(uri)
    dest.mkdir(parents=True, exist_ok=True)
    got: list[Path] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            name = obj["Key"][len(prefix) + 1 :]
            if "/" in name or not (name.startswith("records-") or name.startswith("summary-")):
                continue  # inputs/, run.json
            path = dest / name
            s3.download_file(bucket, obj["Key"], str(path))
            got.append(path)
    return sorted(got)


class CloudRun:
    def __init__(
        self,
        m: Manifest,
        cfg: cc.RunConfig,
        launcher: TaskLauncher,
        s3: Any,
        *,
        out_dir: Path,
        duration_s: float | None = None,
        poll_s: float = 10.0,
        discovery: Any = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        run_id: str | None = None,
    ) -> None:
        self.m = m
        self.cfg = cfg
        self.launcher = launcher
        self.s3 = s3
        self.duration_s = duration_s
        self.poll_s = poll_s
        self.discovery = discovery
        self.say = say
        self.run_id = run_id or cc.new_run_id()
        self.uri = cc.run_uri(cfg.results_uri, self.run_id)
        self.out_dir = out_dir
        self.tasks: list[RunningTask] = []
        self._registered: list[tuple[str, str]] = []  # (Cloud Map service id, instance id)
        self._check_stack_matches()

    def _check_stack_matches(self) -> None:
        fleets = {f.name for f in self.m.fleets}
        if set(self.cfg.targets) != fleets:
            raise CloudRunError(
                f"the deployed stack serves fleets {sorted(self.cfg.targets)}, the manifest names {sorted(fleets)}: deploy this manifest first"
            )
        if self.cfg.workers != self.m.loadgen.workers:
            raise CloudRunError(
                f"loadgen.workers: the manifest asks for {self.m.loadgen.workers}, the deployed master expects {self.cfg.workers}; deploy again"
            )

    # --- the run -------------------------------------------------------------------------

    def run(self) -> CloudRunResult:
        from core.schedule import build_schedule, span_s

        m = self.m
        self.say(f"run {self.run_id}: uploading inputs to {cc.inputs_uri(self.cfg.results_uri, self.run_id)}/")
        schedule = build_schedule(m)
        desc = upload_inputs(self.s3, m, self.cfg.results_uri, self.run_id, schedule)
        run_time = replay_run_time_s(m, span_s(schedule), self.duration_s)
        self.say(f"run {self.run_id}: {desc.requests} scheduled requests per fleet (schedule {desc.schedule_digest[:12]}), safety net {run_time} s")
        started = time.time()
        self._write_run_record("starting", started)
        try:
            masters = {f.name: self._start(self._spec("master", f.name, {cc.ENV_RUN_TIME: f"{run_time}s"})) for f in m.fleets}
            self._wait_for_masters(masters)
            for f in m.fleets:
                master = masters[f.name].status
                assert master.address is not None
                extra = {cc.ENV_MASTER_HOST: master.address, cc.ENV_MASTER_PORT: str(master.ports.get(cc.LOCUST_MASTER_PORT, cc.LOCUST_MASTER_PORT))}
                for _ in range(self.cfg.workers):
                    self._start(self._spec("worker", f.name, extra))
                self.say(f"{f.name}: master {masters[f.name].handle} at {master.address}; web UI: {master.ui_hint or '(not reachable)'}")
            self._wait_all(deadline=time.monotonic() + run_time + PROVISIONING_MARGIN_S)
        except KeyboardInterrupt:
            self.say("interrupted: stopping every task of this run (workers flush and upload what they recorded)")
            self._stop_all("operator interrupted the run")
            self._wait_all(deadline=time.monotonic() + 120)
        finally:
            self._deregister()
        return self._collect(started)

    def _spec(self, role: Role, fleet: str, extra: Mapping[str, str]) -> TaskSpec:
        env = {cc.ENV_RUN_ID: self.run_id, cc.ENV_FLEET: fleet, cc.ENV_HOST: self.cfg.targets[fleet], **extra}
        if self.duration_s is not None:
            env[cc.ENV_REPLAY_DURATION] = f"{self.duration_s:g}"
        definition = self.cfg.master_task_definition if role == "master" else self.cfg.worker_task_definition
        return TaskSpec(role, fleet, definition, env)

    def _start(self, spec: TaskSpec) -> RunningTask:
        task = RunningTask(spec, self.launcher.start(spec))
        self.tasks.append(task)
        return task

    def _refresh(self) -> None:
        live = [t for t in self.tasks if not t.status.stopped]
        if not live:
            return
        statuses = self.launcher.describe([t.handle for t in live])
        for t in live:
            new = statuses.get(t.handle)
            if new is None:
                continue
            if new.state != t.status.state:
                line = f"{t.spec.fleet} {t.spec.role} {t.handle.rsplit('/', 1)[-1]}: {new.state}"
                if new.stopped:
                    line += f" (exit {new.exit_code}{', ' + new.reason if new.reason else ''})"
                self.say(line)
                if new.state == "RUNNING" and new.address:
                    self._register(t, new.address)
            t.status = new

    def _wait_for_masters(self, masters: Mapping[str, RunningTask]) -> None:
        deadline = time.monotonic() + PROVISIONING_MARGIN_S
        while True:
            self._refresh()
            dead = [f"{fleet}: {t.status.reason or 'exit ' + str(t.status.exit_code)}" for fleet, t in masters.items() if t.status.stopped]
            if dead:
                self._stop_all("a master stopped before its workers started")
                raise CloudRunError("master task stopped before it ran: " + "; ".join(dead))
            if all(t.status.state == "RUNNING" and t.status.address for t in masters.values()):
                return
            if time.monotonic() > deadline:
                self._stop_all("masters did not start in time")
                raise CloudRunError(f"masters not running after {PROVISIONING_MARGIN_S:.0f} s")
            time.sleep(min(self.poll_s, 2.0))

    def _wait_all(self, deadline: float) -> None:
        t0 = time.monotonic()
        last = 0.0
        while True:
            self._refresh()
            if all(t.status.stopped for t in self.tasks):
                return
            now = time.monotonic()
            if now > deadline:
                self.say("tasks still running past the safety net: stopping them")
                self._stop_all("run exceeded its safety net")
                deadline = now + 120
            if now - last >= max(self.poll_s, 30.0):
                last = now
                for f in self.m.fleets:
                    self.say(f"[{now - t0:5.0f} s] {f.name}: {self._fleet_state(f.name)}{self._progress(f.name)}")
            time.sleep(self.poll_s)

    def _fleet_state(self, fleet: str) -> str:
        tasks = [t for t in self.tasks if t.spec.fleet == fleet]
        running = sum(t.status.state == "RUNNING" for t in tasks)
        stopped = sum(t.status.stopped for t in tasks)
        return f"{running} running / {stopped} stopped of {len(tasks)} tasks"

    def _progress(self, fleet: str) -> str:
        """The master's progress object (its Locust stats, merged from the workers' reports)."""
        bucket, prefix = cc.split_s3_uri(self.uri)
        try:
            body = self.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.PROGRESS_PREFIX}{fleet}.json")["Body"].read()
            p = json.loads(body)
            done, misses, ttft = p["goodput"]["count"], p["goodput"]["failures"], p["ttft"]["p95_ms"]
        except Exception:  # not written yet (the replay has not started), or unreadable
            return ""
        share = f", {1 - misses / done:.0%} within the SLO" if done else ""
        return f"; {done} requests done{share}, TTFT p95 {ttft or 0:.0f} ms"

    def _stop_all(self, reason: str) -> None:
        for t in self.tasks:
            if not t.status.stopped:
                try:
                    self.launcher.stop(t.handle, reason)
                except Exception as exc:  # keep stopping the others
                    self.say(f"could not stop {t.handle}: {exc}")

    # --- Cloud Map: Prometheus finds the tasks at master.<ns> / workers.<ns> ---------------

    def _register(self, t: RunningTask, address: str) -> None:
        service = self.cfg.master_discovery_service if t.spec.role == "master" else self.cfg.workers_discovery_service
        if self.discovery is None or not service:
            return
        instance = t.handle.rsplit("/", 1)[-1]
        try:
            self.discovery.register_instance(ServiceId=service, InstanceId=instance, Attributes={"AWS_INSTANCE_IPV4": address})
            self._registered.append((service, instance))
        except Exception as exc:  # Prometheus misses this task's histograms; the records are unaffected
            self.say(f"warning: Cloud Map registration of {instance} failed ({exc}); Prometheus will not scrape it")

    def _deregister(self) -> None:
        for service, instance in self._registered:
            try:
                self.discovery.deregister_instance(ServiceId=service, InstanceId=instance)
            except Exception as exc:
                self.say(f"warning: Cloud Map deregistration of {instance} failed: {exc}")
        self._registered.clear()

    # --- after the run ---------------------------------------------------------------------

    def _task_problems(self, fleet: str) -> tuple[list[str], bool]:
        """(reasons this fleet's run is invalid, whether a task refused its inputs)."""
        reasons: list[str] = []
        refused = False
        for t in self.tasks:
            if t.spec.fleet != fleet:
                continue
            code = t.status.exit_code
            if code in (0, 1):  # Locust's own statuses: 1 is failed requests (no --exit-code-on-error 0), which are records
                continue
            refused |= code == EXIT_SETUP_FAILED
            what = "setup failed, nothing was sent" if code == EXIT_SETUP_FAILED else f"exited {code}"
            reasons.append(f"{t.spec.role} task {t.handle.rsplit('/', 1)[-1]} {what}{': ' + t.status.reason if t.status.reason else ''}")
        return reasons, refused

    def _collect(self, started: float) -> CloudRunResult:
        from loadgen.launch import merge_worker_outputs
        from loadgen.recording import summary_name

        records = self.out_dir / self.run_id / "records"
        files = download_run(self.s3, self.uri, records)
        self.say(f"run {self.run_id}: {len(files)} record/summary file(s) downloaded to {records}")
        bucket, prefix = cc.split_s3_uri(self.uri)
        summaries: dict[str, Any] = {}
        code = EXIT_OK
        for f in self.m.fleets:
            reasons, refused = self._task_problems(f.name)
            s = merge_worker_outputs(self.m, f.name, records, extra_invalid=reasons)
            self.s3.upload_file(str(records / summary_name(f.name)), bucket, f"{prefix}/{summary_name(f.name)}")
            summaries[f.name] = asdict(s)
            verdict = "" if s.valid else " INVALID: " + "; ".join(s.invalid_reasons)
            self.say(
                f"{f.name}: scheduled {s.scheduled} = completed {s.completed} + failed {s.failed} + not sent {s.not_sent}; "
                f"schedule lag p99 {s.schedule_lag_p99_s * 1000:.1f} ms{verdict}"
            )
            if refused:
                code = EXIT_SETUP_FAILED
            elif reasons and code == EXIT_OK:
                code = EXIT_FAILED_STEP
        self._write_run_record("finished" if code == EXIT_OK else "failed", started, summaries)
        self.say(f"records of run {self.run_id}: {self.uri}/")
        return CloudRunResult(self.run_id, self.uri, records, code, summaries)

    def _write_run_record(self, status: str, started: float, summaries: Mapping[str, Any] | None = None) -> None:
        bucket, prefix = cc.split_s3_uri(self.uri)
        body = {
            "run_id": self.run_id,
            "status": status,
            "campaign": self.m.campaign,
            "manifest_digest": self.m.digest,
            "started_at": started,
            "updated_at": time.time(),
            "duration_s": self.duration_s,
            "tasks": [
                {"fleet": t.spec.fleet, "role": t.spec.role, "task": t.handle, "state": t.status.state, "exit_code": t.status.exit_code,
                 "reason": t.status.reason}
                for t in self.tasks
            ],
            "summaries": dict(summaries or {}),
        }  # fmt: skip
        self.s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.RUN_RECORD}", Body=json.dumps(body, indent=2).encode())


def read_run_config(cfn: Any, stack: str) -> cc.RunConfig:
    try:
        described = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    except Exception as exc:  # botocore ClientError or no credentials: say which stack we looked for
        raise CloudRunError(f"cannot read stack {stack}: {exc}") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if cc.RUN_CONFIG_OUTPUT not in outputs:
        raise CloudRunError(f"stack {stack} has no {cc.RUN_CONFIG_OUTPUT} output (outputs: {sorted(outputs)}): deploy with this version")
    try:
        return cc.RunConfig.from_json(outputs[cc.RUN_CONFIG_OUTPUT])
    except ValueError as exc:
        raise CloudRunError(str(exc)) from None
