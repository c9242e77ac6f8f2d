"""A fleet's measured instances behind one emulator port, spread as the NLB spreads them, and the
same spread in simulated time (campaign plan)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from campaign.backends.simulated.fleets import spread_replay
from runtime.emulator import EmulatorConfig, TimingModel, create_app
from runtime.emulator.balancer import FlowHash
from runtime.emulator.engine import EngineSeq
from runtime.emulator.simulate import replay
from tests.runtime.conftest import MODEL, load, variant


async def _scrape(s: aiohttp.ClientSession, url: str, name: str) -> float:
    async with s.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + "{"):
                return float(line.split()[-1])
    raise AssertionError(name)


@pytest.mark.parametrize("instances", [1, 2])
def test_each_instance_runs_its_own_batch_behind_the_one_port(
    manifest_data: dict[str, Any], tmp_path: Path, instances: int
) -> None:
    """4 sequences per instance, 24 requests at once: 2 instances run 8, twice what one runs."""
    # ~0.2 s steps and 40 tokens each: nothing finishes while the requests arrive and are counted.
    data = variant(manifest_data, "g6", max_concurrency=4, efficiency={"bandwidth": 0.25, "compute": 0.5})
    _, m = load(tmp_path, data)
    cfg = EmulatorConfig(m, m.fleet("g6"), instances=instances)

    async def main() -> None:
        server = TestServer(create_app(cfg), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url(""))
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 40, "stream": True}

                async def one() -> None:
                    async with s.post(url + "/v1/completions", json=body) as r:
                        async for _ in r.content:
                            pass

                tasks = [asyncio.create_task(one()) for _ in range(24)]
                for _ in range(200):  # until every request has reached the server
                    if (
                        await _scrape(s, url, "vllm:num_requests_running")
                        + await _scrape(s, url, "vllm:num_requests_waiting")
                        == 24
                    ):
                        break
                    await asyncio.sleep(0.01)
                assert await _scrape(s, url, "vllm:num_requests_running") == 4 * instances
                assert await _scrape(s, url, "vllm:num_requests_waiting") == 24 - 4 * instances
                assert await _scrape(s, url, "emulator_instances") == instances
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await server.close()

    asyncio.run(main())


def test_the_flow_hash_spreads_requests_evenly_and_the_same_way_every_run() -> None:
    def draws(flow: FlowHash, n: int) -> list[int]:
        return [flow.pick() for _ in range(n)]

    picks = draws(FlowHash(4), 4000)
    assert draws(FlowHash(4), 4000) == picks  # seeded: the live emulator and the plan draw the same spread
    counts = Counter(picks)
    assert set(counts) == {0, 1, 2, 3} and all(900 < c < 1100 for c in counts.values())
    assert {FlowHash(1).pick() for _ in range(5)} == {0}
    with pytest.raises(ValueError, match="instances"):
        FlowHash(0)


def _in_flight_max(seqs: list[EngineSeq]) -> int:
    events = sorted(
        [(s.admitted_at or 0.0, 1) for s in seqs] + [(s.last_token_at, -1) for s in seqs], key=lambda e: (e[0], e[1])
    )
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def test_simulated_instances_each_hold_their_own_batch(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    """What campaign plan simulates: 64 requests at once over 2 instances of 4 sequences each run 8 at a time."""
    _, m = load(tmp_path, variant(manifest_data, "g6", max_concurrency=4))
    timing = TimingModel.for_fleet(m, m.fleet("g6"))
    arrivals = [(0.0, 100, 30) for _ in range(64)]
    one, two = spread_replay(timing, arrivals, 1), spread_replay(timing, arrivals, 2)
    assert _in_flight_max(one) == 4 and _in_flight_max(two) == 8
    assert max(s.last_token_at for s in two) < 0.6 * max(
        s.last_token_at for s in one
    )  # two instances drain it in about half the time
    # one instance is exactly the single-endpoint replay; with two, each request is timed as its instance's share alone
    assert [s.last_token_at for s in one] == [s.last_token_at for s in replay(timing, arrivals)]
    flow = FlowHash(2)
    picks = [flow.pick() for _ in arrivals]
    alone = replay(timing, [a for a, p in zip(arrivals, picks, strict=True) if p == 1])
    assert [s.last_token_at for s, p in zip(two, picks, strict=True) if p == 1] == [s.last_token_at for s in alone]


def test_a_simulated_client_that_gives_up_frees_its_slot_for_the_next_request(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    """One sequence at a time: a 300-token request, then a 5-token one 0.01 s later. Waited for, the
    first holds the slot to its last token and the second starts after it; abandoned after 1 s
    (its client's SLO deadline), the engine cancels it at its next event, as the live server aborts a
    disconnected request, and the second starts at once: its first token comes about 1 s after it arrived."""
    _, m = load(tmp_path, variant(manifest_data, "g6", max_concurrency=1))
    timing = TimingModel.for_fleet(m, m.fleet("g6"))
    arrivals = [(0.0, 100, 300), (0.01, 100, 5)]
    waited = replay(timing, arrivals)
    gave_up = replay(timing, arrivals, patience_s=[1.0, 60.0])
    assert waited[1].first_token_at is not None and waited[1].first_token_at > waited[0].last_token_at
    assert gave_up[0].cancelled and gave_up[0].generated < 300
    assert gave_up[0].last_token_at <= 1.0 + 2 * timing.step_s(400, 0, 1)  # no token after the next event past 1 s
    assert gave_up[1].first_token_at is not None and gave_up[1].first_token_at < 1.5 < waited[1].first_token_at
    assert gave_up[1].generated == 5 and not gave_up[1].cancelled
