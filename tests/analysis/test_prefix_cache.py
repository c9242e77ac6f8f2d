"""Prefix caching end to end: Mooncake hash_ids -> shared prompt text -> the emulator's vLLM
counters and faster hits -> the report's per-fleet section, cached and uncached apart."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from analysis.measure import prefix_cache
from analysis.report.build import ReportInputs, build_report
from analysis.sources.records import load_records
from core.manifest import load_manifest
from core.schedule import ScheduledRequest, build_schedule
from loadgen.prompts import PromptBuilder
from runtime.emulator import EmulatorConfig, create_app
from runtime.emulator.timing import TimingModel
from tests.analysis.synth import rec, write_jsonl
from tests.conftest import write_manifest

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def _req(i: int, hashes: tuple[int, ...], tokens: int = 1100) -> ScheduledRequest:
    return ScheduledRequest(i, float(i), tokens, 4, hashes, i + 1, False)


def _serve(cfg: EmulatorConfig, bodies: list[dict[str, Any]]) -> tuple[list[float], str]:
    """Send the bodies one after another; TTFT of each and the final /metrics text."""

    async def main() -> tuple[list[float], str]:
        server = TestServer(create_app(cfg), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url(""))
        ttfts: list[float] = []
        try:
            async with aiohttp.ClientSession() as s:
                for body in bodies:
                    t0 = time.monotonic()
                    first = None
                    async with s.post(url + "/v1/chat/completions", json={**body, "stream": True}) as r:
                        async for raw in r.content:
                            if (
                                first is None
                                and raw.startswith(b"data: {")
                                and b'"content":"' in raw
                                and b'"role"' not in raw
                            ):
                                first = time.monotonic() - t0
                    assert first is not None
                    ttfts.append(first)
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
        finally:
            await server.close()
        return ttfts, text

    return asyncio.run(main())


def _counter(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_shared_trace_blocks_hit_the_emulators_prefix_cache_on_gpu_vllm_only(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    builder = PromptBuilder(m, "chat")
    reqs = [_req(0, (1, 2, 3)), _req(1, (1, 2, 4)), _req(2, (7, 8, 9))]  # 1 shares 1,024 words with 0; 2 shares none
    bodies = [{"model": MODEL, "max_tokens": 4, **builder.build(r).payload_fields()} for r in reqs]
    # Three fresh servers, the same three requests each: wall-clock noise only adds to a TTFT, so
    # each request's fastest of three is compared.
    runs = [_serve(EmulatorConfig.from_manifest(m, "g6"), bodies) for _ in range(3)]
    for _, text in runs:
        queries = _counter(text, "vllm:prefix_cache_queries_total")
        hits = _counter(text, "vllm:prefix_cache_hits_total")
        assert queries == 3 * 1100
        # the template's header plus the two shared 512-word blocks, in whole 16-token pages
        assert 1024 <= hits < 1100 and hits % 16 == 0
    ttft = [min(t[i] for t, _ in runs) for i in range(3)]
    # The hit saves the prefill of the cached tokens as the fleet's timing model prices it (about
    # 0.12 s of 0.19 s here); the load's overhead lands on both sides of the difference.
    timing = TimingModel.for_fleet(m, m.fleet("g6"))
    saved = timing.step_s(1100, 1100, 0) - timing.step_s(1100, 1100 - int(hits), 0)
    assert saved > 0.05
    assert ttft[0] - ttft[1] > 0.5 * saved and ttft[2] - ttft[1] > 0.5 * saved, (ttft, saved)
    # vLLM on Neuron has no prefix cache here: the same requests all miss.
    _, text = _serve(EmulatorConfig.from_manifest(m, "inf2"), bodies)
    assert _counter(text, "vllm:prefix_cache_hits_total") == 0


def test_report_splits_ttft_by_shared_prefix_per_fleet_and_flags_mixed_caching(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    trace = tmp_path / "mooncake.jsonl"
    rows = [
        {
            "timestamp": i * 500,
            "input_length": 1000,
            "output_length": 16,
            "hash_ids": [i % 3 if i >= 3 else 10 + i, 100 + i],
        }
        for i in range(12)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest_data["workload"].update(
        trace={"path": str(trace), "format": "mooncake"},
        window={"start_s": 0, "duration_s": 6},
        rate_scale=1.0,
        warmup_s=0,
        request_class={"max_input_tokens": 1000, "max_output_tokens": 16, "mode": "clip"},
    )
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    schedule = build_schedule(m)
    shared = prefix_cache.shared_prefix_requests(schedule)
    # requests 0..2 use unique blocks; blocks 0, 1, 2 first appear at requests 3, 4, 5 (misses)
    # and come back at 6..11 (hits)
    assert shared is not None
    assert [rid for rid, hit in sorted(shared.items()) if hit] == [6, 7, 8, 9, 10, 11]
    recs = []
    for fleet, hit_ttft in (("g6", 0.1), ("inf2", 0.9)):
        recs += [rec(m, fleet, i, ttft=hit_ttft if shared[i] else 0.9) for i in range(12)]
    write_jsonl(tmp_path / "records" / "records-x.jsonl", recs)
    rep = build_report(
        ReportInputs(m, tmp_path / "records", out_dir=tmp_path / "out", with_sensitivity=False, with_pages=True)
    ).model_dump(mode="json")
    pc = rep["prefix_cache"]
    assert pc["fleets"]["g6"]["caching"] == "on" and pc["fleets"]["inf2"]["caching"] == "off"
    assert pc["fleets"]["g6"]["ttft_by_prefix"]["hit"] == {"requests": 6, "ttft_p50_s": 0.1, "ttft_p95_s": 0.1}
    assert pc["fleets"]["g6"]["ttft_by_prefix"]["miss"]["requests"] == 6
    assert pc["fleets"]["inf2"]["ttft_by_prefix"]["hit"]["ttft_p50_s"] == 0.9
    assert pc["trace_reuse"] == pytest.approx(6 * 512 / 12000)  # each hit reuses its first 512-token block
    assert pc["mixed"] and any(g["what"] == "prefix_cache" and not g["blocks_go"] for g in rep["gaps"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Prefix cache" in md and "| g6 | vllm | on |" in md and "| inf2 | vllm-neuron | off |" in md
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Prefix cache</h2>" in page and "<td>g6</td><td>vllm</td><td>on</td>" in page
    assert load_records(tmp_path / "records", m.digest).count() == 24


def test_a_hit_reuses_at_least_half_its_prompt_within_the_blocks_it_covers() -> None:
    sched = [
        _req(0, (1, 2, 3, 4, 5), 1500),
        _req(1, (1, 9, 8), 1500),
        _req(2, (1, 2, 7), 1500),
        _req(3, (1, 2, 3, 6), 1200),
    ]
    tokens = prefix_cache.shared_prefix_tokens(sched)
    # request 0's blocks 4 and 5 lie beyond its 1,500 tokens (3 blocks): never seen by the server
    assert tokens == {0: (1500, 0), 1: (1500, 512), 2: (1500, 1024), 3: (1200, 1200)}
    assert prefix_cache.shared_prefix_requests(sched) == {0: False, 1: False, 2: True, 3: True}


def test_the_report_says_what_the_manifest_sets_not_the_stacks_default(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """A vLLM GPU fleet whose manifest turns prefix caching off (its stack's default is on) is
    reported as not caching: the section reads serving.prefix_caching, as the flags do."""
    for f in manifest_data["fleets"]:
        if f["name"] == "g6":
            f["serving"]["prefix_caching"] = False
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    write_jsonl(tmp_path / "r" / "records-g6-w0.jsonl", [rec(m, "g6", i) for i in range(5)])
    got = prefix_cache.section(m, load_records(tmp_path / "r", m.digest), None)
    assert got.fleets["g6"].caching == "off"
    assert got.fleets["inf2"].caching == ("on" if m.fleet("inf2").serving.resolved_prefix_caching else "off")
