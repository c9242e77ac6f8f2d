"""The headline never shows figures the report marks invalid; sensitivity cells stay inside the evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analysis.report.build import AwsClients, ReportInputs, build_report
from analysis.sources.pricing import parse_reserved
from tests.analysis.synth import manifest, steady, write_jsonl
from tests.quality import quality_results

PASS = quality_results(
    {
        "inf2": {"passed": True, "pass_rate": 1.0, "failures": []},
        "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
    }
)


def _records(d: Path, m: Any) -> Path:
    write_jsonl(d / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 900))
    write_jsonl(d / "records-g6-w0.jsonl", steady(m, "g6", 100, 300))
    return d


def _data(manifest_data: dict[str, Any], max_concurrency: int) -> dict[str, Any]:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:
        f["asg"]["max"] = 40
        f["max_concurrency"] = max_concurrency  # steady() keeps one request in flight
    return manifest_data


def test_figures_resting_on_a_blocking_gap_are_not_decided(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(_data(manifest_data, 16))  # one request in flight of 16: both fleets unsaturated, sizes only bounds
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
        )
    ).model_dump(mode="json")
    h = r["headline"]
    assert h["decided"] is False and any(x.startswith("saturation.inf2") for x in h["blocked_by"])
    assert (
        h["monthly_delta_usd"] is None
        and h["payback_months"] is None
        and h["instances_required"] == {"inf2": None, "g6": None}
    )
    assert r["monthly_delta_usd"] is not None  # still computed and traceable in the JSON, just not headlined
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Monthly delta, fleet size and payback: **not decided**" in md and "Blocked by:" in md
    assert f"{r['monthly_delta_usd']:,.2f}" not in md.split("## Fleets")[0]
    assert "| not decided | not decided | not decided |" in md
    page = (tmp_path / "out" / "report.html").read_text()
    assert "not decided" in page and "saturation.inf2" in page


def test_a_valid_headline_shows_its_figures(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(_data(manifest_data, 1))
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
        )
    ).model_dump(mode="json")
    assert r["headline"]["decided"] is True and r["headline"]["monthly_delta_usd"] == r["monthly_delta_usd"]
    assert (
        f"Monthly delta (baseline - candidate): {r['monthly_delta_usd']:,.2f} USD"
        in (tmp_path / "out" / "report.md").read_text()
    )


def test_rate_cells_without_commitments_say_so_and_every_cell_shows_its_reasons(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = manifest(_data(manifest_data, 1))
    assert not m.costs.commitments
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
        )
    ).model_dump(mode="json")
    cells = {c["label"]: c for c in r["sensitivity"]["cells"]}
    for label in ("covered", "renewal"):
        c = cells[label]
        assert c["decision"] == "no commitment in the manifest", c
        assert c["reasons"] == [
            f"no commitment in the manifest: {f} has none in costs.commitments and the price source "
            f"lists no Reserved rate, which the {label} rate needs"
            for f in ("inf2", "g6")
        ]
        assert c["monthly_delta_usd"] is None
    assert cells["On-Demand"]["decision"] == r["decision"]["state"] == "go"
    md = (tmp_path / "out" / "report.md").read_text()
    page = (tmp_path / "out" / "report.html").read_text()
    assert (
        "| covered | no commitment in the manifest | n/a | n/a | no commitment in the manifest: inf2 has none in "
        "costs.commitments and the price source lists no Reserved rate, which the covered rate needs; "
        "no commitment in the manifest: g6 has none"
    ) in md
    for c in r["sensitivity"]["cells"]:  # every cell's reasons are on both pages
        for why in c["reasons"]:
            assert why in md and why.replace("'", "&#x27;") in page


def test_rate_cells_with_a_commitment_are_priced(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    data = _data(manifest_data, 1)
    data["costs"]["commitments"] = [
        {
            "fleet": "inf2",
            "kind": "savings-plan",
            "covered_instances": 2,
            "effective_hourly_usd": 0.5,
            "term_months": 12,
            "renewal_hourly_usd": 0.55,
        }
    ]
    m = manifest(data)
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            with_pages=False,
        )
    ).model_dump(mode="json")
    cells = {c["label"]: c for c in r["sensitivity"]["cells"]}
    assert cells["covered"]["reasons"] == [
        "no commitment in the manifest: g6 has none in costs.commitments and the price source "
        "lists no Reserved rate, which the covered rate needs"
    ]
    data["costs"]["commitments"].append(
        {
            "fleet": "g6",
            "kind": "reserved-instance",
            "covered_instances": 10,
            "effective_hourly_usd": 0.5,
            "term_months": 12,
        }
    )
    m = manifest(data)
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "o2",
            instances_measured={"inf2": 1, "g6": 1},
            with_pages=False,
        )
    ).model_dump(mode="json")
    covered = next(c for c in r["sensitivity"]["cells"] if c["label"] == "covered")
    # every instance at its fleet's effective covered rate: inf2 0.5/h and g6 0.5/h, so only the counts differ
    inf2_n, g6_n = (covered["fleets"][f]["instances_required"] for f in ("inf2", "g6"))
    assert covered["monthly_delta_usd"] is not None and covered["decision"] in {"go", "defer", "reject"}
    per_instance = 0.5 * 730 + 250 * 0.08  # compute + EBS (150 GiB root, as deployed, + 100 GiB cache)
    assert covered["monthly_delta_usd"] == pytest.approx((g6_n - inf2_n) * per_instance)


def _doc(instance_type: str, on_demand: str, reserved: dict[tuple[str, str, str], str]) -> str:
    """A GetProducts PriceList element shaped like AWS's: On-Demand and Reserved terms of one SKU."""

    def dims(code: str, usd: str, unit: str = "Hrs") -> dict[str, Any]:
        return {f"{code}.D": {"unit": unit, "pricePerUnit": {"USD": usd}, "description": f"{usd} {unit}"}}

    res = {}
    for i, ((lease, option, klass), usd) in enumerate(reserved.items()):
        code = f"SKU{instance_type}.R{i}"
        res[code] = {
            "termAttributes": {"LeaseContractLength": lease, "PurchaseOption": option, "OfferingClass": klass},
            "priceDimensions": {**dims(code, usd), **dims(code + "U", "0", "Quantity")},
        }
    return json.dumps(
        {
            "product": {
                "sku": f"SKU{instance_type}",
                "attributes": {"instanceType": instance_type, "usagetype": "BoxUsage"},
            },
            "terms": {"OnDemand": {"OD": {"priceDimensions": dims("OD", on_demand)}}, "Reserved": res},
        }
    )


