"""runtime/emulator/calibrate.py, the fitter of data/calibration/efficiency.json: reading any rows
file, and one published row replayed live vs simulated."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from runtime.emulator import EmulatorConfig, create_app
from runtime.emulator import calibrate as cal
from runtime.emulator.engine import EngineSeq
from runtime.emulator.simulate import Load, simulate, summarise
from tests.conftest import ROOT
from tests.runtime.conftest import MODEL, load

HEADER = ",".join(cal.REQUIRED)
ROW = "x,src,2026-01-01,g5.2xlarge,vllm-v0,1,1,256,8.03,bf16,550,150,concurrency,1,31.9,137,30.7,mean"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "rows.csv"
    p.write_text(text)
    return p


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.emulator.calibrate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER.replace(",itl_ms", "") + "\n" + ROW, "line 1: missing column(s) itl_ms"),
        (
            HEADER + "\n" + ROW.replace(",g5.2xlarge,", ",g9.huge,"),
            "line 2: column 'instance_type': unknown instance type 'g9.huge'",
        ),
        (
            HEADER + "\n" + ROW + "\n" + ROW.replace("x,", "y,").replace(",137,", ",fast,"),
            "line 3: column 'ttft_ms': 'fast' is not a number",
        ),
        (HEADER + "\n" + ROW.replace(",concurrency,1,", ",burst,1,"), "line 2: column 'load_kind': 'burst'"),
        (
            HEADER + "\n" + ROW.replace(",vllm-v0,", ",vllm-neuron,"),
            "line 2: column 'serving_stack': vllm-neuron does not run on g5.2xlarge",
        ),
        (HEADER + "\n" + ROW + "\n" + ROW, "line 3: column 'id': 'x' is used twice"),
        (
            HEADER + "\n" + ROW.replace("vllm-v0,1,1,", "vllm-v0,2,1,"),
            "line 2: column 'tensor_parallel': 2 is not a TP degree of g5.2xlarge",
        ),
        (HEADER + ",use\n" + ROW + ",train", "line 2: column 'use': 'train' is not fit or test"),
        (HEADER + ",requests_per_s\n" + ROW + ",-1", "line 2: column 'requests_per_s': must be > 0"),
        (
            HEADER + ",client\n" + ROW + ",locust",
            "line 2: column 'client': 'locust' is not one of steady, guidellm-0.1, llmperf-waves",
        ),
    ],
)
def test_a_bad_rows_file_names_the_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(cal.RowError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cal.read_rows(_write(tmp_path, text))


def test_any_file_with_the_columns_works_and_prints_json(tmp_path: Path) -> None:
    # Two single-user rows of one group (fit from them), one loaded row to predict.
    rows = [ROW, ROW.replace("x,", "y,").replace(",concurrency,1,31.9,137,30.7,", ",concurrency,4,110.9,171,33.9,")]
    path = _write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    r = _run("--rows", str(path), "--json", "--efficiency", str(tmp_path / "absent.json"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {x["id"] for x in out["rows"]} == {"x", "y"}
    assert set(out["median_abs_rel_error"]) == {"output_tok_s", "ttft_ms", "itl_ms"}
    y = {x["metric"]: x for x in out["rows"] if x["id"] == "y"}
    assert y["itl_ms"]["published"] == 33.9 and y["itl_ms"]["rel_error"] == pytest.approx(
        (y["itl_ms"]["predicted"] - 33.9) / 33.9, abs=1e-3
    )
    bad = _run("--rows", str(_write(tmp_path, HEADER + "\n" + ROW.replace(",mean", ",mode"))))
    assert bad.returncode == 2 and "line 2: column 'statistic'" in bad.stderr


def test_fit_uses_only_single_user_rows_and_records_them() -> None:
    rows = cal.read_rows(cal.DEFAULT_ROWS)
    groups = cal.fit(rows)
    neuron = groups["neuron-nxd"]
    # one vendor family, one set of fractions: every single-user Inferentia2 row not kept unseen
    assert set(neuron["rows"]) == {r.id for r in rows if r.vendor == "aws-neuron" and r.single_user and r.use == "fit"}
    assert set(neuron["own_rows"]) == {
        r.id for r in rows if r.group == "neuron-nxd" and r.single_user and r.use == "fit"
    }
    assert "on-vllm-inf2-tp2-c4" not in neuron["rows"] and not any(rid.startswith("inf2xl-") for rid in neuron["rows"])
    assert (
        groups["neuron-hlo-tgi"]["bandwidth"] == neuron["bandwidth"]
        and groups["neuron-hlo-tgi"]["compute"] == neuron["compute"]
    )
    # the committed file is what --fit writes from the committed rows (its out-of-sample band: test below)
    committed = json.loads(cal.EFFICIENCY_FILE.read_text())["groups"]
    assert {k: {f: v for f, v in g.items() if f != "out_of_sample"} for k, g in committed.items()} == json.loads(
        json.dumps(groups)
    )
    assert all(set(g["out_of_sample"]["median_abs_rel_error"]) == set(cal.METRICS) for g in committed.values())


def _rows(tmp_path: Path, lines: list[str], header: str = HEADER) -> list[cal.Row]:
    return cal.read_rows(_write(tmp_path, header + "\n" + "\n".join(lines) + "\n"))


def test_every_fitted_efficiency_stays_within_its_published_range(tmp_path: Path) -> None:
    # A first token in 20 ms for 550 prompt tokens would need 2.2 x the A10G's peak FLOP/s, and an
    # ITL of 5 ms 5 x its memory bandwidth: the fit stops at the published bounds and says so.
    fast = ROW.replace(",31.9,137,30.7,", ",200,20,5,")
    g = cal.fit(_rows(tmp_path, [fast]))["nvidia-vllm"]
    ranges = cal.PHYSICS["nvidia"]
    assert g["compute"] == ranges["compute"].high and g["bandwidth"] == ranges["bandwidth"].high
    assert set(g["at_bound"]) == {"compute", "bandwidth"}
    slow = ROW.replace(",31.9,137,30.7,", ",1,40000,3000,")
    g = cal.fit(_rows(tmp_path, [slow]))["nvidia-vllm"]
    assert g["compute"] == ranges["compute"].low and g["bandwidth"] == ranges["bandwidth"].low
    assert g["step_overhead_ms"] <= cal.STEP_OVERHEAD_MS[1] and g["request_overhead_ms"] <= cal.REQUEST_OVERHEAD_MS[1]
    # every committed group: fractions strictly inside (0, 1) and inside their vendor's range
    for group in json.loads(cal.EFFICIENCY_FILE.read_text())["groups"].values():
        for name in ("bandwidth", "compute"):
            r = cal.PHYSICS[group["vendor"]][name]
            assert 0 < r.low <= group[name] <= r.high < 1 and r.sources


def test_loso_fits_without_the_configuration_it_predicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two GPU configurations (vLLM V0 and TensorRT-LLM on the A10G), one single-user row each.
    # The TensorRT-LLM row's ITL is made twice the vLLM row's: fitted in sample, the shared
    # bandwidth fraction splits the difference; left out, it is predicted from vLLM's row alone.
    trt = ROW.replace("x,", "t,").replace(",vllm-v0,", ",tensorrt-llm,").replace(",31.9,137,30.7,", ",16,137,61.4,")
    rows = _rows(tmp_path, [ROW, trt])
    seen: list[set[str]] = []
    real_fit = cal.fit
    monkeypatch.setattr(cal, "fit", lambda rs: seen.append({r.id for r in rs}) or real_fit(rs))
    out = cal.loso(rows)
    folds = cal.folds(rows)
    assert len(folds) == 2 and seen[0] == {"x", "t"}  # the first fit: all rows, for the unseen ones
    for key, held in folds.items():
        trained = set(out["folds"][key]["groups"])
        assert not {r.id for r in held} & seen[1 + list(folds).index(key)]  # the held-out rows are not in its fit
        assert cal.GROUP_OF_STACK[held[0].serving_stack] not in trained  # so neither is their group
    in_sample = {x["id"]: x for x in cal.compare(rows, real_fit(rows))["rows"] if x["metric"] == "itl_ms"}
    held_out = {x["id"]: x for x in out["rows"] if x["metric"] == "itl_ms"}
    assert abs(held_out["t"]["rel_error"]) > abs(in_sample["t"]["rel_error"]) + 0.1
    assert held_out["t"]["predicted"] == pytest.approx(
        held_out["x"]["published"], rel=0.05
    )  # vLLM's figure, transferred
    assert set(out) >= {"rows", "median_abs_rel_error", "max_abs_rel_error", "by_vendor", "holdout", "folds"}


def test_loso_json_keeps_the_shape_of_the_in_sample_json(tmp_path: Path) -> None:
    trt = ROW.replace("x,", "t,").replace(",vllm-v0,", ",tensorrt-llm,")
    path = _write(tmp_path, HEADER + "\n" + ROW + "\n" + trt + "\n")
    a, b = (
        json.loads(_run("--rows", str(path), "--json", *extra, "--efficiency", str(tmp_path / "no.json")).stdout)
        for extra in ((), ("--loso",))
    )
    for key in ("median_abs_rel_error", "max_abs_rel_error"):
        assert set(a[key]) == set(b[key]) == set(cal.METRICS)
    assert [(x["id"], x["metric"]) for x in a["rows"]] == [(x["id"], x["metric"]) for x in b["rows"]]
    assert b["holdout"] == "configuration" and a["fitted_rows"] and not b["fitted_rows"]


def test_a_row_that_held_fewer_users_is_replayed_with_their_think_time(tmp_path: Path) -> None:
    header = HEADER + ",requests_per_s,request_latency_s"
    # 16 users, 0.5 requests/s completed at 8 s each: 4 in flight on average, so each user
    # thought 16 / 0.5 - 8 = 24 s between a response and its next request.
    loaded = ROW.replace(",concurrency,1,31.9,137,30.7,", ",concurrency,16,75,300,40,") + ",0.5,8"
    r = _rows(tmp_path, [loaded], header)[0]
    assert r.in_flight() == pytest.approx(4.0)
    assert r.held_load == Load("concurrency", 16, 24.0)
    assert r.load_shortfall() is None and "held 4.0 of 16 users" in (r.held_note() or "")
    timing = r.timing(cal.efficiency_of(r, cal.fit(_rows(tmp_path, [ROW]))))
    held, _ = simulate(timing, r.held_load, r.sizes())
    stated, _ = simulate(timing, r.load, r.sizes())
    assert held.output_tok_s < 0.5 * stated.output_tok_s  # a quarter of the requests in flight
    # without the published rate and latency the shortfall can only be reported
    bare = _rows(tmp_path, [ROW.replace(",concurrency,1,31.9,137,30.7,", ",concurrency,16,75,300,40,")])[0]
    assert bare.held_load == bare.load and (bare.load_shortfall() or "").startswith("Little's law")


def test_the_stored_out_of_sample_bands_are_what_loso_gives_on_the_committed_rows() -> None:
    # plan and the report print the band efficiency.json pins; refitting must reproduce it, so a
    # change to the rows, the fit or the engine cannot leave a stale band behind (--fit rewrites it)
    rows = cal.read_rows(cal.DEFAULT_ROWS)
    bands = cal.out_of_sample_bands(cal.loso(rows), cal.fit(rows))
    committed = json.loads(cal.EFFICIENCY_FILE.read_text())["groups"]
    assert {k: g["out_of_sample"] for k, g in committed.items()} == json.loads(json.dumps(bands))


def test_a_guidellm_row_is_replayed_as_guidellm_0_1_sends_and_counts(tmp_path: Path) -> None:
    # 8 users with 400-token outputs on the A10G: guidellm keeps at most 7 outstanding, sends
    # nothing after 120 s and drops what is still running then.
    row = ROW.replace(",concurrency,1,", ",concurrency,8,").replace(",550,150,", ",550,400,")
    r = _rows(tmp_path, [row + ",guidellm-0.1"], HEADER + ",client")[0]
    run = cal.guidellm_run(r, r.timing(cal.efficiency_of(r, cal.fit(_rows(tmp_path, [ROW])))))
    assert run.counted and run.pooled_itl
    assert all(s.finish_reason == "length" and (s.last_token_at or 0) <= cal.GUIDELLM_SECONDS for s in run.counted)
    events = sorted([(s.arrival, 1) for s in run.counted] + [(s.last_token_at or 0.0, -1) for s in run.counted])
    outstanding = max(sum(d for _, d in events[: i + 1]) for i in range(len(events)))
    assert outstanding == 7
    # the last requests sent were still running at 120 s: not counted, so the span ends before it
    last = max(s.last_token_at or 0.0 for s in run.counted)
    assert last < cal.GUIDELLM_SECONDS and run.span_s == pytest.approx(last - min(s.arrival for s in run.counted))
    figures = cal.predict(r, cal.fit(_rows(tmp_path, [ROW])))
    assert figures["output_tok_s"] == pytest.approx(sum(s.generated for s in run.counted) / run.span_s)


def test_an_llmperf_row_is_replayed_in_waves_as_llmperf_before_its_fix_sent_them(tmp_path: Path) -> None:
    r = _rows(tmp_path, [ROW.replace(",concurrency,1,", ",concurrency,8,") + ",llmperf-waves"], HEADER + ",client")[0]
    run = cal.llmperf_waves_run(r, r.timing(cal.efficiency_of(r, cal.fit(_rows(tmp_path, [ROW])))))
    assert len(run.counted) == 104 and not run.pooled_itl  # 13 waves of 8: the first count >= 100
    waves = [run.counted[i : i + 8] for i in range(0, 104, 8)]
    for before, wave in itertools.pairwise(waves):
        # a wave starts once the last request of the one before is back, one launch later
        assert min(s.arrival for s in wave) == pytest.approx(
            max(s.last_token_at or 0.0 for s in before) + cal.LLMPERF_LAUNCH_S
        )
        gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(wave)]
        assert gaps == pytest.approx([cal.LLMPERF_LAUNCH_S] * 7)
    assert run.span_s == pytest.approx(max(s.last_token_at or 0.0 for s in waves[-1]) + cal.LLMPERF_LAUNCH_S)


def test_plan_prints_the_out_of_sample_band_with_the_fitted_efficiency(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    from campaign.plan.roofline import plan, render_text
    from core import catalog

    _, m = load(tmp_path, manifest_data)
    text = render_text(m, plan(m))
    for fleet in m.fleets:
        c = catalog.calibrated_efficiency(fleet.efficiency.calibration or "")
        band = c.out_of_sample
        assert band is not None and c.error_band is not None and c.error_band in text
        # the printed medians are the stored ones
        assert f"TTFT {band['median_abs_rel_error']['ttft_ms']:.0%}" in c.error_band
    assert "NVIDIA A10G rows" in text  # the g6 fleet's band was measured on another GPU, and says so


def test_the_report_note_carries_each_fleets_pinned_out_of_sample_band(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    from campaign.backends.local import engine
    from core import catalog

    data = copy.deepcopy(manifest_data)
    data["fleets"][1]["efficiency"] = {"bandwidth": 0.7, "compute": 0.5}  # assumed by the manifest: no measured error
    _, m = load(tmp_path, data)
    note = engine.emulator_note(m)
    calibrated, assumed = m.fleets
    band = catalog.calibrated_efficiency(calibrated.efficiency.calibration or "").error_band
    assert band and f"{calibrated.name} (calibration {calibrated.efficiency.calibration!r}): {band}" in note
    assert f"{assumed.name}: efficiency assumed by the manifest, error not measured" in note
    # the campaign-wide note (campaign local) names every fitted vendor family's band, as pinned
    for g in catalog.calibration_groups().values():
        assert g.error_band and g.error_band in engine.EMULATOR_NOTE


@pytest.mark.parametrize(
    ("row_id", "output_tokens"),
    [
        # vLLM V0 on GPU: 4 users, 550+-150 prompt / 150+-10 output tokens. Not cut as the row below
        # is: at 48 output tokens the live TTFT came out 26% above the simulated on a loaded machine.
        ("a10g-vllm-c4", None),
        # vLLM on Neuron: prefill steps of several 4,096-token passes whose first tokens leave
        # together, static decode; outputs cut to 24 tokens to keep the run short
        ("on-vllm-inf2-tp2-c4", 24),
    ],
)
def test_a_published_row_replayed_live_agrees_with_simulated_time(
    manifest_data: dict[str, Any], tmp_path: Path, row_id: str, output_tokens: int | None
) -> None:
    """The row's configuration through the HTTP server (sockets, streaming) vs simulated time.

    Real time on purpose: the subject is the live server's timing agreeing with the simulation."""
    row = next(r for r in cal.read_rows(cal.DEFAULT_ROWS) if r.id == row_id)
    if not row.input_spread:
        # Identical requests keep the users in lockstep, where a millisecond of HTTP decides whether
        # a newcomer joins a prefill step: spread the prompts as a client's would be.
        row = dataclasses.replace(row, input_spread=100, output_spread=10)
    groups = json.loads(cal.EFFICIENCY_FILE.read_text())["groups"]
    timing = row.timing(cal.efficiency_of(row, groups))
    n = 12
    drawn = row.sizes()

    def sizes(i: int) -> tuple[int, int]:
        inp, out = drawn(i)
        return inp, output_tokens or out

    predicted, _ = simulate(timing, row.load, sizes, requests=n)
    _, m = load(tmp_path, manifest_data)
    cfg = EmulatorConfig.from_manifest(m, "g6")

    async def main() -> list[EngineSeq]:
        server = TestServer(create_app(cfg, timing), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url(""))
        done: list[EngineSeq] = []
        t0 = time.monotonic()
        next_index = 0
        try:
            async with aiohttp.ClientSession() as s:

                async def user() -> None:
                    nonlocal next_index
                    while next_index < n:
                        i = next_index
                        next_index += 1
                        inp, out = sizes(i)
                        prompt = " ".join([f"request{i}"] + ["token"] * (inp - 1))
                        seq = EngineSeq(inp, out, time.monotonic() - t0)
                        body = {"model": MODEL, "prompt": prompt, "max_tokens": out, "stream": True}
                        async with s.post(url + "/v1/completions", json=body) as r:
                            assert r.status == 200
                            async for raw in r.content:
                                if raw.startswith(b"data: {"):
                                    now = time.monotonic() - t0
                                    seq.generated += 1
                                    seq.first_token_at = seq.first_token_at or now
                                    seq.last_token_at = now
                        assert seq.generated == out
                        seq.finish_reason = "length"
                        done.append(seq)

                await asyncio.gather(*(user() for _ in range(row.load.users)))
        finally:
            await server.close()
        return sorted(done, key=lambda s: s.arrival)

    live = summarise(asyncio.run(main()), warmup=row.load.users)
    assert live.requests == predicted.requests == n - row.load.users
    for metric in ("ttft_s", "itl_s", "output_tok_s"):
        got, want = getattr(live, metric), getattr(predicted, metric)
        assert got == pytest.approx(want, rel=0.10), (metric, got, want)
    assert isinstance(row.load, Load)


