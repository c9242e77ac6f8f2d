"""The load-generator task's entry point stages a run's inputs from S3 and refuses wrong ones;
`run` uploads them and keys everything by a new run id."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate.run import upload_inputs
from core import cloud_contract as cc
from core.errors import EXIT_SETUP_FAILED
from core.manifest import load_manifest, manifest_from_data
from core.schedule import build_schedule
from core.serving import served_model_id
from core.tokenizer import HuggingFaceTokenizer, for_manifest
from loadgen import task_entry
from loadgen.prompts import PromptBuilder
from loadgen.task_inputs import InputsRejected, stage_inputs
from loadgen.tokenizer_check import check_prompt_counts, pick_samples
from runtime import tiny_model
from tests.conftest import EXAMPLE_MANIFEST, ROOT, moto_server
from tests.runtime.conftest import emulator_process

BUCKET = "results"
TINY_MANIFEST = ROOT / "manifests" / "tiny-llama-real-engine.yaml"
RESULTS = f"s3://{BUCKET}/campaigns/c/0123456789ab/runs"


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _env(tmp_path: Path, run_id: str, digest: str) -> dict[str, str]:
    return {
        cc.ENV_RESULTS_URI: RESULTS,
        cc.ENV_RUN_ID: run_id,
        cc.ENV_MANIFEST_DIGEST: digest,
        cc.ENV_WORK_DIR: str(tmp_path / "task"),
    }


def test_uploaded_inputs_stage_to_a_byte_identical_manifest(s3: Any, tmp_path: Path) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    run_id = cc.new_run_id()
    desc = upload_inputs(s3, m, RESULTS, run_id)
    staged = stage_inputs(_env(tmp_path, run_id, m.digest), s3)
    assert staged.read_bytes() == EXAMPLE_MANIFEST.read_bytes()
    again = load_manifest(staged)
    assert again.digest == m.digest and again.trace_path.read_bytes() == m.trace_path.read_bytes()
    assert again.trace_path.is_relative_to(tmp_path / "task")
    assert desc.requests > 0 and len(desc.schedule_digest) == 64


def test_a_manifest_other_than_the_deployed_one_is_refused(s3: Any, tmp_path: Path) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    run_id = cc.new_run_id()
    upload_inputs(s3, m, RESULTS, run_id)
    with pytest.raises(InputsRejected, match="not the one this stack was deployed for"):
        stage_inputs(_env(tmp_path, run_id, "f" * 64), s3)


def test_a_schedule_that_differs_from_the_planned_one_is_refused(s3: Any, tmp_path: Path) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    run_id = cc.new_run_id()
    desc = upload_inputs(s3, m, RESULTS, run_id)
    _, prefix = cc.split_s3_uri(cc.inputs_uri(RESULTS, run_id))
    tampered = json.loads(desc.to_json()) | {"schedule_digest": "0" * 64}
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{cc.INPUT_SCHEDULE}", Body=json.dumps(tampered).encode())
    with pytest.raises(InputsRejected, match="differs from the one `campaign run` planned"):
        stage_inputs(_env(tmp_path, run_id, m.digest), s3)


def test_missing_inputs_and_environment_name_what_is_missing(s3: Any, tmp_path: Path) -> None:
    run_id = cc.new_run_id()
    with pytest.raises(InputsRejected, match=f"cannot download {RESULTS}/{run_id}/inputs/schedule.json"):
        stage_inputs(_env(tmp_path, run_id, "a" * 64), s3)
    env = _env(tmp_path, run_id, "a" * 64)
    del env[cc.ENV_RUN_ID]
    with pytest.raises(InputsRejected, match="LOADGEN_RUN_ID is not set"):
        stage_inputs(env, s3)


def test_absolute_trace_path_cannot_be_run_in_the_cloud(s3: Any, tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str(load_manifest(EXAMPLE_MANIFEST).trace_path)
    path = tmp_path / "abs.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"workload\.trace\.path: .* is absolute"):
        upload_inputs(s3, load_manifest(path), RESULTS, cc.new_run_id())


def test_run_ids_are_new_every_time_and_checked() -> None:
    ids = {cc.new_run_id(1_780_000_000.0) for _ in range(20)}
    assert len(ids) == 20 and all(i.startswith("20260528T") for i in ids)
    for bad in ("latest", "../other", "20261203T143000Z-XYZ123"):
        with pytest.raises(ValueError, match="run id"):
            cc.check_run_id(bad)


@pytest.mark.parametrize(
    ("trace", "inside"),
    [("../data/t.csv", "manifest/data/t.csv"), ("t.csv", "manifest/t.csv"), ("../../a/b/t.csv", "manifest/a/b/t.csv")],
)
def test_staged_paths_keep_the_manifests_relative_trace_path(tmp_path: Path, trace: str, inside: str) -> None:
    staged = cc.staged_paths(tmp_path, {cc.TRACE_FIELD: trace})
    assert staged.files[cc.TRACE_FIELD] == (tmp_path / inside).resolve()
    assert (staged.manifest.parent / trace).resolve() == staged.files[cc.TRACE_FIELD]


def test_the_staging_depth_comes_from_every_staged_path(tmp_path: Path) -> None:
    """A tokenizer two levels up beside a trace next to the manifest: both resolve inside the
    staging root, each where the manifest's own relative path points."""
    paths = {cc.TRACE_FIELD: "t.csv", cc.TOKENIZER_FIELD: "../../.cache/tiny/tokenizer.json"}
    staged = cc.staged_paths(tmp_path, paths)
    for field, rel in paths.items():
        assert (staged.manifest.parent / rel).resolve() == staged.files[field]
        assert staged.files[field].is_relative_to(tmp_path.resolve())
    assert len({staged.files[cc.TRACE_FIELD].parent, staged.files[cc.TOKENIZER_FIELD].parent}) == 2
    with pytest.raises(ValueError, match=r"tokenizer\.path: /abs/tokenizer\.json is absolute"):
        cc.staged_paths(tmp_path, {cc.TRACE_FIELD: "t.csv", cc.TOKENIZER_FIELD: "/abs/tokenizer.json"})


