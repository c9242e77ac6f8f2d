"""The cloud path, offline: the synthesized Fargate task definitions run as local processes.

The stand-ins are `make cloud-offline`'s (testing/cloud_offline.py): `cdk synth` in a subprocess
(jsii and gevent deadlock in one process), the load-generator task definitions' Command and
Environment and the run-config stack output read from the template, a moto server for S3,
CloudFormation (the deployed stack's outputs), Auto Scaling, CloudWatch and the Tagging API, and
one emulator per fleet serving its measured instances behind the NLB endpoint (the one value of
the run config replaced). The stack is the rehearsal's (issue 51: `deploy --rehearsal`, the
rehearsal's manifest synthesized with -c rehearsal=1), so the module's one full campaign is the
rehearsal, `make cloud-offline-rehearsal`'s: `run --rehearsal` checks the images (a loopback
registry) and quotas, starts the conductor with `run --detach` (its own process, calling
campaign.backends.fargate.campaign.run_campaign as `python -m campaign run` does, with
LocalTaskLauncher in place of ECS RunTask) and follows it with `run --attach`: every stage (gate
tasks, replay, a short capacity search and the settle phase, each step on its own master +
workers, records streamed through S3, the report); then its report's seams. A second run, in this
process, runs only the replay. Then `python -m campaign report --run-id` and `teardown --run-dir` (the
second run's local copy, under the bucket's TLS-only policy) run as the operator would type
them. The Prometheus task's command line runs too, with a local prometheus binary.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core import cloud_contract as cc
from core.manifest import load_manifest
from core.ports import free_port
from testing.cloud_offline import (
    BUCKET,
    STAND_IN_KEY,
    OfflineAws,
    OfflineRehearsal,
    denials_seam,
    denied_without,
    offline_manifest,
    rehearsal_stand_ins,
    rehearse_in,
    run_once,
    short_run,
)
from testing.offline_tasks import resolve, task_role
from tests.conftest import EXAMPLE_MANIFEST, ROOT
from tests.real_parts import program

pytestmark = pytest.mark.cloud_path

REGION = "us-east-1"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cloud")


@pytest.fixture(scope="module")
def manifest_path(workdir: Path) -> Path:
    """The example manifest with a 12 s window, answers of 32 tokens at most and a short search
    (testing.cloud_offline.short_run: the replay and one capacity step per fleet, in real time:
    the tasks are real processes):
    the same relative trace path, so the copy sits next to a copy of the trace exactly as in the
    repository."""

    # The client-lag bound relaxed as `make cloud-offline` relaxes it (the lag check itself: tests/loadgen).
    return offline_manifest(EXAMPLE_MANIFEST, workdir, short_run)


@pytest.fixture(scope="module")
def rehearsal(workdir: Path, manifest_path: Path) -> Iterator[OfflineRehearsal]:
    """`deploy --rehearsal` in the stand-ins `make cloud-offline-rehearsal` uses (testing/cloud_offline.py):
    the rehearsal's manifest (beside the short one) synthesized with -c rehearsal=1, moto, the
    synthesized stack's outputs, emulated fleets, tagged Auto Scaling groups with their in-service
    metric and deadline actions, a loopback registry holding every image. The module's campaign is
    the rehearsal (issue 51): it runs every stage the campaign runs, through the conductor."""
    with rehearsal_stand_ins(manifest_path, workdir, say=lambda _: None) as stand_ins:
        yield stand_ins


@pytest.fixture(scope="module")
def offline(rehearsal: OfflineRehearsal) -> OfflineAws:
    return rehearsal.aws


@pytest.fixture(scope="module")
def rehearsal_manifest(rehearsal: OfflineRehearsal) -> Path:
    """The manifest the stack was deployed from, the rehearsal's: what `run`, `report` and `teardown` are given."""
    return Path(rehearsal.m.source_file())


@pytest.fixture(scope="module")
def template(offline: OfflineAws) -> dict[str, Any]:
    return offline.template


def _session() -> Any:
    """The test's own reads and the bucket policy it sets (CloudFormation's): not the operator's."""
    import boto3

    return boto3.session.Session(region_name=REGION, aws_access_key_id=STAND_IN_KEY, aws_secret_access_key="testing")


def _objects(prefix: str) -> dict[str, str]:
    s3 = _session().client("s3")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["ETag"]
    return out


def _run(offline: OfflineAws, manifest_path: Path, workdir: Path, name: str, **kwargs: Any) -> Any:
    return run_once(offline, manifest_path, workdir, name, poll_s=0.5, **kwargs)


def _json(key: str) -> Any:
    return json.loads(_session().client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read())


