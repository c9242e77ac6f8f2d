"""95% intervals in the report: P95s with n, capacity propagated to size, cost, delta and payback,
and Defer when an interval straddles a decision threshold (the Go threshold first, then 0), with
the evidence that would settle it (decision.to_settle)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.report.build import ReportInputs, build_report
from analysis.report.measurement import measure, read_records
from core import stats
from core.manifest import Manifest
from tests.analysis.synth import manifest, rec, steady, write_jsonl
from tests.quality import quality_results

PASS = quality_results(
    {
        "inf2": {"passed": True, "pass_rate": 1.0, "failures": []},
        "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
    }
)
KW: dict[str, Any] = {"quality": PASS, "instances_measured": {"inf2": 1, "g6": 1}, "with_sensitivity": False}


@pytest.fixture
def big(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:  # steady() keeps one request in flight: saturated at max_concurrency 1
        f["asg"]["max"] = 40
        f["max_concurrency"] = 1
    return manifest(manifest_data)


def _varied_inf2(m: Manifest, n: int = 100) -> list[Any]:
    # output lengths 20 and 1,780 alternating: mean 900 tok/s, a wide bootstrap interval on the sum
    return [rec(m, "inf2", i, tokens=1780 if i % 2 else 20) for i in range(n)]


def _report(tmp_path: Path, m: Manifest, g6_tokens: int, n: int = 100, *, pages: bool = False) -> dict[str, Any]:
    """report.json's data; `pages`: report.md and report.html beside it too (for a test that reads them)."""
    d = tmp_path / f"rec-{g6_tokens}-{n}"
    write_jsonl(d / "records-inf2-w0.jsonl", _varied_inf2(m, n))
    write_jsonl(d / "records-g6-w0.jsonl", steady(m, "g6", n, g6_tokens))
    return build_report(
        ReportInputs(m, d, out_dir=tmp_path / f"out-{g6_tokens}-{n}", with_pages=pages, **KW)
    ).model_dump(mode="json")


def test_p95_intervals_and_n_by_hand(tmp_path: Path, big: Manifest) -> None:
    d = tmp_path / "rec"
    write_jsonl(d / "records-inf2-w0.jsonl", [rec(big, "inf2", i, tokens=900, ttft=0.01 * (i + 1)) for i in range(100)])
    write_jsonl(d / "records-g6-w0.jsonl", steady(big, "g6", 100, 300))
    r = build_report(ReportInputs(big, d, out_dir=tmp_path / "out", **KW)).model_dump(mode="json")
    f = r["fleets"]["inf2"]
    # TTFTs 0.01 .. 1.00: nearest-rank P95 is the 95th (0.95); n = 100 gives order statistics 90 and 100
    assert f["p95_ttft_s"] == pytest.approx(0.95) and f["p95_ttft_n"] == 100
    assert f["p95_ttft_ci_s"] == pytest.approx([0.90, 1.00])
    assert f["p95_itl_ci_s"] == pytest.approx([0.05, 0.05]) and f["p95_itl_n"] == 100
    # identical output lengths: the bootstrap of the token sum has no spread, nor has anything downstream
    assert f["capacity_ci_tok_s"] == pytest.approx([900.0, 900.0])
    assert r["monthly_delta_ci_usd"] == pytest.approx([r["monthly_delta_usd"]] * 2)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "0.950 [0.900, 1.000] n=100" in md
    assert "0.950 [0.900, 1.000] n=100" in (tmp_path / "out" / "report.html").read_text()


