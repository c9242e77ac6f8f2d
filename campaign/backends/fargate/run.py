"""A cloud run's tasks and files: `CloudRun` starts each replay's or step's Fargate master and
workers (through a TaskLauncher), uploads the run's inputs, reads the records back from S3 and
keeps the run record; `CloudRunResult` is what `campaign run` returns."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign.aws.run_config import CloudRunError
from campaign.aws.s3_trees import download_run, upload_tree
from campaign.backends.fargate.tasks import Role, RunningTask, TaskLauncher, TaskRefused, TaskSpec, TaskStatus
from campaign.stages.resume import publish_order
from core import cloud_contract as cc
from core.errors import EXIT_SETUP_FAILED
from core.manifest import Manifest
from loadgen.replay_options import ReplayOptions, to_env

if TYPE_CHECKING:  # the analysis stack (duckdb) stays out of `--help` (tests/campaign/test_cli.py)
    from analysis.model import Report
    from core.records import RunSummary
    from core.schedule import ScheduledRequest

# The gate task's wait for the served model through the NLB, once every target is healthy (the
# long wait, up to the health grace, is `run`'s own: CloudFleets._wait_healthy, billing no task).
GATE_READY_TIMEOUT_S = 600.0
# After the replay's own safety net (Locust --run-time), how long `run` still waits for a task
# to stop before it stops it: Fargate provisioning, the workers' connect wait, the UI linger.
PROVISIONING_MARGIN_S = 600.0
# How often, at most, a progress line puts the run's progress.log again (`run --attach` reads it);
# every run record put also puts it.
PROGRESS_PUT_EVERY_S = 5.0


@dataclass
class CloudRunResult:
    run_id: str
    uri: str  # s3://bucket/<runs prefix>/<run id>
    run_dir: Path  # the run's local copy (campaign.stages.run's layout; records/ is the trace replay's)
    exit_code: int  # the decision's (core/errors.py), or EXIT_OK when no report was asked for
    report: Report | None = None


def replay_run_time_s(m: Manifest, schedule_span_s: float, duration_s: float | None) -> int:
    """Locust's --run-time for the master: a safety net only (the replay stops the run itself)."""
    span = schedule_span_s if duration_s is None else min(schedule_span_s, duration_s)
    return int(span + m.loadgen.request_timeout_s + 60)


def upload_inputs(
    s3: Any, m: Manifest, results_uri: str, run_id: str, schedule: Sequence[ScheduledRequest] | None = None
) -> cc.RunInputs:
    """The manifest (byte for byte: its digest is what the tasks check), the trace, a huggingface
    tokenizer's pinned files, the files the buyer's scorer command names (the conductor runs the
    quality gate's scorer) and the schedule description, under <run>/inputs/."""
    from core.schedule import build_schedule, schedule_digest

    if m.source is None:
        raise CloudRunError("the manifest has no file to upload")
    tokenizer = m.tokenizer
    if tokenizer.kind == "huggingface" and not tokenizer.files:
        # The tasks get the tokenizer only through these inputs, and stage nothing unpinned.
        raise CloudRunError(
            "tokenizer.files: not pinned; a cloud run stages the tokenizer's files to its load generators "
            "by their sha256 (docs/cloud.md)"
        )
    if schedule is None:
        schedule = build_schedule(m)
    scorer = m.quality.task_acceptance
    desc = cc.RunInputs(
        m.digest,
        m.workload.trace.path,
        m.trace_path.name,
        schedule_digest(schedule),
        len(schedule),
        tokenizer.path if tokenizer.files else None,
        tuple(sorted(tokenizer.files)),
        cc.scorer_files(scorer.command, m.source.parent) if scorer is not None else (),
    )
    cc.staged_paths(Path("/nonexistent"), desc.relative_paths)  # an absolute path fails here, before anything starts
    bucket, prefix = cc.split_s3_uri(cc.inputs_uri(results_uri, run_id))
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.INPUT_MANIFEST}", Body=m.source.read_bytes())
    s3.upload_file(str(m.trace_path), bucket, f"{prefix}/{desc.trace_file}")
    tokenizer_dir = m.tokenizer_dir
    for name in desc.tokenizer_files:
        assert tokenizer_dir is not None  # pinned files come with tokenizer.path (core.manifest.Tokenizer)
        s3.upload_file(str(tokenizer_dir / name), bucket, f"{prefix}/{cc.tokenizer_object(name)}")
    for i, rel in enumerate(desc.scorer_files):
        s3.upload_file(str(m.source.parent / rel), bucket, f"{prefix}/{cc.scorer_object(i, rel)}")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.INPUT_SCHEDULE}", Body=desc.to_json().encode())
    return desc


