"""The contract between the stacks, `campaign run` and the load-generator task (root Dockerfile).

The stacks put the deploy-time half into the Fargate task definitions and into one stack
output (`LoadgenRunConfig`); `campaign run` adds the run-time half as RunTask environment
overrides; `loadgen.task_entry` reads both. Everything of one run lives under one S3 prefix:

    <runs prefix>/<run id>/inputs/manifest.yaml     uploaded by `run` before any task starts
    <runs prefix>/<run id>/inputs/schedule.json     trace file name + path, schedule digest
    <runs prefix>/<run id>/inputs/<trace file>
    <runs prefix>/<run id>/inputs/tokenizer/<file>   a huggingface tokenizer's pinned files (tokenizer.files)
    <runs prefix>/<run id>/gate-<fleet>.json       each fleet's readiness and quality gate (loadgen/gate_task.py)
    <runs prefix>/<run id>/records-<fleet>-w<i>-p<seq>.jsonl, summary-<fleet>-w<i>.json   (workers)
    <runs prefix>/<run id>/capacity/<fleet>/x<k>/records-...   a capacity step's (LOADGEN_RECORDS_PREFIX)
    <runs prefix>/<run id>/report/...              report.json/.md/.html, quality.json, capacity/*.json
    <runs prefix>/<run id>/progress-<fleet>.json    the master's live Locust stats, for `run`'s progress lines
    <runs prefix>/<run id>/summary-<fleet>.json     merged by `run` once the tasks stopped
    <runs prefix>/<run id>/run.json                 what `run` started and how it ended

Every RECORDS_UPLOAD_EVERY_S while it runs, and once more when it stops, a worker uploads the
complete lines its records file gained since the last upload as a new object, part <seq> = 1, 2,
... (loadgen.recording.RecordParts): S3 has no append, and putting the whole file again each time
kept every old version in the versioned bucket, storage growing with the square of a step's
length. A worker's records are its parts read in sequence (loadgen.recording.in_stream_order);
a worker that dies keeps the parts it uploaded. `run` reads a step's records as they stream, a
new part at a time, and can stop it early. A run id is new for every `run`, so a second run never
overwrites the first.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

# How long a fleet's first boot may take before its NLB health check counts (minutes, by
# accelerator vendor): it downloads ~16 GB of weights, and Neuron then compiles every sequence
# bucket (tens of minutes for an 8B model). The fleet stacks set it as the ASG's health-check
# grace; `campaign plan` takes it as the longest a fleet can take to be ready.
HEALTH_GRACE_MIN = {"aws-neuron": 75, "nvidia": 30}


def health_grace_s(vendor: str) -> int:
    """The grace in seconds: the ASG's health-check grace (stacks/fleet.py) and, counted from the
    boot script's start, how long the script itself waits for the server (stacks/fleet_boot.py),
    so the script gives up when the load balancer's check starts to count, not long after."""
    return HEALTH_GRACE_MIN[vendor] * 60


# The campaign's deadline as the stack carries it (the CampaignDeadline parameter) and the fleets'
# scheduled actions read it: "in YYYY-MM-DDThh:mm:ssZ format in UTC/GMT only" (EC2 Auto Scaling API
# reference, PutScheduledUpdateGroupAction, StartTime; AWS::AutoScaling::ScheduledAction's StartTime
# is the same field).
DEADLINE_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
DEADLINE_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"


def format_deadline(at: datetime) -> str:
    """`at` (timezone-aware) as the scheduled action's StartTime, whole seconds, UTC."""
    if at.tzinfo is None:
        raise ValueError("deadline: a timezone-aware time is needed (UTC)")
    return at.astimezone(UTC).strftime(DEADLINE_FORMAT)


def parse_deadline(text: str, *, field_name: str = "deadline") -> datetime:
    """A deadline written by format_deadline back as an aware UTC time; ValueError naming `field_name`."""
    if not re.match(DEADLINE_PATTERN, text):
        raise ValueError(f"{field_name}: expected YYYY-MM-DDThh:mm:ssZ (UTC), got {text!r}")
    return datetime.strptime(text, DEADLINE_FORMAT).replace(tzinfo=UTC)


