"""A run's state outlives its orchestrator (issue 40, item 1): the stages checkpoint after each
stage and before each capacity step or settle segment, a step's verdict is written as soon as
it is judged, and on AWS a checkpoint puts what changed in the run directory under the run's
prefix with the run record naming the stage."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boto3.exceptions import S3UploadFailedError
from moto import mock_aws

from analysis.capacity.steps import STEP_FILE
from analysis.model import Verdict
from analysis.sources.server_series import METRICS_DIR
from campaign.backends.simulated.fleets import SimulatedFleets
from campaign.stages.run import run_stages
from core import cloud_contract as cc
from core.manifest import Manifest, manifest_from_data
from tests.cloud.test_cloud_steps import Aws, Launcher, _run


@pytest.fixture(scope="module")
def aws() -> Iterator[Aws]:
    """One moto account for the module's cloud tests (test_cloud_steps' fixture makes one per test,
    5 to 9 s each here): each test's run puts under its own run id's prefix."""
    with mock_aws():
        yield Aws()


class Recording(SimulatedFleets):
    """The plan's fleets, each checkpoint recorded with what the run directory held at it."""

    def __init__(self, *args: Any, run_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_dir = run_dir
        self.calls: list[tuple[str, set[str]]] = []

    def checkpoint(self, stage: str) -> None:
        verdicts = {p.parent.relative_to(self.run_dir).as_posix() for p in self.run_dir.rglob(STEP_FILE)}
        self.calls.append((stage, verdicts))


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory, _example_data: dict[str, Any]) -> tuple[Manifest, Recording]:
    """The example's campaign on the plan's fleets, run through with its checkpoints recorded:
    shared by the two tests below (each ran its own until 2026-12-07)."""
    from tests.conftest import ROOT

    data = copy.deepcopy(_example_data)
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    m = manifest_from_data(data)
    run_dir = tmp_path_factory.mktemp("finished")
    fleets = Recording(m, 60.0, run_dir=run_dir)
    rep = run_stages(m, fleets, run_dir, threading.Event(), full_report=False, log=lambda line: None)
    assert rep is not None
    return m, fleets


def test_the_stages_checkpoint_after_each_stage_and_before_each_step(example_run: tuple[Manifest, Recording]) -> None:
    _, fleets = example_run
    tmp_path = fleets.run_dir
    stages = [s for s, _ in fleets.calls]
    # after the gate and the replay, then before each step, then after the search, the settle phase
    # and the server series saved for the report
    assert stages[:2] == ["quality gate", "trace replay"]
    assert stages.index("capacity search") < stages.index("settle phase") == len(stages) - 2
    assert stages[-1] == "server series"
    before_steps = [s for s in stages if s.startswith("capacity search: before ")]
    steps = sorted(p.parent.relative_to(tmp_path / "capacity").as_posix() for p in tmp_path.rglob(STEP_FILE))
    assert len(before_steps) == len(steps) > 2
    assert sorted(s.removeprefix("capacity search: before ") for s in before_steps) == steps
    # each step's verdict is on disk before the next step of its fleet starts (kept by that checkpoint)
    for i, (stage, seen) in enumerate(fleets.calls):
        if not stage.startswith("capacity search: before "):
            continue
        fleet = stage.removeprefix("capacity search: before ").split("/")[0]
        earlier = [s.removeprefix("capacity search: before ") for s, _ in fleets.calls[:i]]
        for prev in (e for e in earlier if e.startswith(f"{fleet}/")):
            assert f"capacity/{prev}" in seen, (stage, prev)
    step = json.loads((tmp_path / "capacity" / steps[0] / STEP_FILE).read_text())
    assert step["verdict"] in {v.value for v in Verdict} and step["requests"] > 0


def test_a_cloud_checkpoint_puts_only_what_changed_and_names_the_stage(aws: Aws, tmp_path: Path) -> None:
    run = _run(aws, Launcher(aws), tmp_path)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "quality.json").write_text("{}")
    (run.run_dir / "records").mkdir()
    (run.run_dir / "records" / "records-inf2-w0.jsonl").write_text("{}\n")  # the tasks put records themselves
    run.checkpoint("quality gate")
    bucket, prefix = cc.split_s3_uri(run.uri)

    def keys() -> set[str]:
        listed = aws.s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
        return {o["Key"].removeprefix(f"{prefix}/") for o in listed}

    assert keys() == {"quality.json", cc.RUN_RECORD}
    record = json.loads(aws.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.RUN_RECORD}")["Body"].read())
    assert record["status"] == "running" and record["stage"] == "quality gate"
    assert run.publish() == 0  # nothing changed since
    step = run.run_dir / "capacity" / "inf2" / "x1"
    step.mkdir(parents=True)
    (step / STEP_FILE).write_text('{"verdict": "held"}')
    assert run.publish() == 1 and f"capacity/inf2/x1/{STEP_FILE}" in keys()
    (run.run_dir / "quality.json").write_text('{"inf2": {}}')  # changed: put again
    assert run.publish() == 1


class _Killed(BaseException):
    """The orchestrator's process dying: nothing after it runs."""


class _DiesAfter:
    """The results bucket, as a process killed after `n` uploads of a publish leaves it."""

    def __init__(self, s3: Any, n: int) -> None:
        self.s3, self.n, self.keys = s3, n, []  # type: Any, int, list[str]

    def upload_file(self, path: str, bucket: str, key: str) -> None:
        if len(self.keys) == self.n:
            raise _Killed
        self.s3.upload_file(path, bucket, key)
        self.keys.append(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.s3, name)


