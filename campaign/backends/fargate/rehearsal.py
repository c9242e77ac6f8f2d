"""`run MANIFEST --rehearsal` (issue 51): the campaign's own `run --detach` and `run --attach` on
the rehearsal's manifest (campaign.stages.rehearsal), then what the run and the stack show, seam by
seam, in the rehearsal report (campaign.aws.rehearsal_report).

Nothing here runs a stage: the conductor runs `run_campaign`, exactly as a detached campaign does,
with the rehearsal's fixed shape in its manifest. This module starts it, follows it, and observes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from campaign.aws import stack as aws
from campaign.aws.rehearsal_report import (
    CONDUCTOR,
    GATE,
    INSTANCES,
    RECORDS,
    TASKS,
    TEARDOWN,
    RehearsalReport,
    Seam,
    failed,
    put_record,
)
from campaign.aws.rehearsal_seams import amp_seam, cost_allocation_seam, deadline_seam, stack_seam, tags_seam
from campaign.backends.fargate.tasks import TaskLauncher
from core import cloud_contract as cc
from core import rehearsal
from core.manifest import Manifest

REPORT_JSON = "rehearsal.json"
REPORT_TEXT = "rehearsal.txt"


def rehearse(
    session: Any,
    m: Manifest,
    campaign_digest: str,
    cfg: cc.RunConfig,
    launcher: TaskLauncher,
    out_dir: Path,
    *,
    checked: Sequence[Seam] = (),
    run_id: str | None = None,
    poll_s: float = 10.0,
    say: Callable[[str], None] = print,
    observe: Callable[[RehearsalReport, Path], None] | None = None,
) -> RehearsalReport:
    """The rehearsal of the deployed stack on `m` (the rehearsal's manifest; `campaign_digest`: the
    campaign's, whose record it is): `checked`, the seams the caller observed before anything
    started (images, quotas); then the stack, one `run --detach` and its `--attach`, and the seams
    the run and the stack show. `observe(report, run_dir)`: more seams, after the run's (the
    offline run's role evaluation). The report is written to out_dir/<run id>/ and recorded in the
    results bucket (campaign.aws.rehearsal_report.put_record)."""
    from campaign.backends.fargate.conductor import ConductorRequest, attach, detach

    report = RehearsalReport(m.campaign, campaign_digest, m.digest)
    for seam in checked:
        report.add(seam)
    stack = aws.stack_name(m)
    if report.add(stack_seam(session.client("cloudformation"), stack)).passed is False:
        return _finish(session, cfg, report, out_dir, say)
    run_id = run_id or cc.new_run_id()  # the launcher's (an ECS launcher tags its tasks with it)
    report.run_id = run_id
    request = ConductorRequest(run_id, False, requested_at=time.time())
    try:
        task = detach(session, m, cfg, launcher, request)
    except Exception as exc:  # botocore (RunTask refused, PassRole denied) or a CloudRunError
        report.add(failed(CONDUCTOR, "`run --detach` did not start the conductor", exc, "the error names what"))
        return _finish(session, cfg, report, out_dir, say)
    say(f"rehearsal run {run_id}: `run --detach` started the conductor {task}; following it as `run --attach` does")
    try:
        code = attach(session, cfg, run_id, launcher, poll_s=poll_s)
    except Exception as exc:
        report.add(failed(CONDUCTOR, f"`run --attach {run_id}` failed", exc, "the error names what"))
        return _finish(session, cfg, report, out_dir, say)
    run_dir = out_dir / run_id
    run_seams(session, m, cfg, report, run_dir, code, task)
    if observe is not None:
        observe(report, run_dir)
    return _finish(session, cfg, report, out_dir, say)


def run_seams(
    session: Any, m: Manifest, cfg: cc.RunConfig, report: RehearsalReport, run_dir: Path, attach_code: int, task: str
) -> None:
    """The seams the finished run shows (its directory fetched into `run_dir`) and the stack's."""
    from campaign.aws.s3_trees import download_tree

    s3 = session.client("s3")
    uri = cc.run_uri(cfg.results_uri, report.run_id)
    try:
        files = download_tree(s3, uri, run_dir)
    except Exception as exc:
        report.add(
            failed(RECORDS, f"the run's files under {uri}/ not readable", exc, "allow s3:ListBucket and GetObject")
        )
        files = []
    record = _json(run_dir / cc.RUN_RECORD) or {}
    report.add(_instances(session, m, run_dir))
    report.add(_gate(m, run_dir))
    report.add(_tasks(m, run_dir, record))
    if not any(s.name == RECORDS for s in report.seams):
        report.add(_records(m, uri, [p.relative_to(run_dir).as_posix() for p in files]))
    facts = _json(run_dir / "campaign.json") or {}
    saved = len(list((run_dir / "metrics").glob("*/*.json")))
    report.add(amp_seam(cfg.prometheus_url or facts.get("prometheus_url"), cfg.region, saved))
    report.add(tags_seam(session, m, aws.stack_name(m)))
    report.add(cost_allocation_seam(session))
    report.add(deadline_seam(session, m, cfg.deadline))
    report.add(_conductor(report.run_id, task, record, attach_code))
    report.add(Seam(TEARDOWN, None, "`teardown MANIFEST` deletes the stack and checks that nothing tagged is left"))


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _instances(session: Any, m: Manifest, run_dir: Path) -> Seam:
    from campaign.aws.readiness import not_ready_evidence

    ready = (_json(run_dir / "campaign.json") or {}).get("ready_after_s") or {}
    missing = [f.name for f in m.fleets if f.name not in ready]
    if missing:
        evidence = "; ".join(f"{n}: {not_ready_evidence(session, m.campaign, n)}" for n in missing)
        return failed(
            INSTANCES,
            f"{', '.join(missing)}: never every measured instance healthy behind the NLB",
            evidence,
            "the Auto Scaling activities and target health above say why (the boot script's log is on the instance)",
        )
    parts = [f"{f.name} {f.instances_measured} healthy in {ready[f.name] / 60:.1f} min" for f in m.fleets]
    slow = [f.name for f in m.fleets if ready[f.name] / 60 > rehearsal.READY_MIN]
    note = (
        f" (over the {rehearsal.READY_MIN:g} min core.rehearsal.READY_MIN assumes: {', '.join(slow)})" if slow else ""
    )
    return Seam(INSTANCES, True, "; ".join(parts) + note)


def _gate(m: Manifest, run_dir: Path) -> Seam:
    quality = _json(run_dir / "quality.json")
    if not isinstance(quality, dict):
        return failed(
            GATE, "no quality.json: the gate did not run", "none", "the run's progress.log says where it stopped"
        )
    bad = {k: q for k, q in quality.items() if not (isinstance(q, dict) and q.get("passed") is True)}
    if bad:
        q = next(iter(bad.values()))
        return failed(
            GATE,
            f"{', '.join(bad)} did not pass the gate",
            "; ".join((q or {}).get("failures", [])[:3]) or str(q),
            "the gate task's log (gate-<fleet>.json under the run) names each fixture",
        )
    return Seam(GATE, True, "passed: " + ", ".join(f"{k} {q.get('pass_rate', 0):.0%}" for k, q in quality.items()))


def _tasks(m: Manifest, run_dir: Path, record: dict[str, Any]) -> Seam:
    """Tasks started per step: the gate task, then a master and its workers for the replay, each
    capacity step and each settle segment; each stopped with exit 0."""
    from analysis.capacity.settle_record import SettleOutcome
    from analysis.capacity.steps import read_search_path

    tasks = record.get("tasks") or []
    if not tasks:
        return failed(TASKS, "the run record lists no task", "none started", "the run's progress.log says why")
    bad = [t for t in tasks if t.get("exit_code") not in (0, None) or t.get("state") != "STOPPED"]
    settle = SettleOutcome.read(run_dir / "capacity")
    parts, short = [], []
    for f in m.fleets:
        mine = [t for t in tasks if t.get("fleet") == f.name]
        masters = sum(t["role"] == "master" for t in mine)
        workers = sum(t["role"] == "worker" for t in mine)
        path = read_search_path(run_dir / "capacity" / f.name)
        steps = [s.label for s in path.steps if s.label != "replay"] if path is not None else []
        segments = [s for s in settle.segments if s.fleet == f.name] if settle is not None else []
        parts.append(
            f"{f.name}: gate {sum(t['role'] == 'gate' for t in mine)}; {masters} master(s) with {workers} worker(s): "
            f"the replay, {len(steps)} capacity step(s) ({', '.join(steps) or 'none'}), {len(segments)} settle segment(s)"
        )
        if len(steps) < rehearsal.CAPACITY_STEPS:
            short.append(f"{f.name}: {len(steps)} capacity step(s), the rehearsal runs {rehearsal.CAPACITY_STEPS}")
        if len(segments) < rehearsal.SETTLE_SEGMENTS:
            # the rehearsal's manifest asks them settled or not (settle_min_segments): fewer means
            # the phase stopped early or never ran, and its tasks went unrehearsed
            why = f" (settle phase: {settle.stopped}, {settle.detail})" if settle is not None else " (no settle.json)"
            short.append(
                f"{f.name}: {len(segments)} settle segment(s), the rehearsal runs {rehearsal.SETTLE_SEGMENTS}{why}"
            )
    if bad:
        t = bad[0]
        return failed(
            TASKS,
            "; ".join(parts),
            f"{t.get('role')} task {t.get('task')} ({t.get('fleet')}): {t.get('state')}, exit {t.get('exit_code')}, "
            f"{t.get('reason') or 'no reason given'}",
            "the task's log (CloudWatch Logs, its stream named by the task id) says why",
        )
    if short:
        return failed(
            TASKS,
            "; ".join(parts),
            "; ".join(short),
            "the run's progress.log says why its search or settle phase stopped",
        )
    return Seam(TASKS, True, "; ".join(parts))


def _records(m: Manifest, uri: str, names: list[str]) -> Seam:
    counts = {
        f.name: sum(1 for n in names if n.endswith(".jsonl") and f"records-{f.name}-" in n.rsplit("/", 1)[-1])
        for f in m.fleets
    }
    empty = [k for k, v in counts.items() if v == 0]
    if empty:
        return failed(
            RECORDS,
            f"no record files of {', '.join(empty)} under {uri}/",
            "none uploaded",
            "the workers' task role needs s3:PutObject on the results prefix; their logs say what S3 answered",
        )
    return Seam(
        RECORDS,
        True,
        f"{len(names)} file(s) under {uri}/, " + ", ".join(f"{k} {v} record file(s)" for k, v in counts.items()),
    )


def _conductor(run_id: str, task: str, record: dict[str, Any], attach_code: int) -> Seam:
    status = record.get("status")
    if status != "finished":
        return failed(
            CONDUCTOR,
            f"`run --attach {run_id}` ended (exit {attach_code}) with the run {status or 'not recorded'}",
            f"run.json status {status!r}, stage {record.get('stage', '?')}",
            f"the conductor's log says why; `run --resume {run_id} --detach` picks the run up",
        )
    return Seam(CONDUCTOR, True, f"`run --detach` started {task}; `run --attach` followed run {run_id} to its end")


def _finish(
    session: Any, cfg: cc.RunConfig, report: RehearsalReport, out_dir: Path, say: Callable[[str], None]
) -> RehearsalReport:
    where = out_dir / (report.run_id or "no-run")
    where.mkdir(parents=True, exist_ok=True)
    (where / REPORT_JSON).write_text(report.to_json(), encoding="utf-8")
    (where / REPORT_TEXT).write_text("\n".join(report.lines()) + "\n", encoding="utf-8")
    for line in report.lines():
        say(line)
    try:
        say(f"rehearsal recorded at {put_record(session.client('s3'), cfg.results_uri, report)}")
    except Exception as exc:  # the report stands without its record; the campaign's deploy then suggests one
        say(f"rehearsal not recorded in the results bucket ({type(exc).__name__}: {exc})")
    return report