# What the stacks keep billing whatever the fleets' size, until `teardown`: `plan` and `deploy` list
# it as what the deadline does not stop (tests/stacks/test_deadline.py holds each to the template).
NAT_GATEWAYS = 1  # stacks/network.py
# stacks/network.py's interface endpoints, by the service name's last part (com.amazonaws.<region>.<name>)
INTERFACE_ENDPOINT_SERVICES = ("ecr.api", "ecr.dkr", "logs", "monitoring", "ssm", "ssmmessages", "ec2messages")
PROMETHEUS_TASK_VCPU = 1  # stacks/observability.py: the Prometheus Fargate service's one task
PROMETHEUS_TASK_MEMORY_GIB = 2
# The stack's Prometheus scrapes every target this often (stacks/observability.py); a short run
# needs it short: a 15 s interval leaves too few points per step window.
PROMETHEUS_SCRAPE_INTERVAL_S = 5

LOCUST_WEB_PORT = 8089
LOCUST_MASTER_PORT = 5557  # workers connect to the master here (Locust default)
METRICS_PORT = 9646  # the loadgen Prometheus exporter (histograms) on master and workers
CONTAINER_NAME = "locust"
# Seconds the master's web UI stays up after the trace replay ended (Locust --autoquit), for
# watching it. A capacity step or settle segment does not linger (STEP_AUTOQUIT_S): nobody
# watches a step's UI after it, and the linger would be billed on every measured instance.
UI_LINGER_S = 60
STEP_AUTOQUIT_S = 0
# How long a worker task waits for its master to appear in Cloud Map (both start together;
# Fargate provisioning takes a minute or two), and how often it asks.
MASTER_DISCOVERY_TIMEOUT_S = 600.0
MASTER_DISCOVERY_POLL_S = 2.0
# Cloud Map instance attributes of a registered master (AWS_INSTANCE_IPV4 and AWS_INSTANCE_PORT are
# Cloud Map's own; STEP_ATTRIBUTE is ours: a worker asks for its own step's master, never a
# stale registration of an earlier step).
STEP_ATTRIBUTE = "harness_step"


def master_service_name(fleet: str) -> str:
    """Cloud Map service of a fleet's Locust master: each fleet's workers find their own master
    (fleets run side by side), registered by `run` per task, at master-<fleet>.<namespace>."""
    return f"master-{fleet}"


def workers_service_name(fleet: str) -> str:
    return f"workers-{fleet}"


# One load-generator task (a Locust master or worker): 1 vCPU, as gevent is single-threaded and a
# worker sharing a core adds its own scheduling lag, and 2 GiB (the Fargate pairing for 1 vCPU).
LOADGEN_TASK_VCPU = 1
LOADGEN_TASK_MEMORY_GIB = 2


def loadgen_task_hourly_usd(vcpu_hour_usd: float, gb_hour_usd: float) -> float:
    """One load-generator task's hourly price at Fargate's per-vCPU and per-GB rates."""
    return LOADGEN_TASK_VCPU * vcpu_hour_usd + LOADGEN_TASK_MEMORY_GIB * gb_hour_usd


# The conductor (`run --detach`): one Fargate task of the conductor image (Dockerfile.conductor,
# ENTRYPOINT `python -m campaign`) that runs the campaign's orchestration in the stack, so the
# operator's terminal may close. Its command is CONDUCT_COMMAND, the run id, and RESUME_FLAG when it
# picks up a run that was cut off. 1 vCPU (the orchestration mostly waits on its tasks; the report
# at the end is one duckdb pass) and 4 GiB, a valid Fargate pairing for 1 vCPU (2 to 8 GiB: ECS
# developer guide, "Task CPU and memory").
CONDUCTOR_TASK_VCPU = 1
CONDUCTOR_TASK_MEMORY_GIB = 4
CONDUCT_COMMAND = "conduct"
RESUME_FLAG = "--resume"
# Set by the conductor's task definition: the stack whose LoadgenRunConfig output it reads.
ENV_STACK_NAME = "HARNESS_STACK_NAME"
# Under a run's prefix: the orchestration's progress lines, put again as they grow (`run --attach`
# follows it), and what `run --detach` asked for beside the manifest (CONDUCTOR_REQUEST).
PROGRESS_LOG = "progress.log"
CONDUCTOR_REQUEST = "conductor.json"

