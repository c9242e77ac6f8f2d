"""The headline never shows figures the report marks invalid; sensitivity cells stay inside the evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis.report import build_report
from tests.analysis.synth import manifest, steady, write_jsonl

PASS = {"inf2": {"passed": True, "pass_rate": 1.0, "failures": []}, "g6": {"passed": True, "pass_rate": 1.0, "failures": []}}


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
    r = build_report(m, _records(tmp_path / "rec", m), quality=PASS, out_dir=tmp_path / "out",
                     instances_measured={"inf2": 1, "g6": 1}, with_sensitivity=False)
    h = r["headline"]
    assert h["decided"] is False and any(x.startswith("saturation.inf2") for x in h["blocked_by"])
    assert h["monthly_delta_usd"] is None and h["payback_months"] is None and h["instances_required"] == {"inf2": None, "g6": None}
    assert r["monthly_delta_usd"] is not None  # still computed and traceable in the JSON, just not headlined
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Monthly delta, fleet size and payback: **not decided**" in md and "Blocked by:" in md
    assert f"{r['monthly_delta_usd']:,.2f}" not in md.split("## Fleets")[0]
    assert "| not decided | not decided | not decided |" in md
    page = (tmp_path / "out" / "report.html").read_text()
    assert "not decided" in page and "saturation.inf2" in page


def test_a_valid_headline_shows_its_figures(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(_data(manifest_data, 1))
    r = build_report(m, _records(tmp_path / "rec", m), quality=PASS, out_dir=tmp_path / "out",
                     instances_measured={"inf2": 1, "g6": 1}, with_sensitivity=False)
    assert r["headline"]["decided"] is True and r["headline"]["monthly_delta_usd"] == r["monthly_delta_usd"]
    assert f"Monthly delta (baseline - candidate): {r['monthly_delta_usd']:,.2f} USD" in (tmp_path / "out" / "report.md").read_text()


def test_rate_cells_without_commitments_say_so_and_every_cell_shows_its_reasons(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(_data(manifest_data, 1))
    assert not m.costs.commitments
    r = build_report(m, _records(tmp_path / "rec", m), quality=PASS, out_dir=tmp_path / "out", instances_measured={"inf2": 1, "g6": 1})
    cells = {c["label"]: c for c in r["sensitivity"]["cells"]}
    for label in ("covered", "renewal"):
        c = cells[label]
        assert c["decision"] == "no commitment in the manifest", c
        assert c["reasons"] == [f"no commitment in the manifest: {f} has none in costs.commitments, which the {label} rate needs"
                                for f in ("inf2", "g6")]
        assert c["monthly_delta_usd"] is None
    assert cells["On-Demand"]["decision"] == r["decision"]["state"] == "go"
    md = (tmp_path / "out" / "report.md").read_text()
    page = (tmp_path / "out" / "report.html").read_text()
    assert ("| covered | no commitment in the manifest | n/a | n/a | no commitment in the manifest: inf2 has none in "
            "costs.commitments, which the covered rate needs; no commitment in the manifest: g6 has none") in md
    for c in r["sensitivity"]["cells"]:  # every cell's reasons are on both pages
        for why in c["reasons"]:
            assert why in md and why.replace("'", "&#x27;") in page


def test_rate_cells_with_a_commitment_are_priced(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    data = _data(manifest_data, 1)
    data["costs"]["commitments"] = [{"fleet": "inf2", "kind": "savings-plan", "covered_instances": 2, "effective_hourly_usd": 0.5,
                                     "term_months": 12, "renewal_hourly_usd": 0.55}]
    m = manifest(data)
    r = build_report(m, _records(tmp_path / "rec", m), quality=PASS, out_dir=tmp_path / "out", instances_measured={"inf2": 1, "g6": 1})
    cells = {c["label"]: c for c in r["sensitivity"]["cells"]}
    assert cells["covered"]["reasons"] == ["no commitment in the manifest: g6 has none in costs.commitments, which the covered rate needs"]
    data["costs"]["commitments"].append({"fleet": "g6", "kind": "reserved-instance", "covered_instances": 10, "effective_hourly_usd": 0.5,
                                         "term_months": 12})
    m = manifest(data)
    r = build_report(m, _records(tmp_path / "rec", m), quality=PASS, out_dir=tmp_path / "o2", instances_measured={"inf2": 1, "g6": 1})
    covered = next(c for c in r["sensitivity"]["cells"] if c["label"] == "covered")
    # every instance at its fleet's effective covered rate: inf2 0.5/h and g6 0.5/h, so only the counts differ
    inf2_n, g6_n = (covered["fleets"][f]["instances_required"] for f in ("inf2", "g6"))
    assert covered["monthly_delta_usd"] is not None and covered["decision"] in {"go", "defer", "reject"}
    per_instance = 0.5 * 730 + 200 * 0.08  # compute + EBS (100 GiB root + 100 GiB cache)
    assert covered["monthly_delta_usd"] == pytest.approx((g6_n - inf2_n) * per_instance)
