"""Capacity sweep: fleets sized from the best step that held the SLO, with hand-computed numbers."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.capacity.steps import (
    SearchPath,
    SearchStep,
    StopRule,
    Verdict,
    discover_steps,
    parse_label,
    split_label,
    write_search_path,
)
from analysis.errors import AnalysisError, BadCapacityStep
from analysis.report.build import ReportInputs, build_report
from core.manifest import Manifest
from core.records import INSTANCES_FILE, RequestRecord, RunSummary
from tests.analysis.synth import manifest, rec, write_jsonl
from tests.quality import quality_results

PASS = quality_results(
    {
        "inf2": {"passed": True, "pass_rate": 1.0, "failures": []},
        "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
    }
)
KW: dict[str, Any] = {"quality": PASS, "instances_measured": {"inf2": 1, "g6": 1}}


def _m(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:
        f["asg"]["max"] = 40
        f["max_concurrency"] = 4
    return manifest(manifest_data)


def _rate(m: Manifest, fleet: str, mult: float, tokens: int, *, slow: bool = False) -> list[RequestRecord]:
    """`mult` requests/s for exactly 100 s, back to back (e2e 1/mult): goodput = mult x tokens tok/s when all meet the SLO.

    slow: every 10th request waits 3 s for its first token (SLO 2 s), so the fleet P95 TTFT is 3 s: SLO FAIL."""
    n = round(100 * mult)
    out = []
    for i in range(n):
        t = i / mult
        r = rec(m, fleet, i, tokens=tokens, e2e=1 / mult, ttft=3.0 if slow and i % 10 == 0 else 0.5)
        out.append(replace(r, scheduled_s=t, sent_s=t, send_lag_s=0.0))
    return out


def _write(d: Path, m: Manifest, spec: dict[str, tuple[float, int, bool]]) -> Path:
    for fleet, (mult, tokens, slow) in spec.items():
        write_jsonl(d / f"records-{fleet}-w0.jsonl", _rate(m, fleet, mult, tokens, slow=slow))
    return d


def _three_steps(tmp_path: Path, m: Manifest) -> dict[str, Path]:
    # g6 x1: 300 tok/s pass; x2: 600 pass; x4: 10% slow -> P95 TTFT 3 s FAIL (goodput 360 x 300 / 100 = 1080, not a capacity)
    # inf2 x1: 900 pass; x2: 1800 pass; x4: FAIL
    return {
        label: _write(tmp_path / label, m, {"g6": (mult, 300, mult == 4), "inf2": (mult, 900, mult == 4)})
        for label, mult in (("x1", 1.0), ("x2", 2.0), ("x4", 4.0))
    }


def test_parse_label() -> None:
    assert parse_label("x0.5") == 0.5 and parse_label("x2") == 2.0 and parse_label("x1e1") == 10.0
    for bad in ("2x", "x", "x0", "x-1", "xfoo", "X2", "replay", "x2 ", "xnan", "xinf"):
        with pytest.raises(BadCapacityStep, match=re.escape(repr(bad))):
            parse_label(bad)


def test_bad_label_is_rejected_before_anything_is_loaded(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, False)})
    with pytest.raises(BadCapacityStep, match="'2x'"):
        build_report(
            ReportInputs(m, rep, out_dir=tmp_path / "o", capacity_dirs={"x1": rep, "2x": tmp_path / "missing"}, **KW)
        )
    assert not (tmp_path / "o").exists()


def test_capacity_is_the_best_step_inside_the_slo(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(manifest_data)
    # the replay: inf2 under-loaded (1 in flight of 4, a lower bound); g6 overloaded (P95 TTFT 3 s)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    r = build_report(
        ReportInputs(m, rep, out_dir=tmp_path / "o", capacity_dirs=_three_steps(tmp_path, m), **KW)
    ).model_dump(mode="json")

    # demand: 20 req/s x pooled (100 x 900 + 100 x 300) / 200 = 600 tok/request = 12,000 tok/s
    assert r["demand_tok_s"] == pytest.approx(12_000.0)
    g6, inf2 = r["fleets"]["g6"], r["fleets"]["inf2"]
    assert g6["capacity"]["step"] == "x2" and g6["capacity"]["per_instance_tok_s"] == pytest.approx(600.0)
    assert inf2["capacity"]["step"] == "x2" and inf2["capacity"]["per_instance_tok_s"] == pytest.approx(1800.0)
    # g6: ceil(12,000 / (600 x 0.8)) = 25, + 1 redundancy = 26 (20 busy + 5 headroom + 1)
    assert g6["size"]["per_instance_tok_s"] == pytest.approx(600.0)
    assert (g6["size"]["busy_instances"], g6["size"]["headroom_instances"], g6["instances_required"]) == (20, 5, 26)
    # inf2: ceil(12,000 / (1,800 x 0.8)) = ceil(8.33) = 9, + 1 = 10
    assert inf2["instances_required"] == 10
    assert g6["sized_from"] == "capacity sweep step x2"
    # the replay's own figures stay as measured: g6 270 tok/s (90 of 100 requests met the SLO)
    assert g6["per_instance_goodput_tok_s"] == pytest.approx(270.0) and g6["slo_pass"] is False

    steps = g6["capacity"]["steps"]
    assert [s["label"] for s in steps] == ["replay", "x1", "x2", "x4"]
    assert [s["multiplier"] for s in steps] == [1.0, 1.0, 2.0, 4.0]
    assert [s["slo_pass"] for s in steps] == [False, True, True, False]
    assert [s["per_instance_goodput_tok_s"] for s in steps] == pytest.approx([270.0, 300.0, 600.0, 1080.0])
    assert [s["requests"] for s in steps] == [100, 100, 200, 400]
    assert [s["successful_requests"] for s in steps] == [90, 100, 200, 360]
    assert steps[3]["p95_ttft_s"] == pytest.approx(3.0) and steps[2]["p95_ttft_s"] == pytest.approx(0.5)
    assert steps[2]["p95_itl_s"] == pytest.approx(0.05) and steps[2]["error_rate"] == 0.0
    assert steps[2]["peak_in_flight_per_instance"] == 1.0
    assert inf2["capacity"]["steps"][0]["label"] == "replay" and inf2["capacity"]["steps"][0]["slo_pass"] is True

    # measured directly: no saturation / overload gap for either fleet, and no capacity gap (x2 < x4, the top)
    whats = [g["what"] for g in r["gaps"]]
    assert not [w for w in whats if w.split(".")[0] in ("saturation", "overload", "capacity")], whats
    prov = r["provenance"]["capacity.g6"]
    assert prov["source"] == "measured" and prov["value"] == pytest.approx(600.0) and "step x2" in prov["detail"]
    assert r["provenance"]["saturation.inf2"]["value"]["saturated"] is False  # the replay evidence is still reported

    # SLO cells recompute the capacity from the step records: looser (x1.5: TTFT 3 s) lets x4 pass with every request
    # compliant, 400 x 300 / 100 = 1,200 tok/s -> ceil(12,000 / 960) = 13, + 1 = 14; tighter (x0.75) leaves x2 at 26
    cells = {c["label"]: c for c in r["sensitivity"]["cells"]}
    assert cells["SLO looser (x1.5)"]["fleets"]["g6"]["instances_required"] == 14
    assert cells["SLO tighter (x0.75)"]["fleets"]["g6"]["instances_required"] == 26

    on_disk = json.loads((tmp_path / "o" / "report.json").read_text())
    assert on_disk["fleets"]["g6"]["capacity"]["step"] == "x2"
    md = (tmp_path / "o" / "report.md").read_text()
    assert "## Capacity sweep" in md and "### g6: capacity 600.0 tok/s per instance (step x2)" in md
    assert (
        "| **x2** | 200 | 200 | 0.500 [0.500, 0.500] n=200 | 0.050 [0.050, 0.050] n=200 | 0.0000 | pass | 600.0 | 1.0 "
        "| 100.0 | 0.5 | yes | chosen |"
    ) in md
    # x4: 40 of 400 at 3 s; order statistics 371 and 389 (the 95% interval) both fall among them
    assert (
        "| x4 | 400 | 360 | 3.000 [3.000, 3.000] n=400 | 0.050 [0.050, 0.050] n=400 | 0.0000 | FAIL | 1,080.0 | 1.0 "
        "| 100.0 | 0.2 | yes |  |"
    ) in md
    assert "(upper bound)" not in md
    page = (tmp_path / "o" / "report.html").read_text()
    assert "<h2>Capacity sweep</h2>" in page and "Capacity sweep: per-instance goodput" in page
    assert '<tr style="font-weight:bold"><td>x2</td><td>200</td>' in page


def test_capacity_per_instance_is_the_fleet_goodput_over_the_instances_measured(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    # The same records served by 2 g6 instances (measure_instances: 2): each instance held half of them.
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    steps = _three_steps(tmp_path, m)
    kw: dict[str, Any] = {"quality": PASS, "capacity_dirs": steps, "with_sensitivity": False, "with_pages": False}
    one = build_report(
        ReportInputs(m, rep, out_dir=tmp_path / "o1", instances_measured={"inf2": 1, "g6": 1}, **kw)
    ).model_dump(mode="json")
    two = build_report(
        ReportInputs(m, rep, out_dir=tmp_path / "o2", instances_measured={"inf2": 1, "g6": 2}, **kw)
    ).model_dump(mode="json")
    g1, g2 = one["fleets"]["g6"], two["fleets"]["g6"]
    assert g1["capacity"]["per_instance_tok_s"] == pytest.approx(600.0)
    assert g2["capacity"]["step"] == "x2" and g2["capacity"]["per_instance_tok_s"] == pytest.approx(300.0)
    assert [s["per_instance_goodput_tok_s"] for s in g2["capacity"]["steps"]] == pytest.approx(
        [135.0, 150.0, 300.0, 540.0]
    )
    assert g2["capacity_ci_tok_s"] == pytest.approx([v / 2 for v in g1["capacity_ci_tok_s"]])
    # 12,000 tok/s of demand: ceil(12,000 / (300 x 0.8)) = 50, + 1 redundancy = 51 (26 from one instance's 600)
    assert (g1["instances_required"], g2["instances_required"]) == (26, 51)
    assert two["fleets"]["inf2"]["capacity"]["per_instance_tok_s"] == pytest.approx(1800.0)  # untouched


def test_top_step_note_and_no_step_blocking_gap(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, True), "g6": (1.0, 300, True)})
    # inf2: only the top step x4 held the SLO (3,600 tok/s); g6: no step did
    dirs = {
        label: _write(tmp_path / label, m, {"inf2": (mult, 900, mult != 4), "g6": (mult, 300, True)})
        for label, mult in (("x0.5", 0.5), ("x2", 2.0), ("x4", 4.0))
    }
    r = build_report(ReportInputs(m, rep, out_dir=tmp_path / "o", capacity_dirs=dirs, **KW)).model_dump(mode="json")
    inf2, g6 = r["fleets"]["inf2"], r["fleets"]["g6"]
    assert inf2["capacity"]["step"] == "x4" and inf2["capacity"]["per_instance_tok_s"] == pytest.approx(3600.0)
    # ceil(12,000 / (3,600 x 0.8)) = ceil(4.17) = 5, + 1 = 6
    assert inf2["instances_required"] == 6
    gaps = {g["what"]: g for g in r["gaps"]}
    note = gaps["capacity.inf2"]
    assert note["blocks_go"] is False and "raise the sweep's top multiplier" in note["reason"]
    assert "overload.inf2" not in gaps and "saturation.inf2" not in gaps

    # g6: no step passed -> sized from the replay (90 x 300 / 100 = 270 tok/s), the replay's gaps kept, plus a blocking one
    assert g6["capacity"]["step"] is None and g6["capacity"]["per_instance_tok_s"] is None
    assert [s["label"] for s in g6["capacity"]["steps"]] == ["x0.5", "replay", "x2", "x4"]
    assert not any(s["slo_pass"] for s in g6["capacity"]["steps"])
    assert g6["size"]["per_instance_tok_s"] == pytest.approx(270.0) and g6["sized_from"] == "replay"
    # ceil(12,000 / (270 x 0.8)) = ceil(55.6) = 56, + 1 = 57
    assert g6["instances_required"] == 57
    blocking = gaps["capacity.g6"]
    assert blocking["blocks_go"] is True and "no sweep step met the SLO" in blocking["reason"]
    # each step's figure that missed is named: g6's slow tenth puts every P95 TTFT at 3 s
    assert blocking["reason"].startswith(
        "g6: no sweep step met the SLO (x0.5: P95 TTFT 3 s > 2 s; replay: P95 TTFT 3 s > 2 s; "
    )
    assert blocking["reason"].endswith("; add a step below the smallest multiplier tried (x0.5)")
    assert gaps["overload.g6"]["blocks_go"] and gaps["saturation.g6"]["blocks_go"]
    assert r["provenance"]["capacity.g6"]["source"] == "missing"
    assert r["decision"]["state"] == "defer" and any("capacity.g6" in x for x in r["decision"]["reasons"])
    md = (tmp_path / "o" / "report.md").read_text()
    assert "### g6: capacity n/a tok/s per instance (no steady-state step held the SLO; sized from the replay)" in md


def test_without_a_sweep_the_report_is_unchanged(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    a = build_report(ReportInputs(m, rep, out_dir=tmp_path / "a", **KW)).model_dump(mode="json")
    b = build_report(  # report.json alone: the pages come from the same model (and a's are read below)
        ReportInputs(m, rep, out_dir=tmp_path / "b", capacity_dirs=None, with_pages=False, **KW)
    ).model_dump(mode="json")
    assert (
        set(a)
        == set(b)
        == {
            "campaign",
            "manifest_digest",
            "generated_at",
            "comparison",
            "slo",
            "horizon_months",
            "fleets",
            "demand_tok_s",
            "pooled_output_tokens_per_request",
            "utilization_target",
            "monthly_delta_usd",
            "migration",
            "migration_cost_usd",
            "payback_months",
            "months_to_next_refresh",
            "decision",
            "gaps",
            "prometheus",
            "prefix_cache",
            "cloudwatch",
            "billing",
            "quality",
            "provenance",
            "sensitivity",
            "series",
            "monthly_delta_ci_usd",
            "payback_months_ci",
            "headline",
            "time_to_ready",
            "systems_under_test",
            "report_version",
            "stopped_at",
        }
    )
    for name in ("inf2", "g6"):
        assert a["fleets"][name]["capacity"] is None and a["fleets"][name]["sized_from"] is None
    assert not any(k.startswith("capacity") for k in a["provenance"])
    assert not any(g["what"].startswith("capacity") for g in a["gaps"])
    assert {g["what"] for g in a["gaps"]} >= {"overload.g6", "saturation.g6", "saturation.inf2"}
    a.pop("generated_at")
    b.pop("generated_at")
    assert a == b
    assert "Capacity sweep" not in (tmp_path / "a" / "report.md").read_text()
    assert "Capacity sweep" not in (tmp_path / "a" / "report.html").read_text()


def test_a_candidate_overloaded_in_the_replay_but_sized_inside_the_slo_holds_it(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(manifest_data)
    # the replay overloads the candidate (P95 TTFT 3 s) while the baseline holds: without a sweep that defers
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, True), "g6": (1.0, 300, False)})
    no_sweep = build_report(
        ReportInputs(m, rep, out_dir=tmp_path / "o1", with_sensitivity=False, with_pages=False, **KW)
    ).model_dump(mode="json")
    assert any("did not hold the SLO in the measured run" in x for x in no_sweep["decision"]["reasons"])
    swept = build_report(
        ReportInputs(
            m,
            rep,
            out_dir=tmp_path / "o2",
            capacity_dirs=_three_steps(tmp_path, m),
            with_sensitivity=False,
            with_pages=False,
            **KW,
        )
    ).model_dump(mode="json")
    assert swept["fleets"]["inf2"]["sized_from"] == "capacity sweep step x2"
    assert not any("did not hold the SLO" in x for x in swept["decision"]["reasons"]), swept["decision"]


def test_a_step_shorter_than_three_request_lifetimes_is_not_a_capacity(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    manifest_data["workload"].pop("capacity_search", None)  # the explicit sweep, with 45 s steps
    manifest_data["workload"]["capacity_sweep"] = {"multipliers": [0.5, 1], "step_s": 45}
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})

    def short(fleet: str, tokens: int) -> list[RequestRecord]:
        # 10 arrivals over 10 s, each taking 8 s: in SLO, but the window holds barely one request lifetime
        return [
            replace(rec(m, fleet, i, tokens=tokens, e2e=8.0), scheduled_s=float(i), sent_s=float(i)) for i in range(10)
        ]

    step = tmp_path / "x4"
    write_jsonl(step / "records-g6-w0.jsonl", short("g6", 300))
    write_jsonl(step / "records-inf2-w0.jsonl", short("inf2", 900))
    r = build_report(
        ReportInputs(
            m, rep, out_dir=tmp_path / "o", capacity_dirs={"x4": step}, with_sensitivity=False, with_pages=False, **KW
        )
    ).model_dump(mode="json")
    g6 = r["fleets"]["g6"]["capacity"]
    x4 = next(s for s in g6["steps"] if s["label"] == "x4")
    assert x4["slo_pass"] and x4["window_s"] == pytest.approx(10.0) and x4["median_e2e_s"] == pytest.approx(8.0)
    assert x4["steady_state"] is False and g6["step"] is None
    gap = next(g for g in r["gaps"] if g["what"] == "capacity.g6")
    # The manifest's step_s is already 45 s: the short quantity is the arrival span (10 s of 3 x 8 s = 24 s), and the
    # advice scales step_s by what the arrivals filled (45 x 24 / 10 = 108 s), never "at least 24 s".
    assert m.workload.capacity_sweep is not None and m.workload.capacity_sweep.step_s == 45
    assert (
        gap["blocks_go"]
        and "x4: arrivals spanned 10.0 s, 3 median request lifetimes need 3 x 8.0 s = 24.0 s" in gap["reason"]
    )
    assert (
        "step_s is 45 s but x4's arrivals filled only 10.0 s of it: lengthen step_s to at least 108 s" in gap["reason"]
    )
    assert "at least 24 s" not in gap["reason"]
    assert r["decision"]["state"] != "go"


def _search_layout(tmp_path: Path, m: Manifest) -> Path:
    """capacity/<fleet>/x<k>/ steps of each fleet's own search, with the search paths beside them.
    g6: x1 (300 tok/s) and x2 (600) hold, x4 misses: bracket x2..x4 not converged (max_steps 3);
    inf2: x1 (900) and x2 (1,800) hold, x2.2 misses: converged (2.2 / 2 = 1.1)."""
    root = tmp_path / "capacity"
    for fleet, tokens, mults, rule in (
        ("g6", 300, (1.0, 2.0, 4.0), StopRule.MAX_STEPS),
        ("inf2", 900, (1.0, 2.0, 2.2), StopRule.CONVERGED),
    ):
        steps = []
        for k in mults:
            miss = k == max(mults)
            d = root / fleet / f"x{k:.4g}"
            write_jsonl(d / f"records-{fleet}-w0.jsonl", _rate(m, fleet, k, tokens, slow=miss))
            steps.append(
                SearchStep(
                    f"x{k:.4g}",
                    k,
                    "test",
                    100.0,
                    Verdict.MISSED if miss else Verdict.HELD,
                    round(100 * k),
                    100.0,
                    k,
                    1 / k,
                    3.0 if miss else 0.5,
                    0.05,
                    0.0,
                    "hand-made",
                )
            )
        write_search_path(
            SearchPath(fleet, tuple(steps), mults[1], mults[2], rule, f"{rule} (hand-made)", 0.1), root / fleet
        )
    return root


def test_search_steps_are_per_fleet_and_the_report_carries_the_path(full_pages: tuple[dict[str, Any], Path]) -> None:
    # tests.analysis.report_pages.full_report: this replay and _search_layout's steps, built once a session
    r, out = full_pages
    dirs = discover_steps(out.parent / "capacity")
    assert sorted(dirs) == ["g6/x1", "g6/x2", "g6/x4", "inf2/x1", "inf2/x2", "inf2/x2.2"]
    g6, inf2 = r["fleets"]["g6"]["capacity"], r["fleets"]["inf2"]["capacity"]
    # each fleet's rows are its own steps only (plus the replay), never the other fleet's
    assert [s["label"] for s in g6["steps"]] == ["replay", "g6/x1", "g6/x2", "g6/x4"]
    assert [s["label"] for s in inf2["steps"]] == ["replay", "inf2/x1", "inf2/x2", "inf2/x2.2"]
    assert g6["step"] == "g6/x2" and g6["per_instance_tok_s"] == pytest.approx(600.0)
    assert inf2["step"] == "inf2/x2" and inf2["per_instance_tok_s"] == pytest.approx(1800.0)
    assert g6["search"]["stop_rule"] == "max_steps" and [s["multiplier"] for s in g6["search"]["steps"]] == [
        1.0,
        2.0,
        4.0,
    ]
    assert inf2["search"]["stop_rule"] == "converged"
    gaps = {g["what"]: g for g in r["gaps"]}
    # g6's bracket x2..x4 is wider than 10%: said, naming the rule; inf2 converged: nothing to say
    assert gaps["capacity.g6"]["blocks_go"] is False
    assert "not bracketed within 10%" in gaps["capacity.g6"]["reason"] and "max_steps" in gaps["capacity.g6"]["reason"]
    assert "capacity.inf2" not in gaps
    assert "the capacity search stopped (converged" in r["provenance"]["capacity.inf2"]["detail"]
    # the report shows each fleet's path: the rule that stopped it and one row per step
    md = (out / "report.md").read_text()
    assert "Search stopped (max_steps): max_steps (hand-made)" in md
    assert "| 3 | x4 | test | 100.0 | 100.0 | 400 | 4.00 | 0.2 | 3.000 | missed | hand-made |" in md
    page = (out / "report.html").read_text()
    assert "<p>Search stopped (converged): converged (hand-made)</p>" in page and "<td>x2.2</td>" in page


def test_search_labels_are_checked(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, False)})
    assert (
        split_label("g6/x1.414") == ("g6", 1.414)
        and split_label("g6/x2-r2") == ("g6", 2.0)
        and split_label("x1e-1") == (None, 0.1)
    )
    with pytest.raises(BadCapacityStep, match="names fleet 'a100'"):
        build_report(ReportInputs(m, rep, out_dir=tmp_path / "o", capacity_dirs={"a100/x1": rep}, **KW))
    # a fleet's step holding another fleet's records is refused
    with pytest.raises(AnalysisError, match=r"are not the step's fleet g6"):
        build_report(ReportInputs(m, rep, out_dir=tmp_path / "o", capacity_dirs={"g6/x1": rep}, **KW))


def test_a_step_whose_run_measured_the_client_is_never_the_capacity(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    dirs = _three_steps(tmp_path, m)
    bad = RunSummary(
        m.campaign,
        m.digest,
        "g6",
        200,
        200,
        0,
        0,
        0,
        0.001,
        0.16,
        50.0,
        False,
        ["schedule lag p99 160.0 ms > bound 50.0 ms: the client was measured"],
        0.0,
        0.0,
        1.0,
    )
    (dirs["x2"] / "summary-g6.json").write_text(bad.to_json())
    r = build_report(
        ReportInputs(m, rep, out_dir=tmp_path / "o", capacity_dirs=dirs, with_sensitivity=False, with_pages=False, **KW)
    ).model_dump(mode="json")
    g6 = r["fleets"]["g6"]["capacity"]
    assert g6["step"] == "x1" and g6["per_instance_tok_s"] == pytest.approx(
        300.0
    )  # x2 (600 tok/s) held but was invalid
    assert [s["valid"] for s in g6["steps"] if s["label"] == "x2"] == [False]
    assert r["fleets"]["inf2"]["capacity"]["step"] == "x2"  # the other fleet's run in that step was valid


def test_a_step_the_search_judged_too_short_is_never_the_capacity() -> None:
    """The replay held over 32 requests, which the search judged short (min_requests 72) and ran
    again at x1 with 72, which missed; x0.5 held over 72. The fleet is sized from x0.5, not from
    the replay's higher goodput (the report sized g6 from such a replay in the example run)."""
    from analysis.capacity.steps import REPLAY, choose, steady_state
    from analysis.model import CapacityStep

    def row(label: str, k: float, tok_s: float, held: bool) -> CapacityStep:
        return CapacityStep(
            label=label,
            multiplier=k,
            requests=72,
            successful_requests=70,
            per_instance_goodput_tok_s=tok_s,
            p95_ttft_s=1.0 if held else 2.5,
            p95_itl_s=0.05,
            error_rate=0.0,
            slo_pass=held,
            peak_in_flight_per_instance=4.0,
            window_s=150.0,
            median_e2e_s=10.0,
            steady_state=steady_state(150.0, 10.0),
            valid=True,
        )

    def step(label: str, k: float, verdict: Verdict) -> SearchStep:
        return SearchStep(label, k, "t", 100.0, verdict, 72, 150.0, 0.5, 10.0, 1.0, 0.05, 0.0, "hand-made")

    rows = [row(REPLAY, 1.0, 166.0, True), row("g6/x1", 1.0, 90.0, False), row("g6/x0.5", 0.5, 110.0, True)]
    path = SearchPath(
        "g6",
        (step(REPLAY, 1.0, Verdict.SHORT), step("x1", 1.0, Verdict.MISSED), step("x0.5", 0.5, Verdict.HELD)),
        0.5,
        1.0,
        StopRule.TIME_BUDGET,
        "hand-made",
        0.1,
    )
    cap = choose(rows, path)
    assert cap.step == "g6/x0.5" and cap.per_instance_tok_s == pytest.approx(110.0)
    # without a search (a fixed sweep), the replay stays a candidate as before
    assert choose(rows).step == REPLAY


