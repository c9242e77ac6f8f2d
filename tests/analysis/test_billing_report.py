"""report.json's `billing`: the campaign cost planned, computed and billed side by side, each with its source."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from analysis.report.build import ReportInputs, build_report
from analysis.report.inputs import PlannedCost
from campaign.cli import report_cmds as cli
from campaign.plan.plan_file import RUN_DIR_PLAN, plan_document
from campaign.stages.run import RunFacts
from core import prices
from core.cloud_contract import LOADGEN_TASK_MEMORY_GIB, LOADGEN_TASK_VCPU
from core.manifest import Manifest, load_manifest
from tests.analysis.synth import manifest, steady, write_jsonl
from tests.conftest import write_manifest
from tests.quality import quality_results

PASS = quality_results({f: {"passed": True, "pass_rate": 1.0, "failures": []} for f in ("inf2", "g6")})
WALL = 1_700_000_000.0  # tests.analysis.synth's records' wall_start: 2023-11-14T22:13:20Z
PLAN = PlannedCost(
    12.5,
    240.0,
    "predicted (campaign plan, 2023-11-14T20:00:00Z; plan.json, dated by generated_at)",
    "2023-11-14T20:00:00Z",
)


@pytest.fixture
def small(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 1.0
    return manifest(manifest_data)


def _report(tmp_path: Path, m: Manifest, *, pages: bool = False, **kw: Any) -> dict[str, Any]:
    """report.json's data; `pages`: report.md and report.html beside it too (for a test that reads them)."""
    rec = tmp_path / "rec"
    write_jsonl(rec / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 600))
    write_jsonl(rec / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))
    inp = ReportInputs(
        m,
        rec,
        quality=PASS,
        out_dir=tmp_path / "out",
        instances_measured={"inf2": 1, "g6": 2},
        with_sensitivity=False,
        with_pages=pages,
        **kw,
    )
    return build_report(inp).model_dump(mode="json")


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _focus(path: Path, m: Manifest) -> Path:
    def row(start: float, hours: float, usd: float, fleet: str) -> str:
        tags = json.dumps({"campaign": m.campaign, "fleet": fleet}).replace('"', '""')
        return f'{_iso(start)},{usd},{usd},i-{fleet},"{tags}",Amazon EC2,,{_iso(start + hours * 3600)}\n'

    hour = WALL - WALL % 3600  # the UTC hour the window falls in
    path.write_text(
        "ChargePeriodStart,EffectiveCost,BilledCost,ResourceId,Tags,ServiceName,CommitmentDiscountId,ChargePeriodEnd\n"
        + row(hour, 1, 0.76, "inf2")
        + row(hour, 1, 1.61, "g6")
        + row(hour - 3600, 1, 9.0, "g6")  # the hour before: another run of the campaign
        + row(hour + 3600, 1, 9.0, "inf2"),  # the hour after
        encoding="utf-8",
    )
    return path


def test_plan_computed_and_billed_side_by_side_each_with_its_source(tmp_path: Path, small: Manifest) -> None:
    r = _report(tmp_path, small, planned_cost=PLAN, focus_csv=_focus(tmp_path / "focus.csv", small), pages=True)
    b = r["billing"]
    assert b["plan"]["usd"] == 12.5 and b["plan"]["date"] == "2023-11-14T20:00:00Z"
    assert "campaign plan" in b["plan"]["source"] and "240 min" in b["plan"]["covers"]

    region = small.costs.region

    def usd(kind: str, key: str) -> float:
        return prices.lookup(kind, key, region).usd

    task = LOADGEN_TASK_VCPU * usd("fargate", "vcpu-hour") + LOADGEN_TASK_MEMORY_GIB * usd("fargate", "gb-hour")
    # every instance deployed bills (4 per fleet: measure_instances), whatever the runner measured on (1 and 2 here)
    hourly = 4 * usd("instance", "inf2.xlarge") + 4 * usd("instance", "g6.xlarge") + usd("nlb", "hour")
    hourly += 2 * (small.loadgen.workers + 1) * task
    # synth's records: sends at 0 .. 99 s, the arrival window widened by n/(n-1) to 100 s; no run summaries
    hours = 100 / 3600
    assert b["computed"]["usd"] == pytest.approx(hourly * hours, abs=1e-4)
    assert (
        b["computed"]["source"].startswith("computed: unit prices")
        and b["computed"]["date"] == "2023-04-20 .. 2026-04-01"
    )
    assert (
        "measured window, 2023-11-14T22:13:20Z" in b["computed"]["covers"]
        and "deploy to teardown" in b["computed"]["covers"]
    )

    assert b["billed"]["usd"] == pytest.approx(0.76 + 1.61)  # the rows outside the window are left out
    assert b["billed"]["source"].startswith("billed: FOCUS export") and b["billed"]["unavailable"] is None
    assert b["focus"]["g6"]["rows"] == 1 and "billing.focus" in r["provenance"]

    page = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "## Campaign cost: planned, computed, billed" in page
    assert "| planned | 12.50 | predicted (campaign plan, 2023-11-14T20:00:00Z" in page
    assert "| billed | 2.37 | billed: FOCUS export" in page
    assert "Campaign cost: planned, computed, billed</h2>" in (tmp_path / "out" / "report.html").read_text(
        encoding="utf-8"
    )


