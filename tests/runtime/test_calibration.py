"""bench/calibration.py: reading any rows file, and one published row replayed live vs simulated."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench import calibration as cal
from runtime.emulator import EmulatorConfig, create_app
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
    return subprocess.run([sys.executable, "bench/calibration.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER.replace(",itl_ms", "") + "\n" + ROW, "line 1: missing column(s) itl_ms"),
        (HEADER + "\n" + ROW.replace(",g5.2xlarge,", ",g9.huge,"), "line 2: column 'instance_type': unknown instance type 'g9.huge'"),
        (HEADER + "\n" + ROW + "\n" + ROW.replace("x,", "y,").replace(",137,", ",fast,"), "line 3: column 'ttft_ms': 'fast' is not a number"),
        (HEADER + "\n" + ROW.replace(",concurrency,1,", ",burst,1,"), "line 2: column 'load_kind': 'burst'"),
        (HEADER + "\n" + ROW.replace(",vllm-v0,", ",vllm-neuron,"), "line 2: column 'serving_stack': vllm-neuron does not run on g5.2xlarge"),
        (HEADER + "\n" + ROW + "\n" + ROW, "line 3: column 'id': 'x' is used twice"),
        (HEADER + "\n" + ROW.replace("vllm-v0,1,1,", "vllm-v0,2,1,"), "line 2: column 'tensor_parallel': 2 is not a TP degree of g5.2xlarge"),
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
    assert set(neuron["rows"]) == {r.id for r in rows if r.group == "neuron-nxd" and r.single_user}
    assert "on-vllm-inf2-tp2-c4" not in neuron["rows"]
    # the committed file is what --fit writes from the committed rows
    assert json.loads(cal.EFFICIENCY_FILE.read_text())["groups"] == json.loads(json.dumps(groups))


@pytest.mark.parametrize(
    ("row_id", "output_tokens"),
    [
        ("a10g-vllm-c4", None),  # vLLM V0 on GPU: 4 users, 550+-150 prompt / 150+-10 output tokens
        # vLLM on Neuron: prefill steps of several 4,096-token passes whose first tokens leave
        # together, static decode; outputs cut to 24 tokens to keep the run short
        ("on-vllm-inf2-tp2-c4", 24),
    ],
)
def test_a_published_row_replayed_live_agrees_with_simulated_time(
    manifest_data: dict[str, Any], tmp_path: Path, row_id: str, output_tokens: int | None
) -> None:
    """The row's configuration through the HTTP server (sockets, streaming) vs simulated time."""
    row = next(r for r in cal.read_rows(cal.DEFAULT_ROWS) if r.id == row_id)
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
