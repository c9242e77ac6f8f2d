"""Capacity of one loadgen worker: concurrent streams, streamed tokens/s, schedule lag, and
TTFT error against a server whose latency is known exactly (fixed TTFT and ITL).

    .venv/bin/python -m bench.loadgen_capacity [--rate 42] [--seconds 40] [--tokens 500] [--itl 0.025]
    .venv/bin/python -m bench.loadgen_capacity --server emulator [--fleet inf2] [--rate 2] [--tokens 200]

Concurrency ~= rate x (ttft + tokens x itl); tokens/s ~= rate x tokens once the first
streams end (after ttft + tokens x itl). Defaults aim at >= 500 streams and 20,000 tokens/s.
The Locust worker is pinned to core 0 and the server (testing/fixed_latency_server.py) to
core 1, so "one worker on one core" is literal and the server's CPU is never the client's.
Prints figures only; pass/fail is the reader's call against the targets.

`--server emulator` replays against the real emulator (runtime/emulator) instead and joins
each record to the emulator's own per-request times (X-Request-Id, /emulator/requests), so the
TTFT error is measured against the emulator's ground truth. The emulator is a model of a real
accelerator written in Python: one core of it streams a few thousand tokens/s on time, not
20,000, so the capacity target is shown against the fixed server and the TTFT error at the
rates the emulator holds.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from core.quantiles import interpolated_quantile
from core.records import RequestRecord
from testing.fixed_latency_server import ServerStats, serve_in_process

ROOT = Path(__file__).resolve().parent.parent


def _pin(core: int) -> bool:
    try:
        if core >= (os.cpu_count() or 1):
            return False
        os.sched_setaffinity(0, {core})
        return True
    except (AttributeError, OSError):  # not Linux: run unpinned, and say so
        return False


def _serve_pinned(ttft: float, itl: float, ports: mp.Queue[int], conn: Any) -> None:
    _pin(1)
    serve_in_process(ttft, itl, ports, conn)


def _q(xs: list[float], p: float) -> float:
    return interpolated_quantile(xs, p, empty=math.nan)


def _tokens_between(recs: list[RequestRecord], lo: float, hi: float) -> int:
    """Tokens whose arrival falls in [lo, hi), each stream's tokens spread evenly between its
    first and last token (records keep TTFT, E2E and the count, not every timestamp)."""
    total = 0
    for r in recs:
        n = r.output_tokens  # server usage: a chunk may carry several tokens
        if not n or r.ttft_s is None or r.e2e_s is None:
            continue
        first, last = r.scheduled_s + r.ttft_s, r.scheduled_s + r.e2e_s
        if n == 1 or last <= first:
            total += int(lo <= first < hi)
            continue
        step = (last - first) / (n - 1)
        k0 = max(0, math.ceil((lo - first) / step))
        k1 = min(n - 1, math.ceil((hi - first) / step) - 1)
        total += max(0, k1 - k0 + 1)
    return total


def _emulator(mpath: Path, fleet: str, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp / "emulator.port"
    cmd = ["taskset", "-c", "1"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    cmd += [
        sys.executable,
        "-m",
        "runtime.emulator",
        "--manifest",
        str(mpath),
        "--fleet",
        fleet,
        "--port-file",
        str(port_file),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"emulator did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc, int(port_file.read_text())


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:  # loopback only
        return json.load(r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--server",
        choices=["fixed", "emulator"],
        default="fixed",
        help="fixed-latency server (default) or the emulator",
    )
    ap.add_argument("--fleet", default="inf2", help="with --server emulator: the manifest fleet it emulates")
    ap.add_argument("--rate", type=float, default=None, help="requests per second (default 42; 2 with the emulator)")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument(
        "--tokens", type=int, default=None, help="output tokens per request (default 500; 200 with the emulator)"
    )
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--ttft", type=float, default=0.05, help="fixed server: time to first token")
    ap.add_argument("--itl", type=float, default=0.025, help="fixed server: inter-token latency")
    a = ap.parse_args()
    emu = a.server == "emulator"
    rate = a.rate if a.rate is not None else (2.0 if emu else 42.0)
    tokens = a.tokens if a.tokens is not None else (200 if emu else 500)

    from loadgen.launch import run_fleet
    from loadgen.recording import read_records

    tmp = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    n = int(rate * a.seconds)
    trace = tmp / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"offset_s": i / rate, "input_tokens": a.input, "output_tokens": tokens}) + "\n"
            for i in range(n)
        )
    )
    d = yaml.safe_load((ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml").read_text())
    d["workload"].update(
        trace={"path": str(trace), "format": "plain-jsonl"},
        window={"start_s": 0, "duration_s": a.seconds + 1},
        time_scale=1.0,
        rate_scale=1.0,
        warmup_s=0,
        request_class={"max_input_tokens": a.input, "max_output_tokens": tokens, "mode": "clip"},
    )
    d["loadgen"]["request_timeout_s"] = 120
    d["loadgen"]["max_schedule_lag_p99_s"] = 0.005
    mpath = tmp / "bench.yaml"
    mpath.write_text(yaml.safe_dump(d))
    fleet = a.fleet if emu else "g6"  # the fixed server ignores the fleet; records need one

    server: ServerStats | None = None
    truth: dict[str, dict[str, Any]] = {}
    emu_stats: dict[str, Any] = {}
    if emu:
        proc, port = _emulator(mpath, fleet, tmp)
        pinned = _pin(0)
        try:
            t = time.time()
            s = run_fleet(mpath, fleet, f"http://127.0.0.1:{port}", tmp / "run")
            wall = time.time() - t
            truth = {g["id"]: g for g in _get_json(f"http://127.0.0.1:{port}/emulator/requests")["requests"]}
            emu_stats = _get_json(f"http://127.0.0.1:{port}/emulator/stats")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    else:
        ports: mp.Queue[int] = mp.Queue()
        ours, theirs = mp.Pipe()
        srv = mp.Process(target=_serve_pinned, args=(a.ttft, a.itl, ports, theirs), daemon=True)
        srv.start()
        port = ports.get(timeout=30)
        pinned = _pin(0)  # inherited by the Locust process run_fleet starts
        try:
            t = time.time()
            s = run_fleet(mpath, fleet, f"http://127.0.0.1:{port}", tmp / "run")
            wall = time.time() - t
            ours.send("stop")
            server = ours.recv()
        finally:
            srv.terminate()
    recs = [r for r in read_records(sorted((tmp / "run").glob("records-*.jsonl"))) if r.outcome == "ok"]
    # Peak concurrency from the records' send/finish intervals.
    ev = sorted([(r.sent_s, 1) for r in recs] + [(r.scheduled_s + (r.e2e_s or 0), -1) for r in recs])  # type: ignore[operator]
    cur = peak = 0
    for _, d_ in ev:
        cur += d_
        peak = max(peak, cur)
    print(f"server {a.server}{' (' + fleet + ')' if emu else ''}: {rate:g} req/s x {tokens} tokens for {a.seconds:g} s")
    print(
        f"requests ok {len(recs)}/{s.scheduled}  wall {wall:.1f} s  valid={s.valid}  worker pinned to one core: {pinned}"
    )
    print(f"peak concurrent streams {peak}")
    if not emu:
        # Steady state: from the end of the first streams to the last send, arrivals and
        # completions balance, so tokens/s there is what the worker sustains (the span average
        # would be diluted by the ramp up and down).
        lo, hi = a.ttft + tokens * a.itl, a.seconds
        steady = _tokens_between(recs, lo, hi) / (hi - lo) if hi > lo else float("nan")
        print(f"streamed tokens/s {steady:,.0f} in the steady window t = {lo:.1f}..{hi:.1f} s")
    elif recs:
        # The emulator's batch decides how fast tokens come; the mean over the run (ramp
        # included) is what this worker received.
        first = min(r.sent_s or 0.0 for r in recs)
        last = max(r.scheduled_s + (r.e2e_s or 0.0) for r in recs)
        total = sum(r.output_tokens for r in recs)
        print(f"streamed tokens/s {total / (last - first):,.0f} (mean from first send to last token, {total:,} tokens)")
    print(f"schedule lag p50 {s.schedule_lag_p50_s * 1000:.2f} ms  p99 {s.schedule_lag_p99_s * 1000:.2f} ms")
    print(f"client CPU {s.client_cpu_percent:.0f}% of one core")
    if server is not None:
        ttft_err = sorted((r.ttft_s or 0) - a.ttft for r in recs)
        itl_err = sorted((r.itl_s or 0) - a.itl for r in recs)
        print(
            f"TTFT error vs ground truth: p50 {_q(ttft_err, 0.5) * 1000:.2f} ms  p99 {_q(ttft_err, 0.99) * 1000:.2f} ms"
        )
        print(
            f"ITL error vs ground truth:  p50 {_q(itl_err, 0.5) * 1000:.3f} ms  p99 {_q(itl_err, 0.99) * 1000:.3f} ms"
        )
        fl, tl = sorted(server.first_token_late_s), sorted(server.token_late_s)
        print(
            f"server's own lateness (part of the errors above): first token p50 {_q(fl, 0.5) * 1000:.2f} ms p99 {_q(fl, 0.99) * 1000:.2f} ms;"
            f" tokens p50 {_q(tl, 0.5) * 1000:.2f} ms p99 {_q(tl, 0.99) * 1000:.2f} ms"
        )
    else:
        # Ground truth per request, joined on X-Request-Id: the emulator's TTFT runs from the
        # request's arrival to the first token's frame reaching its socket; the client's runs
        # from its send (TTFT minus schedule lag), so the difference is what the client adds.
        from loadgen.openai_request import request_id_header

        campaign = d["campaign"]
        pairs = [(r, truth.get(request_id_header(campaign, fleet, r.request_id))) for r in recs]
        errs = sorted(
            (r.ttft_s or 0) - (r.send_lag_s or 0) - (g["first_token_written"] - g["arrival"])
            for r, g in pairs
            if g is not None and g["first_token_written"] is not None
        )
        print(f"requests joined to the emulator's ground truth: {len(errs)}/{len(recs)}")
        print(
            "TTFT error vs the emulator (client from send - server from arrival):"
            f" p50 {_q(errs, 0.5) * 1000:.2f} ms  p99 {_q(errs, 0.99) * 1000:.2f} ms"
        )
        print(
            f"emulator step lag p50 {emu_stats['lag_median_s'] * 1000:.2f} ms  p99 {emu_stats['lag_p99_s'] * 1000:.2f} ms"
            f"  (model step median {emu_stats['step_median_s'] * 1000:.1f} ms, batch median {emu_stats['batch_median']})"
        )
    print(f"records in {tmp / 'run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
