"""The peer load generators of `bench.loadgen_ceiling --efficiency`: AIPerf, inference-perf and
GuideLLM, each pinned in a virtual environment of its own (bench/requirements-peer-<tool>.txt,
installed here on demand into the ignored .cache/peer-venvs/<tool>; never by make test), run as a user
would run it (its own CLI, its own processes) against the reference server, offline: a local
tokenizer directory, no hub, loopback only.

None of them sends a per-request X-Request-Id the server could join its ground truth by, so each
tool's requests are joined to the server's by time: the tool's own send stamps (wall clock) are
put on CLOCK_MONOTONIC and each is matched to the first server arrival after it (`join_by_time`);
on loopback a request arrives well under a millisecond after its send, and the sends are at least
several milliseconds apart at every rate measured here.

Also the CPU sampler every tool is measured by (`TreeCpuSampler`: the whole process tree, reaped
children included, and the cores each process was allowed) and the long-context shape
(`LongShape`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testing.loadgen_probes import CpuSampler

ROOT = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT_S = 1500.0


class PeerUnavailable(RuntimeError):
    """A peer that could not be installed or started offline; the message says why."""


# -- the virtual environments ----------------------------------------------------------------------


@dataclass(frozen=True)
class PeerSpec:
    name: str
    dist: str  # its PyPI distribution
    python: str  # the interpreter version its venv is made with
    script: str  # its console script

    @property
    def requirements(self) -> Path:
        return ROOT / "bench" / f"requirements-peer-{self.name}.txt"

    @property
    def venv(self) -> Path:
        # under .cache (git-, docker- and test-ignored, tests/test_bench_stays_apart.py SKIPPED):
        # a .venv-peer-* at the root would be walked by the repository's own source checks
        return ROOT / ".cache" / "peer-venvs" / self.name

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / self.script

    @property
    def py(self) -> Path:
        return self.venv / "bin" / "python"

    def version(self) -> str:
        r = subprocess.run(
            [str(self.py), "-c", f"import importlib.metadata as m; print(m.version({self.dist!r}))"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return r.stdout.strip() or "?"


PEERS = {
    "aiperf": PeerSpec("aiperf", "aiperf", "3.11", "aiperf"),
    # inference-perf 0.7.0's wheel says Requires-Python >=3.12
    "inference-perf": PeerSpec("inference-perf", "inference-perf", "3.12", "inference-perf"),
    "guidellm": PeerSpec("guidellm", "guidellm", "3.11", "guidellm"),
}


def _interpreter(version: str) -> str:
    """python<version>: on PATH where it runs, else a pyenv install's (a pyenv shim for a version
    that is not the global one is on PATH but refuses to run)."""
    cands = [shutil.which(f"python{version}") or ""]
    cands += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for c in cands:
        if c and subprocess.run([c, "--version"], capture_output=True).returncode == 0:
            return c
    raise PeerUnavailable(f"no python{version} interpreter found (PATH, ~/.pyenv/versions) for its venv")


def ensure_installed(spec: PeerSpec, log: Callable[[str], None], timeout_s: float = INSTALL_TIMEOUT_S) -> str:
    """The peer's venv, made and pip-installed from its requirements file where it is missing or
    was installed from another version of that file; returns the installed version."""
    want = hashlib.sha256(spec.requirements.read_bytes()).hexdigest()
    marker = spec.venv / ".installed"
    if marker.exists() and marker.read_text().strip() == want and spec.exe.exists():
        return spec.version()
    log(f"installing {spec.name} into {spec.venv} from {spec.requirements.name} (up to {timeout_s:.0f} s) ...")
    if spec.venv.exists():
        shutil.rmtree(spec.venv)
    py = _interpreter(spec.python)
    t0 = time.monotonic()
    try:
        subprocess.run([py, "-m", "venv", str(spec.venv)], check=True, capture_output=True, timeout=300)
        r = subprocess.run(
            [str(spec.venv / "bin" / "pip"), "install", "-q", "-r", str(spec.requirements)],
            capture_output=True,
            text=True,
            timeout=max(1.0, timeout_s - (time.monotonic() - t0)),
        )
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"{spec.name}: pip install did not finish within {timeout_s:.0f} s") from None
    if r.returncode != 0:
        errors = [ln for ln in (r.stderr + r.stdout).splitlines() if "Location 'file:" not in ln]
        raise PeerUnavailable(f"{spec.name}: pip install failed ({r.returncode}): " + "\n".join(errors[-15:]))
    marker.write_text(want + "\n")
    log(f"{spec.name} installed in {time.monotonic() - t0:.0f} s")
    return spec.version()


# -- the CPU of every process of a tool ------------------------------------------------------------


class TreeCpuSampler(CpuSampler):
    """CpuSampler with the CPU of children that already exited counted too (cutime + cstime of
    every process in the tree: a reaped child's time moves into its parent's, so none is counted
    twice), and the cores every process of the tree was allowed, so a tool that moves a worker
    off the client's core is seen (`cores`)."""

    def __init__(self, root_pid: int) -> None:
        self.cores: dict[int, frozenset[int]] = {}  # pid -> its affinity when first seen
        super().__init__(root_pid)

    def _tree_cpu(self, root: int) -> float:  # type: ignore[override]
        children: dict[int, list[int]] = {}
        ticks: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(f[1]), []).append(int(d.name))
            # utime + stime + cutime + cstime (proc(5): fields 14-17)
            ticks[int(d.name)] = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
        total, todo = 0, [root]
        while todo:
            pid = todo.pop()
            total += ticks.get(pid, 0)
            if pid not in self.cores:
                with contextlib.suppress(OSError):  # gone since
                    self.cores[pid] = frozenset(os.sched_getaffinity(pid))
            todo.extend(children.get(pid, ()))
        return total / os.sysconf("SC_CLK_TCK")

    def total_cpu_s(self) -> float:
        return self.samples[-1][1] if self.samples else 0.0

    def off_core(self, core: int) -> list[int]:
        """Processes of the tree allowed on any core but `core`."""
        return sorted(pid for pid, cores in self.cores.items() if cores != {core})


