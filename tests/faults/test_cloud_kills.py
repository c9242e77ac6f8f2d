"""The conductor killed, offline (testing/cloud_offline_resume.py, `make cloud-offline-resume`'s
runner): a cloud run started with `run --detach`, whose conductor is its own process, SIGKILLed
mid-search, then its resumed run killed during a publish of the run directory (a loopback proxy in
front of moto's S3 kills it as the first search.json is being put, before it lands), then that
resumed run killed again as the report starts; each time `run --resume --detach` picks it up and
`run --attach` follows the last to its report. Every kill leaves its tasks running, as a dead
Fargate task does; the resume stops them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign.stages import resume
from testing.cloud_offline import denied_without, kill_run, offline_aws, offline_manifest
from testing.cloud_offline_resume import KillingRun
from testing.offline_tasks import task_role
from tests.conftest import EXAMPLE_MANIFEST

pytestmark = [pytest.mark.faults, pytest.mark.cloud_path]


# Real time: the conductor and its tasks are real processes, killed by signal (kill_run keeps the
# campaign itself short).
@pytest.mark.timeout(1200)  # one short offline campaign, three conductors after the first: about 4 min on 2 cores
def test_a_run_killed_mid_search_mid_upload_and_as_its_report_starts_resumes_to_the_same_decision(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    path = offline_manifest(EXAMPLE_MANIFEST, tmp_path, kill_run)
    with offline_aws(path, tmp_path, say=lines.append) as aws:
        run = KillingRun(aws, path, tmp_path, seed=1, say=lines.append)
        outcome = run.run(["search@2", "upload", "report"])
    log = "\n".join(lines[-80:])
    # Every call was allowed by its caller's role (offline_aws fails the run otherwise: the
    # conductors' by the conductor's task role); with one statement of that role removed, the
    # same evaluation of the run's calls denies the call that needed it, named.
    assert any(line.startswith("IAM: the run's ") for line in lines), log
    conductor = task_role(aws.template, aws.run_config["conductor_task_definition"])
    for action in (
        "cloudformation:DescribeStacks",
        "servicediscovery:RegisterInstance",
        "s3:PutObject",
        "s3:ListBucket",
    ):
        denied = denied_without(tmp_path, conductor, action)
        assert denied and all(d.startswith(f"{conductor} may not ") for d in denied), (action, denied)
        assert any(d.startswith(f"{conductor} may not {action} on arn:aws:") for d in denied), (action, denied)
    # the checks the runner makes: the record says it resumed; no step with a verdict at a kill
    # ran again; each verdict carried over is the killed run's, byte for byte; the report says
    # it resumed, and `report --run-dir` over the run's prefix gives its report.json field by field
    assert outcome.problems == [], log
    assert outcome.exit_code in (0, 10, 11), log  # the decision itself may be any of the three
    # ... but the figures were compared, not skipped (issue 46, finding 12: only decision.state was)
    assert outcome.compared_fields > 100, outcome.compared_fields  # a fleet's row alone has dozens
    assert outcome.carried_verdicts > 0, outcome.carried_verdicts
    wheres = [k.split(" ", 1)[0] for k in outcome.kills]
    assert wheres == ["search@2", "upload", "report"], outcome.kills
    assert "capacity search" in outcome.kills[0], outcome.kills  # killed in the search, not after it
    # the last resume picked the run up at its report, every search step carried over
    resumed = outcome.record["resumed"]
    assert resumed["at"] == resume.REPORT, resumed
    steps = sorted(
        p.parent.relative_to(outcome.run_dir / "capacity").as_posix()
        for p in (outcome.run_dir / "capacity").glob("*/*/step.json")
    )
    assert resumed["carried_over"] == steps and steps, (resumed, steps)
    # the report says so: each resume, where it was cut off, what it kept and what ran again
    said = json.loads((outcome.run_dir / "report.json").read_text(encoding="utf-8"))["provenance"]["resume"]
    assert [r["at"] for r in said["value"]] == [resume.SEARCH, resume.SEARCH, resume.REPORT], said
    assert [c for c in said["value"][-1]["carried_over"] if "/settle-" not in c] == steps, said
    # the upload kill fell before a search.json landed, so that resume found the search unfinished
    assert any("search.json" in line for line in lines if line.startswith("== killed")), log
    assert outcome.record["status"] == "finished" and outcome.record["exit_code"] == outcome.exit_code
    # the resumed runs said where they took the run up (progress.log, as --attach printed it)
    progress = (outcome.run_dir / "progress.log").read_text(encoding="utf-8")
    assert progress.count("task(s) of it still running stopped") == 3, progress[-3000:]
