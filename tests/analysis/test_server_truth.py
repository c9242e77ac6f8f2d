"""The server's P95s per step, kept with the run (issue 39, items 2 and 3): pulled into
metrics/<fleet>/<step>.json at the end of a run, and every per-step server figure of the report
computed from those files alone. Prometheus here is a stand-in that answers the queries the way
Prometheus's HTTP API does (a vector of {metric, value}); test_prometheus.py has the real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import AnalysisError
from analysis.measure import goodput
from analysis.measure.server_truth import MIN_SCRAPES, TOO_SHORT, server_step
from analysis.sources.prometheus import HistogramNames
from analysis.sources.records import load_records
from analysis.sources.server_series import METRICS_DIR, pull_step, read_series, series_path, write_series
from campaign.stages.run import RunFacts, run_report, step_windows
from core.manifest import Manifest
from tests.analysis.synth import manifest, steady, write_jsonl

INF = float("inf")
# 100 server TTFTs: 90 under 0.1 s, 10 between 0.5 and 1 s -> P95 = 0.5 + 0.5 * (95 - 90) / 10 = 0.75
TTFT = {0.1: 90.0, 0.5: 90.0, 1.0: 100.0, INF: 100.0}
# ITL: 80 under 0.02 s, 20 between 0.02 and 0.04 -> P95 = 0.02 + 0.02 * (95 - 80) / 20 = 0.035
ITL = {0.02: 80.0, 0.04: 100.0, INF: 100.0}
# 100 server TTFTs: 60 under 0.1 s, 40 in (0.1, 0.25] -> P95 = 0.1 + 0.15 * (95 - 60) / 40 = 0.23125
TTFT_FAST = {0.1: 60.0, 0.25: 100.0, 0.5: 100.0, INF: 100.0}


class StandInPrometheus:
    """Answers the queries pull_step sends: the fleet's merged buckets and its targets' up checks."""

    url = "http://127.0.0.1:9"

    def __init__(
        self, interval_s: float, *, up_min: float = 1.0, missing_scrapes: int = 0, ttft: dict[float, float] = TTFT
    ) -> None:
        self.interval_s, self.up_min, self.missing = interval_s, up_min, missing_scrapes
        self.ttft = ttft
        self.queries: list[str] = []

    def has_series(self, metric: str, labels: dict[str, str], start: float, end: float) -> bool:
        return True

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        self.queries.append(expr)
        if expr.startswith("sum by (le) (increase("):
            buckets = self.ttft if "time_to_first_token" in expr else ITL
            return [
                {"metric": {"le": "+Inf" if le == INF else str(le)}, "value": [at, str(c)]} for le, c in buckets.items()
            ]
        window_s = float(expr.rsplit("[", 1)[1].rstrip("s])"))
        if expr.startswith("min_over_time(up"):
            return [{"metric": {"instance": "10.0.0.1:8000"}, "value": [at, str(self.up_min)]}]
        samples = window_s / self.interval_s - self.missing
        return [{"metric": {"instance": "10.0.0.1:8000"}, "value": [at, str(samples)]}]


@pytest.fixture
def small(manifest_data: dict[str, Any]) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 1.0
    return manifest(manifest_data)


def _run_dir(root: Path, m: Manifest, n: int = 60, ttft: float = 0.9) -> Path:
    # one request a second for n s, each 1 s long, TTFT 0.9 s and ITL 0.05 s on the client's side
    for f in ("inf2", "g6"):
        write_jsonl(root / "records" / f"records-{f}-w0.jsonl", steady(m, f, n, 500, ttft=ttft, itl=0.05))
    return root


def _save(m: Manifest, run: Path, prom: StandInPrometheus) -> list[Path]:
    out = []
    for (fleet, label), window in step_windows(m, run / "records", {}).items():
        names = HistogramNames.for_stack(m.fleet(fleet).serving.stack)
        saved = pull_step(prom, names, fleet, label, window, prom.interval_s)  # type: ignore[arg-type]
        out.append(write_series(run / METRICS_DIR, saved))
    return out


def _report(m: Manifest, run: Path) -> dict[str, Any]:
    facts = RunFacts({"inf2": 1, "g6": 1})  # no prometheus_url: nothing is queried
    r = run_report(m, run, run / "out", None, facts, None, None, full=False)
    return r.model_dump(mode="json")


def test_saved_series_hold_the_query_and_window_and_give_pulled_p95s_and_the_gap(
    tmp_path: Path, small: Manifest
) -> None:
    m = small
    run = _run_dir(tmp_path, m)
    files = _save(m, run, StandInPrometheus(1.0))
    assert sorted(p.relative_to(run).as_posix() for p in files) == [
        "metrics/g6/replay.json",
        "metrics/inf2/replay.json",
    ]
    saved = json.loads((run / "metrics/g6/replay.json").read_text())
    # first send (wall_start + 0) to last completion (wall_start + 59 + 1 s)
    assert saved["window_unix"] == [1_700_000_000.0, 1_700_000_060.0]
    q = saved["queries"]["server_ttft"]
    assert q["query"] == 'sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{fleet="g6"}[62s]))'
    assert q["at"] == 1_700_000_061.0  # one scrape past the last completion
    assert saved["queries"]["up_min"]["query"].startswith('min_over_time(up{fleet="g6",job=~"server|serving-.+"}')

    r = _report(m, run)
    steps = r["prometheus"]["steps"]
    for fleet in ("inf2", "g6"):
        (step,) = steps[fleet]
        assert step["label"] == "replay" and step["source"] == "pulled" and step["status"] == "ok"
        assert step["series"] == f"metrics/{fleet}/replay.json"
        assert step["p95_ttft_s"] == pytest.approx(0.75) and step["p95_itl_s"] == pytest.approx(0.035)
        assert step["client_p95_ttft_s"] == pytest.approx(0.9)
        # the client's 0.9 s lies in the server P95's bucket (0.5, 1]: they agree within it, no signed gap;
        # its 0.05 s ITL lies above the server's (0.02, 0.04]: a gap, read at that bucket
        assert step["ttft_gap_s"] is None and step["ttft_bucket_s"] == [0.5, 1.0]
        assert step["itl_gap_s"] == pytest.approx(0.05 - 0.035) and step["itl_bucket_s"] == [0.02, 0.04]
        assert r["provenance"][f"prometheus.steps.{fleet}"]["source"] == "pulled"
    assert r["prometheus"]["fleets"] == {}  # no live pull: only the saved series


def test_editing_a_saved_series_changes_the_figure(tmp_path: Path, small: Manifest) -> None:
    m = small
    run = _run_dir(tmp_path, m)
    _save(m, run, StandInPrometheus(1.0))
    before = _report(m, run)["prometheus"]["steps"]["g6"][0]["p95_ttft_s"]
    path = run / "metrics/g6/replay.json"
    saved = json.loads(path.read_text())
    for s in saved["queries"]["server_ttft"]["result"]:  # 10 more requests land in the slowest bucket
        if s["metric"]["le"] in ("+Inf",):
            s["value"][1] = "110"
    path.write_text(json.dumps(saved))
    after = _report(m, run)["prometheus"]["steps"]
    # 110 in all, rank 104.5 in the +Inf bucket: the highest finite bound, 1.0, read in (1, +Inf)
    assert before == pytest.approx(0.75) and after["g6"][0]["p95_ttft_s"] == pytest.approx(1.0)
    assert after["g6"][0]["ttft_bucket_s"] == [1.0, None] and after["g6"][0]["ttft_gap_s"] == pytest.approx(-0.1)
    assert after["inf2"][0]["p95_ttft_s"] == pytest.approx(0.75)  # the other fleet's file is untouched


def test_a_window_under_six_scrapes_is_too_short_for_server_truth(tmp_path: Path, small: Manifest) -> None:
    m = small
    run = _run_dir(tmp_path, m, n=20)  # a 20 s window
    _save(m, run, StandInPrometheus(5.0))  # 4 scrapes of 5 s
    r = _report(m, run)
    step = r["prometheus"]["steps"]["g6"][0]
    assert step["status"] == "too_short" and TOO_SHORT in step["note"]
    assert step["p95_ttft_s"] is None and step["ttft_gap_s"] is None
    assert step["window_s"] < MIN_SCRAPES * 5.0


@pytest.mark.parametrize(("up_min", "missing", "why"), [(0.0, 0, "up = 0"), (1.0, 10, "scrapes")])
def test_a_target_down_for_part_of_the_window_is_a_gap_not_a_smaller_histogram(
    tmp_path: Path, small: Manifest, up_min: float, missing: int, why: str
) -> None:
    m = small
    run = _run_dir(tmp_path, m)
    _save(m, run, StandInPrometheus(1.0, up_min=up_min, missing_scrapes=missing))
    r = _report(m, run)
    step = r["prometheus"]["steps"]["inf2"][0]
    assert step["status"] == "target_down" and why in step["note"]
    assert step["p95_ttft_s"] is None and step["p95_itl_s"] is None
    gaps = {g["what"]: g for g in r["gaps"]}
    assert "prometheus.steps.inf2.replay" in gaps and why in gaps["prometheus.steps.inf2.replay"]["reason"]


def test_one_missed_scrape_at_an_edge_is_not_a_target_down(tmp_path: Path, small: Manifest) -> None:
    m = small
    run = _run_dir(tmp_path, m)
    _save(m, run, StandInPrometheus(1.0, missing_scrapes=1))
    assert _report(m, run)["prometheus"]["steps"]["g6"][0]["status"] == "ok"


def test_settle_segments_and_steps_get_their_own_windows(tmp_path: Path, small: Manifest) -> None:
    m = small
    run = _run_dir(tmp_path, m, n=10)
    step = run / "capacity" / "g6" / "x2"
    write_jsonl(step / "records-g6-w0.jsonl", steady(m, "g6", 30, 500))
    seg = [r for r in steady(m, "g6", 30, 500)]
    write_jsonl(step / "settle-1" / "records-g6-w0.jsonl", [_shifted(r, 100.0) for r in seg])
    windows = step_windows(m, run / "records", {"g6/x2": step})
    t0 = 1_700_000_000.0
    assert windows[("g6", "g6/x2")] == (t0, t0 + 30)
    assert windows[("g6", "g6/x2+settle-1")] == (t0 + 100, t0 + 130)
    assert windows[("inf2", "replay")] == (t0, t0 + 10)
    # the step's load span (its overhead's reference) still runs over its segments together
    assert goodput.load_span_s(load_records(step, m.digest)) == {"g6": 130.0}
    assert series_path(Path("metrics"), "g6", "g6/x2+settle-1") == Path("metrics/g6/x2+settle-1.json")


def _shifted(r: Any, by: float) -> Any:
    from dataclasses import replace

    return replace(r, request_id=r.request_id + 1000, wall_start=r.wall_start + by)


def test_a_malformed_saved_series_names_the_file_and_field(tmp_path: Path, small: Manifest) -> None:
    m = small
    run = _run_dir(tmp_path, m)
    (path,) = [p for p in _save(m, run, StandInPrometheus(1.0)) if p.parent.name == "g6"]
    saved = json.loads(path.read_text())
    saved["scrape_interval_s"] = 0
    path.write_text(json.dumps(saved))
    with pytest.raises(AnalysisError, match=r"g6/replay.json: scrape_interval_s"):
        read_series(path)
    saved["scrape_interval_s"] = 1.0
    saved["queries"]["server_itl"]["result"] = [{"metric": {}, "value": [0, "1"]}]
    path.write_text(json.dumps(saved))
    with pytest.raises(AnalysisError, match=r"queries.server_itl: a bucket series without le"):
        server_step(read_series(path), str(path))


def test_both_pages_show_each_steps_server_p95s_gap_and_why_a_step_has_none(tmp_path: Path, small: Manifest) -> None:
    from analysis.model import Report
    from analysis.report.render.html import render_html
    from analysis.report.render.markdown import render_markdown

    m = small
    run = _run_dir(tmp_path, m)
    _save(m, run, StandInPrometheus(1.0))
    short = json.loads((run / "metrics/inf2/replay.json").read_text())
    short["window_unix"][1] = short["window_unix"][0] + 4.0  # 4 s: under 6 scrapes of 1 s
    (run / "metrics/inf2/replay.json").write_text(json.dumps(short))
    report = Report.model_validate(_report(m, run))
    md, page = render_markdown(report), render_html(report)
    g6_row = (
        "| g6 | replay | 60.0 | 0.750 | 0.900 | within bucket 0.5-1 | 0.0350 | 0.0500 | 0.0150 (bucket 0.02-0.04) "
        "| pulled |"
    )
    assert g6_row in md
    assert "<td>g6</td><td>replay</td><td>60.0</td><td>0.750</td><td>0.900</td><td>within bucket 0.5-1</td>" in page
    assert "<td>0.0150 (bucket 0.02-0.04)</td>" in page
    assert "| inf2 | replay | 4.0 | n/a |" in md and f"{TOO_SHORT}: a 4.0 s window" in md
    assert f"{TOO_SHORT}: a 4.0 s window" in page
    assert "Histograms over the replay window: not queried for this report" in md
    from tests.analysis.report_pages import PageText
    from tests.analysis.test_report_html import _md_cells

    cells = set(PageText(page).cells)  # every cell of the new table in both pages, as for the others
    assert [c for c in _md_cells(md) if c not in cells] == []


@pytest.mark.parametrize(
    ("client", "gap", "cell"),
    [
        (0.2, None, "within bucket 0.1-0.25"),  # inside (0.1, 0.25]: the old code gave -0.031 s
        (0.4, 0.4 - 0.23125, "0.169 (bucket 0.1-0.25)"),  # above it: a gap, with the resolution it is read at
        (0.05, 0.05 - 0.23125, "-0.181 (bucket 0.1-0.25)"),  # below it
    ],
)
def test_a_client_p95_inside_the_servers_bucket_agrees_within_it_and_is_no_signed_gap(
    tmp_path: Path, small: Manifest, client: float, gap: float | None, cell: str
) -> None:
    """Issue 46, finding 11: the server's P95 from its histogram is known only to lie in its bucket
    (here 0.1-0.25 s, interpolated to 0.231 s); a client P95 inside that bucket is no gap of
    -0.031 s (client faster than the server) but agreement within the bucket's resolution."""
    from analysis.model import Report
    from analysis.report.render.html import render_html
    from analysis.report.render.markdown import render_markdown

    m = small
    run = _run_dir(tmp_path, m, ttft=client)
    _save(m, run, StandInPrometheus(1.0, ttft=TTFT_FAST))
    r = _report(m, run)
    step = r["prometheus"]["steps"]["g6"][0]
    assert step["p95_ttft_s"] == pytest.approx(0.23125) and step["client_p95_ttft_s"] == pytest.approx(client)
    assert step["ttft_gap_s"] == (None if gap is None else pytest.approx(gap))
    assert step["ttft_bucket_s"] == [0.1, 0.25]
    report = Report.model_validate(r)
    md, page = render_markdown(report), render_html(report)
    assert f"| g6 | replay | 60.0 | 0.231 | {client:.3f} | {cell} | 0.0350 |" in md
    assert f"<td>{client:.3f}</td><td>{cell}</td>" in page