def test_a_publish_cut_off_at_any_upload_never_leaves_a_stage_finished_without_its_files(
    aws: Aws,
    tmp_path: Path,
    example_run: tuple[Manifest, Recording],
) -> None:
    """The resume reads "finished" from marker files (step.json, search.json, settle.json,
    quality.json with campaign.json: campaign.stages.resume). A publish cut off between two uploads
    must never have put a marker before the files it vouches for, or the resumed run would carry
    over a step, search or settle phase whose files never reached the bucket. Failed on the old
    order (sorted by path: capacity/<fleet>/search.json before its x<k>/ directories, step.json
    before the step's summary)."""
    from campaign.aws.s3_trees import download_tree
    from campaign.stages import resume

    m, recording = example_run
    finished = recording.run_dir  # read only: every publish below puts it from scratch
    local = {p.relative_to(finished).as_posix() for p in finished.rglob("*") if p.is_file()}
    fleets = [f.name for f in m.fleets]
    whole = resume.read_run_state(finished, fleets)
    assert whole.stage == resume.REPORT and len(local) > 20

    def files_under(rel: str) -> set[str]:
        return {p for p in local if p.startswith(f"{rel}/") and not p.rsplit("/", 1)[-1].startswith("records-")}

    n = 0
    while True:
        run = _run(aws, Launcher(aws), tmp_path / f"k{n}")
        run.run_dir = finished  # this run's directory: the finished one, put from scratch
        run.uri = f"{run.uri}-k{n}"
        run.s3 = _DiesAfter(aws.s3, n)
        try:
            run.publish()
            done = True
        except _Killed:
            done = False
        landed = tmp_path / f"landed{n}"
        download_tree(aws.s3, run.uri, landed)
        for records in finished.rglob("records-*"):  # the tasks put these themselves, before any publish
            dest = landed / records.relative_to(finished)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(records.read_bytes())
        there = {p.relative_to(landed).as_posix() for p in landed.rglob("*") if p.is_file()}
        state = resume.read_run_state(landed, fleets)
        for fleet, st in state.fleets.items():
            for label in st.finished:
                missing = files_under(f"capacity/{fleet}/{label}") - there
                assert not missing, f"after {n} upload(s): {fleet}/{label} carried over without {sorted(missing)}"
            if st.search_finished:
                unjudged = set(whole.fleets[fleet].finished) - set(st.finished)
                assert not unjudged, f"after {n} upload(s): {fleet}'s search finished without {sorted(unjudged)}"
        if state.settle_finished:
            missing = files_under("capacity") - there
            assert not missing, f"after {n} upload(s): the settle phase finished without {sorted(missing)}"
        if state.gate_finished:
            assert "campaign.json" in there and "quality.json" in there
        if done:
            break
        n += 1
    assert n == len({p for p in local if not p.rsplit("/", 1)[-1].startswith("records-")})  # every cut was tried
    # the markers are the names the analysis writes (resume.py names them without importing duckdb)
    from analysis.capacity.settle_record import SETTLE_FILE, SETTLE_PROGRESS_FILE
    from analysis.capacity.steps import SEARCH_FILE

    assert resume.FINISH_MARKERS[:4] == (STEP_FILE, SEARCH_FILE, SETTLE_PROGRESS_FILE, SETTLE_FILE)


class _FailsOnce:
    """The results bucket refusing the first upload of `key` (a timed-out PutObject, say) and
    taking every other upload."""

    def __init__(self, s3: Any, key: str) -> None:
        self.s3, self.key, self.failed = s3, key, False

    def upload_file(self, path: str, bucket: str, key: str) -> None:
        if key.endswith(f"/{self.key}") and not self.failed:
            self.failed = True
            raise S3UploadFailedError(f"Failed to upload {path} to {bucket}/{key}: RequestTimeout")
        self.s3.upload_file(path, bucket, key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.s3, name)


def test_a_file_whose_upload_failed_is_put_by_the_next_publish(aws: Aws, tmp_path: Path) -> None:
    """Issue 46, finding 6: publish stamped a file as put before its upload, so a file whose upload
    raised was skipped by every later publish, and lost once teardown deleted the workspace."""
    run = _run(aws, Launcher(aws), tmp_path)
    (run.run_dir / METRICS_DIR).mkdir(parents=True)
    (run.run_dir / METRICS_DIR / "inf2.json").write_text('{"series": []}')
    (run.run_dir / "quality.json").write_text("{}")  # a finish marker: put after the metrics
    run.s3 = _FailsOnce(aws.s3, f"{METRICS_DIR}/inf2.json")
    with pytest.raises(S3UploadFailedError):
        run.publish()
    bucket, prefix = cc.split_s3_uri(run.uri)

    def keys() -> list[str]:
        listed = aws.s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
        return sorted(o["Key"].removeprefix(f"{prefix}/") for o in listed)

    assert keys() == []  # the failed upload stopped the publish before the marker
    assert run.publish() == 2  # the retry (the next checkpoint, or the run's last publish) puts both
    assert keys() == [f"{METRICS_DIR}/inf2.json", "quality.json"]
    body = aws.s3.get_object(Bucket=bucket, Key=f"{prefix}/{METRICS_DIR}/inf2.json")["Body"].read()
    assert body == b'{"series": []}'
    assert run.publish() == 0  # both put now: neither again