# Set by the task definitions (deploy time).
ENV_RESULTS_URI = "HARNESS_RESULTS_S3_URI"  # s3://bucket/campaigns/<campaign>/<digest12>/runs
ENV_MANIFEST_DIGEST = "HARNESS_MANIFEST_DIGEST"  # the manifest the stack was synthesized from
ENV_ROLE = "HARNESS_LOADGEN_ROLE"  # "master", "worker" or "gate"
ENV_WORK_DIR = "HARNESS_WORK_DIR"  # where the task stages its inputs (the image: /data)
# Set by `campaign run` per task (RunTask overrides). LOADGEN_* / LOCUST_* are read by the
# locustfile and Locust themselves.
ENV_RUN_ID = "LOADGEN_RUN_ID"
ENV_FLEET = "LOADGEN_FLEET"
ENV_HOST = "LOCUST_HOST"
ENV_REPLAY_DURATION = "LOADGEN_REPLAY_DURATION"
ENV_RUN_TIME = "LOCUST_RUN_TIME"  # the master's safety net; the replay ends the run itself
ENV_MASTER_HOST = "LOCUST_MASTER_NODE_HOST"
ENV_MASTER_PORT = "LOCUST_MASTER_NODE_PORT"
ENV_RECORDS_PREFIX = "LOADGEN_RECORDS_PREFIX"  # a capacity step's records: <run id>/<this prefix>/
# A worker started beside its master finds it through Cloud Map (DiscoverInstances): the
# namespace, the fleet's master service, and the step whose master it wants (STEP_ATTRIBUTE).
ENV_DISCOVERY_NAMESPACE = "LOADGEN_DISCOVERY_NAMESPACE"
ENV_MASTER_SERVICE = "LOADGEN_MASTER_SERVICE"
ENV_STEP = "LOADGEN_STEP"
ENV_AUTOQUIT = "LOCUST_AUTOQUIT"

RUN_CONFIG_OUTPUT = "LoadgenRunConfig"  # stack output: JSON of RunConfig
# Stack output: the Prometheus workspace's query URL (<its endpoint>api/v1/query), which the
# analysis queries with SigV4 (analysis.sources.prometheus); `run` and `report --run-id` read it.
PROMETHEUS_QUERY_OUTPUT = "PrometheusQueryUrl"
INPUTS_DIR = "inputs"
INPUT_MANIFEST = "manifest.yaml"
INPUT_SCHEDULE = "schedule.json"
INPUT_TOKENIZER_DIR = "tokenizer"  # + /<file>: a huggingface tokenizer's pinned files
INPUT_SCORER_DIR = "scorer"  # + /<i>-<name>: a file quality.task_acceptance.command names
TRACE_FIELD = "workload.trace.path"
TOKENIZER_FIELD = "tokenizer.path"
SCORER_FIELD = "quality.task_acceptance.command"
RUN_RECORD = "run.json"
GATE_PREFIX = "gate-"  # + <fleet>.json, written by the gate task (loadgen/gate_task.py)
REPORT_DIR = "report"  # the report and the files it was built from, uploaded by `run`
RECORDS_UPLOAD_EVERY_S = 10.0  # a worker's records part period (see the module docstring)
PROGRESS_PREFIX = "progress-"  # + <fleet>.json, written by the master (loadgen/locustfile.py)

_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")


def new_run_id(now: float | None = None) -> str:
    """Sortable by start time, unique: `20261203T143000Z-1a2b3c`."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} is not of the form YYYYmmddTHHMMSSZ-xxxxxx (as `campaign run` prints it)")
    return run_id


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix without slashes at either end)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, prefix.strip("/")


def run_uri(results_uri: str, run_id: str) -> str:
    """s3://bucket/<runs prefix>/<run id>: the run's records and inputs."""
    return f"{results_uri.rstrip('/')}/{check_run_id(run_id)}"