def test_capacity_interval_propagates_to_size_cost_delta_and_payback(tmp_path: Path, big: Manifest) -> None:
    r = _report(tmp_path, big, 820)
    inf2, g6 = r["fleets"]["inf2"], r["fleets"]["g6"]
    low, high = inf2["capacity_ci_tok_s"]
    assert low < 900.0 < high  # around the point: 90,000 tokens over the 100 s window
    demand = r["demand_tok_s"]
    assert demand == pytest.approx(20 * (900 + 820) / 2)
    # required = ceil(demand / (capacity x 0.8)) + 1 redundancy, at each end of the capacity interval
    assert inf2["instances_required_ci"] == [math.ceil(demand / (high * 0.8)) + 1, math.ceil(demand / (low * 0.8)) + 1]
    assert g6["instances_required_ci"] == [g6["instances_required"]] * 2  # identical requests: no spread
    c_cheap, c_dear = inf2["monthly_cost_ci_usd"]
    b_cheap, b_dear = g6["monthly_cost_ci_usd"]
    assert c_cheap <= inf2["monthly_cost_usd"] <= c_dear
    assert r["monthly_delta_ci_usd"] == pytest.approx([b_cheap - c_dear, b_dear - c_cheap])
    # The point says the candidate is cheaper; its interval reaches below 0 and above the Go threshold (migration
    # cost / 12 months): Defer at the Go threshold, the action, naming the evidence that settles it, not at 0.
    go = r["decision"]["go_threshold_usd_per_month"]
    assert go == pytest.approx(r["migration_cost_usd"] / 12)
    assert r["monthly_delta_ci_usd"][0] < 0 < r["monthly_delta_usd"] < go < r["monthly_delta_ci_usd"][1]
    assert r["decision"]["state"] == "defer"
    [why] = [x for x in r["decision"]["reasons"] if x.startswith("evidence insufficient")]
    assert why.startswith("evidence insufficient at the Go threshold") and "straddles 0" not in why
    assert "fleets move in whole instances: the requests at each capacity boundary" in why and "(now 100)" in why
    ts = r["decision"]["to_settle"]
    assert ts["threshold"] == "go" and ts["whole_instances"]
    # g6's identical requests give its capacity no spread: its count is the point's at both ends, so
    # no requests there move the delta; inf2's high end must come down past its next instance boundary.
    assert ts["requests"]["g6"] == 100 and ts["requests"]["inf2"] > 100


def test_a_negative_delta_whose_interval_straddles_zero_defers_instead_of_rejecting(
    tmp_path: Path, big: Manifest
) -> None:
    r = _report(tmp_path, big, 1000)
    assert r["monthly_delta_usd"] < 0 < r["monthly_delta_ci_usd"][1]
    assert r["decision"]["state"] == "defer"
    assert not any("<= 0" in x for x in r["decision"]["reasons"])


def test_a_payback_interval_across_the_horizon_defers_a_point_go(tmp_path: Path, big: Manifest) -> None:
    r = _report(tmp_path, big, 640)
    low, high = r["payback_months_ci"]
    assert r["monthly_delta_ci_usd"][0] > 0  # the sign is settled
    assert low < r["payback_months"] < 12 < high  # the point is inside the horizon, the interval is not
    assert r["decision"]["state"] == "defer"
    # a payback interval across the horizon is a delta interval across the Go threshold: the low end misses the
    # threshold priced at that end (its own migration cost, pessimistic payback x low end, over 12 months)
    d_low = r["monthly_delta_ci_usd"][0]
    assert d_low < high * d_low / 12
    [why] = [x for x in r["decision"]["reasons"] if x.startswith("evidence insufficient")]
    assert why.startswith("evidence insufficient at the Go threshold") and "(decision.to_settle)" in why
    assert r["decision"]["to_settle"]["threshold"] == "go"


def test_too_few_requests_for_a_bounded_p95_leave_the_pessimistic_end_unknown(tmp_path: Path, big: Manifest) -> None:
    r = _report(tmp_path, big, 560, n=40, pages=True)
    f = r["fleets"]["inf2"]
    assert f["p95_ttft_ci_s"][1] is None and f["p95_ttft_n"] == 40  # 0.95^40 > 0.025: no order statistic bounds it
    assert f["capacity_ci_tok_s"][0] is None and f["instances_required_ci"][1] is None
    assert r["decision"]["state"] == "defer"
    why = " ".join(r["decision"]["reasons"])
    assert (
        "held the SLO only at its point estimate" in why
        and "a sizing step holds the SLO with 95% confidence once" in why
    )
    md = (tmp_path / "out-560-40" / "report.md").read_text()
    assert "[0.500, unbounded] n=40" in md  # a P95 the sample cannot bound
    assert "| [unknown, " in md  # a capacity whose low end no step established


