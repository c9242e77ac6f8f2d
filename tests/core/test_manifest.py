from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from core.manifest import ManifestError, load_manifest
from tests.conftest import ROOT, write_manifest


def _issues(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as exc:
        load_manifest(write_manifest(tmp_path, data))
    return [str(i) for i in exc.value.issues]


def test_example_manifest_is_valid(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path)
    assert {f.name for f in m.fleets} == {"inf2", "g6"}
    assert m.trace_path.is_file()
    assert len(m.digest) == 64


def test_manifest_is_frozen(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path)
    with pytest.raises(ValidationError):
        m.campaign = "other"  # type: ignore[misc]


def test_digest_stable_across_key_order_and_whitespace(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    a = load_manifest(write_manifest(tmp_path, manifest_data, "a.yaml"))
    reordered = dict(reversed(list(manifest_data.items())))
    text = yaml.safe_dump(reordered, sort_keys=True, indent=4) + "\n# a comment\n\n"
    (tmp_path / "b.yaml").write_text(text)
    b = load_manifest(tmp_path / "b.yaml")
    assert a.digest == b.digest


def test_digest_changes_with_content(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    a = load_manifest(write_manifest(tmp_path, manifest_data, "a.yaml"))
    manifest_data["slo"]["ttft_p95_s"] = 2.5
    b = load_manifest(write_manifest(tmp_path, manifest_data, "b.yaml"))
    assert a.digest != b.digest


def test_indifference_margin_defaults_to_zero_and_leaves_the_digest_as_it_was(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    a = load_manifest(write_manifest(tmp_path, manifest_data, "a.yaml"))
    assert a.indifference_margin.usd(10_000.0) == 0.0
    manifest_data["indifference_margin"] = {"usd_per_month": 0}
    b = load_manifest(write_manifest(tmp_path, manifest_data, "b.yaml"))
    assert b.digest == a.digest  # a zero margin is the same comparison as none: old runs' records still match
    manifest_data["indifference_margin"] = {"percent_of_baseline": 5}
    c = load_manifest(write_manifest(tmp_path, manifest_data, "c.yaml"))
    assert c.digest != a.digest
    assert c.indifference_margin.usd(20_000.0) == 1_000.0  # 5% of a 20,000 USD/month baseline fleet
    manifest_data["indifference_margin"] = {"usd_per_month": 250}
    assert load_manifest(write_manifest(tmp_path, manifest_data, "d.yaml")).indifference_margin.usd(20_000.0) == 250.0


@pytest.mark.parametrize(
    ("margin", "expected"),
    [
        (
            {"usd_per_month": 100, "percent_of_baseline": 5},
            "indifference_margin: give usd_per_month or percent_of_baseline, not both",
        ),
        ({"usd_per_month": -1}, "indifference_margin.usd_per_month: Input should be greater than or equal to 0"),
        (
            {"percent_of_baseline": 120},
            "indifference_margin.percent_of_baseline: Input should be less than or equal to 100",
        ),
        ({"usd": 100}, "indifference_margin.usd: unknown field (typo?)"),
    ],
)
def test_a_bad_indifference_margin_names_the_field(
    tmp_path: Path, manifest_data: dict[str, Any], margin: dict[str, Any], expected: str
) -> None:
    manifest_data["indifference_margin"] = margin
    assert expected in _issues(tmp_path, manifest_data)


def test_max_campaign_hours_is_optional_and_never_in_the_digest(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data.pop("max_campaign_hours", None)
    a = load_manifest(write_manifest(tmp_path, manifest_data, "a.yaml"))
    assert a.max_campaign_hours is None  # a manifest written before the field loads unchanged
    manifest_data["max_campaign_hours"] = 12
    b = load_manifest(write_manifest(tmp_path, manifest_data, "b.yaml"))
    assert b.max_campaign_hours == 12.0
    assert b.digest == a.digest  # moving the deadline keeps the campaign's results prefix


@pytest.mark.parametrize(
    ("hours", "expected"),
    [
        (0, "max_campaign_hours: Input should be greater than 0"),
        (-3, "max_campaign_hours: Input should be greater than 0"),
        (24 * 14 + 1, "max_campaign_hours: Input should be less than or equal to 336"),
        ("soon", "max_campaign_hours: Input should be a valid number"),
    ],
)
def test_a_bad_max_campaign_hours_names_the_field(
    tmp_path: Path, manifest_data: dict[str, Any], hours: Any, expected: str
) -> None:
    manifest_data["max_campaign_hours"] = hours
    issues = _issues(tmp_path, manifest_data)
    assert any(i.startswith(expected) for i in issues), issues


def test_unknown_instance_type(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][1]["instance_type"] = "g7.mega"
    issues = _issues(tmp_path, manifest_data)
    assert any(i.startswith("fleets[1].instance_type: unknown instance type 'g7.mega'") for i in issues), issues


def test_tp_degree_3_on_inf2(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["instance_type"] = "inf2.24xlarge"
    manifest_data["fleets"][0]["tensor_parallel"] = 3
    issues = _issues(tmp_path, manifest_data)
    assert any(
        i.startswith("fleets[0].tensor_parallel: degree 3 not supported") and "{1, 2, 4, 8, 24}" in i for i in issues
    )


def test_tp_beyond_cores_of_instance(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["tensor_parallel"] = 4  # inf2.xlarge has 2 NeuronCores
    issues = _issues(tmp_path, manifest_data)
    assert any("fleets[0].tensor_parallel" in i and "2 NeuronCores" in i for i in issues), issues


def test_tp_not_dividing_heads(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["model"]["attention_heads"] = 30
    manifest_data["model"]["head_dim"] = 128
    manifest_data["fleets"][0]["instance_type"] = "inf2.48xlarge"
    manifest_data["fleets"][0]["tensor_parallel"] = 8
    issues = _issues(tmp_path, manifest_data)
    assert any(
        i.startswith("fleets[0].tensor_parallel: degree 8 does not divide the model's 30 attention heads")
        for i in issues
    )


def test_model_that_does_not_fit(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # 13B BF16: 24.2 GiB of weights cannot fit the 22 GiB an L4 shows on g6.xlarge.
    manifest_data["model"].update(
        params_b=13.0, layers=40, hidden_size=5120, attention_heads=40, kv_heads=40, head_dim=128
    )
    for f in manifest_data["fleets"]:
        f["max_concurrency"] = 1
    issues = _issues(tmp_path, manifest_data)
    assert any(i.startswith("fleets[1]: model does not fit g6.xlarge") for i in issues), issues
    # ...but it fits inf2.xlarge at TP=2 (32 GB HBM), the seed's example.
    assert not any(i.startswith("fleets[0]:") for i in issues), issues


def test_one_az_with_redundancy(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][1]["availability_zones"] = ["us-east-1a"]
    issues = _issues(tmp_path, manifest_data)
    assert "fleets[1].availability_zones: redundancy 1 asks for at least two AZs, got 1" in issues


def test_az_not_in_region(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["availability_zones"] = ["us-east-1a", "us-west-2b"]
    issues = _issues(tmp_path, manifest_data)
    assert "fleets[0].availability_zones[1]: 'us-west-2b' is not an AZ of region us-east-1" in issues


def test_short_commit_hash(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["model"]["commit"] = "339ce92"
    issues = _issues(tmp_path, manifest_data)
    assert any(i.startswith("model.commit:") and "abbreviated" in i for i in issues), issues


def test_missing_slo(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    del manifest_data["slo"]
    assert "slo: required field is missing" in _issues(tmp_path, manifest_data)


def test_missing_slo_field(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    del manifest_data["slo"]["itl_p95_s"]
    assert "slo.itl_p95_s: required field is missing" in _issues(tmp_path, manifest_data)


@pytest.mark.parametrize(
    ("section", "key", "path"),
    [
        ("workload", "rate_scale", "workload.rate_scale"),
        ("workload", "time_scale", "workload.time_scale"),
        ("migration", "loaded_rate_usd_per_hour", "migration.loaded_rate_usd_per_hour"),
        ("costs", "observability_monthly_usd", "costs.observability_monthly_usd"),
    ],
)
def test_negative_rates(tmp_path: Path, manifest_data: dict[str, Any], section: str, key: str, path: str) -> None:
    manifest_data[section][key] = -1
    issues = _issues(tmp_path, manifest_data)
    assert any(i.startswith(f"{path}: Input should be greater than") for i in issues), issues


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("campaign: x\nmodel:\n  repo: a/b\n  commit: [unclosed\nslo: {}\n")
    with pytest.raises(ManifestError) as exc:
        load_manifest(p)
    msg = str(exc.value.issues[0])
    assert msg.startswith("(yaml): line ") and "column" in msg
    assert "line 5" in msg or "line 4" in msg


def test_duplicate_key_is_an_error_not_a_silent_overwrite(tmp_path: Path) -> None:
    p = tmp_path / "dup.yaml"
    p.write_text("campaign: a\ncampaign: b\n")
    with pytest.raises(ManifestError) as exc:
        load_manifest(p)
    assert "duplicate key 'campaign' (first on line 1)" in str(exc.value)


def test_unknown_field_is_reported(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["slo"]["ttft_p99_s"] = 3
    assert "slo.ttft_p99_s: unknown field (typo?)" in _issues(tmp_path, manifest_data)


def test_world_open_operator_cidr(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["operator"]["cidr"] = "0.0.0.0/0"
    assert any(i.startswith("operator.cidr:") and "whole internet" in i for i in _issues(tmp_path, manifest_data))


@pytest.mark.parametrize("cidr", ["0.0.0.0/1", "128.0.0.0/1", "10.0.0.0/8", "198.18.0.0/15", "2001:db8::/32", "::/1"])
def test_operator_cidr_wider_than_the_minimum_prefix_is_refused(
    tmp_path: Path, manifest_data: dict[str, Any], cidr: str
) -> None:
    manifest_data["operator"]["cidr"] = cidr
    issues = [i for i in _issues(tmp_path, manifest_data) if i.startswith("operator.cidr:")]
    assert issues and "prefix" in issues[0] and cidr in issues[0], issues


@pytest.mark.parametrize(
    "cidr", ["203.0.113.0/24", "198.51.100.7/32", "172.16.0.0/16", "2001:db8:1::/48", "2001:db8::1/128"]
)
def test_operator_cidr_at_or_under_the_minimum_prefix_is_accepted(
    tmp_path: Path, manifest_data: dict[str, Any], cidr: str
) -> None:
    manifest_data["operator"]["cidr"] = cidr
    assert load_manifest(write_manifest(tmp_path, manifest_data)).operator.cidr == cidr


def test_trace_hash_mismatch(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["workload"]["trace"]["sha256"] = "0" * 64
    assert any(i.startswith("workload.trace.sha256: file hash") for i in _issues(tmp_path, manifest_data))


def test_every_issue_reported_at_once(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["instance_type"] = "nope.large"
    manifest_data["fleets"][1]["availability_zones"] = ["us-east-1a"]
    manifest_data["comparison"]["candidate"] = "trn1"
    issues = _issues(tmp_path, manifest_data)
    assert len(issues) >= 3


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "campaign", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`_cli` in this process: the exit code campaign.cli.main.main returns (campaign/__main__.py exits
    with it) and what it printed. A new interpreter costs seconds of imports; one test below keeps it."""
    from campaign.cli.main import main

    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["campaign", *args], code, out.out, out.err)


def test_cli_validate_ok(example_manifest_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _main(capsys, "validate", str(example_manifest_path))
    assert r.returncode == 0, r.stderr
    assert "digest=" in r.stdout


def test_cli_validate_bad_input_exits_2_without_traceback(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # a real `python -m campaign` process: the entry point's exit status and stderr, end to end
    manifest_data["fleets"][0]["tensor_parallel"] = 3
    manifest_data["model"]["commit"] = "abc123"
    p = write_manifest(tmp_path, manifest_data)
    r = _cli("validate", str(p))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "fleets[0].tensor_parallel:" in r.stderr
    assert "model.commit:" in r.stderr


def test_cli_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _main(capsys, "validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2
    assert "(file): cannot read" in r.stderr and "Traceback" not in r.stderr


def test_hub_token_must_be_a_full_secret_arn(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["model"]["hub_token_secret_arn"] = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token"
    assert any(i.startswith("model.hub_token_secret_arn:") for i in _issues(tmp_path, manifest_data))
    manifest_data["model"]["hub_token_secret_arn"] = (
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
    )
    assert load_manifest(write_manifest(tmp_path, manifest_data)).model.hub_token_secret_arn


def test_replicas_per_instance_defaults_to_one_and_fits_the_instance(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    assert all(f.replicas_per_instance == 1 for f in load_manifest(write_manifest(tmp_path, manifest_data)).fleets)
    fleet = manifest_data["fleets"][0]
    fleet.update(instance_type="inf2.48xlarge", tensor_parallel=8, replicas_per_instance=3)  # 24 NeuronCores: fits
    m = load_manifest(write_manifest(tmp_path, manifest_data, "three.yaml"))
    assert m.fleets[0].sequences_per_instance == 3 * m.fleets[0].max_concurrency
    fleet["replicas_per_instance"] = 4
    issues = _issues(tmp_path, manifest_data)
    assert (
        "fleets[0].replicas_per_instance: 4 replicas x tensor_parallel 8 need 32 NeuronCores; inf2.48xlarge has 24"
        in issues
    )
    fleet["replicas_per_instance"] = 0
    assert any(i.startswith("fleets[0].replicas_per_instance") for i in _issues(tmp_path, manifest_data))


def test_prefix_caching_is_explicit_in_the_examples_and_left_out_of_the_digest_at_the_stacks_default(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    from core import catalog

    for name in ("llama3-8b-inf2-vs-g6.yaml", "llama3-8b-three-fleets.yaml"):
        m = load_manifest(ROOT / "manifests" / name, check_files=False)
        for f in m.fleets:
            assert f.serving.prefix_caching is not None, f"{name}: {f.name} leaves prefix caching to the engine"
            assert f.serving.prefix_caching == catalog.PREFIX_CACHING_DEFAULT[f.serving.stack]
    a = load_manifest(write_manifest(tmp_path, manifest_data, "a.yaml"))
    for fleet in manifest_data["fleets"]:
        fleet["serving"].pop("prefix_caching", None)
    b = load_manifest(write_manifest(tmp_path, manifest_data, "b.yaml"))
    # Omitted or written out at the stack's default: the same digest (the example run's records still match).
    assert a.digest == b.digest
    assert [f.serving.resolved_prefix_caching for f in b.fleets] == [False, True]  # inf2 (vllm-neuron), g6 (vllm)
    manifest_data["fleets"][0]["serving"]["prefix_caching"] = True
    c = load_manifest(write_manifest(tmp_path, manifest_data, "c.yaml"))
    assert c.digest != a.digest and c.fleet("inf2").serving.resolved_prefix_caching


def test_prefix_caching_is_validated_with_its_path(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["serving"]["prefix_caching"] = "sometimes"
    assert any(i.startswith("fleets[0].serving.prefix_caching: ") for i in _issues(tmp_path, manifest_data))
    manifest_data["fleets"][0]["serving"]["prefix_caching"] = False
    manifest_data["fleets"][1]["serving"]["stack"] = "tgi"
    manifest_data["fleets"][1]["serving"]["prefix_caching"] = False
    issues = _issues(tmp_path, manifest_data)
    assert any(i.startswith("fleets[1].serving.prefix_caching: tgi") for i in issues), issues


def test_measure_instances_defaults_to_asg_desired_and_is_bounded_by_asg_max(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    for fleet in manifest_data["fleets"]:
        fleet.pop("measure_instances", None)
    fleet = manifest_data["fleets"][1]
    fleet["asg"] = {"min": 1, "max": 8, "desired": 3}
    a = load_manifest(write_manifest(tmp_path, manifest_data, "a.yaml"))
    assert a.fleets[1].measure_instances is None and a.fleets[1].instances_measured == 3
    fleet["asg"] = {"min": 0, "max": 8, "desired": 0}  # an ASG parked at 0 still measures one instance
    assert load_manifest(write_manifest(tmp_path, manifest_data, "z.yaml")).fleets[1].instances_measured == 1
    fleet["asg"] = {"min": 1, "max": 8, "desired": 3}
    fleet["measure_instances"] = 3  # written out at its default: the same digest (recorded runs still match)
    assert load_manifest(write_manifest(tmp_path, manifest_data, "b.yaml")).digest == a.digest
    fleet["measure_instances"] = 8
    c = load_manifest(write_manifest(tmp_path, manifest_data, "c.yaml"))
    assert c.fleets[1].instances_measured == 8 and c.digest != a.digest
    fleet["measure_instances"] = 9
    assert "fleets[1].measure_instances: 9 instances measured, more than asg.max 8" in _issues(tmp_path, manifest_data)
    fleet["measure_instances"] = 0
    assert any(i.startswith("fleets[1].measure_instances: ") for i in _issues(tmp_path, manifest_data))
    fleet["measure_instances"] = "two"
    assert any(i.startswith("fleets[1].measure_instances: ") for i in _issues(tmp_path, manifest_data))