def test_computed_cost_bills_every_instance_deployed_healthy_or_not(tmp_path: Path, small: Manifest) -> None:
    """Issue 46, finding 8: an instance out of the target group's healthy targets still bills. The
    runner counted 3 healthy inf2 instances of the 4 deployed (instances.json): the measured
    capacity is per those 3, the computed cost counts all 4 (until 2026-12 it counted 3)."""
    from core.records import INSTANCES_FILE

    (tmp_path / "rec").mkdir()
    counted = {
        "inf2": {"instances": 3, "source": "measured", "detail": "fewest healthy targets while the replay ran"},
        "g6": {"instances": 4, "source": "measured", "detail": "fewest healthy targets while the replay ran"},
    }
    (tmp_path / "rec" / INSTANCES_FILE).write_text(json.dumps(counted), encoding="utf-8")
    r = _report(tmp_path, small, planned_cost=PLAN)
    assert r["provenance"]["instances_measured.inf2"]["value"] == 3  # what the capacity is per
    region = small.costs.region
    inf2, g6 = (prices.lookup("instance", t, region).usd for t in ("inf2.xlarge", "g6.xlarge"))
    task = LOADGEN_TASK_VCPU * prices.lookup("fargate", "vcpu-hour", region).usd
    task += LOADGEN_TASK_MEMORY_GIB * prices.lookup("fargate", "gb-hour", region).usd
    tasks = 2 * (small.loadgen.workers + 1) * task
    assert [f.instances_deployed for f in small.fleets] == [4, 4]
    hourly = 4 * inf2 + 4 * g6 + prices.lookup("nlb", "hour", region).usd + tasks
    computed = r["billing"]["computed"]
    assert computed["usd"] == pytest.approx(hourly * 100 / 3600, abs=1e-4)  # synth's 100 s window
    assert "inf2: 4 x inf2.xlarge deployed" in computed["covers"]


def test_billed_is_unavailable_with_the_reason_when_no_source_answers(tmp_path: Path, small: Manifest) -> None:
    b = _report(tmp_path, small, planned_cost=PLAN, pages=True)["billing"]
    assert b["plan"]["usd"] == 12.5 and b["computed"]["usd"] > 0
    billed = b["billed"]
    assert billed["usd"] is None and billed["source"] == "billed: no billing source answered"
    assert "Cost Explorer: not asked" in billed["unavailable"] and "FOCUS: no export given" in billed["unavailable"]
    page = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "| billed | unavailable | billed: no billing source answered | n/a | unavailable: Cost Explorer" in page


def test_no_plan_and_no_billing_source_leaves_billing_null(tmp_path: Path, small: Manifest) -> None:
    assert _report(tmp_path, small)["billing"] is None


@mock_aws
def test_report_run_dir_takes_the_run_directorys_plan_and_a_focus_export_in_s3(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 1.0
    path = write_manifest(tmp_path, manifest_data)
    m = load_manifest(path, check_files=False)
    run = tmp_path / "run"
    write_jsonl(run / "records" / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 600))
    write_jsonl(run / "records" / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))
    RunFacts({"inf2": 1, "g6": 1}).write(run)
    plan = plan_document(
        m,
        [],
        {"campaign_minutes": 206.0, "campaign_usd": 31.4, "predicted_decision": "defer"},
        generated_at="2026-12-05T20:00:00Z",
    )
    (run / RUN_DIR_PLAN).write_text(json.dumps(plan), encoding="utf-8")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="results")
    s3.put_object(Bucket="results", Key="focus/export.csv", Body=_focus(tmp_path / "focus.csv", m).read_bytes())
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "report",
            str(path),
            "--run-dir",
            str(run),
            "--focus",
            "s3://results/focus/export.csv",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    args.handler(args)
    b = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))["billing"]
    assert b["plan"]["usd"] == 31.4 and "plan.json, dated by generated_at" in b["plan"]["source"]
    assert b["billed"]["usd"] == pytest.approx(0.76 + 1.61)
    assert b["billed"]["source"].startswith("billed: FOCUS export s3://results/focus/export.csv")
    assert b["computed"]["usd"] > 0


