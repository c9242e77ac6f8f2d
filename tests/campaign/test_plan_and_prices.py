from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from campaign.aws.cloud_checks import cloud_issues
from campaign.plan.roofline import plan, render_text
from core import catalog, prices
from core.manifest import ManifestError, fit, load_manifest, manifest_from_data, semantic_issues
from runtime.emulator.timing import TimingModel
from tests.conftest import ROOT


def _seven_b(manifest_data: dict[str, Any]) -> dict[str, Any]:
    # The seed formula uses a 7B BF16 model: 14 GB of weights read per decoded token.
    manifest_data["model"].update(params_b=7.0)
    for f in manifest_data["fleets"]:
        f["efficiency"] = {"bandwidth": 1.0, "compute": 1.0}
    return manifest_data


def test_roofline_decode_ceiling_matches_seed(manifest_data: dict[str, Any]) -> None:
    m = manifest_from_data(_seven_b(manifest_data))
    by = {p.fleet: p for p in plan(m)}
    # Inferentia2: 820 GiB/s per chip (Neuron architecture docs), so 62.9 tok/s over 14e9 bytes;
    # the seed's 58.5 read the figure as 820 GB/s. L4: 300 GB/s, 21.4 tok/s.
    assert by["inf2"].decode_ceiling_tok_s == pytest.approx(820 * 2**30 / 14e9, rel=1e-3)
    assert by["g6"].decode_ceiling_tok_s == pytest.approx(300 / 14, rel=1e-3)
    assert by["inf2"].decode_ceiling_tok_s / by["g6"].decode_ceiling_tok_s == pytest.approx(
        820 * 2**30 / 1e9 / 300, rel=1e-6
    )


def test_efficiency_scales_expected_decode(manifest_data: dict[str, Any]) -> None:
    for f in manifest_data["fleets"]:
        f["efficiency"] = {"bandwidth": 0.7, "compute": 0.5}
    m = manifest_from_data(manifest_data)
    p = {p.fleet: p for p in plan(m)}["g6"]  # paged KV: batch 1 at context 0 reads the weights only
    assert p.decode_expected_tok_s == pytest.approx(p.decode_ceiling_tok_s * 0.7, rel=1e-6)
    assert p.efficiency_source == "manifest (assumed)"


def test_example_uses_the_fitted_calibration_and_plan_names_its_rows(manifest_data: dict[str, Any]) -> None:
    m = manifest_from_data(manifest_data)
    by = {p.fleet: p for p in plan(m)}
    fitted = catalog.calibrated_efficiency("neuron-nxd")
    assert "on-vllm-inf2-tp2-sync" in fitted.rows
    inf2 = by["inf2"]
    assert inf2.efficiency_source == fitted.provenance and "on-vllm-inf2-tp2-sync" in inf2.efficiency_source
    # batch-1 decode = one step of the compiled graph: weights + 16 slots x the 512 bucket of KV
    # (131,072 bytes a token) over the fitted bandwidth share, plus the fitted step overhead
    step = (16.06e9 + 16 * 512 * 131072) / (820 * 2**30 * fitted.bandwidth) + fitted.step_overhead_ms / 1000
    assert inf2.decode_expected_tok_s == pytest.approx(1 / step, rel=1e-3)
    # the ceiling is physics: the calibration does not move it
    assert inf2.decode_ceiling_tok_s == pytest.approx(820 * 2**30 / 16.06e9, rel=1e-3)
    text = render_text(m, plan(m))
    assert "from calibration 'neuron-nxd': fitted on on-vllm-inf2-tp2-sync" in text


