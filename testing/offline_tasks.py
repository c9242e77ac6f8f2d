"""Stand-ins for what AWS does around the load-generator tasks, for the offline cloud path
(testing/cloud_offline.py, `make cloud-offline`, and its test).

`LocalTaskLauncher` implements campaign.backends.fargate.tasks.TaskLauncher with local processes: each
"task" runs the container exactly as the synthesized task definition describes it (the
image's ENTRYPOINT from the Dockerfile + the container's Command, the definition's
Environment with its CloudFormation references resolved, then the RunTask overrides). What
one host cannot share is substituted and listed here: each task gets its own work and
records directory (a container has its own /data), and the master its own free ports for
the worker link, the web UI and the metrics (tasks have their own network namespace), and
the trace replay's web UI lingers 1 s after the run instead of a minute (a step's does not
linger on AWS either).

The launcher's state is on disk, so that an orchestrator in its own process can be killed and
another pick its run up, as on ECS: each task's process is written to `<workdir>/tasks.jsonl` as it
starts (its run id, role, fleet, step), and `stop_run` finds a cut-off run's tasks there, whoever
started them. `<workdir>/launcher.json` holds what a launcher in another process needs
(`LocalTaskLauncher.from_state`). The conductor (`run --detach`) runs the conductor definition's
`campaign conduct` through testing.offline_conductor, which gives it a launcher over the same
state in place of ECS RunTask (the one substitution: moto's ECS starts no container).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from campaign.backends.fargate.tasks import TaskSpec, TaskStatus
from core import cloud_contract as cc
from core.ports import free_port
from loadgen.launch import exit_reason

SETUP_FAILED_PREFIX = "setup failed, nothing was sent: "  # cloud_run says it already
TASKS_FILE = "tasks.jsonl"
STATE_FILE = "launcher.json"
# StopTask: SIGTERM, then SIGKILL once the container's stop timeout has passed, 30 s unless the
# definition sets stopTimeout (ECS API reference, StopTask; ContainerDefinition.stopTimeout).
STOP_TIMEOUT_S = 30.0

ROOT = Path(__file__).resolve().parents[1]


def resolve(value: Any, refs: Mapping[str, str]) -> Any:
    """Resolve the intrinsics the stacks use in task environments and outputs: Ref, GetAtt, Join.
    Anything else fails the test: the offline run must not silently drop a value."""
    if isinstance(value, str | int | float):
        return value
    if isinstance(value, list):
        return [resolve(v, refs) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Ref":
            return refs.get(arg, arg)
        if fn == "Fn::GetAtt":
            key = f"{arg[0]}.{arg[1]}"
            return refs.get(key, key)
        if fn == "Fn::Join":
            sep, parts = arg
            return sep.join(str(resolve(p, refs)) for p in parts)
    raise AssertionError(f"unsupported CloudFormation value in the offline run: {json.dumps(value)[:200]}")


def task_role(template: Mapping[str, Any], task_definition: str) -> str:
    """The logical id of the task definition's task role: each task's access key id, so that its
    calls are recorded as that role's (testing/iam_recorder.py; moto takes any key)."""
    role = template["Resources"][task_definition]["Properties"]["TaskRoleArn"]
    if set(role) != {"Fn::GetAtt"}:
        raise AssertionError(f"{task_definition}: TaskRoleArn {json.dumps(role)} is not a role of the stack")
    return str(role["Fn::GetAtt"][0])


def dockerfile_entrypoint(dockerfile: Path) -> list[str]:
    m = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", dockerfile.read_text(encoding="utf-8"), re.M)
    assert m, f"{dockerfile}: no exec-form ENTRYPOINT"
    argv: list[str] = json.loads(m.group(1))
    # The image's python is this environment's python; /app (WORKDIR, PYTHONPATH) is the repository.
    return [sys.executable if a == "python" else a for a in argv]


