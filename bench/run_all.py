"""Every benchmark in one run, one after another so they do not compete for the cores.

    .venv/bin/python -m bench.run_all [--quick]

Prints each benchmark's own figures, then the CDK synth time (median of 3, in-process app
through `python app.py`). --quick shrinks the sizes for a smoke run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(title: str, argv: list[str]) -> None:
    print(f"\n=== {title}: {' '.join(argv[1:])}", flush=True)
    rc = subprocess.call(argv, cwd=ROOT)
    if rc != 0:
        print(f"--- {title} exited {rc}", flush=True)


def synth_seconds(runs: int = 3) -> list[float]:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "app.py"],
                cwd=ROOT,
                env={**os.environ, "CDK_OUTDIR": out},
                check=True,
                capture_output=True,
            )
            times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures to quote")
    a = ap.parse_args()
    py = sys.executable
    _run("emulator capacity", [py, "-m", "bench.emulator_capacity", *(["--streams", "200"] if a.quick else [])])
    _run(
        "loadgen capacity",
        [py, "-m", "bench.loadgen_capacity", *(["--rate", "10", "--seconds", "5"] if a.quick else [])],
    )
    _run("TTFT vs peer tool (aiperf)", [py, "-m", "bench.peer_compare", *(["--seconds", "10"] if a.quick else [])])
    if (ROOT / ".venv-engine" / "bin" / "python").is_file():  # `make engine`; it starts one real vLLM (CPU)
        _run(
            "TTFT/TPOT vs vllm bench serve (real vLLM, CPU)",
            [py, "-m", "bench.vllm_bench_compare", *(["--requests", "10"] if a.quick else [])],
        )
    else:
        print("\n=== TTFT/TPOT vs vllm bench serve: skipped, no .venv-engine (make engine)", flush=True)
    _run("emulator vs published measurements", [py, "-m", "runtime.emulator.calibrate"])
    _run("analysis throughput", [py, "-m", "bench.analysis_throughput", *(["--records", "200000"] if a.quick else [])])
    _run("prompt synthesis", [py, "-m", "bench.prompt_build", *(["--runs", "1"] if a.quick else [])])
    # about 10 min per trace (a whole local campaign each): --quick runs the Mooncake excerpt only
    _run(
        "capacity search on every shipped trace",
        [py, "-m", "bench.capacity_search_traces", *(["--traces", "mooncake"] if a.quick else [])],
    )
    t = synth_seconds(1 if a.quick else 3)
    print(f"\n=== cdk synth (python app.py): median {statistics.median(t):.1f} s over {len(t)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