def test_calibration_and_numbers_together_is_an_error(manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["efficiency"] = {"calibration": "neuron-nxd", "bandwidth": 0.5}
    with pytest.raises(ManifestError, match=r"fleets\[0\]\.efficiency: .*drop bandwidth"):
        manifest_from_data(manifest_data)
    manifest_data["fleets"][0]["efficiency"] = {"calibration": "no-such-group"}
    issues = semantic_issues(manifest_from_data(manifest_data), check_files=False)
    assert any(i.path == "fleets[0].efficiency.calibration" and "no-such-group" in i.reason for i in issues)
    manifest_data["fleets"][0]["efficiency"] = {"calibration": "nvidia-vllm"}  # fleet 0 is Inferentia2
    issues = semantic_issues(manifest_from_data(manifest_data), check_files=False)
    assert any(
        i.path == "fleets[0].efficiency.calibration" and "aws-neuron" not in i.reason and "nvidia" in i.reason
        for i in issues
    )


def test_batching_raises_throughput_but_not_linearly(manifest_data: dict[str, Any]) -> None:
    m = manifest_from_data(manifest_data)
    p = {p.fleet: p for p in plan(m)}["g6"]
    assert p.decode_expected_tok_s < p.batch_decode_tok_s < 16 * p.decode_expected_tok_s


def test_8b_bf16_fits_both_at_batch_1(manifest_data: dict[str, Any]) -> None:
    for f in manifest_data["fleets"]:
        f["max_concurrency"] = 1
    m = manifest_from_data(manifest_data)
    assert all(fit(m, f).fits for f in m.fleets)


def test_visible_memory_is_22_gib_on_g6_xlarge() -> None:
    it = catalog.instance("g6.xlarge")
    assert it.visible_gib(1) == 22.0
    assert it.accelerator.board_memory_gb == 24.0


def test_inf2_tp_degrees_follow_cores() -> None:
    assert catalog.instance("inf2.xlarge").tp_degrees == (1, 2)
    assert catalog.instance("inf2.48xlarge").tp_degrees == (1, 2, 4, 8, 24)
    with pytest.raises(catalog.UnknownInstanceType):
        catalog.instance("p5.48xlarge")


def test_snapshot_prices_carry_date_and_source() -> None:
    p = prices.instance_hourly("inf2.xlarge")
    assert p.usd == 0.7582 and p.as_of == "2023-04-20"
    assert "2023-04-20" in p.provenance
    assert prices.instance_hourly("g5.xlarge").usd == 1.006
    with pytest.raises(prices.PriceNotFound) as exc:
        prices.instance_hourly("g6.xlarge", region="eu-west-9")
    # The message reaches report.json as a gap: it names the file, not this machine's directories.
    assert "core/data/prices-eu-west-9.csv" in str(exc.value) and "prices-us-east-1.csv" in str(exc.value)
    assert str(prices.SNAPSHOT_DIR) not in str(exc.value)


def test_every_catalog_instance_has_a_snapshot_price() -> None:
    for name in catalog.CATALOG:
        assert prices.instance_hourly(name).usd > 0


def test_bad_snapshot_row_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "prices.csv"
    bad.write_text("kind,key,region,usd,unit,as_of,source\ninstance,x,us-east-1,abc,hour,2024-01-01,s\n")
    with pytest.raises(prices.PriceSnapshotError, match=r"prices.csv:2: usd: not a number"):
        prices._parse(bad)


def test_cli_plan_json(example_manifest_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # In this process, through the CLI's own entry (campaign.cli.main.main): what the command
    # prints is the subject, not the interpreter starting; test_plan_text_shows_the_host_memory_risk runs `python -m campaign plan`.
    from campaign.cli.main import main

    saved = tmp_path / "plan.json"
    code = main(["plan", str(example_manifest_path), "--json", "--save", str(saved), "--rehearsal"])
    r = capsys.readouterr()
    assert code == 0, r.err
    out = json.loads(r.out)
    m = load_manifest(example_manifest_path)
    assert out["manifest_digest"] == m.digest
    fleets = {f["fleet"]: f for f in out["fleets"]}
    assert fleets["inf2"]["hourly_usd"] == 0.7582 and fleets["inf2"]["fits"]
    assert fleets["g6"]["decode_ceiling_tok_s"] == pytest.approx(300e9 / (8.03e9 * 2), rel=1e-6)
    # the campaign in simulated time: its minutes, cost and decision, each the sum of its parts
    pred = out["prediction"]
    assert (
        out["predicted_decision"] in ("go", "defer", "reject")
        and out["predicted_decision"] == pred["predicted_decision"]
    )
    assert out["campaign_minutes"] == pytest.approx(sum(pred["minutes"].values()), abs=0.1)
    assert out["campaign_usd"] == pytest.approx(sum(pred["usd"].values()), abs=0.01)
    # the conductor (`run --detach`, 1 vCPU / 4 GiB on Fargate) bills while the fleets run, after the compile phase
    fargate = (
        prices.lookup("fargate", "vcpu-hour", m.costs.region).usd
        + 4 * prices.lookup("fargate", "gb-hour", m.costs.region).usd
    )
    running = (
        out["campaign_minutes"]
        - pred["minutes"].get("compile_phase_at_most", 0.0)
        - pred["minutes"].get("one_instance_check_at_most", 0.0)
    )
    assert pred["usd"]["conductor"] == pytest.approx(fargate * running / 60, abs=0.02)
    assert pred["minutes"]["ready_at_most"] == 75  # the Neuron fleet's health-check grace bounds the wait
    # The Neuron fleet's host memory is at risk: deploy compiles once first, on one inf2.8xlarge, while
    # every fleet is at 0 (16 GB of weights at the guide's 1 min per GB), and every instance fetches.
    from core.serving import definition_for

    key = definition_for(m, m.fleet("inf2")).compiled.key  # type: ignore[union-attr]
    (compile_line,) = [a for a in pred["assumptions"] if "compiled once" in a]
    assert compile_line.startswith("inf2: compiled once by deploy's compile phase on one inf2.8xlarge")
    assert "about 16 min for 16 GB" in compile_line
    assert f"compiled/{key}/" in compile_line and "fetches instead of compiling" in compile_line
    phase = fleets["inf2"]["compile_phase"]
    assert fleets["g6"]["compile_phase"] is None
    assert (phase["instance_type"], phase["host_memory_gib"], phase["hourly_usd"]) == ("inf2.8xlarge", 128, 1.9679)
    assert phase["minutes"] == 75 + 10 and "health-check grace, 75 min" in phase["minutes_source"]
    assert phase["usd"] == round(1.9679 * 85 / 60, 2) == pred["usd"]["compile.inf2"]
    assert pred["minutes"]["compile_phase_at_most"] == 85  # in campaign_minutes (the sum above)
    # Then one instance of inf2.xlarge on the published set, healthy within its 75-min grace, before
    # the group is sized (issue 50, item 2), priced at the fleet's own On-Demand price.
    inf2_hourly = pred["fleets"]["inf2"]["hourly_usd"]
    assert (phase["check_instance_type"], phase["check_minutes"]) == ("inf2.xlarge", 75)
    assert phase["check_usd"] == round(inf2_hourly * 75 / 60, 2) == pred["usd"]["one_instance_check.inf2"]
    assert pred["minutes"]["one_instance_check_at_most"] == 75
    # The fleets are at 0 during the compile phase and the check: each is paid for the rest only.
    paid_min = out["campaign_minutes"] - 85 - 75
    for name in ("inf2", "g6"):
        f = pred["fleets"][name]
        assert pred["usd"][f"instances.{name}"] == pytest.approx(
            f["hourly_usd"] * f["instances_deployed"] * paid_min / 60, abs=0.02
        )
    for name in ("inf2", "g6"):
        f = pred["fleets"][name]
        assert f["search_steps"] >= 2 and f["search_minutes"] > 0 and f["capacity_tok_s"] > 0
        assert "out of sample" in f["error_band"]  # the emulator's calibration error beside its prediction
    assert pred["minutes"]["capacity_searches"] == pytest.approx(
        max(f["search_minutes"] for f in pred["fleets"].values()), abs=0.1
    )
    # --rehearsal: the rehearsal's minutes, USD and host type beside the campaign's, each the sum of its parts
    # (tests/invariants/test_rehearsal_sum_of_parts.py computes them from their parts)
    reh = out["rehearsal"]
    assert (out["rehearsal_minutes"], out["rehearsal_usd"]) == (reh["rehearsal_minutes"], reh["rehearsal_usd"])
    assert out["rehearsal_minutes"] == pytest.approx(sum(reh["minutes"].values()), abs=1e-9)
    assert out["rehearsal_usd"] == pytest.approx(sum(reh["usd"].values()), abs=1e-9)
    assert out["rehearsal_minutes"] < 45 and out["rehearsal_usd"] < 5
    assert out["rehearsal_instance_type"] == reh["instance_type"] == "c6a.large"
    assert out["rehearsal_minutes"] < out["campaign_minutes"] and out["rehearsal_usd"] < out["campaign_usd"]
    # --save writes the same document; --from-plan reads each fleet's predicted boundary back from it
    from campaign.plan.plan_file import predicted_boundaries

    assert json.loads(saved.read_text()) == out
    assert predicted_boundaries(saved, m) == {
        name: f["search_bracket"][0] for name, f in pred["fleets"].items() if f["search_bracket"][0] is not None
    }


def test_plan_flags_weights_close_to_inf2_host_memory(manifest_data: dict[str, Any]) -> None:
    m = manifest_from_data(manifest_data)
    by = {p.fleet: p for p in plan(m)}
    # 8.03B x 2 bytes = 14.96 GiB on inf2.xlarge's 16 GiB of host memory.
    assert by["inf2"].host_memory_gib == 16
    warning = by["inf2"].host_memory_warning
    assert warning is not None and "weights 15.0 GiB are 93%" in warning and "16 GiB host memory" in warning
    # deploy compiles it first on a larger host and publishes under this fleet's key (it names inf2.xlarge).
    from core.serving import definition_for

    key = definition_for(m, m.fleet("inf2")).compiled.key  # type: ignore[union-attr]
    assert "`deploy` compiles it once first, on one inf2.8xlarge (128 GiB host)" in warning
    assert f"results bucket's compiled/{key}/ (this fleet's key: it names inf2.xlarge)" in warning
    assert by["inf2"].compile_phase is not None and by["inf2"].compile_phase.compiled_prefix == f"compiled/{key}/"
    assert by["g6"].host_memory_warning is None  # the GPU load path is not the reported risk
    assert by["g6"].compile_phase is None
    big = manifest_from_data(
        {
            **manifest_data,
            "fleets": [
                {**f, "instance_type": "inf2.8xlarge"} if f["name"] == "inf2" else f for f in manifest_data["fleets"]
            ],
        }
    )
    big_inf2 = {p.fleet: p for p in plan(big)}["inf2"]
    assert big_inf2.host_memory_warning is None and big_inf2.compile_phase is None  # 128 GiB host: compiles itself


def test_plan_says_deploy_refuses_a_model_no_instance_can_compile(manifest_data: dict[str, Any]) -> None:
    # 300B at bf16: above half of every inf2 host, inf2.48xlarge's 768 GiB included. (The fleet does
    # not fit its accelerators either; the host check is the plan's sentence about compiling.)
    manifest_data["model"]["params_b"] = 300.0
    m = manifest_from_data(manifest_data)
    inf2 = {p.fleet: p for p in plan(m)}["inf2"]
    assert inf2.compile_phase is None
    from core.serving import definition_for

    key = definition_for(m, m.fleet("inf2")).compiled.key  # type: ignore[union-attr]
    assert inf2.host_memory_warning is not None
    assert (
        "no Inferentia2 instance in core/catalog.py clears it at TP 2, so `deploy` refuses" in inf2.host_memory_warning
    )
    assert f"results bucket's compiled/{key}/<any name>/, COMPLETE written last" in inf2.host_memory_warning


def test_plan_text_shows_the_host_memory_risk(example_manifest_path: Path) -> None:
    # A process of its own: `python -m campaign plan` as a user runs it (the --json test calls main in-process).
    out = subprocess.run(
        [sys.executable, "-m", "campaign", "plan", str(example_manifest_path), "--no-simulate"],  # the roofline part
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    inf2 = out.stdout.split("\ng6:")[0]
    assert "host     AT RISK: weights 15.0 GiB are 93% of inf2.xlarge's 16 GiB host memory" in inf2
    assert (
        "  compile  once, before the fleet boots: 1 x inf2.8xlarge (128 GiB host), at most 85 min, "
        "2.79 USD at $1.9679/h (snapshot 2023-04-20" in inf2
    )
    assert "           minutes: the Neuron health-check grace, 75 min (core.cloud_contract.HEALTH_GRACE_MIN)" in inf2
    # Issue 50, item 2: beside it, the one instance on the fleet's own type that must serve the set.
    assert (
        "  check    then 1 x inf2.xlarge, the fleet's own type, on the published set, healthy in its target group "
        "before the group is sized: at most 75 min (its health grace), 0.95 USD (snapshot 2023-04-20" in inf2
    )
    assert "compile  " not in out.stdout.split("\ng6:")[1]


def test_plan_and_emulator_run_every_replica_of_an_instance(manifest_data: dict[str, Any]) -> None:
    one = manifest_from_data(manifest_data)
    manifest_data["fleets"][0].update(instance_type="inf2.48xlarge", tensor_parallel=8, replicas_per_instance=3)
    base = dict(
        manifest_data, fleets=[dict(manifest_data["fleets"][0], replicas_per_instance=1), manifest_data["fleets"][1]]
    )
    three, single = manifest_from_data(manifest_data), manifest_from_data(base)
    p3, p1 = plan(three)[0], plan(single)[0]
    assert p3.replicas_per_instance == 3 and p3.batch_decode_tok_s == pytest.approx(3 * p1.batch_decode_tok_s)
    assert p3.decode_expected_tok_s == pytest.approx(p1.decode_expected_tok_s)  # one request still runs on one replica
    assert "inf2.48xlarge (Inferentia2 x12), TP=8 x 3 replicas" in render_text(three, plan(three))
    assert "x 3 replicas" not in render_text(one, plan(one))
    assert TimingModel.for_fleet(three, three.fleets[0]).replicas == 3
    issues = cloud_issues(three)
    assert any(i.path == "fleets[0].replicas_per_instance" for i in issues)


def test_plan_batch_decode_on_neuron_reads_every_compiled_slot_over_its_bucket(manifest_data: dict[str, Any]) -> None:
    m = manifest_from_data(manifest_data)
    f = m.fleet("inf2")  # vllm-neuron, buckets 512 1024 2048 2560, max_concurrency 16
    rc = m.workload.request_class
    t = TimingModel.for_fleet(m, f)
    bucket = t.padded(int(rc.max_input_tokens + rc.max_output_tokens / 2))
    step = t.roofline.memory_s(16 * bucket, t.efficiency.bandwidth) + t.efficiency.step_overhead_ms / 1000
    assert {p.fleet: p for p in plan(m)}["inf2"].batch_decode_tok_s == pytest.approx(16 / step)


def test_the_plan_resumes_a_search_its_settle_phase_reopens(
    example_manifest_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`campaign plan` runs the live campaign's settle phase, reopened searches included: when the
    phase finds a sizing step missing pooled (the example's demo, 2026-12-05: inf2 x0.7071 held
    over 95 requests, missed over 237), the plan's search goes on below it, and the plan's
    predicted boundary (what `--from-plan` seeds the live search with) is the hold found there."""
    from analysis.capacity.settle_record import Reopened, SettleOutcome, SettleStop
    from analysis.capacity.steps import read_search_path
    from campaign.plan.predict import predict
    from campaign.stages import settle as settle_mod

    m = load_manifest(example_manifest_path)
    real = settle_mod.settle
    first: dict[str, str] = {}  # the sizing step the fake reopened, and its multiplier

    def reopening(*args: Any, **kwargs: Any) -> SettleOutcome:
        if first:
            return real(*args, **kwargs)
        path = read_search_path(args[2] / "inf2")  # capacity_root: the search as it stopped
        assert path is not None
        first["step"] = next(f"inf2/{s.label}" for s in path.steps if s.multiplier == path.held_multiplier)
        first["held"] = str(path.held_multiplier)
        return SettleOutcome(
            stopped=SettleStop.REOPENED,
            detail="as measured",
            delta_ci_before=None,
            delta_ci_after=None,
            decision_before="defer",
            decision_after="defer",
            reopened={"inf2": Reopened(step=first["step"], why="as measured")},
        )

    monkeypatch.setattr(settle_mod, "settle", reopening)
    pred = predict(m, tmp_path)
    held, missed = pred.fleets["inf2"].search_bracket
    assert missed == pytest.approx(float(first["held"]))  # the reopened step is now the miss
    assert held is not None and missed is not None and held < missed
    assert pred.settle is not None and pred.settle["stopped"] != "reopened"


def test_the_step_overhead_is_measured_from_an_earlier_run_or_assumed(tmp_path: Path) -> None:
    from analysis.capacity.steps import write_search_path
    from analysis.model import SearchPath, SearchStep, StopRule, Verdict
    from campaign.plan.predict import STEP_OVERHEAD_S, StepOverhead
    from core.errors import CampaignError

    assert StepOverhead() == StepOverhead(STEP_OVERHEAD_S, "assumed")
    for fleet, overheads in (("inf2", [30.0, 70.0]), ("g6", [50.0, None])):
        steps = [
            SearchStep(f"x{i + 1}", i + 1.0, "t", 10.0, Verdict.HELD, 72, 10.0, 7.2, 2.0, 1.0, 0.05, 0.0, overhead_s=o)
            for i, o in enumerate(overheads)
        ]
        write_search_path(
            SearchPath(fleet, tuple(steps), 2.0, None, StopRule.CONVERGED, "", 0.1), tmp_path / "capacity" / fleet
        )
    got = StepOverhead.measured_in(tmp_path)
    assert got.seconds == 50.0 and got.source == f"measured: the median of 3 steps of {tmp_path}"
    with pytest.raises(CampaignError, match="no capacity step with a measured overhead"):
        StepOverhead.measured_in(tmp_path / "nothing")


def test_the_plan_prices_the_prometheus_task_for_the_whole_campaign(manifest_data: dict[str, Any]) -> None:
    """Issue 46, finding 8: stacks/observability.py's Prometheus service runs one Fargate task of
    PROMETHEUS_TASK_VCPU vCPU and PROMETHEUS_TASK_MEMORY_GIB GiB (tests/stacks hold both to the
    template) from deploy to teardown, as the NLB does; the plan's USD counts it (until 2026-12 it
    did not, while the report's computed cost said the plan counts it)."""
    from campaign.plan.predict import _cost
    from core.cloud_contract import PROMETHEUS_TASK_MEMORY_GIB, PROMETHEUS_TASK_VCPU

    m = manifest_from_data(manifest_data)
    region = m.costs.region
    hourly = PROMETHEUS_TASK_VCPU * prices.lookup("fargate", "vcpu-hour", region).usd
    hourly += PROMETHEUS_TASK_MEMORY_GIB * prices.lookup("fargate", "gb-hour", region).usd
    usd = _cost(m, {}, total_min=240.0, load_min=12.0)
    assert usd.get("prometheus_task") == pytest.approx(hourly * 4)  # 240 min: 4 hours
    assert usd["nlb"] == pytest.approx(prices.lookup("nlb", "hour", region).usd * 4)


def test_the_plan_prices_the_weights_through_the_nat_gateway(example_manifest_path: Path) -> None:
    """Issue 50, item 4: the weights come from the Hub through the NAT gateway at every boot unless
    `deploy --weights-s3-uri`; the plan prices that at the NAT's per-GB rate and names the way out."""
    from types import SimpleNamespace

    from campaign.aws.compile_estimate import compile_phase
    from campaign.plan.predict import _cost
    from core.manifest import weight_bytes

    m = load_manifest(example_manifest_path, check_files=False)
    # what _cost reads of each fleet's prediction
    preds: dict[str, Any] = {
        name: SimpleNamespace(fleet=name, hourly_usd=1.0, instances_deployed=4) for name in ("inf2", "g6")
    }
    compiles = [c for c in (compile_phase(m, f) for f in m.fleets) if c is not None]
    usd = _cost(m, preds, total_min=240.0, load_min=12.0, compiles=compiles)
    boots = 4 + 4 + 1  # every fleet instance deployed, and the inf2 compile instance
    assert prices.lookup("network", "nat-gb", m.costs.region).usd == 0.045
    assert usd.get("nat_weights") == pytest.approx(weight_bytes(m) / 1e9 * boots * 0.045)
