from __future__ import annotations

import json

from tests.stacks.conftest import Synth


def test_loadgen_cluster_has_enhanced_container_insights(example: Synth) -> None:
    (cluster,) = example.resources("AWS::ECS::Cluster").values()
    assert {"Name": "containerInsights", "Value": "enhanced"} in cluster["Properties"]["ClusterSettings"]


def test_prometheus_scrapes_every_fleet_and_the_loadgen_into_a_managed_workspace(example: Synth) -> None:
    assert len(example.resources("AWS::APS::Workspace")) == 1
    containers = [c for t in example.resources("AWS::ECS::TaskDefinition").values() for c in t["Properties"]["ContainerDefinitions"]]
    (prom,) = [c for c in containers if c["Name"] == "prometheus"]
    (env,) = [e for e in prom["Environment"] if e["Name"] == "PROMETHEUS_CONFIG"]
    text = json.dumps(env["Value"])
    for job in ("serving-inf2", "serving-g6", "loadgen-master", "loadgen-worker"):
        assert job in text
    assert "remote_write" in text and "sigv4" in text


def test_loadgen_master_and_workers_run_the_root_dockerfile_image(example: Synth) -> None:
    services = example.resources("AWS::ECS::Service")
    counts = sorted(s["Properties"]["DesiredCount"] for s in services.values())
    assert counts == [1, 1, 2]  # prometheus, master, manifest.loadgen.workers = 2
    assets = json.loads((example.outdir / "Comparison.assets.json").read_text(encoding="utf-8"))
    assert len(assets["dockerImages"]) == 1
    locust = [
        c for t in example.resources("AWS::ECS::TaskDefinition").values() for c in t["Properties"]["ContainerDefinitions"] if c["Name"] == "locust"
    ]
    assert len(locust) == 2
    for c in locust:
        names = {e["Name"] for e in c["Environment"]}
        assert {"HARNESS_MANIFEST_S3_URI", "HARNESS_TRACE_S3_URI", "HARNESS_RESULTS_S3_URI", "HARNESS_TARGETS"} <= names
        env = {e["Name"]: e["Value"] for e in c["Environment"]}
        assert env["LOADGEN_MANIFEST"] == "/app/manifests/llama3-8b-inf2-vs-g6.yaml"
        assert env["LOADGEN_FLEET"] == "inf2"
    # The image's CMD is --help: each role must be given explicitly.
    assert sorted(c["Command"] for c in locust) == [["--master"], ["--worker"]]
