"""The pieces `campaign run` adds around the shared stages: the gate task's readiness wait, the
gate's result as it travels through S3, a step's replay options as RunTask environment
overrides, and the error when a fleet never serves."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import boto3
import configargparse
import pytest
from moto import mock_aws

from analysis.capacity.search import StepPlan
from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate.fleets import CloudFleets
from campaign.backends.fargate.run import GATE_READY_TIMEOUT_S
from campaign.stages.capacity import step_options
from core import cloud_contract as cc
from core.manifest import load_manifest
from core.serving import served_model_id
from loadgen import gate_task
from loadgen.fixtures import FixtureResult, GateResult
from loadgen.gate_task import ENV_READY_TIMEOUT, wait_until_serving
from loadgen.replay_options import add_arguments, from_namespace, to_env
from tests.conftest import EXAMPLE_MANIFEST, ROOT
from tests.runtime.conftest import emulator_process

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


@pytest.fixture
def models_server() -> Iterator[dict[str, Any]]:
    """/v1/models answering 503, then a list without the model, then with it, per `state["answers"]`."""
    state: dict[str, Any] = {"answers": [], "calls": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answers = state["answers"]
            code, ids = answers[min(state["calls"], len(answers) - 1)]
            state["calls"] += 1
            body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()


def test_ready_once_the_model_list_names_the_served_model(models_server: dict[str, Any]) -> None:
    models_server["answers"] = [(503, []), (200, ["other-model"]), (200, [MODEL])]
    r = wait_until_serving(models_server["url"], MODEL, timeout_s=30, poll_s=0.01)
    assert r.ready and models_server["calls"] == 3
    assert MODEL in r.seen


def test_never_ready_says_what_the_last_probe_saw(models_server: dict[str, Any]) -> None:
    models_server["answers"] = [(200, ["other-model"])]
    r = wait_until_serving(models_server["url"], MODEL, timeout_s=0.2, poll_s=0.05)
    assert not r.ready and r.after_s <= 0.3
    assert "other-model" in r.seen and f"not {MODEL!r}" in r.seen
    refused = wait_until_serving(
        "http://127.0.0.1:9", MODEL, timeout_s=0.1, poll_s=0.05
    )  # nothing listens: the error is kept
    assert not refused.ready and "127.0.0.1:9/v1/models" in refused.seen


def test_gate_result_round_trips_through_json() -> None:
    g = GateResult(
        "inf2",
        False,
        0.5,
        1.0,
        [
            FixtureResult("a", True, [], "length", 32, "text", None),
            FixtureResult("b", False, ["output does not match '\\\\S'"], "stop", 0, "", False),
        ],
    )
    back = GateResult.from_dict(json.loads(json.dumps(g.as_dict())))
    assert back == g and back.failures == g.failures


def test_a_steps_options_reach_the_task_through_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What FargateSteps sets as RunTask overrides is what Locust parses back in the task."""
    m = load_manifest(EXAMPLE_MANIFEST)
    options = step_options(m, StepPlan(0.6484, 110.4, "bisect", skip_s=95.2))
    env = to_env(options)
    assert env["LOADGEN_SLO_DEADLINE"] == "true" and env["LOADGEN_NO_WARMUP"] == "true"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = configargparse.ArgumentParser()
    add_arguments(parser)
    assert from_namespace(parser.parse_args([])) == options


class _Run:
    """The gate's side of a CloudRun: its gate tasks' results; no target health to wait for
    (tests/cloud/test_cloud_steps.py waits for it against moto)."""

    elbv2 = None

    def __init__(self, results: dict[str, dict[str, Any]]) -> None:
        self.m = load_manifest(EXAMPLE_MANIFEST)
        self.cfg = SimpleNamespace(prometheus_url="")  # a stack without the workspace's query URL
        self.results = results
        self.asked: dict[str, float] = {}
        self.lines: list[str] = []

    def gate(self, timeouts: dict[str, float]) -> dict[str, dict[str, Any]]:
        self.asked = dict(timeouts)
        return self.results

    def say(self, line: str) -> None:
        self.lines.append(line)


def _passed(fleet: str) -> dict[str, Any]:
    return GateResult(fleet, True, 1.0, 1.0, [FixtureResult("a", True, [], "length", 32, "x")]).as_dict()


def test_a_fleet_that_never_serves_ends_the_run_naming_it() -> None:
    run = _Run(
        {
            "inf2": {
                "ready": False,
                "ready_after_s": 4500.0,
                "seen": "GET http://nlb/v1/models: HTTP 503",
                "gate": None,
            },
            "g6": {"ready": True, "ready_after_s": 300.0, "seen": "ok", "gate": _passed("g6")},
        }
    )
    with pytest.raises(CloudRunError, match=r"fleet inf2: not serving .* through its NLB 4500 s .*HTTP 503") as exc:
        CloudFleets(run).gate()  # type: ignore[arg-type]
    assert "g6" not in str(exc.value)
    # The health grace is `run`'s own wait for healthy targets; the gate task waits only for the
    # served model through the NLB once they are.
    assert run.asked == {"inf2": GATE_READY_TIMEOUT_S, "g6": GATE_READY_TIMEOUT_S}


def test_each_fleets_time_to_ready_is_kept_for_the_report() -> None:
    run = _Run(
        {
            "inf2": {"ready": True, "ready_after_s": 1800.0, "seen": "ok", "gate": _passed("inf2")},
            "g6": {"ready": True, "ready_after_s": 420.0, "seen": "ok", "gate": _passed("g6")},
        }
    )
    fleets = CloudFleets(run)  # type: ignore[arg-type]
    gates = fleets.gate()
    assert set(gates) == {"inf2", "g6"} and all(g.passed for g in gates.values())
    assert fleets.facts().ready_after_s == {"inf2": 1800.0, "g6": 420.0}
    assert fleets.facts().aws
    # No run-wide count: each replay and step counts the healthy targets it ran on (INSTANCES_FILE).
    assert fleets.facts().instances_measured == {}


THREE_FLEETS = ROOT / "manifests" / "llama3-8b-three-fleets.yaml"


def test_the_gate_finds_a_trtllm_fleet_serving_under_its_weights_directory_name() -> None:
    """trtllm-serve lists the model directory's name at /v1/models (it has no --served-model-name),
    the emulator's trtllm stack too: the gate task waits for that id and sends its fixtures with it.
    Waiting for model.repo, the g5 fleet never counted as ready."""
    m = load_manifest(THREE_FLEETS, check_files=False)
    served = served_model_id(m, m.fleet("g5"))
    assert served == m.model.commit != m.model.repo  # trtllm-serve serves /opt/cache/weights/<repo>/<commit>
    env = {
        cc.ENV_FLEET: "g5",
        cc.ENV_RESULTS_URI: "s3://results/campaigns/c/0123456789ab/runs",
        cc.ENV_RUN_ID: cc.new_run_id(),
        ENV_READY_TIMEOUT: "5",
    }
    with emulator_process(THREE_FLEETS, "g5") as url, mock_aws():
        assert gate_task.probe_models(url)[0] == [served]  # as trtllm-serve lists it
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="results")
        out = gate_task.run(m, {**env, cc.ENV_HOST: url}, s3)
        assert out["ready"], out["seen"]
        assert out["gate"] is not None and out["gate"]["passed"], out["gate"]
        key = f"campaigns/c/0123456789ab/runs/{env[cc.ENV_RUN_ID]}/{gate_task.gate_key('g5')}"
        assert json.loads(s3.get_object(Bucket="results", Key=key)["Body"].read())["ready"]
