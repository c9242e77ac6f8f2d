"""Every answer the report pulls is kept with the run (pulled/<source>.json), so `report --run-dir`
after teardown rebuilds the run's report with no network (issue 46, finding 10).

The live report pulls from fakes: CloudWatch, Auto Scaling, ELBv2, Cost Explorer and the Price
List API as plain objects answering as boto3 does, and a loopback Prometheus answering the replay
window's queries. The rebuild's AWS clients raise on every call and the Prometheus is shut down."""

from __future__ import annotations

import datetime as dt
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import AnalysisError
from analysis.report.inputs import AwsClients
from campaign.stages.run import RunFacts, report_from_run_dir, run_report, write_quality
from core.manifest import Manifest
from tests.analysis.synth import manifest, steady, write_jsonl
from tests.quality import quality_results

PASS = quality_results({f: {"passed": True, "pass_rate": 1.0, "failures": []} for f in ("inf2", "g6")})
LAUNCHED = dt.datetime(2023, 11, 14, 21, 0, tzinfo=dt.UTC)
IN_SERVICE = {"inf2": 2.0, "g6": 3.0}
BILLED = {"inf2": 1.25, "g6": 2.5}
BUCKETS = {"0.1": "60", "0.25": "100", "+Inf": "100"}  # P95 = 0.1 + 0.15 * 35 / 40 = 0.23125
HITS, QUERIES = 30.0, 120.0  # the server's prefix-cache hit rate: 0.25


class Gone:
    """A client after teardown: every call fails, and is counted."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise ConnectionError(f"{name}: the network is gone")

        return call


class Pages:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages

    def paginate(self, **_: Any) -> list[dict[str, Any]]:
        return self.pages


class FakeAutoscaling:
    def __init__(self, campaign: str) -> None:
        self.campaign = campaign

    def get_paginator(self, name: str) -> Pages:
        if name == "describe_auto_scaling_groups":
            groups = [
                {
                    "AutoScalingGroupName": f"asg-{f}",
                    "Tags": [{"Key": "campaign", "Value": self.campaign}, {"Key": "fleet", "Value": f}],
                }
                for f in ("inf2", "g6")
            ]
            return Pages([{"AutoScalingGroups": groups}])
        assert name == "describe_scaling_activities"
        return Pages(
            [
                {
                    "Activities": [
                        {
                            "Description": "Launching a new EC2 instance: i-0000000000000000a",
                            "StatusCode": "Successful",
                            "StartTime": LAUNCHED,
                        }
                    ],
                    "ResponseMetadata": {"RequestId": "r-1"},
                }
            ]
        )


class FakeElbv2:
    ARN = "arn:aws:elasticloadbalancing:us-east-1:1:targetgroup/tg-{}/0a"
    LB = "arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/net/nlb/1b"

    def __init__(self, campaign: str) -> None:
        self.campaign = campaign

    def get_paginator(self, name: str) -> Pages:
        assert name == "describe_target_groups"
        return Pages(
            [
                {
                    "TargetGroups": [
                        {"TargetGroupArn": self.ARN.format(f), "LoadBalancerArns": [self.LB]} for f in ("inf2", "g6")
                    ]
                }
            ]
        )

    def describe_tags(self, ResourceArns: list[str]) -> dict[str, Any]:
        fleet = {self.ARN.format(f): f for f in ("inf2", "g6")}
        return {
            "TagDescriptions": [
                {
                    "ResourceArn": a,
                    "Tags": [{"Key": "campaign", "Value": self.campaign}, {"Key": "fleet", "Value": fleet[a]}],
                }
                for a in ResourceArns
            ]
        }


class FakeCloudWatch:
    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        out = []
        for q in MetricDataQueries:
            metric = q["MetricStat"]["Metric"]
            asg = metric["Dimensions"][0]["Value"]
            value = IN_SERVICE[asg.removeprefix("asg-")] if metric["MetricName"] == "GroupInServiceInstances" else 61.5
            out.append({"Id": q["Id"], "Values": [value, value]})
        return {"MetricDataResults": out}

    def get_paginator(self, name: str) -> Pages:  # HealthyHostCount: healthy from 4 minutes after the launch
        assert name == "get_metric_data"
        minutes = [LAUNCHED + dt.timedelta(minutes=k) for k in range(6)]
        return Pages([{"MetricDataResults": [{"Id": "healthy", "Timestamps": minutes, "Values": [0, 0, 0, 0, 1, 1]}]}])


class FakeCe:
    def get_cost_and_usage(self, **_: Any) -> dict[str, Any]:
        groups = [
            {"Keys": [f"fleet${f}"], "Metrics": {"UnblendedCost": {"Amount": str(usd)}}} for f, usd in BILLED.items()
        ]
        return {"ResultsByTime": [{"Groups": groups}]}


class FakePricing:
    """An On-Demand price for each instance type; nothing for the rest (the snapshot answers)."""

    def get_products(self, Filters: list[dict[str, str]], **_: Any) -> dict[str, Any]:
        itype = next((f["Value"] for f in Filters if f["Field"] == "instanceType"), None)
        if itype is None:
            return {"PriceList": []}
        dim = {"unit": "Hrs", "pricePerUnit": {"USD": "0.7777"}, "description": f"{itype} test price"}
        doc = {
            "product": {"sku": f"SKU-{itype}", "attributes": {"usagetype": f"BoxUsage:{itype}"}},
            "terms": {"OnDemand": {"t": {"priceDimensions": {"d": dim}}}},
        }
        return {"PriceList": [json.dumps(doc)]}


def _answer(query: str, at: str) -> list[dict[str, Any]]:
    """The fake Prometheus's answer to one instant query, by its shape."""
    if "prefix_cache_hits" in query:
        return [{"metric": {}, "value": [float(at), str(HITS)]}]
    if "prefix_cache_queries" in query:
        return [{"metric": {}, "value": [float(at), str(QUERIES)]}]
    if query.startswith("count(count_over_time("):
        return [{"metric": {}, "value": [float(at), "1"]}]
    if "sum by (le, instance)" in query:
        return [{"metric": {"instance": "i-1"}, "value": [float(at), "0.2"]}]
    if query.startswith("histogram_quantile("):
        return [{"metric": {}, "value": [float(at), "0.23125"]}]
    if query.startswith("sum by (le)"):
        return [{"metric": {"le": le}, "value": [float(at), n]} for le, n in BUCKETS.items()]
    return []