def _step(m: Manifest, fleet: str, rate: float, tokens: int, slow: int = 0) -> list[Any]:
    """`rate` requests/s for 100 s, each lasting 1/rate s; the last `slow` requests wait 3 s for their first token."""
    n = round(100 * rate)
    out = []
    for i in range(n):
        r = rec(m, fleet, i, tokens=tokens, e2e=1 / rate, ttft=3.0 if i >= n - slow else 0.5)
        out.append(replace(r, scheduled_s=i / rate, sent_s=i / rate))
    return out


def test_a_step_that_holds_the_slo_only_at_its_point_lowers_the_capacity_to_a_step_that_surely_does(
    tmp_path: Path,
    manifest_data: dict[str, Any],
) -> None:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:
        f["asg"]["max"] = 80
        f["max_concurrency"] = 1
    m = manifest(manifest_data)
    dirs = {}
    for label, rate, slow in (("x1", 1.0, 0), ("x2", 2.0, 4)):
        d = tmp_path / label
        for fleet in ("inf2", "g6"):
            write_jsonl(d / f"records-{fleet}-w0.jsonl", _step(m, fleet, rate, 300, slow))
        dirs[label] = d
    rep = tmp_path / "replay"
    for fleet in ("inf2", "g6"):
        write_jsonl(rep / f"records-{fleet}-w0.jsonl", _step(m, fleet, 1.0, 200))  # 200 tok/s: surely inside, below x1
    r = build_report(ReportInputs(m, rep, out_dir=tmp_path / "out", capacity_dirs=dirs, **KW)).model_dump(mode="json")
    g6 = r["fleets"]["g6"]
    # x2: 200 requests, 4 of them at 3 s: the nearest-rank P95 (190th) is 0.5 s, inside the 2 s SLO, so x2 is the
    # capacity (196 x 300 / 100 s = 588 tok/s); but order statistic 197, the interval's high end, is 3 s: not surely.
    assert g6["capacity"]["step"] == "x2" and g6["capacity"]["per_instance_tok_s"] == pytest.approx(588.0)
    low, high = g6["capacity_ci_tok_s"]
    # the low end is x1's (100 identical requests, 300 tok/s, surely inside the SLO); the high end x2's bootstrap
    assert low == pytest.approx(300.0) and high >= 588.0
    assert "the low end is step x1" in g6["intervals"]["capacity_note"]
    assert g6["intervals"]["basis"] == "x2" and g6["intervals"]["basis_p95_ttft"]["ci"] == [0.5, 3.0]
    # The borrowed low end moves with x2's requests only once x2 holds with 95% confidence: 4 of 200 over
    # the target bound the P95 within it at core.stats.n_to_hold(200, 4) requests (decision.to_settle).
    inp = ReportInputs(m, rep, out_dir=tmp_path / "out2", capacity_dirs=dirs, **KW)
    iv = measure(inp, read_records(inp), {"inf2": 1, "g6": 1}).intervals(1.0)["g6"]
    assert iv.low_borrowed and iv.hold_requests == stats.n_to_hold(200, 4) and (iv.hold_requests or 0) > 200
    # every step's P95s carry their interval and n in the JSON and in the capacity tables
    x2 = next(s for s in g6["capacity"]["steps"] if s["label"] == "x2")
    assert x2["p95_ttft_n"] == 200 and x2["p95_ttft_ci_s"] == [0.5, 3.0]
    assert "| 0.500 [0.500, 3.000] n=200 |" in (tmp_path / "out" / "report.md").read_text()
    assert "0.500 [0.500, 3.000] n=200" in (tmp_path / "out" / "report.html").read_text()


def _fixed_ledger(data: dict[str, Any], go_threshold: float) -> None:
    """A migration costing 12 x `go_threshold` whatever the fleets cost: no dual run or rollback priced from them."""
    fixed = (80 + 40 + 16) * 120 + 500 + 1000  # the example's labor, tooling and training
    data["migration"].update(dual_run_days=0, rollback_retention_days=0, testing_usd=12 * go_threshold - fixed)