def _counted(d: Path, **per_fleet: int) -> None:
    (d / INSTANCES_FILE).write_text(
        json.dumps(
            {
                f: {"instances": n, "source": "measured", "detail": "fewest healthy targets (test)"}
                for f, n in per_fleet.items()
            }
        )
    )


def test_a_step_divides_by_the_instances_counted_while_it_ran(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # issue 37: the report divided every step by one run-wide count; a step during which one of 4
    # targets dropped out ran on 3, and its per-instance goodput is its goodput over those 3.
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    steps = _three_steps(tmp_path, m)
    _counted(steps["x2"], g6=3)
    kw: dict[str, Any] = {"quality": PASS, "capacity_dirs": steps, "with_sensitivity": False, "with_pages": False}
    out = build_report(
        ReportInputs(m, rep, out_dir=tmp_path / "o", instances_measured={"inf2": 4, "g6": 4}, **kw)
    ).model_dump(mode="json")
    rows = {s["label"]: s for s in out["fleets"]["g6"]["capacity"]["steps"]}
    assert rows["x2"]["instances"] == 3 and rows["x2"]["per_instance_goodput_tok_s"] == pytest.approx(600.0 / 3)
    assert rows["x2"]["instances_detail"].startswith("counted while it ran: fewest healthy targets")
    assert rows["x1"]["instances"] == 4 and rows["x1"]["per_instance_goodput_tok_s"] == pytest.approx(300.0 / 4)
    assert rows["x1"]["instances_detail"] == "the run's instances_measured"
    inf2 = {s["label"]: s for s in out["fleets"]["inf2"]["capacity"]["steps"]}
    assert inf2["x2"]["instances"] == 4  # counted for g6 only
    # g6 is sized from x2: its capacity interval is over the same 3 instances as its point (the
    # interval once divided by the run's 4 and left the point outside it: a negative whisker)
    g6 = out["fleets"]["g6"]
    assert g6["capacity"]["step"] == "x2"
    low, high = g6["capacity_ci_tok_s"]
    assert low <= g6["capacity"]["per_instance_tok_s"] <= high


def test_the_replays_counted_instances_come_first_and_the_fallback_is_what_the_stack_deploys(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    # The interim (settle) and the final report both read the replay's count beside its records:
    # the same instances from the same source, whatever the runner passed.
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, False)})
    _counted(rep, inf2=3)
    kw: dict[str, Any] = {"quality": PASS, "with_sensitivity": False, "with_pages": False}
    out = build_report(ReportInputs(m, rep, out_dir=tmp_path / "o", **kw)).model_dump(mode="json")
    assert out["fleets"]["inf2"]["instances_measured"] == 3
    assert out["provenance"]["instances_measured.inf2"]["source"] == "measured"
    # nothing counted, nothing given: the stack runs max(asg.desired, measure_instances) = 4, not asg.desired 2
    g6 = m.fleet("g6")
    assert (g6.asg.desired, g6.instances_measured) == (2, 4)
    assert out["fleets"]["g6"]["instances_measured"] == 4
    assert out["provenance"]["instances_measured.g6"]["source"] == "manifest"


def test_a_hand_edited_instances_file_is_refused_naming_the_field(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(manifest_data)
    rep = _write(tmp_path / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, False)})
    (rep / INSTANCES_FILE).write_text(json.dumps({"inf2": {"instances": "four"}}))
    with pytest.raises(AnalysisError, match=r"instances\.json: inf2\.instances: expected a whole number"):
        build_report(ReportInputs(m, rep, out_dir=tmp_path / "o", quality=PASS, with_pages=False))
