"""A real emulator process on loopback, driven by the official openai client and a raw client."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from runtime.emulator import TimingModel
from tests.runtime.conftest import MODEL, emulator_process, load, variant


def test_openai_client_streams_with_usage_and_stops(example: Any) -> None:
    path, _ = example

    async def main(base: str) -> None:
        client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        text = "".join(pieces)
        assert finish == "length" and usage is not None
        assert usage.completion_tokens == 12 == len(text.split())
        # Prompt tokens: the manifest chat template rendered, then counted by the word tokenizer.
        async with (
            aiohttp.ClientSession() as raw,
            raw.post(  # vLLM serves /tokenize outside /v1
                base + "/tokenize", json={"messages": [{"role": "user", "content": "Say something."}]}
            ) as r,
        ):
            tok = await r.json()
        assert usage.prompt_tokens == tok["count"] > 2

        # Same request, same text (non-streaming too); a stop string cuts it exactly.
        again = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=12
        )
        assert again.choices[0].message.content == text
        stop = " ".join(text.split()[5:7])
        cut = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=12, stop=[stop]
        )
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].message.content == text[: text.index(stop)]

        comp = await client.completions.create(model=MODEL, prompt="one two three", max_tokens=4)
        assert comp.usage is not None and comp.usage.prompt_tokens == 3 and comp.usage.completion_tokens == 4
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        await client.close()

    with emulator_process(path, "g6") as base:
        asyncio.run(main(base))


def test_client_ttft_and_itl_match_timing_model(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    """At low load a client sees TTFT = prefill step and ITL = decode step, within 3% of a step (median)."""
    data = variant(manifest_data, "g6", efficiency={"bandwidth": 0.5, "compute": 0.5})  # ~107 ms steps
    path, m = load(tmp_path, data)
    timing = TimingModel.for_fleet(m, m.fleet("g6"))
    prompt_tokens, max_tokens = 1200, 8  # long enough that prefill is compute-bound
    # A different first word per request: vLLM on GPU caches prefixes, so a repeated prompt would
    # (rightly) skip its prefill.
    prompts = [" ".join([f"request{i}"] + ["token"] * (prompt_tokens - 1)) for i in range(9)]
    expected_ttft = timing.step_s(prompt_tokens, prompt_tokens, 0)
    expected_itl = [timing.step_s(prompt_tokens + k, 0, 1) for k in range(1, max_tokens)]
    assert expected_ttft > 1.5 * expected_itl[0]  # the two paths really differ

    async def main(base: str) -> tuple[list[float], list[float]]:
        ttft_err: list[float] = []
        itl_err: list[float] = []
        async with aiohttp.ClientSession() as s:

            async def tokenize_rtt(prompt: str) -> float:
                # The same body to /tokenize: loopback round trip + JSON parse + tokenizing the
                # prompt, i.e. everything before the model's first step, which is not model time.
                t = time.monotonic()
                async with s.post(base + "/tokenize", json={"model": MODEL, "prompt": prompt}) as r:
                    await r.read()
                return time.monotonic() - t

            for i in range(9):
                # Paired with the request it corrects, so a slow stretch on a shared VM shifts
                # both sides alike instead of biasing a run-level median.
                prompt = prompts[i]
                rtt = min([await tokenize_rtt(prompt) for _ in range(3)])
                t0 = time.monotonic()
                times: list[float] = []
                body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
                async with s.post(base + "/v1/completions", json=body) as r:
                    async for raw in r.content:
                        if raw.startswith(b"data: {"):
                            times.append(time.monotonic())
                if i == 0:
                    continue  # warm-up: connection setup is not the model's time
                ttft_err.append(times[0] - t0 - rtt - expected_ttft)
                itl_err += [b - a - e for a, b, e in zip(times[:-1], times[1:], expected_itl, strict=True)]
        return ttft_err, itl_err

    with emulator_process(path, "g6") as base:
        ttft_err, itl_err = asyncio.run(main(base))
    # 3% of a ~107 ms step: any wrong path in the model (prefill priced as decode, a missing
    # term) is tens of ms off, while loopback noise on a shared 2-core VM stays within this.
    assert abs(statistics.median(ttft_err)) < 0.03 * expected_ttft, ttft_err
    assert abs(statistics.median(itl_err)) < 0.03 * expected_itl[0], itl_err


def test_process_exits_cleanly_and_writes_port_file(example: Any, tmp_path: Path) -> None:
    path, _ = example
    port_file = tmp_path / "port"
    with emulator_process(path, "inf2", "--port-file", str(port_file)) as base:
        assert base.endswith(":" + port_file.read_text().strip())
