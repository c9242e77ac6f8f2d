"""The Fargate tasks of a cloud run, as the stages see them: what to start (TaskSpec), what ECS
says of it (TaskStatus), and the one seam that starts them (TaskLauncher: ECS RunTask in a
campaign, local processes in the offline cloud path, testing/offline_tasks.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from campaign.aws.run_config import CloudRunError
from core.errors import EXIT_SETUP_FAILED

Role = Literal["master", "worker", "gate", "conductor"]


@dataclass(frozen=True)
class TaskSpec:
    role: Role
    fleet: str
    task_definition: str
    environment: dict[str, str]  # overrides on top of the task definition's own
    command: tuple[str, ...] | None = None  # None: the task definition's command


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

    def stop_run(self, run_id: str, reason: str, *, conductor: bool) -> list[str]:
        """Stop every task of run `run_id` still alive, its conductor too when `conductor`, and
        return once each has stopped (`run --resume`: a late record part must not land where the
        cut-off step runs again); returns their handles."""
        ...


@dataclass
class RunningTask:
    spec: TaskSpec
    handle: str
    status: TaskStatus = field(default_factory=lambda: TaskStatus("PROVISIONING"))


class TaskRefused(CloudRunError):
    exit_code = EXIT_SETUP_FAILED