class _FakePricing:
    """Answers GetProducts by the instanceType filter; anything else (EBS, NLB) has no listing, so the snapshot answers."""

    def __init__(self, docs: dict[str, str]):
        self.docs = docs

    def get_products(self, **kw: Any) -> dict[str, Any]:
        itype = next((f["Value"] for f in kw["Filters"] if f["Field"] == "instanceType"), None)
        return {"PriceList": [self.docs[itype]] if itype in self.docs else []}


def test_parse_reserved_picks_the_one_year_no_upfront_standard_hourly_rate() -> None:
    doc = _doc(
        "inf2.xlarge",
        "0.7582",
        {
            ("1yr", "No Upfront", "standard"): "0.4800",
            ("3yr", "No Upfront", "standard"): "0.3300",
            ("1yr", "No Upfront", "convertible"): "0.5500",
            ("1yr", "All Upfront", "standard"): "0.0000",
        },
    )
    got = parse_reserved([doc])
    assert [p.usd for p in got] == [0.48] and got[0].unit == "Hrs"


def test_rate_cells_use_the_price_sources_reserved_rate_when_the_manifest_has_none(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    data = _data(manifest_data, 1)
    data["costs"]["price_source"] = "price-list-api"
    m = manifest(data)
    docs = {
        "inf2.xlarge": _doc("inf2.xlarge", "0.7582", {("1yr", "No Upfront", "standard"): "0.4800"}),
        "g6.xlarge": _doc("g6.xlarge", "0.8048", {("1yr", "No Upfront", "standard"): "0.5100"}),
    }
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            aws_clients=AwsClients(pricing=_FakePricing(docs)),
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert r["provenance"]["prices.instance-reserved-1yr-no-upfront.inf2.xlarge"]["source"] == "pulled"
    covered = next(c for c in r["sensitivity"]["cells"] if c["label"] == "covered")
    inf2_n, g6_n = (covered["fleets"][f]["instances_required"] for f in ("inf2", "g6"))
    ebs = 250 * 0.08  # root (150, as deployed) + cache GiB x the snapshot's gp3 GB-month (the fake lists no EBS price)
    # every instance at its listed Reserved rate; the fleet-level lines (NLB, inter-AZ, observability) cancel in the delta
    assert covered["monthly_delta_usd"] == pytest.approx(g6_n * (0.51 * 730 + ebs) - inf2_n * (0.48 * 730 + ebs))
    assert covered["decision"] in {"go", "defer", "reject"}


def _steps(m: Any, fleet: str, rate: float, tokens: int, ttft: float) -> list[Any]:
    """`rate` requests/s for 100 s, each lasting 1/rate s, every one with this TTFT."""
    from dataclasses import replace

    from tests.analysis.synth import rec

    n = round(100 * rate)
    return [
        replace(rec(m, fleet, i, tokens=tokens, e2e=1 / rate, ttft=ttft), scheduled_s=i / rate, sent_s=i / rate)
        for i in range(n)
    ]


def test_a_tighter_slo_cell_uses_the_step_that_held_it_and_no_extrapolation(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    data = _data(manifest_data, 1)
    for f in data["fleets"]:
        f["asg"]["max"] = 80
    m = manifest(data)
    # both fleets: x1 at TTFT 0.5 s (holds 2 s and 1.5 s), x2 at TTFT 1.8 s (holds 2 s, not 1.5 s); g6 never holds 1.0 s
    dirs = {}
    for label, rate, ttft in (("x1", 1.0, 0.5), ("x2", 2.0, 1.8)):
        write_jsonl(tmp_path / label / "records-inf2-w0.jsonl", _steps(m, "inf2", rate, 900, ttft))
        write_jsonl(tmp_path / label / "records-g6-w0.jsonl", _steps(m, "g6", rate, 300, ttft))
        dirs[label] = tmp_path / label
    rep = tmp_path / "replay"
    write_jsonl(rep / "records-inf2-w0.jsonl", _steps(m, "inf2", 1.0, 900, 1.8))
    write_jsonl(rep / "records-g6-w0.jsonl", _steps(m, "g6", 1.0, 300, 1.8))
    r = build_report(
        ReportInputs(
            m,
            rep,
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            capacity_dirs=dirs,
            with_pages=False,
        )
    ).model_dump(mode="json")
    demand = 20.0 * (900 + 300) / 2  # 12,000 tok/s, pooled over the replay
    # manifest SLO: x2 holds -> inf2 1,800 tok/s: ceil(12,000 / 1,440) = 9, + 1 = 10; g6 600: ceil(25) = 25, + 1 = 26
    assert r["fleets"]["inf2"]["instances_required"] == 10 and r["fleets"]["g6"]["instances_required"] == 26
    tight = next(c for c in r["sensitivity"]["cells"] if c["label"] == "SLO tighter (x0.75)")
    # x0.75 (1.5 s): only x1 holds -> inf2 900 tok/s: ceil(12,000 / 720) = 17, + 1 = 18; g6 300: ceil(50) = 50, + 1 = 51
    assert r["demand_tok_s"] == demand
    assert tight["fleets"]["inf2"]["instances_required"] == 18 and tight["fleets"]["g6"]["instances_required"] == 51
    assert tight["decision"] in {"go", "defer", "reject"} and tight["monthly_delta_usd"] is not None


def test_a_gate_that_could_not_be_evaluated_defers_and_says_so(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    from analysis.report.build import build_gate_report

    m = manifest(manifest_data)
    quality = quality_results(
        {
            "inf2": {"passed": None, "pass_rate": None, "failures": ["task acceptance: the scorer exited 1"]},
            "g6": PASS["g6"],
        }
    )
    r = build_gate_report(m, quality, out_dir=tmp_path / "out", with_pages=False).model_dump(mode="json")
    assert r["decision"]["state"] == "defer"
    assert r["decision"]["reasons"][0] == "evidence incomplete: no quality-gate result for inf2"
    assert r["gaps"][0]["reason"] == "no load was replayed: the quality gate could not be evaluated for inf2"
    assert r["headline"]["decided"] is False and r["monthly_delta_usd"] is None
