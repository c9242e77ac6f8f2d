"""Capacity of one loadgen worker: concurrent streams, streamed tokens/s, schedule lag, and
TTFT error against a server whose latency is known exactly (fixed TTFT and ITL).

    .venv/bin/python bench/loadgen_capacity.py [--rate 42] [--seconds 20] [--tokens 500] [--itl 0.025]

Concurrency ~= rate x (ttft + tokens x itl); tokens/s ~= rate x tokens. Defaults aim at
>= 500 streams and 20,000 tokens/s. The server runs in a separate process so it does not share
the worker's CPU. Prints figures only; pass/fail is the reader's call against the targets.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _serve(manifest: str, ttft: float, itl: float, q: mp.Queue[int]) -> None:
    from campaign.manifest import load_manifest
    from campaign.tokenizer import for_manifest
    from tests.loadgen.sse_server import Behaviour, SSEServer

    m = load_manifest(manifest)
    s = SSEServer(for_manifest(m), m.tokenizer.chat_template, dict(m.tokenizer.special_tokens), Behaviour(ttft_s=ttft, itl_s=itl)).start()
    q.put(s.port)
    while True:
        time.sleep(3600)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=42.0, help="requests per second")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=500, help="output tokens per request (<= the manifest max)")
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--ttft", type=float, default=0.05)
    ap.add_argument("--itl", type=float, default=0.025)
    a = ap.parse_args()

    from loadgen.launch import run_fleet
    from loadgen.recording import read_records

    tmp = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    n = int(a.rate * a.seconds)
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(json.dumps({"offset_s": i / a.rate, "input_tokens": a.input, "output_tokens": a.tokens}) + "\n" for i in range(n)))
    d = yaml.safe_load((ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml").read_text())
    d["workload"].update(
        trace={"path": str(trace), "format": "plain-jsonl"},
        window={"start_s": 0, "duration_s": a.seconds + 1},
        time_scale=1.0,
        rate_scale=1.0,
        warmup_s=0,
        request_class={"max_input_tokens": a.input, "max_output_tokens": a.tokens, "mode": "clip"},
    )
    d["loadgen"]["request_timeout_s"] = 120
    d["loadgen"]["max_schedule_lag_p99_s"] = 0.005
    mpath = tmp / "bench.yaml"
    mpath.write_text(yaml.safe_dump(d))

    q: mp.Queue[int] = mp.Queue()
    srv = mp.Process(target=_serve, args=(str(mpath), a.ttft, a.itl, q), daemon=True)
    srv.start()
    port = q.get(timeout=30)
    try:
        t = time.time()
        s = run_fleet(mpath, "g6", f"http://127.0.0.1:{port}", tmp / "run")
        wall = time.time() - t
    finally:
        srv.terminate()
    recs = [r for r in read_records(sorted((tmp / "run").glob("records-*.jsonl"))) if r.outcome == "ok"]
    toks = sum(r.client_output_tokens for r in recs)
    # Peak concurrency from the records' send/finish intervals.
    ev = sorted([(r.sent_s, 1) for r in recs] + [(r.scheduled_s + (r.e2e_s or 0), -1) for r in recs])  # type: ignore[operator]
    cur = peak = 0
    for _, d_ in ev:
        cur += d_
        peak = max(peak, cur)
    span = max(r.scheduled_s + (r.e2e_s or 0) for r in recs) - min(r.sent_s or 0 for r in recs)
    ttft_err = sorted((r.ttft_s or 0) - a.ttft for r in recs)
    itl_err = sorted((r.itl_s or 0) - a.itl for r in recs)
    print(f"requests ok {len(recs)}/{s.scheduled}  wall {wall:.1f} s  valid={s.valid}")
    print(f"peak concurrent streams {peak}")
    print(f"streamed tokens/s {toks / span:,.0f} (over the active span {span:.1f} s)")
    print(f"schedule lag p50 {s.schedule_lag_p50_s * 1000:.2f} ms  p99 {s.schedule_lag_p99_s * 1000:.2f} ms")
    print(f"client CPU {s.client_cpu_percent:.0f}% of one core")
    print(f"TTFT error vs ground truth: p50 {ttft_err[len(ttft_err) // 2] * 1000:.2f} ms  p99 {ttft_err[int(len(ttft_err) * 0.99)] * 1000:.2f} ms")
    print(f"ITL error vs ground truth:  p50 {itl_err[len(itl_err) // 2] * 1000:.3f} ms  p99 {itl_err[int(len(itl_err) * 0.99)] * 1000:.3f} ms")
    print(f"records in {tmp / 'run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
