"""`campaign run` on AWS: the campaign's stages (campaign.stages.run) against the deployed
fleets, through Fargate tasks inside the VPC.

`CloudFleets` is the orchestration's `Fleets` seam on AWS: per fleet, a gate task waits until
the fleet serves and runs the quality gate (loadgen/gate_task.py); the trace replay and every
capacity step or settle segment start a fresh Locust master + workers per fleet (`FargateSteps`),
whose records stream to S3 as they are written and are read back while the step runs, so a
step stops early on a certain miss exactly as a local one does. Tasks are reached only through
a `TaskLauncher` (ECS RunTask in a campaign, local processes in the offline cloud-path test),
so the same code path is exercised by both. Fleets run side by side, as in the local campaign.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from campaign.aws.run_config import CloudRunError
from campaign.aws.s3_trees import download_run
from campaign.backends.fargate.run import GATE_READY_TIMEOUT_S, CloudRun, replay_run_time_s
from core import cloud_contract as cc
from core.serving import served_model_id
from loadgen.replay_options import ReplayOptions

if TYPE_CHECKING:  # the analysis stack (duckdb) stays out of `--help` (tests/campaign/test_cli.py)
    from analysis.capacity.search import StepPlan
    from campaign.stages.run import RunFacts
    from core.records import RunSummary
    from loadgen.fixtures import GateResult


class CloudFleets:
    """The orchestration's `Fleets` seam on AWS (campaign.stages.run)."""

    def __init__(
        self,
        run: CloudRun,
        diagnose: Callable[[str], str] | None = None,
        *,
        concurrent: int | None = None,
        systems_under_test: str | None = None,
    ) -> None:
        """`concurrent`: fleets measured at once, the trace replay included (default: all; on AWS each
        step has its own Fargate tasks and each fleet its own instances). The offline run with real
        CPU engines on 2 cores measures one at a time, as `campaign local` does. `systems_under_test`:
        what serves each fleet (campaign.backends.fargate.systems), for the report."""
        self.run = run
        self.systems_under_test = systems_under_test
        self.diagnose = diagnose  # fleet -> what AWS says of it (campaign.aws.readiness), for a fleet never ready
        self.names = [f.name for f in run.m.fleets]
        self.concurrent = concurrent or len(self.names)
        self.ready_after_s: dict[str, float] = {}
        self._steps = FargateSteps(run)

    def facts(self) -> RunFacts:
        from campaign.stages.run import RunFacts

        # No run-wide instance count: the replay and each step record the instances they really
        # ran on beside their records (INSTANCES_FILE, the fewest healthy targets while they ran),
        # which the report reads; without it, CloudWatch's GroupInServiceInstances. The histograms
        # come from the stack's Prometheus workspace, queried with SigV4 (analysis.sources.prometheus)
        # for the stack's region: the workspace is the stack's own (stacks/observability.py), so an
        # AMP URL names that region too, and the offline stand-in (testing/sigv4_proxy.py) is signed for it.
        url = self.run.cfg.prometheus_url or None
        return RunFacts(
            {},
            self.systems_under_test,
            aws=True,
            prometheus_url=url,
            prometheus_sigv4_region=self.run.cfg.region if url else None,
            ready_after_s=dict(self.ready_after_s),
            scrape_interval_s=float(cc.PROMETHEUS_SCRAPE_INTERVAL_S),
        )

    def gate(self) -> dict[str, GateResult]:
        """Ready is every measured instance healthy in the fleet's target group (campaign.backends.fargate.target_health),
        waited for here, up to the fleet's health grace; then the gate task per fleet, inside the
        VPC, checks the served model through the NLB and runs the quality gate."""
        from core import catalog
        from loadgen.fixtures import GateResult

        m = self.run.m
        grace = {
            f.name: cc.HEALTH_GRACE_MIN[catalog.instance(f.instance_type).accelerator.vendor] * 60.0 for f in m.fleets
        }
        healthy_after = self._wait_healthy(grace)
        results = self.run.gate({name: GATE_READY_TIMEOUT_S for name in grace})
        never = [
            f"fleet {name}: not serving {served_model_id(m, m.fleet(name))} through its NLB {d['ready_after_s']:.0f} s "
            f"after its targets were healthy; last seen: {d['seen']}; "
            + (self.diagnose(name) if self.diagnose else "see its ASG's activities and target health")
            for name, d in results.items()
            if not d["ready"]
        ]
        if never:
            raise CloudRunError(" | ".join(never))
        for name, d in results.items():
            self.ready_after_s[name] = healthy_after.get(name, 0.0) + float(d["ready_after_s"])
            self.run.say(f"{name}: serving after {self.ready_after_s[name]:.0f} s")
        return {name: GateResult.from_dict(d["gate"]) for name, d in results.items()}

    def _wait_healthy(self, grace: Mapping[str, float]) -> dict[str, float]:
        """Per fleet, seconds until all its measure_instances targets were healthy at once."""
        from campaign.backends.fargate.target_health import wait_all_healthy

        run = self.run
        if run.elbv2 is None or not run.cfg.target_groups:
            return {}
        want = {f.name: f.instances_measured for f in run.m.fleets}
        run.say(
            "waiting until every measured instance is healthy in its NLB target group: "
            + ", ".join(f"{name} {n} (up to {grace[name] / 60:.0f} min)" for name, n in want.items())
        )
        out: dict[str, float] = {}
        never: list[str] = []
        t0 = time.monotonic()
        for name, n in want.items():  # one after the other: the later ones had the earlier ones' wait too
            left = max(grace[name] - (time.monotonic() - t0), run.poll_s)
            r = wait_all_healthy(
                run.elbv2,
                run.cfg.target_groups[name],
                n,
                left,
                poll_s=run.poll_s,
                say=lambda line, name=name: run.say(f"{name}: {line}"),  # type: ignore[misc]
            )
            out[name] = time.monotonic() - t0
            if not r.ready:
                never.append(
                    f"fleet {name}: {r.seen} after {out[name]:.0f} s (its health grace); "
                    + (self.diagnose(name) if self.diagnose else "see its ASG's activities and target health")
                )
        if never:
            raise CloudRunError(" | ".join(never))
        return out

    def replay(self, records_dir: Path, options: ReplayOptions) -> dict[str, RunSummary]:
        from core.schedule import build_schedule, span_s

        run_time = replay_run_time_s(self.run.m, span_s(build_schedule(self.run.m)), options.duration_s)
        prefix = records_dir.relative_to(self.run.run_dir).as_posix()
        groups = [self.names] if self.concurrent >= len(self.names) else [[n] for n in self.names]
        summaries: dict[str, RunSummary] = {}
        for group in groups:
            with self.run.instances_while(group, records_dir) as poll:
                summaries.update(
                    self.run.replay(group, options, prefix, records_dir, run_time, poll, linger_s=cc.UI_LINGER_S)
                )
        return summaries

    def steps(self) -> FargateSteps:
        return self._steps

    def abort(self) -> None:
        self.run.stop(None, "operator interrupted the run")

    def checkpoint(self, stage: str) -> None:
        self.run.checkpoint(stage)