def inputs_uri(results_uri: str, run_id: str) -> str:
    return f"{run_uri(results_uri, run_id)}/{INPUTS_DIR}"


@dataclass(frozen=True)
class RunConfig:
    """What `campaign run` needs from the deployed stack (the `LoadgenRunConfig` output)."""

    region: str
    cluster: str
    master_task_definition: str
    worker_task_definition: str
    gate_task_definition: str  # the gate's own definition and task role: the only one that writes gate-*
    subnets: tuple[str, ...]
    security_groups: tuple[str, ...]
    results_uri: str  # s3://bucket/<runs prefix>
    targets: dict[str, str]  # fleet -> http://<nlb>:<port>
    workers: int
    # fleet -> its NLB target group's ARN: `run` reads DescribeTargetHealth there (ready means
    # every measured instance healthy; each step's instances are the fewest healthy while it ran).
    target_groups: dict[str, str] = field(default_factory=dict)
    # Cloud Map: the namespace's name, and per fleet its master's and workers' service ids
    # (workers find their master there; Prometheus finds both by DNS).
    namespace: str = ""
    master_services: dict[str, str] = field(default_factory=dict)
    workers_services: dict[str, str] = field(default_factory=dict)
    # When each fleet's scheduled action sets its group to 0 (DEADLINE_FORMAT); "" from a stack
    # deployed before the deadline existed: `run` then has no deadline to hold a stage to.
    deadline: str = ""
    # The Prometheus workspace's query URL (the PROMETHEUS_QUERY_OUTPUT output, read_run_config
    # adds it); "" where the stack has none (an older stack): the report then reads the records alone.
    prometheus_url: str = ""
    # The conductor's task definition (`run --detach`); "" from a stack deployed before it existed.
    conductor_task_definition: str = ""

    @property
    def deadline_at(self) -> datetime | None:
        return (
            parse_deadline(self.deadline, field_name=f"stack output {RUN_CONFIG_OUTPUT}: deadline")
            if self.deadline
            else None
        )

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"stack output {RUN_CONFIG_OUTPUT} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"stack output {RUN_CONFIG_OUTPUT}: expected a JSON object")
        missing = [
            k
            for k in (
                "region",
                "cluster",
                "master_task_definition",
                "worker_task_definition",
                "gate_task_definition",
                "subnets",
                "security_groups",
                "results_uri",
                "targets",
                "workers",
            )
            if k not in data
        ]
        if missing:
            raise ValueError(
                f"stack output {RUN_CONFIG_OUTPUT} lacks {', '.join(missing)}: redeploy with this version of the stacks"
            )
        subnets = data["subnets"]
        if isinstance(subnets, str):  # CloudFormation joins a subnet list into one string
            subnets = [s for s in subnets.split(",") if s]
        groups = data["security_groups"]
        if isinstance(groups, str):
            groups = [g for g in groups.split(",") if g]
        split_s3_uri(data["results_uri"])
        return cls(
            region=str(data["region"]),
            cluster=str(data["cluster"]),
            master_task_definition=str(data["master_task_definition"]),
            worker_task_definition=str(data["worker_task_definition"]),
            gate_task_definition=str(data["gate_task_definition"]),
            subnets=tuple(subnets),
            security_groups=tuple(groups),
            results_uri=str(data["results_uri"]).rstrip("/"),
            targets={str(k): str(v) for k, v in dict(data["targets"]).items()},
            workers=int(data["workers"]),
            target_groups={str(k): str(v) for k, v in dict(data.get("target_groups") or {}).items()},
            namespace=str(data.get("namespace", "")),
            master_services={str(k): str(v) for k, v in dict(data.get("master_services") or {}).items()},
            workers_services={str(k): str(v) for k, v in dict(data.get("workers_services") or {}).items()},
            deadline=_checked_deadline(str(data.get("deadline") or "")),
            prometheus_url=str(data.get("prometheus_url") or ""),
            conductor_task_definition=str(data.get("conductor_task_definition") or ""),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _checked_deadline(text: str) -> str:
    if text:
        parse_deadline(text, field_name=f"stack output {RUN_CONFIG_OUTPUT}: deadline")
    return text


@dataclass(frozen=True)
class RunInputs:
    """inputs/schedule.json: what the tasks must find once they staged the inputs."""

    manifest_digest: str
    trace_path: str  # workload.trace.path as the manifest writes it (relative to the manifest)
    trace_file: str  # the object name under inputs/
    schedule_digest: str  # core.schedule.schedule_digest of the full schedule
    requests: int
    # A huggingface tokenizer: tokenizer.path as the manifest writes it, and the names of its pinned
    # files (tokenizer.files), each under inputs/tokenizer/ and staged beside the staged tokenizer.path.
    tokenizer_path: str | None = None
    tokenizer_files: tuple[str, ...] = ()
    # The files the buyer's scorer command names, relative to the manifest (scorer_files): the
    # orchestrator runs the scorer in the manifest's directory, the conductor in its staged one.
    scorer_files: tuple[str, ...] = ()

    @property
    def relative_paths(self) -> dict[str, str]:
        """The manifest's relative paths the tasks stage, by the field that writes each."""
        paths = {TRACE_FIELD: self.trace_path}
        if self.tokenizer_path is not None:
            paths[TOKENIZER_FIELD] = self.tokenizer_path
        for i, rel in enumerate(self.scorer_files):
            paths[scorer_field(i)] = rel
        return paths

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunInputs:
        try:
            data = json.loads(text)
            return cls(
                **{k: data[k] for k in ("manifest_digest", "trace_path", "trace_file", "schedule_digest", "requests")},
                tokenizer_path=data.get("tokenizer_path"),
                tokenizer_files=tuple(data.get("tokenizer_files", ())),
                scorer_files=tuple(data.get("scorer_files", ())),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{INPUT_SCHEDULE}: not a run-inputs description ({type(exc).__name__}: {exc})") from None


def scorer_field(i: int) -> str:
    return f"{SCORER_FIELD}[{i}]"


def scorer_object(i: int, rel: str) -> str:
    """A scorer file's object name under inputs/ (its place in the list: two may share a name)."""
    return f"{INPUT_SCORER_DIR}/{i}-{PurePosixPath(rel).name}"


def scorer_files(command: Sequence[str], manifest_dir: Path) -> tuple[str, ...]:
    """The arguments of a scorer command that name a file relative to the manifest's directory
    (`python3 scorers/answers_nonempty.py`: the script), which a run stages beside its manifest.
    A scorer that reads other files than those it names is not staged whole: docs/cloud.md."""
    return tuple(a for a in command if not Path(a).is_absolute() and (manifest_dir / a).is_file())


def tokenizer_object(name: str) -> str:
    """A pinned tokenizer file's object name under inputs/."""
    return f"{INPUT_TOKENIZER_DIR}/{name}"


@dataclass(frozen=True)
class StagedPaths:
    manifest: Path
    files: dict[str, Path]  # manifest field -> where the file it names is staged


def staged_paths(root: Path, relative: Mapping[str, str]) -> StagedPaths:
    """Where a task puts the manifest and the files it names (`relative`: manifest field -> its
    path as the manifest writes it) under `root`, so that each relative path resolves to the staged
    file unchanged: the manifest is byte-identical to the operator's and keeps its digest. The
    manifest sits as deep as the path that climbs most (`..`) needs."""
    parts = {}
    for name, rel_path in relative.items():
        rel = PurePosixPath(rel_path)
        if rel.is_absolute():
            raise ValueError(f"{name}: {rel_path} is absolute; a cloud run needs a path relative to the manifest")
        parts[name] = rel.parts
    depth = max((sum(part == ".." for part in p) for p in parts.values()), default=0)
    manifest_dir = root.joinpath("manifest", *(["m"] * depth))
    files = {}
    for name, p in parts.items():
        staged = (manifest_dir / Path(*p)).resolve()
        if not staged.is_relative_to(root.resolve()):
            raise ValueError(f"{name}: {relative[name]} leaves the staging directory")
        files[name] = staged
    return StagedPaths(manifest_dir / INPUT_MANIFEST, files)