@pytest.fixture
def prometheus() -> Iterator[tuple[str, ThreadingHTTPServer, list[str]]]:
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            params = dict(urllib.parse.parse_qsl(parts.query))
            asked.append(params["query"])
            result = _answer(params["query"], params["time"])
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the loop's next poll: 0.05 s, not the default 0.5 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server, asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def small(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 1.0
    return manifest(manifest_data)


def _run_dir(tmp_path: Path, m: Manifest, url: str) -> Path:
    run = tmp_path / "run"
    write_jsonl(run / "records" / "records-inf2-w0.jsonl", steady(m, "inf2", 60, 600))
    write_jsonl(run / "records" / "records-g6-w0.jsonl", steady(m, "g6", 60, 450))
    # what a cloud run's campaign.json says: AWS and the stack's Prometheus, scraped every 5 s
    RunFacts({}, aws=True, prometheus_url=url, scrape_interval_s=5.0).write(run)
    write_quality(run, dict(PASS))
    return run


def _use_clients(monkeypatch: pytest.MonkeyPatch, clients: AwsClients) -> None:
    monkeypatch.setattr(AwsClients, "from_session", classmethod(lambda cls, region: clients))


def test_report_run_dir_after_teardown_gives_the_runs_figures_from_the_pulled_answers(
    tmp_path: Path,
    small: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    prometheus: tuple[str, ThreadingHTTPServer, list[str]],
) -> None:
    url, server, asked = prometheus
    m = small
    run = _run_dir(tmp_path, m, url)
    _use_clients(
        monkeypatch,
        AwsClients(
            pricing=FakePricing(),
            cloudwatch=FakeCloudWatch(),
            autoscaling=FakeAutoscaling(m.campaign),
            elbv2=FakeElbv2(m.campaign),
            ce=FakeCe(),
        ),
    )
    facts = RunFacts.read(run)
    assert facts is not None
    facts.prometheus_url = url  # as the cloud run's facts carry it (campaign.json does not)
    live = run_report(m, run, run, PASS, facts, None, None).model_dump(mode="json")  # the run's own report
    assert asked and live["cloudwatch"]["inf2"]["instances_in_service"] == 2.0  # the fakes answered
    server.shutdown()  # teardown: the stack's Prometheus and every AWS answer are gone
    calls: list[str] = []
    gone = Gone(calls)
    _use_clients(monkeypatch, AwsClients(pricing=gone, cloudwatch=gone, autoscaling=gone, elbv2=gone, ce=gone))

    again = report_from_run_dir(m, run, run).model_dump(mode="json")  # report --run-dir RUN --out RUN

    assert again["cloudwatch"] == live["cloudwatch"]
    assert again["cloudwatch"]["g6"]["instances_in_service"] == 3.0
    assert again["time_to_ready"] == live["time_to_ready"]
    assert again["time_to_ready"]["inf2"]["seconds"] == 240.0
    assert again["prometheus"] is not None and again["prometheus"]["fleets"] == live["prometheus"]["fleets"]
    assert again["prometheus"]["fleets"]["inf2"]["client_ttft"]["p95_s_merged_histogram"] == 0.23125
    assert [again["prefix_cache"]["fleets"][f]["server_hit_rate"] for f in ("inf2", "g6")] == [0.25, 0.25]
    assert again["billing"] == live["billing"]
    assert again["billing"]["billed"]["usd"] == 3.75
    for f in m.fleets:
        price = f"prices.instance.{f.instance_type}"
        assert again["provenance"][price] == live["provenance"][price]
        assert again["provenance"][price]["source"] == "pulled" and again["provenance"][price]["value"] == 0.7777
    from testing.cloud_offline import VOLATILE
    from testing.json_diff import report_differences

    compared, differences = report_differences(live, again, VOLATILE)  # field by field, but for when it was built
    assert differences == [] and compared > 500
    assert calls == []  # no AWS call: every answer came from pulled/
    kept = {p.name for p in (run / "pulled").iterdir()}
    assert kept == {"cloudwatch.json", "time_to_ready.json", "billing.json", "prices.json", "prometheus.json"}