@pytest.mark.timeout(900)  # every stage, each step on fresh task processes: about 3 min on 2 shared cores
def test_rehearsal_a_second_run_report_and_teardown_from_the_synthesized_task_definitions(
    rehearsal: OfflineRehearsal, offline: OfflineAws, rehearsal_manifest: Path, workdir: Path
) -> None:
    manifest_path = rehearsal_manifest
    m = load_manifest(manifest_path)
    from core.schedule import build_schedule

    scheduled = len(build_schedule(m))
    # `run --rehearsal`: the images and quotas, then `run --detach` (the conductor, its own
    # process, starts every task) and `--attach`, then every seam observed (issue 51).
    rehearsed = rehearse_in(rehearsal, workdir, say=lambda _: None)
    lines = "\n".join(rehearsed.lines())
    assert rehearsed.exit_code == 0, lines
    from campaign.aws.rehearsal_report import SEAMS, TEARDOWN

    assert [s.name for s in rehearsed.seams] == list(SEAMS), lines  # every seam, each with its observation
    assert [s.name for s in rehearsed.seams if s.passed is None] == [TEARDOWN]  # teardown's, below
    results_uri = offline.run_config["results_uri"]
    first_uri, first_run_id = f"{results_uri}/{rehearsed.run_id}", rehearsed.run_id
    _, prefix = cc.split_s3_uri(first_uri)
    first_objects = _objects(prefix + "/")
    run_record = _json(f"{prefix}/run.json")
    roles = [(t["fleet"], t["role"]) for t in run_record["tasks"]]
    # A gate task per fleet, then a fresh master and loadgen.workers workers per fleet for the
    # replay and for every capacity step (and settle segment), each from its task definition.
    for f in m.fleets:
        assert roles.count((f.name, "gate")) == 1
        masters = roles.count((f.name, "master"))
        assert masters >= 2 and roles.count((f.name, "worker")) == masters * m.loadgen.workers
    # what the rehearsal report says of them is what the run record lists
    tasks_line = next(s.observed for s in rehearsed.seams if s.name == "tasks")
    for f in m.fleets:
        assert f"{f.name}: gate 1; {roles.count((f.name, 'master'))} master(s) with" in tasks_line, tasks_line
    # the record in the results bucket, under the campaign (not the rehearsal's digest prefix)
    bucket_record = _json(f"campaigns/{m.campaign}/rehearsal.json")
    assert bucket_record["run_id"] == rehearsed.run_id and bucket_record["rehearsal_digest"] == m.digest
    # Seams broken on purpose, over this run's stand-ins and calls (issue 51), while the stack
    # stands: the rehearsal report exits 1 naming the seam and the AWS error.
    _broken_seams(rehearsal, m, workdir, rehearsed.run_id)
    names = {k[len(prefix) + 1 :] for k in first_objects}
    for f in m.fleets:
        # each worker's records as the parts it flushed (loadgen.recording.RecordParts), the first at least
        assert {f"records/records-{f.name}-w{i}-p000001.jsonl" for i in range(m.loadgen.workers)} <= names
        assert f"records/summary-{f.name}.json" in names
        s = _json(f"{prefix}/records/summary-{f.name}.json")
        assert s["scheduled"] == scheduled and s["scheduled"] == s["completed"] + s["failed"] + s["not_sent"]
        assert s["completed"] == scheduled, (s, lines)  # the emulators answer every request
        assert s["valid"], (s["invalid_reasons"], lines)
        gate = _json(
            f"{prefix}/gate-{f.name}.json"
        )  # readiness through the "NLB", then the fixtures, from inside the "VPC"
        assert gate["ready"] and gate["gate"]["passed"], gate
        search = _json(f"{prefix}/capacity/{f.name}/search.json")
        steps = [st for st in search["steps"] if st["label"] != "replay"]
        assert steps, search
        for st in steps:  # each step's records, as its workers uploaded them, beside the step's merged summary
            assert f"capacity/{f.name}/{st['label']}/records-{f.name}-w0-p000001.jsonl" in names
            step_summary = _json(f"{prefix}/capacity/{f.name}/{st['label']}/summary-{f.name}.json")
            assert step_summary["valid"], step_summary["invalid_reasons"]  # judged against the step's own schedule
            assert st["verdict"] != "invalid" and (st["requests"] >= 12 or "certain miss" in st["detail"]), st
    assert {
        "inputs/manifest.yaml",
        "inputs/schedule.json",
        f"inputs/{m.trace_path.name}",
        "run.json",
        "campaign.json",
        "quality.json",
        "report.json",
        "report.html",
        "capacity/settle.json",
    } <= names
    assert run_record["status"] == "finished"
    report = _json(f"{prefix}/report.json")
    # Instances in service as the run counted them while the replay ran (the fewest healthy
    # targets, DescribeTargetHealth), not the manifest; and the settle phase's interim report
    # decided on the same fleet as the final one (issue 37: it divided by asg.desired). Time to
    # ready: each group's launch activities (moto's, filled in by testing/moto_gaps at its
    # emulator's start) to its target group's first healthy minute.
    interim = _json(f"{prefix}/settle-interim/report.json")
    for f in m.fleets:
        counted = report["provenance"][f"instances_measured.{f.name}"]
        assert report["fleets"][f.name]["instances_measured"] == f.instances_measured
        assert counted["source"] == "measured" and "fewest healthy targets" in counted["detail"]
        assert interim["fleets"][f.name]["instances_measured"] == f.instances_measured
        assert interim["provenance"][f"instances_measured.{f.name}"] == counted
        ready = report["time_to_ready"][f.name]
        assert ready["instances_launched"] == f.instances_measured, ready
        assert 0 <= ready["first_healthy_unix"] - ready["first_launch_unix"] <= 180, ready
    assert report["provenance"]["time_to_ready"]["source"] == "pulled"
    assert not [g for g in report["gaps"] if g["what"].startswith("time_to_ready")], report["gaps"]

    second, launcher2 = _run(offline, manifest_path, workdir, "second", capacity=False, final_report=False)
    assert second.exit_code == 0 and second.report is None, launcher2.log_tail()
    assert second.run_id != first_run_id
    assert _objects(prefix + "/") == first_objects  # nothing of the first run was overwritten
    _, prefix2 = cc.split_s3_uri(second.uri)
    assert any(k.endswith("records/records-inf2-w0-p000001.jsonl") for k in _objects(prefix2 + "/"))

    env = {**os.environ, **offline.env}
    out = workdir / "report"
    rep = subprocess.run(
        [sys.executable, "-m", "campaign", "report", str(manifest_path), "--run-id", first_run_id, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode in (0, 10, 11), rep.stderr[-3000:]
    again = json.loads((out / "report.json").read_text(encoding="utf-8"))
    # The same report from the run's files in S3 as the run built (its creation time and paths aside).
    assert again["decision"] == report["decision"] and again["fleets"] == report["fleets"]
    assert f"{scheduled * len(m.fleets)} records" in json.dumps(again["provenance"]["records"])

    # The evidence outlives the stack: both runs stay in the results bucket. Listed now, because
    # the bucket's policy below (the stack's: TLS only) refuses moto's plain-HTTP requests.
    second_objects = _objects(prefix2 + "/")
    s3 = _session().client("s3")
    s3.put_bucket_policy(
        Bucket=BUCKET,
        Policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Deny",
                        "Principal": {"AWS": "*"},
                        "Action": "s3:*",
                        "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                    }
                ],
            }
        ),
    )
    down = workdir / "teardown"
    td = subprocess.run(  # the second run as `run` left it locally: the policy refuses plain-HTTP reads
        [
            sys.executable,
            "-m",
            "campaign",
            "teardown",
            str(manifest_path),
            "--run-dir",
            str(second.run_dir),
            "--out",
            str(down),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert td.returncode == 0, td.stdout[-2000:] + td.stderr[-3000:]
    assert (down / "report.html").is_file()
    assert f"kept by design: arn:aws:s3:::{BUCKET}" in td.stdout
    with pytest.raises(Exception, match="does not exist"):
        _session().client("cloudformation").describe_stacks(StackName=f"{m.campaign}-comparison")
    s3.delete_bucket_policy(Bucket=BUCKET)
    assert _objects(prefix + "/") == first_objects and _objects(prefix2 + "/") == second_objects and second_objects

    # Every call is recorded as its caller's (each task's access key is its task role's) and the
    # run fails on a denial (offline_aws, at its end: testing.cloud_offline.enforce_roles). Here
    # the same evaluation of the calls so far, with one statement of a task's role removed,
    # denies the call that needed it, naming the role, the action and the resource.
    for definition, action in (
        ("worker_task_definition", "s3:GetObject"),
        ("worker_task_definition", "s3:PutObject"),
        ("worker_task_definition", "servicediscovery:DiscoverInstances"),
        ("gate_task_definition", "s3:PutObject"),
    ):
        role = task_role(offline.template, offline.run_config[definition])
        denied = denied_without(workdir, role, action)
        assert denied and all(d.startswith(f"{role} may not ") for d in denied), (definition, action, denied)
        assert any(d.startswith(f"{role} may not {action} on arn:aws:") for d in denied), (definition, action, denied)


def _broken_seams(rehearsal: OfflineRehearsal, m: Any, workdir: Path, run_id: str) -> None:
    """A permission removed from a role, an image reference that does not exist, an untagged
    resource: each fails its seam with the AWS error, and the rehearsal exits 1 naming it."""
    from campaign.aws.rehearsal_report import RehearsalReport
    from campaign.aws.rehearsal_seams import tags_seam
    from testing.offline_tasks import task_role

    def report() -> RehearsalReport:
        return RehearsalReport(m.campaign, rehearsal.campaign_digest, m.digest, run_id)

    # the workers' task role without s3:PutObject: their records never reach S3
    worker = task_role(rehearsal.aws.template, rehearsal.aws.run_config["worker_task_definition"])
    denied = report()
    denials_seam(denied, workdir, (worker, "s3:PutObject"))
    bad = denied.first_failure()
    assert denied.exit_code == 1 and bad is not None and bad.name == "records", denied.lines()
    assert bad.error.startswith(f"AccessDenied: {worker} may not s3:PutObject on arn:aws:s3:::{BUCKET}/"), bad.error

    # an image the registry does not hold: the pre-flight's first seam
    gone = next(k for k in rehearsal.held if "/manifests/sha256:" in k)
    digest = rehearsal.held.pop(gone)
    try:
        images, _ = rehearsal.preflight()
    finally:
        rehearsal.held[gone] = digest
    missing = report()
    missing.add(images)
    assert missing.exit_code == 1 and images.name == "images" and images.passed is False
    assert images.error.endswith(f"no manifest {digest} (HTTP 404)"), images.error
    assert missing.lines()[-1].startswith("rehearsal FAILED at images: HEAD http://127.0.0.1:")

    # a target group without the campaign tag
    stack = f"{m.campaign}-comparison"
    tg = rehearsal.aws.run_config["target_groups"][m.fleets[0].name]
    elbv2 = _session().client("elbv2")
    elbv2.remove_tags(ResourceArns=[tg], TagKeys=["campaign"])
    try:
        untagged = report()
        seam = untagged.add(tags_seam(rehearsal.aws.session, m, stack))
    finally:
        elbv2.add_tags(ResourceArns=[tg], Tags=[{"Key": "campaign", "Value": m.campaign}])
    assert untagged.exit_code == 1 and seam.name == "tags" and seam.error == f"untagged: {tg}", seam


@pytest.mark.prometheus
def test_the_synthesized_prometheus_task_loads_its_config_in_a_real_prometheus(
    template: dict[str, Any], workdir: Path
) -> None:
    """The Prometheus task's own command line (sh -c: write $PROMETHEUS_CONFIG, exec prometheus),
    run with a local prometheus binary; substituted: its paths (a directory here), its listen
    address (a free loopback port) and the managed workspace's URL (an unused loopback port: the
    remote write fails and is logged), credentials (fake ones; the task role's on Fargate).
    Discovery finds nothing offline; the config must load."""
    binary = program("prometheus")
    (c,) = [
        c
        for r in template["Resources"].values()
        if r["Type"] == "AWS::ECS::TaskDefinition"
        for c in r["Properties"]["ContainerDefinitions"]
        if c["Name"] == "prometheus"
    ]
    assert c["EntryPoint"] == ["/bin/sh", "-c"]
    (script,) = c["Command"]
    assert "exec /bin/prometheus " in script
    (workspace,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::APS::Workspace"]
    refs = {f"{workspace}.PrometheusEndpoint": "http://127.0.0.1:9/workspaces/ws-offline/"}
    env = {e["Name"]: str(resolve(e["Value"], refs)) for e in c["Environment"]}
    home = workdir / "prometheus-task"
    home.mkdir()
    port = free_port()
    local = re.sub(
        r"(?<![\w/])/prometheus(?=/| |$)", str(home), script.replace("exec /bin/prometheus ", "exec @BINARY@ ")
    )
    local = local.replace("@BINARY@ ", f"{binary} --web.listen-address=127.0.0.1:{port} ")
    assert str(home) + "/prometheus.yml" in local and f"--storage.tsdb.path={home} " in local
    with (home / "stdout.log").open("wb") as log:
        # Credentials: the task role gives them on Fargate; sigv4 needs some to load the config.
        creds = {"AWS_ACCESS_KEY_ID": "offline", "AWS_SECRET_ACCESS_KEY": "offline"}
        proc = subprocess.Popen(
            ["/bin/sh", "-c", local],
            env={**os.environ, **creds, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            loaded = ""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status/config", timeout=2) as resp:
                        loaded = json.loads(resp.read())["data"]["yaml"]
                        break
                except OSError:
                    time.sleep(0.5)
            assert loaded, (home / "stdout.log").read_text(errors="replace")[-3000:]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    for job in ("serving-inf2", "serving-g6", "loadgen-master", "loadgen-worker"):
        assert f"job_name: {job}" in loaded
    assert "url: http://127.0.0.1:9/workspaces/ws-offline/api/v1/remote_write" in loaded and "sigv4:" in loaded