def test_billed_from_cost_explorer_says_it_covers_whole_utc_days(tmp_path: Path, small: Manifest) -> None:
    from botocore.stub import Stubber

    from analysis.report.inputs import AwsClients

    ce = boto3.client("ce", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    answer = {
        "ResultsByTime": [
            {
                "TimePeriod": {"Start": "2023-11-14", "End": "2023-11-15"},
                "Groups": [
                    {"Keys": ["fleet$inf2"], "Metrics": {"UnblendedCost": {"Amount": "18.2", "Unit": "USD"}}},
                    {"Keys": ["fleet$g6"], "Metrics": {"UnblendedCost": {"Amount": "19.3", "Unit": "USD"}}},
                ],
            }
        ]
    }
    with Stubber(ce) as stub:  # the records are from 2023: past HOURLY's 14 days, so whole days at once
        stub.add_response(
            "get_cost_and_usage",
            answer,
            {
                "TimePeriod": {"Start": "2023-11-14", "End": "2023-11-15"},
                "Granularity": "DAILY",
                "Metrics": ["UnblendedCost"],
                "Filter": {"Tags": {"Key": "campaign", "Values": [small.campaign], "MatchOptions": ["EQUALS"]}},
                "GroupBy": [{"Type": "TAG", "Key": "fleet"}],
            },
        )
        r = _report(tmp_path, small, aws=True, aws_clients=AwsClients(ce=ce))
    b = r["billing"]
    assert b["plan"] is None and b["cost_explorer"] == {"inf2": 18.2, "g6": 19.3}
    assert b["billed"]["usd"] == pytest.approx(37.5) and b["billed"]["date"] == "2023-11-14 .. 2023-11-15"
    assert b["billed"]["covers"].startswith("DAILY: the whole UTC days that hold the measured window")
    assert "DAILY 2023-11-14 .. 2023-11-15" in r["provenance"]["billing.cost_explorer"]["detail"]


def test_billed_from_a_cost_explorer_with_no_rows_is_unavailable_with_the_reason(
    tmp_path: Path, small: Manifest
) -> None:
    """No rows from Cost Explorer is a gap with its reason, never `billed: 0.0 USD` pulled (issue 46, finding 10)."""
    from botocore.stub import Stubber

    from analysis.report.inputs import AwsClients

    ce = boto3.client("ce", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    empty = {"ResultsByTime": [{"TimePeriod": {"Start": "2023-11-14", "End": "2023-11-15"}, "Groups": []}]}
    with Stubber(ce) as stub:
        stub.add_response("get_cost_and_usage", empty)
        r = _report(tmp_path, small, aws=True, aws_clients=AwsClients(ce=ce))
    billed = r["billing"]["billed"]
    assert billed["usd"] is None and billed["source"] == "billed: no billing source answered"
    assert billed["unavailable"].startswith(
        "Cost Explorer returned no rows for the run's tags (campaign=" + small.campaign + ", grouped by fleet) between "
        "2023-11-14 and 2023-11-15 (DAILY, end exclusive): cost-allocation tags may not be activated yet"
    )
    assert "billing.cost_explorer" not in r["provenance"] and r["billing"]["cost_explorer"] is None
    assert any(g["what"] == "billing.cost_explorer" and "no rows" in g["reason"] for g in r["gaps"])


def test_the_measured_window_runs_from_the_replays_first_request_to_the_last_step_summarys_end() -> None:
    from types import SimpleNamespace as NS

    from analysis.report.evidence import measured_window

    base = {
        "inf2": NS(wall_start=WALL, window_start_s=2.0, window_end_s=100.0),
        "g6": NS(wall_start=WALL + 1, window_start_s=0.5, window_end_s=90.0),
    }
    steps = [NS(ended_at=WALL + 700.0), NS(ended_at=WALL + 1500.0), NS(ended_at=0.0)]  # 0: a summary that says nothing
    got = measured_window(base, steps)  # type: ignore[arg-type]
    assert got is not None and (got.start, got.end) == (WALL + 1.5, WALL + 1500.0)
    assert got.words() == "2023-11-14T22:13:21Z .. 2023-11-14T22:38:20Z UTC (25.0 min)"
    assert measured_window(base, []).end == WALL + 100.0  # type: ignore[arg-type,union-attr]
    assert measured_window({"g6": NS(wall_start=None, window_start_s=None, window_end_s=None)}, steps) is None  # type: ignore[arg-type,dict-item]


# --- issue 48, finding 4: a bill that knows when it cannot know ------------------------------------


def test_a_focus_export_with_no_rows_for_the_run_is_no_figure_and_says_why(tmp_path: Path, small: Manifest) -> None:
    """An export whose rows are all another campaign's (or outside the window) is no bill known, not
    0 USD. On 63bedbd: billed 0.0 USD, "billed: FOCUS export ..."."""
    other = small.model_copy(update={"campaign": "another-campaign"})
    r = _report(tmp_path, small, focus_csv=_focus(tmp_path / "focus.csv", other))
    billed = r["billing"]["billed"]
    assert billed["usd"] is None, billed
    assert billed["source"] == "billed: no billing source answered"
    assert (
        f"has no rows tagged campaign={small.campaign} whose charge period meets the measured window"
        in (billed["unavailable"])
    )
    assert any(g["what"] == "billing.focus" and "no rows" in g["reason"] for g in r["gaps"])


@mock_aws
def test_a_focus_export_under_an_s3_prefix_is_read_part_by_part(tmp_path: Path, small: Manifest) -> None:
    """`--focus s3://BUCKET/PREFIX/`: every CSV part under it (AWS Data Exports may split an
    export). On 63bedbd the prefix was refused: BadBillingData "expected s3://BUCKET/KEY of one
    FOCUS export CSV", no report."""
    from analysis.errors import BadBillingData
    from analysis.report.inputs import AwsClients

    rows = _focus(tmp_path / "focus.csv", small).read_text(encoding="utf-8").splitlines(keepends=True)
    head, body = rows[0], rows[1:]
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="results")
    for i, part in enumerate((body[:2], body[2:]), start=1):  # the window's rows in part 1, the others in 2
        s3.put_object(Bucket="results", Key=f"exports/data/part-{i}.csv", Body="".join([head, *part]).encode())
    try:
        r = _report(tmp_path, small, focus_csv="s3://results/exports/", aws_clients=AwsClients(s3=s3))
    except BadBillingData as exc:
        r = {"billing": {"billed": {"usd": str(exc)}}}
    billed = r["billing"]["billed"]
    assert billed["usd"] == pytest.approx(0.76 + 1.61)
    assert billed["source"].startswith("billed: FOCUS export s3://results/exports/ (2 part(s))")


def test_an_estimated_bill_pulled_within_24_hours_is_flagged_and_its_requests_priced(
    tmp_path: Path, small: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cost Explorer's answer marked Estimated and pulled an hour after the window: the billed figure
    says it is provisional and which command fetches it again, and the report counts and prices the
    two paginated requests it took (0.01 USD each). On 63bedbd the figure read as final ("HOURLY: the
    whole UTC hours ...") and no request was counted."""
    from types import SimpleNamespace

    from botocore.stub import Stubber

    from analysis.report.inputs import AwsClients
    from analysis.sources import pulled

    monkeypatch.setattr(pulled, "time", SimpleNamespace(time=lambda: WALL + 3600))  # pulled an hour after

    def page(amount: str, fleet: str, token: str | None) -> dict[str, Any]:
        return {
            "ResultsByTime": [
                {
                    "TimePeriod": {"Start": "2023-11-14T22:00:00Z", "End": "2023-11-14T23:00:00Z"},
                    "Estimated": True,
                    "Groups": [
                        {"Keys": [f"fleet${fleet}"], "Metrics": {"UnblendedCost": {"Amount": amount, "Unit": "USD"}}}
                    ],
                }
            ],
            **({"NextPageToken": token} if token else {}),
        }

    ce = boto3.client("ce", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    with Stubber(ce) as stub:
        stub.add_response("get_cost_and_usage", page("0.8", "inf2", "next"))
        stub.add_response("get_cost_and_usage", page("1.6", "g6", None))
        r = _report(tmp_path, small, aws=True, aws_clients=AwsClients(ce=ce))
    billed = r["billing"]["billed"]
    assert billed["usd"] == pytest.approx(2.4)
    assert billed["covers"].startswith("PROVISIONAL: Cost Explorer marks it Estimated"), billed["covers"]
    assert "pulled 1.0 h after the window ended, less than the 24 h" in billed["covers"]
    assert "`python -m campaign report MANIFEST --run-id RUN_ID --out DIR`" in billed["covers"]
    assert any(g["what"] == "billing.billed" and "provisional" in g["reason"] for g in r["gaps"])
    requests = r["provenance"].get("billing.cost_explorer_requests") or {}
    assert requests.get("value") == pytest.approx(0.02)
    assert requests["detail"].startswith("2 Cost Explorer GetCostAndUsage request(s)")
