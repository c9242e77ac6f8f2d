"""A load-generator task's inputs: staged from S3 and checked before anything is sent
(`stage_inputs`), and a worker's master found in Cloud Map (`discover_master`).

The task definition gives the results prefix and the manifest digest the stack was built from;
`campaign run` gives the run id (and fleet, host, master address). The inputs are the run's manifest,
schedule description, trace and a huggingface tokenizer's pinned files under
`<results>/<run id>/inputs/`; a task refuses to start (InputsRejected: exit 3, nothing sent) when the
manifest is not the one the stack was deployed for, when the trace's or a tokenizer file's sha256
does not match the manifest, or when the schedule it builds differs from the one `run` planned. The
conductor stages the same inputs (its quality gate's scorer among them). Apart from the task's entry
point (loadgen/task_entry.py), which runs Locust, so that the conductor's image needs no Locust.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, CampaignError
from core.manifest import ManifestError, load_manifest
from core.schedule import ScheduleError, build_schedule, schedule_digest


class InputsRejected(CampaignError, RuntimeError):
    exit_code = EXIT_FAILED_STEP


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise InputsRejected(f"environment variable {name} is not set (the task definition or `campaign run` sets it)")
    return value


def _download(s3: Any, uri: str, dest: Path) -> None:
    bucket, key = cc.split_s3_uri(uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        s3.download_file(bucket, key, str(dest))
    except Exception as exc:  # botocore ClientError (missing object, access denied), endpoint errors
        raise InputsRejected(f"cannot download {uri}: {exc}") from None


def stage_inputs(env: Mapping[str, str], s3: Any) -> Path:
    """Download and check the run's inputs; returns the staged manifest's path."""
    results = _required(env, cc.ENV_RESULTS_URI)
    run_id = _required(env, cc.ENV_RUN_ID)
    expected_digest = _required(env, cc.ENV_MANIFEST_DIGEST)
    root = Path(env.get(cc.ENV_WORK_DIR) or "/data") / "inputs" / run_id
    try:
        inputs = cc.inputs_uri(results, run_id)
    except ValueError as exc:
        raise InputsRejected(str(exc)) from None
    desc_path = root / cc.INPUT_SCHEDULE
    _download(s3, f"{inputs}/{cc.INPUT_SCHEDULE}", desc_path)
    try:
        desc = cc.RunInputs.from_json(desc_path.read_text(encoding="utf-8"))
        staged = cc.staged_paths(root, desc.relative_paths)
    except ValueError as exc:
        raise InputsRejected(f"{inputs}/{cc.INPUT_SCHEDULE}: {exc}") from None
    manifest_path = staged.manifest
    _download(s3, f"{inputs}/{cc.INPUT_MANIFEST}", manifest_path)
    _download(s3, f"{inputs}/{desc.trace_file}", staged.files[cc.TRACE_FIELD])
    if desc.tokenizer_files:
        tokenizer_dir = staged.files[cc.TOKENIZER_FIELD].parent
        for name in desc.tokenizer_files:
            _download(s3, f"{inputs}/{cc.tokenizer_object(name)}", tokenizer_dir / name)
    for i, rel in enumerate(desc.scorer_files):  # what the conductor's quality gate runs
        _download(s3, f"{inputs}/{cc.scorer_object(i, rel)}", staged.files[cc.scorer_field(i)])
    try:
        # Also checks the staged trace's and tokenizer files' sha256 against the manifest's pins:
        # a mismatch names the file and both hashes.
        m = load_manifest(manifest_path)
    except ManifestError as exc:
        raise InputsRejected(
            f"{inputs}/{cc.INPUT_MANIFEST} is invalid here: " + "; ".join(str(i) for i in exc.issues)
        ) from None
    if m.digest != expected_digest:
        raise InputsRejected(
            f"manifest digest {m.digest[:12]} is not the one this stack was deployed for ({expected_digest[:12]}): "
            "deploy the manifest you run, or run the manifest you deployed"
        )
    try:
        digest = schedule_digest(build_schedule(m))
    except ScheduleError as exc:
        raise InputsRejected(str(exc)) from None
    if digest != desc.schedule_digest:
        raise InputsRejected(
            f"the schedule built here ({digest[:12]}) differs from the one `campaign run` planned ({desc.schedule_digest[:12]})"
        )
    return manifest_path


def discover_master(
    env: Mapping[str, str],
    servicediscovery: Any,
    *,
    timeout_s: float = cc.MASTER_DISCOVERY_TIMEOUT_S,
    poll_s: float = cc.MASTER_DISCOVERY_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, str]:
    """A worker started beside its master: (host, port) of this step's master of this fleet, once
    `run` registered it in Cloud Map. DiscoverInstances answers from the service registry itself,
    with no DNS caching in between, and filters on a custom attribute (QueryParameters), so a
    registration left by an earlier step is never taken (AWS Cloud Map API reference,
    DiscoverInstances)."""
    namespace = _required(env, cc.ENV_DISCOVERY_NAMESPACE)
    service = _required(env, cc.ENV_MASTER_SERVICE)
    step = _required(env, cc.ENV_STEP)
    t0 = clock()
    seen = "no answer yet"
    while True:
        try:
            found = servicediscovery.discover_instances(
                NamespaceName=namespace, ServiceName=service, QueryParameters={cc.STEP_ATTRIBUTE: step}
            ).get("Instances", [])
            attrs = found[0].get("Attributes", {}) if found else {}
            if attrs.get("AWS_INSTANCE_IPV4"):
                return attrs["AWS_INSTANCE_IPV4"], attrs.get("AWS_INSTANCE_PORT") or str(cc.LOCUST_MASTER_PORT)
            seen = f"no master of step {step} registered in {service}.{namespace}"
        except Exception as exc:  # throttled, or the service not readable: ask again until the wait runs out
            seen = f"DiscoverInstances {service}.{namespace}: {type(exc).__name__}: {exc}"
        if clock() - t0 + poll_s > timeout_s:
            raise InputsRejected(f"no master found after {clock() - t0:.0f} s: {seen}")
        sleep(poll_s)
