"""The emulator app in-process: bad requests, faults, saturation, metrics."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from runtime.emulator import EmulatorConfig, TimingModel, create_app
from tests.runtime.conftest import MODEL, load, variant

Body = dict[str, Any]


def run_app(cfg: EmulatorConfig, fn: Callable[[str, aiohttp.ClientSession], Awaitable[None]]) -> None:
    async def main() -> None:
        server = TestServer(create_app(cfg), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                await fn(str(server.make_url("")), session)
        finally:
            await server.close()

    asyncio.run(main())


async def stream_events(session: aiohttp.ClientSession, url: str, body: Body) -> tuple[list[Any], list[float], bool]:
    """SSE payloads, arrival times of content chunks, and whether [DONE] came."""
    events: list[Any] = []
    times: list[float] = []
    done = False
    async with session.post(url + "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            ev = json.loads(line[6:])
            if ev["choices"] and ev["choices"][0]["text"]:
                times.append(time.monotonic())
            events.append(ev)
    return events, times, done


def fast_cfg(manifest_data: Body, tmp_path: Path, **faults: float) -> EmulatorConfig:
    _, m = load(tmp_path, manifest_data)
    return EmulatorConfig.from_manifest(m, "inf2", **faults)


BAD: list[tuple[str, Body | list[int] | str, str | None]] = [
    ("/v1/completions", "{not json", None),
    ("/v1/completions", {"prompt": "hi"}, "model"),
    ("/v1/completions", {"model": MODEL}, "prompt"),
    ("/v1/chat/completions", {"model": MODEL}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": "a " * 2600}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "a " * 100, "max_tokens": 2500}, "max_tokens"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9999},
        "max_completion_tokens",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "stop": 5}, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 3]}, "prompt"),
    ("/v1/completions", [1, 2], None),
]


def test_bad_requests_get_openai_400s(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        for path, body, param in BAD:
            data = body if isinstance(body, str) else json.dumps(body)
            async with s.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, (path, body)
                err = (await r.json())["error"]
                assert err["type"] == "invalid_request_error" and err["message"]
                assert err["param"] == param, (body, err)
        async with s.get(url + "/health") as r:  # still alive
            assert r.status == 200

    run_app(fast_cfg(manifest_data, tmp_path), check)


def test_unknown_model_is_a_404_like_vllm(manifest_data: Body, tmp_path: Path) -> None:
    # vLLM: 404 NotFoundError "The model `x` does not exist." for a name it does not serve,
    # on generation and on /tokenize alike.
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        for path, body in (
            ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
            ("/tokenize", {"model": MODEL, "prompt": "hi"}),
        ):
            async with s.post(url + path, json=body) as r:
                assert r.status == 404, path
                err = (await r.json())["error"]
                assert err["type"] == "NotFoundError" and err["message"] == f"The model `{MODEL}` does not exist."
        async with s.post(url + "/tokenize", json={"model": "local/tiny", "prompt": "hi there"}) as r:
            assert r.status == 200 and (await r.json())["count"] == 2
        async with s.get(url + "/v1/models") as r:
            assert [c["id"] for c in (await r.json())["data"]] == ["local/tiny"]

    _, m = load(tmp_path, manifest_data)
    run_app(EmulatorConfig(m, m.fleet("inf2"), served_model_name="local/tiny"), check)


def test_error_rate_gives_500s(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        for _ in range(3):
            async with s.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}) as r:
                assert r.status == 500
                assert (await r.json())["error"]["code"] == "injected_fault"

    run_app(fast_cfg(manifest_data, tmp_path, error_rate=1.0), check)


def test_truncate_ends_stream_without_finish_or_done(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        events, times, done = await stream_events(s, url, {"model": MODEL, "prompt": "hi", "max_tokens": 10})
        assert not done and len(times) == 5
        assert all(e["choices"][0]["finish_reason"] is None for e in events)

    run_app(fast_cfg(manifest_data, tmp_path, truncate_rate=1.0), check)


def test_reset_aborts_connection_mid_stream(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        with pytest.raises(aiohttp.ClientError, match="reset by peer"):
            await stream_events(s, url, {"model": MODEL, "prompt": "hi", "max_tokens": 10})
        async with s.get(url + "/health") as r:  # the emulator survives it
            assert r.status == 200

    cfg = fast_cfg(manifest_data, tmp_path, reset_rate=1.0)
    run_app(cfg, check)


def test_stall_pauses_mid_stream(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        _, times, done = await stream_events(s, url, {"model": MODEL, "prompt": "hi", "max_tokens": 8})
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert done and len(times) == 8
        assert gaps.index(max(gaps)) == 3  # between token 4 and 5: half-way
        assert max(gaps) >= 0.4 and statistics.median(gaps) < 0.1

    run_app(fast_cfg(manifest_data, tmp_path, stall_rate=1.0, stall_s=0.4), check)


def test_slow_start_delays_first_token(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        t0 = time.monotonic()
        _, times, done = await stream_events(s, url, {"model": MODEL, "prompt": "hi", "max_tokens": 3})
        assert done and times[0] - t0 >= 0.5
        assert times[-1] - times[0] < 0.3

    run_app(fast_cfg(manifest_data, tmp_path, slow_start_s=0.5), check)


def test_saturation_queues_and_ttft_grows(manifest_data: Body, tmp_path: Path) -> None:
    """4 slots, 16 simultaneous requests: later ones queue, so TTFT climbs in waves of 4 (vLLM on
    GPU, whose chunked prefill admits all four short prompts in one step)."""
    # ~0.2 s steps: all 16 requests reach the server well inside the first wave even on a busy box.
    data = variant(manifest_data, "g6", max_concurrency=4, efficiency={"bandwidth": 0.25, "compute": 0.5})
    _, m = load(tmp_path, data)
    cfg = EmulatorConfig.from_manifest(m, "g6")

    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async def one() -> tuple[float, int]:
            t0 = time.monotonic()
            async with s.post(
                url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 6, "stream": True}
            ) as r:
                first = None
                async for raw in r.content:
                    if first is None and raw.startswith(b"data: {"):
                        first = time.monotonic() - t0
            assert first is not None
            return first, 0

        async def scrape(name: str, labels: str = "") -> float:
            async with s.get(url + "/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith(name + "{") and labels in line:
                        return float(line.split()[-1])
            raise AssertionError(name)

        tasks = [asyncio.create_task(one()) for _ in range(16)]
        # Wait until all 16 have reached the server (a loaded CI box may take longer than a step).
        for _ in range(100):
            if await scrape("vllm:num_requests_running") + await scrape("vllm:num_requests_waiting") == 16:
                break
            await asyncio.sleep(0.01)
        assert await scrape("vllm:num_requests_running") == 4
        assert await scrape("vllm:num_requests_waiting") >= 8
        ttfts = sorted(t for t, _ in await asyncio.gather(*tasks))
        # The fourth wave waits for three waves of 6 steps each before it is admitted.
        step = TimingModel.for_fleet(m, m.fleet("g6")).step_s(4 * 8, 0, 4)
        waves = [statistics.median(ttfts[i : i + 4]) for i in range(0, 16, 4)]
        # Measured between waves, not from the client's start: on a loaded CI box the 16 connections
        # alone once took half a second to open (0.70 s to the first wave's first token).
        assert all(later - earlier > 0.9 * 6 * step for earlier, later in itertools.pairwise(waves))
        assert await scrape("vllm:num_requests_running") == 0
        assert await scrape("vllm:request_success_total", 'finished_reason="length"') == 16
        assert await scrape("vllm:generation_tokens_total") == 16 * 6

    run_app(cfg, check)


def test_metrics_are_served_where_a_tensorrt_llm_fleet_is_scraped_too(manifest_data: Body, tmp_path: Path) -> None:
    # A rehearsal's Prometheus scrapes each fleet's definition's metrics_path; TensorRT-LLM's is
    # /prometheus/metrics, and a 404 there would leave that fleet with no series in AMP.
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        async with s.get(url + "/metrics") as plain, s.get(url + "/prometheus/metrics") as trt:
            assert plain.status == trt.status == 200
            names = [
                {ln.split("{")[0].split()[0] for ln in (await r.text()).splitlines() if ln and ln[0] != "#"}
                for r in (plain, trt)
            ]
        assert names[0] == names[1] and "vllm:num_requests_running" in names[0]

    run_app(fast_cfg(manifest_data, tmp_path), check)


def test_request_id_is_echoed_and_ground_truth_recorded(manifest_data: Body, tmp_path: Path) -> None:
    async def check(url: str, s: aiohttp.ClientSession) -> None:
        t0 = time.monotonic()
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}
        async with s.post(url + "/v1/completions", json=body, headers={"X-Request-Id": "camp-g6-7"}) as r:
            assert r.headers["X-Request-Id"] == "camp-g6-7"
            first: float | None = None
            async for raw in r.content:
                if first is None and raw.startswith(b'data: {"id"'):
                    first = time.monotonic()
        t1 = time.monotonic()
        async with s.post(url + "/v1/completions", json={**body, "stream": False}) as r:  # no id: not recorded
            assert "X-Request-Id" not in r.headers
        got = (await (await s.get(url + "/emulator/requests?clear=1")).json())["requests"]
        assert [g["id"] for g in got] == ["camp-g6-7"]
        g = got[0]
        assert (
            t0 <= g["arrival"] <= g["first_token_emitted"] <= g["first_token_written"] <= g["last_token_emitted"] <= t1
        )
        assert first is not None and g["first_token_written"] <= first  # same monotonic clock as this process
        assert (g["tokens"], g["finish_reason"]) == (4, "length")
        assert (await (await s.get(url + "/emulator/requests")).json())["requests"] == []

    run_app(fast_cfg(manifest_data, tmp_path), check)