def test_an_interval_across_the_go_threshold_is_settled_at_it_not_at_zero(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """The issue's shape: a positive point below the Go threshold, an interval from below 0 to above it. The
    decision is open at the Go threshold (whether to migrate), and the evidence aims there, not at the delta's sign."""
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:
        f["asg"]["max"] = 40
        f["max_concurrency"] = 1
    first = _report(tmp_path / "a", manifest(manifest_data), 820)
    delta, (low, high) = first["monthly_delta_usd"], first["monthly_delta_ci_usd"]
    assert low < 0 < delta < high
    go = delta + (high - delta) / 2  # the threshold halfway between the point and the high end
    _fixed_ledger(manifest_data, go)
    r = _report(tmp_path / "b", manifest(manifest_data), 820, pages=True)
    assert (r["monthly_delta_usd"], r["monthly_delta_ci_usd"]) == (delta, [low, high])  # the ledger moves no fleet cost
    dec = r["decision"]
    assert dec["state"] == "defer"
    whys = [x for x in dec["reasons"] if x.startswith("evidence insufficient")]
    assert not any("straddles 0" in x for x in whys), whys  # the old code aimed here: "about N requests ... settle it"
    [why] = whys
    assert why.startswith(
        f"evidence insufficient at the Go threshold: monthly delta {delta:,.2f} USD, 95% CI [{low:,.2f}, {high:,.2f}] "
        f"USD straddles the Go threshold {go:,.2f} USD/month (migration {12 * go:,.2f} USD / 12 months"
    ), why
    assert r["migration_cost_usd"] == pytest.approx(12 * go) and dec["go_threshold_usd_per_month"] == pytest.approx(go)
    ts = dec["to_settle"]
    # by hand: the high end's reach above the point over the point's distance below the threshold, squared: 2^2 = 4
    # (about: the threshold is the ledger's sum / 12, so 100 x 4 may round up to 401)
    factor = ((high - delta) / (dec["go_threshold_usd_per_month"] - delta)) ** 2
    assert ts["threshold"] == "go" and ts["factor"] == pytest.approx(4.0) and ts["factor"] == pytest.approx(factor)
    need = math.ceil(100 * factor)
    assert need in (400, 401)
    # g6's identical requests give its capacity no spread: no requests there move the delta (whole instances)
    assert ts["requests"] == {"inf2": need, "g6": 100} and not ts["lower_bound"]
    # 100 requests over a 100 s arrival span: 1 req/s; one instance each, at the snapshot's On-Demand price, and
    # one Locust master + 2 workers per fleet, each 1 vCPU x 0.04048 + 2 GiB x 0.004445 USD/h
    minutes = (need - 100) / 1.0 / 60
    task = 0.04048 + 2 * 0.004445
    assert ts["minutes"] == pytest.approx(minutes)
    assert ts["usd"] == pytest.approx(minutes / 60 * (0.7582 + 3 * task))
    assert r["provenance"]["prices.fargate_vcpu_hour"]["value"] == 0.04048
    out = tmp_path / "b" / "out-820-100"
    for page in ("report.md", "report.html"):
        text = (out / page).read_text()
        assert (
            "Rule: Go when the monthly delta&#x27;s 95% low end" in text
            or "Rule: Go when the monthly delta's 95% low end" in text
        )
        assert (
            f"To settle it at the Go threshold ({go:,.2f} USD/month: migrate or not): inf2 {need:,} (now 100)" in text
        )


def test_an_indifference_margin_in_percent_of_the_baseline_raises_the_go_threshold(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:
        f["asg"]["max"] = 40
        f["max_concurrency"] = 1
    manifest_data["indifference_margin"] = {"percent_of_baseline": 5}
    r = _report(tmp_path, manifest(manifest_data), 640)
    g6_month = r["fleets"]["g6"]["monthly_cost_usd"]
    assert r["decision"]["go_threshold_usd_per_month"] == pytest.approx(r["migration_cost_usd"] / 12 + 0.05 * g6_month)
    assert "+ indifference margin " in " ".join(r["decision"]["reasons"])