def test_a_huggingface_tokenizer_without_pinned_files_cannot_be_run_in_the_cloud(s3: Any, tmp_path: Path) -> None:
    data = yaml.safe_load(TINY_MANIFEST.read_text(encoding="utf-8"))
    data["tokenizer"]["files"] = {}
    data["tokenizer"]["chat_template"] = tiny_model.CHAT_TEMPLATE
    m = manifest_from_data(data, source=tmp_path / "m.yaml")
    with pytest.raises(CloudRunError, match=r"tokenizer\.files: not pinned"):
        upload_inputs(s3, m, RESULTS, cc.new_run_id())


@pytest.fixture
def tiny_checkout(tmp_path: Path) -> Path:
    """The real-engine manifest, byte for byte, with the files it names where its relative paths
    point: the trace, and the tokenizer files `runtime.tiny_model` writes (no weights needed)."""
    root = tmp_path / "checkout"
    manifest = root / "manifests" / TINY_MANIFEST.name
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(TINY_MANIFEST.read_bytes())
    m = load_manifest(TINY_MANIFEST, check_files=False)
    trace = (manifest.parent / m.workload.trace.path).resolve()
    trace.parent.mkdir(parents=True)
    trace.write_bytes(m.trace_path.read_bytes())
    assert m.tokenizer.path is not None
    tiny_model.write_tokenizer((manifest.parent / m.tokenizer.path).resolve().parent)
    return manifest