class FargateSteps:
    """A capacity step or settle segment on Fargate: a fresh master + workers for the fleet, the
    step's records read back from S3 as the workers upload them, stopped on a certain miss."""

    def __init__(self, run: CloudRun) -> None:
        self.cloud = run

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        from campaign.stages.capacity import running_miss, step_options
        from campaign.stages.progress import RecordTail

        m, t0 = self.cloud.m, time.monotonic()
        prefix = step_dir.relative_to(self.cloud.run_dir).as_posix()
        tail = RecordTail(step_dir, fleet, planned)
        early: list[str] = []

        with self.cloud.instances_while([fleet], step_dir) as count_healthy:

            def decided() -> bool:
                count_healthy()
                if stop.is_set():
                    return True
                download_run(
                    self.cloud.s3, f"{self.cloud.uri}/{prefix}", step_dir
                )  # the records as the workers last uploaded them
                miss = running_miss(m, tail, planned)
                if miss is not None:
                    early.append(miss)
                return miss is not None

            self.cloud.replay(
                [fleet], step_options(m, plan), prefix, step_dir, replay_run_time_s(m, plan.span_s, None), decided
            )
        return time.monotonic() - t0, early[0] if early else None

    def abort(self) -> None:
        self.cloud.stop(None, "operator interrupted the run")
