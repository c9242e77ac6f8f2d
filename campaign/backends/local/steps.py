"""A capacity step or settle segment on this machine: the real Locust (loadgen.launch) against a
fleet's local endpoint, watched as it runs and stopped on a certain miss (the
campaign.stages.capacity.StepRunner behind `campaign local`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from campaign.stages.capacity import running_miss, step_options
from campaign.stages.progress import RecordTail
from core.manifest import Manifest
from core.records import add_instance_counts, constant_count

if TYPE_CHECKING:
    from analysis.capacity.search import StepPlan
    from loadgen.launch import FleetRun

# How often a running step's records are read for a certain miss (they are flushed every second).
WATCH_S = 1.0


class LocalSteps:
    """Steps replayed by the real Locust (loadgen.launch) against each fleet's endpoint, watched
    as they run and stopped on a certain miss."""

    def __init__(
        self,
        m: Manifest,
        endpoints: Mapping[str, str],
        handles: MutableMapping[str, FleetRun],
        cpus: Mapping[str, set[int]] | None = None,
        instances: Mapping[str, int] | None = None,
    ):
        self.m, self.endpoints, self.handles = m, endpoints, handles  # m: parsed once, by the caller
        self.cpus = cpus or {}  # per fleet: the cores its Locust may use (kept off a CPU engine's core)
        self.instances = instances or {}  # per fleet: the instances emulated behind its endpoint

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        from loadgen.launch import start_fleet

        t0, wall0 = time.monotonic(), time.time()
        # trace seconds whose arrivals land inside the span at rate x k (offsets are trace seconds x time_scale)
        h = self.handles[fleet] = start_fleet(
            self.m,
            fleet,
            self.endpoints[fleet],
            step_dir,
            step_options(self.m, plan),
            cpus=self.cpus.get(fleet),
        )
        early = None
        tail = RecordTail(step_dir, fleet, planned)
        while not h.poll() and not stop.is_set():
            early = running_miss(self.m, tail, planned)
            if early is not None:
                h.terminate()
                break
            time.sleep(WATCH_S)
        h.wait()
        if fleet in self.instances:  # an emulator's instances never drop out: the same count throughout
            detail = "the instances emulated behind the fleet's endpoint, all serving throughout"
            add_instance_counts(step_dir, {fleet: constant_count(self.instances[fleet], wall0, time.time(), detail)})
        return time.monotonic() - t0, early

    def abort(self) -> None:
        for h in list(self.handles.values()):
            h.terminate()