class LocalTaskLauncher:
    def __init__(
        self,
        template: Mapping[str, Any],
        refs: Mapping[str, str],
        workdir: Path,
        env: Mapping[str, str],
        *,
        cpus: Mapping[str, set[int]] | None = None,
        concurrent: int | None = None,
        stand_in: str | None = None,
    ) -> None:
        """`env`: what every task gets beside its definition's (the moto endpoint and credentials,
        what the task role gives a real task, the access key id being the task role's logical id;
        offline, the NLB stand-in's answer source);
        `cpus`: per fleet, the cores its tasks may use (a Fargate task has its own vCPU; here
        they stay off the cores the fleets' CPU engines run on); `concurrent`: the fleets a conductor
        started here measures at once (the real-engine run's one at a time); `stand_in`: what serves
        the fleets (testing.cloud_offline.OfflineAws.stand_in), for a conductor's report."""
        self.template = template
        self.refs = refs
        self.workdir = workdir
        self.cpus = dict(cpus or {})
        self.concurrent = concurrent
        self.stand_in = stand_in
        self.env = dict(env)  # the moto endpoint and credentials: what the task role gives a real task
        self.entrypoint = dockerfile_entrypoint(ROOT / "Dockerfile")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, dict[int, int]] = {}
        self.web: dict[str, int] = {}
        self.logs: dict[str, Path] = {}
        self._files: list[IO[bytes]] = []
        self.started: list[TaskSpec] = []
        self._count = 0
        self._count_lock = threading.Lock()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / STATE_FILE).write_text(
            json.dumps(
                {
                    "template": template,
                    "refs": dict(refs),
                    "env": self.env,
                    "cpus": {k: sorted(v) for k, v in self.cpus.items()},
                    "concurrent": concurrent,
                    "stand_in": stand_in,
                }
            ),
            encoding="utf-8",
        )
        # Ports handed out stay reserved: a port found free is not bound until its task starts,
        # and two masters' ports once collided (a worker's metrics port = its master's + index).
        self._reserved: set[int] = set()

    @classmethod
    def from_state(cls, workdir: Path) -> LocalTaskLauncher:
        """A launcher over `workdir`'s state, in another process (the conductor's, a resumed run's)."""
        state = json.loads((workdir / STATE_FILE).read_text(encoding="utf-8"))
        cpus = {k: set(v) for k, v in state["cpus"].items()}
        return cls(
            state["template"],
            state["refs"],
            workdir,
            state["env"],
            cpus=cpus,
            concurrent=state["concurrent"],
            stand_in=state.get("stand_in"),
        )

    def _port(self, width: int = 1) -> int:
        """A free loopback port p (with p+1 .. p+width-1 free too), reserved for this launcher."""
        for _ in range(100):
            p = free_port(width=width)
            span = set(range(p, p + width))
            if not span & self._reserved:
                self._reserved |= span
                return p
        raise RuntimeError("no free port range")

    def container(self, task_definition: str) -> dict[str, Any]:
        # The run config's task-definition "ARN" is its unresolved Ref: the logical id.
        res = self.template["Resources"][task_definition]
        assert res["Type"] == "AWS::ECS::TaskDefinition", task_definition
        (c,) = [c for c in res["Properties"]["ContainerDefinitions"] if c["Name"] == cc.CONTAINER_NAME]
        return dict(c)

    def start(self, spec: TaskSpec) -> str:
        c = self.container(spec.task_definition)
        # unique across the processes sharing the state: this one's pid and its count
        with self._count_lock:  # fleets start their tasks from their own threads
            self._count += 1
            handle = f"arn:local:ecs:task/local/{spec.fleet or 'run'}-{spec.role}-{os.getpid()}-{self._count}"
        home = self.workdir / handle.rsplit("/", 1)[-1]
        env = {e["Name"]: str(resolve(e["Value"], self.refs)) for e in c["Environment"]}
        env.update(spec.environment)
        env.update({cc.ENV_WORK_DIR: str(home), "LOADGEN_RECORDS_DIR": str(home / "records"), "PYTHONPATH": str(ROOT)})
        env["AWS_ACCESS_KEY_ID"] = task_role(self.template, spec.task_definition)  # its role's calls
        ports: dict[int, int] = {}
        if spec.role == "master":
            ports[cc.LOCUST_MASTER_PORT] = self._port()
            self.web[handle] = self._port()
            env.update(
                {
                    "LOCUST_MASTER_BIND_PORT": str(ports[cc.LOCUST_MASTER_PORT]),
                    "LOCUST_WEB_PORT": str(self.web[handle]),
                    "LOADGEN_METRICS_PORT": str(self._port(1 + int(env.get("LOCUST_EXPECT_WORKERS", "2")))),
                }
            )
            if env[cc.ENV_AUTOQUIT] == str(cc.UI_LINGER_S):  # the trace replay's UI linger: nobody watches it here
                env[cc.ENV_AUTOQUIT] = "1"
        command = list(c["Command"] if spec.command is None else spec.command)  # RunTask's command override
        if spec.role == "conductor":  # `campaign conduct`, with this launcher's state for ECS RunTask
            argv = [sys.executable, "-m", "testing.offline_conductor", str(self.workdir), *command]
        else:
            argv = [*self.entrypoint, *command]
        home.mkdir(parents=True)
        log = home / "task.log"
        fh = log.open("wb")
        self._files.append(fh)
        cores = self.cpus.get(spec.fleet)
        self.procs[handle] = subprocess.Popen(
            argv,
            env={**os.environ, **self.env, **env},
            cwd=str(ROOT),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
        self.ports[handle] = ports
        self.logs[handle] = log
        self.started.append(spec)
        entry = {
            "handle": handle,
            "pid": self.procs[handle].pid,
            "started": _start_ticks(self.procs[handle].pid),
            "at": time.time(),
            "run_id": spec.environment.get(cc.ENV_RUN_ID, ""),
            "role": spec.role,
            "fleet": spec.fleet,
            "step": spec.environment.get(cc.ENV_STEP, ""),
        }
        with (self.workdir / TASKS_FILE).open("a", encoding="utf-8") as registry:  # one short line: one write
            registry.write(json.dumps(entry) + "\n")
        return handle

    def registry(self) -> list[dict[str, Any]]:
        """Every task started over this state, by any process, in start order."""
        path = self.workdir / TASKS_FILE
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def stop_run(self, run_id: str, reason: str, *, conductor: bool) -> list[str]:
        """StopTask for each of the run's tasks still alive, whoever started it: SIGTERM to its
        process group, SIGKILL after STOP_TIMEOUT_S; returns once every one has exited."""
        alive = [
            e
            for e in self.registry()
            if e["run_id"] == run_id and (conductor or e["role"] != "conductor") and _alive(e["pid"], e["started"])
        ]
        for e in alive:
            _signal_group(e["pid"], signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for e in alive:
            while _alive(e["pid"], e["started"]) and time.monotonic() < deadline:
                self._reap(e["handle"])
                time.sleep(0.1)
            if _alive(e["pid"], e["started"]):
                _signal_group(e["pid"], signal.SIGKILL)
                while _alive(e["pid"], e["started"]):
                    self._reap(e["handle"])
                    time.sleep(0.05)
            self._reap(e["handle"])
        return [e["handle"] for e in alive]

    def _reap(self, handle: str) -> None:
        p = self.procs.get(handle)
        if p is not None:
            p.poll()

    def describe(self, handles: Sequence[str]) -> dict[str, TaskStatus]:
        out = {}
        for h in handles:
            if h not in self.procs:  # started by another process over this state: alive or not, no exit code
                e = next(e for e in self.registry() if e["handle"] == h)
                state = "RUNNING" if _alive(e["pid"], e["started"]) else "STOPPED"
                out[h] = TaskStatus(state, None, "" if state == "RUNNING" else "its process exited")
                continue
            p = self.procs[h]
            code = p.poll()
            if code is None:
                ui = f"http://127.0.0.1:{self.web[h]}" if h in self.web else ""
                out[h] = TaskStatus("RUNNING", None, "", "127.0.0.1", self.ports[h], ui)
            else:
                # ECS's stoppedReason says little; here the log's own cause, so a CI failure names it
                why = "" if code == 0 else exit_reason(code, self.logs[h]).removeprefix(SETUP_FAILED_PREFIX)
                why = why.removeprefix("nothing was sent: ")  # task_entry's own line says it too
                out[h] = TaskStatus("STOPPED", code, why)
        return out

    def stop(self, handle: str, reason: str) -> None:
        p = self.procs[handle]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for fh in self._files:
            fh.close()

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for h, log in self.logs.items():
            text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            parts.append(f"--- {h}\n" + "\n".join(text))
        return "\n".join(parts)


def _start_ticks(pid: int) -> int:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid,
    it names one process, never a later one given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, started: int) -> bool:
    """The process still runs: it exists, is the one started then, and is no zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and int(fields[19]) == started


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)  # each task leads its own session (start_new_session): its children too