class CloudRun:
    """One `campaign run`: its id and S3 prefix, and every task it started (for the run record,
    Cloud Map and Ctrl-C). Replays and steps of several fleets may run from several threads."""

    def __init__(
        self,
        m: Manifest,
        cfg: cc.RunConfig,
        launcher: TaskLauncher,
        s3: Any,
        *,
        out_dir: Path,
        poll_s: float = 10.0,
        discovery: Any = None,
        elbv2: Any = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        run_id: str | None = None,
    ) -> None:
        """`discovery`: Cloud Map (a step's workers find its master there); `elbv2`: the fleets'
        target health (readiness, instances per step); None leaves that part out (unit tests)."""
        self.m = m
        self.cfg = cfg
        self.launcher = launcher
        self.s3 = s3
        self.poll_s = poll_s
        self.discovery = discovery
        self.elbv2 = elbv2
        self._print = say
        self.run_id = run_id or cc.new_run_id()
        self.uri = cc.run_uri(cfg.results_uri, self.run_id)
        self.run_dir = out_dir / self.run_id  # the run's local copy: the same layout as under self.uri
        self.tasks: list[RunningTask] = []
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._published: dict[str, tuple[int, int]] = {}  # run-dir path -> (size, mtime) as last put
        self._registered: dict[str, list[tuple[str, str]]] = {}  # step -> (Cloud Map service id, instance id)
        self.started = time.time()
        self.predicted: Mapping[str, float] | None = None  # the plan's boundaries the searches were given
        self.resumed: dict[str, Any] | None = None  # `run --resume`: where it resumed, what it carried over
        self.exit_code: int | None = None  # the decision's, once the run finished (the run record's, for --attach)
        self._progress_put = 0.0  # when progress.log was last put
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

    def upload_inputs(self) -> cc.RunInputs:
        from core.schedule import build_schedule

        self.say(f"run {self.run_id}: uploading inputs to {cc.inputs_uri(self.cfg.results_uri, self.run_id)}/")
        desc = upload_inputs(self.s3, self.m, self.cfg.results_uri, self.run_id, build_schedule(self.m))
        self.say(
            f"run {self.run_id}: {desc.requests} scheduled requests per fleet (schedule {desc.schedule_digest[:12]})"
        )
        self.write_run_record("starting")
        return desc

    def say(self, line: str) -> None:
        """A progress line: printed, appended to the run directory's progress.log and, at most every
        PROGRESS_PUT_EVERY_S, put whole under the run's prefix, where `run --attach` follows it."""
        self._print(line)
        log = self.run_dir / cc.PROGRESS_LOG
        with self._lock:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a", encoding="utf-8") as fh:
                fh.write(f"{time.strftime('%H:%M:%S', time.gmtime())}Z {line}\n")
        if time.monotonic() - self._progress_put >= PROGRESS_PUT_EVERY_S:
            self._put_progress()

    def fetch_progress(self) -> None:
        """The run's progress.log as its prefix holds it, into the run directory (`run --resume`,
        before it says anything): the resumed run's lines go on after the cut-off run's, and the
        log under the prefix only ever grows (`run --attach` reads it by offset)."""
        bucket, prefix = cc.split_s3_uri(self.uri)
        try:
            body = self.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.PROGRESS_LOG}")["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return
        with self._lock:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / cc.PROGRESS_LOG).write_bytes(body)

    def _put_progress(self) -> None:
        log = self.run_dir / cc.PROGRESS_LOG
        if not log.is_file():
            return
        bucket, prefix = cc.split_s3_uri(self.uri)
        with self._lock:
            body = log.read_bytes()
            self._progress_put = time.monotonic()
        self.s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.PROGRESS_LOG}", Body=body)

    # --- tasks ------------------------------------------------------------------------------

    def _spec(
        self, role: Role, fleet: str, extra: Mapping[str, str], command: tuple[str, ...] | None = None
    ) -> TaskSpec:
        env = {cc.ENV_RUN_ID: self.run_id, cc.ENV_FLEET: fleet, cc.ENV_HOST: self.cfg.targets[fleet], **extra}
        definition = {
            "master": self.cfg.master_task_definition,
            "worker": self.cfg.worker_task_definition,
            "gate": self.cfg.gate_task_definition,
        }[role]
        return TaskSpec(role, fleet, definition, env, command)

    def _start(self, spec: TaskSpec) -> RunningTask:
        task = RunningTask(spec, self.launcher.start(spec))
        with self._lock:
            self.tasks.append(task)
        return task

    def _refresh(self, group: Sequence[RunningTask]) -> None:
        live = [t for t in group if not t.status.stopped]
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
                if new.state == "RUNNING" and new.address and t.spec.role != "gate":
                    self._register(t, new)
            t.status = new

    def _wait_stopped(
        self,
        group: Sequence[RunningTask],
        deadline: float,
        on_poll: Callable[[], bool] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        """Until every task of `group` stopped; `on_poll()` returning True stops them early."""
        t0 = time.monotonic()
        last = 0.0
        stopping = False
        while True:
            self._refresh(group)
            if all(t.status.stopped for t in group):
                return
            now = time.monotonic()
            if now > deadline:
                self.say("tasks still running past their safety net: stopping them")
                self.stop(group, "past its safety net")
                deadline = now + 120
            if not stopping and on_poll is not None and on_poll():
                stopping = True
                self.stop(group, "the step is decided (a certain miss) or the run was stopped")
            if progress is not None and now - last >= max(self.poll_s, 30.0):
                last = now
                progress(now - t0)
            time.sleep(self.poll_s)

    def stop(self, group: Sequence[RunningTask] | None, reason: str) -> None:
        for t in list(self.tasks if group is None else group):
            if not t.status.stopped:
                try:
                    self.launcher.stop(t.handle, reason)
                except Exception as exc:  # keep stopping the others
                    self.say(f"could not stop {t.handle}: {exc}")

    def wait_all_stopped(self, timeout_s: float = 120.0) -> None:
        self._wait_stopped(list(self.tasks), time.monotonic() + timeout_s)

    # --- the gate task: readiness and quality, inside the VPC --------------------------------

    def gate(self, ready_timeout_s: Mapping[str, float]) -> dict[str, dict[str, Any]]:
        """One gate task per fleet (loadgen/gate_task.py); their results from S3."""
        from loadgen.gate_task import ENV_READY_TIMEOUT, gate_key

        group = [
            self._start(self._spec("gate", f, {ENV_READY_TIMEOUT: f"{t:g}"}))  # its definition's command: --gate
            for f, t in ready_timeout_s.items()
        ]
        self.say(
            "waiting for every fleet to serve the model through its NLB, then the quality gate: "
            + ", ".join(f"{f} (up to {t / 60:.0f} min)" for f, t in ready_timeout_s.items())
        )
        self._wait_stopped(group, time.monotonic() + max(ready_timeout_s.values()) + PROVISIONING_MARGIN_S)
        bucket, prefix = cc.split_s3_uri(self.uri)
        out: dict[str, dict[str, Any]] = {}
        for t in group:
            try:
                out[t.spec.fleet] = json.loads(
                    self.s3.get_object(Bucket=bucket, Key=f"{prefix}/{gate_key(t.spec.fleet)}")["Body"].read()
                )
            except Exception as exc:
                raise CloudRunError(
                    f"fleet {t.spec.fleet}: its gate task wrote no result (exit {t.status.exit_code}"
                    f"{', ' + t.status.reason if t.status.reason else ''}; {type(exc).__name__})"
                ) from None
        return out

    # --- a replay (the trace at x1, a capacity step, a settle segment) -------------------------

    def replay(
        self,
        fleets: Sequence[str],
        options: ReplayOptions,
        prefix: str,
        dest: Path,
        run_time_s: int,
        on_poll: Callable[[], bool] | None = None,
        *,
        linger_s: int = cc.STEP_AUTOQUIT_S,
    ) -> dict[str, RunSummary]:
        """A fresh master + workers per fleet replaying `options`, records under <run>/<prefix>/,
        downloaded into `dest` once every task stopped; `on_poll()` True stops them early.

        Master and workers start together: each worker finds its own fleet's master of this step
        in Cloud Map (loadgen/task_inputs.py) once `run` registered it, so the step pays one
        Fargate provisioning, not a master's and then its workers'. `linger_s`: how long the
        master's web UI stays up after the replay (the trace replay's, to watch it; none on a step)."""
        step = f"{self.run_id}/{prefix}"
        env = {cc.ENV_RUN_TIME: f"{run_time_s}s", cc.ENV_RECORDS_PREFIX: prefix, **to_env(options)}
        group: list[RunningTask] = []
        try:
            for f in fleets:
                # --autoquit is the master's alone (Locust refuses it on a worker: "only meaningful
                # in combination with --autostart")
                master_env = {**env, cc.ENV_STEP: step, cc.ENV_AUTOQUIT: str(linger_s)}
                group.append(self._start(self._spec("master", f, master_env)))
                worker_env = {
                    **env,
                    cc.ENV_STEP: step,
                    cc.ENV_DISCOVERY_NAMESPACE: self.cfg.namespace,
                    cc.ENV_MASTER_SERVICE: cc.master_service_name(f),
                }
                group += [self._start(self._spec("worker", f, worker_env)) for _ in range(self.cfg.workers)]
            self._refresh(group)
            for t in group:
                if t.spec.role == "master":
                    self.say(
                        f"{t.spec.fleet} [{prefix}]: master {t.handle}; web UI: {t.status.ui_hint or '(once it runs)'}"
                    )

            def progress(elapsed: float) -> None:
                for f in fleets:
                    self.say(
                        f"[{elapsed:5.0f} s] {f} [{prefix}]: {self._group_state(group, f)}{self._progress(f, prefix)}"
                    )

            def poll() -> bool:
                self._stop_broken_fleets(group)
                return on_poll() if on_poll is not None else False

            self._wait_stopped(group, time.monotonic() + run_time_s + PROVISIONING_MARGIN_S, poll, progress)
        except BaseException:  # Ctrl-C or a failed start: this replay's tasks stop and flush what they recorded
            self.stop(group, "the run was interrupted")
            raise
        finally:
            self.deregister(step)  # the step's tasks leave Cloud Map with it: registrations never pile up
        return self._collect(group, fleets, prefix, dest, options)

    def _stop_broken_fleets(self, group: Sequence[RunningTask]) -> None:
        """A task that failed (an exit other than Locust's 0 / 1) breaks its fleet's replay: a
        failed master leaves its workers waiting for it in Cloud Map, a failed worker leaves its
        master waiting for all its workers (LOCUST_EXPECT_WORKERS). Stop the fleet's other tasks
        now, not at the end of those waits; what they recorded is kept, and the replay is invalid."""
        failed = {t.spec.fleet for t in group if t.status.stopped and t.status.exit_code not in (0, 1)}
        left = [t for t in group if t.spec.fleet in failed and not t.status.stopped]
        if left:
            self.stop(left, "another task of this fleet's replay failed")

    @staticmethod
    def _group_state(group: Sequence[RunningTask], fleet: str) -> str:
        tasks = [t for t in group if t.spec.fleet == fleet]
        running = sum(t.status.state == "RUNNING" for t in tasks)
        stopped = sum(t.status.stopped for t in tasks)
        return f"{running} running / {stopped} stopped of {len(tasks)} tasks"

    def _progress(self, fleet: str, prefix: str) -> str:
        """The master's progress object (its Locust stats, merged from the workers' reports)."""
        bucket, key = cc.split_s3_uri(f"{self.uri}/{prefix}/{cc.PROGRESS_PREFIX}{fleet}.json")
        try:
            p = json.loads(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            done, misses, ttft = p["goodput"]["count"], p["goodput"]["failures"], p["ttft"]["p95_ms"]
        except Exception:  # not written yet (the replay has not started), or unreadable
            return ""
        share = f", {1 - misses / done:.0%} within the SLO" if done else ""
        return f"; {done} requests done{share}, TTFT p95 {ttft or 0:.0f} ms"

    def _task_problems(self, group: Sequence[RunningTask], fleet: str) -> tuple[list[str], bool]:
        """(reasons this fleet's replay is invalid, whether a task refused its inputs)."""
        reasons: list[str] = []
        refused = False
        for t in group:
            if t.spec.fleet != fleet:
                continue
            code = t.status.exit_code
            if code in (
                0,
                1,
            ):  # Locust's own statuses: 1 is failed requests (no --exit-code-on-error 0), which are records
                continue
            refused |= code == EXIT_SETUP_FAILED
            what = "setup failed, nothing was sent" if code == EXIT_SETUP_FAILED else f"exited {code}"
            reasons.append(
                f"{t.spec.role} task {t.handle.rsplit('/', 1)[-1]} {what}{': ' + t.status.reason if t.status.reason else ''}"
            )
        return reasons, refused

    def _collect(
        self, group: Sequence[RunningTask], fleets: Sequence[str], prefix: str, dest: Path, options: ReplayOptions
    ) -> dict[str, RunSummary]:
        from loadgen.launch import merge_worker_outputs
        from loadgen.recording import summary_name

        uri = f"{self.uri}/{prefix}"
        download_run(self.s3, uri, dest)
        bucket, key_prefix = cc.split_s3_uri(uri)
        summaries: dict[str, RunSummary] = {}
        refusals: list[str] = []
        for f in fleets:
            reasons, refused = self._task_problems(group, f)
            # against the schedule this replay had (a step's window and skip), as the tasks built it
            summaries[f] = merge_worker_outputs(
                self.m, f, dest, extra_invalid=reasons, window_s=options.window_s, skip_s=options.skip_s
            )
            self.s3.upload_file(str(dest / summary_name(f)), bucket, f"{key_prefix}/{summary_name(f)}")
            if refused:
                refusals += reasons
        self.write_run_record("running")
        if refusals:
            raise TaskRefused("a load-generator task refused its inputs, nothing was sent: " + "; ".join(refusals))
        return summaries

    # --- Cloud Map: Prometheus finds the tasks at master.<ns> / workers.<ns> ---------------

    def _register(self, t: RunningTask, status: TaskStatus) -> None:
        """The task's address in its fleet's Cloud Map service (master-<fleet> or workers-<fleet>),
        tagged with its step: the step's workers find their master there, Prometheus both."""
        services = self.cfg.master_services if t.spec.role == "master" else self.cfg.workers_services
        service = services.get(t.spec.fleet, "")
        if self.discovery is None or not service or status.address is None:
            return
        instance = t.handle.rsplit("/", 1)[-1]
        step = t.spec.environment.get(cc.ENV_STEP, "")
        attributes = {"AWS_INSTANCE_IPV4": status.address, cc.STEP_ATTRIBUTE: step}
        if t.spec.role == "master":
            attributes["AWS_INSTANCE_PORT"] = str(status.ports.get(cc.LOCUST_MASTER_PORT, cc.LOCUST_MASTER_PORT))
        try:
            self.discovery.register_instance(ServiceId=service, InstanceId=instance, Attributes=attributes)
            with self._lock:
                self._registered.setdefault(step, []).append((service, instance))
        except Exception as exc:
            if t.spec.role == "master":  # its workers cannot find it: the step fails (their wait runs out)
                self.say(
                    f"error: Cloud Map registration of master {instance} failed ({exc}); its workers cannot find it"
                )
            else:  # Prometheus misses this worker's histograms; the records are unaffected
                self.say(f"warning: Cloud Map registration of {instance} failed ({exc}); Prometheus will not scrape it")

    def deregister(self, step: str | None = None) -> None:
        """Deregister one step's tasks (when the step ends), or every task still registered."""
        with self._lock:
            steps = [step] if step is not None else list(self._registered)
            registered = [r for s in steps for r in self._registered.pop(s, [])]
        for service, instance in registered:
            try:
                self.discovery.deregister_instance(ServiceId=service, InstanceId=instance)
            except Exception as exc:
                self.say(f"warning: Cloud Map deregistration of {instance} failed: {exc}")

    # --- the instances a replay or step ran on --------------------------------------------------

    @contextmanager
    def instances_while(self, fleets: Sequence[str], dest: Path) -> Iterator[Callable[[], bool]]:
        """A poll (call it on every poll of the replay; it returns False: it never stops one)
        counting each fleet's healthy targets; on exit every poll per fleet goes to
        dest/INSTANCES_FILE, whose time-weighted mean over the load window the report divides that
        replay's, step's or settle segment's goodput by (analysis.sources.instances)."""
        from campaign.backends.fargate.target_health import fewest_healthy
        from core.records import add_instance_counts

        trackers = fewest_healthy(self.elbv2, self.cfg.target_groups, list(fleets)) if self.elbv2 is not None else {}

        def poll() -> bool:
            for t in trackers.values():
                t.poll()
            return False

        poll()
        try:
            yield poll
        finally:
            poll()
            counted = {f: t.as_dict(self.poll_s) for f, t in trackers.items() if t.fewest is not None}
            if counted:
                add_instance_counts(dest, counted)
                self.say(
                    f"[{dest.name}] instances in service: "
                    + ", ".join(
                        f"{f} {c['instances']} (fewest healthy of {len(c['polls'])} polls)" for f, c in counted.items()
                    )
                )

    # --- the run's record and its files ----------------------------------------------------------

    def publish(self) -> int:
        """The run directory's own files (quality, capacity paths, settle, report) to the run's
        prefix, each only when it changed since this run last put it; the records are there
        already (the tasks wrote them). Returns how many files went up."""
        with self._publish_lock:  # fleets searched side by side checkpoint from their own threads
            seen: dict[str, tuple[int, int]] = {}  # each file's stamp as it stood before its upload

            def skip(p: Path) -> bool:
                if p.name.startswith("records-"):
                    return True
                st = p.stat()
                key, stamp = p.relative_to(self.run_dir).as_posix(), (st.st_size, st.st_mtime_ns)
                seen[key] = stamp
                return self._published.get(key) == stamp

            def uploaded(p: Path) -> None:
                # stamped only once its upload returned: a file whose upload raised is put again by
                # the next publish (a change while it went up makes its stamp stale, so that too)
                key = p.relative_to(self.run_dir).as_posix()
                self._published[key] = seen[key]

            # the files a resume reads as "finished" last, each after what it vouches for: a
            # publish cut off half-way must not carry over a step whose files never arrived
            return upload_tree(self.s3, self.run_dir, self.uri, skip=skip, order=publish_order, uploaded=uploaded)

    def mark_published(self) -> None:
        """The run directory as it stands is what the run's prefix holds (just downloaded from it):
        the next publish puts only what changes after this."""
        with self._publish_lock:
            for p in self.run_dir.rglob("*"):
                if p.is_file():
                    st = p.stat()
                    self._published[p.relative_to(self.run_dir).as_posix()] = (st.st_size, st.st_mtime_ns)

    def move(self, src: str, dst: str) -> int:
        """Every object under the run's `src/` to `dst/` (run-relative), as campaign.stages.resume
        moved the local copy: S3 has no rename, so each is copied (CopyObject) and its key deleted
        (DeleteObject; in the versioned results bucket that leaves a delete marker over it, and the
        listing a report reads no longer shows it: S3 user guide, "Deleting object versions from a
        versioning-enabled bucket"). Returns how many objects moved."""
        bucket, prefix = cc.split_s3_uri(self.uri)
        moved = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{src}/"):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                new = f"{prefix}/{dst}/{key[len(prefix) + len(src) + 2 :]}"
                self.s3.copy_object(Bucket=bucket, Key=new, CopySource={"Bucket": bucket, "Key": key})
                self.s3.delete_object(Bucket=bucket, Key=key)
                moved += 1
        self._published = {k: v for k, v in self._published.items() if not k.startswith(f"{src}/")}
        return moved

    def deregister_stale(self) -> int:
        """Deregister every Cloud Map instance a step of this run registered (its step attribute
        starts with the run id), which the orchestrator cut off never deregistered: a step run
        again has the same step id, and its workers must not find the dead step's master. Cloud
        Map ListInstances returns each instance's Id and Attributes (Cloud Map API reference,
        ListInstances). Returns how many were deregistered."""
        if self.discovery is None:
            return 0
        services = {*self.cfg.master_services.values(), *self.cfg.workers_services.values()} - {""}
        gone = 0
        for service in sorted(services):
            for page in self.discovery.get_paginator("list_instances").paginate(ServiceId=service):
                for inst in page.get("Instances", []):
                    if str(inst.get("Attributes", {}).get(cc.STEP_ATTRIBUTE, "")).startswith(f"{self.run_id}/"):
                        self.discovery.deregister_instance(ServiceId=service, InstanceId=inst["Id"])
                        gone += 1
        return gone

    def checkpoint(self, stage: str) -> None:
        """The run directory as it stands, and the run record saying the run is at `stage`: what
        a killed orchestrator leaves for `report --run-id` (and a resume) to start from."""
        if self.run_dir.is_dir():
            self.publish()
        self.write_run_record("running", stage=stage)

    def write_run_record(self, status: str, *, stage: str | None = None) -> None:
        self._put_progress()  # every line said so far is there before a record says the run ended
        bucket, prefix = cc.split_s3_uri(self.uri)
        with self._lock:
            tasks = [
                {
                    "fleet": t.spec.fleet,
                    "role": t.spec.role,
                    "task": t.handle,
                    "state": t.status.state,
                    "exit_code": t.status.exit_code,
                    "reason": t.status.reason,
                }
                for t in self.tasks
            ]
        body = {
            "run_id": self.run_id,
            "status": status,
            "campaign": self.m.campaign,
            "manifest_digest": self.m.digest,
            "started_at": self.started,
            "updated_at": time.time(),
            **({"stage": stage} if stage is not None else {}),
            "predicted": dict(self.predicted) if self.predicted is not None else None,
            **({"resumed": self.resumed} if self.resumed is not None else {}),
            **({"exit_code": self.exit_code} if self.exit_code is not None else {}),
            "tasks": tasks,
        }
        self.s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.RUN_RECORD}", Body=json.dumps(body, indent=2).encode())
