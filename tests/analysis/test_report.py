from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.report.build import ReportInputs, build_report
from campaign.cli import report_cmds as cli
from core.manifest import Manifest
from tests.analysis.synth import manifest, steady, write_jsonl
from tests.conftest import write_manifest
from tests.quality import quality_results

PASS = quality_results(
    {
        "inf2": {"passed": True, "pass_rate": 1.0, "failures": []},
        "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
    }
)


@pytest.fixture
def small(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 1.0
    return manifest(manifest_data)


def _records(d: Path, m: Manifest) -> Path:
    write_jsonl(d / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 600))  # 600 tok/s on one instance
    write_jsonl(d / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))  # 450 tok/s
    return d


def test_report_numbers_by_hand_and_files(tmp_path: Path, small: Manifest) -> None:
    m = small
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
        )
    ).model_dump(mode="json")
    demand = 1.0 * (100 * 600 + 100 * 450) / 200  # 525 tok/s, pooled
    assert r["demand_tok_s"] == pytest.approx(demand)
    # inf2: 525 / (600 * 0.8) -> 2, +1 redundancy = 3; g6: 525 / (450 * 0.8) -> 2, +1 = 3
    assert r["fleets"]["inf2"]["instances_required"] == 3 and r["fleets"]["g6"]["instances_required"] == 3
    other = 3 * (150 + 100) * 0.08 + (0.0225 + 1.0 * 0.006) * 730 + 50 * 0.01 * 2 + 40
    inf2_month = 3 * 0.7582 * 730 + other
    assert r["fleets"]["inf2"]["monthly_cost_usd"] == pytest.approx(inf2_month)
    assert r["fleets"]["inf2"]["cost_per_million_successful_tokens"] == pytest.approx(
        inf2_month / (demand * 3600 * 730) * 1e6
    )
    assert r["monthly_delta_usd"] == pytest.approx(3 * (0.8048 - 0.7582) * 730)
    assert r["payback_months"] == pytest.approx(r["migration_cost_usd"] / r["monthly_delta_usd"])
    assert r["decision"]["state"] == "defer" and any(
        "beyond the 12-month horizon" in x for x in r["decision"]["reasons"]
    )
    assert r["manifest_digest"] == m.digest and r["campaign"] == m.campaign
    for key in ("requests", "successful_requests", "successful_output_tokens", "p95_ttft_s", "p95_itl_s", "slo_pass"):
        assert key in r["fleets"]["g6"]
    assert r["provenance"]["prices.instance.inf2.xlarge"]["source"] == "snapshot"
    assert "2023-04-20" in r["provenance"]["prices.instance.inf2.xlarge"]["detail"]
    assert {c["dimension"] for c in r["sensitivity"]["cells"]} >= {
        "demand",
        "utilization",
        "rate",
        "slo",
        "port_effort",
        "refresh",
    }
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["decision"] == r["decision"]
    page = (tmp_path / "out" / "report.html").read_text()
    # CDFs and goodput; the headline is not decided here, so no cost, payback or sensitivity figure is
    # drawn (the cells' deltas rest on the same blocked evidence)
    assert page.count("<figure>") == 3 and "<script" not in page and "src=" not in page and "Source:" in page
    assert "No cost or payback figure" in page
    md = (tmp_path / "out" / "report.md").read_text()
    assert "# llama3-8b-inf2-vs-g6: DEFER" in md
    # The fleet sizes are not decided: neither page prints them in the placement lines either.
    for text in (md, page):
        assert "inf2: not decided (the fleet size rests on the blocked evidence)" in text and " busy + " not in text
    # The ledger keeps the manifest's own items and says not decided for those priced from the fleets.
    assert (
        "- dual_run: not decided" in md
        and "- total: not decided" in md
        and "- testing: " in md
        and "- testing: not decided" not in md
    )


