"""The automatic capacity search on every shipped trace, with no tuning: prints where it stopped.

    .venv/bin/python -m bench.capacity_search_traces [--traces conv code mooncake] [--out DIR]

For each trace, the example manifest is copied with only the trace (path, format, sha256) and,
for the 600 s Mooncake excerpt, the window's start changed; `capacity_search` keeps the
example's settings. Then `python -m campaign local` runs it end to end (emulators, quality
gate, replay, the search) and the table shows, per fleet, the rule that stopped the search, the
bracket it ended with and its width (missed / held - 1; the search converges at `tolerance`),
the steps it ran (the replay excluded), the seconds they cost (each step's `took_s`, summed: what
the time budget counts), the requests they measured and the capacity the report used. A figure,
not a test: the machine is shared, so read the stop rules and brackets before the seconds.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"
TRACES = {
    "conv": (ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv", "azure", 600.0),
    "code": (ROOT / "data" / "traces" / "AzureLLMInferenceTrace_code.csv", "azure", 600.0),
    "mooncake": (ROOT / "data" / "traces" / "mooncake_conversation_trace_600s.jsonl", "mooncake", 0.0),
}


def variant(name: str, tmp: Path) -> Path:
    path, fmt, start = TRACES[name]
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    w = data["workload"]
    w["trace"] = {
        "path": str(path),
        "format": fmt,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "source": f"data/traces/{path.name} (see data/traces/SOURCES.md)",
    }
    w["window"]["start_s"] = start
    # The scorer runs in the manifest's directory: point at the shipped one from the temp copy.
    data["quality"]["task_acceptance"]["command"] = [
        sys.executable,
        str(ROOT / "manifests" / "scorers" / "answers_nonempty.py"),
    ]
    out = tmp / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def fmt(v: float | None) -> str:
    return f"{v:.3g}" if v is not None else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", choices=sorted(TRACES), default=["conv", "code", "mooncake"])
    ap.add_argument("--out", type=Path, default=None, help="keep each run here (default: a temp directory)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="search-traces-") as tmp_s:
        tmp = Path(tmp_s)
        base = args.out or tmp / "runs"
        for name in args.traces:
            out = base / name
            t0 = time.monotonic()
            r = subprocess.run(
                [sys.executable, "-m", "campaign", "local", str(variant(name, tmp)), "--out", str(out)],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            took = time.monotonic() - t0
            report = out / "report.json"
            if not report.is_file():
                print(
                    f"{name}: campaign local exited {r.returncode} without a report:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
                )
                continue
            rep = json.loads(report.read_text())
            for fleet, f in rep["fleets"].items():
                cap = f.get("capacity") or {}
                s = cap.get("search") or {}
                steps = s.get("steps", [])
                run = [x for x in steps if x.get("label") != "replay"]
                lo, hi = s.get("held_multiplier"), s.get("missed_multiplier")
                rows.append(
                    (
                        name,
                        fleet,
                        s.get("stop_rule", "-"),
                        lo,
                        hi,
                        hi / lo - 1 if lo and hi else None,
                        len(run),
                        sum(x.get("took_s") or 0.0 for x in run),
                        sum(x.get("requests", 0) for x in run),
                        cap.get("per_instance_tok_s"),
                        took,
                        rep["decision"]["state"],
                    )
                )
    print(
        f"{'trace':9} {'fleet':5} {'stop rule':16} {'held x':>8} {'missed x':>8} {'width':>6} {'steps':>5} {'search s':>8} "
        f"{'requests':>8} {'tok/s/inst':>10} {'run s':>6} decision"
    )
    for name, fleet, rule, lo, hi, width, n, secs, req, cap, took, state in rows:
        w = f"{width:.0%}" if width is not None else "-"
        print(
            f"{name:9} {fleet:5} {rule:16} {fmt(lo):>8} {fmt(hi):>8} {w:>6} {n:>5} {secs:>8.0f} {req:>8} {fmt(cap):>10} "
            f"{took:>6.0f} {state}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
