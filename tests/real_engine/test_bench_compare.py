"""Our replayer and vLLM's own `bench serve` client agree on the same requests to the same
real vLLM (bench/vllm_bench_compare.py prints the figures, run here as a module against the
fixture's server; this asserts them).

Tolerances: the two tools run at the same time against one server (1 request/s of 256 + 32
tokens each), so the load of the shared 2-core machine weighs on both alike; what differs is
each client's own overhead (a gevent reader vs aiohttp: milliseconds) and where each tool's
requests fall against the other's: both send evenly spaced at the same rate, so the phase
between the two sets is fixed for the whole run, and one set can keep landing on the other's
prefills. That is systematic, not noise, and grows with the machine's load: TTFT medians of
15.3 vs 12.9 ms on a quiet machine (2026-12-05, both tools asking the set's 32 output tokens;
earlier figures had vLLM's client asking 256, its --custom-output-len default), 105.8 vs 167.4 ms
at load average 12. Medians must agree
within 50% + 25 ms (TTFT) and 30% + 3 ms (TPOT, the per-request (last - first token) /
(tokens - 1) both tools compute; 23.7 vs 18.1 ms at load 12); third quartiles within
50% + 50 ms. P95s are printed, not asserted: over 30 requests a P95 is the second-worst
request, so one stall of the shared machine decides it (a clean-clone CI run here saw TTFT
P95 112 ms ours vs 745 ms for vLLM's client, with medians and quartiles in agreement). The
medians and quartiles still catch a TTFT read at the wrong event (the stream's end is 31
tokens x TPOT later) or a TPOT off by a factor, not a few-ms client overhead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from core.quantiles import interpolated_quantile
from tests.conftest import ROOT
from tests.real_engine.conftest import RealServer

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]
N = 30


def _close(a: float, b: float, rel: float, abs_s: float) -> bool:
    return abs(a - b) <= rel * max(a, b) + abs_s


def _bench_figures(server: RealServer) -> dict[str, dict[str, Any]]:
    """`python -m bench.vllm_bench_compare --json` against the fixture's server: its table goes
    to the test's output, its last line is each tool's per-request figures."""
    argv = [sys.executable, "-m", "bench.vllm_bench_compare", "--url", server.url, "--manifest", str(server.manifest)]
    argv += ["--requests", str(N), "--rate", "1", "--input", "256", "--output", "32", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    *table, last = done.stdout.strip().splitlines()
    print("\n".join(table))
    figures: dict[str, dict[str, Any]] = json.loads(last)
    return figures


def test_ours_and_vllm_bench_serve_agree(real_server: RealServer) -> None:
    c = _bench_figures(real_server)
    ours, vllm = c["ours"], c["vllm"]
    assert ours["completed"] == vllm["completed"] == N
    assert len(ours["tpot_s"]) == len(vllm["tpot_s"]) == N
    for q, rel, abs_s in ((0.5, 0.5, 0.025), (0.75, 0.5, 0.050)):
        a, b = interpolated_quantile(ours["ttft_s"], q), interpolated_quantile(vllm["ttft_s"], q)
        assert _close(a, b, rel, abs_s), f"TTFT p{q * 100:g}: ours {a:.4f} s, vllm bench {b:.4f} s"
    for q, rel, abs_s in ((0.5, 0.30, 0.003), (0.75, 0.5, 0.050)):
        a, b = interpolated_quantile(ours["tpot_s"], q), interpolated_quantile(vllm["tpot_s"], q)
        assert _close(a, b, rel, abs_s), f"TPOT p{q * 100:g}: ours {a:.4f} s, vllm bench {b:.4f} s"