def test_the_tasks_get_the_tokenizer_only_through_their_inputs_and_count_as_the_server(
    tiny_checkout: Path, tmp_path: Path
) -> None:
    """`run` uploads the real-engine manifest's inputs to S3 (a moto server); a task stages them in
    an empty directory as on Fargate, and its manifest's tokenizer resolves to the staged,
    hash-checked files. A server counting with the operator's checkpoint (the emulator serving the
    huggingface tokenizer) counts the staged manifest's sample prompts exactly: none skipped."""
    m = load_manifest(tiny_checkout)
    run_id = cc.new_run_id()
    with moto_server("us-east-1"):
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        desc = upload_inputs(s3, m, RESULTS, run_id)
        assert desc.tokenizer_path == m.tokenizer.path and set(desc.tokenizer_files) == set(m.tokenizer.files)
        staged = load_manifest(stage_inputs(_env(tmp_path, run_id, m.digest), s3))
    task_dir = (tmp_path / "task").resolve()
    assert staged.digest == m.digest and staged.tokenizer_dir is not None
    assert staged.tokenizer_dir.is_relative_to(task_dir) and sorted(
        p.name for p in staged.tokenizer_dir.iterdir()
    ) == sorted(m.tokenizer.files)
    assert staged.chat_template == tiny_model.CHAT_TEMPLATE
    tokenizer = for_manifest(staged)
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    builder = PromptBuilder(staged, "chat")
    built = [(r.request_id, builder.build(r)) for r in build_schedule(staged)[:12]]
    with emulator_process(tiny_checkout, "g6") as url:
        result = check_prompt_counts(url, served_model_id(staged, staged.fleet("g6")), pick_samples(built))
    assert result.checked > 0 and result.skipped is None


def test_a_staged_tokenizer_file_with_another_hash_is_refused_naming_it(
    tiny_checkout: Path, tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    m = load_manifest(tiny_checkout)
    run_id = cc.new_run_id()
    upload_inputs(s3, m, RESULTS, run_id)
    _, prefix = cc.split_s3_uri(cc.inputs_uri(RESULTS, run_id))
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{cc.tokenizer_object('tokenizer.json')}", Body=b"another tokenizer")
    got = hashlib.sha256(b"another tokenizer").hexdigest()
    with pytest.raises(
        InputsRejected, match=rf"tokenizer\.files\.tokenizer\.json: .* has sha256 {got}, the manifest pins"
    ):
        stage_inputs(_env(tmp_path, run_id, m.digest), s3)
    # The task's entry point: exit 3 (EXIT_SETUP_FAILED), nothing started, both hashes in its log.
    for k, v in _env(tmp_path / "again", run_id, m.digest).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(boto3, "client", lambda *a, **k: s3)
    assert task_entry.main(["--worker"]) == EXIT_SETUP_FAILED == 3
    err = capsys.readouterr().err
    assert "setup failed, nothing was sent" in err and got in err and m.tokenizer.files["tokenizer.json"] in err


def test_the_scorer_the_manifest_names_is_staged_where_its_command_finds_it(s3: Any, tmp_path: Path) -> None:
    """The conductor (`run --detach`) runs the quality gate's scorer in the staged manifest's
    directory: the script the command names must be there. Failed before the scorer was staged
    (the offline conductor's gate: "can't open file .../scorers/answers_nonempty.py")."""
    import subprocess

    m = load_manifest(EXAMPLE_MANIFEST)
    assert m.quality.task_acceptance is not None
    command = m.quality.task_acceptance.command
    run_id = cc.new_run_id()
    desc = upload_inputs(s3, m, RESULTS, run_id)
    assert desc.scorer_files == ("scorers/answers_nonempty.py",) and "python3" in command
    staged = stage_inputs(_env(tmp_path, run_id, m.digest), s3)
    script = staged.parent / "scorers" / "answers_nonempty.py"
    assert script.read_bytes() == (EXAMPLE_MANIFEST.parent / "scorers" / "answers_nonempty.py").read_bytes()
    # the command runs there as the quality gate runs it (cwd: the manifest's directory)
    out = subprocess.run(
        list(command), input='{"output": "an answer"}\n', capture_output=True, text=True, cwd=staged.parent
    )
    assert out.returncode == 0, out.stderr
    # an older run's schedule.json, without the field, still reads
    old = json.loads(desc.to_json())
    del old["scorer_files"]
    assert cc.RunInputs.from_json(json.dumps(old)).scorer_files == ()