def test_buckets_column_is_optional_and_checked(tmp_path: Path) -> None:
    header = HEADER + ",max_model_len,buckets"
    good = _write(tmp_path, header + "\n" + ROW + ",1024,512 1024")
    assert cal.read_rows(good)[0].buckets == (512, 1024)
    bad = _write(tmp_path, header + "\n" + ROW + ",1024,512 big")
    with pytest.raises(cal.RowError, match="line 2: column 'buckets': '512 big'"):
        cal.read_rows(bad)
    short = _write(tmp_path, header + "\n" + ROW + ",1024,512")
    with pytest.raises(cal.RowError, match=r"line 2: column 'buckets'.*max_model_len 1024"):
        cal.read_rows(short)


def test_a_loaded_ttft_below_its_single_user_ttft_is_reported_not_matchable(tmp_path: Path) -> None:
    loaded = ROW.replace("x,", "y,").replace(",concurrency,1,31.9,137,", ",concurrency,4,110.9,120,")
    rows = cal.read_rows(_write(tmp_path, HEADER + "\n" + ROW + "\n" + loaded))
    assert cal.ttft_below_synchronous(rows) == {"y": "TTFT under load 120 ms is below its single-user TTFT 137 ms"}
    report = cal.compare(rows, cal.fit(rows))
    assert "y" in report["not_matchable"] and "x" not in report["not_matchable"]