# -- joining a tool's requests to the server's -----------------------------------------------------


def wall_to_monotonic() -> float:
    """What to subtract from a time.time() stamp to put it on CLOCK_MONOTONIC (both clocks read
    back to back; NTP slews the wall clock by microseconds per second at most)."""
    return time.time() - time.monotonic()


def join_by_time(
    records: Sequence[tuple[float, float | None]],
    truth: Sequence[tuple[float, float]],
    *,
    tolerance_s: float = 0.002,
    within_s: float = 0.5,
) -> list[int | None]:
    """For each request a tool recorded, (its send, its TTFT or None), both on CLOCK_MONOTONIC,
    the index of the server's request (arrival, first token's write) it was, or None. A server
    request can be a record's only if it arrived after the record's send and its first token was
    written before the tool read one (send + TTFT; with no TTFT, it arrived within `within_s` of
    the send); stamps read just after the event they mark are allowed `tolerance_s`. A tool can
    stamp a request and send it late, or read its first token late (inference-perf did both, by
    seconds, on a busy core), so neither the sends' order nor the first tokens' need be the
    server's: the join is a maximum matching under those two bounds (augmenting paths), started
    from the earliest free arrival for each record in send order. Where two server requests fit
    one record, which it takes changes its TTFT error only by the server's own TTFT jitter (the
    server's TTFT is fixed), so the figures do not depend on the choice."""
    import bisect

    order = sorted(range(len(truth)), key=lambda j: truth[j][0])
    arrivals = [truth[j][0] for j in order]

    def candidates(i: int) -> list[int]:
        send, ttft = records[i]
        lo = bisect.bisect_left(arrivals, send - tolerance_s)
        if ttft is None:
            hi = bisect.bisect_right(arrivals, send + within_s)
            return order[lo:hi]
        hi = bisect.bisect_right(arrivals, send + ttft + tolerance_s)  # arrival < first write <= the read
        return [j for j in order[lo:hi] if truth[j][1] <= send + ttft + tolerance_s]

    cand = [candidates(i) for i in range(len(records))]
    owner: dict[int, int] = {}  # server request -> record
    match: list[int | None] = [None] * len(records)
    for i in sorted(range(len(records)), key=lambda i: records[i][0]):
        # breadth-first search for an augmenting path from record i
        prev: dict[int, tuple[int, int | None]] = {}  # server request -> (record reaching it, that record's old one)
        frontier, seen, end = [i], set(), None
        while frontier and end is None:
            nxt = []
            for r in frontier:
                for j in cand[r]:
                    if j in seen:
                        continue
                    seen.add(j)
                    prev[j] = (r, match[r])
                    if j not in owner:
                        end = j
                        break
                    nxt.append(owner[j])
                if end is not None:
                    break
            frontier = nxt
        while end is not None:  # flip the path back to record i
            r, old = prev[end]
            owner[end], match[r] = r, end
            end = old if r != i else None
    return match