def test_cheaper_candidate_with_short_payback_is_go(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    manifest_data["fleets"][0]["asg"]["max"] = 40
    manifest_data["fleets"][1]["asg"]["max"] = 40
    for f in manifest_data["fleets"]:  # steady() keeps one request in flight: saturated only at max_concurrency 1
        f["max_concurrency"] = 1
    m = manifest(manifest_data)
    d = tmp_path / "rec"
    write_jsonl(d / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 900))
    write_jsonl(d / "records-g6-w0.jsonl", steady(m, "g6", 100, 300))
    r = build_report(
        ReportInputs(
            m, d, quality=PASS, out_dir=tmp_path / "out", instances_measured={"inf2": 1, "g6": 1}, with_pages=False
        )
    ).model_dump(mode="json")
    assert r["monthly_delta_usd"] > 0 and r["payback_months"] < 12
    assert r["decision"]["state"] == "go", r["decision"]
    failed = build_report(
        ReportInputs(
            m,
            d,
            quality=quality_results({**PASS, "inf2": {"passed": False, "pass_rate": 0.5, "failures": ["x"]}}),
            out_dir=tmp_path / "o2",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert failed["decision"]["state"] == "reject"


def test_more_expensive_candidate_rejects_with_null_payback(tmp_path: Path, small: Manifest) -> None:
    d = tmp_path / "rec"
    write_jsonl(d / "records-inf2-w0.jsonl", steady(small, "inf2", 100, 100))  # far slower: more instances
    write_jsonl(d / "records-g6-w0.jsonl", steady(small, "g6", 100, 900))
    r = build_report(
        ReportInputs(
            small, d, quality=PASS, out_dir=tmp_path / "out", instances_measured={"inf2": 1, "g6": 1}, with_pages=False
        )
    ).model_dump(mode="json")
    assert r["monthly_delta_usd"] <= 0 and r["payback_months"] is None
    assert r["decision"]["state"] == "reject"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["payback_months"] is None


def test_missing_prices_mark_gaps_not_zero(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["costs"]["region"] = "eu-north-1"  # no pinned snapshot, no API asked
    m = manifest(manifest_data)
    r = build_report(
        ReportInputs(
            m,
            _records(tmp_path / "rec", m),
            quality=PASS,
            out_dir=tmp_path / "out",
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert r["fleets"]["inf2"]["monthly_cost_usd"] is None and r["monthly_delta_usd"] is None
    assert any(g["what"] == "prices.instance.inf2.xlarge" for g in r["gaps"])
    assert r["decision"]["state"] == "defer"


def test_unreachable_prometheus_is_a_gap(tmp_path: Path, small: Manifest) -> None:
    r = build_report(
        ReportInputs(
            small,
            _records(tmp_path / "rec", small),
            prometheus_url="http://127.0.0.1:9",
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    gap = next(g for g in r["gaps"] if g["what"] == "prometheus")
    assert "unreachable" in gap["reason"] and gap["blocks_go"]
    assert any("prometheus" in x for x in r["decision"]["reasons"])


def test_sensitivity_slo_cells_recompute_goodput_from_records(tmp_path: Path, small: Manifest) -> None:
    d = tmp_path / "rec"
    # half the inf2 requests have TTFT 1.8 s: inside the 2 s SLO, outside a 0.75x (1.5 s) one
    from tests.analysis.synth import rec

    write_jsonl(
        d / "records-inf2-w0.jsonl", [rec(small, "inf2", i, tokens=600, ttft=1.8 if i % 2 else 0.5) for i in range(100)]
    )
    write_jsonl(d / "records-g6-w0.jsonl", steady(small, "g6", 100, 450))
    r = build_report(
        ReportInputs(
            small, d, quality=PASS, out_dir=tmp_path / "out", instances_measured={"inf2": 1, "g6": 1}, with_pages=False
        )
    ).model_dump(mode="json")
    tight = next(c for c in r["sensitivity"]["cells"] if c["label"].startswith("SLO tighter"))
    loose = next(c for c in r["sensitivity"]["cells"] if c["label"].startswith("SLO looser"))
    assert r["fleets"]["inf2"]["instances_required"] == 3
    # At x0.75 inf2's P95 TTFT (1.8 s) misses the 1.5 s SLO in every measured step: its capacity there was never
    # measured, so the cell shows no number and no decision (not the 300 tok/s of an overloaded instance).
    assert tight["decision"] == "not measured" and tight["reasons"] == [
        "not measured: inf2 never held the SLO at x0.75"
    ]
    assert tight["monthly_delta_usd"] is None and tight["fleets"]["inf2"]["instances_required"] is None
    # At x1.5 (3 s) every request is compliant: inf2 600 tok/s, 525 / (600 * 0.8) -> 2, +1 = 3, as at the manifest's SLO
    assert loose["fleets"]["inf2"]["instances_required"] == 3 and loose["decision"] in {"go", "defer", "reject"}


def test_cli_handler_writes_report_and_maps_exit_codes(
    tmp_path: Path, manifest_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_manifest(tmp_path, manifest_data)
    from core.manifest import load_manifest

    m = load_manifest(path, check_files=False)
    rec_dir = _records(tmp_path / "rec", m)
    q = tmp_path / "q.json"
    q.write_text(json.dumps({k: v.model_dump(mode="json") for k, v in PASS.items()}))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "report",
            str(path),
            "--records",
            str(rec_dir),
            "--quality",
            str(q),
            "--instances",
            "inf2=1",
            "g6=1",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    code = args.handler(args)
    assert code == cli.EXIT_BY_STATE[json.loads((tmp_path / "out" / "report.json").read_text())["decision"]["state"]]
    write_jsonl(rec_dir / "records-x.jsonl", steady(m, "g6", 2, 1, digest="0" * 64))
    # A project error reaches campaign's main, which prints it (no traceback) and exits with its code.
    from campaign.cli.main import main

    assert main(["report", str(path), "--records", str(rec_dir), "--out", str(tmp_path / "o2")]) == cli.EXIT_BAD_INPUT
    assert "0" * 64 in capsys.readouterr().err
    assert not (tmp_path / "o2" / "report.json").exists()


def test_report_counts_outcomes_and_the_itl_definition_per_fleet(tmp_path: Path, small: Manifest) -> None:
    from dataclasses import replace

    from tests.analysis.synth import rec

    d = tmp_path / "rec"
    write_jsonl(d / "records-inf2-w0.jsonl", steady(small, "inf2", 40, 600))
    g6 = [replace(r, itl_basis="server_tokens") for r in steady(small, "g6", 40, 450)]
    g6[3] = replace(g6[3], itl_basis="chunks")  # a response without server usage
    g6.append(rec(small, "g6", 40, outcome="timeout", ttft=None, itl=None, e2e=None, tokens=0))
    g6.append(rec(small, "g6", 41, outcome="no_text", ttft=None, itl=None, tokens=0, server_tokens=12))
    write_jsonl(d / "records-g6-w0.jsonl", g6)
    r = build_report(
        ReportInputs(
            small,
            d,
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
        )
    ).model_dump(mode="json")
    assert r["fleets"]["g6"]["outcomes"] == {"no_text": 1, "ok": 40, "timeout": 1}
    assert r["fleets"]["g6"]["itl_basis"] == {"chunks": 1, "server_tokens": 39}
    assert r["fleets"]["inf2"]["itl_basis"] == {"unknown": 40}  # records written before the field existed
    assert "server-reported output tokens - 1" in r["provenance"]["itl_definition"]["detail"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "- g6: no_text 1, ok 40, timeout 1; ITL basis: chunks 1, server_tokens 39" in md
    assert "`no_text`" in md  # the outcome is explained where it is counted
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<td>g6</td><td>no_text 1, ok 40, timeout 1</td><td>chunks 1, server_tokens 39</td>" in page
