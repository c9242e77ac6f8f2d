"""Can one emulator process carry 1,000 concurrent streams without becoming the bottleneck?

Starts an emulator (inf2 fleet by default, max_concurrency raised to 1,024, short requests so the KV cache
holds them all) as a subprocess, opens N concurrent streams from this process, then reads the
emulator's own step lag (actual minus scheduled step end) from /emulator/stats and prints it
against the model's step time. Lag well below the step time means the emulator kept up.

    .venv/bin/python -m bench.emulator_capacity [--streams 1000] [--max-tokens 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"


def write_variant(tmp: Path, streams: int, fleet: str) -> Path:
    data = yaml.safe_load(MANIFEST.read_text())
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    # Short requests so 1,000 sequences fit the KV cache and pass the manifest's fit check.
    data["workload"]["request_class"].update(max_input_tokens=16, max_output_tokens=48)
    for f in data["fleets"]:
        if f["name"] == fleet:
            f["max_concurrency"] = max(streams, f["max_concurrency"])
        f["max_model_len"] = 64
        if f.get("sequence_buckets"):
            f["sequence_buckets"] = [64]
    p = tmp / "capacity.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


async def drive(base: str, streams: int, max_tokens: int) -> tuple[int, float]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        model = (await (await s.get(base + "/v1/models")).json())["data"][0]["id"]

        async def one(i: int) -> int:
            body = {"model": model, "prompt": f"request {i} says hello", "max_tokens": max_tokens, "stream": True}
            n = 0
            async with s.post(base + "/v1/completions", json=body) as r:
                async for raw in r.content:
                    n += raw.startswith(b"data: {")
            return n

        t0 = time.monotonic()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts), time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--fleet", default="inf2")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        path = write_variant(Path(td), a.streams, a.fleet)
        cmd = [
            sys.executable,
            "-m",
            "runtime.emulator",
            "--manifest",
            str(path),
            "--fleet",
            a.fleet,
            "--no-check-files",
        ]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # stderr shows manifest errors
        try:
            assert proc.stdout is not None
            base = proc.stdout.readline().split()[-1]
            tokens, wall = asyncio.run(drive(base, a.streams, a.max_tokens))

            async def stats() -> dict[str, float]:
                async with aiohttp.ClientSession() as s, s.get(base + "/emulator/stats") as r:
                    out: dict[str, float] = await r.json()
                    return out

            st = asyncio.run(stats())
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(
        f"streams {a.streams}  max_tokens {a.max_tokens}  fleet {a.fleet}  tokens received {tokens}  wall {wall:.2f} s"
    )
    print(f"steps {st['steps']}  batch median {st['batch_median']}  batch max {st['batch_max']}")
    print(f"model step median      {st['step_median_s'] * 1000:.2f} ms")
    print(f"emulator lag median    {st['lag_median_s'] * 1000:.3f} ms  p99 {st['lag_p99_s'] * 1000:.3f} ms")
    print(f"lag / step (median)    {st['lag_median_s'] / st['step_median_s']:.4f}")
    print(json.dumps({"tokens": tokens, "wall_s": wall, **st}))
    return 0 if tokens == a.streams * a.max_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