def test_report_run_id_asks_for_the_bill_again_and_keeps_the_new_answer_with_its_date(
    tmp_path: Path,
    small: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    prometheus: tuple[str, ThreadingHTTPServer, list[str]],
) -> None:
    """The bill pulled minutes after the run may be refreshed later (Cost Explorer, up to 24 h):
    `report --run-id` asks again (pull_again), `report --run-dir` reads the run's, dated."""
    url, _, _ = prometheus
    m = small
    run = _run_dir(tmp_path, m, url)
    clients = AwsClients(
        cloudwatch=FakeCloudWatch(), autoscaling=FakeAutoscaling(m.campaign), elbv2=FakeElbv2(m.campaign), ce=FakeCe()
    )
    _use_clients(monkeypatch, clients)
    first = report_from_run_dir(m, run, tmp_path / "first", pull_again=("billing",))
    assert first.billing is not None and first.billing.billed is not None and first.billing.billed.usd == 3.75
    saved = json.loads((run / "pulled" / "billing.json").read_text())
    monkeypatch.setitem(BILLED, "g6", 4.0)  # the bill as refreshed a day later
    later = report_from_run_dir(m, run, tmp_path / "later", pull_again=("billing",))
    assert later.billing is not None and later.billing.billed is not None and later.billing.billed.usd == 5.25
    kept = report_from_run_dir(m, run, tmp_path / "kept")  # --run-dir: the last answer pulled, as dated
    assert kept.billing is not None and kept.billing.billed is not None and kept.billing.billed.usd == 5.25
    again = json.loads((run / "pulled" / "billing.json").read_text())
    assert again["pulled_at"] >= saved["pulled_at"]
    assert f"pulled {again['pulled_at_utc']}" in kept.provenance["billing.cost_explorer"].detail


def test_a_pulled_file_that_is_not_one_is_refused_naming_the_file_and_field(
    tmp_path: Path, small: Manifest, prometheus: tuple[str, ThreadingHTTPServer, list[str]]
) -> None:
    url, _, _ = prometheus
    run = _run_dir(tmp_path, small, url)
    facts = RunFacts.read(run)
    assert facts is not None
    facts.aws, facts.prometheus_url = False, url
    run_report(small, run, run, PASS, facts, None, None)
    path = run / "pulled" / "prometheus.json"
    body = json.loads(path.read_text())
    del body["calls"][0]["answer"]
    path.write_text(json.dumps(body))
    with pytest.raises(AnalysisError, match=r"prometheus\.json: calls\[0\]: .*one of answer or failed"):
        report_from_run_dir(small, run, tmp_path / "again")


def test_the_run_lists_its_capacity_steps_as_the_rebuilt_report_does(tmp_path: Path, small: Manifest) -> None:
    """The run hands the report its steps in the order it measured them (fleets one after the
    other: inf2/x1, g6/x1, g6/x2); `report --run-dir` finds them in its directory's order. The
    offline engine run's rebuilt report differed from the run's in provenance.capacity_sweep."""
    m = small
    run = tmp_path / "run"
    for f in ("inf2", "g6"):
        write_jsonl(run / "records" / f"records-{f}-w0.jsonl", steady(m, f, 60, 500))
    measured = {}
    for label in ("inf2/x1", "g6/x1", "g6/x2"):
        fleet = label.split("/")[0]
        measured[label] = run / "capacity" / label
        write_jsonl(measured[label] / f"records-{fleet}-w0.jsonl", steady(m, fleet, 30, 500))
    facts = RunFacts({"inf2": 1, "g6": 1})
    facts.write(run)
    write_quality(run, dict(PASS))
    live = run_report(m, run, run, PASS, facts, measured, None)
    again = report_from_run_dir(m, run, run)
    assert again.provenance["capacity_sweep"].detail == live.provenance["capacity_sweep"].detail
    assert live.provenance["capacity_sweep"].detail.startswith("g6/x1: ")