def relabel_truth(truth: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """The server's truth with every request named by its arrival order (`t<j>`), for tools whose
    requests carry no id of their own, and (arrival, first write) of each in that order."""
    reqs = sorted(truth["requests"], key=lambda r: r["arrival"])
    out = dict(truth)
    out["requests"] = [{**r, "id": f"t{j}"} for j, r in enumerate(reqs)]
    return out, [(r["arrival"], r["first_write"]) for r in reqs]


Row = tuple[float, str, float | None, float | None, bool, float]


def rows_by_time(
    records: Sequence[tuple[float, float | None, bool]], truth: dict[str, Any], rate: float
) -> tuple[dict[str, Any], list[Row]]:
    """A peer's per-request records (send on CLOCK_MONOTONIC, its TTFT from that send or None,
    whether it ended whole) as probe_from's rows, joined to the relabelled truth by time. Its
    schedule is evenly spaced at `rate` from an unrecorded start: placed through its most punctual
    request, as for vLLM's bench (a lower bound of the lag)."""
    truth2, server = relabel_truth(truth)
    recs = sorted(records, key=lambda r: r[0])
    match = join_by_time([(r[0], r[1]) for r in recs], server)
    t0 = min((s - i / rate for i, (s, _, _) in enumerate(recs)), default=0.0)
    rows: list[Row] = []
    for i, ((sent, ttft, whole), j) in enumerate(zip(recs, match, strict=True)):
        rows.append((i / rate, f"t{j}" if j is not None else f"unmatched{i}", ttft, sent - t0 - i / rate, whole, sent))
    return truth2, rows


# -- the long-context shape --------------------------------------------------------------------------


@dataclass(frozen=True)
class LongShape:
    """Conversations whose context grows to `max_context` tokens: `conversations` of `turns`
    each, turn t (1-based) sending t x max_context / turns tokens of context, `output_tokens`
    back. Requests go out evenly at `rate`, the conversations interleaved (request i is turn
    i // conversations + 1 of conversation i % conversations), so a conversation's next turn
    leaves conversations / rate seconds after its last, after that turn's stream has ended."""

    max_context: int = 32_768
    turns: int = 8
    conversations: int = 6
    rate: float = 4.0
    output_tokens: int = 64

    def inputs(self) -> list[int]:
        step = self.max_context // self.turns
        return [(i // self.conversations + 1) * step for i in range(self.conversations * self.turns)]

    def check(self, ttft_s: float, itl_s: float) -> None:
        stream = ttft_s + self.output_tokens * itl_s
        gap = self.conversations / self.rate
        if gap <= stream:
            raise ValueError(
                f"long-context shape: a conversation's turns {gap:.2f} s apart overlap its {stream:.2f} s streams"
            )


def write_json(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj))
    return path


# -- the peers themselves ----------------------------------------------------------------------------

# One item of a probe's request set: the prompt text (the same texts ours and vLLM's bench send,
# loadgen.prompts.PromptBuilder), its token count, and the output tokens asked for.
Item = tuple[str, int, int]
# A peer's record of one request: its send (CLOCK_MONOTONIC), TTFT from that send (None: no first
# token), whether it ended whole, its X-Request-Id where the tool sends one.
Record = tuple[float, float | None, bool, str | None]

MODEL = "reference"


def rows_from_records(
    records: Sequence[Record], truth: dict[str, Any], rate: float
) -> tuple[dict[str, Any], list[Row]]:
    """probe_from's rows: by X-Request-Id where every record carries one the server saw (AIPerf),
    else by time (`rows_by_time`). The schedule, as for vLLM's bench: evenly spaced at `rate`,
    placed through the most punctual request."""
    known = {r["id"] for r in truth["requests"]}
    if records and all(r[3] is not None and r[3] in known for r in records if r[2]):
        recs = sorted(records, key=lambda r: r[0])
        t0 = min(s - i / rate for i, (s, *_rest) in enumerate(recs))
        rows: list[Row] = [
            (i / rate, rid or "", ttft, s - t0 - i / rate, whole, s) for i, (s, ttft, whole, rid) in enumerate(recs)
        ]
        return truth, rows
    return rows_by_time([(s, ttft, whole) for s, ttft, whole, _ in records], truth, rate)


def offline_env() -> dict[str, str]:
    """The environment every peer runs in: no hub, no telemetry, loopback only."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_DISABLE_TELEMETRY="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        NO_PROXY="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    return env


@dataclass
class PeerRun:
    records: list[Record]
    sampler: TreeCpuSampler
    wall_s: float
    command: list[str]


class PeerTool:
    """One peer, run once per probe as a user runs it (its CLI, a fresh process tree), every
    process pinned to the client core by inheritance (the bench pins itself before it starts
    any tool; `TreeCpuSampler.off_core` checks that no process moved)."""

    spec: PeerSpec

    def __init__(self, server_url: str, workdir: Path, tokenizer: Path, log: Callable[[str], None]) -> None:
        self.name = self.spec.name
        self.url = server_url
        self.workdir = workdir
        self.tokenizer = tokenizer
        self.log = log
        self.runs = 0
        self.version = ensure_installed(self.spec, log)

    def command(self, wd: Path, items: Sequence[Item], rate: float) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return offline_env()

    def records(self, wd: Path, offset: float) -> list[Record]:
        """Its per-request export; `offset` puts a time.time() stamp on CLOCK_MONOTONIC."""
        raise NotImplementedError

    def run(self, items: Sequence[Item], rate: float, timeout_s: float) -> PeerRun:
        self.runs += 1
        wd = self.workdir / f"{self.name}-{self.runs}"
        wd.mkdir(parents=True)
        cmd = self.command(wd, items, rate)
        t = time.monotonic()
        with (wd / "tool.log").open("wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env(), cwd=wd)
            sampler = TreeCpuSampler(proc.pid)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = -9
            finally:
                sampler.stop()
        wall = time.monotonic() - t
        if rc != 0:
            tail = (wd / "tool.log").read_text(errors="replace").splitlines()[-25:]
            raise RuntimeError(f"{self.name} exited {rc}; log {wd / 'tool.log'}:\n" + "\n".join(tail))
        recs = self.records(wd, wall_to_monotonic())
        if not recs:
            raise RuntimeError(f"{self.name}: no per-request records in {wd}")
        return PeerRun(recs, sampler, wall, cmd)


class AIPerf(PeerTool):
    """`aiperf profile` (AIPerf 0.13.0, aiperf/cli.py): the request set as a mooncake_trace of
    text_input + output_length with millisecond timestamps, `--fixed-schedule` (as
    bench/peer_compare.py runs it), completions endpoint, streaming, a local tokenizer
    directory and `--use-server-token-count`. Its records (profile_export.jsonl) carry each
    request's X-Request-ID (aiperf/transports/base_transports.py sends one) and its start as
    time.time_ns (aiperf/common/models/record_models.py MetricRecordMetadata.request_start_ns)."""

    spec = PEERS["aiperf"]

    def command(self, wd: Path, items: Sequence[Item], rate: float) -> list[str]:
        trace = wd / "trace.jsonl"
        with trace.open("w") as fh:
            for i, (text, _n, out) in enumerate(items):
                fh.write(json.dumps({"timestamp": round(i / rate * 1000), "text_input": text, "output_length": out}))
                fh.write("\n")
        return [
            str(self.spec.exe),
            "profile",
            "--model",
            MODEL,
            "--url",
            self.url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--input-file",
            str(trace),
            "--custom-dataset-type",
            "mooncake_trace",
            "--fixed-schedule",
            "--tokenizer",
            str(self.tokenizer),
            "--use-server-token-count",
            "--extra-inputs",
            "ignore_eos:true",
            "--random-seed",
            "0",
            "--no-server-metrics",
            "--ui-type",
            "none",
            "--artifact-dir",
            str(wd / "artifacts"),
        ]

    def env(self) -> dict[str, str]:
        # Not HF_HUB_OFFLINE: aiperf 0.13.0's offline branch looks a local tokenizer directory up
        # in the hub cache and fails (bench/peer_compare.py); a local path loads with no network.
        return offline_env()

    def records(self, wd: Path, offset: float) -> list[Record]:
        out: list[Record] = []
        for p in wd.rglob("profile_export.jsonl"):
            for line in p.read_text().splitlines():
                rec = json.loads(line)
                meta = rec.get("metadata") or {}
                m = (rec.get("metrics") or {}).get("time_to_first_token")
                ttft = None
                if m is not None:
                    v, unit = (m["value"], m.get("unit", "ms")) if isinstance(m, dict) else (m, "ms")
                    ttft = float(v) / {"ms": 1e3, "ns": 1e9, "us": 1e6}.get(unit, 1.0)
                ok = not rec.get("error") and ttft is not None
                out.append((meta["request_start_ns"] / 1e9 - offset, ttft, ok, meta.get("x_request_id")))
        return out


class InferencePerf(PeerTool):
    """`inference-perf --config_file` (inference-perf 0.7.0, inference_perf/main.py,
    config/config.py): completions API, streaming, a `constant` load stage at the rate for
    n / rate seconds, `random` data (token ids of the local tokenizer, decoded) of the shape's
    lengths or, for the long-context shape, an AzurePublicDataset trace of the growing lengths
    (datagen/synthetic/random_datagen.py), per-request report on. Its per-request start_time
    is time.perf_counter() (client/modelserver/openai_client.py), CLOCK_MONOTONIC on Linux;
    its requests carry no id, so they are joined to the server's by time."""

    spec = PEERS["inference-perf"]

    def command(self, wd: Path, items: Sequence[Item], rate: float) -> list[str]:
        import math

        import yaml

        n = len(items)
        ins = {i for _t, i, _o in items}
        outs = {o for _t, _i, o in items}
        if len(ins) == 1 and len(outs) == 1:
            i0, o0 = ins.pop(), outs.pop()
            data: dict[str, Any] = {
                "type": "random",
                "input_distribution": {"min": i0, "max": i0, "mean": i0, "std_dev": 0, "total_count": n},
                "output_distribution": {"min": o0, "max": o0, "mean": o0, "std_dev": 0, "total_count": n},
            }
        else:
            trace = wd / "trace.csv"
            rows = [f"2026-01-01 00:00:{i / rate:09.6f},{i_n},{o}" for i, (_t, i_n, o) in enumerate(items)]
            trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
            data = {"type": "random", "trace": {"file": str(trace), "format": "AzurePublicDataset"}}
        cfg = {
            "api": {"type": "completion", "streaming": True},
            "data": data,
            "load": {"type": "constant", "stages": [{"rate": rate, "duration": max(1, math.ceil(n / rate))}]},
            "server": {"type": "vllm", "model_name": MODEL, "base_url": self.url, "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(self.tokenizer)},
            "report": {
                "request_lifecycle": {
                    "summary": True,
                    "per_stage": False,
                    "per_request": True,
                    "per_request_fields": {
                        "request": False,
                        "response": False,
                        "response_chunks": False,
                        "computed_metrics": True,
                    },
                }
            },
            "storage": {"local_storage": {"path": str(wd / "reports")}},
        }
        (wd / "config.yml").write_text(yaml.safe_dump(cfg))
        return [str(self.spec.exe), "--config_file", str(wd / "config.yml")]

    def env(self) -> dict[str, str]:
        return {**offline_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def records(self, wd: Path, offset: float) -> list[Record]:
        out: list[Record] = []
        for p in wd.rglob("per_request_lifecycle_metrics.json"):
            for rec in json.loads(p.read_text()):
                cm = rec.get("computed_metrics") or {}
                ttft = cm.get("time_to_first_token")
                ok = rec.get("error") is None and ttft is not None
                out.append((float(rec["start_time"]), float(ttft) if ttft is not None else None, ok, None))
        return out


class GuideLLM(PeerTool):
    """`guidellm run` (GuideLLM 0.8.1, guidellm/cli/run.py): the openai_http backend on
    /v1/completions, streaming, a `constant` profile at the rate, max_requests n, the request
    set from a JSON file (prompt + output_tokens_count), a local tokenizer, JSON output. Its
    per-request timings are time.time() (guidellm/backends/openai/http.py); its requests carry
    no id, so they are joined to the server's by time."""

    spec = PEERS["guidellm"]

    def command(self, wd: Path, items: Sequence[Item], rate: float) -> list[str]:
        data = wd / "data.jsonl"
        with data.open("w") as fh:
            for text, n_in, out in items:
                fh.write(json.dumps({"prompt": text, "prompt_tokens_count": n_in, "output_tokens_count": out}) + "\n")
        return [
            str(self.spec.exe),
            "run",
            "--backend",
            f"kind=openai_http,target={self.url},model={MODEL},request_format=/v1/completions,"
            "validate_backend=false,http2=false",
            "--profile",
            f"kind=constant,rate={rate}",
            "--constraint",
            f"kind=max_requests,count={len(items)}",
            "--data",
            f"kind=json_file,path={data}",
            "--tokenizer",
            f"kind=huggingface_auto,model={self.tokenizer}",
            "--output",
            f"kind=json,path={wd / 'benchmarks.json'}",
            "--disable-console-interactive",
        ]

    def env(self) -> dict[str, str]:
        return {**offline_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def records(self, wd: Path, offset: float) -> list[Record]:
        doc = json.loads((wd / "benchmarks.json").read_text())
        out: list[Record] = []
        for b in doc.get("benchmarks", []):
            reqs = b.get("requests") or {}
            for status, items in reqs.items():
                for r in items or []:
                    t = r.get("info", {}).get("timings") or r.get("timings") or {}
                    start = t.get("request_start")
                    first = t.get("first_token_iteration") or t.get("first_iteration")
                    if start is None:
                        continue
                    ttft = first - start if first is not None else None
                    out.append((start - offset, ttft, status == "successful" and ttft is not None, None))
        return out


PEER_CLASSES: dict[str, type[PeerTool]] = {"aiperf": AIPerf, "inference-perf": InferencePerf, "guidellm": GuideLLM}


# -- the figures over every tool ---------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float | None:
    from core.quantiles import interpolated_quantile

    return interpolated_quantile(sorted(xs), q) if xs else None


@dataclass(frozen=True)
class LongFigures:
    """One tool's run of the long-context shape."""

    tool: str
    requests: int
    ok: int  # ended whole and reached the server
    cpu_s_per_request: float | None  # the tree's CPU from the first arrival to the last stream's end, per request
    run_cpu_s_per_request: float  # the tree's CPU over the whole run (start-up and prompt preparation too)
    ttft_err_p50_s: float | None
    ttft_err_p99_s: float | None
    server_kept_schedule: bool

    def as_dict(self) -> dict[str, Any]:
        def ms(x: float | None) -> float | None:
            return None if x is None else x * 1000

        return {
            "tool": self.tool,
            "requests": self.requests,
            "ok": self.ok,
            "cpu_s_per_request": self.cpu_s_per_request,
            "run_cpu_s_per_request": self.run_cpu_s_per_request,
            "ttft_error_p50_ms": ms(self.ttft_err_p50_s),
            "ttft_error_p99_ms": ms(self.ttft_err_p99_s),
            "server_kept_schedule": self.server_kept_schedule,
        }


def long_figures(
    tool: str, truth: dict[str, Any], rows: Sequence[Row], sampler: CpuSampler, shape: LongShape, itl_s: float
) -> LongFigures:
    """Every request counts (no steady window: the context grows through the run). The CPU
    window runs from the first request's arrival at the server to the last stream's last token
    (its first write + output_tokens x ITL), so a tool's start-up and its report afterwards are
    left out of `cpu_s_per_request` and counted in `run_cpu_s_per_request`."""
    from testing.reference_server import kept_schedule

    by_id = {r["id"]: r for r in truth["requests"] if r["id"]}
    errs: list[float] = []
    ok = 0
    for _offset, rid, ttft, _lag, whole, _sent in rows:
        g = by_id.get(rid)
        if not whole or g is None or ttft is None:
            continue
        ok += 1
        errs.append(ttft - (g["first_write"] - g["arrival"]))
    cpu = None
    if truth["requests"]:
        start = min(r["arrival"] for r in truth["requests"])
        end = max(r["first_write"] for r in truth["requests"]) + shape.output_tokens * itl_s
        w = sampler.window(start, end)
        cpu = w.cpu_s / len(rows) if w is not None and rows else None
    run_cpu = (sampler.samples[-1][1] - sampler.samples[0][1]) if len(sampler.samples) > 1 else 0.0
    return LongFigures(
        tool,
        len(rows),
        ok,
        cpu,
        run_cpu / max(1, len(rows)),
        _pct(errs, 0.5),
        _pct(errs, 0.99),
        kept_schedule(truth),
    )


def ratio_to_best_peer(
    figures: Sequence[dict[str, Any]], ours: str, peer_names: Sequence[str], rates: Sequence[float]
) -> dict[str, dict[str, Any]]:
    """Per rate: ours' tokens per CPU-second (median) over the best peer's, the best peer being
    the one with the most tokens per CPU-second among those measured at that rate (whether or
    not it kept up: the ratio is never flattered by leaving a peer out)."""

    def tpc(tool: str, rate: float) -> tuple[float | None, bool]:
        for f in figures:
            if f["tool"] == tool and f["offered_req_s"] == rate and f["tokens_per_cpu_s"]:
                return f["tokens_per_cpu_s"]["median"], bool(f["kept_up"])
        return None, False

    out: dict[str, dict[str, Any]] = {}
    for rate in rates:
        mine, _ = tpc(ours, rate)
        cands = [(v, name, up) for name in peer_names for v, up in [tpc(name, rate)] if v is not None]
        if not cands:
            out[f"{rate:g}"] = {"ratio": None, "best_peer": None, "best_peer_kept_up": None}
            continue
        v, name, up = max(cands)
        out[f"{rate:g}"] = {"ratio": mine / v if mine else None, "best_peer": name, "best_peer_kept_up": up}
    return out


def tokens_per_cpu_by_tool(
    figures: Sequence[dict[str, Any]], tools: Sequence[str], rates: Sequence[float]
) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for tool in tools:
        out[tool] = {}
        for rate in rates:
            f = next((x for x in figures if x["tool"] == tool and x["offered_req_s"] == rate), None)
            out[tool][f"{rate:g}"] = f["tokens_per_cpu_s"]["median"] if f and f["tokens_per_cpu_s"] else None
    return out
